import { newSnapshotId, parseSnapshotId, snapshotDeadline, snapshotKey, workspaceObject } from './snapshots.js';
import { sessionHash } from './labels.js';

test('a snapshot id carries its session hash, creation time and expiry, and parses back', () => {
  const created = new Date('2026-03-01T12:00:00.123Z');
  const expires = new Date('2026-03-08T12:00:00.123Z');
  const id = newSnapshotId('tenant/env/session-1', created, expires);
  expect(id.id).toMatch(/^snap-[0-9a-f]{12}-[0-9a-z]{9}-[0-9a-z]{7}-[0-9a-f]{8}$/);
  expect(parseSnapshotId(id.id)).toEqual({
    id: id.id,
    sessionHash: sessionHash('tenant/env/session-1'),
    createdAt: created,
    expiresAt: new Date('2026-03-08T12:00:00.000Z'),
  });
  expect(snapshotKey('default', id, 'snapshot.json')).toBe(`snapshots/default/${sessionHash('tenant/env/session-1')}/${id.id}/snapshot.json`);
});

test('ids sort by creation time, so the newest is found from a listing', () => {
  const a = newSnapshotId('s', new Date(1_700_000_000_000), new Date(1_800_000_000_000));
  const b = newSnapshotId('s', new Date(1_700_000_000_001), new Date(1_700_000_100_000));
  expect([b.id, a.id].sort()).toEqual([a.id, b.id]);
});

test.each(['', 'snap-', 'snap-zz0000000000-000000000-0000000-00000000', 'snap-000000000000-000000000-0000000-0000000', '../etc/passwd'])(
  '"%s" is not a snapshot id',
  (text) => expect(parseSnapshotId(text)).toBeUndefined(),
);

test("a snapshot is due at its own expiry, or earlier when the pool's retention was shortened", () => {
  const id = newSnapshotId('s', new Date(0), new Date(7 * 86_400_000));
  expect(snapshotDeadline(id, 7 * 86_400)).toBe(7 * 86_400_000);
  expect(snapshotDeadline(id, 86_400)).toBe(86_400_000);
  expect(snapshotDeadline(id, 30 * 86_400)).toBe(7 * 86_400_000);
});

test("a snapshot's workspace object is named by its compression: zstd now, gzip for snapshots taken before", () => {
  expect(workspaceObject({ compression: 'zstd' })).toBe('workspace.tar.zst');
  expect(workspaceObject({})).toBe('workspace.tar.gz');
});
