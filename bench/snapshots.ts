// Bench: snapshot and restore throughput.
//
//   npm run bench:snapshots   (BENCH_SNAPSHOT_MIB=100 BENCH_SNAPSHOT_ROUNDS=3)
//
// On the local cluster's real node, with its object store (versitygw on loopback): a box with a
// BENCH_SNAPSHOT_MIB workspace of incompressible data (so the archive is as large as the data,
// the worst case for the transfer) is snapshotted (POST /boxes/:id/snapshots: boxd's gzip tar ->
// bridge -> multipart upload) and forked (POST /boxes {snapshot_id}: a new box, then store ->
// bridge -> boxd extraction), BENCH_SNAPSHOT_ROUNDS times. Reported: time and MB/s of each, the
// fork's restore part (the fork minus an empty box's create-and-start time, measured alongside),
// and the bridge process's peak RSS growth (VmHWM) over the runs, from after a warm-up snapshot.
// The bridge runs as its own process (node dist/bridge/main.js). Results: bench/results/snapshots.md, .json.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { createBridgeClient, type BridgeClient } from '../client/index.js';
import { NODE_FLAGS } from '../common/node-flags.js';
import { writeResults } from './results-file.js';
import { BOXD_IMAGE, ON_REAL_NODE, REAL_NODE_LABEL, createBenchPool, ensureCluster, freePort, objectStoreEnv } from './setup.js';

const ROOT = process.cwd();
const MIB = Number(process.env.BENCH_SNAPSHOT_MIB ?? 100);
const ROUNDS = Number(process.env.BENCH_SNAPSHOT_ROUNDS ?? 3);
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const ns = `bench-snap-${id}`;
const pool = `bench-snap-${id}`;
const token = randomBytes(24).toString('hex');

const log = (msg: string) => process.stderr.write(`[bench:snapshots] ${msg}\n`);

ensureCluster(ROOT, KUBECONFIG, []);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);


function rssMiB(pid: number, peak = false): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(new RegExp(`${peak ? 'VmHWM' : 'VmRSS'}:\\s+(\\d+) kB`).exec(status)![1]) / 1024;
}

