// Idle sleep and wake end to end: boxes on the local cluster's real node, the local cluster's
// real S3 store (versitygw), two real bridge replicas. A box idle for the pool's (short) idle time
// is snapshotted, its pod deleted and reported Sleeping; a call wakes it with its tree (binary,
// empty, symlinks, modes) and env intact; two replicas woken at once make one pod; a background
// process keeps a box awake; a store that is down leaves the box running with an Event saying so;
// a fork of the sleep snapshot is independent; a box of the warm shape wakes into a warm pod; a
// bridge killed mid-snapshot never costs the box its pod; the sleep and wake metrics count.
import { randomBytes } from 'node:crypto';
import * as k8s from '@kubernetes/client-node';
import type { RunningBridge } from '../../bridge/server.js';
import { ObjectStore, ObjectStoreConfigSchema } from '../../common/object-store.js';
import { LABELS } from '../../common/labels.js';
import { ON_REAL_NODE, TEST_BOXD_IMAGE, TEST_BOXD_KEY, api, spawnBridge, startTestBridge, testPolicy } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, realNodeAvailable, testKubeConfig } from '../support/cluster.js';
import { Pools, freePort, installCrd, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';
import { localObjectStore } from '../support/object-store.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const realNode = await realNodeAvailable(kc);
const store = await localObjectStore();
const skipReason = !realNode.available ? `no real node: ${realNode.reason}` : !store.available ? `no object store: ${store.reason}` : undefined;
if (skipReason) console.warn(`SKIPPED sleep/wake tests on the real node: ${skipReason}`);
const suite = skipReason ? describe.skip : describe;
const storeEnv = store.available ? store.env : {};
/** Short, so tests wait seconds; sweeps then run every 0.8 s. */
const SLEEP_AFTER_SECONDS = 4;

const TREE_SUM =
  'find . | LC_ALL=C sort | while read f; do if [ -L "$f" ]; then echo "$f -> $(readlink "$f")"; ' +
  'elif [ -f "$f" ]; then echo "$f $(stat -c %a "$f") $(sha256sum < "$f" | cut -c1-64)"; else echo "$f dir $(stat -c %a "$f")"; fi; done | sha256sum';

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 90_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

async function boxPods(namespace: string, boxId: string): Promise<k8s.V1Pod[]> {
  return (await core.listNamespacedPod({ namespace, labelSelector: `sandbox-bridge.io/box-id=${boxId}` })).items;
}

async function metric(bridge: RunningBridge, name: string, labels: Record<string, string> = {}): Promise<number> {
  const text = await (await fetch(`${bridge.metricsUrl}/metrics`)).text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) sum += Number(line.split(' ').at(-1));
  }
  return sum;
}

