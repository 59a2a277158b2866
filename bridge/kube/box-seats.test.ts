import type * as k8s from '@kubernetes/client-node';
import { BridgeError } from '../../common/errors.js';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS, seatName } from '../../common/labels.js';
import { BoxSeats } from './box-seats.js';
import type { KubeCall } from './instrument.js';

/** Secrets by name, as the API server keeps them: creates collide on names, deletes check preconditions. */
function secrets(initial: k8s.V1Secret[], pods: string[] = []) {
  const byName = new Map(initial.map((s) => [s.metadata!.name!, s]));
  const deletes: string[] = [];
  let version = 100;
  const core = {
    createNamespacedSecret: async ({ body }: { body: k8s.V1Secret }) => {
      if (byName.has(body.metadata!.name!)) throw new BridgeError('conflict', 'exists');
      byName.set(body.metadata!.name!, { ...body, metadata: { ...body.metadata, uid: `u${++version}`, resourceVersion: String(version) } });
      return byName.get(body.metadata!.name!);
    },
    readNamespacedSecret: async ({ name }: { name: string }) => {
      const s = byName.get(name);
      if (!s) throw new BridgeError('not_found', `${name} not found`);
      return s;
    },
    deleteNamespacedSecret: async ({ name, body }: { name: string; body: { preconditions: { uid: string; resourceVersion: string } } }) => {
      const s = byName.get(name);
      if (!s) throw new BridgeError('not_found', `${name} not found`);
      if (s.metadata!.uid !== body.preconditions.uid || s.metadata!.resourceVersion !== body.preconditions.resourceVersion) throw new BridgeError('conflict', 'changed');
      deletes.push(name);
      byName.delete(name);
      return s;
    },
    readNamespacedPod: async ({ name }: { name: string }) => {
      if (!pods.includes(name)) throw new BridgeError('not_found', `${name} not found`);
      return { metadata: { name } };
    },
  } as unknown as k8s.CoreV1Api;
  const call: KubeCall = (_what, fn) => fn();
  return { seats: new BoxSeats(core, call, 'ns'), byName, deletes };
}

const recordSecret = (name: string, uid: string): k8s.V1Secret => ({ metadata: { name, uid, resourceVersion: '1', labels: { [LABELS.component]: SECRET_COMPONENTS.record } } });
const recordSeat = (n: number, owner: { name: string; uid: string }): k8s.V1Secret => ({
  metadata: { name: seatName(n), uid: `seat-${n}`, resourceVersion: '7', labels: { [LABELS.component]: SECRET_COMPONENTS.seat }, ownerReferences: [{ apiVersion: 'v1', kind: 'Secret', name: owner.name, uid: owner.uid }] },
});
const warmSeat = (n: number): k8s.V1Secret => ({
  metadata: { name: seatName(n), uid: `seat-${n}`, resourceVersion: '7', labels: { [LABELS.component]: SECRET_COMPONENTS.credential }, ownerReferences: [{ apiVersion: 'sandbox-bridge.io/v1alpha1', kind: 'SandboxPool', name: 'p', uid: 'pool' }] },
});
const me = { name: 'box-new-0', uid: 'rec-new' };

describe('BoxSeats.take: a seat whose box is gone', () => {
  test('a deleted box\'s seat that garbage collection has not removed yet is freed and taken', async () => {
    const { seats, byName, deletes } = secrets([recordSeat(0, { name: 'box-old-0', uid: 'rec-old' })]);
    expect(await seats.take('p', 1, new Set(), me)).toBe(0);
    expect(deletes).toEqual([seatName(0)]);
    expect(byName.get(seatName(0))!.metadata!.ownerReferences![0]!.uid).toBe('rec-new');
  });

  test('a record of that name made again (another uid) does not hold the old seat', async () => {
    const { seats, deletes } = secrets([recordSeat(0, { name: 'box-old-0', uid: 'rec-old' }), recordSecret('box-old-0', 'rec-again')]);
    expect(await seats.take('p', 1, new Set(), me)).toBe(0);
    expect(deletes).toEqual([seatName(0)]);
  });

  test('a seat whose box exists, or a warm pod\'s seat, is never taken', async () => {
    const held = secrets([recordSeat(0, { name: 'box-old-0', uid: 'rec-old' }), recordSecret('box-old-0', 'rec-old')]);
    expect(await held.seats.take('p', 1, new Set(), me)).toBeUndefined();
    expect(held.deletes).toEqual([]);
    const warm = secrets([warmSeat(0)]);
    expect(await warm.seats.take('p', 1, new Set(), me)).toBeUndefined();
    expect(warm.deletes).toEqual([]);
  });
});

describe('BoxSeats.take: a warm seat whose pod is gone', () => {
  const minutesAgo = (m: number) => new Date(Date.now() - m * 60_000);
  const seatOfPod = (n: number, pod: string, created: Date): k8s.V1Secret => {
    const s = warmSeat(n);
    return { metadata: { ...s.metadata, creationTimestamp: created, annotations: { [ANNOTATIONS.warmPod]: pod } } };
  };

  test('a claimed box deleted a moment ago: its pod gone, its warm seat is freed and taken, not left to the reaper', async () => {
    const { seats, byName, deletes } = secrets([seatOfPod(0, 'box-warm-gone', minutesAgo(5))]);
    expect(await seats.take('p', 1, new Set(), me)).toBe(0);
    expect(deletes).toEqual([seatName(0)]);
    expect(byName.get(seatName(0))!.metadata!.ownerReferences![0]!.uid).toBe('rec-new');
  });

  test('its pod still there, or the seat young enough for its pod to be on its way: never taken', async () => {
    const alive = secrets([seatOfPod(0, 'box-warm-here', minutesAgo(5))], ['box-warm-here']);
    expect(await alive.seats.take('p', 1, new Set(), me)).toBeUndefined();
    expect(alive.deletes).toEqual([]);
    const young = secrets([seatOfPod(0, 'box-warm-starting', minutesAgo(0.1))]);
    expect(await young.seats.take('p', 1, new Set(), me)).toBeUndefined();
    expect(young.deletes).toEqual([]);
  });
});
