// Bench: snapshot and restore throughput, and where a snapshot's time goes.
//
//   npm run bench:snapshots   (BENCH_SNAPSHOT_MIB=200 BENCH_SNAPSHOT_KIND=mixed|random
//                              BENCH_SNAPSHOT_ROUNDS=5 BENCH_SNAPSHOT_CPU=0.25
//                              BENCH_SNAPSHOT_BASELINE=<a built checkout> BENCH_SNAPSHOT_BASELINE_BOXD_IMAGE=<its boxd image>)
//
// On the local cluster's real node, with its object store (versitygw on loopback): a box
// (BENCH_SNAPSHOT_CPU cores, 512 MiB) gets a BENCH_SNAPSHOT_MIB workspace, then each round
// snapshots it (POST /boxes/:id/snapshots: boxd's tar -> bridge -> multipart upload) and restores
// that snapshot into the same box (POST /boxes/:id/restore: store -> bridge -> boxd, the old tree
// replaced), each timed. The workspace is "mixed" by default, like a real one: two large random
// files (40%), 1 MiB random files (25%, media), a log of text (15%) and 8 KiB source-like text
// files (20%, 5,120 of them at 200 MiB); "random" is one file of random bytes. MB/s counts the
// workspace's data (its files' bytes), whatever the archive's size.
//
// Where the time goes: around each call the CPU seconds of the bridge process, of the box's pod
// (its cgroup, with the time the CFS quota throttled it), of the store's process and of the whole
// machine (the rest: the API server, other work on the shared machine) are read from /proc and
// the cgroup file system (this is the real node), with the 1-minute load average.
//
// BENCH_SNAPSHOT_BASELINE: a second checkout, built (its dist/), whose bridge runs beside this
// one's with its own pool, box and boxd image (BENCH_SNAPSHOT_BASELINE_BOXD_IMAGE, default the
// same); the rounds alternate between the two (A B, B A, ...), so both see the same machine.
// Each bridge runs as its own process (node dist/bridge/main.js); its peak RSS growth (VmHWM)
// after a warm-up snapshot and restore is reported. Results: bench/results/snapshots.md, .json.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { Readable } from 'node:stream';
import { cpus, loadavg } from 'node:os';
import { join, resolve } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { createBridgeClient, type BridgeClient } from '../client/index.js';
import { NODE_FLAGS } from '../common/node-flags.js';
import { ObjectStore, ObjectStoreConfigSchema } from '../common/object-store.js';
import { writeResults } from './results-file.js';
import { BOXD_IMAGE, createBenchPool, deletePool, ensureCluster, freePort, objectStoreEnv, ON_REAL_NODE, percentile, REAL_NODE_LABEL } from './setup.js';

const ROOT = process.cwd();
const MIB = Number(process.env.BENCH_SNAPSHOT_MIB ?? 200);
const KIND = process.env.BENCH_SNAPSHOT_KIND ?? 'mixed';
const ROUNDS = Number(process.env.BENCH_SNAPSHOT_ROUNDS ?? 5);
const CPU = Number(process.env.BENCH_SNAPSHOT_CPU ?? 0.25);
const MEMORY_MIB = 512;
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const token = randomBytes(24).toString('hex');
const storeEnv = objectStoreEnv(ROOT, `bench-${id}`);

const log = (msg: string) => process.stderr.write(`[bench:snapshots] ${msg}\n`);

if (!['mixed', 'random'].includes(KIND)) throw new Error(`BENCH_SNAPSHOT_KIND must be mixed or random, not ${KIND}`);
ensureCluster(ROOT, KUBECONFIG, []);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);

interface Variant {
  name: string;
  root: string;
  boxdImage: string;
  pool: string;
  child?: ChildProcess;
  client?: BridgeClient;
  box?: string;
  /** The box pod's cgroup directory below the cpuacct / cpu hierarchies (undefined: not found). */
  cgroup?: string;
  rssBefore?: number;
}

