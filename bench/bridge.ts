// Bench: what the bridge costs.
//
//   npm run bench   (BENCH_EXEC_ROUNDS=200 BENCH_LOAD_BOXES=50 BENCH_LOAD_SECONDS=60
//                    BENCH_BOXES=10000 BENCH_NODES=1000; BENCH_SKIP_READS=1 skips part 5)
//
// More knobs for the exec load (part 4):
//   BENCH_PARTS=load            only some parts (exec, stream, files, load, reads; default all)
//   BENCH_BASELINE=DIR          a build of other code (DIR/dist/bridge/main.js) served from the same boxes
//                               as a second bridge; the load alternates between the two, segment by
//                               segment (ABBA...), so both see the same machine
//   BENCH_LOAD_ROUNDS=2         load segments per bridge (each BENCH_LOAD_SECONDS)
//   BENCH_BRIDGE_ARGS='--cpu-prof --cpu-prof-dir=/tmp/prof'   extra node flags for this build's bridge
//   BENCH_VARIANTS='name:--flag --flag;name2:--flag'   more bridges of this build, each with its own extra
//                               node flags (after BENCH_BRIDGE_ARGS), in the same alternation
//   BENCH_BRIDGE_ENV='K=V ...'  extra environment for every bridge started
//   BENCH_RESULTS_NAME=bridge   where the results go (bench/results/<name>.md)
//
// On the local cluster's real node (parts 1-4 need it):
// 1. Exec round trip of `echo hi` through the bridge (fetch-only client -> bridge -> boxd) against
//    a direct client-node exec (pods/exec through the API server) of the same command in the same
//    box, interleaved in one run so both see the same machine load: p50, p99 and the ratio.
// 2. Time to first byte of a streamed exec.
// 3. Writing and reading 10 MiB (raw bytes both ways, and the spec's JSON read).
// 4. Load: BENCH_LOAD_BOXES boxes x 5 concurrent execs for BENCH_LOAD_SECONDS: errors, rate,
//    latency, bridge CPU per exec and Kubernetes API requests per exec.
// On simulated nodes:
// 5. With BENCH_BOXES box pods on BENCH_NODES simulated nodes: latency of GET /sandboxes (whole,
//    a page of 100, one session) and GET /boxes/:id/status, and the bridge process's RSS.
// 6. (BENCH_PARTS=...,rest) RSS at rest with BENCH_BOXES box pods on the simulated nodes the
//    cluster already has (no scaling): one fresh bridge per build and flag set (the baseline, this
//    build, each of BENCH_VARIANTS), one after the other, each started with the boxes there (its
//    initial list) and left BENCH_REST_SECONDS (default 20) after it serves every box: RSS and
//    peak RSS. Done after the load, whose bridges are stopped first.
//
// The bridge runs as its own process (node dist/bridge/main.js) so its RSS and CPU are its own.
// Results go to bench/results/bridge.md and .json.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { loadavg } from 'node:os';
import { Writable } from 'node:stream';
import * as k8s from '@kubernetes/client-node';
import { BridgeClientError, createBridgeClient, type BridgeClient } from '../client/index.js';
import { NODE_FLAGS } from '../common/node-flags.js';
import { writeResults } from './results-file.js';
import { BOXD_IMAGE, clusterUp, createBenchPool, deletePool, ensureCluster, freePort, ON_REAL_NODE, percentile, REAL_NODE_LABEL } from './setup.js';
import { ANNOTATIONS, BOX_SELECTOR, LABELS, MANAGED_BY, sessionHash } from '../common/labels.js';

const ROOT = process.cwd();
const EXEC_ROUNDS = Number(process.env.BENCH_EXEC_ROUNDS ?? 200);
const BOXES = Number(process.env.BENCH_BOXES ?? 10_000);
const NODES = Number(process.env.BENCH_NODES ?? 1000);
const READ_ROUNDS = Number(process.env.BENCH_READ_ROUNDS ?? 100);
const LOAD_BOXES = Number(process.env.BENCH_LOAD_BOXES ?? 50);
const LOAD_SECONDS = Number(process.env.BENCH_LOAD_SECONDS ?? 60);
const LOAD_CONCURRENCY = 5;
const SKIP_READS = process.env.BENCH_SKIP_READS === '1';
const PARTS = new Set((process.env.BENCH_PARTS ?? 'exec,stream,files,load,reads').split(',').map((p) => p.trim()));
const REST_SECONDS = Number(process.env.BENCH_REST_SECONDS ?? 20);
if (SKIP_READS) PARTS.delete('reads');
const BASELINE = process.env.BENCH_BASELINE;
const LOAD_ROUNDS = Number(process.env.BENCH_LOAD_ROUNDS ?? 1);
const BRIDGE_ARGS = (process.env.BENCH_BRIDGE_ARGS ?? '').split(' ').filter(Boolean);
const RESULTS_NAME = process.env.BENCH_RESULTS_NAME ?? 'bridge';
const VARIANTS = (process.env.BENCH_VARIANTS ?? '')
  .split(';')
  .filter((v) => v.includes(':'))
  .map((v) => ({ name: v.slice(0, v.indexOf(':')).trim(), args: v.slice(v.indexOf(':') + 1).split(' ').filter(Boolean) }));
