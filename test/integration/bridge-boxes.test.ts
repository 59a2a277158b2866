// Box lifecycle, auth, validation and policy through the real bridge against the local
// cluster (boxes on simulated nodes; commands inside real containers are in bridge-exec).
import * as k8s from '@kubernetes/client-node';
import { BOXD_BINARY, BOXD_PORT, BOXD_VERSION_ANNOTATION } from '../../common/boxd.js';
import { ANNOTATIONS, LABELS, boxName, boxRecordName, sessionHash } from '../../common/labels.js';
import type { RunningBridge } from '../../bridge/server.js';
import { ON_SIMULATED_NODES, TEST_TOKEN, api, startTestBridge, testPolicy } from '../support/bridge.js';
import { LOCAL_BOX_IMAGE, createTestNamespace, deleteTestNamespace, restrictedPod, testKubeConfig, waitFor } from '../support/cluster.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
let namespace: string;
let bridge: RunningBridge;
let call: ReturnType<typeof api>;

beforeAll(async () => {
  namespace = await createTestNamespace(kc, 'boxes', { 'pod-security.kubernetes.io/enforce': 'restricted' });
  bridge = await startTestBridge(
    kc,
    testPolicy(namespace, {
      ...ON_SIMULATED_NODES,
      allowedImages: ['registry.example.com/tools/*'],
      allowedRuntimeClassNames: ['gvisor'],
      allowedServiceAccountNames: ['box-reader'],
    }),
  );
  call = api(bridge);
});

afterAll(async () => {
  await bridge?.close();
  await deleteTestNamespace(kc, namespace);
});

async function podNames(selector?: string): Promise<string[]> {
  const list = await core.listNamespacedPod({ namespace, ...(selector ? { labelSelector: selector } : {}) });
  return list.items.map((p) => p.metadata!.name!).sort();
}

describe('authentication', () => {
  test('every route needs the bearer token; failures are JSON 401s', async () => {
    for (const [method, path] of [
      ['GET', '/health'],
      ['POST', '/boxes'],
      ['GET', '/sandboxes'],
      ['GET', '/openapi.json'],
    ] as const) {
      const missing = await api(bridge, '')(method, path);
      expect(missing.status).toBe(401);
      expect(missing.json).toEqual({ error: { type: 'unauthorized', message: expect.stringMatching(/missing bearer token/) } });
      expect(missing.headers.get('www-authenticate')).toMatch(/^Bearer/);
      const wrong = await api(bridge, `${TEST_TOKEN}x`)(method, path);
      expect(wrong.status).toBe(401);
      expect(wrong.json.error.type).toBe('unauthorized');
    }
  });
});

test('health reports version, cluster version, namespace and counts', async () => {
  const res = await call('GET', '/health');
  expect(res.status).toBe(200);
  expect(res.json).toEqual({
    status: 'ok',
    version: expect.any(String),
    kubernetes: 'v1.35.4',
    namespace,
    uptime_seconds: expect.any(Number),
    active_boxes: expect.any(Number),
    total_boxes_created: expect.any(Number),
  });
  expect(res.headers.get('x-request-id')).toBeTruthy();
});

