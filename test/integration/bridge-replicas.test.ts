// The bridge as a deployment: two replicas behave as one, policy comes from the SandboxPool,
// the API server's ResourceQuota holds the global cap, an unreachable cluster is a 503 (not a
// hang), metrics and probes are served unauthenticated, and SIGTERM lets in-flight work finish.
import { spawn } from 'node:child_process';
import * as k8s from '@kubernetes/client-node';
import { LABELS, sessionHash } from '../../common/labels.js';
import { withDefaults } from '../../common/pool.js';
import type { RunningBridge } from '../../bridge/server.js';
import { ON_REAL_NODE, ON_SIMULATED_NODES, TEST_BOXD_IMAGE, TEST_BOXD_KEY, TEST_TOKEN, api, startTestBridge, testConfig, testPolicy } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, realNodeAvailable, testKubeConfig, waitFor } from '../support/cluster.js';
import { Pools, installCrd, uniqueName } from '../support/operator.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { startBridge } from '../../bridge/server.js';
import { pino } from 'pino';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const realNode = await realNodeAvailable(kc);
let namespace: string;
const bridges: RunningBridge[] = [];

beforeAll(async () => {
  namespace = await createTestNamespace(kc, 'replicas', { 'pod-security.kubernetes.io/enforce': 'restricted' });
});

afterAll(async () => {
  await Promise.all(bridges.map((b) => b.close()));
  await deleteTestNamespace(kc, namespace);
});

async function replica(policy = testPolicy(namespace, ON_SIMULATED_NODES), overrides: Record<string, string> = {}) {
  const b = await startTestBridge(kc, policy, overrides);
  bridges.push(b);
  return b;
}

test('two replicas receiving creates for one session at the same moment still give it at most 3 boxes', async () => {
  const [a, b] = await Promise.all([replica(), replica()]);
  const results = await Promise.all(
    Array.from({ length: 8 }, (_, i) => api(i % 2 ? a : b)('POST', '/boxes', { sessionId: 'raced-session' })),
  );
  const created = results.filter((r) => r.status === 201);
  const refused = results.filter((r) => r.status === 429);
  expect(created.length).toBe(3);
  expect(refused.length).toBe(5);
  expect(refused.every((r) => r.json.error.type === 'quota_exceeded')).toBe(true);
  expect(new Set(created.map((r) => r.json.box_id)).size).toBe(3);
  const pods = await core.listNamespacedPod({ namespace, labelSelector: `${LABELS.session}=${sessionHash('raced-session')}` });
  expect(pods.items.length).toBe(3);

  // Either replica sees and deletes the other's boxes.
  for (const [i, r] of created.entries()) {
    const other = api(i % 2 ? a : b);
    await waitFor('box visible on both replicas', async () => ((await other('GET', `/boxes/${r.json.box_id}/status`)).status === 200 ? true : undefined));
    expect((await other('DELETE', `/boxes/${r.json.box_id}`)).status).toBe(200);
  }
});

test('the ResourceQuota makes the global cap atomic at the API server', async () => {
  const ns = await createTestNamespace(kc, 'quota', { 'pod-security.kubernetes.io/enforce': 'restricted' });
  try {
    await core.createNamespacedResourceQuota({ namespace: ns, body: { metadata: { name: 'boxes' }, spec: { hard: { pods: '2' } } } });
    await waitFor('quota status', async () => {
      const q = await core.readNamespacedResourceQuota({ name: 'boxes', namespace: ns });
      return q.status?.hard?.pods ? true : undefined;
    });
    const b = await replica(testPolicy(ns, ON_SIMULATED_NODES));
    const results = await Promise.all(['q1', 'q2', 'q3', 'q4'].map((s) => api(b)('POST', '/boxes', { sessionId: s })));
    expect(results.filter((r) => r.status === 201).length).toBe(2);
    const refused = results.filter((r) => r.status === 429);
    expect(refused.length).toBe(2);
    expect(refused[0]!.json.error).toEqual({ type: 'quota_exceeded', message: expect.stringMatching(/ResourceQuota/) });
  } finally {
    await deleteTestNamespace(kc, ns);
  }
});