const BRIDGE_ENV = Object.fromEntries(
  (process.env.BENCH_BRIDGE_ENV ?? '')
    .split(' ')
    .filter(Boolean)
    .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
);
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const ns = `bench-bridge-${id}`;
const pool = `bench-bridge-${id}`;
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');

ensureCluster(ROOT, KUBECONFIG, []);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);

const log = (msg: string) => process.stderr.write(`[bench] ${msg}\n`);

const ms = (v: number) => `${v.toFixed(2)} ms`;

/** Current RSS, or with `peak` the kernel's high-water mark of it (VmHWM), in MiB. */
function rssMiB(pid: number, peak = false): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(new RegExp(`${peak ? 'VmHWM' : 'VmRSS'}:\\s+(\\d+) kB`).exec(status)![1]) / 1024;
}

/** A direct exec that, like the bridge, keeps stdout and stderr apart. */
async function directExec(pod: string, command: string): Promise<string> {
  const out: Buffer[] = [];
  const sink = (into: Buffer[]) =>
    new Writable({
      write(chunk: Buffer, _e, done) {
        into.push(chunk);
        done();
      },
    });
  return new Promise((resolve, reject) => {
    let status: k8s.V1Status | undefined;
    new k8s.Exec(kc)
      .exec(ns, pod, 'box', ['sh', '-c', command], sink(out), sink([]), null, false, (s) => (status = s))
      .then((ws) => {
        ws.on('close', () => (status ? resolve(Buffer.concat(out).toString()) : reject(new Error('no status'))));
        ws.on('error', reject);
      }, reject);
  });
}

/** CPU seconds (user + system) a process has used so far. */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime in clock ticks (USER_HZ 100)
}

/** Busy and total CPU seconds of the whole machine (all cores), from /proc/stat. */
function machineSeconds(): { busy: number; total: number } {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const total = fields.slice(0, 8).reduce((a, b) => a + b, 0); // user..steal (guest time is inside user)
  const idle = fields[3]! + fields[4]!; // idle + iowait
  return { busy: (total - idle) / 100, total: total / 100 };
}

/** The kubelet's kubepods cgroups (cgroup v1 cpuacct or v2), where every box pod's CPU is counted. */
function kubepodsCgroups(): string[] {
  const found: string[] = [];
  for (const base of ['/sys/fs/cgroup/cpuacct', '/sys/fs/cgroup']) {
    if (!existsSync(base)) continue;
    for (const dir of [join(base, 'kubepods'), join(base, 'kubepods.slice'), ...readdirSync(base).map((d) => join(base, d, 'kubepods'))]) {
      if (existsSync(join(dir, 'cpuacct.usage')) || existsSync(join(dir, 'cpu.stat'))) found.push(dir);
    }
    if (found.length) break;
  }
  return found;
}

/** CPU seconds used by all box pods (boxd and the commands it runs) of the real node. */
function podSeconds(cgroups: string[]): number | undefined {
  if (!cgroups.length) return undefined;
  let s = 0;
  for (const dir of cgroups) {
    if (existsSync(join(dir, 'cpuacct.usage'))) s += Number(readFileSync(join(dir, 'cpuacct.usage'), 'utf8')) / 1e9;
    else s += Number(/usage_usec (\d+)/.exec(readFileSync(join(dir, 'cpu.stat'), 'utf8'))?.[1] ?? 0) / 1e6;
  }
  return s;
}

/** CFS throttling of the given pods (by UID): periods throttled and seconds throttled, summed. */
function podThrottling(uids: string[]): { periods: number; throttled: number; seconds: number } {
  const want = new Set(uids.flatMap((u) => [`pod${u}`, `pod${u.replaceAll('-', '_')}`]));
  const total = { periods: 0, throttled: 0, seconds: 0 };
  const visit = (dir: string, depth: number) => {
    if (depth > 3 || !existsSync(dir)) return;
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      if (!entry.isDirectory()) continue;
      const path = join(dir, entry.name);
      const name = entry.name.replace(/^kubepods-(burstable-|besteffort-)?/, '').replace(/\.slice$/, '');
      if (!want.has(name)) {
        visit(path, depth + 1);
        continue;
      }
      const stat = readFileSync(join(path, 'cpu.stat'), 'utf8');
      const field = (k: string) => Number(new RegExp(`^${k} (\\d+)`, 'm').exec(stat)?.[1] ?? 0);
      total.periods += field('nr_periods');
      total.throttled += field('nr_throttled');
      total.seconds += field('throttled_time') / 1e9 + field('throttled_usec') / 1e6;
    }
  };
  for (const base of ['/sys/fs/cgroup/cpu', '/sys/fs/cgroup']) {
    if (!existsSync(base)) continue;
    for (const d of readdirSync(base)) if (d.startsWith('kubepods') || existsSync(join(base, d, 'kubepods'))) visit(join(base, d), 0);
    break;
  }
  return total;
}

/** Kubernetes API requests the bridge has made (its own metric). */
async function bridgeKubeRequests(metricsUrl: string): Promise<number> {
  const text = await (await fetch(`${metricsUrl}/metrics`)).text();
  let n = 0;
  for (const m of text.matchAll(/^sandbox_bridge_kube_api_duration_seconds_count\{[^}]*\} (\d+)/gm)) n += Number(m[1]);
  return n;
}

