// GET /sandboxes with filters and pages through the real bridge (boxes on simulated nodes):
// every answer checked against the response schema; pages in a stable order; bad parameters 400.
import type { z } from 'zod';
import type { SandboxList } from '../../client/index.js';
import { SandboxList as SandboxListSchema } from '../../bridge/schemas.js';
import type { RunningBridge } from '../../bridge/server.js';
import { ON_SIMULATED_NODES, api, startTestBridge, testClient, testPolicy } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, testKubeConfig, waitFor } from '../support/cluster.js';

const kc = testKubeConfig();
let namespace: string;
let bridge: RunningBridge;

/** The answer holds exactly the schema's fields (parse strips unknown ones and fails on missing ones). */
function checked(body: SandboxList): SandboxList {
  expect(SandboxListSchema.parse(body) as z.output<typeof SandboxListSchema>).toEqual(body);
  return body;
}

beforeAll(async () => {
  namespace = await createTestNamespace(kc, 'list', { 'pod-security.kubernetes.io/enforce': 'restricted' });
  bridge = await startTestBridge(kc, testPolicy(namespace, ON_SIMULATED_NODES));
  const call = api(bridge);
  for (const sessionId of ['alpha', 'alpha', 'beta', 'beta', 'beta']) {
    expect((await call('POST', '/boxes', { sessionId, cpu: 0.1, memory: 64 })).status).toBe(201);
  }
  await waitFor('five running boxes', async () => {
    const list = (await call('GET', '/sandboxes?status=Running')).json as SandboxList;
    return list.total === 5 ? true : undefined;
  });
});

afterAll(async () => {
  await bridge?.close();
  await deleteTestNamespace(kc, namespace);
});

test('without parameters: the spec shape, oldest first', async () => {
  const res = await api(bridge)('GET', '/sandboxes');
  expect(res.status).toBe(200);
  const list = checked(res.json);
  expect(Object.keys(list).sort()).toEqual(['namespace', 'sandboxes', 'total']);
  expect(list.total).toBe(5);
  const order = list.sandboxes.map((s) => `${s.created_at}/${s.name}`);
  expect(order).toEqual([...order].sort());
});

test('pages of two: every box once, in the same order as the whole list', async () => {
  const client = testClient(bridge);
  const whole = checked(await client.sandboxes());
  const seen: string[] = [];
  let cont: string | undefined;
  let pages = 0;
  do {
    const page = checked(await client.sandboxes({ limit: 2, ...(cont ? { continue: cont } : {}) }));
    expect(page.total).toBe(5);
    expect(page.sandboxes.length).toBeLessThanOrEqual(2);
    seen.push(...page.sandboxes.map((s) => s.name));
    cont = page.continue;
    pages++;
  } while (cont);
  expect(pages).toBe(3);
  expect(seen).toEqual(whole.sandboxes.map((s) => s.name));
});

test('filters: by session and status, with pages', async () => {
  const client = testClient(bridge);
  const beta = checked(await client.sandboxes({ sessionId: 'beta' }));
  expect(beta.total).toBe(3);
  expect(beta.sandboxes.every((s) => s.session_id === 'beta')).toBe(true);
  const first = checked(await client.sandboxes({ sessionId: 'beta', status: 'Running', limit: 2 }));
  const rest = checked(await client.sandboxes({ sessionId: 'beta', status: 'Running', limit: 2, continue: first.continue! }));
  expect([...first.sandboxes, ...rest.sandboxes].map((s) => s.name)).toEqual(beta.sandboxes.map((s) => s.name));
  expect(rest.continue).toBeUndefined();
  expect(checked(await client.sandboxes({ status: 'Pending' })).total).toBe(0);
});

test('bad parameters are 400 invalid_request naming the parameter', async () => {
  const call = api(bridge);
  const cont = ((await call('GET', '/sandboxes?limit=1')).json as SandboxList).continue!;
  for (const [query, message] of [
    ['limit=0', /limit/],
    ['limit=1001', /limit/],
    ['limit=ten', /limit/],
    ['status=Sleepy', /status/],
    ['colour=red', /unknown field\(s\) colour/],
    ['continue=not-a-token', /continue: not a continue token/],
    [`continue=${cont}&session_id=alpha`, /another session_id or status filter/],
  ] as const) {
    const res = await call('GET', `/sandboxes?${query}`);
    expect({ query, status: res.status, type: res.json?.error?.type }).toEqual({ query, status: 400, type: 'invalid_request' });
    expect(res.json.error.message).toMatch(message);
  }
});