suite('idle sleep and wake on the real node with the real store', () => {
  let namespace: string;
  let bridgeA: RunningBridge;
  let bridgeB: RunningBridge;
  let call: ReturnType<typeof api>;
  let callB: ReturnType<typeof api>;
  const secret = `s3cr3t-${randomBytes(6).toString('hex')}`;
  const exec = (c: ReturnType<typeof api>, id: string, command: string) =>
    c('POST', `/boxes/${id}/exec`, { command }).then((r) => {
      expect({ status: r.status, body: r.json }).toMatchObject({ status: 200 });
      return r.json as { exit_code: number; stdout: string; stderr: string };
    });
  const sleeping = (id: string) =>
    until(`box ${id} to sleep`, async () => {
      const s = await call('GET', `/boxes/${id}/status`);
      return s.json?.status === 'Sleeping' ? s.json : undefined;
    });

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'sleep', { 'pod-security.kubernetes.io/enforce': 'restricted' });
    const policy = testPolicy(namespace, { ...ON_REAL_NODE, idle: { sleepAfterSeconds: SLEEP_AFTER_SECONDS } });
    [bridgeA, bridgeB] = await Promise.all([startTestBridge(kc, policy, storeEnv), startTestBridge(kc, policy, storeEnv)]);
    call = api(bridgeA);
    callB = api(bridgeB);
  }, 120_000);

  afterAll(async () => {
    await Promise.all([bridgeA?.close(), bridgeB?.close()]);
    await deleteTestNamespace(kc, namespace);
  });

  test('an idle box sleeps (snapshot stored, pod gone, record kept); a call wakes it with its files and env intact', async () => {
    const created = await call('POST', '/boxes', { sessionId: 'sleepy', cpu: 0.25, memory: 256, env: { FROM_CREATE: 'created' } });
    expect(created.status).toBe(201);
    const box = created.json.box_id as string;
    const made = await exec(
      call,
      box,
      'head -c 65536 /dev/urandom > blob.bin && : > empty && mkdir -p sub/deeper && echo hi > sub/a.txt && ' +
        'chmod 0600 blob.bin && chmod 0700 sub/deeper && chmod 1777 sub && chmod 0751 sub/a.txt && ln -s ../blob.bin sub/link && ln -s missing dangling && echo ok',
    );
    expect(made.stdout).toBe('ok\n');
    expect((await call('POST', `/boxes/${box}/env`, { envVars: { SECRET_TOKEN: secret, EMPTY: '' } })).status).toBe(200);
    const before = (await exec(call, box, TREE_SUM)).stdout;
    const firstPod = (await boxPods(namespace, box))[0]!.metadata!.uid;

    const status = await sleeping(box);
    expect(status).toMatchObject({ box_id: box, status: 'Sleeping', pod_name: '', session_id: 'sleepy', cpu: '250m', memory: '256Mi', snapshot_id: expect.stringMatching(/^snap-/) });
    expect(Date.parse(status.expires_at)).toBeGreaterThan(Date.now());
    expect((await boxPods(namespace, box)).filter((p) => !p.metadata?.deletionTimestamp)).toHaveLength(0);
    const record = await core.readNamespacedSecret({ name: box, namespace });
    expect(record.metadata?.labels?.['sandbox-bridge.io/sleep']).toBe('asleep');
    // Listed as Sleeping by either replica; the snapshot is in the store.
    const listed = await callB('GET', '/sandboxes?session_id=sleepy');
    expect(listed.json.sandboxes).toEqual([expect.objectContaining({ box_id: box, status: 'Sleeping' })]);
    expect((await call('GET', `/snapshots/${status.snapshot_id}`)).json).toMatchObject({ box_id: box, name: 'idle-sleep' });

    // Woken by a call through the other replica: same box id, a new pod, everything intact.
    const started = performance.now();
    expect((await exec(callB, box, TREE_SUM)).stdout).toBe(before);
    const wakeMs = performance.now() - started;
    expect((await exec(call, box, 'printf "%s|%s|%s" "$SECRET_TOKEN" "${EMPTY-unset}" "$FROM_CREATE"')).stdout).toBe(`${secret}||created`);
    const pods = (await boxPods(namespace, box)).filter((p) => !p.metadata?.deletionTimestamp);
    expect(pods).toHaveLength(1);
    expect(pods[0]!.metadata!.uid).not.toBe(firstPod);
    expect(pods[0]!.metadata!.annotations?.['sandbox-bridge.io/expires-at']).toBe(status.expires_at);
    const after = await call('GET', `/boxes/${box}/status`);
    expect(after.status).toBe(200); // Pending..Running as A's watch catches up, or Sleeping again already
    console.log(`cold wake of a small workspace answered in ${Math.round(wakeMs)} ms`);

    expect((await metric(bridgeA, 'sandbox_bridge_box_sleeps_total', { outcome: 'slept' })) + (await metric(bridgeB, 'sandbox_bridge_box_sleeps_total', { outcome: 'slept' }))).toBeGreaterThanOrEqual(1);
    expect(await metric(bridgeB, 'sandbox_bridge_box_wakes_total', { outcome: 'ok' })).toBeGreaterThanOrEqual(1);
    expect(await metric(bridgeB, 'sandbox_bridge_box_wake_duration_seconds_count')).toBeGreaterThanOrEqual(1);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);

  test('two replicas woken at once make one pod; every call is answered', async () => {
    const created = await call('POST', '/boxes', { sessionId: 'racers', cpu: 0.25, memory: 256 });
    const box = created.json.box_id as string;
    await exec(call, box, 'echo kept > kept.txt');
    await sleeping(box);
    const wakesBefore = (await metric(bridgeA, 'sandbox_bridge_box_wakes_total', { outcome: 'ok' })) + (await metric(bridgeB, 'sandbox_bridge_box_wakes_total', { outcome: 'ok' }));
    const results = await Promise.all([call, callB, call, callB, call, callB].map((c) => exec(c, box, 'cat kept.txt')));
    for (const r of results) expect(r.stdout).toBe('kept\n');
    const wakesAfter = (await metric(bridgeA, 'sandbox_bridge_box_wakes_total', { outcome: 'ok' })) + (await metric(bridgeB, 'sandbox_bridge_box_wakes_total', { outcome: 'ok' }));
    expect(wakesAfter - wakesBefore).toBe(1);
    // Every pod the box ever had since: the one it slept in is gone; one was made for the wake.
    expect((await boxPods(namespace, box)).filter((p) => !p.metadata?.deletionTimestamp)).toHaveLength(1);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);

  test('a running background process keeps its box awake (the keepalive); deleting a sleeping box deletes its record', async () => {
    const created = await call('POST', '/boxes', { sessionId: 'busy', cpu: 0.25, memory: 256 });
    const box = created.json.box_id as string;
    expect((await call('POST', `/boxes/${box}/processes`, { command: 'sleep 600' })).status).toBe(201);
    await new Promise((r) => setTimeout(r, (SLEEP_AFTER_SECONDS * 3 + 2) * 1000));
    expect((await call('GET', `/boxes/${box}/status`)).json.status).toBe('Running');
    expect(await metric(bridgeA, 'sandbox_bridge_box_sleeps_total', { outcome: 'busy' }) + (await metric(bridgeB, 'sandbox_bridge_box_sleeps_total', { outcome: 'busy' }))).toBeGreaterThanOrEqual(1);
    const procs = (await call('GET', `/boxes/${box}/processes`)).json.processes as Array<{ process_id: string }>;
    expect((await call('POST', `/boxes/${box}/processes/${procs[0]!.process_id}/signal`, { signal: 'KILL' })).status).toBe(200);
    await sleeping(box);
    expect((await callB('DELETE', `/boxes/${box}`)).json).toMatchObject({ box_id: box, status: 'Terminated' });
    // Gone at once for the replica that deleted it; for the other, once its watch shows it.
    expect((await callB('GET', `/boxes/${box}/status`)).status).toBe(404);
    await until('the record to go', async () => ((await core.readNamespacedSecret({ name: box, namespace }).catch(() => undefined)) ? undefined : true));
    await until('the other replica to answer 404', async () => ((await call('GET', `/boxes/${box}/status`)).status === 404 ? true : undefined), 10_000);
  }, 240_000);

  test('a command still running when the idle time is up keeps its box awake', async () => {
    const created = await call('POST', '/boxes', { sessionId: 'long-command', cpu: 0.25, memory: 256 });
    const box = created.json.box_id as string;
    const pod = (await boxPods(namespace, box))[0]!.metadata!.uid;
    // Longer than three idle times, with no other call meanwhile.
    expect(await exec(call, box, `sleep ${SLEEP_AFTER_SECONDS * 3 + 2}; echo done`)).toMatchObject({ exit_code: 0, stdout: 'done\n' });
    expect((await boxPods(namespace, box)).map((p) => [p.metadata!.uid, p.metadata!.deletionTimestamp ?? null])).toEqual([[pod, null]]);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 120_000);

  test('a fork of the sleep snapshot is independent of the box', async () => {
    const created = await call('POST', '/boxes', { sessionId: 'forked', cpu: 0.25, memory: 256 });
    const box = created.json.box_id as string;
    await exec(call, box, 'echo original > note.txt');
    const { snapshot_id: snapshotId } = await sleeping(box);
    const fork = await callB('POST', '/boxes', { sessionId: 'fork-of-sleeper', snapshot_id: snapshotId });
    expect(fork.status).toBe(201);
    await exec(callB, fork.json.box_id, 'echo changed > note.txt');
    expect((await exec(call, box, 'cat note.txt')).stdout).toBe('original\n');
    expect((await exec(call, fork.json.box_id, 'cat note.txt')).stdout).toBe('changed\n');
    await Promise.all([call('DELETE', `/boxes/${box}`), call('DELETE', `/boxes/${fork.json.box_id}`)]);
  }, 240_000);
});

suite('idle sleep with the object store down', () => {
  let namespace: string;
  let bridge: RunningBridge;
  let call: ReturnType<typeof api>;

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'sleep-down', { 'pod-security.kubernetes.io/enforce': 'restricted' });
    const policy = testPolicy(namespace, { ...ON_REAL_NODE, idle: { sleepAfterSeconds: 2 } });
    // A closed port: the store refuses every connection.
    bridge = await startTestBridge(kc, policy, { ...storeEnv, OBJECT_STORE_ENDPOINT: `http://127.0.0.1:${await freePort()}` });
    call = api(bridge);
  }, 120_000);

  afterAll(async () => {
    await bridge?.close();
    await deleteTestNamespace(kc, namespace);
  });

  test('the box keeps running with nothing lost, and an Event on its pod says why', async () => {
    const created = await call('POST', '/boxes', { sessionId: 'store-down', cpu: 0.25, memory: 256 });
    const box = created.json.box_id as string;
    expect((await call('POST', `/boxes/${box}/exec`, { command: 'echo safe > kept.txt' })).status).toBe(200);
    const pod = (await boxPods(namespace, box))[0]!;
    const event = await until('a SleepFailed event', async () => {
      const events = await core.listNamespacedEvent({ namespace, fieldSelector: `involvedObject.uid=${pod.metadata!.uid}` });
      return events.items.find((e) => e.reason === 'SleepFailed');
    }, 60_000);
    expect(event.type).toBe('Warning');
    expect(event.message).toMatch(/keeps running/);
    expect((await call('GET', `/boxes/${box}/status`)).json.status).toBe('Running');
    const record = await core.readNamespacedSecret({ name: box, namespace });
    expect(record.metadata?.labels?.['sandbox-bridge.io/sleep']).toBeUndefined();
    expect((await call('POST', `/boxes/${box}/exec`, { command: 'cat kept.txt' })).json.stdout).toBe('safe\n');
    expect(await metric(bridge, 'sandbox_bridge_box_sleeps_total', { outcome: 'error' })).toBeGreaterThanOrEqual(1);
    expect((await boxPods(namespace, box)).map((p) => p.metadata!.uid)).toEqual([pod.metadata!.uid]);
  }, 120_000);
});

