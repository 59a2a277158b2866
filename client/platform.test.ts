// ClusterBridgeExecutor with an injected fetch: what it sends for command secrets, contexts,
// backups and restores, and that ping/getCapacity/restore never throw.
import { createBridgeClient } from './client.js';
import { ClusterBridgeExecutor } from './platform.js';

interface Seen {
  method: string;
  path: string;
  query: Record<string, string>;
  body: unknown;
}

const BOX = 'box-0123456789ab-0';
const EXEC_OK = { exit_code: 0, stdout: 'ok\n', stderr: '', duration_ms: 1, timed_out: false, stdout_truncated: false, stderr_truncated: false };
const SNAP = { snapshot_id: 'snap-1', box_id: BOX, session_id: 's', size: 10, created_at: '2026-01-01T00:00:00Z', expires_at: '2999-01-01T00:00:00Z', image: 'i', cpu: '1', memory: '512Mi' };
const json = (body: unknown, status = 200) => new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json' } });

/** A bridge that answers by route; `routes` override the defaults. */
function fakeBridge(routes: Record<string, (s: Seen) => Response> = {}) {
  const seen: Seen[] = [];
  const fetch = async (input: string, init: RequestInit) => {
    const url = new URL(input);
    const path = url.pathname.replace('/api/v1', '');
    const s: Seen = { method: init.method ?? 'GET', path, query: Object.fromEntries(url.searchParams), body: typeof init.body === 'string' && init.body.startsWith('{') ? JSON.parse(init.body) : init.body };
    seen.push(s);
    const key = `${s.method} ${path}`;
    if (routes[key]) return routes[key](s);
    if (key === 'GET /sandboxes') return json({ sandboxes: [], total: 0, namespace: 'n' });
    if (key === 'POST /boxes') return json({ box_id: (s.body as { snapshot_id?: string }).snapshot_id ? 'box-forked-0' : BOX, status: 'Pending' }, 201);
    if (path.endsWith('/exec')) return json(EXEC_OK);
    if (path.endsWith('/context')) return json({ box_id: BOX, backup: null, outbound: null });
    if (path.endsWith('/snapshots') && s.method === 'POST') return json(SNAP, 201);
    if (key === 'GET /snapshots/snap-1') return json(SNAP);
    if (key.startsWith('GET /snapshots/')) return json({ error: { type: 'not_found', message: 'snapshot not found' } }, 404);
    return json({ error: { type: 'not_found', message: `no route ${key}` } }, 404);
  };
  const client = createBridgeClient({ url: 'https://bridge.example', token: 't', fetch, retries: 0 });
  return { client, seen };
}

test('command secrets go only into the env of execs that start with the prefix as a word, and are never shown', async () => {
  const { client, seen } = fakeBridge();
  const executor = new ClusterBridgeExecutor(client, { sessionId: 's' });
  executor.registerCommandSecrets('git', { GIT_TOKEN: 'tok-123' });
  await executor.exec('git push');
  await executor.exec('gitk');
  await executor.exec('echo $GIT_TOKEN');
  const execs = seen.filter((s) => s.path.endsWith('/exec')).map((s) => s.body as { command: string; env?: Record<string, string> });
  expect(execs.map((e) => [e.command, e.env])).toEqual([
    ['git push', { GIT_TOKEN: 'tok-123' }],
    ['gitk', undefined],
    ['echo $GIT_TOKEN', undefined],
  ]);
  expect(JSON.stringify(executor)).not.toContain('tok-123');
  expect(() => executor.registerCommandSecrets(' ', { A: 'x' })).toThrow(/prefix is empty/);
  expect(() => executor.registerCommandSecrets('gh', { 'BAD-NAME': 'hidden-value' })).toThrow(/"BAD-NAME"/);
  expect(() => executor.registerCommandSecrets('gh', { 'BAD-NAME': 'hidden-value' })).not.toThrow(/hidden-value/);
});

test('a session box another executor made is adopted, not duplicated', async () => {
  const { client, seen } = fakeBridge({
    'GET /sandboxes': () => json({ sandboxes: [{ box_id: 'box-other-0', status: 'Sleeping', session_id: 's' }], total: 1, namespace: 'n' }),
  });
  const executor = new ClusterBridgeExecutor(client, { sessionId: 's' });
  await executor.exec('true');
  expect(executor.boxId).toBe('box-other-0');
  expect(seen.map((s) => `${s.method} ${s.path}`)).toEqual(['GET /sandboxes', 'POST /boxes/box-other-0/exec']);
});

test('a backup context set before the box exists is sent once the box is made; later ones at once', async () => {
  const { client, seen } = fakeBridge();
  const executor = new ClusterBridgeExecutor(client, { sessionId: 's' });
  await executor.setBackupContext({ tenantId: 't', environmentId: 'e', sessionId: 's' });
  expect(seen).toEqual([]);
  await executor.exec('true');
  await executor.setOutboundContext({ tenantId: 't', sessionId: 's' });
  expect(seen.map((s) => [`${s.method} ${s.path}`, s.body])).toEqual([
    ['GET /sandboxes', undefined],
    ['POST /boxes', { sessionId: 's' }],
    [`PUT /boxes/${BOX}/context`, { backup: { tenant_id: 't', environment_id: 'e', session_id: 's' } }],
    [`POST /boxes/${BOX}/exec`, { command: 'true' }],
    [`PUT /boxes/${BOX}/context`, { outbound: { tenant_id: 't', session_id: 's' } }],
  ]);
});

