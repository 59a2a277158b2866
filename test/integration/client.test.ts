// sandbox-bridge/client against a real bridge on the local cluster: a whole agent session through
// ClusterBridgeSandbox.fromEnv (lazy create, exec, files as text and bytes, env, status, destroy),
// and the plain client's endpoints and error shapes.
import { randomBytes } from 'node:crypto';
import type { RunningBridge } from '../../bridge/server.js';
import { BridgeClientError, ClusterBridgeSandbox, type BridgeClient } from '../../client/index.js';
import { ON_REAL_NODE, ON_SIMULATED_NODES, TEST_TOKEN, startTestBridge, testClient, testPolicy } from '../support/bridge.js';
import { checkedFetch } from '../support/contract.js';
import { createTestNamespace, deleteTestNamespace, realNodeAvailable, testKubeConfig, waitFor } from '../support/cluster.js';

const kc = testKubeConfig();
const realNode = await realNodeAvailable(kc);
// Commands and files need boxd, which only real containers have: without the real node the
// session test is skipped and the rest runs on simulated nodes.
if (!realNode.available) console.warn(`SKIPPED the client session test (needs the real node): ${realNode.reason}`);
const placement = realNode.available ? ON_REAL_NODE : ON_SIMULATED_NODES;
const dir = '/workspace';
const workdir = undefined;
const onRealNode = realNode.available ? test : test.skip;

let namespace: string;
let bridge: RunningBridge;
let client: BridgeClient;

const envFor = (b: RunningBridge, token = TEST_TOKEN) => ({
  SANDBOX_PROVIDER: 'cluster-bridge',
  CLUSTER_BRIDGE_URL: b.url,
  CLUSTER_BRIDGE_TOKEN: token,
  CLUSTER_CPU: '0.5',
  CLUSTER_MEMORY: '128',
});

beforeAll(async () => {
  namespace = await createTestNamespace(kc, 'client', { 'pod-security.kubernetes.io/enforce': 'restricted' });
  bridge = await startTestBridge(kc, testPolicy(namespace, placement));
  client = testClient(bridge);
});

afterAll(async () => {
  await bridge?.close();
  await deleteTestNamespace(kc, namespace);
});

const boxesOf = async (sessionId: string) => (await client.sandboxes()).sandboxes.filter((s) => s.session_id === sessionId);

onRealNode('a whole session: lazy create, exec, files, env, status, destroy', async () => {
  const sessionId = `client-session-${randomBytes(4).toString('hex')}`;
  const sandbox = ClusterBridgeSandbox.fromEnv({ sessionId, env: envFor(bridge), workdir, fetch: checkedFetch() });

  // Lazy: nothing exists until the first operation.
  expect(sandbox.boxId).toBeUndefined();
  expect(await boxesOf(sessionId)).toEqual([]);

  // Concurrent first operations (a runtime's warm-up probe racing a tool call) make one box.
  const [probe, mkdir] = await Promise.all([sandbox.exec('echo ready'), sandbox.exec(`mkdir -p '${dir}/notes'`)]);
  expect(probe).toMatchObject({ exit_code: 0, stdout: 'ready\n', stderr: '', timed_out: false });
  expect(mkdir.exit_code).toBe(0);
  const boxId = sandbox.boxId!;
  expect(boxId).toMatch(/^box-[0-9a-f]{12}-\d$/);
  expect((await boxesOf(sessionId)).map((b) => b.name)).toEqual([boxId]);
  expect(sandbox.box).toMatchObject({ cpu: '500m', memory: '128Mi', namespace });

  const failing = await sandbox.exec('echo out; echo err >&2; exit 3');
  expect(failing).toMatchObject({ exit_code: 3, stdout: 'out\n', stderr: 'err\n' });

  // Files: text, then bytes that are not UTF-8 (every byte value).
  const text = 'héllo wörld\nsecond line\n';
  expect(await sandbox.writeFile(`${dir}/notes/hello.txt`, text)).toEqual({ path: `${dir}/notes/hello.txt`, size: new TextEncoder().encode(text).length, encoding: 'text' });
  expect(await sandbox.readFile(`${dir}/notes/hello.txt`)).toBe(text);
  expect((await sandbox.exec(`cat '${dir}/notes/hello.txt'`)).stdout).toBe(text);

  const bytes = new Uint8Array(512).map((_, i) => (i * 7) % 256);
  expect(await sandbox.writeFile(`${dir}/blob.bin`, bytes)).toEqual({ path: `${dir}/blob.bin`, size: 512, encoding: 'base64' });
  expect(await sandbox.readFileBytes(`${dir}/blob.bin`)).toEqual(bytes);
  expect((await sandbox.exec(`wc -c < '${dir}/blob.bin'`)).stdout.trim()).toBe('512');
  expect(await sandbox.readFileBytes(`${dir}/notes/hello.txt`)).toEqual(new TextEncoder().encode(text));

  // Env: later commands see the variables; values are passed as data.
  const tricky = `it's "quoted" $(not run) ${randomBytes(4).toString('hex')}`;
  expect(await sandbox.setEnvVars({ GREETING: 'hello', TRICKY: tricky })).toEqual({ box_id: boxId, env_count: 2, updated_at: expect.any(String) });
  expect((await sandbox.exec('printf "%s|%s" "$GREETING" "$TRICKY"')).stdout).toBe(`hello|${tricky}`);

  // boxd answers before the kubelet reports the pod Running: status follows the kubelet.
  const status = await waitFor('the kubelet to report the box Running', async () => {
    const s = await sandbox.status();
    return s.status === 'Running' ? s : undefined;
  });
  expect(status).toMatchObject({ box_id: boxId, session_id: sessionId, namespace, status: 'Running', cpu: '500m', memory: '128Mi' });
  if (realNode.available) expect(status.node).toBe(realNode.name);

  await sandbox.destroy();
  await sandbox.destroy(); // again: fine, and sends nothing
  await expect(sandbox.exec('true')).rejects.toMatchObject({ type: 'sandbox_destroyed' });
  await waitFor('the box to be gone', async () => ((await boxesOf(sessionId)).length === 0 ? true : undefined));
  // The plain client reports the second delete as the bridge does: 404 not_found.
  await expect(client.deleteBox(boxId)).rejects.toMatchObject({ status: 404, type: 'not_found', message: `delete failed: 404 not_found: box ${boxId} not found` });
});

