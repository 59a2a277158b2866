import type * as k8s from '@kubernetes/client-node';
import { LABELS } from '../../common/labels.js';
import { SEAT_RETRIES, giveUpWarm, takeSeat, type GiveUp, type SeatIo } from './seat-taking.js';

const warm = (name: string, seat: number): k8s.V1Pod => ({ metadata: { name, labels: { [LABELS.seat]: String(seat) } } });

/** A pool of `max` seats as the API server holds them, and a cache that may show pods already gone. */
function pool(max: number, o: { apiSeats: Map<number, string>; cachePods: k8s.V1Pod[]; giveUp: (pod: k8s.V1Pod) => GiveUp }) {
  const sleeps: number[] = [];
  const io: SeatIo = {
    held: () => new Set(o.cachePods.map((p) => Number(p.metadata!.labels![LABELS.seat]))),
    liveHeld: async () => new Set(o.apiSeats.keys()),
    take: async (held) => {
      for (let n = 0; n < max; n++) {
        if (held.has(n) || o.apiSeats.has(n)) continue;
        o.apiSeats.set(n, 'record');
        return n;
      }
      return undefined;
    },
    spares: () => o.cachePods.filter((p) => p.metadata!.name!.startsWith('warm-')),
    giveUp: async (pod) => o.giveUp(pod),
    adoptWarm: async (n, podName) => {
      if (o.apiSeats.get(n) !== podName) return false;
      o.apiSeats.set(n, 'record');
      return true;
    },
    sleep: async (ms) => void sleeps.push(ms),
  };
  return { io, sleeps };
}

describe('takeSeat', () => {
  test('a free seat is taken without giving up any warm pod', async () => {
    const gaveUp: string[] = [];
    const { io } = pool(3, { apiSeats: new Map([[0, 'box-a']]), cachePods: [warm('box-a', 0), warm('warm-1', 1)], giveUp: (p) => (gaveUp.push(p.metadata!.name!), 'deleted') });
    expect(await takeSeat(io, 3)).toBe(2);
    expect(gaveUp).toEqual([]);
  });

  test('a full pool gives up an unclaimed warm pod and adopts its seat', async () => {
    const apiSeats = new Map([[0, 'box-a'], [1, 'warm-1']]);
    const { io } = pool(2, { apiSeats, cachePods: [warm('box-a', 0), warm('warm-1', 1)], giveUp: () => 'deleted' });
    expect(await takeSeat(io, 2)).toBe(1);
    expect(apiSeats.get(1)).toBe('record');
  });

  test('a warm pod the operator shrank away, still in the cache, has its freed seat taken', async () => {
    // The operator deleted warm-1 and its seat; this replica's watch has not shown that yet.
    const apiSeats = new Map([[0, 'box-a']]);
    const { io, sleeps } = pool(2, { apiSeats, cachePods: [warm('box-a', 0), warm('warm-1', 1)], giveUp: () => 'gone' });
    expect(await takeSeat(io, 2)).toBe(1);
    expect(sleeps).toEqual([]);
  });

  test('its seat not freed yet: waited for, then taken', async () => {
    const apiSeats = new Map([[0, 'box-a'], [1, 'old-owner']]);
    const { io, sleeps } = pool(2, { apiSeats, cachePods: [warm('box-a', 0), warm('warm-1', 1)], giveUp: () => 'gone' });
    const freed = io.sleep;
    io.sleep = async (ms) => {
      await freed(ms);
      apiSeats.delete(1); // the reaper frees it
    };
    expect(await takeSeat(io, 2)).toBe(1);
    expect(sleeps).toEqual([150]);
  });

  test('a pool full of boxes answers undefined at once', async () => {
    const apiSeats = new Map([[0, 'box-a'], [1, 'box-b']]);
    const { io, sleeps } = pool(2, { apiSeats, cachePods: [warm('box-a', 0), warm('box-b', 1)], giveUp: () => 'deleted' });
    expect(await takeSeat(io, 2)).toBeUndefined();
    expect(sleeps).toEqual([]);
  });

  test("a seat the cache still shows held but the API server freed (a box just deleted) is taken, not refused", async () => {
    // box-b was deleted: its record and seat are gone, its pod still in this replica's cache.
    const apiSeats = new Map([[0, 'box-a']]);
    const { io, sleeps } = pool(2, { apiSeats, cachePods: [warm('box-a', 0), warm('box-b', 1)], giveUp: () => 'deleted' });
    expect(await takeSeat(io, 2)).toBe(1);
    expect(apiSeats.get(1)).toBe('record');
    expect(sleeps).toEqual([]);
  });

  test('a warm pod claimed meanwhile is never taken: once the cache shows the claim, the pool is full', async () => {
    const apiSeats = new Map([[0, 'box-a'], [1, 'warm-1']]);
    const cachePods = [warm('box-a', 0), warm('warm-1', 1)];
    const { io, sleeps } = pool(2, {
      apiSeats,
      cachePods,
      giveUp: () => {
        cachePods[1] = warm('box-b', 1); // the watch catches up: a box now
        return 'changed';
      },
    });
    expect(await takeSeat(io, 2)).toBeUndefined();
    expect(apiSeats.get(1)).toBe('warm-1');
    expect(sleeps).toEqual([150]);
  });

  test('a spare that changed under the give-up (the kubelet updated its status) is tried again as the cache shows it next', async () => {
    const apiSeats = new Map([[0, 'box-a'], [1, 'warm-1']]);
    let tries = 0;
    const { io, sleeps } = pool(2, { apiSeats, cachePods: [warm('box-a', 0), warm('warm-1', 1)], giveUp: () => (++tries === 1 ? 'changed' : 'deleted') });
    expect(await takeSeat(io, 2)).toBe(1);
    expect(sleeps).toEqual([150]);
  });

  test('a seat held by what the cache does not show is waited for a bounded time', async () => {
    const apiSeats = new Map([[0, 'box-a'], [1, 'unseen']]);
    const { io, sleeps } = pool(2, { apiSeats, cachePods: [warm('box-a', 0)], giveUp: () => 'deleted' });
    expect(await takeSeat(io, 2)).toBeUndefined();
    expect(sleeps).toHaveLength(SEAT_RETRIES);
    // ~5 s in all, at most 1 s apart: time for the operator to free a seat it shrank away under load.
    expect(sleeps).toEqual([150, 300, 600, 1000, 1000, 1000, 1000]);
  });
});