async function startBridge(): Promise<{ child: ChildProcess; client: BridgeClient }> {
  const [port, metricsPort] = [await freePort(), await freePort()];
  const child = spawn(process.execPath, [...NODE_FLAGS, join(ROOT, 'dist/bridge/main.js')], {
    env: {
      PATH: process.env.PATH,
      KUBECONFIG,
      BRIDGE_TOKEN: token,
      BOXD_KEY: randomBytes(32).toString('hex'),
      BOXD_IMAGE,
      POOL_NAME: pool,
      SANDBOX_NAMESPACE: ns,
      PORT: String(port),
      METRICS_PORT: String(metricsPort),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      ...objectStoreEnv(ROOT, `bench-${id}`),
    },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  for (let i = 0; i < 600; i++) {
    if (await fetch(`http://127.0.0.1:${metricsPort}/readyz`).then((r) => r.ok, () => false)) {
      return { child, client: createBridgeClient({ url: `http://127.0.0.1:${port}`, token, retries: 0, timeoutMs: 600_000 }) };
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('bridge did not start');
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;

async function main() {
  const realNodes = await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` });
  if (!realNodes.items.length) throw new Error('no real node in the local cluster: this bench needs boxd (test/cluster/up.sh as root)');
  await createBenchPool(
    { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
    {
      name: pool,
      labels: { 'sandbox-bridge.io/bench': 'true' },
      spec: {
        namespace: ns,
        box: {
          defaultImage: 'sandbox-bridge.local/box:dev',
          workspaceSizeLimit: `${Math.max(1024, MIB * 4)}Mi`,
          ...ON_REAL_NODE,
        },
      },
    },
  );
  const { child, client } = await startBridge();
  const runs: Array<{ snapshotMs: number; forkMs: number; emptyCreateMs: number; bytes: number }> = [];
  let baseline = 0;
  try {
    const box = await client.createBox({ sessionId: 'bench-snap-source', cpu: 0.25, memory: 256 });
    // A warm-up snapshot and restore of the empty workspace, so the baseline includes the object
    // store client's code (loaded on first use) and the growth is what the transfers hold.
    const warm = await client.snapshot(box.box_id);
    await client.deleteBox((await client.fromSnapshot(warm.snapshot_id, { sessionId: 'bench-snap-warm' })).box_id);
    await client.deleteSnapshot(warm.snapshot_id);
    const made = await client.exec(box.box_id, { command: `head -c ${MIB * 1048576} /dev/urandom > data.bin && sha256sum data.bin | cut -c1-64`, timeoutMs: 600_000 });
    const sum = made.stdout;
    baseline = rssMiB(child.pid!);
    for (let round = 1; round <= ROUNDS; round++) {
      let t = performance.now();
      const snap = await client.snapshot(box.box_id);
      const snapshotMs = performance.now() - t;
      // An empty box's create-and-start, so the fork's restore part can be told apart.
      t = performance.now();
      const empty = await client.createBox({ sessionId: `bench-snap-empty-${round}`, cpu: 0.25, memory: 256 });
      await client.exec(empty.box_id, { command: 'true' });
      const emptyCreateMs = performance.now() - t;
      await client.deleteBox(empty.box_id);
      t = performance.now();
      const fork = await client.fromSnapshot(snap.snapshot_id, { sessionId: `bench-snap-fork-${round}` });
      const forkMs = performance.now() - t;
      const check = await client.exec(fork.box_id, { command: 'sha256sum data.bin | cut -c1-64' });
      if (check.stdout !== sum) throw new Error(`round ${round}: the fork's data differs`);
      await client.deleteBox(fork.box_id);
      await client.deleteSnapshot(snap.snapshot_id);
      runs.push({ snapshotMs, forkMs, emptyCreateMs, bytes: snap.size });
      log(`round ${round}: snapshot ${snapshotMs.toFixed(0)} ms, fork ${forkMs.toFixed(0)} ms (empty create ${emptyCreateMs.toFixed(0)} ms), ${(snap.size / 1e6).toFixed(1)} MB`);
    }
    await client.deleteBox(box.box_id);
  } finally {
    const peak = child.pid ? rssMiB(child.pid, true) : 0;
    child.kill('SIGTERM');
    log('cleaning up');
    await custom.deleteClusterCustomObject({ group: 'sandbox-bridge.io', version: 'v1alpha1', plural: 'sandboxpools', name: pool }).catch(() => undefined);
    await core.deleteNamespace({ name: ns }).catch(() => undefined);
    if (runs.length) report(runs, baseline, peak);
  }
}

function report(runs: Array<{ snapshotMs: number; forkMs: number; emptyCreateMs: number; bytes: number }>, baseline: number, peak: number) {
  const bytes = median(runs.map((r) => r.bytes));
  const snap = median(runs.map((r) => r.snapshotMs));
  const fork = median(runs.map((r) => r.forkMs));
  const restore = median(runs.map((r) => r.forkMs - r.emptyCreateMs));
  const mbps = (ms: number) => (bytes / 1e6 / (ms / 1000)).toFixed(1);
  const results = {
    date: new Date().toISOString(),
    node: process.version,
    cores: cpus().length,
    workspaceMiB: MIB,
    archiveBytes: bytes,
    rounds: runs,
    medians: { snapshotMs: snap, forkMs: fork, restoreMs: restore },
    bridgeRss: { beforeMiB: baseline, peakMiB: peak, growthMiB: peak - baseline },
  };
  const rows = [
    [`snapshot of a ${MIB} MiB workspace (POST /boxes/:id/snapshots), median of ${runs.length}`, `${(snap / 1000).toFixed(2)} s = ${mbps(snap)} MB/s`],
    [`fork into a new box (POST /boxes {snapshot_id}): create + start + restore, median`, `${(fork / 1000).toFixed(2)} s`],
    [`an empty box's create and start (same rounds), median`, `${(median(runs.map((r) => r.emptyCreateMs)) / 1000).toFixed(2)} s`],
    // The difference is the restore only when pod starts vary less than it: on a loaded 2-core
    // node a pod start varies by more than a 100 MiB restore takes, so a difference below zero
    // is reported as not separable rather than as a throughput.
    ['restore (fork minus the empty create, median)', restore > 0 ? `${(restore / 1000).toFixed(2)} s = ${mbps(restore)} MB/s` : 'not separable from pod start variance in this run'],
    ['compressed archive (incompressible data)', `${(bytes / 1e6).toFixed(1)} MB`],
    ['bridge RSS after a warm-up snapshot / peak (VmHWM) over all rounds', `${baseline.toFixed(0)} / ${peak.toFixed(0)} MiB (+${(peak - baseline).toFixed(0)} MiB)`],
  ];
  const table = ['| measure | value |', '|---|---|', ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
  const md =
    `# Snapshot bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}; \`npm run bench:snapshots\` ` +
    `(BENCH_SNAPSHOT_MIB=${MIB}, BENCH_SNAPSHOT_ROUNDS=${runs.length}); object store: the local cluster's versitygw on loopback, ` +
    `box on the real node, bridge as its own process.\n\n${table}\n`;
  writeResults(ROOT, 'snapshots', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