/**
 * A bridge as its own process: this build's, or the one under `root` (a baseline), with extra
 * node flags (a CPU profile).
 */
async function startBridgeProcess(
  onSpawn?: (child: ChildProcess) => void,
  opts: { root?: string; args?: readonly string[] } = {},
): Promise<{ child: ChildProcess; url: string; metricsUrl: string }> {
  const port = await freePort();
  const metricsPort = await freePort();
  const child = spawn(process.execPath, [...NODE_FLAGS.bridge, ...(opts.args ?? []), join(opts.root ?? ROOT, 'dist/bridge/main.js')], {
    env: {
      PATH: process.env.PATH,
      KUBECONFIG,
      BRIDGE_TOKEN: token,
      BOXD_KEY: boxdKey,
      BOXD_IMAGE,
      POOL_NAME: pool,
      SANDBOX_NAMESPACE: ns,
      PORT: String(port),
      METRICS_PORT: String(metricsPort),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      RATE_LIMIT_RPS: '100000',
      RATE_LIMIT_BURST: '100000',
      ...BRIDGE_ENV,
    },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  onSpawn?.(child);
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 600; i++) {
    const ok = await fetch(`${url}/api/v1/health`, { headers: { authorization: `Bearer ${token}` } }).then((r) => r.ok, () => false);
    if (ok) return { child, url, metricsUrl: `http://127.0.0.1:${metricsPort}` };
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('bridge did not start');
}

/** SIGTERM, then up to 30 s for the process to exit. */
async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  await Promise.race([exited, new Promise((r) => setTimeout(r, 30_000).unref())]);
}

async function createPods(count: number, nodeNames: string[]): Promise<void> {
  let next = 0;
  const started = Date.now();
  const worker = async () => {
    while (next < count) {
      const i = next++;
      const session = `bench-session-${i}`;
      await core.createNamespacedPod({
        namespace: ns,
        body: {
          metadata: {
            name: `box-bench-${i}`,
            labels: { [LABELS.box]: 'true', [LABELS.pool]: pool, [LABELS.session]: sessionHash(session), [LABELS.managedBy]: MANAGED_BY },
            annotations: { [ANNOTATIONS.sessionId]: session, [ANNOTATIONS.expiresAt]: new Date(Date.now() + 86_400_000).toISOString() },
          },
          spec: {
            nodeName: nodeNames[i % nodeNames.length],
            automountServiceAccountToken: false,
            securityContext: { runAsNonRoot: true, runAsUser: 65534, seccompProfile: { type: 'RuntimeDefault' } },
            containers: [
              {
                name: 'box',
                image: 'sandbox-bridge.local/box:dev',
                resources: { limits: { cpu: '1m', memory: '1Mi' } },
                securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } },
              },
            ],
          },
        },
      });
      if (i > 0 && i % 1000 === 0) log(`created ${i} pods (${Math.round(i / ((Date.now() - started) / 1000))}/s)`);
    }
  };
  await Promise.all(Array.from({ length: 32 }, worker));
}

