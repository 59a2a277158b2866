import type * as k8s from '@kubernetes/client-node';
import { BridgeError } from '../../common/errors.js';
import type { SessionBox } from '../../common/box-pod.js';
import type { BoxReader } from '../kube/box-cache.js';
import { WarmClaims, pickWarm, rendezvous } from './warm-claims.js';

const pod = (n: number, rv = 1): k8s.V1Pod => ({
  metadata: { name: `box-warm-${n}`, uid: `uid-${n}`, resourceVersion: String(rv), labels: { 'sandbox-bridge.io/seat': String(n) } },
  status: { podIP: `10.0.0.${n}` },
});

describe('pickWarm', () => {
  const pods = Array.from({ length: 20 }, (_, i) => pod(i));

  test('is deterministic per key, skips what was tried, and ends when all were', () => {
    const first = pickWarm(pods, 'box-a-0', () => false)!;
    expect(pickWarm([...pods].reverse(), 'box-a-0', () => false)).toBe(first);
    const tried = new Set<k8s.V1Pod>();
    for (let i = 0; i < pods.length; i++) tried.add(pickWarm(pods, 'box-a-0', (p) => tried.has(p))!);
    expect(tried.size).toBe(pods.length);
    expect(pickWarm(pods, 'box-a-0', (p) => tried.has(p))).toBeUndefined();
  });

  test('spreads keys evenly: first picks of 10,000 box ids over 20 pods within 20% of the mean', () => {
    const counts = new Map<string, number>();
    for (let i = 0; i < 10_000; i++) {
      const p = pickWarm(pods, `box-${i.toString(16)}-${i % 3}`, () => false)!;
      counts.set(p.metadata!.name!, (counts.get(p.metadata!.name!) ?? 0) + 1);
    }
    expect(counts.size).toBe(20);
    for (const n of counts.values()) expect(Math.abs(n - 500)).toBeLessThan(100);
  });

  test('a pod joining or leaving moves no other pod in a key\'s order', () => {
    expect(rendezvous('k', 'a')).toBe(rendezvous('k', 'a'));
    const order = (list: k8s.V1Pod[]) => {
      const out: string[] = [];
      for (;;) {
        const p = pickWarm(list, 'box-x-1', (q) => out.includes(q.metadata!.name!));
        if (!p) return out;
        out.push(p.metadata!.name!);
      }
    };
    const all = order(pods);
    expect(order(pods.filter((p) => p.metadata!.name !== all[3]))).toEqual(all.filter((n) => n !== all[3]));
  });
});

