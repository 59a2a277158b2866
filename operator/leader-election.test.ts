import { jest } from '@jest/globals';
import type * as k8s from '@kubernetes/client-node';
import { pino } from 'pino';
import { decide, LeaderElector, type LeaseClient } from './leader-election.js';
import { realTimers, type Timers } from './work-queue.js';

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

/**
 * One Lease with the API server's optimistic concurrency, and a network between it and each
 * elector that can be cut: while an elector is partitioned its calls hang (as against a frozen
 * API server) until `heal`, when they reach the store (a frozen server processes what it
 * received once thawed), or until `timeoutMs` if given, when they fail as a client timeout would.
 */
class LeaseStore {
  lease: k8s.V1Lease | undefined;
  private rv = 0;
  private readonly cut = new Map<string, 'all' | 'writes'>();
  private readonly held: Array<() => void> = [];

  client(who: string, timeoutMs?: number): LeaseClient {
    const call = <T>(fn: () => T, write = true): Promise<T> => {
      const cut = this.cut.get(who);
      if (!cut || (cut === 'writes' && !write)) return Promise.resolve().then(fn);
      return new Promise<T>((resolve, reject) => {
        let timer: NodeJS.Timeout | undefined;
        if (timeoutMs !== undefined) timer = setTimeout(() => reject(new DOMException('timed out', 'TimeoutError')), timeoutMs);
        this.held.push(() => {
          clearTimeout(timer);
          try {
            resolve(fn());
          } catch (err) {
            reject(err as Error);
          }
        });
      });
    };
    return {
      read: () => call(() => structuredClone(this.lease), false),
      create: (body) =>
        call(() => {
          if (this.lease) throw Object.assign(new Error('exists'), { code: 409 });
          return this.store(body);
        }),
      replace: (body) =>
        call(() => {
          if (body.metadata?.resourceVersion !== this.lease?.metadata?.resourceVersion) throw Object.assign(new Error('conflict'), { code: 409 });
          return this.store(body);
        }),
    };
  }

  partition(who: string, what: 'all' | 'writes' = 'all'): void {
    this.cut.set(who, what);
  }

  heal(who: string): void {
    this.cut.delete(who);
    for (const release of this.held.splice(0)) release();
  }

  private store(body: k8s.V1Lease): k8s.V1Lease {
    this.lease = structuredClone({ ...body, metadata: { ...body.metadata, resourceVersion: String(++this.rv) } });
    return structuredClone(this.lease);
  }
}

/** Timers on jest's fake clock; now() is performance.now(), the monotonic clock. */
const fakeTimers: Timers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
  now: () => performance.now(),
};

interface Replica {
  elector: LeaderElector;
  /** [start, end) of each leadership term in monotonic ms; end undefined while leading. */
  terms: Array<{ start: number; end?: number; reason?: string }>;
}

function replica(store: LeaseStore, identity: string, options: { timeoutMs?: number; timers?: Timers } = {}): Replica {
  const terms: Replica['terms'] = [];
  const elector = new LeaderElector({
    kc: undefined as unknown as k8s.KubeConfig,
    client: store.client(identity, options.timeoutMs),
    namespace: 'ns',
    name: 'lease',
    identity,
    log: pino({ level: 'silent' }),
    leaseDurationSeconds: 10,
    retryIntervalMs: 2000,
    renewDeadlineMs: 7000,
    timers: options.timers ?? fakeTimers,
    onStartedLeading: () => terms.push({ start: performance.now() }),
    onStoppedLeading: (reason) => Object.assign(terms[terms.length - 1]!, { end: performance.now(), reason }),
  });
  return { elector, terms };
}

/** Advances the fake clock in small steps so promise callbacks run between timers. */
async function advance(ms: number, step = 50): Promise<void> {
  for (let t = 0; t < ms; t += step) await jest.advanceTimersByTimeAsync(Math.min(step, ms - t));
}

function overlaps(a: Replica['terms'], b: Replica['terms']): boolean {
  return a.some((x) => b.some((y) => x.start < (y.end ?? Infinity) && y.start < (x.end ?? Infinity)));
}

