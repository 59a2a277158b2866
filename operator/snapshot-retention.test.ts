import { newSnapshotId } from '../common/snapshots.js';
import { planRetention } from './snapshot-retention.js';

const HOUR = 3_600_000;
const now = Date.parse('2026-05-01T00:00:00Z');
const at = (ms: number) => new Date(ms);

function snapshot(createdAgoMs: number, ttlMs: number, objects = ['workspace.tar.gz', 'snapshot.json'], writtenAgoMs = createdAgoMs) {
  const id = newSnapshotId('session', at(now - createdAgoMs), at(now - createdAgoMs + ttlMs));
  return { id: id.id, objects: objects.map((o) => ({ key: `${id.sessionHash}/${id.id}/${o}`, lastModified: at(now - writtenAgoMs) })) };
}

test('expired snapshots go whole; the others stay, and the next expiry is when to look again', () => {
  const expired = snapshot(8 * 24 * HOUR, 7 * 24 * HOUR);
  const fresh = snapshot(HOUR, 2 * HOUR);
  const later = snapshot(HOUR, 5 * HOUR);
  const plan = planRetention({ objects: [...expired.objects, ...fresh.objects, ...later.objects], retentionSeconds: 7 * 86_400, now, incompleteGraceMs: HOUR });
  expect(plan).toEqual({ deletes: expired.objects.map((o) => o.key), expired: 1, incomplete: 0, nextDueAt: Math.floor((now + HOUR) / 1000) * 1000 });
});

test("a shorter pool retention applies to snapshots already taken", () => {
  const s = snapshot(2 * HOUR, 7 * 24 * HOUR);
  expect(planRetention({ objects: s.objects, retentionSeconds: 3600, now, incompleteGraceMs: HOUR }).expired).toBe(1);
});

test('a workspace without metadata (a snapshot that failed mid-way) goes after the grace, not before', () => {
  const recent = snapshot(10 * 60_000, 24 * HOUR, ['workspace.tar.gz']);
  const stale = snapshot(2 * HOUR, 24 * HOUR, ['workspace.tar.gz']);
  const plan = planRetention({ objects: [...recent.objects, ...stale.objects], retentionSeconds: 86_400, now, incompleteGraceMs: HOUR });
  expect(plan.deletes).toEqual(stale.objects.map((o) => o.key));
  expect(plan).toMatchObject({ expired: 0, incomplete: 1, nextDueAt: now - 10 * 60_000 + HOUR });
});

test('objects that are not snapshots are left alone', () => {
  const plan = planRetention({
    objects: [{ key: 'notes.txt', lastModified: at(0) }, { key: 'abc/not-a-snapshot/snapshot.json', lastModified: at(0) }],
    retentionSeconds: 60,
    now,
    incompleteGraceMs: 0,
  });
  expect(plan).toEqual({ deletes: [], expired: 0, incomplete: 0 });
});
