// Box health from the operator's pod watch (never by polling the API server): OOMKilled, crashed
// and restarting containers, image pull failures, evictions, and boxes Pending longer than a
// threshold (a timer on what the watch last said, armed for the earliest one due). Every replica
// follows its pods; only the leader reports. A report is an Event on the box pod, a summary event
// on its pool, the metric sandbox_operator_box_failures_total{reason,pool}, a log line and,
// when configured, a webhook notification.
//
// Once per occurrence: in one process, keys already reported are remembered per pod (a relist or
// a repeated update yields the same keys). Across processes (a new leader, a restart) the pod
// Event is the record: its name derives from the pod UID and the key, so creating it again is a
// 409 and the new leader reports nothing it finds already recorded. Only when the Event cannot be
// written at all is the failure still counted and notified, and a later leader may then report it
// again. An occurrence that started and ended while no replica was leading is not seen.
import type * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { LABELS } from '../common/labels.js';
import type { SandboxPool } from '../common/pool.js';
import { EVENT_REASONS, failuresOf, pendingReason, pendingSince, type BoxFailure } from './box-health.js';
import type { EventRecorder } from './events.js';
import type { OperatorMetrics } from './metrics.js';
import type { WebhookNotifier } from './webhooks.js';

export interface HealthMonitorOptions {
  events: Pick<EventRecorder, 'record' | 'recordOnce'>;
  /** The pool a box pod belongs to (by its pool label or namespace), if this operator handles it. */
  poolOf: (pod: k8s.V1Pod) => SandboxPool | undefined;
  metrics: Pick<OperatorMetrics, 'boxFailures'>;
  webhooks?: Pick<WebhookNotifier, 'notify'>;
  /** A box Pending for longer than this is reported as stuck. */
  stuckPendingMs: number;
  log: Logger;
  now?: () => number;
}

/** What is kept about a pod that has failed or is Pending (healthy pods are not tracked). */
interface Tracked {
  ref: { apiVersion: 'v1'; kind: 'Pod'; name: string; namespace: string; uid: string };
  /** The pod's pool label; which pool it belongs to is decided when reporting (caches are synced then). */
  poolLabel: string;
  /** Seen and not reported yet (reported when leading). */
  unreported: Map<string, BoxFailure>;
  reported: Set<string>;
  pendingSince?: number;
  pendingReason?: string;
}

const STUCK_KEY = 'stuck_pending';

export class BoxHealthMonitor {
  private readonly tracked = new Map<string, Tracked>();
  private leading = false;
  private timer: NodeJS.Timeout | undefined;
  private readonly now: () => number;

  constructor(private readonly o: HealthMonitorOptions) {
    this.now = o.now ?? Date.now;
  }

  /**
   * A pod as the watch (or the initial list) delivers it, before the cache trims it. A pod without
   * a spec has been trimmed already, i.e. was seen at list time: nothing new.
   */
  observe(pod: k8s.V1Pod): void {
    const m = pod.metadata;
    if (!pod.spec || !m?.uid || !m.name || !m.namespace) return;
    const failures = failuresOf(pod);
    const since = pendingSince(pod);
    let t = this.tracked.get(m.uid);
    if (!t && failures.length === 0 && since === undefined) return;
    if (!t) {
      t = { ref: { apiVersion: 'v1', kind: 'Pod', name: m.name, namespace: m.namespace, uid: m.uid }, poolLabel: m.labels?.[LABELS.pool] ?? '', unreported: new Map(), reported: new Set() };
      this.tracked.set(m.uid, t);
    }
    for (const f of failures) if (!t.reported.has(f.key)) t.unreported.set(f.key, f);
    t.pendingSince = since;
    t.pendingReason = since === undefined ? undefined : pendingReason(pod);
    if (t.reported.size === 0 && t.unreported.size === 0 && since === undefined) this.tracked.delete(m.uid);
    if (this.leading) this.reportDue(t);
    this.arm();
  }

  /** The pod is gone. */
  forget(pod: k8s.V1Pod): void {
    if (pod.metadata?.uid) this.tracked.delete(pod.metadata.uid);
  }

  /** On becoming leader: report what is outstanding (what an earlier leader recorded is skipped). */
  startLeading(): void {
    this.leading = true;
    for (const t of this.tracked.values()) this.reportDue(t);
    this.arm();
  }

  stopLeading(): void {
    this.leading = false;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** Pods followed now (for tests and debugging). */
  get size(): number {
    return this.tracked.size;
  }

  private reportDue(t: Tracked): void {
    const pool = this.o.poolOf({ metadata: { namespace: t.ref.namespace, labels: { [LABELS.pool]: t.poolLabel } } });
    if (!pool) {
      this.tracked.delete(t.ref.uid); // not a box of a pool this operator handles
      return;
    }
    for (const [key, failure] of t.unreported) {
      t.unreported.delete(key);
      t.reported.add(key);
      void this.report(t, pool, failure);
    }
    if (t.pendingSince === undefined || t.reported.has(STUCK_KEY)) return;
    // A box that cannot pull its image is already reported; being Pending is its consequence.
    if ([...t.reported].some((k) => k.startsWith('image_pull_failed/'))) return;
    const waited = this.now() - t.pendingSince;
    if (waited < this.o.stuckPendingMs) return;
    t.reported.add(STUCK_KEY);
    void this.report(t, pool, { reason: 'stuck_pending', key: STUCK_KEY, message: `Pending for ${Math.round(waited / 1000)} s: ${t.pendingReason ?? ''}` });
  }

  /** One timer, for the earliest box that will have been Pending too long. */
  private arm(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    if (!this.leading) return;
    let due: number | undefined;
    for (const t of this.tracked.values()) {
      if (t.pendingSince === undefined || t.reported.has(STUCK_KEY)) continue;
      const at = t.pendingSince + this.o.stuckPendingMs;
      if (due === undefined || at < due) due = at;
    }
    if (due === undefined) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      for (const t of this.tracked.values()) this.reportDue(t);
      this.arm();
    }, Math.max(0, due - this.now()) + 10);
    this.timer.unref();
  }

  private async report(t: Tracked, pool: SandboxPool, failure: BoxFailure): Promise<void> {
    const reason = EVENT_REASONS[failure.reason];
    const recorded = await this.o.events.recordOnce(t.ref, failure.key, { type: 'Warning', reason, message: failure.message });
    if (recorded === 'exists') return; // reported before, by this or an earlier leader
    const poolName = pool.metadata.name;
    this.o.metrics.boxFailures.inc({ reason: failure.reason, pool: poolName });
    this.o.log.warn({ pool: poolName, namespace: t.ref.namespace, box: t.ref.name, reason: failure.reason, container: failure.container }, failure.message);
    await this.o.events.record(pool, { type: 'Warning', reason, message: `Box ${t.ref.name} (namespace ${t.ref.namespace}): ${failure.message}` });
    this.o.webhooks?.notify({
      reason: failure.reason,
      pool: poolName,
      namespace: t.ref.namespace,
      box: t.ref.name,
      podUid: t.ref.uid,
      ...(failure.container ? { container: failure.container } : {}),
      message: failure.message,
      occurredAt: new Date(this.now()),
    });
  }
}
