// A tenant with one token and one box, tried as an attacker would (issue #20): boxd's own
// directories (the box credential, the env store, boxd's binary) are refused on every file and
// archive route however they are named — absolute, climbed to with `..`, or through symlinks the
// box's own code planted; contents need the boxes:contents scope; a client polling a deleted box
// costs (almost) no API requests, counted at an API proxy in front of that one replica.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RunningBridge } from '../../bridge/server.js';
import { ON_REAL_NODE, api, startTestBridge } from '../support/bridge.js';
import { ApiProxy } from '../support/api-proxy.js';
import { realNodeAvailable } from '../support/cluster.js';
import { kc, startLifecycle, type LifecycleEnv } from '../support/lifecycle.js';
import { localObjectStore } from '../support/object-store.js';

const realNode = await realNodeAvailable(kc);
const store = await localObjectStore();
const skipReason = !realNode.available ? `no real node: ${realNode.reason}` : !store.available ? `no object store: ${store.reason}` : undefined;
if (skipReason) console.warn(`SKIPPED hostile tenant tests on the real node: ${skipReason}`);
const suite = skipReason ? describe.skip : describe;
const SECRET = '/opt/sandbox-bridge/secret';
const BIN = '/opt/sandbox-bridge/bin';

suite('a hostile tenant on the real node', () => {
  let env: LifecycleEnv;
  let proxy: ApiProxy;
  let counted: RunningBridge;
  let dir: string;
  const reader = `reader-${randomBytes(12).toString('hex')}`;
  const viewer = `viewer-${randomBytes(12).toString('hex')}`;

  beforeAll(async () => {
    env = await startLifecycle({ name: 'hostile', pool: { box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: 0 } } });
    dir = mkdtempSync(join(tmpdir(), 'tokens-'));
    writeFileSync(
      join(dir, 'tokens.json'),
      JSON.stringify([
        { name: 'viewer', token: viewer, scopes: ['boxes:read'] },
        { name: 'reader', token: reader, scopes: ['boxes:contents'] },
      ]),
    );
    proxy = new ApiProxy(kc);
    await proxy.start();
    counted = await startTestBridge(proxy.kubeConfig(), undefined, {
      POOL_NAME: env.pool.name,
      SANDBOX_NAMESPACE: env.pool.ns,
      BRIDGE_TOKENS_FILE: join(dir, 'tokens.json'),
      RATE_LIMIT_RPS: '100000',
      RATE_LIMIT_BURST: '100000',
      ...env.storeEnv,
    });
  }, 120_000);

  afterAll(async () => {
    await counted?.close();
    await proxy?.stop();
    await env?.stop();
    rmSync(dir, { recursive: true, force: true });
  }, 60_000);

  test('boxd\'s own directories are refused on every file and archive route, however they are reached', async () => {
    const call = api(env.bridges[0]!);
    const box = (await call('POST', '/boxes', { sessionId: 'attacker', cpu: 0.25, memory: 256 })).json.box_id as string;
    // Box code plants symlinks into boxd's directories, a file and a directory each.
    const planted = await call('POST', `/boxes/${box}/exec`, {
      command: `ln -s ${SECRET} s && ln -s ${SECRET}/token t && ln -s ${BIN}/boxd b && mkdir -p deep && ln -s ../s deep/up && ls ${SECRET} >/dev/null 2>&1; echo planted`,
    });
    expect(planted.json.stdout).toBe('planted\n');
    const refused: Array<[string, string, unknown?]> = [
      ['GET', `/boxes/${box}/files?path=${SECRET}/env`],
      ['GET', `/boxes/${box}/files?path=${SECRET}/token`],
      ['GET', `/boxes/${box}/files?path=../opt/sandbox-bridge/secret/env`],
      ['GET', `/boxes/${box}/files?path=t`],
      ['GET', `/boxes/${box}/files?path=s/env`],
      ['GET', `/boxes/${box}/files?path=deep/up/token`],
      ['GET', `/boxes/${box}/files?path=b`],
      ['GET', `/boxes/${box}/files/list?path=${SECRET}`],
      ['GET', `/boxes/${box}/files/list?path=/opt/sandbox-bridge`],
      ['GET', `/boxes/${box}/files/list?path=s`],
      ['GET', `/boxes/${box}/archive?path=${SECRET}`],
      ['GET', `/boxes/${box}/archive?path=s`],
      ['GET', `/boxes/${box}/archive?path=/opt`],
      ['PUT', `/boxes/${box}/files?path=${SECRET}/token`, 'forged'],
      ['PUT', `/boxes/${box}/files?path=t`, 'forged'],
      ['PUT', `/boxes/${box}/files?path=${BIN}/boxd`, 'forged'],
      ['DELETE', `/boxes/${box}/files?path=${SECRET}/env`],
      ['DELETE', `/boxes/${box}/files?path=s/env`],
    ];
    for (const [method, path, body] of refused) {
      const r = await call(method, path, body as string | undefined, body ? { 'content-type': 'application/octet-stream' } : {});
      expect([method, path, r.status, r.json?.error?.type]).toEqual([method, path, 403, 'forbidden']);
    }
    // An archive that would write into them is refused too.
    const tar = await call('GET', `/boxes/${box}/archive?path=deep`);
    expect(tar.status).toBe(200);
    // Nothing changed: the box still answers with its credential, and its files are still there.
    expect((await call('POST', `/boxes/${box}/exec`, { command: `cat ${SECRET}/token | wc -c` })).json.stdout).not.toBe('0\n');
    // Its workspace is still readable as usual.
    expect((await call('GET', `/boxes/${box}/files/list?path=.`)).status).toBe(200);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 120_000);

  test('contents need boxes:contents: a boxes:read token gets 403 for files, archives and process output, 200 for status', async () => {
    const box = (await api(env.bridges[0]!)('POST', '/boxes', { sessionId: 'contents', cpu: 0.25, memory: 256 })).json.box_id as string;
    const asViewer = api(counted, viewer);
    const asReader = api(counted, reader);
    for (const path of [`/boxes/${box}/files?path=a`, `/boxes/${box}/files/list?path=.`, `/boxes/${box}/archive?path=.`, `/boxes/${box}/processes/p/output`]) {
      const r = await asViewer('GET', path);
      expect([path, r.status, r.json?.error?.message]).toEqual([path, 403, expect.stringContaining('boxes:contents')]);
    }
    expect((await asViewer('GET', `/boxes/${box}/status`)).status).toBe(200);
    expect((await asReader('GET', `/boxes/${box}/files/list?path=.`)).status).toBe(200);
    expect((await asReader('GET', `/boxes/${box}/status`)).status).toBe(403); // metadata is boxes:read's
    expect((await asReader('PUT', `/boxes/${box}/files?path=x`, 'y', { 'content-type': 'application/octet-stream' })).status).toBe(403);
    expect((await api(env.bridges[0]!)('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 120_000);

  test('a replica at rest makes no API requests: its watches hold (no relist loop, even of an empty list)', async () => {
    // The replica watches records in a sleep state as metadata; none exist here, so that list is empty.
    await new Promise((r) => setTimeout(r, 2000));
    const before = proxy.requests.length;
    await new Promise((r) => setTimeout(r, 5000));
    const made = proxy.requests.slice(before).map((r) => `${r.method} ${r.url}`);
    expect(made).toEqual([]);
  }, 60_000);

  test('polling a deleted box 1,000 times costs a handful of API requests, and no LIST', async () => {
    const call = api(counted);
    const box = (await call('POST', '/boxes', { sessionId: 'deleted-poll', cpu: 0.25, memory: 256 })).json.box_id as string;
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
    // And a box this replica never knew (deleted through another replica).
    const other = (await api(env.bridges[0]!)('POST', '/boxes', { sessionId: 'deleted-elsewhere', cpu: 0.25, memory: 256 })).json.box_id as string;
    expect((await api(env.bridges[0]!)('DELETE', `/boxes/${other}`)).status).toBe(200);
    await new Promise((r) => setTimeout(r, 2000)); // both pods gone from every watch
    const before = proxy.requests.length;
    const started = performance.now();
    for (let i = 0; i < 1000; i++) {
      const id = i % 2 ? box : other;
      const r = i % 3 ? await call('GET', `/boxes/${id}/status`) : await call('POST', `/boxes/${id}/exec`, { command: 'true' });
      expect([i, r.status]).toEqual([i, 404]);
    }
    const seconds = (performance.now() - started) / 1000;
    const made = proxy.requests.slice(before).filter((r) => !r.watch);
    console.log(`1,000 polls of two deleted boxes in ${seconds.toFixed(1)} s: ${made.length} API requests (${made.map((r) => `${r.method} ${r.url.split('?')[0]}`).join(', ')})`);
    // One read per box per few seconds at most; never a LIST.
    expect(made.length).toBeLessThanOrEqual(2 * Math.ceil(seconds / 5) + 2);
    expect(made.filter((r) => r.method === 'GET' && /\/(pods|secrets)(\?|$)/.test(r.url))).toEqual([]);
  }, 120_000);
});
