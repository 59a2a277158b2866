// planWarm: how many warm boxes a pool keeps, which start, which go (pure logic); WarmPods.start's order.
import * as k8s from '@kubernetes/client-node';
import { ANNOTATIONS, warmCredentialName } from '../common/labels.js';
import { withDefaults, type SandboxPool, type WarmPolicy } from '../common/pool.js';
import { planReaps } from './reaper.js';
import { WarmPods, planWarm } from './warm-pool.js';

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
function warmPod(o: { template?: string; ready?: boolean; phase?: string; ageSeconds?: number; deleting?: boolean } = {}): k8s.V1Pod {
  n++;
  return {
    metadata: {
      name: `w${n}`,
      uid: `u${n}`,
      creationTimestamp: new Date(NOW - (o.ageSeconds ?? 10) * 1000),
      annotations: { [ANNOTATIONS.warmTemplate]: o.template ?? 'T' },
      ...(o.deleting ? { deletionTimestamp: new Date(NOW) } : {}),
    },
    status: { phase: o.phase ?? 'Running', conditions: [{ type: 'Ready', status: o.ready === false ? 'False' : 'True' }] },
  };
}

const plan = (p: SandboxPool, pods: k8s.V1Pod[], extra: { active?: number; recentCreates?: number } = {}) =>
  planWarm({ pool: p, template: 'T', pods, active: extra.active ?? 0, recentCreates: extra.recentCreates ?? 0, now: NOW });
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

test('a warm start makes the Secret first, owned by the pool, then the pod that mounts it', async () => {
  const api = fakeCore();
  await new WarmPods({ core: api.core, boxd }).start(warmPool(), 'T');
  expect(api.calls).toEqual(['create secret', 'create pod']);
  const [pod] = [...api.pods.values()];
  const [secret] = [...api.secrets.values()];
  expect(secret!.metadata!.name).toBe(warmCredentialName(pod!.metadata!.name!));
  expect(secret!.metadata!.ownerReferences).toEqual([expect.objectContaining({ kind: 'SandboxPool', uid: 'uid-pool', controller: false })]);
  expect(pod!.spec!.volumes!.some((v) => v.secret?.secretName === secret!.metadata!.name)).toBe(true);
});

test('no crash point strands a pod: every pod has its Secret, and a Secret left without a pod is reaped after the grace', async () => {
  for (const crashAfter of [0, 1, 2]) {
    const api = fakeCore(crashAfter);
    await new WarmPods({ core: api.core, boxd }).start(warmPool(), 'T').catch((err: unknown) => {
      if (!(err instanceof Crash)) throw err;
    });
    for (const name of api.pods.keys()) expect(api.secrets.has(warmCredentialName(name))).toBe(true);
    const reap = (now: number) =>
      planReaps({ pods: [...api.pods.values()], secrets: [...api.secrets.values()], defaultTtlSeconds: 3600, now, orphanGraceMs: 30_000 }).reaps.map((r) => r.name);
    expect(reap(NOW)).toEqual([]); // the pod may be moments away
    const stranded = [...api.secrets.keys()].filter((s) => ![...api.pods.keys()].some((p) => warmCredentialName(p) === s));
    expect(reap(NOW + 30_000)).toEqual(stranded);
    expect(stranded).toHaveLength(crashAfter === 1 ? 1 : 0);
  }
});

test("a pod the API server refused takes its Secret along; one whose create may have happened (no answer, 5xx) leaves it to the reaper", async () => {
  const refused = fakeCore(Infinity, 403);
  await expect(new WarmPods({ core: refused.core, boxd }).start(warmPool(), 'T')).rejects.toThrow();
  expect([refused.calls, refused.secrets.size]).toEqual([['create secret', 'create pod', 'delete secret'], 0]);
  const unsure = fakeCore(Infinity, 504);
  await expect(new WarmPods({ core: unsure.core, boxd }).start(warmPool(), 'T')).rejects.toThrow();
  expect([unsure.calls, unsure.secrets.size]).toEqual([['create secret', 'create pod'], 1]);
});