test('destroy after the box was deleted elsewhere (say, by its TTL) counts as done', async () => {
  const sessionId = `client-reaped-${randomBytes(4).toString('hex')}`;
  const sandbox = ClusterBridgeSandbox.fromEnv({ sessionId, env: envFor(bridge), workdir, fetch: checkedFetch() });
  const status = await sandbox.status(); // status is a first operation too: it creates the box
  expect(status.session_id).toBe(sessionId);
  await client.deleteBox(sandbox.boxId!);
  await waitFor('the box to be gone', async () => {
    const err = await client.status(sandbox.boxId!).then(
      () => undefined,
      (e: unknown) => e,
    );
    return err instanceof BridgeClientError && err.status === 404 ? true : undefined;
  });
  await expect(sandbox.destroy()).resolves.toBeUndefined();
});

test('a wrong token: "create failed: 401" on the first operation, and no box', async () => {
  const sessionId = `client-badtoken-${randomBytes(4).toString('hex')}`;
  const sandbox = ClusterBridgeSandbox.fromEnv({ sessionId, env: envFor(bridge, `${TEST_TOKEN}-wrong`), workdir, fetch: checkedFetch() });
  const err = (await sandbox.exec('true').catch((e: unknown) => e)) as BridgeClientError;
  expect(err).toBeInstanceOf(BridgeClientError);
  expect(err.message).toMatch(/^create failed: 401 unauthorized: /);
  expect(err).toMatchObject({ status: 401, type: 'unauthorized', operation: 'create' });
  expect(await boxesOf(sessionId)).toEqual([]);
  await sandbox.destroy(); // nothing was created: a no-op
});

test('the read-only endpoints, with typed answers', async () => {
  const health = await client.health();
  expect(health).toMatchObject({ status: 'ok', namespace, version: expect.any(String) });
  const info = await client.clusterInfo();
  expect(info.nodes).toBeGreaterThan(0);
  const nodes = await client.nodes();
  expect(nodes.nodes.length).toBe(info.nodes);
  const list = await client.sandboxes();
  expect(list).toMatchObject({ namespace, total: list.sandboxes.length });
  const doc = await client.openapi();
  expect(doc.openapi).toBe('3.1.0');
  expect(Object.keys(doc.paths)).toEqual(expect.arrayContaining(['/boxes', '/boxes/{id}/exec']));

  // Logs of a box (text), and errors of the cluster-reading endpoints keep their shape.
  const created = await client.createBox({ sessionId: `client-logs-${randomBytes(4).toString('hex')}`, memory: 64 });
  try {
    expect(typeof (await waitFor('logs', () => client.logs(created.pod_name, { tailLines: 5 }).catch(() => undefined)))).toBe('string');
  } finally {
    await client.deleteBox(created.box_id);
  }
  await expect(client.logs('no-such-pod')).rejects.toMatchObject({ status: 404, type: 'not_found', operation: 'logs' });
  // metrics: 200 with a list when the cluster serves pod metrics, else the bridge's 500 (spec).
  const metrics = await client.metrics().then(
    (m) => ({ ok: Array.isArray(m.metrics) }),
    (e: BridgeClientError) => ({ ok: e.status === 500 && e.type === 'internal_error' }),
  );
  expect(metrics.ok).toBe(true);
});
