// A hostile tenant against one bridge replica, on the local cluster's real node: output floods
// (20 concurrent execs of 10 MiB stdout + 10 MiB stderr, a terminal flooded while its caller
// reads nothing) leave the replica's memory under the chart's limit; a frozen boxd (SIGSTOP on
// the node) makes calls answer 503 within their deadlines instead of hanging; a plain exec whose
// caller disconnects gives its slot back at once.
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { WebSocket } from 'ws';
import type { RunningBridge } from '../../bridge/server.js';
import { PTY_PROTOCOL } from '../../bridge/schemas.js';
import { ON_REAL_NODE, TEST_TOKEN, api, spawnBridge, startTestBridge, testPolicy } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, realNodeAvailable, testKubeConfig, waitFor } from '../support/cluster.js';
import { checkAnswer } from '../support/contract.js';
import { Pools, installCrd } from '../support/operator.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const realNode = await realNodeAvailable(kc);
if (!realNode.available) console.warn(`SKIPPED bridge limit tests on a real node: ${realNode.reason}`);
const suite = realNode.available ? describe : describe.skip;
const pools = new Pools(kc, `limits-${randomBytes(3).toString('hex')}`);
const MiB = 1024 * 1024;

/** VmRSS (now) and VmHWM (peak since start) of a process, in MiB. */
function memoryOf(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(status)![1]);
  return { rss: kib('VmRSS') / 1024, peak: kib('VmHWM') / 1024 };
}

/** Bytes a process has read through syscalls (sockets included) since it started, in MiB. */
function readMiB(pid: number): number {
  return Number(/^rchar: (\d+)$/m.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))![1]) / MiB;
}

/** Samples a process's RSS every 50 ms until stopped; resolves with the samples (MiB). */
function sampleRss(pid: number): { stop: () => number[] } {
  const samples: number[] = [];
  const timer = setInterval(() => samples.push(memoryOf(pid).rss), 50);
  return {
    stop: () => {
      clearInterval(timer);
      return samples;
    },
  };
}

/** The bridge container's memory limit in the chart's default values (resources.limits.memory), in MiB. */
function chartMemoryLimitMiB(): number {
  const values = readFileSync(join(process.cwd(), 'charts/sandbox-bridge/values.yaml'), 'utf8');
  const block = /^resources:\n(?: {2}.*\n)*? {2}limits:\n(?: {4}.*\n)*? {4}memory: (\d+)Mi$/m.exec(values);
  if (!block) throw new Error('no resources.limits.memory in Mi in the chart values');
  return Number(block[1]);
}

/** The host pid of a box's boxd: the process named boxd in the box pod's cgroup (the node runs on this machine). */
function boxdPid(podUid: string): number {
  const marks = [`pod${podUid}`, `pod${podUid.replace(/-/g, '_')}`];
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/comm`, 'utf8').trim() !== 'boxd') continue;
      const cgroup = readFileSync(`/proc/${entry}/cgroup`, 'utf8');
      if (marks.some((m) => cgroup.includes(m))) found.push(Number(entry));
    } catch {
      // the process ended while we looked
    }
  }
  if (found.length !== 1) throw new Error(`expected one boxd process for pod ${podUid}, found ${found.length}`);
  return found[0]!;
}

/** A POST /exec read as a stream: status, headers and the answer's JSON without keeping ~25 MB of it around. */
async function execAnswer(url: string, box: string, command: string): Promise<{ status: number; retryAfter: string | null; head: string; tail: string; bytes: number }> {
  const res = await fetch(`${url}/api/v1/boxes/${box}/exec`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TEST_TOKEN}`, 'content-type': 'application/json' },
    body: JSON.stringify({ command, timeoutMs: 120_000 }),
  });
  let head = '';
  let tail = '';
  let bytes = 0;
  const decoder = new TextDecoder();
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    bytes += chunk.length;
    const text = decoder.decode(chunk, { stream: true });
    if (head.length < 200) head += text.slice(0, 200 - head.length);
    tail = (tail + text).slice(-400);
  }
  return { status: res.status, retryAfter: res.headers.get('retry-after'), head, tail, bytes };
}

