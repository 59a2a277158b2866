// planWarm: how many warm boxes a pool keeps, which start, which go (pure logic); WarmPods.start's order.
import * as k8s from '@kubernetes/client-node';
import { ANNOTATIONS, LABELS, seatName } from '../common/labels.js';
import { withDefaults, type SandboxPool, type WarmPolicy } from '../common/pool.js';
import { planReaps } from './reaper.js';
import { NoSeatError, WarmPods, freeSeats, planWarm, starving } from './warm-pool.js';

const NOW = Date.parse('2030-01-01T12:00:00Z');

function pool(warm: Partial<WarmPolicy>, maxBoxes = 50): SandboxPool {
  return {
    apiVersion: 'sandbox-bridge.io/v1alpha1',
    kind: 'SandboxPool',
    metadata: { name: 'p' },
    spec: withDefaults({ namespace: 'ns', maxBoxes, warm }),
  };
}

let n = 0;
function warmPod(o: { template?: string; shape?: string; ready?: boolean; phase?: string; ageSeconds?: number; deleting?: boolean } = {}): k8s.V1Pod {
  n++;
  return {
    metadata: {
      name: `w${n}`,
      uid: `u${n}`,
      creationTimestamp: new Date(NOW - (o.ageSeconds ?? 10) * 1000),
      annotations: { [ANNOTATIONS.warmTemplate]: o.template ?? 'T', ...(o.shape ? { [ANNOTATIONS.warmShape]: o.shape } : {}) },
      ...(o.deleting ? { deletionTimestamp: new Date(NOW) } : {}),
    },
    status: { phase: o.phase ?? 'Running', conditions: [{ type: 'Ready', status: o.ready === false ? 'False' : 'True' }] },
  };
}

/** The single form: one shape, the pool's default. */
const plan = (p: SandboxPool, pods: k8s.V1Pod[], extra: { active?: number; recentCreates?: number } = {}) => {
  const { count, max, minAvailable } = p.spec.warm;
  const r = planWarm({ pool: p, shapes: [{ id: 'default', template: 'T', count, max, minAvailable, recentCreates: extra.recentCreates ?? 0 }], pods, active: extra.active ?? 0, now: NOW });
  return { ...r, create: r.shapes[0]!.create };
};
const reasons = (r: ReturnType<typeof plan>) => r.remove.map((x) => `${x.pod.metadata!.name}:${x.reason}`);

test('keeps count ready, refilling what claims took', () => {
  expect(plan(pool({ count: 3 }), [])).toMatchObject({ desired: 3, create: 3, remove: [] });
  expect(plan(pool({ count: 3 }), [warmPod(), warmPod()])).toMatchObject({ desired: 3, ready: 2, create: 1, remove: [] });
  expect(plan(pool({ count: 3 }), [warmPod(), warmPod(), warmPod()])).toMatchObject({ create: 0, remove: [] });
  // A pod still starting counts: no second start for the same hole.
  expect(plan(pool({ count: 2 }), [warmPod(), warmPod({ ready: false })])).toMatchObject({ ready: 1, create: 0 });
  expect(plan(pool({ count: 0 }), [])).toMatchObject({ desired: 0, create: 0 });
});

test('never holds more than the room sessions leave under maxBoxes; a shrink lets unready ones go first', () => {
  const pods = [warmPod(), warmPod({ ready: false }), warmPod()];
  const r = plan(pool({ count: 3 }, 11), pods, { active: 9 });
  expect(r).toMatchObject({ desired: 1, create: 0 });
  expect(reasons(r)).toEqual([`${pods[1]!.metadata!.name}:surplus`, `${pods[0]!.metadata!.name}:surplus`]);
});

test('between count and max, sized by recent creates', () => {
  expect(plan(pool({ count: 2, max: 10 }), [], { recentCreates: 0 }).desired).toBe(2);
  expect(plan(pool({ count: 2, max: 10 }), [], { recentCreates: 6 }).desired).toBe(6);
  expect(plan(pool({ count: 2, max: 10 }), [], { recentCreates: 60 }).desired).toBe(10);
  expect(plan(pool({ count: 2, max: 30 }), [], { recentCreates: 60 }).create).toBe(20); // a burst refills in steps
});

