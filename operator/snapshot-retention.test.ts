import type * as k8s from '@kubernetes/client-node';
import { pino } from 'pino';
import type { ObjectStore } from '../common/object-store.js';
import { withDefaults, type SandboxPool } from '../common/pool.js';
import { newSnapshotId } from '../common/snapshots.js';
import type { EventRecorder } from './events.js';
import type { OperatorMetrics } from './metrics.js';
import { SnapshotRetentionReconciler, namedSnapshots, planRetention } from './snapshot-retention.js';

const HOUR = 3_600_000;
const now = Date.parse('2026-05-01T00:00:00Z');
const at = (ms: number) => new Date(ms);
const none = new Set<string>();

function snapshot(createdAgoMs: number, ttlMs: number, objects = ['workspace.tar.gz', 'snapshot.json'], writtenAgoMs = createdAgoMs) {
  const id = newSnapshotId('session', at(now - createdAgoMs), at(now - createdAgoMs + ttlMs));
  return { id: id.id, objects: objects.map((o) => ({ key: `${id.sessionHash}/${id.id}/${o}`, lastModified: at(now - writtenAgoMs) })) };
}

test('expired snapshots go whole; the others stay, and the next expiry is when to look again', () => {
  const expired = snapshot(8 * 24 * HOUR, 7 * 24 * HOUR);
  const fresh = snapshot(HOUR, 2 * HOUR);
  const later = snapshot(HOUR, 5 * HOUR);
  const plan = planRetention({ objects: [...expired.objects, ...fresh.objects, ...later.objects], retentionSeconds: 7 * 86_400, now, incompleteGraceMs: HOUR, named: none });
  expect(plan).toEqual({ deletes: expired.objects.map((o) => o.key), expired: 1, incomplete: 0, kept: 0, deferred: 0, nextDueAt: Math.floor((now + HOUR) / 1000) * 1000 });
});

test("a shorter pool retention applies to snapshots already taken", () => {
  const s = snapshot(2 * HOUR, 7 * 24 * HOUR);
  expect(planRetention({ objects: s.objects, retentionSeconds: 3600, now, incompleteGraceMs: HOUR, named: none }).expired).toBe(1);
});

test('a workspace without metadata (a snapshot that failed mid-way) goes after the grace, not before', () => {
  const recent = snapshot(10 * 60_000, 24 * HOUR, ['workspace.tar.gz']);
  const stale = snapshot(2 * HOUR, 24 * HOUR, ['workspace.tar.gz']);
  const plan = planRetention({ objects: [...recent.objects, ...stale.objects], retentionSeconds: 86_400, now, incompleteGraceMs: HOUR, named: none });
  expect(plan.deletes).toEqual(stale.objects.map((o) => o.key));
  expect(plan).toMatchObject({ expired: 0, incomplete: 1, nextDueAt: now - 10 * 60_000 + HOUR });
});

test('objects that are not snapshots are left alone', () => {
  const plan = planRetention({
    objects: [{ key: 'notes.txt', lastModified: at(0) }, { key: 'abc/not-a-snapshot/snapshot.json', lastModified: at(0) }],
    retentionSeconds: 60,
    now,
    incompleteGraceMs: 0,
    named: none,
  });
  expect(plan).toEqual({ deletes: [], expired: 0, incomplete: 0, kept: 0, deferred: 0 });
});

test('a snapshot a live record names (a sleeping box) is never deleted, whatever its expiry; counted as kept', () => {
  const ownExpiry = snapshot(3 * HOUR, HOUR); // expired two hours ago
  const pastRetention = snapshot(3 * HOUR, 7 * 24 * HOUR); // beyond a retention shortened to 1 h
  const unfinished = snapshot(3 * HOUR, 7 * 24 * HOUR, ['workspace.tar.gz']);
  const unnamed = snapshot(3 * HOUR, HOUR);
  const plan = planRetention({
    objects: [...ownExpiry.objects, ...pastRetention.objects, ...unfinished.objects, ...unnamed.objects],
    retentionSeconds: 3600,
    now,
    incompleteGraceMs: HOUR,
    named: new Set([ownExpiry.id, pastRetention.id, unfinished.id]),
  });
  expect(plan.deletes).toEqual(unnamed.objects.map((o) => o.key));
  expect(plan).toMatchObject({ expired: 1, kept: 3 });
  // A kept snapshot is past due: it must not make the pool requeue at once, forever.
  expect(plan.nextDueAt).toBeUndefined();
});

