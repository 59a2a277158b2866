// A frozen API server (no answer at all, connections kept open: a SIGSTOPped kube-apiserver, a
// partition) must not hold writes for the whole Kubernetes timeout (15 s by default): once the
// bridge finds it silent, writes answer 503 cluster_unavailable with Retry-After within ~2 s,
// later writes at once, reads keep coming from the cache, and writes work again seconds after
// it thaws (common/api-health.ts). The freeze is a proxy in front of the real API server, so only
// this test's bridge sees it.
import type { RunningBridge } from '../../bridge/server.js';
import { ON_SIMULATED_NODES, api, startTestBridge, testPolicy } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, testKubeConfig, waitFor } from '../support/cluster.js';
import { TcpProxy } from '../support/tcp-proxy.js';

const kc = testKubeConfig();
const proxy = TcpProxy.forApiServer(kc);
let namespace: string;
let bridge: RunningBridge | undefined;

beforeAll(async () => {
  namespace = await createTestNamespace(kc, 'failfast', { 'pod-security.kubernetes.io/enforce': 'restricted' });
  await proxy.start();
});

afterAll(async () => {
  proxy.thaw();
  await bridge?.close();
  await proxy.stop();
  await deleteTestNamespace(kc, namespace);
});

const timed = async <T>(fn: () => Promise<T>): Promise<{ ms: number; value: T }> => {
  const started = performance.now();
  const value = await fn();
  return { ms: Math.round(performance.now() - started), value };
};

test('API server frozen: writes 503 within ~2 s then at once, cache reads 200, writes recover within seconds of the thaw', async () => {
  // The default KUBE_TIMEOUT_MS (15 s): what a write took to fail before.
  bridge = await startTestBridge(proxy.kubeConfig(kc), testPolicy(namespace, ON_SIMULATED_NODES));
  const call = api(bridge);
  const box = await call('POST', '/boxes', { sessionId: 'before-freeze' });
  expect(box.status).toBe(201);
  const boxId: string = box.json.box_id;
  await waitFor('the box in the cache', async () => ((await call('GET', `/boxes/${boxId}/status`)).status === 200 ? true : undefined));

  proxy.freeze();
  try {
    const first = await timed(() => call('POST', '/boxes', { sessionId: 'during-freeze' }));
    expect(first.value.status).toBe(503);
    expect(first.value.json.error.type).toBe('cluster_unavailable');
    expect(Number(first.value.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(first.ms).toBeLessThan(4000); // ~2 s: 1 s without an answer, then a 1 s probe; room for load

    const second = await timed(() => call('POST', '/boxes', { sessionId: 'during-freeze-2' }));
    expect(second.value.status).toBe(503);
    expect(second.value.headers.get('retry-after')).toBe('2');
    expect(second.ms).toBeLessThan(1000);
    const del = await timed(() => call('DELETE', `/boxes/${boxId}`));
    expect(del.value.status).toBe(503);
    expect(del.ms).toBeLessThan(1000);

    const status = await call('GET', `/boxes/${boxId}/status`);
    expect(status.status).toBe(200);
    const list = await call('GET', '/sandboxes');
    expect(list.status).toBe(200);
    expect(list.json.sandboxes.map((s: { name: string }) => s.name)).toContain(boxId);
    process.stderr.write(`[fail-fast] frozen API server: first write 503 after ${first.ms} ms, next ${second.ms} ms, delete ${del.ms} ms\n`);
  } finally {
    proxy.thaw();
  }

  const thawedAt = performance.now();
  const after = await waitFor(
    'writes to work again',
    async () => {
      const r = await call('POST', '/boxes', { sessionId: 'after-thaw' });
      return r.status === 201 ? r : undefined;
    },
    { timeoutMs: 30_000, intervalMs: 200 },
  );
  const recoveryMs = Math.round(performance.now() - thawedAt);
  process.stderr.write(`[fail-fast] writes work again ${recoveryMs} ms after the thaw\n`);
  expect(recoveryMs).toBeLessThan(10_000);
  expect((await call('DELETE', `/boxes/${boxId}`)).status).toBe(200);
  expect((await call('DELETE', `/boxes/${after.json.box_id}`)).status).toBe(200);
}, 90_000);
