// Leader election on a coordination.k8s.io/v1 Lease (client-node has no elector). Same rules as
// client-go's: writes are optimistic (replace with the read resourceVersion, so two candidates
// cannot both win), and expiry is judged by when *this* process last saw the record change,
// never by comparing another machine's renewTime with our clock.
//
// Timing, all on the monotonic clock (a wall-clock step must not extend or cut a lease):
// - every lease call has a timeout (callTimeoutMs), so a hung API server cannot hold a tick;
// - a leader steps down by a timer at (send time of its last successful renew) + renewDeadlineMs,
//   whatever calls are in flight then; a renew that succeeds after that does not revive it;
// - a candidate takes over only after the record stayed unchanged for leaseDurationSeconds since
//   it saw it (timed from when its read returned, the later and safer instant).
// With renewDeadline < leaseDuration the old leader stops before anyone may start: the margin
// (3 s with the defaults) absorbs clock-rate differences. A write the old leader sent before its
// deadline can still land later (a frozen API server processes it when thawed); that write is
// the reconcile of a level-based controller, which the new leader's next pass re-levels.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { isConflict, isNotFound, apiMessage, makeApiClient } from '../common/kube.js';
import { realTimers, type Timers } from './work-queue.js';

export interface LeaseState {
  holderIdentity?: string;
  leaseDurationSeconds?: number;
  resourceVersion?: string;
}

/** The last distinct lease record we saw, and our (monotonic) time when we saw it. */
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

/** The three calls an elector makes on its Lease; each must settle within its own timeout. */
export interface LeaseClient {
  /** The lease, or undefined when it does not exist. */
  read(): Promise<k8s.V1Lease | undefined>;
  create(body: k8s.V1Lease): Promise<k8s.V1Lease>;
  /** Replace guarded by body.metadata.resourceVersion (409 when the lease changed since). */
  replace(body: k8s.V1Lease): Promise<k8s.V1Lease>;
}

/** A LeaseClient on the API server whose every call is aborted after timeoutMs. */
export function kubeLeaseClient(kc: k8s.KubeConfig, namespace: string, name: string, timeoutMs: number): LeaseClient {
  const api = makeApiClient(kc, k8s.CoordinationV1Api, timeoutMs);
  return {
    read: () =>
      api.readNamespacedLease({ name, namespace }).catch((err: unknown) => {
        if (isNotFound(err)) return undefined;
        throw err;
      }),
    create: (body) => api.createNamespacedLease({ namespace, body }),
    replace: (body) => api.replaceNamespacedLease({ name, namespace, body }),
  };
}

export interface LeaderElectorOptions {
  kc: k8s.KubeConfig;
  /** Defaults to kubeLeaseClient(kc, namespace, name, callTimeoutMs). */
  client?: LeaseClient;
  namespace: string;
  name: string;
  identity: string;
  log: Logger;
  leaseDurationSeconds?: number;
  /** How often the leader renews and candidates retry. */
  retryIntervalMs?: number;
  /** A leader that has not renewed for this long steps down (before others may take over). */
  renewDeadlineMs?: number;
  /** Timeout of each lease call (default a third of the renew deadline, at least 1 s). */
  callTimeoutMs?: number;
  /** Monotonic timers; now() must never jump (performance.now). */
  timers?: Timers;
  /** Wall clock, only for the renewTime/acquireTime written into the Lease for people to read. */
  wallClock?: () => Date;
  onStartedLeading: () => void;
  onStoppedLeading: (reason: string) => void;
}

export class LeaderElector {
  private readonly client: LeaseClient;
  private readonly timers: Timers;
  private readonly wallClock: () => Date;
  private readonly durationS: number;
  private readonly retryMs: number;
  private readonly renewDeadlineMs: number;
  private readonly log: Logger;
  private observation: Observation | undefined;
  private leading = false;
  /** Monotonic time until which we may lead: the last successful renew's send time + renewDeadline. */
  private leadingUntil = 0;
  private deadlineTimer: unknown;
  private stopped = false;
  private timer: unknown;
  private ticking: Promise<void> = Promise.resolve();

  constructor(private readonly o: LeaderElectorOptions) {
    this.timers = o.timers ?? realTimers;
    this.wallClock = o.wallClock ?? (() => new Date());
    this.durationS = o.leaseDurationSeconds ?? 10;
    this.retryMs = o.retryIntervalMs ?? 2000;
    this.renewDeadlineMs = o.renewDeadlineMs ?? 7000;
    if (this.renewDeadlineMs >= this.durationS * 1000) throw new Error('renewDeadlineMs must be shorter than the lease duration');
    const callTimeoutMs = o.callTimeoutMs ?? Math.max(1000, Math.floor(this.renewDeadlineMs / 3));
    this.client = o.client ?? kubeLeaseClient(o.kc, o.namespace, o.name, callTimeoutMs);
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
    this.setLeading(false, 'stopped');
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = this.timers.setTimeout(() => {
      this.ticking = this.tick().finally(() => this.schedule(this.retryMs));
    }, ms);
  }

