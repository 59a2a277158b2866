// Bench: file watch events per second and latency from a write to its event (issue 23; docs/api.md
// "File watch").
//
//   npm run bench:watch   (BENCH_WATCH_ROUNDS=6 BENCH_WATCH_WRITES=100 BENCH_WATCH_FLOOD=3000)
//
// One box on the local cluster's real node. The files are made from this machine straight in the
// box's /workspace emptyDir on the node (the kubelet's pod directory: the real node is this
// machine), so the write's time and the event's arrival are read on one clock and nothing of an
// exec is in the figure. Two ways to the same watch, each a stream read here:
//   direct: boxd's /v1/files/watch on the pod IP with the box's credential (inotify -> boxd);
//   bridge: /api/v1/boxes/:id/files/watch on a bridge process (inotify -> boxd -> bridge).
// Latency: BENCH_WATCH_ROUNDS rounds per way, the ways alternating (ABBA), each BENCH_WATCH_WRITES
// new files, one at a time, 20 ms apart: from just before the file is made to its create line.
// Rate: per round BENCH_WATCH_FLOOD files made as fast as this machine makes them; events per
// second = create lines received / (last line's arrival - first write), and lines lost to overflow.
// The load average is taken with every figure. Results: bench/results/watch.md and .json.
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { createBridgeClient } from '../client/index.js';
import { BOXD_NONCE_ANNOTATION, BOXD_PORT, boxdToken } from '../common/boxd.js';
import { startProgram, type Program } from './programs.js';
import { writeResults } from './results-file.js';
import { benchCluster, BOXD_IMAGE, createBenchPool, deletePool, ON_REAL_NODE, percentile, REAL_NODE_LABEL } from './setup.js';

const ROOT = process.cwd();
const ROUNDS = Number(process.env.BENCH_WATCH_ROUNDS ?? 6);
const WRITES = Number(process.env.BENCH_WATCH_WRITES ?? 100);
const FLOOD = Number(process.env.BENCH_WATCH_FLOOD ?? 3000);
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const PODS_DIR = process.env.BENCH_WATCH_PODS_DIR ?? join(ROOT, '.cluster/real-node/kubelet/root/pods');
const id = randomBytes(3).toString('hex');
const pool = `bench-watch-${id}`;
const ns = `${pool}-boxes`;
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');

const { kc, core, custom } = benchCluster(ROOT, KUBECONFIG);
const log = (msg: string) => process.stderr.write(`[bench:watch] ${msg}\n`);
const load1 = () => Number(loadavg()[0]!.toFixed(2));
const round = (n: number) => Math.round(n * 1000) / 1000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Way {
  name: 'direct' | 'bridge';
  host: string;
  port: number;
  path: string;
  headers: Record<string, string>;
}

interface Line {
  type: string;
  path?: string;
  dropped?: number;
}

/** An open watch: its lines as they arrive, each with the time it was read. */
class Stream {
  private waiters: Array<() => void> = [];
  readonly lines: Array<{ line: Line; at: number }> = [];
  private constructor(private readonly req: http.ClientRequest) {}

  static open(way: Way, dir: string): Promise<Stream> {
    return new Promise((resolve, reject) => {
      const req = http.request({ host: way.host, port: way.port, path: `${way.path}?path=${encodeURIComponent(dir)}`, headers: way.headers });
      const s = new Stream(req);
      req.on('response', (res) => {
        if (res.statusCode !== 200) return reject(new Error(`${way.name}: watch answered ${res.statusCode}`));
        let rest = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          const at = performance.now();
          rest += chunk;
          let nl: number;
          while ((nl = rest.indexOf('\n')) >= 0) {
            const line = JSON.parse(rest.slice(0, nl)) as Line;
            rest = rest.slice(nl + 1);
            s.lines.push({ line, at });
            if (line.type === 'ready') resolve(s);
          }
          for (const w of s.waiters.splice(0)) w();
        });
        res.on('error', () => undefined);
      });
      req.on('error', reject);
      req.end();
    });
  }

  /** Resolves with the arrival time of the first line after index `from` that matches, within ms. */
  async until(match: (l: Line) => boolean, from: number, ms: number): Promise<{ at: number; index: number } | undefined> {
    const deadline = performance.now() + ms;
    for (let i = from; ; ) {
      for (; i < this.lines.length; i++) if (match(this.lines[i]!.line)) return { at: this.lines[i]!.at, index: i + 1 };
      const left = deadline - performance.now();
      if (left <= 0) return undefined;
      await Promise.race([new Promise<void>((r) => this.waiters.push(r)), sleep(left)]);
    }
  }

  close(): void {
    this.req.destroy();
  }
}

