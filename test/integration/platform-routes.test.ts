// The platform port's server routes on the real node with the real store (issue 21; docs/api.md
// "Keepalive", "Contexts", "Session outputs"; docs/snapshots.md "Listing by backup context"). The
// operator runs as its own process (it decides sleeps), the bridge in-process, as in
// sleep-wake.test.ts. Keepalives keep a box from sleeping past its idle time and wake a sleeping
// one; a backup context labels API, idle-sleep and final snapshots, listed by tenant, environment
// and session newest first through the index; session outputs are read live while the box runs,
// from the store after it sleeps and after it is destroyed, copied back on wake; traversal is
// refused; outputs the store cannot take keep a box awake.
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RunningBridge } from '../../bridge/server.js';
import { ANNOTATIONS } from '../../common/labels.js';
import { ObjectStore, ObjectStoreConfigSchema } from '../../common/object-store.js';
import { contextDigest, indexPoolPrefix } from '../../common/snapshot-index.js';
import { outputsKeys } from '../../common/session-outputs.js';
import { ON_REAL_NODE, TEST_TOKEN, api } from '../support/bridge.js';
import { realNodeAvailable } from '../support/cluster.js';
import { boxPods, eventsAbout, kc, record, startLifecycle, until, type LifecycleEnv } from '../support/lifecycle.js';
import { localObjectStore } from '../support/object-store.js';

const realNode = await realNodeAvailable(kc);
const store = await localObjectStore();
const skipReason = !realNode.available ? `no real node: ${realNode.reason}` : !store.available ? `no object store: ${store.reason}` : undefined;
if (skipReason) console.warn(`SKIPPED platform route tests on the real node: ${skipReason}`);
const suite = skipReason ? describe.skip : describe;
const SLEEP_AFTER_SECONDS = 4;
const SMALL = { cpu: 0.25, memory: 256 };

type Call = ReturnType<typeof api>;
const exec = (c: Call, id: string, command: string) =>
  c('POST', `/boxes/${id}/exec`, { command }).then((r) => {
    expect({ status: r.status, body: r.json }).toMatchObject({ status: 200, body: { exit_code: 0 } });
    return r.json as { exit_code: number; stdout: string; stderr: string };
  });
const status = async (c: Call, id: string) => (await c('GET', `/boxes/${id}/status`)).json;
const sleeping = (c: Call, id: string, timeoutMs = 90_000) =>
  until(`box ${id} to sleep`, async () => ((await status(c, id))?.status === 'Sleeping' ? status(c, id) : undefined), timeoutMs);
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