async function waitForAllBoxes(client: ReturnType<typeof createBridgeClient>): Promise<void> {
  for (let i = 0; i < 1200; i++) {
    const health = await client.health().catch(() => undefined);
    if (health && health.active_boxes >= BOXES) return;
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error('the bridge cache never saw every box');
}

/** List, page, filtered list and status latency against one bridge, alternating. */
async function measureReads(url: string) {
  const client = createBridgeClient({ url, token, retries: 0 });
  const times = { list: [] as number[], page: [] as number[], session: [] as number[], status: [] as number[] };
  let listBytes = 0;
  const get = async (path: string) => {
    const res = await fetch(`${url}/api/v1${path}`, { headers: { authorization: `Bearer ${token}` } });
    if (!res.ok) throw new Error(`GET ${path}: ${res.status}`);
    return (await res.arrayBuffer()).byteLength;
  };
  for (let i = 0; i < READ_ROUNDS; i++) {
    let t = performance.now();
    listBytes = await get('/sandboxes');
    times.list.push(performance.now() - t);
    // A page of 100 somewhere in the list, and one session's boxes.
    t = performance.now();
    const first = (await client.sandboxes({ limit: 100 })).continue;
    await get(`/sandboxes?limit=100&continue=${encodeURIComponent(first ?? '')}`);
    times.page.push((performance.now() - t) / 2);
    t = performance.now();
    await client.sandboxes({ sessionId: `bench-session-${Math.floor(Math.random() * BOXES)}` });
    times.session.push(performance.now() - t);
    t = performance.now();
    await client.status(`box-bench-${Math.floor(Math.random() * BOXES)}`);
    times.status.push(performance.now() - t);
  }
  const summary = (v: number[]) => ({ p50: percentile(v, 50), p99: percentile(v, 99) });
  return { listBytes, list: summary(times.list), page: summary(times.page), session: summary(times.session), status: summary(times.status) };
}

type Rows = Array<[string, string, string]>;
const stats = (values: number[]) => ({ p50: percentile(values, 50), p99: percentile(values, 99), n: values.length });
const pair = (s: { p50: number; p99: number }) => `${ms(s.p50)} / ${ms(s.p99)}`;

/** Parts 1-3: one box on the real node. */
async function benchBox(client: BridgeClient, rows: Rows, results: Record<string, unknown>): Promise<void> {
  if (!['exec', 'stream', 'files'].some((p) => PARTS.has(p))) return;
  const box = await client.createBox({ sessionId: `bench-${id}`, cpu: 1, memory: 256 });
  if (PARTS.has('exec')) {
    // 1. exec round trip, bridge vs direct, interleaved
    const command = 'echo hi';
    for (let i = 0; i < 20; i++) {
      await client.exec(box.box_id, { command });
      await directExec(box.box_id, command);
    }
    const viaBridge: number[] = [];
    const direct: number[] = [];
    const hop: number[] = [];
    for (let i = 0; i < EXEC_ROUNDS; i++) {
      let t = performance.now();
      await client.status(box.box_id); // an HTTP round trip to the bridge answered from its cache
      hop.push(performance.now() - t);
      t = performance.now();
      const r = await client.exec(box.box_id, { command });
      viaBridge.push(performance.now() - t);
      if (r.stdout !== 'hi\n') throw new Error(`unexpected output ${JSON.stringify(r)}`);
      t = performance.now();
      const out = await directExec(box.box_id, command);
      direct.push(performance.now() - t);
      if (out !== 'hi\n') throw new Error(`unexpected direct output ${out}`);
    }
    const exec = { rounds: EXEC_ROUNDS, bridge: stats(viaBridge), direct: stats(direct), httpHop: stats(hop) };
    results.exec = exec;
    rows.push(['exec `echo hi`, direct client-node pods/exec p50 / p99', pair(exec.direct), '']);
    rows.push(['exec `echo hi`, through the bridge and boxd p50 / p99', pair(exec.bridge), '<= 5 ms p50']);
    rows.push(['bridge / direct, p50', `${(exec.bridge.p50 / exec.direct.p50).toFixed(3)}x`, '<= 0.1x']);
    rows.push(['HTTP round trip to the bridge alone (GET status, from cache) p50 / p99', pair(exec.httpHop), '']);
    log(`exec: bridge p50 ${ms(exec.bridge.p50)}, direct p50 ${ms(exec.direct.p50)}, HTTP hop p50 ${ms(exec.httpHop.p50)}`);
  }

  if (PARTS.has('stream')) {
    // 2. time to the first streamed byte, and to the end of the same command
    const first: number[] = [];
    const whole: number[] = [];
    for (let i = 0; i < 50; i++) {
      const t = performance.now();
      for await (const e of client.execStream(box.box_id, { command: 'echo hi; sleep 0.1; echo bye' })) {
        if (e.type === 'stdout' && first.length === whole.length) first.push(performance.now() - t);
        if (e.type === 'exit') whole.push(performance.now() - t);
      }
    }
    results.stream = { firstByte: stats(first), whole: stats(whole) };
    rows.push(['streamed exec: time to first output byte p50 / p99', pair(stats(first)), '']);
    rows.push(['streamed exec: whole command (prints, sleeps 100 ms, prints) p50 / p99', pair(stats(whole)), '']);
  }

  if (PARTS.has('files')) {
    // 3. 10 MiB written and read back
    const bytes = randomBytes(10 * 1024 * 1024);
    const write: number[] = [];
    const readRaw: number[] = [];
    const readJson: number[] = [];
    for (let i = 0; i < 10; i++) {
      let t = performance.now();
      const put = await fetch(`${client.url}/boxes/${box.box_id}/files?path=ten.bin`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/octet-stream' },
        body: bytes,
      });
      if (!put.ok) throw new Error(`write failed: ${put.status} ${await put.text()}`);
      write.push(performance.now() - t);
      t = performance.now();
      const raw = await client.downloadFile(box.box_id, 'ten.bin');
      readRaw.push(performance.now() - t);
      if (raw.length !== bytes.length) throw new Error('short read');
      t = performance.now();
      const json = await client.readFile(box.box_id, 'ten.bin');
      readJson.push(performance.now() - t);
      if (json.size !== bytes.length) throw new Error('short JSON read');
    }
    results.files = { write: stats(write), readRaw: stats(readRaw), readJson: stats(readJson) };
    rows.push(['10 MiB write (PUT raw) p50', `${ms(stats(write).p50)} (${(10 / (stats(write).p50 / 1000)).toFixed(0)} MiB/s)`, '']);
    rows.push(['10 MiB read (raw bytes) p50', `${ms(stats(readRaw).p50)} (${(10 / (stats(readRaw).p50 / 1000)).toFixed(0)} MiB/s)`, '']);
    rows.push(['10 MiB read (JSON, base64 content) p50', ms(stats(readJson).p50), '']);
  }
  await client.deleteBox(box.box_id);
}

/** A bridge the load goes through. */
interface LoadBridge {
  name: string;
  url: string;
  client: BridgeClient;
  pid: number;
  metricsUrl: string;
}

