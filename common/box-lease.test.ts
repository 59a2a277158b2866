import { jest } from '@jest/globals';
import type * as k8s from '@kubernetes/client-node';
import { BoxLeases, LeaseKeeper, epochOf, leaseExpired, leaseOf, stateOf } from './box-lease.js';
import type { RecordChange } from './box-records.js';
import { ANNOTATIONS, LABELS } from './labels.js';

/** Records with the API server's compare-and-swap on resourceVersion (merge-patch semantics). */
class MemoryRecords {
  version = 1;
  readonly byName = new Map<string, k8s.V1Secret>();

  put(name: string, labels: Record<string, string> = {}, annotations: Record<string, string> = {}): k8s.V1Secret {
    const r: k8s.V1Secret = { metadata: { name, uid: `uid-${name}`, resourceVersion: String(this.version++), labels, annotations } };
    this.byName.set(name, r);
    return structuredClone(r);
  }

  async read(name: string): Promise<k8s.V1Secret | undefined> {
    const r = this.byName.get(name);
    return r && structuredClone(r);
  }

  async swap(record: k8s.V1Secret, change: RecordChange): Promise<k8s.V1Secret | undefined> {
    const live = this.byName.get(record.metadata!.name!);
    if (!live || live.metadata!.resourceVersion !== record.metadata!.resourceVersion) return undefined;
    const merge = (into: Record<string, string> | undefined, c: Record<string, string | null> | undefined) => {
      const out = { ...into };
      for (const [k, v] of Object.entries(c ?? {})) {
        if (v === null) delete out[k];
        else out[k] = v;
      }
      return out;
    };
    live.metadata!.labels = merge(live.metadata!.labels, change.labels);
    live.metadata!.annotations = merge(live.metadata!.annotations, change.annotations);
    live.metadata!.resourceVersion = String(this.version++);
    return structuredClone(live);
  }

  /** Another writer changes something unrelated (an env update). */
  touch(name: string): void {
    this.byName.get(name)!.metadata!.resourceVersion = String(this.version++);
  }
}

describe('box leases', () => {
  let now = 1_000_000;
  const clock = () => now;
  let records: MemoryRecords;
  const leases = (identity: string) => new BoxLeases({ records, identity, durationMs: 30_000, now: clock });

  beforeEach(() => {
    now = 1_000_000;
    records = new MemoryRecords();
  });

  test('take sets the state and a lease with the next epoch; a live lease cannot be taken', async () => {
    const a = leases('a');
    const held = await a.take(records.put('box-1'), 'pending');
    expect(held).toBeDefined();
    expect(stateOf(held!.record)).toBe('pending');
    expect(leaseOf(held!.record)).toMatchObject({ holder: 'a', epoch: 1, seconds: 30 });
    expect(epochOf(held!.record)).toBe(1);
    // Another party, with the current record: refused while the lease lives.
    expect(await leases('b').take((await records.read('box-1'))!, 'waking')).toBeUndefined();
    now += 30_000;
    expect(leaseExpired(await records.read('box-1'), now)).toBe(true);
    const taken = await leases('b').take((await records.read('box-1'))!, 'pending');
    expect(leaseOf(taken!.record)).toMatchObject({ holder: 'b', epoch: 2 });
  });

  test('take fails when the record changed since it was read (the decision was on stale data)', async () => {
    const stale = records.put('box-1');
    records.touch('box-1');
    expect(await leases('a').take(stale, 'pending')).toBeUndefined();
  });

  test('update and release survive unrelated writes but never a takeover', async () => {
    const a = leases('a');
    let held = (await a.take(records.put('box-1'), 'pending'))!;
    records.touch('box-1'); // an env update
    held = (await a.update(held, { annotations: { [ANNOTATIONS.sleepSnapshot]: 'snap-1' } }))!;
    expect(held.record.metadata!.annotations![ANNOTATIONS.sleepSnapshot]).toBe('snap-1');
    records.touch('box-1');
    const released = await a.release(held, 'asleep');
    expect(stateOf(released)).toBe('asleep');
    expect(leaseOf(released)).toBeUndefined();
    expect(epochOf(released)).toBe(1); // epochs only grow

    // A holder whose lease was taken over writes nothing.
    const again = (await a.take(released!, 'waking'))!;
    now += 31_000;
    const b = (await leases('b').take((await records.read('box-1'))!, 'waking'))!;
    expect(b.lease.epoch).toBe(3);
    expect(await a.update(again)).toBeUndefined();
    expect(await a.release(again, null)).toBeUndefined();
    expect(leaseOf(await records.read('box-1'))).toMatchObject({ holder: 'b', epoch: 3 });
    expect(stateOf(await records.read('box-1'))).toBe('waking');
  });

  test('release to Running removes the state label', async () => {
    const a = leases('a');
    const held = (await a.take(records.put('box-1'), 'pending'))!;
    const released = await a.release(held, null);
    expect(released!.metadata!.labels![LABELS.sleep]).toBeUndefined();
    expect(stateOf(released)).toBeUndefined();
  });

  test('a keeper renews the lease and aborts its signal once another holder took it', async () => {
    jest.useFakeTimers();
    try {
      const a = leases('a');
      const held = (await a.take(records.put('box-1'), 'waking'))!;
      const keeper = new LeaseKeeper(a, held, clock);
      now += 10_000;
      await jest.advanceTimersByTimeAsync(10_000);
      expect(leaseOf(await records.read('box-1'))!.renewed).toBe(now);
      expect(keeper.signal.aborted).toBe(false);
      // Someone rewrites the lease (a takeover after a stall).
      const live = records.byName.get('box-1')!;
      live.metadata!.annotations![ANNOTATIONS.lease] = JSON.stringify({ holder: 'b', epoch: 9, renewed: new Date(now).toISOString(), seconds: 30 });
      records.touch('box-1');
      await jest.advanceTimersByTimeAsync(10_000);
      expect(keeper.signal.aborted).toBe(true);
      expect(await keeper.update({ annotations: { x: 'y' } })).toBeUndefined();
      await keeper.stop();
    } finally {
      jest.useRealTimers();
    }
  });

  test('a keeper gives up when no renewal succeeded for most of the lease', async () => {
    jest.useFakeTimers();
    try {
      const failing = { read: records.read.bind(records), swap: () => Promise.reject(new Error('API server down')) };
      const a = new BoxLeases({ records: failing, identity: 'a', durationMs: 30_000, now: clock });
      const held = { record: records.put('box-1'), lease: { holder: 'a', epoch: 1, renewed: now, seconds: 30 } };
      const keeper = new LeaseKeeper(a, held, clock);
      for (let i = 0; i < 2; i++) {
        now += 10_000;
        await jest.advanceTimersByTimeAsync(10_000);
      }
      expect(keeper.signal.aborted).toBe(false); // 20 s without: still within the lease
      now += 10_000;
      await jest.advanceTimersByTimeAsync(10_000);
      expect(keeper.signal.aborted).toBe(true);
      await keeper.stop();
    } finally {
      jest.useRealTimers();
    }
  });
});
