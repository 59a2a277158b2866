// No acknowledged write is lost to a sleep (docs/lifecycle.md, "Why no acknowledged write is
// lost"), proved where it is hardest: a bridge replica whose watches are held stale (an API proxy
// keeps their events back) writes to a box while the operator puts it to sleep, at every moment
// of the sleep — while the snapshot streams (the sleep must give up) and after the pod's delete
// (the write must wait for the sleep and land in the woken box); every write it acknowledged is
// read back afterwards. And the crash cases of the sleeper: the operator SIGKILLed mid-snapshot
// leaves a fenced box whose calls are served once the lease runs out, never a deleted pod. Plus
// seats: sleeping boxes' seats are never offered to a create (control plane only, kwok nodes).
import { randomBytes } from 'node:crypto';
import type * as k8s from '@kubernetes/client-node';
import type { RunningBridge } from '../../bridge/server.js';
import { buildBoxSecret } from '../../common/box-pod.js';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS, seatName } from '../../common/labels.js';
import { ObjectStore, ObjectStoreConfigSchema } from '../../common/object-store.js';
import { ON_REAL_NODE, ON_SIMULATED_NODES, api, startTestBridge } from '../support/bridge.js';
import { ApiProxy } from '../support/api-proxy.js';
import { realNodeAvailable } from '../support/cluster.js';
import { TEST_LEASE_SECONDS, boxPods, core, kc, metricAt, record, startLifecycle, until, type LifecycleEnv } from '../support/lifecycle.js';
import { localObjectStore } from '../support/object-store.js';

const realNode = await realNodeAvailable(kc);
const store = await localObjectStore();
const skipReason = !realNode.available ? `no real node: ${realNode.reason}` : !store.available ? `no object store: ${store.reason}` : undefined;
if (skipReason) console.warn(`SKIPPED lifecycle fence tests on the real node: ${skipReason}`);
const suite = skipReason ? describe.skip : describe;
const SMALL = { cpu: 0.25, memory: 256 };
type Call = ReturnType<typeof api>;

/** Incompressible and large enough that the sleep's snapshot streams for a few seconds. */
const FILL = 'head -c 104857600 /dev/urandom > fill.bin && echo filled';

async function writeFile(c: Call, box: string, path: string, content: string) {
  return c('PUT', `/boxes/${box}/files?path=${path}`, content, { 'content-type': 'application/octet-stream' });
}

