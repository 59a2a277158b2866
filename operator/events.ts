// Kubernetes Events on a SandboxPool (kubectl describe sbp <name> shows them), and once-only
// events on box pods (recordOnce). The API server
// only accepts events about a cluster-scoped object in the `default` namespace (as client-go
// records them for nodes), so that is where they go. Like client-go's event spam filter, each pool
// gets a burst of individual events per window (an average of one a second); what the limit holds
// back is summed into one summary event per reconcile, so reaping 10,000 boxes does not become
// 10,000 more writes.
import { createHash, randomBytes } from 'node:crypto';
import type * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { apiMessage, isConflict } from '../common/kube.js';
import { buildEvent } from '../common/events.js';
import { KeyedLimiter } from '../common/rate-limit.js';
import { POOL_API_VERSION, POOL_KIND, type SandboxPool } from '../common/pool.js';

export const EVENT_COMPONENT = 'sandbox-bridge-operator';
export const EVENT_NAMESPACE = 'default';

export interface EventSpec {
  type: 'Normal' | 'Warning';
  reason: string;
  message: string;
}

export class EventRecorder {
  private readonly limiter: KeyedLimiter;
  private readonly suppressed = new Map<string, Map<string, number>>();

  constructor(
    private readonly core: k8s.CoreV1Api,
    private readonly log: Logger,
    private readonly instance: string,
    private readonly now: () => number = Date.now,
    burst = 25,
    perSecond = 1,
  ) {
    this.limiter = KeyedLimiter.fromRate(perSecond, burst);
  }

  /** Records the event unless the pool's budget is spent; then it is counted for flush(). */
  async record(pool: SandboxPool, event: EventSpec): Promise<void> {
    if ((await this.limiter.take(pool.metadata.name)).allowed) return this.write(pool, event);
    const byReason = this.suppressed.get(pool.metadata.name) ?? new Map<string, number>();
    byReason.set(event.reason, (byReason.get(event.reason) ?? 0) + 1);
    this.suppressed.set(pool.metadata.name, byReason);
  }

  /** Writes one summary event for what record() held back for this pool. */
  async flush(pool: SandboxPool): Promise<void> {
    const byReason = this.suppressed.get(pool.metadata.name);
    if (!byReason) return;
    this.suppressed.delete(pool.metadata.name);
    const parts = [...byReason].map(([reason, n]) => `${reason}: ${n}`).join(', ');
    await this.write(pool, {
      type: 'Normal',
      reason: 'EventsSummarized',
      message: `${[...byReason.values()].reduce((a, b) => a + b, 0)} more events not recorded individually (${parts})`,
    });
  }

  forget(poolName: string): void {
    this.suppressed.delete(poolName);
  }

  /**
   * Records an event about `target` once per `key`: the event's name is derived from the target's
   * UID and the key, so the API server refuses a second one (409), whichever replica, leader or
   * process tries. Not rate limited: the caller records one event per occurrence.
   */
  async recordOnce(target: k8s.V1ObjectReference & { name: string; namespace: string; uid: string }, key: string, event: EventSpec): Promise<'created' | 'exists' | 'failed'> {
    const name = `${target.name}.${createHash('sha256').update(`${target.uid}/${key}`).digest('hex').slice(0, 16)}`;
    try {
      await this.create(target.namespace, name, target, event);
      return 'created';
    } catch (err) {
      if (isConflict(err)) return 'exists';
      this.log.warn({ err: apiMessage(err), reason: event.reason, object: `${target.namespace}/${target.name}` }, 'could not record event');
      return 'failed';
    }
  }

  private async write(pool: SandboxPool, event: EventSpec): Promise<void> {
    const name = `${pool.metadata.name}.${this.now().toString(16)}${randomBytes(4).toString('hex')}`;
    const target = { apiVersion: POOL_API_VERSION, kind: POOL_KIND, name: pool.metadata.name, uid: pool.metadata.uid };
    try {
      await this.create(EVENT_NAMESPACE, name, target, event);
    } catch (err) {
      // Events are best effort: losing one must not fail a reconcile.
      this.log.debug({ err: apiMessage(err), reason: event.reason }, 'could not record event');
    }
  }

  private async create(namespace: string, name: string, involvedObject: k8s.V1ObjectReference & { name: string }, event: EventSpec): Promise<void> {
    const body = buildEvent({ involved: involvedObject, ...event, component: EVENT_COMPONENT, instance: this.instance, now: new Date(this.now()), name, namespace });
    await this.core.createNamespacedEvent({ namespace, body });
  }
}
