// Snapshot retention: a second reconciler of the SandboxPool (its own work queue, see
// controller.ts). It lists the pool's snapshots in the object store, deletes the expired ones
// (each snapshot's own expiry, or the pool's spec.snapshots.retentionSeconds if that is
// shorter) and what failed snapshots left behind, and asks to run again when the next one falls
// due: RequeueAfter, never a timer. The store is not watched, so snapshots taken meanwhile are
// seen at the next sweep, at most sweepIntervalMs later.
//
// A sleeping box's workspace is in a snapshot its record names (annotation
// sandbox-bridge.io/sleep-snapshot): such a snapshot is never deleted while a live record names
// it, whatever its expiry. The records come from the operator's Secret cache, which may not yet
// show a record that named a snapshot a moment ago: the writer stores the snapshot (its
// metadata last) and only then names it. So a snapshot past a shortened retention is deleted
// only once it was written at least the grace ago (incompleteGraceMs: the time a writer has to
// finish a snapshot and name it), and the records are read after the store was listed: a
// snapshot named within the grace of being written is seen named by any cache less than that
// far behind. (A snapshot's own expiry is not held back: a sleep snapshot expires no earlier
// than its box.) The grace is measured from the store's lastModified, by the operator's clock.
import type { Logger } from 'pino';
import { ANNOTATIONS } from '../common/labels.js';
import type { PartialObjectMetadata } from '../common/informer.js';
import type { ObjectStore } from '../common/object-store.js';
import type { SandboxPool } from '../common/pool.js';
import { METADATA_OBJECT, parseSnapshotId, poolPrefix, snapshotDeadline } from '../common/snapshots.js';
import type { EventRecorder } from './events.js';
import { sweepPlatformObjects } from './platform-retention.js';
import type { OperatorMetrics } from './metrics.js';
import type { Lister, ReconcileResult } from './pool-reconciler.js';

export interface RetentionInput {
  /** The pool's objects: keys relative to the pool's prefix ("<hash>/<snapshot id>/<object>"). */
  objects: ReadonlyArray<{ key: string; lastModified: Date }>;
  retentionSeconds: number;
  now: number;
  /**
   * How long a snapshot's writer has to finish it and name it in a record, from its newest
   * object: a snapshot whose metadata never arrived (its bridge failed mid-way) is removed after
   * this, and a complete one past a shortened pool retention is not deleted before.
   */
  incompleteGraceMs: number;
  /** Snapshot ids live box records name (sleeping boxes' workspaces): never deleted. */
  named: ReadonlySet<string>;
}

export interface RetentionPlan {
  /** Keys to delete, relative like the input's. */
  deletes: string[];
  expired: number;
  incomplete: number;
  /** Snapshots due for deletion that a live record names, so kept. */
  kept: number;
  /** Snapshots past a shortened retention, written less than the grace ago: deleted later. */
  deferred: number;
  /** When the next snapshot falls due (ms since epoch). */
  nextDueAt?: number;
}

/** Pure: which snapshots to delete now, and when to look again. */
export function planRetention(input: RetentionInput): RetentionPlan {
  const groups = new Map<string, { keys: string[]; complete: boolean; newest: number }>();
  for (const o of input.objects) {
    const parts = o.key.split('/');
    if (parts.length !== 3) continue; // not a snapshot object: left alone
    const group = groups.get(parts[1]!) ?? { keys: [], complete: false, newest: 0 };
    group.keys.push(o.key);
    if (parts[2] === METADATA_OBJECT) group.complete = true;
    group.newest = Math.max(group.newest, o.lastModified.getTime());
    groups.set(parts[1]!, group);
  }
  const plan: RetentionPlan = { deletes: [], expired: 0, incomplete: 0, kept: 0, deferred: 0 };
  const due = (at: number) => {
    if (plan.nextDueAt === undefined || at < plan.nextDueAt) plan.nextDueAt = at;
  };
  const { now } = input;
  for (const [name, group] of groups) {
    const id = parseSnapshotId(name);
    if (!id) continue;
    // Written, and named if it is to be, by then (measured from the store's clock).
    const settledAt = group.newest + input.incompleteGraceMs;
    const deadline = snapshotDeadline(id, input.retentionSeconds);
    // Its own expiry holds; a shortened retention only once it has settled.
    const expiresAt = Math.max(deadline, Math.min(id.expiresAt.getTime(), settledAt));
    const deleteAt = group.complete ? expiresAt : Math.min(expiresAt, settledAt);
    if (deleteAt > now) {
      if (deadline <= now) plan.deferred++;
      due(deleteAt);
    } else if (input.named.has(name)) {
      plan.kept++; // looked at again by the next sweep, once no record names it
    } else {
      plan.deletes.push(...group.keys);
      if (expiresAt <= now) plan.expired++;
      else plan.incomplete++;
    }
  }
  return plan;
}

/**
 * The snapshots live box Secrets of a namespace name (sleeping boxes' workspaces). Any Secret
 * with the annotation counts, whatever its labels; one being deleted does not.
 */
export function namedSnapshots(secrets: readonly PartialObjectMetadata[]): Set<string> {
  const named = new Set<string>();
  for (const s of secrets) {
    const id = s.metadata?.annotations?.[ANNOTATIONS.sleepSnapshot];
    if (id && !s.metadata?.deletionTimestamp) named.add(id);
  }
  return named;
}

