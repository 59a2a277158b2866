// Named, scoped tokens through the real bridge against the local cluster: scopes per route,
// rotation through the mounted files without a single 401, names (never tokens) in logs and
// metrics, and the request limits keyed by token name with a separate one for failed attempts.
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { ConfigSchema } from '../../bridge/config.js';
import { startBridge, type RunningBridge } from '../../bridge/server.js';
import { ON_SIMULATED_NODES, TEST_BOXD_IMAGE, TEST_BOXD_KEY, api, testPolicy } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, testKubeConfig, waitFor } from '../support/cluster.js';

const kc = testKubeConfig();
const ADMIN = 'admin-token-for-tokens-test-0001';
const AGENTS = 'agents-token-for-tokens-test-0001';
const VIEWER = 'viewer-token-for-tokens-test-0001';
const AGENTS_2 = 'agents-token-for-tokens-test-0002';
const ALL_TOKENS = [ADMIN, AGENTS, VIEWER, AGENTS_2];

let namespace: string;
let dir: string;
const bridges: RunningBridge[] = [];
let logText = '';

function writeAtomically(path: string, content: string): void {
  writeFileSync(`${path}.tmp`, content);
  renameSync(`${path}.tmp`, path); // as the kubelet swaps a Secret volume
}

async function start(env: Record<string, string>): Promise<RunningBridge> {
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      logText += chunk.toString();
      done();
    },
  });
  const config = ConfigSchema.parse({
    PORT: '0',
    METRICS_PORT: '0',
    HOST: '127.0.0.1',
    SHUTDOWN_GRACE_MS: '1000',
    BOXD_KEY: TEST_BOXD_KEY,
    BOXD_IMAGE: TEST_BOXD_IMAGE,
    ...env,
  });
  const b = await startBridge(config, { kc, policy: testPolicy(namespace, ON_SIMULATED_NODES), log: pino({ level: 'info' }, sink) });
  bridges.push(b);
  return b;
}

beforeAll(async () => {
  namespace = await createTestNamespace(kc, 'tokens', { 'pod-security.kubernetes.io/enforce': 'restricted' });
  dir = mkdtempSync(join(tmpdir(), 'bridge-tokens-'));
});

afterAll(async () => {
  await Promise.all(bridges.map((b) => b.close()));
  rmSync(dir, { recursive: true, force: true });
  await deleteTestNamespace(kc, namespace);
});

test('scopes per route: 403 forbidden names the missing scope; the single token is admin', async () => {
  writeFileSync(join(dir, 'token'), ADMIN);
  writeAtomically(
    join(dir, 'tokens.json'),
    JSON.stringify([
      { name: 'agents', token: AGENTS, scopes: ['boxes:read', 'boxes:write'] },
      { name: 'viewer', token: VIEWER, scopes: ['cluster:read', 'sandboxes:read'] },
    ]),
  );
  const b = await start({ BRIDGE_TOKEN_FILE: join(dir, 'token'), BRIDGE_TOKENS_FILE: join(dir, 'tokens.json') });
  const agents = api(b, AGENTS);
  const viewer = api(b, VIEWER);

  const created = await agents('POST', '/boxes', { sessionId: 'scoped' });
  expect(created.status).toBe(201);
  const box = created.json.box_id as string;
  expect((await agents('GET', `/boxes/${box}/status`)).status).toBe(200);

  const refused = await viewer('DELETE', `/boxes/${box}`);
  expect(refused.status).toBe(403);
  expect(refused.json.error).toEqual({ type: 'forbidden', message: expect.stringContaining('token "viewer" lacks the scope boxes:write') });
  expect((await viewer('GET', `/boxes/${box}/status`)).json.error.message).toContain('boxes:read');
  expect((await viewer('GET', '/sandboxes')).status).toBe(200);
  expect((await viewer('GET', '/cluster/nodes')).status).toBe(200);
  expect((await agents('GET', '/sandboxes')).json.error.message).toContain('sandboxes:read');
  // Any valid token may read health and the API document.
  expect((await viewer('GET', '/health')).status).toBe(200);
  expect((await agents('GET', '/openapi.json')).status).toBe(200);
  // The single token ("default") has admin: every route.
  expect((await api(b, ADMIN)('GET', '/sandboxes')).status).toBe(200);
  expect((await api(b, ADMIN)('DELETE', `/boxes/${box}`)).status).toBe(200);

  const metrics = await (await fetch(`${b.metricsUrl}/metrics`)).text();
  for (const name of ['agents', 'viewer', 'default']) expect(metrics).toContain(`sandbox_bridge_tokens{token="${name}"} 1`);
  expect(metrics).toMatch(/sandbox_bridge_token_requests_total\{token="viewer",status="403"\} 2/);
  expect(logText).toMatch(/"tokenName":"agents"/);
  for (const secret of ALL_TOKENS) {
    expect(metrics).not.toContain(secret);
    expect(logText).not.toContain(secret);
  }
});