suite('the platform port routes on the real node with the real store', () => {
  let env: LifecycleEnv;
  let bridge: RunningBridge;
  let call: Call;
  let s3: ObjectStore;
  let tokensDir: string;
  const viewer = `viewer-${randomBytes(12).toString('hex')}`;
  const reader = `reader-${randomBytes(12).toString('hex')}`;

  beforeAll(async () => {
    tokensDir = mkdtempSync(join(tmpdir(), 'tokens-'));
    writeFileSync(
      join(tokensDir, 'tokens.json'),
      JSON.stringify([
        { name: 'viewer', token: viewer, scopes: ['boxes:read'] },
        { name: 'reader', token: reader, scopes: ['boxes:read', 'boxes:contents'] },
      ]),
    );
    env = await startLifecycle({
      name: 'platform',
      pool: { maxBoxes: 10, box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: SLEEP_AFTER_SECONDS } },
      bridgeEnv: { BRIDGE_TOKENS_FILE: join(tokensDir, 'tokens.json') },
    });
    bridge = env.bridges[0]!;
    call = api(bridge);
    s3 = new ObjectStore(ObjectStoreConfigSchema.parse(env.storeEnv));
  }, 120_000);

  afterAll(async () => {
    s3?.close();
    await env?.stop();
    rmSync(tokensDir, { recursive: true, force: true });
  }, 60_000);

  test('keepalives keep a box awake past its idle time, run nothing in it, and wake a sleeping box', async () => {
    const box = (await call('POST', '/boxes', { sessionId: 'kept-alive', ...SMALL })).json.box_id as string;
    await exec(call, box, 'echo ok');
    // The kubelet reports the container running a moment after boxd answers.
    await until('the box to be reported Running', async () => ((await status(call, box)).status === 'Running' ? true : undefined), 30_000);
    const pod = (await boxPods(env.pool.ns, box))[0]!.metadata!.uid;
    const processesBefore = (await call('GET', `/boxes/${box}/processes`)).json.processes.length;
    // Three idle times with nothing but keepalives: the box stays Running on its first pod.
    const until3 = Date.now() + SLEEP_AFTER_SECONDS * 3 * 1000;
    while (Date.now() < until3) {
      const before = Date.now();
      const kept = await call('POST', `/boxes/${box}/keepalive`);
      expect(kept.status).toBe(200);
      expect(kept.json.box_id).toBe(box);
      expect(Date.parse(kept.json.last_active_at)).toBeGreaterThanOrEqual(before - 1000);
      // The answer is the activity written on the box's pod (what the operator decides by).
      const current = (await boxPods(env.pool.ns, box)).find((p) => !p.metadata?.deletionTimestamp);
      expect(current?.metadata?.annotations?.[ANNOTATIONS.lastActive]).toBe(kept.json.last_active_at);
      expect((await status(call, box)).status).toBe('Running');
      await new Promise((r) => setTimeout(r, 1500));
    }
    expect((await boxPods(env.pool.ns, box)).map((p) => [p.metadata!.uid, p.metadata!.deletionTimestamp ?? null])).toEqual([[pod, null]]);
    expect((await call('GET', `/boxes/${box}/processes`)).json.processes).toHaveLength(processesBefore);

    // Without them it sleeps; a keepalive then wakes it (a boxes:write call), a read-only token may not.
    await sleeping(call, box);
    expect((await api(bridge, viewer)('POST', `/boxes/${box}/keepalive`)).status).toBe(403);
    const woken = await call('POST', `/boxes/${box}/keepalive`);
    expect(woken.status).toBe(200);
    expect((await status(call, box)).status).not.toBe('Sleeping');
    const live = (await boxPods(env.pool.ns, box)).filter((p) => !p.metadata?.deletionTimestamp);
    expect(live).toHaveLength(1);
    expect(live[0]!.metadata!.uid).not.toBe(pod); // a new pod: it was woken
    expect((await call('POST', '/boxes/box-000000000000-9/keepalive')).status).toBe(404);
    expect((await call('POST', '/boxes/NOT_A_BOX/keepalive')).status).toBe(400);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);

  test('a backup context labels API, idle-sleep and final snapshots; listed by tenant, environment and session, newest first', async () => {
    const tenant = `tenant-${randomBytes(4).toString('hex')}`;
    const a = (await call('POST', '/boxes', { sessionId: 'ctx-a', ...SMALL })).json.box_id as string;
    const b = (await call('POST', '/boxes', { sessionId: 'ctx-b', ...SMALL })).json.box_id as string;
    // Both stay awake while a background process runs (the keepalive): b throughout, a until its
    // sleep is wanted, so exactly one idle-sleep snapshot is taken.
    expect((await call('POST', `/boxes/${b}/processes`, { command: 'sleep 600' })).status).toBe(201);
    const holdA = (await call('POST', `/boxes/${a}/processes`, { command: 'sleep 600' })).json.process_id as string;
    const ctxA = { tenant_id: tenant, environment_id: 'env-1', session_id: 'platform-session-a' };
    const ctxB = { tenant_id: tenant, environment_id: 'env-2', session_id: 'platform-session-b' };
    const setA = await call('PUT', `/boxes/${a}/context`, { backup: ctxA, outbound: { tenant_id: tenant, session_id: 'platform-session-a' } });
    expect(setA.json).toEqual({ box_id: a, backup: ctxA, outbound: { tenant_id: tenant, session_id: 'platform-session-a' } });
    // A context not given stays as it was.
    expect((await call('PUT', `/boxes/${b}/context`, { outbound: { tenant_id: tenant, session_id: 'o' } })).json).toEqual({ box_id: b, backup: null, outbound: { tenant_id: tenant, session_id: 'o' } });
    expect((await call('PUT', `/boxes/${b}/context`, { backup: ctxB })).json).toEqual({ box_id: b, backup: ctxB, outbound: { tenant_id: tenant, session_id: 'o' } });
    expect(JSON.parse((await record(env.pool.ns, a))!.metadata!.annotations![ANNOTATIONS.backupContext]!)).toEqual(ctxA);
    for (const bad of [{}, { backup: { tenant_id: tenant } }, { backup: { ...ctxA, extra: 1 } }, { outbound: { tenant_id: '', session_id: 's' } }]) {
      expect((await call('PUT', `/boxes/${a}/context`, bad)).status).toBe(400);
    }
    expect((await call('PUT', '/boxes/box-000000000000-9/context', { backup: ctxA })).status).toBe(404);

    await exec(call, a, 'echo a > a.txt');
    const apiSnap = (await call('POST', `/boxes/${a}/snapshots`, { name: 'api' })).json;
    expect(apiSnap.context).toEqual(ctxA);
    await exec(call, b, 'echo b > b.txt');
    const bSnap = (await call('POST', `/boxes/${b}/snapshots`)).json;
    expect(bSnap.context).toEqual(ctxB);
    expect((await call('POST', `/boxes/${a}/processes/${holdA}/signal`, { signal: 'KILL' })).status).toBe(200);
    const { snapshot_id: sleepSnapId } = await sleeping(call, a);
    const sleepSnap = (await call('GET', `/snapshots/${sleepSnapId}`)).json;
    expect(sleepSnap).toMatchObject({ name: 'idle-sleep', context: ctxA });
    // Setting a context never wakes a box.
    expect((await call('PUT', `/boxes/${a}/context`, { backup: ctxA })).status).toBe(200);
    expect((await status(call, a)).status).toBe('Sleeping');

    const ids = async (query: string) => {
      const r = await call('GET', `/snapshots?${query}`);
      expect(r.status).toBe(200);
      const list = r.json.snapshots as Array<{ snapshot_id: string; created_at: string }>;
      const times = list.map((s) => Date.parse(s.created_at));
      expect(times).toEqual([...times].sort((x, y) => y - x));
      return list.map((s) => s.snapshot_id);
    };
    const t = encodeURIComponent(tenant);
    expect(await ids(`tenant_id=${t}`)).toEqual([sleepSnapId, bSnap.snapshot_id, apiSnap.snapshot_id]);
    expect(await ids(`tenant_id=${t}&environment_id=env-1`)).toEqual([sleepSnapId, apiSnap.snapshot_id]);
    expect(await ids(`tenant_id=${t}&environment_id=env-1&session_id=platform-session-a`)).toEqual([sleepSnapId, apiSnap.snapshot_id]);
    expect(await ids(`tenant_id=${t}&environment_id=env-1&session_id=platform-session-a&limit=1`)).toEqual([sleepSnapId]);
    expect(await ids(`tenant_id=${t}&session_id=platform-session-b`)).toEqual([bSnap.snapshot_id]);
    expect(await ids(`tenant_id=${t}&environment_id=env-2&session_id=platform-session-a`)).toEqual([]);
    expect(await ids(`tenant_id=other-${t}`)).toEqual([]);
    // The box session's own listing is as before, the context shown.
    expect((await call('GET', '/snapshots?session_id=ctx-a')).json.snapshots.map((s: { context: unknown }) => s.context)).toEqual([ctxA, ctxA]);
    for (const bad of ['', 'environment_id=env-1', 'environment_id=env-1&session_id=x', 'tenant_id=', `tenant_id=${t}&limit=0`, `tenant_id=${t}&bogus=1`]) {
      const r = await call('GET', `/snapshots?${bad}`);
      expect([bad, r.status, r.json?.error?.type]).toEqual([bad, 400, 'invalid_request']);
    }
    // Listed through the index: one marker per labelled snapshot under the tenant's prefix.
    const markers: string[] = [];
    for await (const o of s3.list(s3.key(`${indexPoolPrefix(env.pool.name)}${contextDigest(tenant)}/`))) markers.push(o.key.split('/').at(-1)!);
    expect(markers.sort()).toEqual([sleepSnapId, bSnap.snapshot_id, apiSnap.snapshot_id].sort());

    // A final snapshot on delete carries it too; a deleted snapshot leaves the listing (and the index).
    const deleted = await call('DELETE', `/boxes/${b}?snapshot=true`);
    expect(deleted.json.snapshot.context).toEqual(ctxB);
    expect(await ids(`tenant_id=${t}&environment_id=env-2`)).toEqual([deleted.json.snapshot.snapshot_id, bSnap.snapshot_id]);
    expect((await call('DELETE', `/snapshots/${bSnap.snapshot_id}`)).status).toBe(200);
    expect(await ids(`tenant_id=${t}&environment_id=env-2`)).toEqual([deleted.json.snapshot.snapshot_id]);
    expect((await call('DELETE', `/boxes/${a}`)).status).toBe(200);
  }, 240_000);

  test('session outputs: read live while the box runs, from the store after it sleeps and after it is destroyed; copied back on wake', async () => {
    const session = `outputs-${randomBytes(4).toString('hex')}`;
    const box = (await call('POST', '/boxes', { sessionId: 'outputs-box', ...SMALL })).json.box_id as string;
    expect((await call('GET', `/sessions/${session}/outputs`)).status).toBe(404); // never mounted
    const mounted = await call('POST', `/boxes/${box}/mounts/outputs`, { tenant_id: 't1', session_id: session });
    expect(mounted.json).toEqual({ path: '/mnt/session/outputs', tenant_id: 't1', session_id: session });
    expect((await call('POST', `/boxes/${box}/mounts/outputs`, { tenant_id: 't1' })).status).toBe(400);
    expect((await call('POST', `/boxes/${box}/mounts/outputs`, { tenant_id: 't1', session_id: `other-${session}` })).status).toBe(409);
    expect((await call('POST', `/boxes/${box}/mounts/outputs`, { tenant_id: 't1', session_id: session })).status).toBe(200); // again: fine
    await exec(
      call,
      box,
      'cd /mnt/session/outputs && echo hello > report.txt && mkdir -p sub/deeper && head -c 300000 /dev/urandom > sub/deeper/blob.bin && ' +
        'ln -s /etc/passwd link && echo workspace > /workspace/not-an-output.txt',
    );
    const blobSum = (await exec(call, box, 'sha256sum < /mnt/session/outputs/sub/deeper/blob.bin | cut -c1-64')).stdout.trim();
    const raw = async (path: string, token = TEST_TOKEN) => {
      const res = await fetch(`${bridge.url}/api/v1/sessions/${session}/outputs/${path}`, { headers: { authorization: `Bearer ${token}` } });
      return { status: res.status, source: res.headers.get('x-outputs-source'), type: res.headers.get('content-type'), body: Buffer.from(await res.arrayBuffer()) };
    };
    const files = async (source: 'box' | 'store') => {
      const r = await call('GET', `/sessions/${session}/outputs`);
      expect(r.json).toMatchObject({ session_id: session, source });
      return (r.json.files as Array<{ path: string; size: number }>).map((f) => [f.path, f.size]);
    };

    // Live: regular files only (the symlink is no output), by path.
    expect(await files('box')).toEqual([
      ['report.txt', 6],
      ['sub/deeper/blob.bin', 300000],
    ]);
    expect(await raw('report.txt')).toMatchObject({ status: 200, source: 'box', type: 'application/octet-stream', body: Buffer.from('hello\n') });
    expect(sha((await raw('sub/deeper/blob.bin')).body)).toBe(blobSum);
    // Contents: a boxes:read token may not read them, boxes:contents may.
    expect((await raw('report.txt', viewer)).status).toBe(403);
    expect((await api(bridge, viewer)('GET', `/sessions/${session}/outputs`)).status).toBe(403);
    expect((await raw('report.txt', reader)).status).toBe(200);
    expect((await raw('missing.txt')).status).toBe(404);

    // Traversal: "..", "." and separators inside a segment, however encoded, are refused. Sent as
    // written (fetch would resolve "." and ".." segments, "%2e%2e" included, before sending).
    for (const path of ['../../../../etc/passwd', '..%2F..%2Fetc%2Fpasswd', '%2e%2e/%2e%2e/etc/passwd', 'sub/%2e%2e/report.txt', 'sub/../report.txt', 'sub%2F..%2F..%2Fx', 'a%5C..%5Cb', 'sub//deeper/blob.bin', '%2e/report.txt', './report.txt', 'x%00y']) {
      const r = await rawRequest(bridge.url, `/api/v1/sessions/${session}/outputs/${path}`);
      expect([path, r.status, JSON.parse(r.body).error.type]).toEqual([path, 400, 'invalid_request']);
    }

    // Asleep: the store's copy, one object per file under the session's prefix.
    const pod = (await boxPods(env.pool.ns, box))[0]!.metadata!.uid;
    await sleeping(call, box);
    expect(await files('store')).toEqual([
      ['report.txt', 6],
      ['sub/deeper/blob.bin', 300000],
    ]);
    expect(await raw('report.txt')).toMatchObject({ status: 200, source: 'store', body: Buffer.from('hello\n') });
    expect(sha((await raw('sub/deeper/blob.bin')).body)).toBe(blobSum);
    expect((await rawRequest(bridge.url, `/api/v1/sessions/${session}/outputs/%2e%2e/x`)).status).toBe(400);
    expect((await raw('missing.txt')).status).toBe(404);
    const stored: string[] = [];
    const keys = outputsKeys(env.pool.name, session);
    for await (const o of s3.list(s3.key(keys.files))) stored.push(o.key.slice(s3.key(keys.files).length));
    expect(stored.sort()).toEqual(['report.txt', 'sub/deeper/blob.bin']);
    // Reading them woke nothing.
    expect((await status(call, box)).status).toBe('Sleeping');

    // Woken: the outputs are back in the box, which is the live source again.
    expect((await exec(call, box, 'cat /mnt/session/outputs/report.txt && sha256sum < /mnt/session/outputs/sub/deeper/blob.bin | cut -c1-64')).stdout).toBe(`hello\n${blobSum}\n`);
    expect((await boxPods(env.pool.ns, box)).find((p) => !p.metadata?.deletionTimestamp)?.metadata?.uid).not.toBe(pod);
    await exec(call, box, 'echo late > /mnt/session/outputs/late.txt && rm /mnt/session/outputs/report.txt');
    expect((await files('box')).map(([p]) => p)).toEqual(['late.txt', 'sub/deeper/blob.bin']);

    // Destroyed: copied before the delete, the removed file gone from the copy too.
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
    expect(await files('store')).toEqual([
      ['late.txt', 5],
      ['sub/deeper/blob.bin', 300000],
    ]);
    expect(await raw('late.txt')).toMatchObject({ status: 200, source: 'store', body: Buffer.from('late\n') });
    expect((await raw('report.txt')).status).toBe(404);

    // A later box mounting the same session's outputs gets them copied in.
    const next = (await call('POST', '/boxes', { sessionId: 'outputs-box-2', ...SMALL })).json.box_id as string;
    expect((await call('POST', `/boxes/${next}/mounts/outputs`, { tenant_id: 't1', session_id: session })).status).toBe(200);
    expect((await exec(call, next, 'cat /mnt/session/outputs/late.txt')).stdout).toBe('late\n');
    expect(await files('box')).toEqual([
      ['late.txt', 5],
      ['sub/deeper/blob.bin', 300000],
    ]);
    expect((await call('DELETE', `/boxes/${next}`)).status).toBe(200);
  }, 300_000);

  test('outputs the store will not take keep the box awake, like a snapshot over its limit', async () => {
    const session = `too-many-${randomBytes(4).toString('hex')}`;
    const box = (await call('POST', '/boxes', { sessionId: 'too-many-outputs', ...SMALL })).json.box_id as string;
    expect((await call('POST', `/boxes/${box}/mounts/outputs`, { tenant_id: 't1', session_id: session })).status).toBe(200);
    // More files than a copy takes (10,000).
    await exec(call, box, 'cd /mnt/session/outputs && mkdir d && cd d && seq 1 10001 | xargs touch && ls | wc -l');
    const pod = (await boxPods(env.pool.ns, box))[0]!;
    const failed = await until(
      'the sleep to fail',
      async () => (await eventsAbout(env.pool.ns, pod.metadata!.uid!)).find((e) => e.reason === 'SleepRefused' || e.reason === 'SleepFailed'),
      90_000,
    );
    expect(failed.message).toMatch(/10000/);
    expect((await status(call, box)).status).toBe('Running');
    expect((await boxPods(env.pool.ns, box)).map((p) => [p.metadata!.uid, p.metadata!.deletionTimestamp ?? null])).toEqual([[pod.metadata!.uid, null]]);
    // Still writable: the fence came down.
    await exec(call, box, 'rm -r /mnt/session/outputs/d && echo ok > /workspace/after.txt');
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);
});

/** A GET sent as written: fetch would resolve "..", this does not. */
function rawRequest(base: string, path: string): Promise<{ status: number; body: string }> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const req = request({ host: url.hostname, port: url.port, path, method: 'GET', headers: { authorization: `Bearer ${TEST_TOKEN}` } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}