describe('giving up a warm pod', () => {
  /** A pod on the API server whose version moves on `bumps` times (a starting pod's status), claimed or not. */
  function apiPod(o: { bumps: number; claimAfter?: number; replaced?: boolean }) {
    let version = 1;
    let reads = 0;
    const calls: string[] = [];
    const current = (): k8s.V1Pod => ({
      metadata: {
        name: 'box-warm-a',
        uid: o.replaced && reads > 0 ? 'uid-other' : 'uid-a',
        resourceVersion: String(version),
        labels: o.claimAfter !== undefined && reads >= o.claimAfter ? {} : { [LABELS.warm]: 'pool' },
      },
    });
    const io = {
      delete: async (_name: string, uid: string, rv: string) => {
        calls.push(`delete @${rv}`);
        if (uid !== current().metadata!.uid) return 'changed' as const;
        if (rv !== String(version) || !current().metadata!.labels![LABELS.warm]) return 'changed' as const;
        return 'deleted' as const;
      },
      read: async () => {
        reads++;
        if (version <= o.bumps) version++; // it moved on again before this read
        calls.push(`read @${version}`);
        return current();
      },
    };
    return { io, calls, seen: { metadata: { name: 'box-warm-a', uid: 'uid-a', resourceVersion: '0', labels: { [LABELS.warm]: 'pool' } } } as k8s.V1Pod };
  }

  test('a starting pod whose version moved on since the watch saw it is read again and deleted at the version read', async () => {
    const { io, calls, seen } = apiPod({ bumps: 1 });
    expect(await giveUpWarm(io, seen, 'pool')).toBe('deleted');
    expect(calls).toEqual(['delete @0', 'read @2', 'delete @2']);
  });

  test('one claimed meanwhile (its warm label gone) is left alone: changed', async () => {
    const { io, calls, seen } = apiPod({ bumps: 0, claimAfter: 1 });
    expect(await giveUpWarm(io, seen, 'pool')).toBe('changed');
    expect(calls).toEqual(['delete @0', 'read @1']);
  });

  test('a pod of that name with another uid: the one given up is gone', async () => {
    const { io, seen } = apiPod({ bumps: 0, replaced: true });
    expect(await giveUpWarm(io, seen, 'pool')).toBe('gone');
  });
});