test('create, inspect, list and delete a box', async () => {
  const created = await call('POST', '/boxes', { sessionId: 'session-lifecycle', cpu: 0.5, memory: 256, env: { SECRET_TOKEN: 's3cr3t-value' } });
  expect(created.status).toBe(201);
  expect(created.json).toEqual({
    box_id: expect.stringMatching(/^box-[0-9a-f]{12}-0$/),
    status: 'Pending',
    namespace,
    pod_name: created.json.box_id,
    image: LOCAL_BOX_IMAGE,
    cpu: '500m',
    memory: '256Mi',
    created_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
  });
  const id: string = created.json.box_id;

  // The pod: locked down, labelled for kubectl, env values nowhere in its spec.
  const pod = await core.readNamespacedPod({ name: id, namespace });
  expect(pod.metadata?.labels?.[LABELS.session]).toBe(sessionHash('session-lifecycle'));
  expect(pod.metadata?.annotations?.[ANNOTATIONS.sessionId]).toBe('session-lifecycle');
  expect(Date.parse(pod.metadata!.annotations![ANNOTATIONS.expiresAt]!) - Date.now()).toBeGreaterThan(3500_000);
  expect(pod.spec?.automountServiceAccountToken).toBe(false);
  expect(pod.spec?.enableServiceLinks).toBe(false);
  expect(pod.spec?.securityContext).toMatchObject({ runAsNonRoot: true, runAsUser: 65534, seccompProfile: { type: 'RuntimeDefault' } });
  const box = pod.spec!.containers[0]!;
  expect(box.securityContext).toMatchObject({ allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } });
  expect(box.resources).toEqual({ requests: { cpu: '500m', memory: '256Mi' }, limits: { cpu: '500m', memory: '256Mi' } });
  expect(pod.spec?.volumes?.map((v) => [v.name, v.emptyDir ? 'emptyDir' : v.secret ? 'secret' : '?'])).toEqual([
    ['workspace', 'emptyDir'],
    ['tmp', 'emptyDir'],
    ['outputs', 'emptyDir'],
    ['boxd', 'emptyDir'],
    ['box-secret', 'secret'],
  ]);
  // boxd: installed by an init container (same resources, same lockdown), PID 1 of the box.
  expect(pod.metadata?.annotations?.[BOXD_VERSION_ANNOTATION]).toBe('v1');
  const init = pod.spec!.initContainers![0]!;
  expect(init).toMatchObject({ name: 'boxd-install', args: ['install', BOXD_BINARY], resources: box.resources });
  expect(init.securityContext).toEqual(box.securityContext);
  expect(box.command).toEqual([BOXD_BINARY, 'serve']);
  expect(box.ports).toEqual([{ name: 'boxd', containerPort: BOXD_PORT, protocol: 'TCP' }]);
  expect(JSON.stringify(pod)).not.toContain('s3cr3t-value');
  // The record (named after the box) owns the pod, holds the env and the pod's credential.
  const secret = await core.readNamespacedSecret({ name: boxRecordName(id), namespace });
  expect(pod.metadata?.ownerReferences).toEqual([expect.objectContaining({ kind: 'Secret', name: id, uid: secret.metadata?.uid })]);
  expect(pod.metadata?.labels?.[LABELS.boxId]).toBe(id);
  expect(JSON.parse(Buffer.from(secret.data!.env!, 'base64').toString())).toEqual({ SECRET_TOKEN: 's3cr3t-value' });
  expect(Buffer.from(secret.data!.token!, 'base64').toString()).toMatch(/^[0-9a-f]{64}$/);
  expect(await podNames(`${LABELS.session}=${sessionHash('session-lifecycle')}`)).toEqual([id]);

  const running = await waitFor('box to be Running', async () => {
    const s = await call('GET', `/boxes/${id}/status`);
    return s.json.status === 'Running' ? s : undefined;
  });
  expect(running.json).toMatchObject({
    box_id: id,
    pod_name: id,
    namespace,
    session_id: 'session-lifecycle',
    status: 'Running',
    phase: 'Running',
    node: expect.stringMatching(/^node-/),
    image: LOCAL_BOX_IMAGE,
    cpu: '500m',
    memory: '256Mi',
    restarts: 0,
    host_ip: '127.0.0.1',
    pod_ip: expect.any(String),
  });
  expect(running.json.conditions).toEqual(expect.arrayContaining([{ type: 'Ready', status: 'True' }]));
  expect(JSON.stringify(running.json)).not.toContain('s3cr3t-value');

  const list = await call('GET', '/sandboxes');
  expect(list.json.namespace).toBe(namespace);
  expect(list.json.sandboxes).toEqual(expect.arrayContaining([expect.objectContaining({ name: id, session_id: 'session-lifecycle', cpu: '500m', memory: '256Mi' })]));
  expect(list.json.total).toBe(list.json.sandboxes.length);

  const deleted = await call('DELETE', `/boxes/${id}`);
  expect(deleted.status).toBe(200);
  expect(deleted.json).toEqual({ box_id: id, status: 'Terminated', deleted_at: expect.any(String) });
  // Gone for every route at once, while the pod is still terminating.
  const again = await call('DELETE', `/boxes/${id}`);
  expect(again.status).toBe(404);
  expect(again.json.error.type).toBe('not_found');
  expect((await call('GET', `/boxes/${id}/status`)).status).toBe(404);
  await waitFor('pod to be gone', async () => ((await podNames()).includes(id) ? undefined : true));
  expect((await call('DELETE', `/boxes/${id}`)).status).toBe(404);
});