test('a template change rolls: a new pod first, an old one only while minAvailable stay ready', () => {
  const old = [warmPod({ template: 'OLD' }), warmPod({ template: 'OLD' }), warmPod({ template: 'OLD' })];
  const first = plan(pool({ count: 3 }), old);
  expect(first).toMatchObject({ desired: 3, ready: 0, create: 1, remove: [] });
  const fresh = warmPod();
  const second = plan(pool({ count: 3 }), [...old, fresh]);
  expect(reasons(second)).toEqual([`${old[0]!.metadata!.name}:stale`]);
  expect(second.create).toBe(1);
  // minAvailable 1: old ones may go faster, down to one ready.
  const quick = plan(pool({ count: 3, minAvailable: 1 }), [...old, warmPod()]);
  expect(quick.remove).toHaveLength(3);
  // Old pods that are not ready go at once.
  expect(reasons(plan(pool({ count: 3 }), [warmPod({ template: 'OLD', ready: false }), warmPod(), warmPod(), warmPod()]))).toHaveLength(1);
});

test('failed and overaged warm pods are replaced; deleting ones are not counted', () => {
  const dead = warmPod({ phase: 'Failed' });
  const old = warmPod({ ageSeconds: 4000 });
  const going = warmPod({ deleting: true });
  const r = plan(pool({ count: 2 }), [dead, old, going, warmPod()]);
  expect(reasons(r)).toEqual([`${dead.metadata!.name}:failed`, `${old.metadata!.name}:recycled`]);
  expect(r.create).toBe(1);
});

// WarmPods.start against a fake API server that stops answering after a given number of calls:
// what an operator crash (or a lost connection) leaves behind at every point of a start.
class Crash extends Error {}

function fakeCore(callsBeforeCrash = Infinity, refusePod?: number) {
  const pods = new Map<string, k8s.V1Pod>();
  const secrets = new Map<string, k8s.V1Secret>();
  const calls: string[] = [];
  let uid = 0;
  const step = (what: string) => {
    if (calls.length >= callsBeforeCrash) throw new Crash(`crashed before ${what}`);
    calls.push(what);
  };
  const stamp = <T extends k8s.KubernetesObject>(o: T): T => ({ ...o, metadata: { ...o.metadata, uid: `uid-${++uid}`, creationTimestamp: new Date(NOW) } });
  const core = {
    createNamespacedSecret: async ({ body }: { body: k8s.V1Secret }) => {
      step('create secret');
      if (secrets.has(body.metadata!.name!)) throw new k8s.ApiException(409, 'exists', '{}', {});
      secrets.set(body.metadata!.name!, stamp(body));
      return secrets.get(body.metadata!.name!)!;
    },
    createNamespacedPod: async ({ body }: { body: k8s.V1Pod }) => {
      step('create pod');
      if (refusePod) throw new k8s.ApiException(refusePod, 'refused', '{}', {});
      pods.set(body.metadata!.name!, stamp(body));
      return pods.get(body.metadata!.name!)!;
    },
    deleteNamespacedSecret: async ({ name }: { name: string }) => {
      step('delete secret');
      secrets.delete(name);
      return {};
    },
    deleteNamespacedPod: async ({ name }: { name: string }) => {
      step('delete pod');
      pods.delete(name);
      return {};
    },
  };
  return { core: core as unknown as k8s.CoreV1Api, pods, secrets, calls };
}

const boxd = { image: 'boxd:test', key: Buffer.alloc(32, 1) };
const warmPool = (): SandboxPool => ({ ...pool({ count: 1 }), metadata: { name: 'p', uid: 'uid-pool' } });

/** The warm seat a pod mounts (its credential Secret), by its seat label. */
const seatOfPod = (pod: k8s.V1Pod) => seatName(Number(pod.metadata!.labels![LABELS.seat]));

test('a warm start takes a seat (its credential Secret, owned by the pool) first, then makes the pod that holds and mounts it', async () => {
  const api = fakeCore();
  await new WarmPods({ core: api.core, boxd }).start(warmPool(), 'T', freeSeats(5, new Set([0, 1, 2, 4])));
  expect(api.calls).toEqual(['create secret', 'create pod']);
  const [pod] = [...api.pods.values()];
  const [secret] = [...api.secrets.values()];
  expect(secret!.metadata!.name).toBe('box-seat-3');
  expect(pod!.metadata!.labels![LABELS.seat]).toBe('3');
  expect(secret!.metadata!.labels![LABELS.component]).toBe('box-credential');
  expect(secret!.metadata!.ownerReferences).toEqual([expect.objectContaining({ kind: 'SandboxPool', uid: 'uid-pool', controller: false })]);
  expect(pod!.spec!.volumes!.some((v) => v.secret?.secretName === secret!.metadata!.name)).toBe(true);
});

