import { backupContextOf, contextAnnotations, outboundContextOf } from './box-context.js';
import { ANNOTATIONS } from './labels.js';

const record = (annotations: Record<string, string>) => ({ metadata: { annotations } });

test('contexts round-trip through their record annotations, one annotation each', () => {
  const backup = { tenant_id: 't', environment_id: 'e', session_id: 's' };
  const outbound = { tenant_id: 't', session_id: 's2' };
  const a = contextAnnotations({ backup, outbound });
  expect(Object.keys(a).sort()).toEqual([ANNOTATIONS.backupContext, ANNOTATIONS.outboundContext].sort());
  expect(backupContextOf(record(a))).toEqual(backup);
  expect(outboundContextOf(record(a))).toEqual(outbound);
  // One given: only its annotation is written (the other stays as it was on the record).
  expect(Object.keys(contextAnnotations({ outbound }))).toEqual([ANNOTATIONS.outboundContext]);
});

test('a missing, garbled or incomplete context reads as none', () => {
  expect(backupContextOf(undefined)).toBeNull();
  expect(backupContextOf(record({}))).toBeNull();
  expect(backupContextOf(record({ [ANNOTATIONS.backupContext]: '{not json' }))).toBeNull();
  expect(backupContextOf(record({ [ANNOTATIONS.backupContext]: '{"tenant_id":"t","environment_id":"e"}' }))).toBeNull();
  expect(backupContextOf(record({ [ANNOTATIONS.backupContext]: '["t","e","s"]' }))).toBeNull();
  expect(outboundContextOf(record({ [ANNOTATIONS.outboundContext]: '{"tenant_id":"","session_id":"s"}' }))).toBeNull();
  // Extra fields are not carried along.
  expect(backupContextOf(record({ [ANNOTATIONS.backupContext]: '{"tenant_id":"t","environment_id":"e","session_id":"s","x":1}' }))).toEqual({ tenant_id: 't', environment_id: 'e', session_id: 's' });
});