test('policy comes from the SandboxPool and follows edits without a restart', async () => {
  await installCrd(kc);
  const pools = new Pools(kc, 'bridge-test');
  const poolName = uniqueName('bridge-pool');
  const poolNs = await createTestNamespace(kc, 'pooled', { 'pod-security.kubernetes.io/enforce': 'restricted' });
  try {
    await pools.create(poolName, {
      namespace: poolNs,
      maxBoxesPerSession: 1,
      allowedImages: ['example.org/allowed:1'],
      box: { ...withDefaults({ namespace: '' }).box, nodeSelector: { type: 'kwok' } },
    });
    const b = await startBridge(testConfig({ POOL_NAME: poolName, SANDBOX_NAMESPACE: 'unused' }), { kc, log: pino({ level: 'silent' }) });
    bridges.push(b);
    const call = api(b);
    expect((await call('GET', '/health')).json.namespace).toBe(poolNs);
    expect((await call('POST', '/boxes', { sessionId: 'p', image: 'example.org/allowed:1' })).status).toBe(201);
    expect((await call('POST', '/boxes', { sessionId: 'p' })).status).toBe(429);
    expect((await call('POST', '/boxes', { sessionId: 'q', image: 'example.org/other:1' })).status).toBe(403);

    await pools.patchSpec(poolName, { maxBoxesPerSession: 2 });
    await waitFor('the edit to take effect', async () => ((await call('POST', '/boxes', { sessionId: 'p' })).status === 201 ? true : undefined));

    // total_boxes_created comes from the pool status the operator keeps.
    await pools.api.patchClusterCustomObjectStatus(
      { group: 'sandbox-bridge.io', version: 'v1alpha1', plural: 'sandboxpools', name: poolName, body: { status: { totalBoxesCreated: 41 } } },
      k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
    );
    await waitFor('health to report the pool counter', async () => ((await call('GET', '/health')).json.total_boxes_created === 41 ? true : undefined));
  } finally {
    await pools.delete(poolName);
    await deleteTestNamespace(kc, poolNs);
  }
});

test('metrics and probes are served without the token, on their own port', async () => {
  const b = await replica();
  await api(b)('GET', '/health');
  await api(b, 'wrong')('GET', '/health');
  const metrics = await (await fetch(`${b.metricsUrl}/metrics`)).text();
  for (const name of [
    'sandbox_bridge_http_request_duration_seconds_bucket',
    'sandbox_bridge_exec_duration_seconds',
    'sandbox_bridge_boxes_active',
    'sandbox_bridge_boxes_created_total',
    'sandbox_bridge_rate_limited_total',
    'sandbox_bridge_kube_api_duration_seconds',
    'sandbox_bridge_kube_api_errors_total',
  ]) {
    expect(metrics).toContain(name);
  }
  expect(metrics).toMatch(/route="\/api\/v1\/health",status="200"/);
  expect(metrics).not.toContain(TEST_TOKEN);
  expect((await fetch(`${b.metricsUrl}/livez`)).status).toBe(200);
  expect((await fetch(`${b.metricsUrl}/readyz`)).status).toBe(200);
  expect((await fetch(`${b.url}/metrics`)).status).toBe(404);
});