test('a seat held already (409) makes the start try the next free one; none left: NoSeatError, no pod', async () => {
  const api = fakeCore();
  api.secrets.set('box-seat-0', { metadata: { name: 'box-seat-0' } });
  await new WarmPods({ core: api.core, boxd }).start(warmPool(), 'T', freeSeats(2, new Set()));
  expect(api.calls).toEqual(expect.arrayContaining(['create pod']));
  expect([...api.pods.values()][0]!.metadata!.labels![LABELS.seat]).toBe('1');
  await expect(new WarmPods({ core: api.core, boxd }).start(warmPool(), 'T', freeSeats(2, new Set([1])))).rejects.toThrow(NoSeatError);
  expect(api.pods.size).toBe(1);
});

test('freeSeats hands out each free number once, in random order', () => {
  const next = freeSeats(10, new Set([2, 5]));
  const got: number[] = [];
  for (let n = next(); n !== undefined; n = next()) got.push(n);
  expect(got.sort((a, b) => a - b)).toEqual([0, 1, 3, 4, 6, 7, 8, 9]);
});

test('no crash point strands a pod: every pod has its seat, and a seat left without a pod is reaped after the grace', async () => {
  for (const crashAfter of [0, 1, 2]) {
    const api = fakeCore(crashAfter);
    await new WarmPods({ core: api.core, boxd }).start(warmPool(), 'T', freeSeats(5, new Set())).catch((err: unknown) => {
      if (!(err instanceof Crash)) throw err;
    });
    for (const pod of api.pods.values()) expect(api.secrets.has(seatOfPod(pod))).toBe(true);
    const reap = (now: number) =>
      planReaps({ pods: [...api.pods.values()], secrets: [...api.secrets.values()], defaultTtlSeconds: 3600, now, orphanGraceMs: 30_000 }).reaps.map((r) => r.name);
    expect(reap(NOW)).toEqual([]); // the pod may be moments away
    const stranded = [...api.secrets.keys()].filter((s) => ![...api.pods.values()].some((p) => seatOfPod(p) === s));
    expect(reap(NOW + 30_000)).toEqual(stranded);
    expect(stranded).toHaveLength(crashAfter === 1 ? 1 : 0);
  }
});

test("a pod the API server refused takes its seat along; one whose create may have happened (no answer, 5xx) leaves it to the reaper", async () => {
  const refused = fakeCore(Infinity, 403);
  await expect(new WarmPods({ core: refused.core, boxd }).start(warmPool(), 'T', freeSeats(5, new Set()))).rejects.toThrow();
  expect([refused.calls, refused.secrets.size]).toEqual([['create secret', 'create pod', 'delete secret'], 0]);
  const unsure = fakeCore(Infinity, 504);
  await expect(new WarmPods({ core: unsure.core, boxd }).start(warmPool(), 'T', freeSeats(5, new Set()))).rejects.toThrow();
  expect([unsure.calls, unsure.secrets.size]).toEqual([['create secret', 'create pod'], 1]);
});

test('warm pods hold seats: sleeping boxes keep theirs, so fewer warm ones fit under maxBoxes', () => {
  expect(plan(pool({ count: 5 }, 10), [], { active: 6 }).desired).toBe(3);
  expect(planWarm({ pool: pool({ count: 5 }, 10), shapes: [{ id: 'default', template: 'T', count: 5, recentCreates: 0 }], pods: [], active: 2, sleeping: 4, now: NOW }).desired).toBe(3);
});

test('a warm pod let go frees its seat at once (as the cache saw it), after the pod is gone', async () => {
  const api = fakeCore();
  await new WarmPods({ core: api.core, boxd }).start(warmPool(), 'T', freeSeats(1, new Set()));
  const [pod] = [...api.pods.values()];
  const seat = api.secrets.get('box-seat-0')!;
  await new WarmPods({ core: api.core, boxd }).remove(pod!, seat);
  expect(api.calls.slice(2)).toEqual(['delete pod', 'delete secret']);
  expect([api.pods.size, api.secrets.size]).toEqual([0, 0]);
});