test('backups: null without a box; a restore before the first operation makes the box from the backup', async () => {
  const { client, seen } = fakeBridge();
  const executor = new ClusterBridgeExecutor(client, { sessionId: 's' });
  expect(await executor.createWorkspaceBackup({ ttlSec: 10 })).toBeNull();
  expect(await executor.restoreWorkspaceBackup({ id: 'snap-1', dir: '/workspace' })).toEqual({ ok: true });
  expect(executor.boxId).toBe('box-forked-0');
  const handle = await executor.createWorkspaceBackup({ name: 'b', ttlSec: 10 });
  expect(handle).toMatchObject({ id: 'snap-1', dir: '/workspace' });
  const creates = seen.filter((s) => `${s.method} ${s.path}` === 'POST /boxes').map((s) => s.body);
  expect(creates).toEqual([{ sessionId: 's', snapshot_id: 'snap-1' }]);
  // ttlSec below the bridge's minimum is raised to it.
  expect(seen.find((s) => s.path.endsWith('/snapshots') && s.method === 'POST')?.body).toEqual({ name: 'b', ttlSeconds: 60 });
});

test('restore never throws: a missing or expired handle, or a bridge that is down, is {ok: false, error}', async () => {
  const expired = { ...SNAP, snapshot_id: 'snap-old', expires_at: '2000-01-01T00:00:00Z' };
  const { client } = fakeBridge({ 'GET /snapshots/snap-old': () => json(expired) });
  const executor = new ClusterBridgeExecutor(client, { sessionId: 's' });
  expect(await executor.restoreWorkspaceBackup({ id: 'snap-gone', dir: '/workspace' })).toEqual({ ok: false, error: 'backup snap-gone not found: it expired or was deleted' });
  expect(await executor.restoreWorkspaceBackup({ id: 'snap-old', dir: '/workspace' })).toEqual({ ok: false, error: 'backup snap-old expired at 2000-01-01T00:00:00Z' });
  expect(await executor.restoreWorkspaceBackup({} as never)).toEqual({ ok: false, error: 'restoreWorkspaceBackup: the handle has no id' });
  const down = new ClusterBridgeExecutor(
    createBridgeClient({ url: 'https://bridge.example', token: 't', retries: 0, fetch: async () => Promise.reject(new TypeError('fetch failed')) }),
    { sessionId: 's' },
  );
  expect(await down.restoreWorkspaceBackup({ id: 'snap-1', dir: '/workspace' })).toEqual({ ok: false, error: 'get snapshot failed: fetch failed' });
  expect(await down.ping()).toMatchObject({ status: 'error', details: 'health failed: fetch failed', latencyMs: expect.any(Number) });
  expect(await down.getCapacity()).toBeNull();
});

test('previewUrl: null without a box; with one, a link to the port of the session box', async () => {
  const link = { box_id: BOX, port: 3000, url: 'https://3000-box.preview.example/?t=x', expires_at: '2030-01-01T00:00:00.000Z' };
  const { client, seen } = fakeBridge({ [`POST /boxes/${BOX}/ports/3000/preview`]: () => json(link) });
  const executor = new ClusterBridgeExecutor(client, { sessionId: 's' });
  expect(await executor.previewUrl(3000)).toBeNull();
  expect(seen.map((s) => `${s.method} ${s.path}`)).not.toContain('POST /boxes');
  await executor.exec('true');
  expect(await executor.previewUrl(3000, { expiresInSeconds: 60 })).toEqual({ url: link.url, expiresAt: new Date(link.expires_at) });
  expect(seen.at(-1)).toMatchObject({ method: 'POST', path: `/boxes/${BOX}/ports/3000/preview`, body: { expires_in_seconds: 60 } });
});

test('getMetrics: null without a box or with it asleep (never creating or waking one); since passed on', async () => {
  const metrics = { box_id: BOX, at: '2030-01-01T00:00:05.000Z', cpu: { used_cores: 0.1 }, history: [] };
  let asleep = false;
  const { client, seen } = fakeBridge({
    [`GET /boxes/${BOX}/metrics`]: () =>
      asleep ? json({ error: { type: 'conflict', message: `box ${BOX} is asleep` } }, 409) : json(metrics),
  });
  const executor = new ClusterBridgeExecutor(client, { sessionId: 's' });
  expect(await executor.getMetrics()).toBeNull();
  expect(seen.map((s) => `${s.method} ${s.path}`)).not.toContain('POST /boxes');
  await executor.exec('true');
  const since = new Date('2030-01-01T00:00:00.000Z');
  expect(await executor.getMetrics({ since })).toEqual(metrics);
  expect(seen.at(-1)).toMatchObject({ method: 'GET', path: `/boxes/${BOX}/metrics`, query: { since: since.toISOString() } });
  asleep = true;
  expect(await executor.getMetrics()).toBeNull();
  expect(seen.filter((s) => s.method === 'POST' && s.path === '/boxes')).toHaveLength(1);
});