describe('WarmClaims across replicas (compare-and-swap simulated on one store)', () => {
  /** The pods as the API server holds them: a claim wins only with the version it names. */
  function cluster(n: number) {
    const live = new Map(Array.from({ length: n }, (_, i) => [`box-warm-${i}`, pod(i)]));
    const claimedBy = new Map<string, string>();
    let writes = 0;
    const core = {
      patchNamespacedPod: async (req: { name: string; body: { metadata: { resourceVersion: string; labels: Record<string, string> } } }) => {
        writes++;
        await new Promise((r) => setTimeout(r, Math.random() * 5));
        const p = live.get(req.name);
        if (!p) throw new BridgeError('not_found', 'gone');
        if (p.metadata!.resourceVersion !== req.body.metadata.resourceVersion) throw new BridgeError('conflict', 'changed');
        const next = { ...p, metadata: { ...p.metadata, resourceVersion: String(Number(p.metadata!.resourceVersion) + 1) } };
        live.set(req.name, next);
        claimedBy.set(req.name, req.body.metadata.labels['sandbox-bridge.io/box-id']!);
        return next;
      },
      deleteNamespacedPod: async () => undefined,
    } as unknown as k8s.CoreV1Api;
    /** A replica's watch: it sees the store as it was `lagMs` ago (here: claims show up after a while). */
    const cacheOf = (lagMs: number): BoxReader => {
      let view = [...live.values()].filter((p) => !claimedBy.has(p.metadata!.name!));
      const timer = setInterval(() => (view = [...live.values()].filter((p) => !claimedBy.has(p.metadata!.name!))), lagMs);
      timers.push(timer);
      return { warm: () => view } as unknown as BoxReader;
    };
    return { core, cacheOf, claimedBy, writes: () => writes };
  }
  const timers: NodeJS.Timeout[] = [];
  afterEach(() => timers.splice(0).forEach(clearInterval));

  const session = (boxId: string) => ({ boxId, sessionId: boxId, slot: 0, seat: 0, record: { name: boxId, uid: boxId }, ttlSeconds: 60, now: new Date() }) as SessionBox;
  const boxd = { health: async () => undefined, setEnv: async () => undefined } as never;

  test('20 creates through 3 replicas for 20 warm pods: every one claims a pod, none twice', async () => {
    for (let round = 0; round < 20; round++) {
      const c = cluster(20);
      const replicas = [0, 1, 2].map(
        () => new WarmClaims({ core: c.core, call: (_op, fn) => fn(), cache: c.cacheOf(20), boxd, namespace: 'ns', token: () => 't' }),
      );
      const results = await Promise.all(Array.from({ length: 20 }, (_, i) => replicas[i % 3]!.claim('pool', [{ template: 'tmpl' }], session(`box-${round}-${i}`), undefined)));
      expect(results.filter((r) => r.miss)).toEqual([]);
      expect(new Set(results.map((r) => r.pod!.metadata!.name)).size).toBe(20);
      expect(c.claimedBy.size).toBe(20);
    }
  });

  test('more creates than warm pods: the rest miss with all_taken, after trying each pod at most once per version', async () => {
    const c = cluster(5);
    const replicas = [0, 1].map(() => new WarmClaims({ core: c.core, call: (_op, fn) => fn(), cache: c.cacheOf(1000), boxd, namespace: 'ns', token: () => 't' }));
    const results = await Promise.all(Array.from({ length: 8 }, (_, i) => replicas[i % 2]!.claim('pool', [{ template: 'tmpl' }], session(`box-${i}`), undefined)));
    expect(results.filter((r) => r.pod)).toHaveLength(5);
    expect(results.filter((r) => r.miss).map((r) => r.miss)).toEqual(['all_taken', 'all_taken', 'all_taken']);
    // Each replica tries each pod version once: at most 2 x 5 writes.
    expect(c.writes()).toBeLessThanOrEqual(10);
  });

  test('no warm pod at all: none_ready, no write', async () => {
    const c = cluster(0);
    const claims = new WarmClaims({ core: c.core, call: (_op, fn) => fn(), cache: c.cacheOf(10), boxd, namespace: 'ns', token: () => 't' });
    expect(await claims.claim('pool', [{ template: 'tmpl' }], session('box-z-0'), undefined)).toEqual({ miss: 'none_ready', letGo: [] });
    expect(c.writes()).toBe(0);
  });
});