export interface RetentionOptions {
  store: ObjectStore;
  pools: Lister<SandboxPool>;
  /** The operator's cache of box Secrets (metadata): the records that name sleeping boxes' snapshots. */
  secrets: Lister<PartialObjectMetadata>;
  /** Whether that cache has been filled: until then no snapshot is deleted. */
  secretsSynced: () => boolean;
  events: EventRecorder;
  metrics: OperatorMetrics;
  log: Logger;
  /** The longest wait between two sweeps of a pool (new snapshots are only seen by a sweep). */
  sweepIntervalMs: number;
  incompleteGraceMs: number;
  now?: () => number;
}

/** How soon to look again while the Secret cache is not filled yet. */
const CACHE_WAIT_MS = 1000;

export class SnapshotRetentionReconciler {
  private readonly now: () => number;
  /** Per pool: the generation last swept and when the next sweep is due, so pool events in between cost nothing. */
  private readonly swept = new Map<string, { generation: number | undefined; nextAt: number }>();

  constructor(private readonly o: RetentionOptions) {
    this.now = o.now ?? Date.now;
  }

  async reconcile(name: string): Promise<ReconcileResult> {
    const pool = this.o.pools.get(name);
    if (!pool) {
      this.swept.delete(name);
      return {};
    }
    const now = this.now();
    const last = this.swept.get(name);
    if (last && last.generation === pool.metadata.generation && now < last.nextAt) return { requeueAfterMs: last.nextAt - now };

    // Without the records, any snapshot could be a sleeping box's.
    if (!this.o.secretsSynced()) return { requeueAfterMs: CACHE_WAIT_MS };

    const { store } = this.o;
    const prefix = store.key(poolPrefix(name));
    const objects: Array<{ key: string; lastModified: Date }> = [];
    try {
      for await (const o of store.list(prefix)) objects.push({ key: o.key.slice(prefix.length), lastModified: o.lastModified });
      const plan = planRetention({
        objects,
        retentionSeconds: pool.spec.snapshots?.retentionSeconds ?? 604_800,
        now,
        incompleteGraceMs: this.o.incompleteGraceMs,
        // Read after the listing: a snapshot listed was stored before any record named it.
        named: namedSnapshots(this.o.secrets.list(pool.spec.namespace)),
      });
      if (plan.kept || plan.deferred) {
        this.o.log.info({ pool: name, kept: plan.kept, deferred: plan.deferred }, 'kept snapshots due for deletion: named by sleeping boxes (kept), or written within the grace (deferred)');
      }
      if (plan.deletes.length) await store.delete(plan.deletes.map((k) => prefix + k));
      const deleted = new Set(plan.deletes);
      const swept = await sweepPlatformObjects({
        store,
        pool: name,
        stored: new Set(objects.filter((o) => !deleted.has(o.key)).map((o) => o.key.split('/')[1] ?? '')),
        retentionSeconds: pool.spec.snapshots?.retentionSeconds ?? 604_800,
        now,
        graceMs: this.o.incompleteGraceMs,
        records: this.o.secrets.list(pool.spec.namespace),
      });
      if (swept.markers || swept.outputSessions) this.o.log.info({ pool: name, ...swept }, 'deleted index markers of gone snapshots and session outputs past retention');
      // Multipart uploads a failed bridge never completed nor aborted still hold their parts.
      let aborted = 0;
      for await (const u of store.listUploads(prefix)) {
        if (u.initiated.getTime() + this.o.incompleteGraceMs > now) continue;
        await store.abortUpload(u.key, u.uploadId);
        aborted++;
      }
      if (plan.expired) this.o.metrics.snapshotsDeleted.inc({ reason: 'expired' }, plan.expired);
      if (plan.incomplete + aborted) this.o.metrics.snapshotsDeleted.inc({ reason: 'incomplete' }, plan.incomplete + aborted);
      if (plan.expired || plan.incomplete || aborted) {
        this.o.log.info({ pool: name, expired: plan.expired, incomplete: plan.incomplete, abortedUploads: aborted }, 'deleted snapshots');
        await this.o.events.record(pool, {
          type: 'Normal',
          reason: 'SnapshotsDeleted',
          message:
            `Deleted ${plan.expired} expired snapshot(s)` +
            (plan.incomplete + aborted ? ` and ${plan.incomplete + aborted} incomplete one(s)` : '') +
            (plan.kept ? `; kept ${plan.kept} due one(s) that sleeping boxes need` : ''),
        });
      }
      const nextAt = Math.min(plan.nextDueAt ?? Infinity, now + this.o.sweepIntervalMs);
      this.swept.set(name, { generation: pool.metadata.generation, nextAt });
      return { requeueAfterMs: Math.max(0, nextAt - now) };
    } catch (err) {
      // The queue retries with backoff; the event (rate-limited per pool) tells kubectl users.
      await this.o.events.record(pool, {
        type: 'Warning',
        reason: 'SnapshotRetentionFailed',
        message: `Could not sweep expired snapshots: ${err instanceof Error ? err.message : String(err)}`,
      });
      throw err;
    }
  }
}