/** What one stretch of load through one bridge cost, and where the machine's CPU went meanwhile. */
interface Segment {
  bridge: string;
  seconds: number;
  latencies: number[];
  errors: string[];
  /** CPU seconds over the segment: the bridge, this process (the load generator), all box pods (boxd + commands), the machine. */
  cpu: { bridge: number; loadGenerator: number; boxPods: number | undefined; machineBusy: number; machineTotal: number };
  kubeRequests: number;
  /** 1-minute load average at the start and the end. */
  loadAverage: [number, number];
  /** CFS throttling of the load's box pods over the segment. */
  throttled: { periods: number; throttled: number; seconds: number };
  /** The bridge's resident memory at the segment's end and its peak so far (MiB). */
  rssMiB: number;
  peakRssMiB: number;
}

async function loadSegment(bridge: LoadBridge, boxes: string[], seconds: number, podUids: string[], cgroups: string[]): Promise<Segment> {
  const latencies: number[] = [];
  const errors: string[] = [];
  const loadBefore = loadavg()[0]!;
  const throttleBefore = podThrottling(podUids);
  const before = { bridge: cpuSeconds(bridge.pid), self: process.cpuUsage(), pods: podSeconds(cgroups), machine: machineSeconds(), kube: await bridgeKubeRequests(bridge.metricsUrl) };
  const started = performance.now();
  const deadline = started + seconds * 1000;
  await Promise.all(
    boxes.flatMap((box) =>
      Array.from({ length: LOAD_CONCURRENCY }, async () => {
        while (performance.now() < deadline) {
          const t = performance.now();
          try {
            const r = await bridge.client.exec(box, { command: 'echo hi' });
            if (r.stdout !== 'hi\n') errors.push(`unexpected output ${JSON.stringify(r).slice(0, 100)}`);
            latencies.push(performance.now() - t);
          } catch (err) {
            errors.push(String(err));
          }
        }
      }),
    ),
  );
  const elapsed = (performance.now() - started) / 1000;
  const self = process.cpuUsage(before.self);
  const machine = machineSeconds();
  const pods = podSeconds(cgroups);
  const throttle = podThrottling(podUids);
  return {
    bridge: bridge.name,
    seconds: elapsed,
    latencies,
    errors,
    cpu: {
      bridge: cpuSeconds(bridge.pid) - before.bridge,
      loadGenerator: (self.user + self.system) / 1e6,
      boxPods: pods !== undefined && before.pods !== undefined ? pods - before.pods : undefined,
      machineBusy: machine.busy - before.machine.busy,
      machineTotal: machine.total - before.machine.total,
    },
    kubeRequests: (await bridgeKubeRequests(bridge.metricsUrl)) - before.kube,
    loadAverage: [loadBefore, loadavg()[0]!],
    rssMiB: rssMiB(bridge.pid),
    peakRssMiB: rssMiB(bridge.pid, true),
    throttled: {
      periods: throttle.periods - throttleBefore.periods,
      throttled: throttle.throttled - throttleBefore.throttled,
      seconds: throttle.seconds - throttleBefore.seconds,
    },
  };
}

/** The segments of one bridge together. */
function summarize(name: string, segments: Segment[]) {
  const mine = segments.filter((s) => s.bridge === name);
  const sum = (f: (s: Segment) => number) => mine.reduce((a, s) => a + f(s), 0);
  const execs = sum((s) => s.latencies.length);
  const seconds = sum((s) => s.seconds);
  const perExec = (cpuSeconds: number) => (cpuSeconds * 1000) / Math.max(1, execs);
  const pods = mine.every((s) => s.cpu.boxPods !== undefined) ? sum((s) => s.cpu.boxPods!) : undefined;
  const errors = mine.flatMap((s) => s.errors);
  return {
    bridge: name,
    segments: mine.length,
    boxes: LOAD_BOXES,
    concurrency: LOAD_CONCURRENCY,
    seconds,
    execs,
    errors: errors.length,
    firstErrors: errors.slice(0, 5),
    execsPerSecond: execs / Math.max(1e-9, seconds),
    latency: stats(mine.flatMap((s) => s.latencies)),
    bridgeCpuMsPerExec: perExec(sum((s) => s.cpu.bridge)),
    /** Cores busy on average over the segments, by whom. */
    cores: {
      bridge: sum((s) => s.cpu.bridge) / seconds,
      loadGenerator: sum((s) => s.cpu.loadGenerator) / seconds,
      boxPods: pods === undefined ? undefined : pods / seconds,
      machine: sum((s) => s.cpu.machineBusy) / seconds,
      machineCapacity: sum((s) => s.cpu.machineTotal) / seconds,
    },
    cpuMsPerExec: {
      bridge: perExec(sum((s) => s.cpu.bridge)),
      loadGenerator: perExec(sum((s) => s.cpu.loadGenerator)),
      boxPods: pods === undefined ? undefined : perExec(pods),
      machine: perExec(sum((s) => s.cpu.machineBusy)),
    },
    kubeRequestsPerExec: sum((s) => s.kubeRequests) / Math.max(1, execs),
    loadAverage: mine.map((s) => s.loadAverage),
    peakRssMiB: Math.max(...mine.map((s) => s.peakRssMiB)),
    throttled: {
      periods: sum((s) => s.throttled.periods),
      throttled: sum((s) => s.throttled.throttled),
      seconds: sum((s) => s.throttled.seconds),
    },
  };
}