suite('one replica against a hostile tenant', () => {
  let namespace: string;
  let poolName: string;

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'limits', { 'pod-security.kubernetes.io/enforce': 'restricted' });
    await installCrd(kc);
    poolName = `pool-${namespace}`;
    // 20 concurrent execs on one box: the pool allows them (boxd counts them, not the bridge).
    await pools.create(poolName, { namespace, box: ON_REAL_NODE.box, maxExecsPerBox: 20 });
  }, 120_000);

  afterAll(async () => {
    await pools.delete(poolName).catch(() => undefined);
    await deleteTestNamespace(kc, namespace);
  });

  describe('memory, through a bridge process of its own', () => {
    let bridge: Awaited<ReturnType<typeof spawnBridge>>;
    let box: string;
    const limit = chartMemoryLimitMiB();

    beforeAll(async () => {
      bridge = await spawnBridge({ POOL_NAME: poolName, SANDBOX_NAMESPACE: namespace });
      const created = await api(bridge)('POST', '/boxes', { sessionId: 'limits-flood', cpu: 1, memory: 256 });
      expect(created.status).toBe(201);
      box = created.json.box_id;
      expect((await api(bridge)('POST', `/boxes/${box}/exec`, { command: 'true' })).json.exit_code).toBe(0);
    }, 120_000);

    afterAll(async () => {
      await bridge?.stop();
    });

    test('20 concurrent execs of 10 MiB random stdout and stderr: every call answers (200, truncated when short, or 503), RSS under the chart limit', async () => {
      const before = memoryOf(bridge.pid);
      const sampler = sampleRss(bridge.pid);
      const command = 'head -c 10485760 /dev/urandom; head -c 10485760 /dev/urandom >&2';
      const answers = await Promise.all(Array.from({ length: 20 }, () => execAnswer(bridge.url, box, command)));
      const samples = sampler.stop();
      const after = memoryOf(bridge.pid);
      const byStatus: Record<number, number> = {};
      for (const a of answers) byStatus[a.status] = (byStatus[a.status] ?? 0) + 1;
      const truncated = answers.filter((a) => a.status === 200 && /"stdout_truncated":true|"stderr_truncated":true/.test(a.tail)).length;
      process.stderr.write(
        `[limits] 20 x (10 MiB + 10 MiB) execs: statuses ${JSON.stringify(byStatus)}, ${truncated} of the 200s truncated; ` +
          `RSS ${before.rss.toFixed(0)} MiB before, peak ${after.peak.toFixed(0)} MiB (VmHWM; sampled max ${Math.max(...samples).toFixed(0)}), chart limit ${limit} MiB; ` +
          `answer sizes ${Math.min(...answers.map((a) => a.bytes))}-${Math.max(...answers.map((a) => a.bytes))} bytes\n`,
      );
      for (const a of answers) {
        expect([200, 503]).toContain(a.status);
        if (a.status === 503) {
          expect(a.retryAfter).toBe('1');
          expect(a.head).toMatch(/^\{"error":\{"type":"cluster_unavailable"/);
        } else {
          expect(a.head).toMatch(/^\{"exit_code":0,"stdout":"/);
          expect(a.tail).toMatch(/"timed_out":false,"stdout_truncated":(true|false),"stderr_truncated":(true|false)\}$/);
          // Untruncated, a stream's 10 MiB of random bytes is far more than 10 MB of JSON.
          if (!/_truncated":true/.test(a.tail)) expect(a.bytes).toBeGreaterThan(2 * 10 * MiB);
        }
      }
      expect(byStatus[200]).toBeGreaterThan(0);
      expect(after.peak).toBeLessThan(limit);
      // The budget came back: a small exec answers whole.
      const small = await api(bridge)('POST', `/boxes/${box}/exec`, { command: 'echo fine' });
      expect(small.json).toMatchObject({ exit_code: 0, stdout: 'fine\n', stdout_truncated: false });
    }, 300_000);

    test('a terminal flooded by its box while the caller reads nothing keeps the replica small; then it reads on', async () => {
      const ws = new WebSocket(`${bridge.url.replace('http', 'ws')}/api/v1/boxes/${box}/pty?cols=200&rows=50`, PTY_PROTOCOL, {
        headers: { authorization: `Bearer ${TEST_TOKEN}` },
      });
      let received = 0;
      ws.on('message', (data: Buffer, binary: boolean) => {
        if (binary) received += data.length;
      });
      await new Promise<void>((resolve, reject) => {
        ws.once('open', resolve);
        ws.once('error', reject);
      });
      try {
        ws.send(Buffer.from(`yes '${'x'.repeat(1000)}'\n`), { binary: true });
        await waitFor('the flood to start', async () => (received > 4 * MiB ? true : undefined), { timeoutMs: 30_000 });
        // The caller stops reading: its socket is paused, so TCP pushes back to the bridge.
        ws.pause();
        const before = memoryOf(bridge.pid);
        const sampler = sampleRss(bridge.pid);
        await new Promise((r) => setTimeout(r, 10_000));
        const samples = sampler.stop();
        const grew = Math.max(...samples) - before.rss;
        process.stderr.write(`[limits] flooded terminal, caller paused 10 s: RSS ${before.rss.toFixed(0)} MiB before, max ${Math.max(...samples).toFixed(0)} MiB (+${grew.toFixed(0)})\n`);
        expect(grew).toBeLessThan(48);
        // Reading again, the terminal goes on where it stopped.
        const got = received;
        ws.resume();
        await waitFor('output to flow again', async () => (received > got + 4 * MiB ? true : undefined), { timeoutMs: 30_000 });
        ws.send(Buffer.from('\x03'), { binary: true }); // ^C stops yes
      } finally {
        ws.terminate();
      }
    }, 120_000);

    test('followed output of a flooding process, with a caller that reads nothing, keeps the replica small', async () => {
      // NUL bytes: the fastest flood, and the costliest JSON (6 bytes per byte).
      const started = await api(bridge)('POST', `/boxes/${box}/processes`, { command: 'cat /dev/zero' });
      expect(started.status).toBe(201);
      const id = started.json.process_id as string;
      const res = await new Promise<IncomingMessage>((resolve, reject) => {
        const req = httpRequest(`${bridge.url}/api/v1/boxes/${box}/processes/${id}/output?follow=true`, { headers: { authorization: `Bearer ${TEST_TOKEN}` } }, resolve);
        req.on('error', reject);
        req.end();
      });
      try {
        expect(res.statusCode).toBe(200);
        let got = 0;
        const counter = (chunk: Buffer) => (got += chunk.length);
        res.on('data', counter);
        const flowing = performance.now();
        await waitFor('output to flow', async () => (got > 16 * MiB ? true : undefined), { timeoutMs: 30_000, intervalMs: 20 });
        const rate = got / MiB / ((performance.now() - flowing) / 1000);
        // The caller stops reading; the bridge must stop reading from boxd (boxd keeps the last
        // 4 MiB and tells a slow follower what it skipped).
        res.off('data', counter);
        res.pause();
        await new Promise((r) => setTimeout(r, 500)); // what was in flight arrives
        const before = memoryOf(bridge.pid);
        const readBefore = readMiB(bridge.pid);
        const sampler = sampleRss(bridge.pid);
        await new Promise((r) => setTimeout(r, 8000));
        const samples = sampler.stop();
        const read = readMiB(bridge.pid) - readBefore;
        const grew = Math.max(...samples) - before.rss;
        process.stderr.write(
          `[limits] followed output of a flood (~${rate.toFixed(0)} MiB/s of NDJSON while read), caller paused 8 s: the bridge read ${read.toFixed(1)} MiB meanwhile; ` +
            `RSS ${before.rss.toFixed(0)} MiB before, max ${Math.max(...samples).toFixed(0)} MiB (+${grew.toFixed(0)})\n`,
        );
        // The source is paused: the bridge reads (almost) nothing more from boxd.
        expect(read).toBeLessThan(2);
        expect(grew).toBeLessThan(48);
        // Read again: it goes on, with a new start line saying what was skipped meanwhile.
        let carry = '';
        let skipped = false;
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          const text = carry + chunk;
          if (/\{"type":"start",[^}]*"dropped":[1-9]/.test(text)) skipped = true;
          carry = text.slice(-200); // a line cut between two chunks
        });
        res.resume();
        await waitFor('a line saying what was skipped', async () => (skipped ? true : undefined), { timeoutMs: 30_000 });
      } finally {
        res.destroy();
        await api(bridge)('POST', `/boxes/${box}/processes/${id}/signal`, { signal: 'KILL' });
      }
    }, 120_000);

    test('a caller pasting into a terminal whose shell reads nothing keeps the replica small', async () => {
      const ws = new WebSocket(`${bridge.url.replace('http', 'ws')}/api/v1/boxes/${box}/pty`, PTY_PROTOCOL, {
        headers: { authorization: `Bearer ${TEST_TOKEN}` },
      });
      let screen = '';
      ws.on('message', (data: Buffer, binary: boolean) => {
        if (binary) screen = (screen + data.toString('latin1')).slice(-1000);
      });
      await new Promise<void>((resolve, reject) => {
        ws.once('open', resolve);
        ws.once('error', reject);
      });
      try {
        // The shell runs a command that never reads, on a raw terminal (a canonical one would
        // drop input past a full line): its input queue fills, boxd's writes to it block, and
        // so do its reads from the bridge.
        ws.send(Buffer.from('stty raw -echo; echo "busy-$((6 * 7))"; sleep 120\n'), { binary: true });
        await waitFor('the shell to be busy', async () => (screen.includes('busy-42') ? true : undefined), { timeoutMs: 30_000 });
        const before = memoryOf(bridge.pid);
        const sampler = sampleRss(bridge.pid);
        const chunk = Buffer.alloc(1024 * 1024, 'x');
        let sent = 0;
        const until = Date.now() + 8000;
        // As fast as the connection takes it, keeping this side's own buffer small.
        while (Date.now() < until) {
          if (ws.bufferedAmount < 8 * MiB) {
            ws.send(chunk, { binary: true });
            sent += chunk.length;
          } else await new Promise((r) => setTimeout(r, 10));
        }
        const samples = sampler.stop();
        const taken = (sent - ws.bufferedAmount) / MiB;
        const grew = Math.max(...samples) - before.rss;
        process.stderr.write(
          `[limits] paste into a terminal that reads nothing, 8 s: ${taken.toFixed(0)} MiB left the caller; bridge RSS ${before.rss.toFixed(0)} MiB before, max ${Math.max(...samples).toFixed(0)} MiB (+${grew.toFixed(0)})\n`,
        );
        expect(grew).toBeLessThan(48);
      } finally {
        ws.terminate();
      }
    }, 120_000);
  });

  describe('deadlines and cancellation, through an in-process replica', () => {
    let bridge: RunningBridge;
    let call: ReturnType<typeof api>;
    let box: string;
    const idleMs = 1500;

    beforeAll(async () => {
      bridge = await startTestBridge(kc, testPolicy(namespace, ON_REAL_NODE), { BOXD_IDLE_TIMEOUT_MS: String(idleMs) });
      call = api(bridge);
      const created = await call('POST', '/boxes', { sessionId: 'limits-deadlines', cpu: 0.5, memory: 256 });
      expect(created.status).toBe(201);
      box = created.json.box_id;
      expect((await call('POST', `/boxes/${box}/exec`, { command: 'echo hi > note.txt' })).json.exit_code).toBe(0);
    }, 120_000);

    /** A boxd this test stopped: always continued, even when a test times out. */
    let frozen: number | undefined;

    afterAll(async () => {
      if (frozen !== undefined) process.kill(frozen, 'SIGCONT');
      await bridge?.close();
    });

    test('a plain exec whose caller disconnects frees its slot: the next 5 are admitted at once', async () => {
      const marker = `abandoned-${randomBytes(3).toString('hex')}`;
      const aborters = Array.from({ length: 5 }, () => new AbortController());
      const abandoned = aborters.map((a) =>
        fetch(`${bridge.url}/api/v1/boxes/${box}/exec`, {
          method: 'POST',
          headers: { authorization: `Bearer ${TEST_TOKEN}`, 'content-type': 'application/json' },
          // The marker is the shell's $0, so `ps` shows it.
          body: JSON.stringify({ command: `exec sh -c 'sleep 300; echo never' ${marker}`, timeoutMs: 300_000 }),
          signal: a.signal,
        }).then(
          async (res) => `answered ${res.status}: ${await res.text()}`,
          () => 'aborted',
        ),
      );
      const settled: string[] = [];
      for (const p of abandoned) void p.then((outcome) => settled.push(outcome));
      // All 5 slots are held once a 6th command is refused. The probe takes a slot too, so it
      // starts once the 5 have had ample time to be admitted (a probe admitted first would
      // leave one of them refused: the test then says so rather than pass on 4).
      await new Promise((r) => setTimeout(r, 1000));
      await waitFor(
        'the 5 commands to hold every slot',
        async () => {
          if (settled.length) throw new Error(`a command that should still run ended: ${settled.join('; ')}`);
          return (await call('POST', `/boxes/${box}/exec`, { command: 'true' })).status === 429 ? true : undefined;
        },
        { timeoutMs: 20_000 },
      );
      for (const a of aborters) a.abort();
      expect(await Promise.all(abandoned)).toEqual(Array(5).fill('aborted'));
      const started = performance.now();
      // boxd sees each connection close and kills its command; allow it the moment that takes.
      const next = await waitFor(
        '5 new commands to be admitted together',
        async () => {
          const batch = await Promise.all(Array.from({ length: 5 }, (_, i) => call('POST', `/boxes/${box}/exec`, { command: `echo ${i}` })));
          return batch.every((r) => r.status === 200) ? batch : undefined;
        },
        { timeoutMs: 5000, intervalMs: 200 },
      );
      process.stderr.write(`[limits] 5 abandoned execs: slots free again after ${(performance.now() - started).toFixed(0)} ms\n`);
      expect(next.map((r) => r.json.stdout).sort()).toEqual(['0\n', '1\n', '2\n', '3\n', '4\n']);
      const ps = await call('POST', `/boxes/${box}/exec`, { command: 'ps -o pid,args' });
      expect(ps.json.stdout).toMatch(/^\s*PID\s+COMMAND/m);
      expect(ps.json.stdout).not.toContain(marker);
    }, 60_000);

    test('a frozen boxd (SIGSTOP on the node) answers 503 within its deadline, on a pooled connection and a new one; thawed, it answers again', async () => {
      const status = await call('GET', `/boxes/${box}/status`);
      const pod = await core.readNamespacedPod({ namespace, name: status.json.pod_name });
      const pid = boxdPid(pod.metadata!.uid!);
      // A pooled connection to the box exists now.
      expect((await call('GET', `/boxes/${box}/processes`)).status).toBe(200);
      const deadlinesBefore = await deadlineCount(bridge, 'idle');
      frozen = pid;
      process.kill(pid, 'SIGSTOP');
      try {
        const timed = async (what: string, run: () => Promise<{ status: number; json: any; headers: Headers }>) => { // eslint-disable-line @typescript-eslint/no-explicit-any
          const started = performance.now();
          const res = await run();
          const ms = performance.now() - started;
          process.stderr.write(`[limits] frozen boxd, ${what}: ${res.status} in ${ms.toFixed(0)} ms\n`);
          expect({ what, status: res.status, type: res.json?.error?.type, retryAfter: res.headers.get('retry-after') }).toEqual({
            what,
            status: 503,
            type: 'cluster_unavailable',
            retryAfter: '5',
          });
          // quiet for idleMs, then a health probe with its own idleMs (and, on a new connection, its connect)
          expect(ms).toBeLessThan(2 * idleMs + 2000 + 1000);
          expect(ms).toBeGreaterThanOrEqual(idleMs);
        };
        await timed('process list', () => call('GET', `/boxes/${box}/processes`));
        await timed('file read', () => call('GET', `/boxes/${box}/files?path=note.txt`));
        await timed('env', () => call('POST', `/boxes/${box}/env`, { envVars: { FROZEN: '1' } }));
        await timed('exec', () => call('POST', `/boxes/${box}/exec`, { command: 'echo never' }));
      } finally {
        process.kill(pid, 'SIGCONT');
        frozen = undefined;
      }
      expect(await deadlineCount(bridge, 'idle')).toBeGreaterThanOrEqual(deadlinesBefore + 4);
      const read = await call('GET', `/boxes/${box}/files?path=note.txt`);
      expect(read.json).toMatchObject({ content: 'hi\n', encoding: 'text' });
      checkAnswer('GET', `/boxes/${box}/files`, read.status, read.headers.get('content-type'), read.text);
    }, 60_000);
  });
});

/** sandbox_bridge_boxd_deadlines_total{deadline} of a replica. */
async function deadlineCount(bridge: RunningBridge, deadline: string): Promise<number> {
  const text = await (await fetch(`${bridge.metricsUrl}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`sandbox_bridge_boxd_deadlines_total{deadline="${deadline}"}`));
  return line ? Number(line.split(' ').pop()) : 0;
}