describe('LeaderElector timing (fake clock)', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  test('a partitioned leader whose renew hangs forever steps down by its deadline, before the standby takes over', async () => {
    const store = new LeaseStore();
    const a = replica(store, 'a');
    a.elector.start();
    await advance(100);
    const b = replica(store, 'b');
    b.elector.start();
    await advance(4000);
    expect(a.elector.isLeader()).toBe(true);
    expect(b.elector.isLeader()).toBe(false);

    // Last successful renew sent at most one retry interval before the cut.
    const cutAt = performance.now();
    store.partition('a');
    await advance(20_000);
    expect(a.terms).toHaveLength(1);
    const stoppedAt = a.terms[0]!.end!;
    expect(a.terms[0]!.reason).toBe('renew deadline passed');
    // The deadline (7 s after the last renew was sent) is kept although a.'s calls never return.
    expect(stoppedAt - cutAt).toBeLessThanOrEqual(7000);
    expect(stoppedAt - cutAt).toBeGreaterThan(7000 - 2000 - 100);
    expect(b.elector.isLeader()).toBe(true);
    expect(overlaps(a.terms, b.terms)).toBe(false);
    // Margin between the old leader stopping and the new one starting.
    expect(b.terms[0]!.start - stoppedAt).toBeGreaterThanOrEqual(2000);

    // Healing lets a.'s held calls land; its stale replace conflicts, and a. stays a standby.
    store.heal('a');
    await advance(10_000);
    expect(a.elector.isLeader()).toBe(false);
    expect(b.elector.isLeader()).toBe(true);
    expect(store.lease?.spec?.holderIdentity).toBe('b');
    expect(overlaps(a.terms, b.terms)).toBe(false);
    await b.elector.stop(false);
    await a.elector.stop(false);
  });

  test('a renew that succeeds only after the deadline does not make the replica lead again by itself', async () => {
    const store = new LeaseStore();
    const a = replica(store, 'a');
    a.elector.start();
    await advance(3000);
    expect(a.elector.isLeader()).toBe(true);
    // Reads pass, the renew write hangs.
    store.partition('a', 'writes');
    await advance(9000);
    expect(a.elector.isLeader()).toBe(false);
    expect(a.terms[0]!.reason).toBe('renew deadline passed');
    // The held renew lands now, long after the deadline: it is not taken as a licence to lead.
    store.heal('a');
    await jest.advanceTimersByTimeAsync(0);
    expect(a.elector.isLeader()).toBe(false);
    expect(a.terms).toHaveLength(1);
    // The lease still names a., so its next tick renews from a fresh deadline and leads again.
    await advance(3000);
    expect(a.elector.isLeader()).toBe(true);
    expect(a.terms).toHaveLength(2);
    await a.elector.stop(false);
  });

  test('with call timeouts, a partitioned leader keeps trying and leads again once healed if nobody took over', async () => {
    const store = new LeaseStore();
    const a = replica(store, 'a', { timeoutMs: 2333 });
    a.elector.start();
    await advance(3000);
    store.partition('a');
    await advance(12_000);
    expect(a.elector.isLeader()).toBe(false);
    store.heal('a');
    await advance(5000);
    expect(a.elector.isLeader()).toBe(true);
    await a.elector.stop(true);
    expect(store.lease?.spec?.holderIdentity).toBe('');
  });

  test('a deadline timer that fires a little early (as Node timers may against performance.now) still steps down', async () => {
    const early: Timers = { ...fakeTimers, setTimeout: (fn, ms) => setTimeout(fn, ms > 3 ? ms - 3 : ms) };
    const store = new LeaseStore();
    const a = replica(store, 'a', { timers: early });
    a.elector.start();
    await advance(3000);
    expect(a.elector.isLeader()).toBe(true);
    store.partition('a');
    await advance(9000);
    expect(a.elector.isLeader()).toBe(false);
    expect(a.terms[0]!.reason).toBe('renew deadline passed');
    store.heal('a');
    await a.elector.stop(false);
  });

  test('durations use the monotonic clock: a wall-clock jump neither expires a lease nor extends one', async () => {
    const store = new LeaseStore();
    // The production timers (realTimers), on jest's fake clock underneath.
    const a = replica(store, 'a', { timers: realTimers });
    const b = replica(store, 'b', { timers: realTimers });
    a.elector.start();
    await advance(100);
    b.elector.start();
    await advance(3000);
    expect(a.elector.isLeader()).toBe(true);
    // a. dies silently (no release). The wall clock jumps an hour ahead (NTP step, VM resume).
    await a.elector.stop(false);
    jest.setSystemTime(Date.now() + 3_600_000);
    await advance(4000);
    expect(b.elector.isLeader()).toBe(false); // 10 s have not passed on the monotonic clock
    await advance(8000);
    expect(b.elector.isLeader()).toBe(true);
    await b.elector.stop(false);
  });
});