test('a box made before boxd (no agent) is listed and deleted as usual; in-box routes say to create a new one', async () => {
  const name = 'box-legacy00000-0';
  await core.createNamespacedPod({
    namespace,
    body: {
      metadata: { name, labels: { [LABELS.box]: 'true', [LABELS.session]: sessionHash('legacy') }, annotations: { [ANNOTATIONS.sessionId]: 'legacy' } },
      spec: {
        nodeSelector: { type: 'kwok' },
        automountServiceAccountToken: false,
        securityContext: { runAsNonRoot: true, runAsUser: 65534, seccompProfile: { type: 'RuntimeDefault' } },
        containers: [{ name: 'box', image: 'old', securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } } }],
      },
    },
  });
  await waitFor('the legacy box in the cache', async () => ((await call('GET', `/boxes/${name}/status`)).status === 200 ? true : undefined));
  for (const [method, path, body] of [
    ['POST', '/exec', { command: 'true' }],
    ['POST', '/env', { envVars: { A: '1' } }],
    ['GET', '/files?path=x', undefined],
    ['GET', '/processes', undefined],
  ] as const) {
    const res = await call(method, `/boxes/${name}${path}`, body);
    expect([path, res.status, res.json.error.message]).toEqual([path, 409, expect.stringMatching(/older bridge without the in-box agent; create a new box/)]);
  }
  expect((await call('DELETE', `/boxes/${name}`)).status).toBe(200);
  await waitFor('the legacy box to be gone', async () => ((await podNames()).includes(name) ? undefined : true));
});

test('an Idempotency-Key makes a retried create return the same box', async () => {
  const key = { 'idempotency-key': `key-${Date.now()}` };
  const first = await call('POST', '/boxes', { sessionId: 'idempotent' }, key);
  expect(first.status).toBe(201);
  const retried = await call('POST', '/boxes', { sessionId: 'idempotent' }, key);
  expect(retried.status).toBe(201);
  expect(retried.json.box_id).toBe(first.json.box_id);
  const other = await call('POST', '/boxes', { sessionId: 'idempotent' }, { 'idempotency-key': 'another-key' });
  expect(other.json.box_id).not.toBe(first.json.box_id);
  const bad = await call('POST', '/boxes', { sessionId: 'idempotent' }, { 'idempotency-key': 'with space' });
  expect(bad.status).toBe(400);
  expect(await podNames(`${LABELS.session}=${sessionHash('idempotent')}`)).toHaveLength(2);
  for (const id of [first.json.box_id, other.json.box_id]) await call('DELETE', `/boxes/${id}`);
  await waitFor('the boxes to be gone', async () => ((await podNames(`${LABELS.session}=${sessionHash('idempotent')}`)).length ? undefined : true));
});

test("a pod left holding a box's name by an earlier holder of its slot (its record gone) is replaced, not answered 409", async () => {
  // What a create leaves when it answered an error although the API server made its pod, or a
  // box deleted a moment ago whose pod is still going: a pod named after the slot's box id, owned
  // by no record there is. Unlabelled here, so this replica's watch does not show it either.
  const sessionId = `leftover-${Date.now()}`;
  const name = boxName('box', sessionId, 0);
  const leftover = await core.createNamespacedPod({ namespace, body: restrictedPod(name, { nodeSelector: { 'sandbox-bridge.test/none': 'true' } }) });
  const created = await call('POST', '/boxes', { sessionId });
  expect([created.status, created.json.box_id]).toEqual([201, name]);
  const pod = await core.readNamespacedPod({ name, namespace });
  expect(pod.metadata!.uid).not.toBe(leftover.metadata!.uid);
  expect(pod.metadata!.labels![LABELS.boxId]).toBe(name);
  await call('DELETE', `/boxes/${name}`);
});

