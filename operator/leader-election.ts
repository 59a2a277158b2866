// Leader election on a coordination.k8s.io/v1 Lease (client-node has no elector). Same rules as
// client-go's: writes are optimistic (replace with the read resourceVersion, so two candidates
// cannot both win), and expiry is judged by when *this* process last saw the record change,
// never by comparing another machine's renewTime with our clock.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { isConflict, isNotFound, apiMessage } from '../common/kube.js';
import { realTimers, type Timers } from './work-queue.js';

export interface LeaseState {
  holderIdentity?: string;
  leaseDurationSeconds?: number;
  resourceVersion?: string;
}

/** The last distinct lease record we saw, and our local time when we saw it. */
export interface Observation {
  resourceVersion: string;
  observedAt: number;
}

export type LeaseDecision = 'create' | 'renew' | 'acquire' | 'wait';

export function decide(
  lease: LeaseState | undefined,
  identity: string,
  observation: Observation | undefined,
  now: number,
  defaultDurationSeconds: number,
): LeaseDecision {
  if (!lease) return 'create';
  if (lease.holderIdentity === identity) return 'renew';
  if (!lease.holderIdentity) return 'acquire';
  const durationMs = (lease.leaseDurationSeconds ?? defaultDurationSeconds) * 1000;
  // A record we have not watched for a full lease duration is not known to be stale yet.
  if (!observation || observation.resourceVersion !== lease.resourceVersion) return 'wait';
  return now >= observation.observedAt + durationMs ? 'acquire' : 'wait';
}

export interface LeaderElectorOptions {
  kc: k8s.KubeConfig;
  api?: k8s.CoordinationV1Api;
  namespace: string;
  name: string;
  identity: string;
  log: Logger;
  leaseDurationSeconds?: number;
  /** How often the leader renews and candidates retry. */
  retryIntervalMs?: number;
  /** A leader that has not renewed for this long steps down (before others may take over). */
  renewDeadlineMs?: number;
  timers?: Timers;
  onStartedLeading: () => void;
  onStoppedLeading: () => void;
}

export class LeaderElector {
  private readonly api: k8s.CoordinationV1Api;
  private readonly timers: Timers;
  private readonly durationS: number;
  private readonly retryMs: number;
  private readonly renewDeadlineMs: number;
  private readonly log: Logger;
  private observation: Observation | undefined;
  private lastRenew = 0;
  private leading = false;
  private stopped = false;
  private timer: unknown;
  private ticking: Promise<void> = Promise.resolve();

  constructor(private readonly o: LeaderElectorOptions) {
    this.api = o.api ?? o.kc.makeApiClient(k8s.CoordinationV1Api);
    this.timers = o.timers ?? realTimers;
    this.durationS = o.leaseDurationSeconds ?? 10;
    this.retryMs = o.retryIntervalMs ?? 2000;
    this.renewDeadlineMs = o.renewDeadlineMs ?? 7000;
    this.log = o.log.child({ lease: `${o.namespace}/${o.name}`, identity: o.identity });
  }

  isLeader(): boolean {
    return this.leading;
  }

  start(): void {
    this.stopped = false;
    this.schedule(0);
  }

  /** Stops campaigning; a leader gives the lease up so another replica takes over at once. */
  async stop(release = true): Promise<void> {
    this.stopped = true;
    this.timers.clearTimeout(this.timer);
    await this.ticking;
    if (this.leading && release) await this.release();
    this.setLeading(false);
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = this.timers.setTimeout(() => {
      this.ticking = this.tick().finally(() => this.schedule(this.retryMs));
    }, ms);
  }

  private async tick(): Promise<void> {
    const now = this.timers.now();
    try {
      const lease = await this.read();
      if (this.stopped) return;
      const rv = lease?.metadata?.resourceVersion;
      if (rv && rv !== this.observation?.resourceVersion) this.observation = { resourceVersion: rv, observedAt: now };
      const action = decide(
        lease && { holderIdentity: lease.spec?.holderIdentity, leaseDurationSeconds: lease.spec?.leaseDurationSeconds, resourceVersion: rv },
        this.o.identity,
        this.observation,
        now,
        this.durationS,
      );
      if (action === 'wait') {
        if (this.leading) {
          this.log.warn({ holder: lease?.spec?.holderIdentity }, 'lease taken by another replica');
          this.setLeading(false);
        }
        return;
      }
      await this.write(action, lease);
      this.lastRenew = now;
      this.setLeading(true);
    } catch (err) {
      if (isConflict(err)) this.log.debug('lease changed concurrently; retrying');
      else this.log.warn({ err: apiMessage(err) }, 'lease read/write failed');
    }
    if (this.leading && this.timers.now() - this.lastRenew > this.renewDeadlineMs) {
      this.log.error({ renewDeadlineMs: this.renewDeadlineMs }, 'could not renew the lease in time; stepping down');
      this.setLeading(false);
    }
  }

  private async read(): Promise<k8s.V1Lease | undefined> {
    try {
      return await this.api.readNamespacedLease({ name: this.o.name, namespace: this.o.namespace });
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  private async write(action: Exclude<LeaseDecision, 'wait'>, lease: k8s.V1Lease | undefined): Promise<void> {
    const now = new k8s.V1MicroTime(this.timers.now());
    const spec: k8s.V1LeaseSpec = {
      ...lease?.spec,
      holderIdentity: this.o.identity,
      leaseDurationSeconds: this.durationS,
      renewTime: now,
    };
    if (action !== 'renew') {
      spec.acquireTime = now;
      spec.leaseTransitions = (lease?.spec?.leaseTransitions ?? -1) + 1;
    }
    let written: k8s.V1Lease;
    if (action === 'create') {
      written = await this.api.createNamespacedLease({
        namespace: this.o.namespace,
        body: { metadata: { name: this.o.name, namespace: this.o.namespace }, spec },
      });
    } else {
      // Replacing with the resourceVersion we read makes a concurrent write fail with 409.
      written = await this.api.replaceNamespacedLease({
        name: this.o.name,
        namespace: this.o.namespace,
        body: { ...lease, metadata: { ...lease!.metadata }, spec },
      });
    }
    if (written.metadata?.resourceVersion) {
      this.observation = { resourceVersion: written.metadata.resourceVersion, observedAt: this.timers.now() };
    }
  }

  private async release(): Promise<void> {
    try {
      const lease = await this.read();
      if (lease?.spec?.holderIdentity !== this.o.identity) return;
      await this.api.replaceNamespacedLease({
        name: this.o.name,
        namespace: this.o.namespace,
        body: {
          ...lease,
          spec: { ...lease.spec, holderIdentity: '', leaseDurationSeconds: 1, renewTime: new k8s.V1MicroTime(this.timers.now()) },
        },
      });
      this.log.info('lease released');
    } catch (err) {
      this.log.warn({ err: apiMessage(err) }, 'could not release the lease; another replica takes over when it expires');
    }
  }

  private setLeading(leading: boolean): void {
    if (leading === this.leading) return;
    this.leading = leading;
    this.log.info({ leading }, leading ? 'became leader' : 'no longer leader');
    if (leading) this.o.onStartedLeading();
    else this.o.onStoppedLeading();
  }
}
