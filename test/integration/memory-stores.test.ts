// Memory stores end to end (docs/mounts.md; issue 21's mountMemoryStore): boxes on the local
// cluster's real node with the mounts sidecar, the local S3 store, the operator as its own process
// (it syncs before a sleep), a real bridge. A store the test put in the object store appears at
// /mnt/memory/<name>/; a read-only one refuses every write of box code with EROFS (a read-only
// mount, whatever chmod tries), and box code cannot reach the sidecar; a read-write store's files
// written in one session's box reach another session's box after a sync and after the first box
// is destroyed (deletes too); a box's stores survive its sleep and wake; a store that cannot be
// synced keeps its box awake; a pool without memory stores answers 409.
import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import type { RunningBridge } from '../../bridge/server.js';
import { ObjectStore, ObjectStoreConfigSchema } from '../../common/object-store.js';
import { ON_REAL_NODE, api, startTestBridge } from '../support/bridge.js';
import { realNodeAvailable } from '../support/cluster.js';
import { boxPods, eventsAbout, kc, startLifecycle, until, type LifecycleEnv } from '../support/lifecycle.js';
import { localObjectStore } from '../support/object-store.js';

const realNode = await realNodeAvailable(kc);
const storeSettings = await localObjectStore();
const skipReason = !realNode.available ? `no real node: ${realNode.reason}` : !storeSettings.available ? `no object store: ${storeSettings.reason}` : undefined;
if (skipReason) console.warn(`SKIPPED memory store tests on the real node: ${skipReason}`);
const suite = skipReason ? describe.skip : describe;
const SLEEP_AFTER_SECONDS = 5;
const SMALL = { cpu: 0.25, memory: 256 };

type Call = ReturnType<typeof api>;
const exec = (c: Call, id: string, command: string) =>
  c('POST', `/boxes/${id}/exec`, { command }).then((r) => {
    expect({ status: r.status, body: r.json }).toMatchObject({ status: 200 });
    return r.json as { exit_code: number; stdout: string; stderr: string };
  });

