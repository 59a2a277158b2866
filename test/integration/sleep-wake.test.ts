// Idle sleep and wake end to end (docs/lifecycle.md): boxes on the local cluster's real node, the
// local S3 store (versitygw), the operator as its own process (it decides sleeps), real bridge
// replicas (they wake). An idle box is snapshotted, its pod deleted and reported Sleeping; a call
// wakes it with its tree (binary, empty, symlinks, modes, hard links, a 1 GiB sparse file) and
// env intact; two replicas woken at once make one pod; a background process or a long command
// keeps a box awake; a fork of the sleep snapshot is independent; a box whose snapshot is gone
// is Failed with its seat freed; only a boxes:write token wakes a box; a workspace over the
// pool's snapshot limit keeps its box awake with an Event; the store down leaves the box running;
// a box of the warm shape wakes into a warm pod; retention shortened while a box sleeps keeps its
// snapshot. The write-during-a-sleep and crash cases are in lifecycle-fence.test.ts.
import { randomBytes } from 'node:crypto';
import * as k8s from '@kubernetes/client-node';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RunningBridge } from '../../bridge/server.js';
import type { WatchEvent } from '../../client/index.js';
import { LABELS } from '../../common/labels.js';
import { ObjectStore, ObjectStoreConfigSchema } from '../../common/object-store.js';
import { parseSnapshotId, snapshotKey, METADATA_OBJECT, WORKSPACE_OBJECT } from '../../common/snapshots.js';
import { ON_REAL_NODE, api, testClient } from '../support/bridge.js';
import { realNodeAvailable } from '../support/cluster.js';
import { boxPods, core, eventsAbout, kc, metricAt, operatorMetric, record, startLifecycle, until, type LifecycleEnv } from '../support/lifecycle.js';
import { freePort } from '../support/operator.js';
import { localObjectStore } from '../support/object-store.js';

const realNode = await realNodeAvailable(kc);
const store = await localObjectStore();
const skipReason = !realNode.available ? `no real node: ${realNode.reason}` : !store.available ? `no object store: ${store.reason}` : undefined;
if (skipReason) console.warn(`SKIPPED sleep/wake tests on the real node: ${skipReason}`);
const suite = skipReason ? describe.skip : describe;
/** Short, so tests wait seconds. */
const SLEEP_AFTER_SECONDS = 4;
const SMALL = { cpu: 0.25, memory: 256 };

const TREE_SUM =
  'find . | LC_ALL=C sort | while read f; do if [ -L "$f" ]; then echo "$f -> $(readlink "$f")"; ' +
  'elif [ -f "$f" ]; then echo "$f $(stat -c %a "$f") $(sha256sum < "$f" | cut -c1-64)"; else echo "$f dir $(stat -c %a "$f")"; fi; done | sha256sum';

type Call = ReturnType<typeof api>;
const exec = (c: Call, id: string, command: string) =>
  c('POST', `/boxes/${id}/exec`, { command }).then((r) => {
    expect({ status: r.status, body: r.json }).toMatchObject({ status: 200 });
    return r.json as { exit_code: number; stdout: string; stderr: string };
  });
const sleeping = (c: Call, id: string, timeoutMs = 90_000) =>
  until(
    `box ${id} to sleep`,
    async () => {
      const s = await c('GET', `/boxes/${id}/status`);
      return s.json?.status === 'Sleeping' ? s.json : undefined;
    },
    timeoutMs,
  );