test('several shapes: each kept to its count, the room under maxBoxes served in order; a shape dropped takes its pods along; an edited one rolls', () => {
  const shapes = [
    { id: 'default', template: 'D', count: 2, recentCreates: 0 },
    { id: 'shape-0', template: 'S', count: 3, recentCreates: 0 },
    { id: 'shape-1', template: 'L', count: 1, max: 4, recentCreates: 3 },
  ];
  const p = (pods: k8s.V1Pod[], maxBoxes = 50) => planWarm({ pool: pool({ count: 2 }, maxBoxes), shapes, pods, active: 0, now: NOW });
  expect(p([]).shapes.map((s) => [s.id, s.desired, s.create])).toEqual([['default', 2, 2], ['shape-0', 3, 3], ['shape-1', 3, 3]]);
  // Room for 4 (maxBoxes 5, less one): the first shapes first.
  expect(p([], 5).shapes.map((s) => [s.id, s.desired])).toEqual([['default', 2], ['shape-0', 2], ['shape-1', 0]]);
  // Pods count per shape; older pods without a shape are the default one's.
  const r = p([warmPod({ template: 'D' }), warmPod({ shape: 'shape-0', template: 'S' }), warmPod({ shape: 'shape-9', template: 'X' })]);
  expect(r.shapes.map((s) => [s.id, s.ready, s.create])).toEqual([['default', 1, 1], ['shape-0', 1, 2], ['shape-1', 0, 3]]);
  expect(r.remove.map((x) => x.reason)).toEqual(['stale']);
  // An edited shape (new template): its old pods roll like any template change.
  const old = [warmPod({ shape: 'shape-0', template: 'OLD' }), warmPod({ shape: 'shape-0', template: 'OLD' }), warmPod({ shape: 'shape-0', template: 'OLD' })];
  const rolled = p([warmPod({ template: 'D' }), warmPod({ template: 'D' }), ...old]);
  expect(rolled.remove).toEqual([]);
  expect(rolled.shapes[1]).toMatchObject({ ready: 0, create: 1 });
});

test('warm boxes never starve real ones: a box with no room gets one warm pod out of its way (not-ready, then largest first), unscheduled ones go, none starts meanwhile', () => {
  const shapes = [
    { id: 'default', template: 'D', count: 3, recentCreates: 0 },
    { id: 'shape-0', template: 'S', count: 1, recentCreates: 0 },
  ];
  const small = [warmPod({ template: 'D' }), warmPod({ template: 'D' })];
  const big = warmPod({ shape: 'shape-0', template: 'S' });
  const stuck = warmPod({ template: 'D', ready: false });
  stuck.status!.phase = 'Pending';
  stuck.status!.conditions = [{ type: 'PodScheduled', status: 'False', reason: 'Unschedulable' }];
  const cpuOf = new Map([['default', 1], ['shape-0', 2]]);
  const p = (starving: number) => planWarm({ pool: pool({ count: 3 }), shapes, pods: [...small, big, stuck], active: 0, starving, cpuOf, now: NOW });
  expect(p(0).remove).toEqual([]);
  const r = p(1);
  expect(r.remove.map((x) => [x.pod.metadata!.name, x.reason])).toEqual([
    [stuck.metadata!.name, 'yield'],
    [big.metadata!.name, 'yield'],
  ]);
  expect(r.shapes.map((s) => s.create)).toEqual([0, 0]);
  expect(p(2).remove.map((x) => x.pod.metadata!.name)).toEqual([stuck.metadata!.name, big.metadata!.name, small[0]!.metadata!.name]);
});

test('which box pods starve: Pending and Unschedulable, not warm, not deleting', () => {
  const box = (o: Partial<k8s.V1Pod['metadata']> = {}, reason = 'Unschedulable'): k8s.V1Pod => ({
    metadata: { name: 'b', labels: {}, ...o },
    status: { phase: 'Pending', conditions: [{ type: 'PodScheduled', status: 'False', reason }] },
  });
  expect(starving(box())).toBe(true);
  expect(starving(box({ labels: { [LABELS.warm]: 'p' } }))).toBe(false);
  expect(starving(box({ deletionTimestamp: new Date() }))).toBe(false);
  expect(starving(box({}, 'SchedulingGated'))).toBe(false);
});

test("a warm pod let go never frees a seat made for another pod (the number freed and taken again meanwhile)", async () => {
  const api = fakeCore();
  await new WarmPods({ core: api.core, boxd }).start(warmPool(), 'T', freeSeats(1, new Set()));
  const [pod] = [...api.pods.values()];
  const seat = api.secrets.get('box-seat-0')!;
  expect(seat.metadata!.annotations![ANNOTATIONS.warmPod]).toBe(pod!.metadata!.name);
  const later = { ...seat, metadata: { ...seat.metadata, annotations: { [ANNOTATIONS.warmPod]: 'box-warm-later' } } };
  await new WarmPods({ core: api.core, boxd }).remove(pod!, later);
  expect(api.calls.slice(2)).toEqual(['delete pod']);
});