describe('bad requests change nothing', () => {
  test.each([
    ['cpu above the maximum', { sessionId: 's', cpu: 5 }, 400, /cpu 5 exceeds the maximum of 4/],
    ['memory above the maximum', { sessionId: 's', memory: 8192 }, 400, /memory 8192 MiB exceeds the maximum of 4Gi/],
    ['negative cpu', { sessionId: 's', cpu: -1 }, 400, /cpu/],
    ['no session id', { cpu: 1 }, 400, /sessionId/],
    ['unknown field', { sessionId: 's', gpu: 1 }, 400, /unknown field\(s\) gpu/],
    ['bad env name', { sessionId: 's', env: { 'BAD-NAME': 'x' } }, 400, /environment variable names/],
    ['image not allowlisted', { sessionId: 's', image: 'evil/miner:latest' }, 403, /image "evil\/miner:latest" is not allowed/],
    ['runtime class not allowlisted', { sessionId: 's', runtimeClassName: 'runc-privileged' }, 403, /runtimeClassName/],
    ['service account not allowlisted', { sessionId: 's', serviceAccountName: 'cluster-admin' }, 403, /serviceAccountName/],
  ])('%s', async (_name, body, status, message) => {
    const before = await podNames();
    const res = await call('POST', '/boxes', body);
    expect(res.status).toBe(status);
    expect(res.json.error.message).toMatch(message);
    expect(await podNames()).toEqual(before);
  });

  test('malformed JSON and oversized bodies', async () => {
    const malformed = await call('POST', '/boxes', '{"sessionId": ', { 'content-type': 'application/json' });
    expect(malformed.status).toBe(400);
    expect(malformed.json.error).toEqual({ type: 'invalid_request', message: 'request body is not valid JSON' });
    const huge = await call('POST', '/boxes', { sessionId: 's', env: { BIG: 'x'.repeat(1_100_000) } });
    expect(huge.status).toBe(413);
    expect(huge.json.error.type).toBe('payload_too_large');
  });

  test('unknown routes and boxes are JSON 404s', async () => {
    const route = await call('GET', '/nope');
    expect(route.status).toBe(404);
    expect(route.json.error.type).toBe('not_found');
    const box = await call('GET', '/boxes/box-doesnotexist-0/status');
    expect(box.status).toBe(404);
    expect(box.json.error.message).toBe('box box-doesnotexist-0 not found');
    const invalid = await call('GET', '/boxes/Not_A_Box/status');
    expect(invalid.status).toBe(400);
    for (const [method, path, body] of [
      ['POST', '/exec', { command: 'true' }],
      ['POST', '/env', { envVars: { A: '1' } }],
      ['GET', '/files?path=x', undefined],
      ['PUT', '/files?path=x', 'content'],
      ['DELETE', '', undefined],
    ] as const) {
      const missing = await call(method, `/boxes/box-doesnotexist-0${path}`, body);
      expect([path, missing.status, missing.json.error.type]).toEqual([path, 404, 'not_found']);
      const bad = await call(method, `/boxes/Not_A_Box${path}`, body);
      expect([path, bad.status, bad.json.error.type]).toEqual([path, 400, 'invalid_request']);
    }
  });

  test('allowlisted image prefixes are accepted', async () => {
    const res = await call('POST', '/boxes', { sessionId: 'allow', image: 'registry.example.com/tools/python:3.13' });
    expect(res.status).toBe(201);
    expect(res.json.image).toBe('registry.example.com/tools/python:3.13');
    await call('DELETE', `/boxes/${res.json.box_id}`);
  });
});

test('a session gets at most 3 boxes; the 4th is a 429 with Retry-After', async () => {
  const ids: string[] = [];
  for (let i = 0; i < 3; i++) {
    const res = await call('POST', '/boxes', { sessionId: 'capped' });
    expect(res.status).toBe(201);
    ids.push(res.json.box_id);
  }
  expect(new Set(ids).size).toBe(3);
  const fourth = await call('POST', '/boxes', { sessionId: 'capped' });
  expect(fourth.status).toBe(429);
  expect(fourth.json.error).toEqual({ type: 'quota_exceeded', message: expect.stringMatching(/limit per session is 3/) });
  expect(fourth.headers.get('retry-after')).toBeTruthy();
  for (const id of ids) await call('DELETE', `/boxes/${id}`);
});