suite('a bridge killed in the middle of a sleep', () => {
  const pools = new Pools(kc, `sleep-kill-${randomBytes(3).toString('hex')}`);
  let namespace: string;
  let poolName: string;

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'sleep-kill', { 'pod-security.kubernetes.io/enforce': 'restricted' });
    // Bridges as deployed: they read the pool from its SandboxPool object (no operator needed).
    await installCrd(kc);
    poolName = `pool-${namespace}`;
    await pools.create(poolName, { namespace, box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: 3 } });
  }, 120_000);

  afterAll(async () => {
    await pools.delete(poolName).catch(() => undefined);
    await deleteTestNamespace(kc, namespace);
  });

  test('never costs the box its pod; a call through another replica goes on at once, files intact', async () => {
    const env = { POOL_NAME: poolName, SANDBOX_NAMESPACE: namespace, ...storeEnv };
    const doomed = await spawnBridge(env);
    const via = api(doomed);
    const created = await via('POST', '/boxes', { sessionId: 'killed-mid-sleep', cpu: 0.25, memory: 256 });
    expect(created.status).toBe(201);
    const box = created.json.box_id as string;
    // Incompressible and large, so the snapshot takes seconds to stream.
    const made = await via('POST', `/boxes/${box}/exec`, { command: 'head -c 157286400 /dev/urandom > data.bin && sha256sum data.bin | cut -c1-64' });
    expect(made.json.exit_code).toBe(0);
    const pod = (await boxPods(namespace, box))[0]!;

    // The sleep has begun when its snapshot's upload is under way in the store.
    const s3 = new ObjectStore(ObjectStoreConfigSchema.parse(storeEnv));
    await until('the sleep snapshot to be streaming', async () => {
      for await (const upload of s3.listUploads(storeEnv.OBJECT_STORE_PREFIX!)) return upload;
      return undefined;
    }, 60_000).finally(() => s3.close());
    const record = await core.readNamespacedSecret({ name: box, namespace });
    expect(record.metadata?.labels?.['sandbox-bridge.io/sleep']).toBe('pending');
    process.kill(doomed.pid, 'SIGKILL');
    await doomed.stop();

    const survivor = await startTestBridge(kc, undefined, env);
    try {
      // The dead bridge's mark stays until it is stale (minutes); a call need not wait for it.
      const t0 = performance.now();
      const read = await api(survivor)('POST', `/boxes/${box}/exec`, { command: 'sha256sum data.bin | cut -c1-64' });
      const callMs = performance.now() - t0;
      expect(read.json).toMatchObject({ exit_code: 0, stdout: made.json.stdout });
      expect(callMs).toBeLessThan(20_000);
      // Twice the idle time on: the same pod, never deleting, the record not asleep.
      const until2 = Date.now() + 6000;
      while (Date.now() < until2) {
        const pods = await boxPods(namespace, box);
        expect(pods.map((p) => [p.metadata!.uid, p.metadata!.deletionTimestamp ?? null])).toEqual([[pod.metadata!.uid, null]]);
        await new Promise((r) => setTimeout(r, 300));
      }
      const after = await core.readNamespacedSecret({ name: box, namespace });
      expect(after.metadata?.labels?.['sandbox-bridge.io/sleep']).not.toBe('asleep');
      expect((await api(survivor)('GET', `/boxes/${box}/status`)).json.status).toBe('Running');
      expect((await api(survivor)('DELETE', `/boxes/${box}`)).status).toBe(200);
    } finally {
      await survivor.close();
    }
  }, 240_000);
});