suite('idle sleep and wake on the real node with the real store', () => {
  let env: LifecycleEnv;
  let bridgeA: RunningBridge;
  let bridgeB: RunningBridge;
  let call: Call;
  let callB: Call;
  const secret = `s3cr3t-${randomBytes(6).toString('hex')}`;

  beforeAll(async () => {
    env = await startLifecycle({ name: 'sleep', pool: { maxBoxes: 10, box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: SLEEP_AFTER_SECONDS } }, bridges: 2 });
    [bridgeA, bridgeB] = env.bridges as [RunningBridge, RunningBridge];
    call = api(bridgeA);
    callB = api(bridgeB);
  }, 120_000);

  afterAll(async () => {
    await env?.stop();
  }, 60_000);

  test('an idle box sleeps (snapshot stored, pod gone, record kept); a call wakes it with its files and env intact', async () => {
    const created = await call('POST', '/boxes', { sessionId: 'sleepy', ...SMALL, env: { FROM_CREATE: 'created' } });
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
    const firstPod = (await boxPods(env.pool.ns, box))[0]!.metadata!.uid;
    // A file watch open through the other replica neither keeps the box awake nor outlives it.
    const watch = testClient(bridgeB, { retries: 0 }).watchFiles(box, '.');
    expect((await watch.next()).value).toMatchObject({ type: 'ready' });

    const status = await sleeping(call, box);
    let last: IteratorResult<WatchEvent>;
    do last = await Promise.race([watch.next(), new Promise<never>((_, reject) => setTimeout(() => reject(new Error('the watch did not end within 30 s')), 30_000).unref())]);
    while (!last.done && last.value.type !== 'end');
    expect(last.value).toEqual({ type: 'end', reason: 'sleep' });
    expect(status).toMatchObject({ box_id: box, status: 'Sleeping', pod_name: '', session_id: 'sleepy', cpu: '250m', memory: '256Mi', snapshot_id: expect.stringMatching(/^snap-/) });
    expect(Date.parse(status.expires_at)).toBeGreaterThan(Date.now());
    expect((await boxPods(env.pool.ns, box)).filter((p) => !p.metadata?.deletionTimestamp)).toHaveLength(0);
    const rec = await record(env.pool.ns, box);
    expect(rec?.metadata?.labels?.[LABELS.sleep]).toBe('asleep');
    expect(rec?.metadata?.annotations?.['sandbox-bridge.io/lease']).toBeUndefined();
    // Listed as Sleeping by either replica; the snapshot is in the store and outlives the box.
    expect((await callB('GET', '/sandboxes?session_id=sleepy')).json.sandboxes).toEqual([expect.objectContaining({ box_id: box, status: 'Sleeping' })]);
    const snapshot = (await call('GET', `/snapshots/${status.snapshot_id}`)).json;
    expect(snapshot).toMatchObject({ box_id: box, name: 'idle-sleep' });
    expect(Date.parse(snapshot.expires_at)).toBeGreaterThanOrEqual(Date.parse(status.expires_at) + 3600_000 - 1000);

    // Woken by a call through the other replica: same box id, a new pod, everything intact.
    const started = performance.now();
    expect((await exec(callB, box, TREE_SUM)).stdout).toBe(before);
    const wakeMs = performance.now() - started;
    expect((await exec(call, box, 'printf "%s|%s|%s" "$SECRET_TOKEN" "${EMPTY-unset}" "$FROM_CREATE"')).stdout).toBe(`${secret}||created`);
    const pods = (await boxPods(env.pool.ns, box)).filter((p) => !p.metadata?.deletionTimestamp);
    expect(pods).toHaveLength(1);
    expect(pods[0]!.metadata!.uid).not.toBe(firstPod);
    expect(pods[0]!.metadata!.annotations?.['sandbox-bridge.io/expires-at']).toBe(status.expires_at);
    console.log(`cold wake of a small workspace answered in ${Math.round(wakeMs)} ms`);

    expect(await operatorMetric(env.operator, 'sandbox_operator_sleeps_total', { outcome: 'slept' })).toBeGreaterThanOrEqual(1);
    expect(await metricAt(bridgeB.metricsUrl, 'sandbox_bridge_box_wakes_total', { outcome: 'ok' })).toBeGreaterThanOrEqual(1);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);

  test('two replicas woken at once make one pod; every call is answered', async () => {
    const box = (await call('POST', '/boxes', { sessionId: 'racers', ...SMALL })).json.box_id as string;
    await exec(call, box, 'echo kept > kept.txt');
    await sleeping(call, box);
    const wakes = async () =>
      (await metricAt(bridgeA.metricsUrl, 'sandbox_bridge_box_wakes_total', { outcome: 'ok' })) + (await metricAt(bridgeB.metricsUrl, 'sandbox_bridge_box_wakes_total', { outcome: 'ok' }));
    const before = await wakes();
    const results = await Promise.all([call, callB, call, callB, call, callB].map((c) => exec(c, box, 'cat kept.txt')));
    for (const r of results) expect(r.stdout).toBe('kept\n');
    expect((await wakes()) - before).toBe(1);
    expect((await boxPods(env.pool.ns, box)).filter((p) => !p.metadata?.deletionTimestamp)).toHaveLength(1);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);

  test('a woken pod is served by no replica before its workspace is restored', async () => {
    const box = (await call('POST', '/boxes', { sessionId: 'restoring', ...SMALL })).json.box_id as string;
    // Large enough that the restore takes a while: the other replica sees the new pod meanwhile.
    await exec(call, box, 'head -c 83886080 /dev/urandom > big.bin && echo marker > m');
    await sleeping(call, box);
    const old = new Set((await boxPods(env.pool.ns, box)).map((p) => p.metadata!.uid));
    // Every version of the box's pods, to see the commit's own write.
    const versions: k8s.V1Pod[] = [];
    const watch = await new k8s.Watch(kc).watch(`/api/v1/namespaces/${env.pool.ns}/pods`, {}, (_type: string, p: k8s.V1Pod) => void versions.push(p), () => undefined);
    const waking = exec(call, box, 'cat m');
    const fresh = await until('the wake\'s new pod', async () => (await boxPods(env.pool.ns, box)).find((p) => !old.has(p.metadata!.uid) && !p.metadata?.deletionTimestamp), 60_000, 50);
    const seenRestoring = Date.now();
    expect(fresh.metadata?.annotations?.['sandbox-bridge.io/restoring']).toBe('true'); // not committed yet
    // Calls through the other replica, from the moment the pod exists: each waits for the wake.
    const during = await Promise.all(Array.from({ length: 4 }, (_, i) => new Promise((r) => setTimeout(r, i * 200)).then(() => exec(callB, box, 'cat m'))));
    for (const r of during) expect(r).toMatchObject({ exit_code: 0, stdout: 'marker\n' });
    expect(await waking).toMatchObject({ exit_code: 0, stdout: 'marker\n' });
    expect((await core.readNamespacedPod({ name: fresh.metadata!.name!, namespace: env.pool.ns })).metadata?.annotations?.['sandbox-bridge.io/restoring']).toBeUndefined();
    // The commit counts the box active from then, not from when the wake began: a restore longer
    // than the idle time must not put the box straight back to sleep.
    (watch as { abort: () => void }).abort();
    const committed = versions.find((p) => p.metadata?.uid === fresh.metadata!.uid && p.metadata?.annotations?.['sandbox-bridge.io/restoring'] === undefined);
    expect(Date.parse(committed?.metadata?.annotations?.['sandbox-bridge.io/last-active'] ?? '')).toBeGreaterThanOrEqual(seenRestoring);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);

  test('a running background process keeps its box awake (the keepalive); deleting a sleeping box deletes its record', async () => {
    const box = (await call('POST', '/boxes', { sessionId: 'busy', ...SMALL })).json.box_id as string;
    expect((await call('POST', `/boxes/${box}/processes`, { command: 'sleep 600' })).status).toBe(201);
    await new Promise((r) => setTimeout(r, (SLEEP_AFTER_SECONDS * 3 + 2) * 1000));
    expect((await call('GET', `/boxes/${box}/status`)).json.status).toBe('Running');
    expect(await operatorMetric(env.operator, 'sandbox_operator_sleeps_total', { outcome: 'busy' })).toBeGreaterThanOrEqual(1);
    const procs = (await call('GET', `/boxes/${box}/processes`)).json.processes as Array<{ process_id: string }>;
    expect((await call('POST', `/boxes/${box}/processes/${procs[0]!.process_id}/signal`, { signal: 'KILL' })).status).toBe(200);
    await sleeping(call, box);
    expect((await callB('DELETE', `/boxes/${box}`)).json).toMatchObject({ box_id: box, status: 'Terminated' });
    expect((await callB('GET', `/boxes/${box}/status`)).status).toBe(404);
    await until('the record to go', async () => ((await record(env.pool.ns, box)) ? undefined : true));
    await until('the other replica to answer 404', async () => ((await call('GET', `/boxes/${box}/status`)).status === 404 ? true : undefined), 10_000);
  }, 240_000);

  test('a command still running when the idle time is up keeps its box awake', async () => {
    const box = (await call('POST', '/boxes', { sessionId: 'long-command', ...SMALL })).json.box_id as string;
    const pod = (await boxPods(env.pool.ns, box))[0]!.metadata!.uid;
    expect(await exec(call, box, `sleep ${SLEEP_AFTER_SECONDS * 3 + 2}; echo done`)).toMatchObject({ exit_code: 0, stdout: 'done\n' });
    expect((await boxPods(env.pool.ns, box)).map((p) => [p.metadata!.uid, p.metadata!.deletionTimestamp ?? null])).toEqual([[pod, null]]);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 120_000);

  test('a fork of the sleep snapshot is independent of the box', async () => {
    const box = (await call('POST', '/boxes', { sessionId: 'forked', ...SMALL })).json.box_id as string;
    await exec(call, box, 'echo original > note.txt');
    const { snapshot_id: snapshotId } = await sleeping(call, box);
    const fork = await callB('POST', '/boxes', { sessionId: 'fork-of-sleeper', snapshot_id: snapshotId });
    expect(fork.status).toBe(201);
    await exec(callB, fork.json.box_id, 'echo changed > note.txt');
    expect((await exec(call, box, 'cat note.txt')).stdout).toBe('original\n');
    expect((await exec(call, fork.json.box_id, 'cat note.txt')).stdout).toBe('changed\n');
    await Promise.all([call('DELETE', `/boxes/${box}`), call('DELETE', `/boxes/${fork.json.box_id}`)]);
  }, 240_000);

  test('a sparse 1 GiB file and 50 hard links survive sleep and wake in a small snapshot', async () => {
    const box = (await call('POST', '/boxes', { sessionId: 'sparse-links', ...SMALL })).json.box_id as string;
    const made = await exec(
      call,
      box,
      'dd if=/dev/zero of=big.sparse bs=1 count=0 seek=1073741824 2>/dev/null && printf middle | dd of=big.sparse bs=1 seek=536870912 conv=notrunc 2>/dev/null && ' +
        'head -c 1048576 /dev/urandom > one.bin && mkdir links && for i in $(seq 1 50); do ln one.bin links/l$i; done && ' +
        'echo "$(stat -c %s big.sparse) $(du -k big.sparse | cut -f1) $(stat -c %h one.bin) $(sha256sum < one.bin | cut -c1-16)"',
    );
    const [size, kib, links, sum] = made.stdout.trim().split(' ');
    expect([size, links]).toEqual(['1073741824', '51']);
    expect(Number(kib)).toBeLessThan(1024);
    const { snapshot_id: snapshotId } = await sleeping(call, box);
    const snapshot = (await call('GET', `/snapshots/${snapshotId}`)).json;
    // 1 MiB of random data once, a few bytes of the sparse file, tar headers: well under 2 MiB.
    expect(snapshot.size).toBeLessThan(2 * 1024 * 1024);
    const after = await exec(
      callB,
      box,
      'echo "$(stat -c %s big.sparse) $(du -k big.sparse | cut -f1) $(stat -c %h one.bin) $(sha256sum < one.bin | cut -c1-16) ' +
        '$(stat -c %i one.bin links/l1 links/l50 | sort -u | wc -l) $(dd if=big.sparse bs=1 skip=536870912 count=6 2>/dev/null)"',
    );
    const [size2, kib2, links2, sum2, inodes, middle] = after.stdout.trim().split(' ');
    expect([size2, links2, sum2, inodes, middle]).toEqual(['1073741824', '51', sum, '1', 'middle']);
    expect(Number(kib2)).toBeLessThan(1024);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);

  test('a box whose snapshot is gone is Failed: 409 naming why, an Event, its seat freed', async () => {
    const box = (await call('POST', '/boxes', { sessionId: 'lost', ...SMALL })).json.box_id as string;
    const seat = (await boxPods(env.pool.ns, box))[0]!.metadata!.labels![LABELS.seat]!;
    await exec(call, box, 'echo doomed > f');
    const { snapshot_id: snapshotId } = await sleeping(call, box);
    // Someone deletes the snapshot behind the operator's back.
    const s3 = new ObjectStore(ObjectStoreConfigSchema.parse(env.storeEnv));
    try {
      const id = parseSnapshotId(snapshotId)!;
      await s3.delete([s3.key(snapshotKey(env.pool.name, id, METADATA_OBJECT)), s3.key(snapshotKey(env.pool.name, id, WORKSPACE_OBJECT))]);
    } finally {
      s3.close();
    }
    const answer = await callB('POST', `/boxes/${box}/exec`, { command: 'cat f' });
    expect(answer.status).toBe(409);
    expect(answer.json.error.message).toMatch(/failed/);
    const status = (await call('GET', `/boxes/${box}/status`)).json;
    expect(status).toMatchObject({ status: 'Failed', failure: expect.stringMatching(/snapshot/) });
    const rec = (await record(env.pool.ns, box))!;
    expect(rec.metadata?.labels?.[LABELS.sleep]).toBe('failed');
    expect((await eventsAbout(env.pool.ns, rec.metadata!.uid!)).map((e) => e.reason)).toContain('BoxFailed');
    await until('the seat to be free', async () => ((await core.readNamespacedSecret({ name: `box-seat-${seat}`, namespace: env.pool.ns }).catch(() => undefined)) ? undefined : true), 10_000);
    expect(await metricAt(bridgeB.metricsUrl, 'sandbox_bridge_box_wakes_total', { outcome: 'failed' })).toBeGreaterThanOrEqual(1);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);

  test('only a boxes:write token wakes a box: contents and metadata reads get 409 and leave it asleep', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tokens-'));
    const viewer = `viewer-${randomBytes(12).toString('hex')}`;
    const reader = `reader-${randomBytes(12).toString('hex')}`;
    writeFileSync(
      join(dir, 'tokens.json'),
      JSON.stringify([
        { name: 'viewer', token: viewer, scopes: ['boxes:read'] },
        { name: 'reader', token: reader, scopes: ['boxes:read', 'boxes:contents'] },
      ]),
    );
    const scoped = await env.addBridge({ BRIDGE_TOKENS_FILE: join(dir, 'tokens.json') });
    try {
      const box = (await call('POST', '/boxes', { sessionId: 'read-only', ...SMALL })).json.box_id as string;
      await exec(call, box, 'echo content > f.txt');
      await sleeping(call, box);
      const asViewer = api(scoped, viewer);
      const asReader = api(scoped, reader);
      expect((await asViewer('GET', `/boxes/${box}/files?path=f.txt`)).status).toBe(403); // contents: not its scope
      expect((await asViewer('GET', `/boxes/${box}/status`)).json.status).toBe('Sleeping');
      for (const path of [`/boxes/${box}/processes`]) expect((await asViewer('GET', path)).status).toBe(409);
      for (const path of [`/boxes/${box}/files?path=f.txt`, `/boxes/${box}/files/list?path=.`, `/boxes/${box}/archive?path=.`]) {
        const r = await asReader('GET', path);
        expect([path, r.status, r.json?.error?.message]).toEqual([path, 409, expect.stringMatching(/sleeping/)]);
      }
      expect((await call('GET', `/boxes/${box}/status`)).json.status).toBe('Sleeping');
      expect((await boxPods(env.pool.ns, box)).filter((p) => !p.metadata?.deletionTimestamp)).toHaveLength(0);
      expect((await record(env.pool.ns, box))?.metadata?.labels?.[LABELS.sleep]).toBe('asleep');
      // The writer's read wakes it.
      expect((await call('GET', `/boxes/${box}/files?path=f.txt`)).json).toMatchObject({ content: 'content\n' });
      expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 240_000);
});

suite('snapshot limits are restore\'s limits: a workspace over spec.snapshots.maxBytes keeps its box awake', () => {
  let env: LifecycleEnv;
  beforeAll(async () => {
    env = await startLifecycle({ name: 'sleep-big', pool: { box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: 2 }, snapshots: { maxBytes: '1Mi' } } });
  }, 120_000);
  afterAll(async () => {
    await env?.stop();
  }, 60_000);

  test('refused before a byte moves: the box runs on, a SleepRefused Event says why, the metric counts it', async () => {
    const call = api(env.bridges[0]!);
    const box = (await call('POST', '/boxes', { sessionId: 'too-big', ...SMALL })).json.box_id as string;
    await exec(call, box, 'head -c 2097152 /dev/urandom > big.bin');
    const pod = (await boxPods(env.pool.ns, box))[0]!;
    const event = await until('a SleepRefused event', async () => (await eventsAbout(env.pool.ns, pod.metadata!.uid!)).find((e) => e.reason === 'SleepRefused'), 60_000);
    expect(event.message).toMatch(/maxBytes/);
    expect(await operatorMetric(env.operator, 'sandbox_operator_sleeps_total', { outcome: 'too_large' })).toBeGreaterThanOrEqual(1);
    expect((await call('GET', `/boxes/${box}/status`)).json.status).toBe('Running');
    expect((await record(env.pool.ns, box))?.metadata?.labels?.[LABELS.sleep]).toBeUndefined();
    // The refusal was boxd's, before streaming: no upload was started for it.
    const s3 = new ObjectStore(ObjectStoreConfigSchema.parse(env.storeEnv));
    try {
      const uploads: unknown[] = [];
      for await (const u of s3.listUploads(env.storeEnv.OBJECT_STORE_PREFIX!)) uploads.push(u);
      expect(uploads).toEqual([]);
    } finally {
      s3.close();
    }
    expect((await boxPods(env.pool.ns, box)).map((p) => p.metadata!.uid)).toEqual([pod.metadata!.uid]);
  }, 180_000);
});

suite('idle sleep with the object store down', () => {
  let env: LifecycleEnv;
  beforeAll(async () => {
    // A closed port: the operator's store refuses every connection (the bridges' is fine).
    env = await startLifecycle({ name: 'sleep-down', pool: { box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: 2 } }, operatorEnv: { OBJECT_STORE_ENDPOINT: `http://127.0.0.1:${await freePort()}` } });
  }, 120_000);
  afterAll(async () => {
    await env?.stop();
  }, 60_000);

  test('the box keeps running with nothing lost, and one Event on its pod says why', async () => {
    const call = api(env.bridges[0]!);
    const box = (await call('POST', '/boxes', { sessionId: 'store-down', ...SMALL })).json.box_id as string;
    await exec(call, box, 'echo safe > kept.txt');
    const pod = (await boxPods(env.pool.ns, box))[0]!;
    const event = await until('a SleepFailed event', async () => (await eventsAbout(env.pool.ns, pod.metadata!.uid!)).find((e) => e.reason === 'SleepFailed'), 60_000);
    expect(event.type).toBe('Warning');
    expect(event.message).toMatch(/keeps running/);
    expect((await call('GET', `/boxes/${box}/status`)).json.status).toBe('Running');
    expect((await record(env.pool.ns, box))?.metadata?.labels?.[LABELS.sleep]).toBeUndefined();
    expect((await exec(call, box, 'cat kept.txt')).stdout).toBe('safe\n');
    expect(await operatorMetric(env.operator, 'sandbox_operator_sleeps_total', { outcome: 'error' })).toBeGreaterThanOrEqual(1);
    // Backed off: no second attempt within the first minute, so no second Event either.
    await new Promise((r) => setTimeout(r, 5000));
    expect(await operatorMetric(env.operator, 'sandbox_operator_sleeps_total', { outcome: 'error' })).toBe(1);
    expect((await eventsAbout(env.pool.ns, pod.metadata!.uid!)).filter((e) => e.reason === 'SleepFailed')).toHaveLength(1);
    expect((await boxPods(env.pool.ns, box)).map((p) => p.metadata!.uid)).toEqual([pod.metadata!.uid]);
  }, 120_000);
});

suite('a wake into a warm box', () => {
  let env: LifecycleEnv;
  let call: Call;
  const warmReady = async () =>
    (await core.listNamespacedPod({ namespace: env.pool.ns, labelSelector: `${LABELS.warm}=${env.pool.name}` })).items.filter(
      (p) => !p.metadata?.deletionTimestamp && p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'),
    ).length;

  beforeAll(async () => {
    env = await startLifecycle({
      name: 'wake-warm',
      pool: { maxBoxes: 6, box: { ...ON_REAL_NODE.box, defaultCpu: '100m', defaultMemory: '64Mi' }, warm: { count: 1 }, idle: { sleepAfterSeconds: 3 } },
    });
    call = api(env.bridges[0]!);
  }, 120_000);

  afterAll(async () => {
    await env?.stop();
  }, 60_000);

  test('a sleeping box of the pool\'s warm shape wakes into a warm pod, its workspace restored', async () => {
    await until('a warm box', async () => ((await warmReady()) >= 1 ? true : undefined), 120_000);
    const created = await call('POST', '/boxes', { sessionId: 'wakes-warm' });
    expect(created.json.pod_name).toMatch(/^box-warm-/);
    const box = created.json.box_id as string;
    await exec(call, box, 'echo kept > kept.txt');
    await sleeping(call, box);
    await until('the warm pool to refill', async () => ((await warmReady()) >= 1 ? true : undefined), 120_000);
    expect((await exec(call, box, 'cat kept.txt')).stdout).toBe('kept\n');
    const status = (await call('GET', `/boxes/${box}/status`)).json;
    expect(status.pod_name).toMatch(/^box-warm-/);
    expect(status.pod_name).not.toBe(created.json.pod_name);
    expect(await metricAt(env.bridges[0]!.metricsUrl, 'sandbox_bridge_box_wakes_total', { path: 'warm', outcome: 'ok' })).toBe(1);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 300_000);
});

suite('retention shortened while a box sleeps', () => {
  let env: LifecycleEnv;
  beforeAll(async () => {
    env = await startLifecycle({
      name: 'sleep-retention',
      // The shortest retention there is; the box lives an hour.
      pool: { box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: 2 }, snapshots: { retentionSeconds: 60 } },
      operatorEnv: { SNAPSHOT_SWEEP_SECONDS: '2', SNAPSHOT_INCOMPLETE_GRACE_SECONDS: '1' },
    });
  }, 120_000);
  afterAll(async () => {
    await env?.stop();
  }, 60_000);

  test('never deletes the snapshot a sleeping box needs: past the retention, the box wakes with its files', async () => {
    const call = api(env.bridges[0]!);
    const box = (await call('POST', '/boxes', { sessionId: 'kept-asleep', ...SMALL })).json.box_id as string;
    await exec(call, box, 'echo still-here > f');
    // A snapshot nothing names, taken alongside: retention deletes it once it is past its time.
    const other = (await call('POST', '/boxes', { sessionId: 'control', ...SMALL })).json.box_id as string;
    const control = (await call('POST', `/boxes/${other}/snapshots`, { ttlSeconds: 60 })).json.snapshot_id as string;
    await call('DELETE', `/boxes/${other}`);
    const { snapshot_id: snapshotId } = await sleeping(call, box);
    await until('retention to delete the unnamed snapshot', async () => ((await call('GET', `/snapshots/${control}`)).status === 404 ? true : undefined), 150_000, 1000);
    // Past its creation + the retention, and retention has swept since: still there.
    const taken = parseSnapshotId(snapshotId)!.createdAt.getTime();
    await until('the sleep snapshot to be past the retention', async () => (Date.now() > taken + 65_000 ? true : undefined), 90_000, 1000);
    await new Promise((r) => setTimeout(r, 4000)); // two more sweeps
    expect((await call('GET', `/snapshots/${snapshotId}`)).status).toBe(200);
    expect((await exec(call, box, 'cat f')).stdout).toBe('still-here\n');
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 300_000);
});
