import { decide } from './leader-election.js';

const me = 'me';

test('no lease: create it', () => {
  expect(decide(undefined, me, undefined, 0, 10)).toBe('create');
});

test('our own lease: renew', () => {
  expect(decide({ holderIdentity: me, resourceVersion: '1' }, me, undefined, 0, 10)).toBe('renew');
});

test('a released lease (empty holder) is taken at once', () => {
  expect(decide({ holderIdentity: '', leaseDurationSeconds: 1, resourceVersion: '5' }, me, undefined, 0, 10)).toBe('acquire');
});

test("another holder's lease is taken only after it stays unchanged for a full duration of our own clock", () => {
  const lease = { holderIdentity: 'other', leaseDurationSeconds: 10, resourceVersion: '7' };
  // First sight of this record: not known stale yet, whatever its renewTime says.
  expect(decide(lease, me, undefined, 1_000_000, 10)).toBe('wait');
  const seen = { resourceVersion: '7', observedAt: 1_000_000 };
  expect(decide(lease, me, seen, 1_009_999, 10)).toBe('wait');
  expect(decide(lease, me, seen, 1_010_000, 10)).toBe('acquire');
  // The holder renewed (new resourceVersion): the clock starts again.
  expect(decide({ ...lease, resourceVersion: '8' }, me, seen, 1_020_000, 10)).toBe('wait');
});

test('the default duration applies when the lease has none', () => {
  const lease = { holderIdentity: 'other', resourceVersion: '7' };
  expect(decide(lease, me, { resourceVersion: '7', observedAt: 0 }, 14_999, 15)).toBe('wait');
  expect(decide(lease, me, { resourceVersion: '7', observedAt: 0 }, 15_000, 15)).toBe('acquire');
});