test('logs, with tailLines', async () => {
  const box = await call('POST', '/boxes', { sessionId: 'logs' });
  const id = box.json.box_id;
  await waitFor('box running', async () => ((await call('GET', `/boxes/${id}/status`)).json.status === 'Running' ? true : undefined));
  const all = await call('GET', `/sandboxes/${id}/logs`);
  expect(all.status).toBe(200);
  expect(all.headers.get('content-type')).toMatch(/^text\/plain/);
  expect(all.text).toContain('simulated container log line 1');
  const tail = await call('GET', `/sandboxes/${id}/logs?tailLines=abc`);
  expect(tail.status).toBe(400);
  const other = await call('GET', `/sandboxes/kube-apiserver/logs`);
  expect(other.status).toBe(404);
  await call('DELETE', `/boxes/${id}`);
});

test('cluster info, nodes and the OpenAPI document', async () => {
  const info = await call('GET', '/cluster/info');
  expect(info.status).toBe(200);
  expect(info.json).toMatchObject({ version: 'v1.35.4', platform: 'linux/amd64' });
  expect(info.json.nodes).toBeGreaterThanOrEqual(3);
  expect(info.json.capacity).toEqual({ cpu: expect.any(String), memory: expect.any(String), pods: expect.any(String) });

  const nodes = await call('GET', '/cluster/nodes');
  expect(nodes.json.nodes.length).toBe(info.json.nodes);
  expect(nodes.json.nodes[0]).toEqual({
    name: expect.any(String),
    status: 'Ready',
    roles: expect.any(Array),
    version: expect.any(String),
    cpu: { capacity: expect.any(String), allocatable: expect.any(String) },
    memory: { capacity: expect.any(String), allocatable: expect.any(String) },
    pods: { capacity: expect.any(String), allocatable: expect.any(String), running: expect.any(Number) },
  });

  const doc = await call('GET', '/openapi.json');
  expect(doc.json.openapi).toBe('3.1.0');
  expect(doc.json.paths['/boxes'].post.requestBody.content['application/json'].schema).toEqual({ $ref: '#/components/schemas/CreateBoxRequest' });
  expect(doc.json.components.schemas.CreateBoxRequest.required).toEqual(['sessionId']);
});

test('pod metrics come from metrics.k8s.io; without that API the answer is a clear 500', async () => {
  const box = await call('POST', '/boxes', { sessionId: 'metrics' });
  const id = box.json.box_id;
  const withMetrics = await waitFor(
    'metrics-server to report the box',
    async () => {
      const res = await call('GET', '/sandboxes/metrics');
      return res.json.metrics?.some((m: { pod_name: string }) => m.pod_name === id) ? res : undefined;
    },
    { timeoutMs: 90_000, intervalMs: 2000 },
  );
  expect(withMetrics.json.metrics.find((m: { pod_name: string }) => m.pod_name === id)).toEqual({
    pod_name: id,
    namespace,
    cpu: expect.any(String),
    memory: expect.any(String),
    timestamp: expect.any(String),
    window_seconds: expect.any(Number),
  });

  // Take the metrics API away for a moment (cluster-wide; restored below).
  const registration = kc.makeApiClient(k8s.ApiregistrationV1Api);
  const live = await registration.readAPIService({ name: 'v1beta1.metrics.k8s.io' });
  await registration.deleteAPIService({ name: 'v1beta1.metrics.k8s.io' });
  try {
    const res = await waitFor('the metrics API to be gone', async () => {
      const r = await call('GET', '/sandboxes/metrics');
      return r.status === 500 ? r : undefined;
    });
    expect(res.json.error).toEqual({ type: 'internal_error', message: expect.stringMatching(/metrics.k8s.io API is not served.*install metrics-server/) });
  } finally {
    await registration.createAPIService({ body: { metadata: { name: live.metadata!.name!, labels: live.metadata?.labels ?? {} }, spec: live.spec } });
  }
  await call('DELETE', `/boxes/${id}`);
}, 150_000); // a new pod shows in metrics.k8s.io after a few metrics-server scrapes (~30-40 s); waits up to 90 s