async function latencyRound(way: Way, hostDir: string, boxDir: string, r: number): Promise<number[]> {
  const s = await Stream.open(way, boxDir);
  const ms: number[] = [];
  try {
    let from = 0;
    for (let i = 0; i < WRITES; i++) {
      const name = `l${way.name}${r}-${i}`;
      const began = performance.now();
      writeFileSync(join(hostDir, name), '');
      const got = await s.until((l) => l.type === 'create' && l.path === `${boxDir}/${name}`, from, 10_000);
      if (!got) throw new Error(`${way.name}: no create line for ${name} within 10 s`);
      ms.push(got.at - began);
      from = got.index;
      await sleep(20);
    }
  } finally {
    s.close();
  }
  return ms;
}

async function floodRound(way: Way, hostDir: string, boxDir: string, r: number) {
  const s = await Stream.open(way, boxDir);
  try {
    const began = performance.now();
    for (let i = 0; i < FLOOD; i++) writeFileSync(join(hostDir, `f${way.name}${r}-${i}`), '');
    const last = `${boxDir}/f${way.name}${r}-${FLOOD - 1}`;
    await s.until((l) => l.type === 'create' && l.path === last, 0, 30_000);
    await sleep(300); // late lines (an overflow's count)
    const creates = s.lines.filter((l) => l.line.type === 'create');
    const dropped = s.lines.filter((l) => l.line.type === 'overflow').reduce((n, l) => n + (l.line.dropped ?? 0), 0);
    const end = creates.length ? creates[creates.length - 1]!.at : began;
    return { way: way.name, creates: creates.length, dropped, perSecond: Math.round(creates.length / ((end - began) / 1000)), load1: load1() };
  } finally {
    s.close();
  }
}

