// Snapshot retention: a second reconciler of the SandboxPool (its own work queue, see
// controller.ts). It lists the pool's snapshots in the object store, deletes the expired ones
// (each snapshot's own expiry, or the pool's spec.snapshots.retentionSeconds if that is
// shorter) and what failed snapshots left behind, and asks to run again when the next one falls
// due: RequeueAfter, never a timer. The store is not watched, so snapshots taken meanwhile are
// seen at the next sweep, at most sweepIntervalMs later.
import type { Logger } from 'pino';
import type { ObjectStore } from '../common/object-store.js';
import type { SandboxPool } from '../common/pool.js';
import { METADATA_OBJECT, parseSnapshotId, poolPrefix, snapshotDeadline } from '../common/snapshots.js';
import type { EventRecorder } from './events.js';
import type { OperatorMetrics } from './metrics.js';
import type { Lister, ReconcileResult } from './pool-reconciler.js';

export interface RetentionInput {
  /** The pool's objects: keys relative to the pool's prefix ("<hash>/<snapshot id>/<object>"). */
  objects: ReadonlyArray<{ key: string; lastModified: Date }>;
  retentionSeconds: number;
  now: number;
  /** A snapshot whose metadata never arrived (its bridge failed mid-way) is removed after this. */
  incompleteGraceMs: number;
}

export interface RetentionPlan {
  /** Keys to delete, relative like the input's. */
  deletes: string[];
  expired: number;
  incomplete: number;
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
  const plan: RetentionPlan = { deletes: [], expired: 0, incomplete: 0 };
  const due = (at: number) => {
    if (plan.nextDueAt === undefined || at < plan.nextDueAt) plan.nextDueAt = at;
  };
  for (const [name, group] of groups) {
    const id = parseSnapshotId(name);
    if (!id) continue;
    const deadline = snapshotDeadline(id, input.retentionSeconds);
    if (deadline <= input.now) {
      plan.deletes.push(...group.keys);
      plan.expired++;
    } else if (!group.complete && group.newest + input.incompleteGraceMs <= input.now) {
      plan.deletes.push(...group.keys);
      plan.incomplete++;
    } else {
      due(group.complete ? deadline : Math.min(deadline, group.newest + input.incompleteGraceMs));
    }
  }
  return plan;
}

export interface RetentionOptions {
  store: ObjectStore;
  pools: Lister<SandboxPool>;
  events: EventRecorder;
  metrics: OperatorMetrics;
  log: Logger;
  /** The longest wait between two sweeps of a pool (new snapshots are only seen by a sweep). */
  sweepIntervalMs: number;
  incompleteGraceMs: number;
  now?: () => number;
}

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
      });
      if (plan.deletes.length) await store.delete(plan.deletes.map((k) => prefix + k));
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
          message: `Deleted ${plan.expired} expired snapshot(s)` + (plan.incomplete + aborted ? ` and ${plan.incomplete + aborted} incomplete one(s)` : ''),
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