test('rotation: add the new token, move the client, remove the old one; no request is ever refused', async () => {
  const file = join(dir, 'rotate.json');
  const entry = (name: string, token: string) => ({ name, token, scopes: ['boxes:read', 'boxes:write', 'sandboxes:read'] });
  writeAtomically(file, JSON.stringify([entry('agents', AGENTS)]));
  const b = await start({ BRIDGE_TOKENS_FILE: file });

  // A client that keeps calling with whichever token it is told to use, recording every status.
  let current = AGENTS;
  const statuses: number[] = [];
  let running = true;
  const client = (async () => {
    while (running) {
      statuses.push((await api(b, current)('GET', '/sandboxes')).status);
      await new Promise((r) => setTimeout(r, 50));
    }
  })();

  writeAtomically(file, JSON.stringify([entry('agents', AGENTS), entry('agents-2', AGENTS_2)]));
  // The platform moves the client once the bridge accepts the new token.
  await waitFor('the new token to be accepted', async () => ((await api(b, AGENTS_2)('GET', '/health')).status === 200 ? true : undefined), {
    timeoutMs: 15_000,
    intervalMs: 200,
  });
  current = AGENTS_2;
  const moved = statuses.length;
  writeAtomically(file, JSON.stringify([entry('agents-2', AGENTS_2)]));
  await waitFor('the old token to be refused', async () => ((await api(b, AGENTS)('GET', '/health')).status === 401 ? true : undefined), {
    timeoutMs: 15_000,
    intervalMs: 200,
  });
  await new Promise((r) => setTimeout(r, 300));
  running = false;
  await client;

  expect(statuses.length).toBeGreaterThan(moved);
  expect(statuses.filter((s) => s !== 200)).toEqual([]);
  expect(logText).toMatch(/"tokenNames":\["agents-2"\].*"bearer tokens reloaded"/);
});

test('request limits: per token name, and a flood of bad tokens neither starves a real client nor goes unanswered', async () => {
  const file = join(dir, 'limits.json');
  writeAtomically(
    file,
    JSON.stringify([
      { name: 'busy', token: AGENTS, scopes: ['sandboxes:read'] },
      { name: 'quiet', token: VIEWER, scopes: ['sandboxes:read'] },
    ]),
  );
  const b = await start({ BRIDGE_TOKENS_FILE: file, RATE_LIMIT_RPS: '1', RATE_LIMIT_BURST: '20', RATE_LIMIT_AUTH_FAILURES_PER_MINUTE: '10' });

  // One token over its limit does not touch another's.
  const busy = await Promise.all(Array.from({ length: 25 }, () => api(b, AGENTS)('GET', '/sandboxes')));
  const limited = busy.filter((r) => r.status === 429);
  expect(limited.length).toBe(5);
  expect(limited[0]!.json.error).toEqual({ type: 'rate_limited', message: expect.stringContaining('token "busy"') });
  expect(Number(limited[0]!.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
  expect(limited[0]!.headers.get('ratelimit-limit')).toBe('20');
  expect(limited[0]!.headers.get('ratelimit-remaining')).toBe('0');
  expect((await api(b, VIEWER)('GET', '/sandboxes')).status).toBe(200);

  // 200 requests with bad tokens from this address: 10 are 401, the rest 429, all answered.
  const flood = await Promise.all(Array.from({ length: 200 }, (_, i) => api(b, `bad-token-${i}-xxxxxxxxxxxx`)('GET', '/sandboxes')));
  const byStatus = flood.reduce<Record<number, number>>((acc, r) => ({ ...acc, [r.status]: (acc[r.status] ?? 0) + 1 }), {});
  expect(byStatus).toEqual({ 401: 10, 429: 190 });
  expect(flood.find((r) => r.status === 429)!.headers.get('retry-after')).toBeTruthy();
  // The real client from the same address still gets through.
  expect((await api(b, VIEWER)('GET', '/sandboxes')).status).toBe(200);
  const metrics = await (await fetch(`${b.metricsUrl}/metrics`)).text();
  expect(metrics).toMatch(/sandbox_bridge_rate_limited_total\{reason="auth_failures"\} 190/);
  expect(metrics).toMatch(/sandbox_bridge_auth_failures_total\{reason="invalid"\} 200/);
});
