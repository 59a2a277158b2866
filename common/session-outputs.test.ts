import { BridgeError } from './errors.js';
import { ANNOTATIONS } from './labels.js';
import { contextDigest } from './snapshot-index.js';
import { isStorablePath, mountedSessions, outputPath, outputsKeys, outputsMountAnnotation, outputsMountOf, planOutputsRetention } from './session-outputs.js';

test('an output path is its segments joined; traversal, empty segments and separators inside one are refused with 400', () => {
  expect(outputPath(['report.pdf'])).toBe('report.pdf');
  expect(outputPath(['a', 'b c', 'ünï.txt'])).toBe('a/b c/ünï.txt');
  expect(outputPath('a/b')).toBe('a/b');
  expect(outputPath(['..x', 'x..'])).toBe('..x/x..');
  for (const bad of [[], [''], ['..'], ['.'], ['a', '..', 'b'], ['a', ''], ['a/b'], ['a\\b'], ['a\0'], ['a\nb'], ['x'.repeat(5000)]]) {
    let err: unknown;
    try {
      outputPath(bad);
    } catch (e) {
      err = e;
    }
    expect([bad, err instanceof BridgeError && err.type]).toEqual([bad, 'invalid_request']);
  }
  expect(() => outputPath('../etc/passwd')).toThrow(/segment/);
  expect(() => outputPath('/etc/passwd')).toThrow(/segment/);
});

test('only paths that read back by the same rules are stored', () => {
  expect(isStorablePath('a/b.txt')).toBe(true);
  expect(isStorablePath('a//b')).toBe(false);
  expect(isStorablePath('a\\b')).toBe(false);
  expect(isStorablePath('x'.repeat(901))).toBe(false);
});

test("a session's keys are under one prefix of its digest; the mount round-trips through its annotation", () => {
  const keys = outputsKeys('default', 'sess-1');
  const base = `session-outputs/default/${contextDigest('sess-1')}/`;
  expect(keys).toEqual({ files: `${base}files/`, manifest: `${base}manifest.json`, live: `${base}live.json` });
  const m = { tenant_id: 't', session_id: 'sess-1' };
  expect(outputsMountOf({ metadata: { annotations: outputsMountAnnotation(m) } })).toEqual(m);
  expect(outputsMountOf({ metadata: { annotations: { [ANNOTATIONS.sessionOutputs]: '{"tenant_id":"t"}' } } })).toBeUndefined();
  expect(outputsMountOf({ metadata: {} })).toBeUndefined();
});

test('retention deletes a session\'s outputs whole once all are older than the retention and no live record holds them', () => {
  const day = 86400_000;
  const now = Date.UTC(2026, 10, 25);
  const [old, held, recent] = ['old', 'held', 'recent'].map(contextDigest) as [string, string, string];
  const objects = [
    { key: `${old}/files/a`, lastModified: new Date(now - 9 * day) },
    { key: `${old}/manifest.json`, lastModified: new Date(now - 8 * day) },
    { key: `${held}/manifest.json`, lastModified: new Date(now - 9 * day) },
    { key: `${recent}/files/a`, lastModified: new Date(now - 9 * day) },
    { key: `${recent}/manifest.json`, lastModified: new Date(now - day) }, // copied again a day ago: all kept
    { key: 'not-ours/x', lastModified: new Date(0) },
  ];
  const records = [
    { metadata: { annotations: outputsMountAnnotation({ tenant_id: 't', session_id: 'held' }) } },
    { metadata: { deletionTimestamp: new Date(), annotations: outputsMountAnnotation({ tenant_id: 't', session_id: 'old' }) } },
  ];
  const mounted = mountedSessions(records);
  expect([...mounted]).toEqual([held]);
  expect(planOutputsRetention({ objects, mounted, retentionSeconds: 7 * 86400, now })).toEqual({ deletes: [`${old}/files/a`, `${old}/manifest.json`], sessions: 1 });
});