  private async tick(): Promise<void> {
    try {
      const lease = await this.client.read();
      const readAt = this.timers.now();
      if (this.stopped) return;
      const rv = lease?.metadata?.resourceVersion;
      if (rv && rv !== this.observation?.resourceVersion) this.observation = { resourceVersion: rv, observedAt: readAt };
      const action = decide(
        lease && { holderIdentity: lease.spec?.holderIdentity, leaseDurationSeconds: lease.spec?.leaseDurationSeconds, resourceVersion: rv },
        this.o.identity,
        this.observation,
        readAt,
        this.durationS,
      );
      if (action === 'wait') {
        if (this.leading) this.setLeading(false, `lease taken by ${lease?.spec?.holderIdentity ?? 'another replica'}`);
        return;
      }
      const sentAt = this.timers.now();
      await this.write(action, lease);
      this.renewed(sentAt);
    } catch (err) {
      if (isConflict(err)) this.log.debug('lease changed concurrently; retrying');
      else this.log.warn({ err: apiMessage(err) }, 'lease read/write failed');
    }
  }

  /**
   * A write sent at sentAt succeeded: we may lead until sentAt + renewDeadline (others count the
   * lease from when they see it, which is later). Armed as a timer, so stepping down does not
   * wait for the next tick or for a call in flight.
   */
  private renewed(sentAt: number): void {
    const until = sentAt + this.renewDeadlineMs;
    const remaining = until - this.timers.now();
    // The answer came after the deadline: another replica may already lead. Stay down; the
    // next tick renews again (the lease still names us) and leads from a fresh deadline.
    if (remaining <= 0) return;
    this.leadingUntil = until;
    this.timers.clearTimeout(this.deadlineTimer);
    this.deadlineTimer = this.timers.setTimeout(() => this.deadlinePassed(), remaining);
    this.setLeading(true, 'lease acquired');
  }

  private deadlinePassed(): void {
    if (!this.leading) return;
    // Node's timers run on the event loop's cached, millisecond clock and may fire a little
    // before performance.now() reaches the deadline: wait out the rest rather than skip it.
    const early = this.leadingUntil - this.timers.now();
    if (early > 0) {
      this.deadlineTimer = this.timers.setTimeout(() => this.deadlinePassed(), Math.ceil(early));
      return;
    }
    this.log.error({ renewDeadlineMs: this.renewDeadlineMs }, 'could not renew the lease in time; stepping down');
    this.setLeading(false, 'renew deadline passed');
  }

  private async write(action: Exclude<LeaseDecision, 'wait'>, lease: k8s.V1Lease | undefined): Promise<void> {
    const now = new k8s.V1MicroTime(this.wallClock().getTime());
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
    const written =
      action === 'create'
        ? await this.client.create({ metadata: { name: this.o.name, namespace: this.o.namespace }, spec })
        : // Replacing with the resourceVersion we read makes a concurrent write fail with 409.
          await this.client.replace({ ...lease, metadata: { ...lease!.metadata }, spec });
    if (written.metadata?.resourceVersion) {
      this.observation = { resourceVersion: written.metadata.resourceVersion, observedAt: this.timers.now() };
    }
  }

  private async release(): Promise<void> {
    try {
      const lease = await this.client.read();
      if (lease?.spec?.holderIdentity !== this.o.identity) return;
      await this.client.replace({
        ...lease,
        spec: { ...lease.spec, holderIdentity: '', leaseDurationSeconds: 1, renewTime: new k8s.V1MicroTime(this.wallClock().getTime()) },
      });
      this.log.info('lease released');
    } catch (err) {
      this.log.warn({ err: apiMessage(err) }, 'could not release the lease; another replica takes over when it expires');
    }
  }

  private setLeading(leading: boolean, reason: string): void {
    if (!leading) this.timers.clearTimeout(this.deadlineTimer);
    if (leading === this.leading) return;
    this.leading = leading;
    this.log.info({ leading, reason }, leading ? 'became leader' : 'no longer leader');
    if (leading) this.o.onStartedLeading();
    else this.o.onStoppedLeading(reason);
  }
}