test('past a shortened retention, a snapshot written within the grace waits for it (a record may name it any moment); its own expiry does not', () => {
  // Taken 2 h ago (a long upload), written 10 min ago; the pool's retention is now 1 h.
  const slow = snapshot(2 * HOUR, 7 * 24 * HOUR, ['workspace.tar.gz', 'snapshot.json'], 10 * 60_000);
  const plan = planRetention({ objects: slow.objects, retentionSeconds: 3600, now, incompleteGraceMs: HOUR, named: none });
  expect(plan).toMatchObject({ deletes: [], deferred: 1, nextDueAt: now - 10 * 60_000 + HOUR });
  const later = planRetention({ objects: slow.objects, retentionSeconds: 3600, now: now + HOUR, incompleteGraceMs: HOUR, named: none });
  expect(later).toMatchObject({ expired: 1, deferred: 0 });
  // Its own expiry (a request's ttlSeconds) is not held back by the grace.
  const short = snapshot(2 * 60_000, 60_000);
  expect(planRetention({ objects: short.objects, retentionSeconds: 3600, now, incompleteGraceMs: HOUR, named: none }).expired).toBe(1);
});

test('named snapshots: live Secrets with the sleep-snapshot annotation; one being deleted names nothing', () => {
  const secret = (name: string, snap?: string, deleting = false): k8s.KubernetesObject => ({
    metadata: {
      name,
      ...(snap ? { annotations: { 'sandbox-bridge.io/sleep-snapshot': snap } } : {}),
      ...(deleting ? { deletionTimestamp: at(now) } : {}),
    },
  });
  expect([...namedSnapshots([secret('a', 'snap-1'), secret('b'), secret('c', 'snap-3', true)])]).toEqual(['snap-1']);
});

describe('the reconciler', () => {
  const pool: SandboxPool = { apiVersion: 'sandbox-bridge.io/v1alpha1', kind: 'SandboxPool', metadata: { name: 'p', generation: 1 }, spec: withDefaults({ namespace: 'ns', maxBoxes: 5, snapshots: { retentionSeconds: 3600 } }) };

  function harness(objects: Array<{ key: string; lastModified: Date }>, onListed?: () => void) {
    const records: k8s.KubernetesObject[] = [];
    const deleted: string[] = [];
    let listings = 0;
    const store = {
      key: (k: string) => `pre/${k}`,
      async *list(prefix: string) {
        listings++;
        for (const o of objects) yield { key: `${prefix}${o.key}`, lastModified: o.lastModified };
        onListed?.();
      },
      delete: async (keys: string[]) => void deleted.push(...keys),
      async *listUploads() {},
      abortUpload: async () => undefined,
    };
    let synced = true;
    const reconciler = new SnapshotRetentionReconciler({
      store: store as unknown as ObjectStore,
      pools: { get: () => pool, list: () => [pool] },
      secrets: { get: () => undefined, list: (ns) => (ns === 'ns' ? records : []) },
      secretsSynced: () => synced,
      events: { record: async () => undefined } as unknown as EventRecorder,
      metrics: { snapshotsDeleted: { inc: () => undefined } } as unknown as OperatorMetrics,
      log: pino({ level: 'silent' }),
      sweepIntervalMs: 300_000,
      incompleteGraceMs: HOUR,
      now: () => now,
    });
    return { reconciler, records, deleted, listings: () => listings, unsync: () => (synced = false) };
  }

  test('deletes nothing, and does not even list, until the Secret cache is filled', async () => {
    const old = snapshot(3 * HOUR, HOUR);
    const h = harness(old.objects);
    h.unsync();
    expect(await h.reconciler.reconcile('p')).toEqual({ requeueAfterMs: 1000 });
    expect([h.listings(), h.deleted]).toEqual([0, []]);
  });

  test('reads the records after listing the store: a record that named a listed snapshot meanwhile keeps it', async () => {
    const slept = snapshot(3 * HOUR, HOUR);
    const other = snapshot(3 * HOUR, HOUR);
    const h = harness([...slept.objects, ...other.objects], () => {
      // A bridge put a box to sleep while the sweep listed: its record names the snapshot now.
      h.records.push({ metadata: { name: 'box-s-0', namespace: 'ns', annotations: { 'sandbox-bridge.io/sleep-snapshot': slept.id } } });
    });
    await h.reconciler.reconcile('p');
    expect(h.deleted).toEqual(other.objects.map((o) => `pre/snapshots/p/${o.key}`));
  });
});