/**
 * 4. Load: many boxes, each with its full share of concurrent execs, for a while; through this
 * build's bridge, and, with a baseline, through both in alternating segments (ABBA...).
 */
async function benchLoad(bridges: LoadBridge[], rows: Rows, results: Record<string, unknown>): Promise<void> {
  if (!PARTS.has('load')) return;
  // Creates are retried (one Idempotency-Key each) and given minutes: on this loaded machine the
  // API server's probe can time out, and 50 pods start on one node at once.
  const creator = createBridgeClient({ url: bridges[bridges.length - 1]!.url, token, retries: 8, timeoutMs: 300_000 });
  log(`load: creating ${LOAD_BOXES} boxes`);
  const boxes = (
    await Promise.all(Array.from({ length: LOAD_BOXES }, (_, i) => creator.createBox({ sessionId: `bench-load-${id}-${i}`, cpu: 0.03, memory: 64 })))
  ).map((b) => b.box_id);
  try {
    // The first exec of each box through each bridge, retried (a new pod's first answer; on a loaded
    // machine the bridge may see the API server slow and answer 503 for a moment).
    const firstExec = async (b: LoadBridge, box: string) => {
      for (let attempt = 1; ; attempt++) {
        try {
          return await b.client.exec(box, { command: 'true' }, { timeoutMs: 300_000 });
        } catch (err) {
          if (attempt >= 10 || !(err instanceof BridgeClientError) || err.status !== 503) throw err;
          await new Promise((r) => setTimeout(r, 1000));
        }
      }
    };
    for (const b of bridges) await Promise.all(boxes.map((box) => firstExec(b, box)));
    const pods = await core.listNamespacedPod({ namespace: ns, labelSelector: BOX_SELECTOR });
    const podUids = pods.items.filter((p) => boxes.includes(p.metadata!.name!)).map((p) => p.metadata!.uid!);
    const cgroups = kubepodsCgroups();
    // A few seconds each first, not counted: connections to every box, and V8's optimized code.
    for (const b of bridges) await loadSegment(b, boxes, 5, podUids, cgroups);
    const segments: Segment[] = [];
    for (let round = 0; round < LOAD_ROUNDS; round++) {
      for (const b of round % 2 === 0 ? bridges : [...bridges].reverse()) {
        log(`load: ${LOAD_BOXES} boxes x ${LOAD_CONCURRENCY} concurrent execs for ${LOAD_SECONDS} s through ${b.name} (round ${round + 1}/${LOAD_ROUNDS})`);
        const s = await loadSegment(b, boxes, LOAD_SECONDS, podUids, cgroups);
        log(`  ${s.latencies.length} execs (${(s.latencies.length / s.seconds).toFixed(0)}/s), bridge ${((s.cpu.bridge * 1000) / Math.max(1, s.latencies.length)).toFixed(3)} ms CPU per exec, load ${s.loadAverage.map((l) => l.toFixed(2)).join(' -> ')}`);
        segments.push(s);
      }
    }
    const loads = bridges.map((b) => summarize(b.name, segments));
    results.load = bridges.length === 1 ? loads[0] : loads;
    results.loadSegments = segments.map(({ latencies, errors, ...s }) => ({ ...s, execs: latencies.length, errors: errors.length, latency: stats(latencies) }));
    const cores = (c: number | undefined) => (c === undefined ? 'n/a' : c.toFixed(2));
    const perExec = (c: number | undefined) => (c === undefined ? 'n/a' : c.toFixed(3));
    for (const load of loads) {
      const who = bridges.length === 1 ? '' : ` [${load.bridge}]`;
      const where = `${LOAD_BOXES} boxes x ${LOAD_CONCURRENCY} concurrent, ${load.segments} x ${LOAD_SECONDS} s`;
      const avg = load.loadAverage.map(([a, b]) => `${a.toFixed(1)}->${b.toFixed(1)}`).join(', ');
      rows.push([`load (${where})${who}: execs / errors`, `${load.execs} / ${load.errors}`, '0 errors']);
      rows.push([`load${who}: execs per second, latency p50 / p99`, `${load.execsPerSecond.toFixed(0)}/s, ${pair(load.latency)}`, '>= 1,500/s']);
      rows.push([`load${who}: bridge CPU per exec`, `${load.bridgeCpuMsPerExec.toFixed(3)} ms`, '<= 0.5 ms']);
      rows.push([
        `load${who}: CPU per exec, bridge / load generator / box pods (boxd + commands) / whole machine`,
        `${perExec(load.cpuMsPerExec.bridge)} / ${perExec(load.cpuMsPerExec.loadGenerator)} / ${perExec(load.cpuMsPerExec.boxPods)} / ${perExec(load.cpuMsPerExec.machine)} ms`,
        '',
      ]);
      rows.push([
        `load${who}: cores busy, bridge / load generator / box pods / whole machine (of ${load.cores.machineCapacity.toFixed(2)})`,
        `${cores(load.cores.bridge)} / ${cores(load.cores.loadGenerator)} / ${cores(load.cores.boxPods)} / ${cores(load.cores.machine)}`,
        '',
      ]);
      rows.push([
        `load${who}: box pods CFS-throttled (periods throttled of all, seconds)`,
        `${load.throttled.throttled} of ${load.throttled.periods}, ${load.throttled.seconds.toFixed(1)} s`,
        '',
      ]);
      rows.push([`load${who}: 1-min load average (start->end of each segment)`, avg, '']);
      rows.push([`load${who}: bridge peak RSS`, `${load.peakRssMiB.toFixed(0)} MiB`, '']);
      rows.push([`load${who}: Kubernetes API requests per exec (bridge metric)`, load.kubeRequestsPerExec.toFixed(4), '0']);
      if (load.errors) log(`load errors${who}, first: ${load.firstErrors.slice(0, 3).join(' | ')}`);
    }
  } finally {
    await Promise.all(boxes.map((b) => creator.deleteBox(b).catch(() => undefined)));
  }
}