suite('writes through a replica with a stale watch, during a sleep', () => {
  let env: LifecycleEnv;
  let proxy: ApiProxy;
  let fresh: Call;
  let stale: Call;
  let staleBridge: RunningBridge;

  beforeAll(async () => {
    env = await startLifecycle({ name: 'fence', pool: { box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: 3 } } });
    proxy = new ApiProxy(kc);
    await proxy.start();
    staleBridge = await startTestBridge(proxy.kubeConfig(), undefined, {
      POOL_NAME: env.pool.name,
      SANDBOX_NAMESPACE: env.pool.ns,
      BOX_LEASE_SECONDS: String(TEST_LEASE_SECONDS),
      ...env.storeEnv,
    });
    fresh = api(env.bridges[0]!);
    stale = api(staleBridge);
  }, 120_000);

  afterAll(async () => {
    await staleBridge?.close();
    await proxy?.stop();
    await env?.stop();
  }, 60_000);

  /**
   * A box with a large workspace, known to the stale replica; then its watches are held and the
   * test waits for the sleep to reach `moment`, writes through the stale replica, and answers what
   * it acknowledged.
   */
  async function writeDuringSleep(session: string, moment: 'snapshotting' | 'pod-deleting'): Promise<{ box: string; acked: Map<string, string> }> {
    const box = (await fresh('POST', '/boxes', { sessionId: session, ...SMALL })).json.box_id as string;
    expect((await fresh('POST', `/boxes/${box}/exec`, { command: FILL })).json.stdout).toBe('filled\n');
    expect((await writeFile(stale, box, 'seen.txt', 'the stale replica knows the box')).status).toBe(200);
    proxy.hold();
    const acked = new Map<string, string>();
    try {
      if (moment === 'snapshotting') {
        // The snapshot's upload is in the store: the fence went up before it (the sleep is past
        // its check for calls at work), and the pod is not deleted before it is stored.
        const s3 = new ObjectStore(ObjectStoreConfigSchema.parse(env.storeEnv));
        await until('the sleep snapshot to be streaming', async () => {
          for await (const upload of s3.listUploads(env.storeEnv.OBJECT_STORE_PREFIX!)) return upload;
          return undefined;
        }, 60_000, 50).finally(() => s3.close());
      } else {
        await until('the sleep to delete the pod', async () => ((await boxPods(env.pool.ns, box)).some((p) => p.metadata?.deletionTimestamp) ? true : undefined), 60_000, 50);
      }
      // Writes in a row through the stale replica, from that moment on; each one acknowledged is kept.
      for (let i = 0; i < 3; i++) {
        const content = `write ${i} ${randomBytes(4).toString('hex')}`;
        const r = await writeFile(stale, box, `w${i}.txt`, content);
        if (r.status === 200) acked.set(`w${i}.txt`, content);
        else expect([r.status, r.json?.error?.type]).toEqual([503, 'cluster_unavailable']); // refused, never lost
      }
    } finally {
      proxy.release();
    }
    return { box, acked };
  }

  async function expectAcked(box: string, acked: Map<string, string>) {
    for (const [path, content] of acked) {
      const r = await fresh('GET', `/boxes/${box}/files?path=${path}`);
      // A lost write is the one failure this suite exists for: say what the box looked like.
      if (r.status !== 200) process.stderr.write(await lostWriteReport(box, path, r));
      expect([path, r.status, r.json?.content]).toEqual([path, 200, content]);
    }
  }

  /** The box's pods, record, files and the operator's log lines about it, when a write was not found. */
  async function lostWriteReport(box: string, path: string, r: { status: number; json?: unknown }): Promise<string> {
    const ls = await fresh('POST', `/boxes/${box}/exec`, { command: 'ls -la --full-time /workspace' }).catch((err: unknown) => ({ json: String(err) }));
    const pods = (await boxPods(env.pool.ns, box)).map((p) => ({ uid: p.metadata?.uid, created: p.metadata?.creationTimestamp, deleting: p.metadata?.deletionTimestamp, ip: p.status?.podIP, annotations: p.metadata?.annotations }));
    const rec = await record(env.pool.ns, box).catch(() => undefined);
    const log = env.operator.logs().split('\n').filter((l) => l.includes(box)).join('\n');
    return `\n[lifecycle-fence] ${path} of ${box} not found after it was acknowledged: ${r.status} ${JSON.stringify(r.json)}\nfiles: ${JSON.stringify(ls.json)}\npods: ${JSON.stringify(pods)}\nrecord: ${JSON.stringify({ labels: rec?.metadata?.labels, annotations: rec?.metadata?.annotations })}\noperator log:\n${log}\n`;
  }

  test('a write while the snapshot streams makes the sleep give up: acknowledged, and there', async () => {
    const { box, acked } = await writeDuringSleep('stale-during-snapshot', 'snapshotting');
    expect(acked.size).toBeGreaterThanOrEqual(1);
    await expectAcked(box, acked);
    expect(await metricAt(staleBridge.metricsUrl, 'sandbox_bridge_box_fences_met_total', { outcome: 'aborted' })).toBeGreaterThanOrEqual(1);
    expect((await fresh('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);

  test('a write after the pod\'s delete waits for the sleep and lands in the woken box', async () => {
    const { box, acked } = await writeDuringSleep('stale-after-delete', 'pod-deleting');
    expect(acked.size).toBeGreaterThanOrEqual(1);
    await expectAcked(box, acked);
    // The box went to sleep, and was woken for the write.
    expect(await metricAt(staleBridge.metricsUrl, 'sandbox_bridge_box_wakes_total', { outcome: 'ok' })).toBeGreaterThanOrEqual(1);
    expect((await fresh('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);
});

suite('the operator killed in the middle of a sleep', () => {
  let env: LifecycleEnv;
  beforeAll(async () => {
    env = await startLifecycle({ name: 'sleep-kill', pool: { box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: 3 } } });
  }, 120_000);
  afterAll(async () => {
    await env?.stop();
  }, 60_000);

  test('never costs the box its pod; a write meets the fence and is served once the lease runs out, files intact', async () => {
    const call = api(env.bridges[0]!);
    const box = (await call('POST', '/boxes', { sessionId: 'killed-mid-sleep', ...SMALL })).json.box_id as string;
    const made = await call('POST', `/boxes/${box}/exec`, { command: 'head -c 157286400 /dev/urandom > data.bin && sha256sum data.bin | cut -c1-64' });
    expect(made.json.exit_code).toBe(0);
    const pod = (await boxPods(env.pool.ns, box))[0]!;
    const s3 = new ObjectStore(ObjectStoreConfigSchema.parse(env.storeEnv));
    await until('the sleep snapshot to be streaming', async () => {
      for await (const upload of s3.listUploads(env.storeEnv.OBJECT_STORE_PREFIX!)) return upload;
      return undefined;
    }, 60_000, 100).finally(() => s3.close());
    expect((await record(env.pool.ns, box))?.metadata?.labels?.[LABELS.sleep]).toBe('pending');
    await env.operator.stop('SIGKILL');

    // The write meets the fence; the sleeper is gone, so once its lease runs out this replica lifts it.
    const t0 = performance.now();
    const written = await call('PUT', `/boxes/${box}/files?path=after.txt`, 'after the kill', { 'content-type': 'application/octet-stream' });
    const ms = performance.now() - t0;
    expect(written.status).toBe(200);
    expect(ms).toBeLessThan((TEST_LEASE_SECONDS + 10) * 1000);
    expect(await metricAt(env.bridges[0]!.metricsUrl, 'sandbox_bridge_box_fences_met_total', { outcome: 'taken_over' })).toBe(1);
    expect((await call('POST', `/boxes/${box}/exec`, { command: 'sha256sum data.bin | cut -c1-64; cat after.txt' })).json.stdout).toBe(`${made.json.stdout}after the kill`);
    expect((await boxPods(env.pool.ns, box)).map((p) => [p.metadata!.uid, p.metadata!.deletionTimestamp ?? null])).toEqual([[pod.metadata!.uid, null]]);
    const after = await record(env.pool.ns, box);
    expect(after?.metadata?.labels?.[LABELS.sleep]).toBeUndefined();
    expect(after?.metadata?.annotations?.[ANNOTATIONS.sleepSnapshot]).toBeUndefined();

    // A new operator finds nothing to resume, and puts the box to sleep properly later.
    await env.restartOperator();
    await until('the box to sleep', async () => ((await call('GET', `/boxes/${box}/status`)).json.status === 'Sleeping' ? true : undefined), 120_000);
    expect((await call('POST', `/boxes/${box}/exec`, { command: 'cat after.txt' })).json.stdout).toBe('after the kill');
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 300_000);
});

describe('seats: a create never tries the seats sleeping boxes hold', () => {
  let env: LifecycleEnv;
  beforeAll(async () => {
    env = await startLifecycle({ name: 'seats', pool: { ...ON_SIMULATED_NODES, maxBoxes: 10, idle: { sleepAfterSeconds: 0 } } });
  }, 120_000);
  afterAll(async () => {
    await env?.stop();
  }, 60_000);

  test('with 9 of 10 seats held by sleeping boxes, 10 creates in a row all get the last seat', async () => {
    const ns = env.pool.ns;
    // Nine sleeping boxes as the operator leaves them: a record marked asleep, naming its seat, and the seat it owns.
    for (let n = 0; n < 9; n++) {
      const name = `box-sleeper${n}-0`;
      const body = buildBoxSecret({ name, namespace: ns, poolName: env.pool.name, component: SECRET_COMPONENTS.record, token: 't', env: {} });
      body.metadata!.labels = { ...body.metadata!.labels, [LABELS.sleep]: 'asleep', [LABELS.session]: `sleeper${n}`.padEnd(12, '0'), [LABELS.slot]: '0' };
      const slept = { image: 'x', cpu: '100m', memory: '64Mi', createdAt: new Date().toISOString(), expiresAt: new Date(Date.now() + 3600_000).toISOString(), ttlSeconds: 3600, sleptAt: new Date().toISOString(), seat: n };
      body.metadata!.annotations = { ...body.metadata!.annotations, [ANNOTATIONS.sleepBox]: JSON.stringify(slept), [ANNOTATIONS.sleepSnapshot]: 'snap-none', [ANNOTATIONS.expiresAt]: slept.expiresAt };
      const rec = await core.createNamespacedSecret({ namespace: ns, body });
      await core.createNamespacedSecret({
        namespace: ns,
        body: {
          metadata: {
            name: seatName(n),
            labels: { [LABELS.managedBy]: 'sandbox-bridge', [LABELS.component]: SECRET_COMPONENTS.seat, [LABELS.pool]: env.pool.name },
            ownerReferences: [{ apiVersion: 'v1', kind: 'Secret', name, uid: rec.metadata!.uid!, blockOwnerDeletion: false }],
          },
        } as k8s.V1Secret,
      });
    }
    const call = api(env.bridges[0]!);
    await until('the bridge to see the sleepers', async () => ((await call('GET', '/sandboxes')).json.sandboxes.filter((s: { status: string }) => s.status === 'Sleeping').length === 9 ? true : undefined), 30_000);
    for (let i = 0; i < 10; i++) {
      const created = await call('POST', '/boxes', { sessionId: `fresh-${i}` });
      expect([i, created.status, created.json?.error?.message]).toEqual([i, 201, undefined]);
      const pod = await core.readNamespacedPod({ name: created.json.pod_name, namespace: ns });
      expect(pod.metadata?.labels?.[LABELS.seat]).toBe('9');
      expect((await call('DELETE', `/boxes/${created.json.box_id}`)).status).toBe(200);
      await until('the seat to be free again', async () => ((await core.readNamespacedSecret({ name: seatName(9), namespace: ns }).catch(() => undefined)) ? undefined : true), 30_000, 100);
    }
  }, 180_000);
});