const variants: Variant[] = [{ name: 'this build', root: ROOT, boxdImage: process.env.BENCH_SNAPSHOT_BOXD_IMAGE ?? BOXD_IMAGE, pool: `bench-snap-${id}` }];
if (process.env.BENCH_SNAPSHOT_BASELINE) {
  const root = resolve(process.env.BENCH_SNAPSHOT_BASELINE);
  if (!existsSync(join(root, 'dist/bridge/main.js'))) throw new Error(`BENCH_SNAPSHOT_BASELINE: ${root}/dist/bridge/main.js is missing (build that checkout first)`);
  variants.unshift({ name: 'baseline', root, boxdImage: process.env.BENCH_SNAPSHOT_BASELINE_BOXD_IMAGE ?? BOXD_IMAGE, pool: `bench-snap-${id}-base` });
}

// --- where the CPU goes ----------------------------------------------------------------------

const CLOCK_TICKS = 100; // USER_HZ: /proc/<pid>/stat counts in these
const CGROUP = '/sys/fs/cgroup';

function procSeconds(pid: number | undefined): number {
  if (!pid) return NaN;
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return NaN;
  }
}

/** Busy seconds of the whole machine (every core). */
function machineSeconds(): number {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  return (f[0]! + f[1]! + f[2]! + f[5]! + f[6]! + f[7]!) / CLOCK_TICKS;
}

/** The store's process: the local cluster's versitygw. */
const storePid = Number(spawnSync('pgrep', ['-x', 'versitygw'], { encoding: 'utf8' }).stdout.split('\n')[0]) || undefined;

/** The pod's cgroup below the cgroup v1 cpuacct hierarchy (the real node's kubelet uses cgroupfs under a root of its own). */
function podCgroup(uid: string): string | undefined {
  const base = join(CGROUP, 'cpuacct');
  if (!existsSync(base)) return undefined;
  for (const top of readdirSync(base)) {
    for (const qos of ['kubepods', 'kubepods/burstable', 'kubepods/besteffort']) {
      const rel = join(top, qos, `pod${uid}`);
      if (existsSync(join(base, rel, 'cpuacct.usage'))) return rel;
    }
  }
  return undefined;
}

function boxSeconds(cgroup: string | undefined): { cpu: number; throttled: number } {
  if (!cgroup) return { cpu: NaN, throttled: NaN };
  try {
    const cpu = Number(readFileSync(join(CGROUP, 'cpuacct', cgroup, 'cpuacct.usage'), 'utf8')) / 1e9;
    const throttled = Number(/throttled_time (\d+)/.exec(readFileSync(join(CGROUP, 'cpu', cgroup, 'cpu.stat'), 'utf8'))?.[1] ?? NaN) / 1e9;
    return { cpu, throttled };
  } catch {
    return { cpu: NaN, throttled: NaN };
  }
}

interface Cpu {
  /** CPU seconds during the call. */
  bridge: number;
  box: number;
  /** Seconds the box's CFS quota held it back. */
  boxThrottled: number;
  store: number;
  /** Everything else on the machine. */
  rest: number;
}

/** Starts counting; the returned function gives the call's wall seconds and CPU. */
function meter(v: Variant): () => { seconds: number; cpu: Cpu; load1: number } {
  const load1 = loadavg()[0]!;
  const t = performance.now();
  const bridge = procSeconds(v.child?.pid);
  const box = boxSeconds(v.cgroup);
  const store = procSeconds(storePid);
  const machine = machineSeconds();
  return () => {
    const b = procSeconds(v.child?.pid) - bridge;
    const x = boxSeconds(v.cgroup);
    const s = procSeconds(storePid) - store;
    const all = machineSeconds() - machine;
    const boxCpu = x.cpu - box.cpu;
    return {
      seconds: (performance.now() - t) / 1000,
      cpu: { bridge: b, box: boxCpu, boxThrottled: x.throttled - box.throttled, store: s, rest: all - b - (Number.isNaN(boxCpu) ? 0 : boxCpu) - (Number.isNaN(s) ? 0 : s) },
      load1,
    };
  };
}

function rssMiB(pid: number, peak = false): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(new RegExp(`${peak ? 'VmHWM' : 'VmRSS'}:\\s+(\\d+) kB`).exec(status)![1]) / 1024;
}