suite('a wake into a warm box', () => {
  const pools = new Pools(kc, uniqueName('wake-warm'));
  let operator: OperatorProcess;
  let pool: { name: string; ns: string };
  let bridge: RunningBridge;
  let call: ReturnType<typeof api>;
  const warmReady = async () =>
    (await core.listNamespacedPod({ namespace: pool.ns, labelSelector: `${LABELS.warm}=${pool.name}` })).items.filter(
      (p) => !p.metadata?.deletionTimestamp && p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'),
    ).length;

  beforeAll(async () => {
    await installCrd(kc);
    operator = await startOperator({ leaseName: uniqueName('wake-lease'), shard: pools.shard, env: { BOXD_IMAGE: TEST_BOXD_IMAGE, BOXD_KEY: TEST_BOXD_KEY } });
    pool = await pools.createReady({
      maxBoxes: 6,
      box: { ...ON_REAL_NODE.box, defaultCpu: '100m', defaultMemory: '64Mi' },
      warm: { count: 1 },
      idle: { sleepAfterSeconds: 3 },
    });
    bridge = await startTestBridge(kc, undefined, { POOL_NAME: pool.name, SANDBOX_NAMESPACE: pool.ns, ...storeEnv });
    call = api(bridge);
  }, 120_000);

  afterAll(async () => {
    await bridge?.close();
    await operator?.stop();
    await pools.cleanup();
  }, 60_000);

  test('a sleeping box of the pool\'s warm shape wakes into a warm pod, its workspace restored', async () => {
    await until('a warm box', async () => ((await warmReady()) >= 1 ? true : undefined), 120_000);
    const created = await call('POST', '/boxes', { sessionId: 'wakes-warm' });
    expect(created.json.pod_name).toMatch(/^box-warm-/);
    const box = created.json.box_id as string;
    expect((await call('POST', `/boxes/${box}/exec`, { command: 'echo kept > kept.txt' })).json.exit_code).toBe(0);
    await until(`box ${box} to sleep`, async () => ((await call('GET', `/boxes/${box}/status`)).json?.status === 'Sleeping' ? true : undefined));
    await until('the warm pool to refill', async () => ((await warmReady()) >= 1 ? true : undefined), 120_000);
    const woken = await call('POST', `/boxes/${box}/exec`, { command: 'cat kept.txt' });
    expect(woken.json).toMatchObject({ exit_code: 0, stdout: 'kept\n' });
    const status = (await call('GET', `/boxes/${box}/status`)).json;
    expect(status.pod_name).toMatch(/^box-warm-/);
    expect(status.pod_name).not.toBe(created.json.pod_name);
    expect(await metric(bridge, 'sandbox_bridge_box_wakes_total', { path: 'warm', outcome: 'ok' })).toBe(1);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 300_000);
});