async function main() {
  if ((await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` })).items.length === 0) {
    log('no real node: skipped');
    return;
  }
  const shared = { BOXD_IMAGE, BOXD_KEY: boxdKey };
  let operator: Program | undefined;
  let bridge: Program | undefined;
  try {
    await createBenchPool(
      { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
      {
        name: pool,
        labels: { 'sandbox-bridge.io/bench': id },
        spec: { namespace: ns, maxBoxes: 3, box: { defaultImage: 'sandbox-bridge.local/box:dev', defaultCpu: '250m', defaultMemory: '128Mi', ...ON_REAL_NODE }, warm: { count: 0 } },
      },
    );
    operator = await startProgram(ROOT, 'dist/operator/main.js', KUBECONFIG, {
      ...shared,
      LEASE_NAMESPACE: 'default',
      LEASE_NAME: `${pool}-lease`,
      POD_NAME: `${pool}-operator`,
      POOL_SELECTOR: `sandbox-bridge.io/bench=${id}`,
    });
    bridge = await startProgram(ROOT, 'dist/bridge/main.js', KUBECONFIG, { ...shared, BRIDGE_TOKEN: token, POOL_NAME: pool, SANDBOX_NAMESPACE: ns, RATE_LIMIT_RPS: '100000', RATE_LIMIT_BURST: '200000' });
    const client = createBridgeClient({ url: `http://127.0.0.1:${bridge.port}`, token, retries: 2, timeoutMs: 300_000 });
    const box = (await client.createBox({ sessionId: `bench-watch-${id}` })).box_id;
    await client.exec(box, { command: 'mkdir -p /workspace/w' });
    const pod = await core.readNamespacedPod({ namespace: ns, name: box });
    const hostDir = join(PODS_DIR, pod.metadata!.uid!, 'volumes/kubernetes.io~empty-dir/workspace/w');
    mkdirSync(hostDir, { recursive: true });
    const credential = boxdToken(boxdKey, ns, box, pod.metadata!.annotations![BOXD_NONCE_ANNOTATION]!);
    const ways: Way[] = [
      { name: 'direct', host: pod.status!.podIP!, port: BOXD_PORT, path: '/v1/files/watch', headers: { 'x-boxd-token': credential } },
      { name: 'bridge', host: '127.0.0.1', port: bridge.port, path: `/api/v1/boxes/${box}/files/watch`, headers: { authorization: `Bearer ${token}` } },
    ];
    const boxDir = '/workspace/w';
    log(`box ${box}; latency, ${ROUNDS} rounds x ${WRITES} writes per way`);
    const samples: Record<string, number[]> = { direct: [], bridge: [] };
    const loads: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      const order = r % 2 === 0 ? ways : [...ways].reverse();
      for (const w of order) samples[w.name]!.push(...(await latencyRound(w, hostDir, boxDir, r)));
      loads.push(load1());
      rmSync(hostDir, { recursive: true, force: true });
      mkdirSync(hostDir, { recursive: true });
    }
    log(`rate, ${FLOOD} files per round`);
    const floods: Array<Awaited<ReturnType<typeof floodRound>>> = [];
    for (let r = 0; r < 4; r++) {
      const w = ways[[0, 1, 1, 0][r]!]!;
      floods.push(await floodRound(w, hostDir, boxDir, r));
      rmSync(hostDir, { recursive: true, force: true });
      mkdirSync(hostDir, { recursive: true });
      await sleep(500);
    }
    await client.deleteBox(box).catch(() => undefined);

    const stat = (ms: number[]) => ({ n: ms.length, p50Ms: round(percentile(ms, 50)), p99Ms: round(percentile(ms, 99)) });
    const lat = { direct: stat(samples.direct!), bridge: stat(samples.bridge!) };
    const md = [
      '# File watch: events per second and latency from a write to its event',
      '',
      `Generated by \`npm run bench:watch\` (bench/watch.ts) on ${new Date().toISOString()}. One box (250m, 128Mi) on the`,
      "local cluster's real node; files made from this machine straight in the box's /workspace emptyDir, so write and",
      "arrival are timed on one clock. **direct** = boxd's `/v1/files/watch` on the pod IP; **bridge** =",
      '`/api/v1/boxes/:id/files/watch` on a bridge process (inotify -> boxd -> bridge -> here).',
      '',
      `Latency: ${ROUNDS} rounds x ${WRITES} new files per way (one at a time, 20 ms apart), the ways alternating; load1 ${Math.min(...loads)}-${Math.max(...loads)}.`,
      '',
      '| way | n | p50 ms | p99 ms |',
      '|---|---|---|---|',
      ...(['direct', 'bridge'] as const).map((w) => `| ${w} | ${lat[w].n} | ${lat[w].p50Ms} | ${lat[w].p99Ms} |`),
      '',
      `Added by the bridge: p50 ${round(lat.bridge.p50Ms - lat.direct.p50Ms)} ms, p99 ${round(lat.bridge.p99Ms - lat.direct.p99Ms)} ms.`,
      '',
      `Rate: ${FLOOD} files made as fast as possible per round (direct, bridge, bridge, direct):`,
      '',
      '| way | create lines | dropped (overflow) | events/s | load1 after |',
      '|---|---|---|---|---|',
      ...floods.map((f) => `| ${f.way} | ${f.creates} | ${f.dropped} | ${f.perSecond} | ${f.load1} |`),
      '',
    ].join('\n');
    writeResults(ROOT, 'watch', md, { at: new Date().toISOString(), rounds: ROUNDS, writes: WRITES, flood: FLOOD, latency: lat, loads, floods });
    process.stdout.write(`${md}\n`);
  } catch (err) {
    if (bridge) log(`last output of the bridge:\n${bridge.lines.slice(-15).join('\n')}`);
    if (operator) log(`last output of the operator:\n${operator.lines.slice(-15).join('\n')}`);
    throw err;
  } finally {
    await Promise.all([bridge?.stop(), operator?.stop()]);
    log('cleaning up');
    await deletePool(custom, pool);
    await core.deleteNamespace({ name: ns }).catch(() => undefined);
    await kc.makeApiClient(k8s.CoordinationV1Api).deleteNamespacedLease({ name: `${pool}-lease`, namespace: 'default' }).catch(() => undefined);
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    log(String((err as Error).stack ?? err));
    process.exit(1);
  },
);