// --- the workspace ----------------------------------------------------------------------------

/**
 * A busybox script writing the workspace into the current directory; prints its data bytes. The
 * text parts are generated with fixed seeds (the same bytes every run), the random parts from
 * /dev/urandom (incompressible).
 */
function workspaceScript(mib: number, kind: string): string {
  const MiB = 1048576;
  if (kind === 'random') return `head -c ${mib * MiB} /dev/urandom > data.bin && cat data.bin | wc -c`;
  const big = Math.floor(mib * 0.2 * MiB);
  const media = Math.max(1, Math.round(mib * 0.25));
  const logBytes = Math.floor(mib * 0.15 * MiB);
  const sources = Math.max(1, Math.round((mib * 0.2 * MiB) / 8192));
  return [
    'set -e',
    'mkdir -p big media logs src',
    `head -c ${big} /dev/urandom > big/model-a.bin`,
    `head -c ${big} /dev/urandom > big/model-b.bin`,
    `i=0; while [ $i -lt ${media} ]; do head -c ${MiB} /dev/urandom > media/img-$i.png; i=$((i+1)); done`,
    // A service log: timestamps, ids, paths, latencies (compresses about 5x with gzip -1).
    `awk 'BEGIN{srand(7); n=0; i=0; while (n < ${logBytes}) { l = sprintf("2026-11-25T04:%02d:%02d.%03dZ INFO request id=%08x path=/api/v1/items/%d user=u%d took=%dms status=%d", int(i/6000)%60, int(i/100)%60, i%1000, int(rand()*4294967295), int(rand()*100000), int(rand()*500), int(rand()*900), (rand()<0.9?200:500)); print l; n += length(l)+1; i++ } }' > logs/app.log`,
    // Source-like files of about 8 KiB, 100 per directory (compress about 3x).
    `awk 'BEGIN{srand(11); split("const return function import export value if else await string number this config result error =", w, " "); for(f=0;f<${sources};f++){ d="src/pkg" int(f/100); if (f%100==0) system("mkdir -p " d); fn=d "/mod" f ".ts"; n=0; while(n<8192){ l="  "; k=int(rand()*10)+3; for(j=0;j<k;j++) l=l w[int(rand()*16)+1] (rand()<0.3? "_" int(rand()*1000):"") " "; l=l ";"; print l > fn; n+=length(l)+1 } close(fn) } }'`,
    'find . -type f -exec cat {} + | wc -c',
  ].join('\n');
}

/** A digest of the whole tree (names and contents), to check a restore. */
const TREE_DIGEST = 'find . -type f | sort | xargs sha256sum | sha256sum | cut -c1-64';

// --- the run ----------------------------------------------------------------------------------