async function main() {
  const results: Record<string, unknown> = { date: new Date().toISOString(), node: process.version, cores: (await import('node:os')).cpus().length };
  const rows: Rows = [];

  const realNodes = await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` });
  const onRealNode = realNodes.items.length > 0;
  await createBenchPool(
    { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
    {
      name: pool,
      labels: { 'sandbox-bridge.io/bench': 'true' },
      spec: {
        namespace: ns,
        maxBoxes: BOXES + 100,
        maxExecsPerBox: LOAD_CONCURRENCY,
        // The locally built box image: the pool default (a public python image) cannot be pulled here.
        box: onRealNode
          ? {
              defaultImage: 'sandbox-bridge.local/box:dev',
              ...ON_REAL_NODE,
            }
          : { defaultImage: 'sandbox-bridge.local/box:dev', nodeSelector: { type: 'kwok' } },
      },
    },
  );

  const { child, url, metricsUrl } = await startBridgeProcess(undefined, { args: BRIDGE_ARGS });
  let second: ChildProcess | undefined;
  let baseline: ChildProcess | undefined;
  const variants: ChildProcess[] = [];
  try {
    const client = createBridgeClient({ url, token, retries: 0 });
    if (onRealNode) {
      await benchBox(client, rows, results);
      const bridges: LoadBridge[] = [];
      if (BASELINE && PARTS.has('load')) {
        const base = await startBridgeProcess((c) => (baseline = c), { root: BASELINE });
        bridges.push({ name: 'baseline', url: base.url, client: createBridgeClient({ url: base.url, token, retries: 0 }), pid: base.child.pid!, metricsUrl: base.metricsUrl });
        results.baseline = BASELINE;
      }
      bridges.push({ name: 'this build', url, client, pid: child.pid!, metricsUrl });
      if (PARTS.has('load')) {
        for (const v of VARIANTS) {
          const b = await startBridgeProcess((c) => variants.push(c), { args: [...BRIDGE_ARGS, ...v.args] });
          bridges.push({ name: `this build ${v.name}`, url: b.url, client: createBridgeClient({ url: b.url, token, retries: 0 }), pid: b.child.pid!, metricsUrl: b.metricsUrl });
        }
        if (VARIANTS.length) results.variants = VARIANTS;
      }
      await benchLoad(bridges, rows, results);
    } else {
      log('no real node: parts 1-4 (inside boxes) skipped');
      rows.push(['exec, files, load (parts 1-4)', 'skipped: no real node', '']);
    }

    // 6. RSS at rest with many boxes, per build and flag set
    if (PARTS.has('rest')) {
      await Promise.all([baseline, ...variants].map((c) => c && stopChild(c)));
      const nodes = (await core.listNode({ labelSelector: 'type=kwok' })).items.map((n) => n.metadata!.name!);
      if (!nodes.length) throw new Error('part rest: the cluster has no simulated (kwok) nodes');
      log(`rest: creating ${BOXES} box pods on the ${nodes.length} simulated nodes there are`);
      const createStart = Date.now();
      await createPods(BOXES, nodes);
      log(`rest: created in ${((Date.now() - createStart) / 1000).toFixed(1)} s`);
      await waitForAllBoxes(client);
      const sets = [
        ...(BASELINE ? [{ name: 'baseline', root: BASELINE, args: [] as string[] }] : []),
        { name: 'this build', root: ROOT, args: [] as string[] },
        // (a profiled variant is left out: the profiler's own memory is not the flags')
        ...VARIANTS.filter((v) => !v.args.some((a) => a.startsWith('--cpu-prof'))).map((v) => ({ name: `this build ${v.name}`, root: ROOT, args: v.args })),
      ];
      const rest: Array<{ name: string; args: string[]; rssMiB: number; peakRssMiB: number; fillSeconds: number }> = [];
      for (const set of sets) {
        const startedAt = performance.now();
        let started: ChildProcess | undefined;
        try {
          const b = await startBridgeProcess((c) => (started = c), { root: set.root, args: set.args });
          await waitForAllBoxes(createBridgeClient({ url: b.url, token, retries: 0 }));
          const fillSeconds = (performance.now() - startedAt) / 1000;
          await new Promise((r) => setTimeout(r, REST_SECONDS * 1000));
          const r = { name: set.name, args: set.args, rssMiB: rssMiB(b.child.pid!), peakRssMiB: rssMiB(b.child.pid!, true), fillSeconds };
          log(`rest: ${set.name}: RSS ${r.rssMiB.toFixed(0)} MiB, peak ${r.peakRssMiB.toFixed(0)} MiB, serving every box after ${fillSeconds.toFixed(1)} s`);
          rest.push(r);
        } finally {
          if (started) await stopChild(started);
        }
      }
      results.rest = { boxes: BOXES, nodes: nodes.length, seconds: REST_SECONDS, bridges: rest };
      for (const r of rest) {
        rows.push([`${r.name}: RSS at rest / peak RSS, started with ${BOXES} boxes (after ${REST_SECONDS} s)`, `${r.rssMiB.toFixed(0)} / ${r.peakRssMiB.toFixed(0)} MiB`, '']);
      }
    }

    // 5. list and status with many boxes on many nodes
    if (PARTS.has('reads')) {
      log(`scaling to ${NODES} simulated nodes`);
      clusterUp(ROOT, ['--nodes', String(NODES)]);
      const nodes = (await core.listNode({ labelSelector: 'type=kwok' })).items.map((n) => n.metadata!.name!);
      log(`creating ${BOXES} box pods on ${nodes.length} nodes`);
      const createStart = Date.now();
      await createPods(BOXES, nodes);
      const createSeconds = (Date.now() - createStart) / 1000;
      await waitForAllBoxes(client);
      // a) the bridge that watched every box arrive; b) a fresh replica started with all the boxes
      //    already there (a restart or rollout): its initial list is the memory peak.
      const watched = { ...(await measureReads(url)), rssMiB: rssMiB(child.pid!), peakRssMiB: rssMiB(child.pid!, true) };
      child.kill('SIGTERM');
      const restartedAt = performance.now();
      const restart = await startBridgeProcess((c) => (second = c));
      await waitForAllBoxes(createBridgeClient({ url: restart.url, token, retries: 0 }));
      const fillSeconds = (performance.now() - restartedAt) / 1000;
      const restarted = { ...(await measureReads(restart.url)), rssMiB: rssMiB(restart.child.pid!) };
      const peak = rssMiB(restart.child.pid!, true); // its initial list is the peak
      const reads = { boxes: BOXES, nodes: nodes.length, createSeconds, watched, restarted: { ...restarted, fillSeconds, peakRssMiB: peak } };
      results.reads = reads;
      const where = `${BOXES} boxes on ${nodes.length} nodes`;
      for (const [label, r] of [
        ['watched them arrive', watched],
        ['restarted with them', restarted],
      ] as const) {
        rows.push([`GET /sandboxes, ${where}, bridge that ${label}: p50 / p99`, `${ms(r.list.p50)} / ${ms(r.list.p99)} (${(r.listBytes / 1e6).toFixed(1)} MB)`, '<= 50 ms p50']);
        rows.push([`GET /sandboxes?limit=100 (a page), bridge that ${label}: p50 / p99`, `${ms(r.page.p50)} / ${ms(r.page.p99)}`, '']);
        rows.push([`GET /sandboxes?session_id= (one session), bridge that ${label}: p50 / p99`, `${ms(r.session.p50)} / ${ms(r.session.p99)}`, '']);
        rows.push([`GET /boxes/:id/status, bridge that ${label}: p50 / p99`, `${ms(r.status.p50)} / ${ms(r.status.p99)}`, '']);
        rows.push([`bridge RSS, bridge that ${label}`, `${r.rssMiB.toFixed(0)} MiB`, '<= 256 MiB']);
      }
      rows.push(['restarted bridge: peak RSS from start / time from start until it serves every box', `${peak.toFixed(0)} MiB / ${fillSeconds.toFixed(1)} s`, '']);
      rows.push(['(setup) creating the box pods', `${createSeconds.toFixed(1)} s`, '']);
    }
  } finally {
    // Waited for: a bridge with --cpu-prof writes its profile as it exits.
    await Promise.all([child, second, baseline, ...variants].map((c) => c && stopChild(c)));
    log('cleaning up');
    await deletePool(custom, pool);
    // Force-delete: the pods are on simulated nodes and nobody waits for them to shut down.
    await core.deleteCollectionNamespacedPod({ namespace: ns, labelSelector: BOX_SELECTOR, gracePeriodSeconds: 0 }).catch(() => undefined);
    await core.deleteNamespace({ name: ns }).catch(() => undefined);
    if (PARTS.has('reads')) {
      spawnSync(join(ROOT, '.cluster/bin/kwokctl'), ['scale', 'node', '--name', 'sandbox-bridge', '--config', join(ROOT, '.cluster/kwok.yaml'), '--replicas', '3'], {
        env: { ...process.env, KWOK_WORKDIR: join(ROOT, '.cluster/kwok') },
        stdio: 'ignore',
      });
    }
  }

  const table = ['| measure | value | target |', '|---|---|---|', ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
  const md = `# Bridge bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}; \`npm run bench\`\n\n${table}\n`;
  writeResults(ROOT, RESULTS_NAME, md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