test('more than the burst of requests with one token is a 429 with Retry-After', async () => {
  const b = await replica(undefined, { RATE_LIMIT_RPS: '5', RATE_LIMIT_BURST: '10' });
  const results = await Promise.all(Array.from({ length: 15 }, () => api(b)('GET', '/sandboxes')));
  const limited = results.filter((r) => r.status === 429);
  expect(limited.length).toBeGreaterThanOrEqual(4);
  expect(limited[0]!.json.error.type).toBe('rate_limited');
  expect(Number(limited[0]!.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
  expect(limited[0]!.headers.get('ratelimit-limit')).toBe('10'); // the burst, per burst/rps = 2 s
});

test('an unreachable or silent API server is a prompt 503, and reads keep coming from the cache', async () => {
  const proxy = TcpProxy.forApiServer(kc);
  await proxy.start();
  try {
    const b = await startTestBridge(proxy.kubeConfig(kc), testPolicy(namespace, ON_SIMULATED_NODES), { KUBE_TIMEOUT_MS: '1500' });
    bridges.push(b);
    const call = api(b);
    const box = await call('POST', '/boxes', { sessionId: 'outage' });
    expect(box.status).toBe(201);
    // The replica's watch (through the same proxy) shows the box before the outage: the cache
    // it serves reads from during the outage holds it.
    await waitFor('the box in the replica\'s cache', async () =>
      ((await call('GET', '/sandboxes')).json.sandboxes as Array<{ name: string }>).some((s) => s.name === box.json.box_id) ? true : undefined,
    { timeoutMs: 30_000 });

    proxy.set('refuse');
    let started = Date.now();
    const refused = await call('POST', '/boxes', { sessionId: 'outage-2' });
    expect(refused.status).toBe(503);
    expect(refused.json.error.type).toBe('cluster_unavailable');
    expect(Date.now() - started).toBeLessThan(10_000); // KUBE_TIMEOUT_MS is 1.5 s; a hang would be minutes
    const list = await call('GET', '/sandboxes');
    expect(list.status).toBe(200);
    expect(list.json.sandboxes.map((s: { name: string }) => s.name)).toContain(box.json.box_id);

    proxy.set('blackhole');
    started = Date.now();
    const silent = await call('DELETE', `/boxes/${box.json.box_id}`);
    expect(silent.json.error).toEqual({ type: 'cluster_unavailable', message: expect.any(String) });
    expect(silent.status).toBe(503);
    expect(Date.now() - started).toBeLessThan(10_000); // KUBE_TIMEOUT_MS is 1.5 s; a hang would be minutes

    proxy.set('forward');
    await waitFor('recovery', async () => ((await call('DELETE', `/boxes/${box.json.box_id}`)).status === 200 ? true : undefined), {
      timeoutMs: 60_000,
      intervalMs: 500,
    });
  } finally {
    await proxy.stop();
  }
}, 90_000); // recovery may take up to 60 s

describe('the bridge process', () => {
  const entry = 'dist/bridge/main.js';
  const nodeBin = process.execPath;

  test('bad configuration exits at once with a message naming the variable', async () => {
    const child = spawn(nodeBin, [entry], { env: { PATH: process.env.PATH, KUBECONFIG: process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG, LOG_LEVEL: 'loud' } });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
    expect(code).toBe(2);
    expect(stderr).toMatch(/LOG_LEVEL/);
    expect(stderr).toMatch(/BRIDGE_TOKEN/);
  });

  const realNodeTest = realNode.available ? test : test.skip;
  realNodeTest('SIGTERM stops new requests, lets an in-flight exec finish, and exits 0', async () => {
    const port = 20000 + Math.floor(Math.random() * 20000);
    // The pool puts boxes on the real node, where boxd runs commands.
    await installCrd(kc);
    const pools = new Pools(kc, 'bridge-sigterm');
    const poolName = uniqueName('sigterm-pool');
    await pools.create(poolName, { namespace, box: ON_REAL_NODE.box });
    const child = spawn(nodeBin, [entry], {
      env: {
        PATH: process.env.PATH,
        KUBECONFIG: process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG,
        BRIDGE_TOKEN: TEST_TOKEN,
        BOXD_KEY: TEST_BOXD_KEY,
        BOXD_IMAGE: TEST_BOXD_IMAGE,
        PORT: String(port),
        METRICS_PORT: String(port + 1),
        HOST: '127.0.0.1',
        SANDBOX_NAMESPACE: namespace,
        POOL_NAME: poolName,
        SHUTDOWN_GRACE_MS: '20000',
        LOG_LEVEL: 'warn',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let logs = '';
    child.stdout.on('data', (d: Buffer) => (logs += d.toString()));
    child.stderr.on('data', (d: Buffer) => (logs += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
    const url = `http://127.0.0.1:${port}/api/v1`;
    const headers = { authorization: `Bearer ${TEST_TOKEN}`, 'content-type': 'application/json' };
    await waitFor('the bridge process to listen', async () => ((await fetch(`${url}/health`, { headers }).catch(() => undefined))?.ok ? true : undefined), {
      timeoutMs: 30_000,
    });
    const box = (await (await fetch(`${url}/boxes`, { method: 'POST', headers, body: JSON.stringify({ sessionId: 'sigterm', cpu: 0.2, memory: 64 }) })).json()) as {
      box_id: string;
    };
    // The box is up before the exec whose shutdown we watch.
    await fetch(`${url}/boxes/${box.box_id}/exec`, { method: 'POST', headers, body: JSON.stringify({ command: 'true' }) });
    const inFlight = fetch(`${url}/boxes/${box.box_id}/exec`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ command: 'sleep 2; echo finished' }),
    }).then((r) => r.json());
    await new Promise((r) => setTimeout(r, 700));
    child.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 200));
    const late = await fetch(`${url}/health`, { headers }).then(
      (r) => r.status,
      () => 'refused',
    );
    expect(late).toBe('refused');
    const result = await inFlight;
    expect(result).toMatchObject({ exit_code: 0, stdout: 'finished\n' });
    expect(await exited).toBe(0);
    expect(logs).not.toContain(TEST_TOKEN);
    await pools.delete(poolName);
  }, 120_000);
});