suite('memory stores on the real node with the real store', () => {
  let env: LifecycleEnv;
  let bridge: RunningBridge;
  let call: Call;
  let s3: ObjectStore;
  const run = randomBytes(4).toString('hex');
  const storeKey = (storeId: string, path: string) => s3.key('memory', storeId, path);
  const put = (storeId: string, path: string, body: string) => s3.upload(storeKey(storeId, path), Readable.from(Buffer.from(body)), { contentType: 'text/plain' });
  const stored = async (storeId: string): Promise<Record<string, string>> => {
    const out: Record<string, string> = {};
    const prefix = `${s3.key('memory', storeId)}/`;
    for await (const o of s3.list(prefix)) {
      const got = await s3.getStream(o.key);
      const chunks: Buffer[] = [];
      for await (const c of got!.body) chunks.push(c as Buffer);
      out[o.key.slice(prefix.length)] = Buffer.concat(chunks).toString();
    }
    return out;
  };
  const newBox = async (session: string) => {
    const created = await call('POST', '/boxes', { sessionId: `${session}-${run}`, ...SMALL });
    expect(created.status).toBe(201);
    return created.json.box_id as string;
  };
  const mount = (box: string, body: Record<string, unknown>) => call('POST', `/boxes/${box}/mounts/memory`, body);

  beforeAll(async () => {
    env = await startLifecycle({
      name: 'memory',
      pool: { maxBoxes: 10, box: { ...ON_REAL_NODE.box, memoryStores: { enabled: true, sizeLimit: '64Mi' } }, idle: { sleepAfterSeconds: SLEEP_AFTER_SECONDS } },
    });
    bridge = env.bridges[0]!;
    call = api(bridge);
    s3 = new ObjectStore(ObjectStoreConfigSchema.parse(env.storeEnv));
  }, 120_000);

  afterAll(async () => {
    s3?.close();
    await env?.stop();
  }, 60_000);

  test('a store put in the object store appears read-only; box code cannot write it, chmod it, or reach the sidecar', async () => {
    const storeId = `ro-${run}`;
    await put(storeId, 'notes.md', 'remember the milk\n');
    await put(storeId, 'dir/deep.txt', 'deep\n');
    const box = await newBox('ro');

    const mounted = await mount(box, { store_name: 'facts', store_id: storeId, read_only: true });
    expect(mounted).toMatchObject({ status: 200, json: { path: '/mnt/memory/facts', store_name: 'facts', store_id: storeId, read_only: true, files: 2, bytes: 23 } });
    expect((await exec(call, box, 'cat /mnt/memory/facts/notes.md /mnt/memory/facts/dir/deep.txt')).stdout).toBe('remember the milk\ndeep\n');

    // Every write is refused by the kernel (EROFS), whatever the file modes say or are made to say.
    const tries = [
      'echo x >> /mnt/memory/facts/notes.md',
      'chmod 0777 /mnt/memory/facts/notes.md',
      'chmod -R u+w /mnt/memory/facts',
      'touch /mnt/memory/facts/new',
      'rm -f /mnt/memory/facts/notes.md',
      'mv /mnt/memory/facts /mnt/memory/moved',
      'mkdir /mnt/memory/other',
      'ln -s /tmp /mnt/memory/link',
    ];
    for (const t of tries) {
      const r = await exec(call, box, `${t}; echo "rc=$?"`);
      expect({ t, out: r.stdout, err: r.stderr }).toEqual({ t, out: expect.stringMatching(/rc=[1-9]/), err: expect.stringMatching(/Read-only file system/) });
    }
    expect((await exec(call, box, 'grep " /mnt/memory " /proc/self/mountinfo')).stdout).toMatch(/ \/mnt\/memory ro[, ]/);
    expect((await exec(call, box, 'cat /mnt/memory/facts/notes.md; ls /mnt/memory')).stdout).toBe('remember the milk\nfacts\n');

    // The box holds its boxd credential, but the sidecar takes no call from inside the pod.
    const reach = await exec(
      call,
      box,
      'for a in 127.0.0.1 $(hostname -i); do wget -q -O- --header "X-Boxd-Token: $(cat /opt/sandbox-bridge/secret/token)" ' +
        '"http://$a:7772/v1/memory/facts/files" 2>&1; echo "rc=$?"; done',
    );
    expect(reach.stdout).toMatch(/403 Forbidden[\s\S]*rc=1[\s\S]*403 Forbidden[\s\S]*rc=1/);

    // Mounted again: the store's files now (one changed in the store meanwhile).
    await put(storeId, 'notes.md', 'remember the eggs\n');
    expect((await mount(box, { store_name: 'facts', store_id: storeId, read_only: true })).status).toBe(200);
    expect((await exec(call, box, 'cat /mnt/memory/facts/notes.md')).stdout).toBe('remember the eggs\n');

    // Errors: the same name as another store or mode, a read-only store synced, names that are not one component.
    expect(await mount(box, { store_name: 'facts', store_id: `other-${run}`, read_only: true })).toMatchObject({ status: 409, json: { error: { type: 'conflict' } } });
    expect(await mount(box, { store_name: 'facts', store_id: storeId, read_only: false })).toMatchObject({ status: 409 });
    expect(await call('POST', `/boxes/${box}/mounts/memory/facts/sync`)).toMatchObject({ status: 409, json: { error: { type: 'conflict' } } });
    expect(await call('POST', `/boxes/${box}/mounts/memory/nothing/sync`)).toMatchObject({ status: 404 });
    for (const bad of [{ store_name: '../x', store_id: 's', read_only: true }, { store_name: 'a/b', store_id: 's', read_only: true }, { store_name: 'a', store_id: '..', read_only: true }, { store_name: 'a', store_id: 's' }]) {
      expect(await mount(box, bad)).toMatchObject({ status: 400, json: { error: { type: 'invalid_request' } } });
    }
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);

  test("a read-write store: one session's writes reach another session's box after a sync and after the first box is destroyed", async () => {
    const storeId = `rw-${run}`;
    await put(storeId, 'seed.txt', 'seed\n');
    await put(storeId, 'gone.txt', 'to be deleted\n');
    const a = await newBox('writer');
    expect(await mount(a, { store_name: 'work', store_id: storeId, read_only: false })).toMatchObject({ status: 200, json: { path: '/mnt/memory/work', read_only: false, files: 2 } });
    expect((await exec(call, a, 'cd /mnt/memory/work && cat seed.txt && echo one > one.txt && mkdir -p d && echo deep > d/two.txt && echo changed > seed.txt && echo ok')).stdout).toBe('seed\nok\n');
    // The link itself is not box code's to change (it is on the read-only mount).
    expect((await exec(call, a, 'rm /mnt/memory/work; echo "rc=$?"')).stderr).toMatch(/Read-only file system/);

    expect(await call('POST', `/boxes/${a}/mounts/memory/work/sync`)).toMatchObject({ status: 200, json: { store_name: 'work', store_id: storeId, files: 4 } });
    expect(await stored(storeId)).toEqual({ 'seed.txt': 'changed\n', 'gone.txt': 'to be deleted\n', 'one.txt': 'one\n', 'd/two.txt': 'deep\n' });

    const b = await newBox('reader');
    expect(await mount(b, { store_name: 'shared', store_id: storeId, read_only: false })).toMatchObject({ status: 200, json: { files: 4 } });
    expect((await exec(call, b, 'cat /mnt/memory/shared/one.txt /mnt/memory/shared/d/two.txt /mnt/memory/shared/seed.txt')).stdout).toBe('one\ndeep\nchanged\n');

    // Written and deleted after the sync, then the box destroyed: the delete syncs first.
    await exec(call, a, 'cd /mnt/memory/work && echo late > late.txt && rm gone.txt');
    expect((await call('DELETE', `/boxes/${a}`)).status).toBe(200);
    expect(await stored(storeId)).toEqual({ 'seed.txt': 'changed\n', 'one.txt': 'one\n', 'd/two.txt': 'deep\n', 'late.txt': 'late\n' });
    expect(await mount(b, { store_name: 'view', store_id: storeId, read_only: true })).toMatchObject({ status: 200, json: { files: 4 } });
    expect((await exec(call, b, 'cat /mnt/memory/view/late.txt; ls /mnt/memory/view')).stdout).toBe('late\nd\nlate.txt\none.txt\nseed.txt\n');
    expect((await call('DELETE', `/boxes/${b}`)).status).toBe(200);
  }, 240_000);

  test("a box's stores survive its sleep and wake: what it wrote is in the store before the pod goes, the read-only one is read-only again", async () => {
    const rw = `sleep-rw-${run}`;
    const ro = `sleep-ro-${run}`;
    await put(ro, 'fact.txt', 'fact\n');
    const box = await newBox('sleeper');
    expect((await mount(box, { store_name: 'mine', store_id: rw, read_only: false })).status).toBe(200);
    expect((await mount(box, { store_name: 'facts', store_id: ro, read_only: true })).status).toBe(200);
    await exec(call, box, 'echo "before sleep" > /mnt/memory/mine/diary.txt');
    await until(
      `box ${box} to sleep`,
      async () => ((await call('GET', `/boxes/${box}/status`)).json?.status === 'Sleeping' ? true : undefined),
      90_000,
    );
    // Synced under the sleep's fence, before its pod was deleted.
    expect(await stored(rw)).toEqual({ 'diary.txt': 'before sleep\n' });
    // The wake mounts both again.
    expect((await exec(call, box, 'cat /mnt/memory/mine/diary.txt /mnt/memory/facts/fact.txt')).stdout).toBe('before sleep\nfact\n');
    expect((await exec(call, box, 'echo x > /mnt/memory/facts/fact.txt')).stderr).toMatch(/Read-only file system/);
    await exec(call, box, 'echo "after wake" >> /mnt/memory/mine/diary.txt');
    expect(await call('POST', `/boxes/${box}/mounts/memory/mine/sync`)).toMatchObject({ status: 200, json: { files: 1 } });
    expect(await stored(rw)).toEqual({ 'diary.txt': 'before sleep\nafter wake\n' });
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);

  test('a read-write store that cannot be synced keeps its box awake (like a failed snapshot); a delete still deletes it', async () => {
    const storeId = `many-${run}`;
    const box = await newBox('many');
    expect((await mount(box, { store_name: 'many', store_id: storeId, read_only: false })).status).toBe(200);
    // One file more than a store may hold: the sync before a sleep is refused, so the sleep is.
    expect((await exec(call, box, 'cd /mnt/memory/many && seq 0 10000 | xargs touch && ls | wc -l')).stdout.trim()).toBe('10001');
    const pod = (await boxPods(env.pool.ns, box))[0]!;
    const refused = await until(
      'the sleep to be refused',
      async () => (await eventsAbout(env.pool.ns, pod.metadata!.uid!)).find((e) => e.reason === 'SleepRefused' || e.reason === 'SleepFailed'),
      60_000,
    );
    expect(refused.message).toMatch(/memory store many: .*more than 10000 files.*remove files from that read-write memory store/);
    const status = (await call('GET', `/boxes/${box}/status`)).json;
    expect(status.status).toBe('Running');
    expect((await boxPods(env.pool.ns, box)).map((p) => p.metadata?.uid)).toEqual([pod.metadata!.uid]);
    expect(await stored(storeId)).toEqual({});
    // The caller wants it gone: a store past the limits could never be synced, so it does not keep the box.
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 180_000);

  test('a pool without memory stores answers 409 naming the setting', async () => {
    const off = await env.pools.createReady({ maxBoxes: 3, box: ON_REAL_NODE.box });
    const other = await startTestBridge(kc, undefined, { POOL_NAME: off.name, SANDBOX_NAMESPACE: off.ns, ...env.storeEnv });
    try {
      const c = api(other);
      const created = await c('POST', '/boxes', { sessionId: `off-${run}`, ...SMALL });
      expect(created.status).toBe(201);
      const res = await c('POST', `/boxes/${created.json.box_id}/mounts/memory`, { store_name: 'x', store_id: 'y', read_only: true });
      expect(res).toMatchObject({ status: 409, json: { error: { type: 'conflict', message: expect.stringContaining('spec.box.memoryStores.enabled') } } });
      expect((await c('DELETE', `/boxes/${created.json.box_id}`)).status).toBe(200);
    } finally {
      await other.close();
    }
  }, 180_000);
});
