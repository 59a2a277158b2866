// File watch and box metrics on the real node (issue 23; docs/api.md "File watch", "Box
// metrics"), lean: one namespace, one box, two bridge replicas (the watch through one, the
// changes through the other).
import type { RunningBridge } from '../../bridge/server.js';
import type { BoxMetrics, BridgeClient, WatchEvent } from '../../client/index.js';
import { ON_REAL_NODE, api, startTestBridge, testClient, testPolicy } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, realNodeAvailable, testKubeConfig } from '../support/cluster.js';

const kc = testKubeConfig();
const realNode = await realNodeAvailable(kc);
if (!realNode.available) console.warn(`SKIPPED file watch and metrics tests on a real node: ${realNode.reason}`);
const suite = realNode.available ? describe : describe.skip;

suite('file watch and box metrics in a real box', () => {
  let namespace: string;
  let bridgeA: RunningBridge;
  let bridgeB: RunningBridge;
  let call: ReturnType<typeof api>;
  let client: BridgeClient;
  let box: string;

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'observe', { 'pod-security.kubernetes.io/enforce': 'restricted' });
    const policy = testPolicy(namespace, ON_REAL_NODE);
    // Two watches per box at most (FILE_WATCHES_PER_BOX): the bound is the box's, across replicas.
    [bridgeA, bridgeB] = await Promise.all([startTestBridge(kc, policy, { FILE_WATCHES_PER_BOX: '2' }), startTestBridge(kc, policy, { FILE_WATCHES_PER_BOX: '2' })]);
    call = api(bridgeA);
    client = testClient(bridgeB, { retries: 0 });
    const created = await call('POST', '/boxes', { sessionId: 'observe-tests', cpu: 0.25, memory: 128 });
    expect(created.status).toBe(201);
    box = created.json.box_id;
  }, 120_000);

  afterAll(async () => {
    await Promise.all([bridgeA?.close(), bridgeB?.close()]);
    await deleteTestNamespace(kc, namespace);
  });

  const exec = async (command: string, timeoutMs = 30_000) => {
    const r = await call('POST', `/boxes/${box}/exec`, { command, timeoutMs });
    if (r.status !== 200) throw new Error(`exec ${command}: ${r.status} ${r.text}`);
    return r.json as { exit_code: number; stdout: string; stderr: string };
  };

  /** The next line of a watch, within 10 s. */
  const nextOf = (it: AsyncGenerator<WatchEvent>) => async (): Promise<WatchEvent> => {
    const r = await Promise.race([it.next(), new Promise<never>((_, reject) => setTimeout(() => reject(new Error('no watch line within 10 s')), 10_000).unref())]);
    if (r.done) return { type: 'end', reason: '<stream closed>' };
    return r.value;
  };

  // Metrics first: after the flood's 25,000 files boxd counts /workspace less often (its cost bound).
  test('metrics move when the box burns CPU, allocates memory and writes a file; the limits show', async () => {
    const before = await client.boxMetrics(box);
    expect(before.box_id).toBe(box);
    expect(before.cpu.limit_cores).toBe(0.25);
    expect(before.memory.limit_bytes).toBe(128 * 1024 * 1024);
    expect(before.disk.map((d) => [d.path, d.limit_bytes])).toEqual([
      ['/workspace', 1024 * 1024 * 1024],
      ['/tmp', 256 * 1024 * 1024],
    ]);
    expect(before.processes.count).toBeGreaterThanOrEqual(1);

    // 4 s of a busy loop at a 0.25-core limit: about 1 s of CPU, and throttling.
    await exec('timeout 4 sh -c "while :; do :; done"; true');
    // A 40 MB file in /workspace; a shell holding ~40 MB while the metrics are read.
    await exec('head -c 40000000 /dev/zero > /workspace/big');
    const hold = await call('POST', `/boxes/${box}/processes`, { command: 'x=$(head -c 40000000 /dev/zero | tr "\\0" a); sleep 30' });
    expect(hold.status).toBe(201);
    let after: BoxMetrics | undefined;
    for (let i = 0; i < 40; i++) {
      after = await client.boxMetrics(box);
      if (after.memory.used_bytes - before.memory.used_bytes > 30_000_000) break;
      await new Promise((r) => setTimeout(r, 250));
    }
    expect(after!.cpu.usage_seconds - before.cpu.usage_seconds).toBeGreaterThan(0.6);
    expect(after!.cpu.throttled_seconds).toBeGreaterThan(before.cpu.throttled_seconds);
    expect(after!.memory.used_bytes - before.memory.used_bytes).toBeGreaterThan(30_000_000);
    const ws = (m: BoxMetrics) => m.disk.find((d) => d.path === '/workspace')!.used_bytes;
    // Disk is counted again at most every 5 s.
    for (let i = 0; i < 30 && ws(after!) - ws(before) < 39_000_000; i++) {
      await new Promise((r) => setTimeout(r, 500));
      after = await client.boxMetrics(box);
    }
    expect(ws(after!) - ws(before)).toBeGreaterThan(39_000_000);
    await call('POST', `/boxes/${box}/processes/${hold.json.process_id}/signal`, { signal: 'KILL' });
    await exec('rm -f /workspace/big');

    // The history: samples every 5 s, with since.
    const history = await client.boxMetrics(box, { since: new Date(Date.now() - 60_000) });
    expect(history.history!.length).toBeGreaterThan(0);
    expect(history.interval_seconds).toBe(5);
  }, 120_000);

  test('an OOM kill shows, and the box lives on', async () => {
    const before = await client.boxMetrics(box);
    const r = await exec('x=$(head -c 300000000 /dev/zero | tr "\\0" a); echo survived', 60_000);
    expect(r.stdout).not.toContain('survived');
    const after = await client.boxMetrics(box);
    expect(after.memory.oom_kills).toBeGreaterThan(before.memory.oom_kills);
    expect((await exec('echo alive')).stdout).toBe('alive\n');
  }, 90_000);

  test('a watch through one replica sees create, write, rename, remove in order, made through the other', async () => {
    await exec('mkdir -p /workspace/w');
    const closer = new AbortController();
    const it = client.watchFiles(box, 'w', { signal: closer.signal });
    const next = nextOf(it);
    try {
      expect(await next()).toEqual({ type: 'ready', path: '/workspace/w' });
      await exec('echo hello > /workspace/w/f && mv /workspace/w/f /workspace/w/g && rm /workspace/w/g');
      const seen: WatchEvent[] = [];
      while (seen.length < 4) seen.push(await next());
      expect(seen).toEqual([
        { type: 'create', path: '/workspace/w/f', kind: 'file' },
        { type: 'write', path: '/workspace/w/f', kind: 'file' },
        { type: 'rename', path: '/workspace/w/g', from: '/workspace/w/f', kind: 'file' },
        { type: 'remove', path: '/workspace/w/g', kind: 'file' },
      ]);
    } finally {
      closer.abort();
    }
  }, 60_000);

  test('a reader that falls behind a flood gets an overflow line, then the stream goes on', async () => {
    await exec('mkdir -p /workspace/flood');
    const closer = new AbortController();
    const guard = setTimeout(() => closer.abort(new Error('the flood test took over 150 s')), 150_000);
    const it = client.watchFiles(box, 'flood', { signal: closer.signal });
    try {
      expect((await it.next()).value).toEqual({ type: 'ready', path: '/workspace/flood' });
      // 25,000 files of 240-character names (some 7 MB of lines, more than every buffer between
      // boxd and this reader holds) while nothing is read.
      const name = 'n'.repeat(234);
      const began = Date.now();
      const flood = await exec(`cd /workspace/flood && seq 10000 34999 | sed 's/^/${name}/' | xargs touch && echo done`, 120_000);
      expect(flood.stdout).toBe('done\n');
      const made = Date.now();
      let overflow: WatchEvent | undefined;
      let creates = 0;
      for (let r = await it.next(); !r.done; r = await it.next()) {
        if (r.value.type === 'overflow') {
          overflow = r.value;
          break;
        }
        expect(r.value.type).toBe('create');
        creates++;
      }
      console.log(`flood made in ${made - began} ms; ${creates} create lines then ${JSON.stringify(overflow)} read in ${Date.now() - made} ms`);
      expect(overflow).toEqual({ type: 'overflow', reason: 'queue', dropped: expect.any(Number) });
      expect(creates + overflow!.dropped!).toBeLessThanOrEqual(25_000);
      expect(overflow!.dropped).toBeGreaterThan(0);
      // Still watching after it: the lines queued after the overflow, then a new one.
      await exec('touch /workspace/flood/after');
      let after = false;
      for (let r = await it.next(); !r.done; r = await it.next()) {
        if (r.value.path === '/workspace/flood/after') {
          after = true;
          break;
        }
      }
      expect(after).toBe(true);
    } finally {
      clearTimeout(guard);
      closer.abort();
      await exec('rm -rf /workspace/flood');
    }
  }, 180_000);

  test('FILE_WATCHES_PER_BOX watches of a box at once, across replicas; one more is 429 with Retry-After', async () => {
    const viaA = client.watchFiles(box, '.');
    const viaB = testClient(bridgeA, { retries: 0 }).watchFiles(box, '.');
    try {
      expect((await nextOf(viaA)()).type).toBe('ready');
      expect((await nextOf(viaB)()).type).toBe('ready');
      const third = await call('GET', `/boxes/${box}/files/watch?path=.`);
      expect({ status: third.status, type: third.json?.error?.type }).toEqual({ status: 429, type: 'rate_limited' });
      expect(third.headers.get('retry-after')).toBe('1');
    } finally {
      await Promise.all([viaA.return(undefined), viaB.return(undefined)]);
    }
  });

  test('bad input: 400 JSON; a missing path 404; boxd\'s own directories 403', async () => {
    const bad = await call('GET', `/boxes/${box}/files/watch?recursive=maybe`);
    expect(bad.status).toBe(400);
    expect(bad.json.error.type).toBe('invalid_request');
    const missing = await call('GET', `/boxes/${box}/files/watch?path=nope`);
    expect(missing.status).toBe(404);
    const own = await call('GET', `/boxes/${box}/files/watch?path=/opt/sandbox-bridge/secret`);
    expect(own.status).toBe(403);
    const since = await call('GET', `/boxes/${box}/metrics?since=yesterday`);
    expect(since.status).toBe(400);
    expect(since.json.error.type).toBe('invalid_request');
  });

  test('a watch ends with end/deleted when the box is deleted', async () => {
    const it = client.watchFiles(box, '.');
    const next = nextOf(it);
    expect((await next()).type).toBe('ready');
    const deleted = await call('DELETE', `/boxes/${box}`);
    expect(deleted.status).toBe(200);
    let last: WatchEvent;
    do last = await next();
    while (last.type !== 'end');
    expect(last).toEqual({ type: 'end', reason: 'deleted' });
    expect((await it.next()).done).toBe(true);
  }, 60_000);
});