describe('resizing a claimed warm pod to the create\'s shape', () => {
  const MiB = 1024 * 1024;
  const want = { image: 'img', cpuCores: 0.5, memoryBytes: 256 * MiB };
  const sized = (n: number, node: string, cpu: string, memory: string): k8s.V1Pod => {
    const p = pod(n);
    p.spec = { nodeName: node, containers: [{ name: 'box', resources: { requests: { cpu, memory }, limits: { cpu, memory } } }] } as k8s.V1PodSpec;
    p.status = { ...p.status, containerStatuses: [{ name: 'box', resources: { limits: { cpu, memory } } } as unknown as k8s.V1ContainerStatus] };
    return p;
  };
  const session = { boxId: 'box-r-0', sessionId: 's', slot: 0, seat: -1, record: { name: 'box-r-0', uid: 'r' }, ttlSeconds: 60, now: new Date() } as SessionBox;
  const boxd = { health: async () => undefined, setEnv: async () => undefined } as never;

  function setup(pods: k8s.V1Pod[], kubelet: (p: k8s.V1Pod) => k8s.V1Pod, allocatable = { cpu: '2', memory: '4Gi' }) {
    const live = new Map(pods.map((p) => [p.metadata!.name!, p]));
    const calls: string[] = [];
    const core = {
      patchNamespacedPod: async (req: { name: string; body: { metadata: { resourceVersion: string } } }) => {
        calls.push(`claim ${req.name}`);
        const p = live.get(req.name)!;
        if (p.metadata!.resourceVersion !== req.body.metadata.resourceVersion) throw new BridgeError('conflict', 'changed');
        return p;
      },
      patchNamespacedPodResize: async (req: { name: string; body: { spec: { containers: Array<{ resources: { limits: Record<string, string> } }> } } }) => {
        calls.push(`resize ${req.name} ${JSON.stringify(req.body.spec.containers[0]!.resources.limits)}`);
        const p = live.get(req.name)!;
        p.spec!.containers[0]!.resources = req.body.spec.containers[0]!.resources;
        live.set(req.name, kubelet(p));
        return p;
      },
      deleteNamespacedPod: async (req: { name: string }) => {
        calls.push(`delete ${req.name}`);
        live.delete(req.name);
      },
    } as unknown as k8s.CoreV1Api;
    const cache = {
      warm: () => [...live.values()],
      all: () => [...live.values()],
      waitUntil: async (name: string, ready: (p: k8s.V1Pod) => boolean) => {
        const p = live.get(name);
        if (p && ready(p)) return p;
        throw new Error('timed out');
      },
    } as unknown as BoxReader;
    const nodes = { list: () => [{ metadata: { name: 'n1' }, status: { allocatable } }, { metadata: { name: 'n2' }, status: { allocatable } }] as k8s.V1Node[] };
    const claims = new WarmClaims({ core, call: (_op, fn) => fn(), cache, boxd, namespace: 'ns', token: () => 't', nodes });
    return { claims, calls, core };
  }
  const applied = (p: k8s.V1Pod): k8s.V1Pod => ({ ...p, status: { ...p.status, containerStatuses: [{ name: 'box', resources: { limits: p.spec!.containers[0]!.resources!.limits } } as k8s.V1ContainerStatus] } });
  const pending = (reason: string) => (p: k8s.V1Pod): k8s.V1Pod => ({ ...p, status: { ...p.status, conditions: [{ type: 'PodResizePending', status: 'True', reason }] } });

  test('claimed, then resized in place; handed out once the kubelet reports the new size', async () => {
    const { claims, calls } = setup([sized(1, 'n1', '1', '512Mi')], applied);
    const r = await claims.claim('pool', [{ template: 't', resize: want }], session, undefined);
    expect(r.pod?.metadata?.name).toBe('box-warm-1');
    expect(calls).toEqual(['claim box-warm-1', 'resize box-warm-1 {"cpu":"500m","memory":"256Mi"}']);
  });

  test('the kubelet defers the resize: that pod is let go, the others on its node are not tried, and the reason is counted', async () => {
    const { claims, calls } = setup([sized(1, 'n1', '100m', '128Mi'), sized(2, 'n1', '100m', '128Mi')], pending('Deferred'));
    // The pod let go names its seat: the create takes it over at once (bridge/services/boxes.ts).
    expect(await claims.claim('pool', [{ template: 't', resize: want }], session, undefined)).toEqual({ miss: 'resize_deferred', letGo: [{ seat: 1, pod: 'box-warm-1' }] });
    // The second pod is on the node that just refused: not tried.
    expect(calls.filter((c) => c.startsWith('claim'))).toHaveLength(1);
    expect(calls).toContain('delete box-warm-1');
  });

  test('a pod let go whose delete failed still holds its seat: not reported as let go', async () => {
    const { claims, core } = setup([sized(1, 'n1', '100m', '128Mi')], pending('Infeasible'));
    (core as unknown as { deleteNamespacedPod: () => Promise<never> }).deleteNamespacedPod = async () => {
      throw Object.assign(new Error('etcd timeout'), { code: 500 });
    };
    expect(await claims.claim('pool', [{ template: 't', resize: want }], session, undefined)).toEqual({ miss: 'resize_infeasible', letGo: [] });
  });

  test('no room to grow where the pod runs (allocatable less the boxes there): not claimed at all', async () => {
    const { claims, calls } = setup([sized(1, 'n1', '100m', '128Mi'), sized(2, 'n1', '1900m', '128Mi')], applied, { cpu: '2', memory: '4Gi' });
    // box-warm-2 (1900m) shrinks to 500m: fits; box-warm-1 would grow by 400m on a node with 0 free.
    const r = await claims.claim('pool', [{ template: 't', resize: want }], session, undefined);
    expect(r.pod?.metadata?.name).toBe('box-warm-2');
    expect(calls.filter((c) => c.startsWith('claim'))).toEqual(['claim box-warm-2']);
  });
});

test('the pod picked ahead of the claim is one with room to grow too', () => {
  const MiB = 1024 * 1024;
  const p = pod(1);
  p.spec = { nodeName: 'n1', containers: [{ name: 'box', resources: { requests: { cpu: '100m', memory: '128Mi' } } }] } as k8s.V1PodSpec;
  const claims = new WarmClaims({
    core: {} as k8s.CoreV1Api,
    call: (_op, fn) => fn(),
    cache: { warm: () => [p], all: () => [p] } as unknown as BoxReader,
    boxd: {} as never,
    namespace: 'ns',
    token: () => 't',
    nodes: { list: () => [{ metadata: { name: 'n1' }, status: { allocatable: { cpu: '2', memory: '4Gi' } } }] as k8s.V1Node[] },
  });
  expect(claims.prepare('pool', { template: 't', resize: { image: 'i', cpuCores: 3, memoryBytes: 128 * MiB } }, 'k', false)).toBeUndefined();
  expect(claims.prepare('pool', { template: 't', resize: { image: 'i', cpuCores: 1, memoryBytes: 128 * MiB } }, 'k', false)?.pod).toBe(p);
});