async function startBridge(v: Variant): Promise<void> {
  const [port, metricsPort] = [await freePort(), await freePort()];
  const child = spawn(process.execPath, [...NODE_FLAGS.bridge, join(v.root, 'dist/bridge/main.js')], {
    env: {
      PATH: process.env.PATH,
      KUBECONFIG,
      BRIDGE_TOKEN: token,
      BOXD_KEY: randomBytes(32).toString('hex'),
      BOXD_IMAGE: v.boxdImage,
      POOL_NAME: v.pool,
      SANDBOX_NAMESPACE: v.pool,
      PORT: String(port),
      METRICS_PORT: String(metricsPort),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      ...storeEnv,
    },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  v.child = child;
  for (let i = 0; i < 600; i++) {
    if (await fetch(`http://127.0.0.1:${metricsPort}/readyz`).then((r) => r.ok, () => false)) {
      v.client = createBridgeClient({ url: `http://127.0.0.1:${port}`, token, retries: 0, timeoutMs: 600_000 });
      return;
    }
    if (child.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`the ${v.name} bridge did not start`);
}

interface Round {
  variant: string;
  round: number;
  snapshot: { seconds: number; cpu: Cpu; load1: number };
  restore: { seconds: number; cpu: Cpu; load1: number };
  storedBytes: number;
}

async function main() {
  const realNodes = await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` });
  if (!realNodes.items.length) throw new Error('no real node in the local cluster: this bench needs boxd (test/cluster/up.sh as root)');
  const load = loadavg().map((l) => l.toFixed(2)).join(' ');
  const rounds: Round[] = [];
  let dataBytes = 0;
  let ceiling: Ceiling | undefined;
  const peaks: Record<string, { before: number; peak: number }> = {};
  try {
    for (const v of variants) {
      await createBenchPool(
        { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
        {
          name: v.pool,
          labels: { 'sandbox-bridge.io/bench': 'true' },
          spec: { namespace: v.pool, box: { defaultImage: 'sandbox-bridge.local/box:dev', workspaceSizeLimit: `${Math.max(1024, MIB * 4)}Mi`, ...ON_REAL_NODE } },
        },
      );
      await startBridge(v);
      const box = await v.client!.createBox({ sessionId: 'bench-snap-source', cpu: CPU, memory: MEMORY_MIB });
      v.box = box.box_id;
    }
    // The same workspace in every variant's box.
    const digests: string[] = [];
    for (const v of variants) {
      const made = await v.client!.exec(v.box!, { command: workspaceScript(MIB, KIND), timeoutMs: 600_000 });
      if (made.exit_code !== 0) throw new Error(`writing the workspace: exit ${made.exit_code} ${made.stderr}`);
      dataBytes = Number(made.stdout.trim());
      // Looked up once the box has run a command: a create may answer before its pod's cgroup exists.
      const pod = await core.readNamespacedPod({ name: (await v.client!.status(v.box!)).pod_name, namespace: v.pool });
      v.cgroup = podCgroup(pod.metadata!.uid!);
      if (!v.cgroup) log(`the box's cgroup was not found: its CPU is not reported`);
      digests.push((await v.client!.exec(v.box!, { command: TREE_DIGEST, timeoutMs: 600_000 })).stdout.trim());
      // A warm-up snapshot and restore, so the baseline RSS holds the store client's code and
      // the first timed round loads nothing.
      const warm = await v.client!.snapshot(v.box!);
      await v.client!.restoreSnapshot(v.box!, warm.snapshot_id);
      await v.client!.deleteSnapshot(warm.snapshot_id);
      v.rssBefore = rssMiB(v.child!.pid!);
    }
    if (variants.length > 1 && digests[0] !== digests[1] && KIND === 'mixed') {
      // The random parts differ between the boxes; the sizes and the text do not.
      log('(the boxes hold different random bytes, the same sizes and text)');
    }
    log(`workspace: ${KIND}, ${(dataBytes / 1e6).toFixed(1)} MB of data; variants: ${variants.map((v) => `${v.name} (${v.root}, ${v.boxdImage})`).join(', ')}`);
    for (let round = 1; round <= ROUNDS; round++) {
      const order = round % 2 ? variants : [...variants].reverse();
      for (const v of order) {
        const client = v.client!;
        let m = meter(v);
        const snap = await client.snapshot(v.box!);
        const snapshot = m();
        m = meter(v);
        await client.restoreSnapshot(v.box!, snap.snapshot_id);
        const restore = m();
        if (round === 1 || round === ROUNDS) {
          const digest = (await client.exec(v.box!, { command: TREE_DIGEST, timeoutMs: 600_000 })).stdout.trim();
          if (digest !== digests[variants.indexOf(v)]) throw new Error(`${v.name}, round ${round}: the workspace differs after the restore`);
        }
        await client.deleteSnapshot(snap.snapshot_id);
        rounds.push({ variant: v.name, round, snapshot, restore, storedBytes: snap.size });
        const mbps = (s: number) => (dataBytes / 1e6 / s).toFixed(0);
        log(
          `round ${round}, ${v.name}: snapshot ${snapshot.seconds.toFixed(2)} s (${mbps(snapshot.seconds)} MB/s, ${(snap.size / 1e6).toFixed(1)} MB stored; ` +
            `CPU bridge ${snapshot.cpu.bridge.toFixed(2)} box ${snapshot.cpu.box.toFixed(2)} store ${snapshot.cpu.store.toFixed(2)} rest ${snapshot.cpu.rest.toFixed(2)}), ` +
            `restore ${restore.seconds.toFixed(2)} s (${mbps(restore.seconds)} MB/s); load ${snapshot.load1.toFixed(1)}`,
        );
      }
    }
    for (const v of variants) peaks[v.name] = { before: v.rssBefore!, peak: rssMiB(v.child!.pid!, true) };
    ceiling = await storeCeiling(dataBytes);
  } finally {
    log('cleaning up');
    for (const v of variants) {
      if (v.box) await v.client?.deleteBox(v.box).catch(() => undefined);
      v.child?.kill('SIGTERM');
      await deletePool(custom, v.pool);
      await core.deleteNamespace({ name: v.pool }).catch(() => undefined);
    }
    await removeObjects().catch((err: unknown) => log(`could not remove the bench's objects: ${String(err)}`));
  }
  report(rounds, dataBytes, peaks, ceiling, `${load} -> ${loadavg().map((l) => l.toFixed(2)).join(' ')}`);
}

interface Ceiling {
  /** Seconds of each upload and each read-back of dataBytes of random bytes held in memory. */
  put: number[];
  get: number[];
  /** CPU seconds of the store's process per upload, median. */
  storeCpu: number;
}

/**
 * The store alone, a ceiling for both: dataBytes of random bytes from memory uploaded through
 * this build's client (parts in parallel), then read back, ROUNDS times. No box, no bridge.
 */
async function storeCeiling(bytes: number): Promise<Ceiling> {
  const store = new ObjectStore(ObjectStoreConfigSchema.parse(storeEnv));
  const data = randomBytes(bytes);
  const chunks = Array.from({ length: Math.ceil(bytes / 65536) }, (_, i) => data.subarray(i * 65536, (i + 1) * 65536));
  const result: Ceiling = { put: [], get: [], storeCpu: 0 };
  const cpu: number[] = [];
  try {
    for (let i = 0; i < ROUNDS; i++) {
      const key = store.key('ceiling', String(i));
      const before = procSeconds(storePid);
      let t = performance.now();
      await store.upload(key, Readable.from(chunks), { contentType: 'application/octet-stream' });
      result.put.push((performance.now() - t) / 1000);
      cpu.push(procSeconds(storePid) - before);
      t = performance.now();
      const got = await store.getStream(key);
      for await (const c of got!.body as AsyncIterable<Buffer>) void c;
      result.get.push((performance.now() - t) / 1000);
      await store.delete([key]);
    }
  } finally {
    store.close();
  }
  result.storeCpu = percentile(cpu, 50);
  log(`the store alone: upload ${result.put.map((x) => x.toFixed(2)).join(', ')} s, read ${result.get.map((x) => x.toFixed(2)).join(', ')} s`);
  return result;
}

/** Deletes whatever the bench left under its store prefix. */
async function removeObjects(): Promise<void> {
  const store = new ObjectStore(ObjectStoreConfigSchema.parse(storeEnv));
  try {
    const keys: string[] = [];
    for await (const o of store.list(`${store.prefix}/`)) keys.push(o.key);
    await store.delete(keys);
  } finally {
    store.close();
  }
}

function report(rounds: Round[], dataBytes: number, peaks: Record<string, { before: number; peak: number }>, ceiling: Ceiling | undefined, load: string) {
  const names = variants.map((v) => v.name);
  const of = (name: string) => rounds.filter((r) => r.variant === name);
  const med = (xs: number[]) => percentile(xs, 50);
  const mbps = (s: number) => `${(dataBytes / 1e6 / s).toFixed(0)} MB/s`;
  const secs = (s: number) => `${s.toFixed(2)} s`;
  const cpu = (rs: Round[], leg: 'snapshot' | 'restore') => {
    const c = (k: keyof Cpu) => med(rs.map((r) => r[leg].cpu[k]));
    const f = (x: number) => (Number.isNaN(x) ? 'n/a' : x.toFixed(2));
    return `${f(c('bridge'))} / ${f(c('box'))} (throttled ${f(c('boxThrottled'))}) / ${f(c('store'))} / ${f(c('rest'))}`;
  };
  const column = (name: string) => {
    const rs = of(name);
    const snap = rs.map((r) => r.snapshot.seconds);
    const rest = rs.map((r) => r.restore.seconds);
    const stored = med(rs.map((r) => r.storedBytes));
    const p = peaks[name];
    return [
      `**${mbps(med(snap))}** (${secs(med(snap))}) / ${mbps(percentile(snap, 99))} (${secs(percentile(snap, 99))})`,
      `**${mbps(med(rest))}** (${secs(med(rest))}) / ${mbps(percentile(rest, 99))} (${secs(percentile(rest, 99))})`,
      `${(stored / 1e6).toFixed(1)} MB (${((100 * stored) / dataBytes).toFixed(0)}% of the data)`,
      cpu(rs, 'snapshot'),
      cpu(rs, 'restore'),
      p ? `${p.before.toFixed(0)} / ${p.peak.toFixed(0)} MiB (+${(p.peak - p.before).toFixed(0)} MiB)` : '',
      med(rs.map((r) => r.snapshot.load1)).toFixed(1),
    ];
  };
  const labels = [
    `snapshot (POST /boxes/:id/snapshots), p50 / p99 of ${ROUNDS}`,
    'restore into the same box (POST /boxes/:id/restore, the old tree replaced), p50 / p99',
    'stored archive',
    'CPU seconds per snapshot, median: bridge / box (its quota held it back) / store / rest of the machine',
    'CPU seconds per restore, median: bridge / box / store / rest',
    'bridge RSS after a warm-up / peak (VmHWM) over all rounds',
    'load average (1 min) at the snapshots, median',
  ];
  const columns = names.map(column);
  const table = [
    `| measure | ${names.join(' | ')} |`,
    `|---|${names.map(() => '---').join('|')}|`,
    ...labels.map((label, i) => `| ${label} | ${columns.map((c) => c[i]).join(' | ')} |`),
  ].join('\n');
  const results = {
    date: new Date().toISOString(),
    node: process.version,
    cores: cpus().length,
    loadavg: load,
    workspace: { kind: KIND, mib: MIB, dataBytes },
    box: { cpu: CPU, memoryMiB: MEMORY_MIB },
    variants: variants.map((v) => ({ name: v.name, root: v.root, boxdImage: v.boxdImage })),
    rounds,
    bridgeRss: peaks,
    storeCeiling: ceiling,
  };
  const ceilingLine = ceiling
    ? `\n\nThe store alone (its ceiling; no box, no bridge): ${(dataBytes / 1e6).toFixed(0)} MB of random bytes from memory through this build's ` +
      `client, ${ROUNDS} times: upload p50 **${mbps(med(ceiling.put))}** (${secs(med(ceiling.put))}) / p99 ${mbps(percentile(ceiling.put, 99))}, ` +
      `the store's process ${ceiling.storeCpu.toFixed(2)} CPU s per upload; read back p50 ${mbps(med(ceiling.get))} / p99 ${mbps(percentile(ceiling.get, 99))}.`
    : '';
  const md =
    `# Snapshot bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}, load average ${load}; \`npm run bench:snapshots\` ` +
    `(BENCH_SNAPSHOT_MIB=${MIB}, BENCH_SNAPSHOT_KIND=${KIND}, BENCH_SNAPSHOT_ROUNDS=${ROUNDS}, BENCH_SNAPSHOT_CPU=${CPU}` +
    `${variants.length > 1 ? `, BENCH_SNAPSHOT_BASELINE=${variants[0]!.root}` : ''}); ${(dataBytes / 1e6).toFixed(1)} MB of data in a box of ` +
    `${CPU} CPU / ${MEMORY_MIB} MiB on the real node; object store: the local cluster's versitygw on loopback; each bridge its own process` +
    `${variants.length > 1 ? '; the variants alternate round by round' : ''}. MB/s = the workspace's data bytes / the call's time.\n\n${table}${ceilingLine}\n`;
  writeResults(ROOT, 'snapshots', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
