// Bench: how long a call to a sleeping box waits for it to wake.
//
//   npm run bench:wake   (part of npm run bench; BENCH_WAKE_MIB=10,100 BENCH_WAKE_ROUNDS=5
//                         BENCH_WAKE_WARM=2)
//
// On the local cluster's real node, with its object store (versitygw on loopback), the operator
// and one bridge (each its own process), side by side in one run: for each workspace size (of
// incompressible data, so the archive is as large as the data) and with the warm pool off, then
// on, BENCH_WAKE_ROUNDS boxes are created with the workspace, left to sleep (the pool's idle
// time is 2 s), and then called: the wake latency is `exec true` sent -> answered (a new or warm
// pod, the workspace restored, then the command). The data is checked after each wake (not
// timed). With the warm pool on, each wake starts once the pool is refilled, so it measures the
// wake path and not a refill racing it on 2 cores. Results: bench/results/wake.md and .json.
import { randomBytes } from 'node:crypto';
import { cpus } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { createBridgeClient, type BridgeClient } from '../client/index.js';
import { LABELS } from '../common/labels.js';
import { POOL_GROUP, POOL_PLURAL, POOL_VERSION } from '../common/pool.js';
import { writeResults } from './results-file.js';
import { BOXD_IMAGE, ON_REAL_NODE, REAL_NODE_LABEL, createBenchPool, ensureCluster, freePort, objectStoreEnv, percentile, startProgram, waitUntil, warmReady } from './setup.js';

const ROOT = process.cwd();
const SIZES = (process.env.BENCH_WAKE_MIB ?? '10,100').split(',').map(Number);
const ROUNDS = Number(process.env.BENCH_WAKE_ROUNDS ?? 5);
const WARM = Number(process.env.BENCH_WAKE_WARM ?? 2);
const SLEEP_AFTER_SECONDS = 2;
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const pool = `bench-wake-${id}`;
const ns = `${pool}-boxes`;
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');

ensureCluster(ROOT, KUBECONFIG, []);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const log = (msg: string) => process.stderr.write(`[bench:wake] ${msg}\n`);

const start = (script: string, env: Record<string, string>) => startProgram(ROOT, KUBECONFIG, script, { BOXD_IMAGE, BOXD_KEY: boxdKey, ...env });
const warmPods = async () =>
  (await core.listNamespacedPod({ namespace: ns, labelSelector: `${LABELS.warm}=${pool}` })).items.filter((p) => !p.metadata?.deletionTimestamp);

async function setWarm(count: number): Promise<void> {
  await custom.patchClusterCustomObject(
    { group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name: pool, body: { spec: { warm: { count } } } },
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
  );
  await waitUntil(`${count} warm boxes`, async () => (count ? (await warmReady(core, ns, pool)) >= count : (await warmPods()).length === 0), 300_000);
}

interface Wake {
  mib: number;
  warmPool: boolean;
  ms: number;
  servedWarm: boolean;
}

async function oneWake(client: BridgeClient, mib: number, warmPool: boolean, round: number): Promise<Wake> {
  const box = await client.createBox({ sessionId: `wake-${mib}-${warmPool ? 'warm' : 'cold'}-${round}` });
  const made = await client.exec(box.box_id, { command: `head -c ${mib * 1048576} /dev/urandom > data.bin && sha256sum data.bin | cut -c1-64`, timeoutMs: 300_000 });
  if (made.exit_code !== 0) throw new Error(`writing the workspace: exit ${made.exit_code} ${made.stderr}`);
  // Status reads do not count as activity, so polling does not keep the box awake.
  await waitUntil(`box ${box.box_id} to sleep`, async () => (await client.status(box.box_id)).status === 'Sleeping', 120_000, 100);
  if (warmPool) await waitUntil(`${WARM} warm boxes`, async () => (await warmReady(core, ns, pool)) >= WARM, 300_000);
  const t0 = performance.now();
  const answered = await client.exec(box.box_id, { command: 'true' });
  const ms = performance.now() - t0;
  if (answered.exit_code !== 0) throw new Error(`the call after the wake exited ${answered.exit_code}`);
  const check = await client.exec(box.box_id, { command: 'sha256sum data.bin | cut -c1-64' });
  if (check.stdout !== made.stdout) throw new Error(`${box.box_id}: the workspace differs after the wake`);
  const servedWarm = (await client.status(box.box_id)).pod_name.startsWith('box-warm-');
  await client.deleteBox(box.box_id);
  log(`${mib} MiB, warm pool ${warmPool ? 'on' : 'off'}, round ${round}: woken in ${ms.toFixed(0)} ms (${servedWarm ? 'warm pod' : 'new pod'})`);
  return { mib, warmPool, ms, servedWarm };
}

async function main() {
  if ((await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` })).items.length === 0) {
    log('no real node: skipped');
    return;
  }
  await createBenchPool(
    { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
    {
      name: pool,
      labels: { 'sandbox-bridge.io/bench': id },
      spec: {
        namespace: ns,
        maxBoxes: WARM + 4,
        box: {
          defaultImage: 'sandbox-bridge.local/box:dev',
          defaultCpu: '250m',
          defaultMemory: '256Mi',
          workspaceSizeLimit: `${Math.max(1024, Math.max(...SIZES) * 4)}Mi`,
          ...ON_REAL_NODE,
        },
        idle: { sleepAfterSeconds: SLEEP_AFTER_SECONDS },
        warm: { count: 0 },
      },
    },
  );
  const store = objectStoreEnv(ROOT, `bench-${id}`);
  const operator = start('dist/operator/main.js', {
    METRICS_PORT: String(await freePort()),
    METRICS_HOST: '127.0.0.1',
    LEASE_NAMESPACE: 'default',
    LEASE_NAME: `${pool}-lease`,
    POD_NAME: `${pool}-operator`,
    POOL_SELECTOR: `sandbox-bridge.io/bench=${id}`,
    ...store,
  });
  const port = await freePort();
  const bridge = start('dist/bridge/main.js', {
    BRIDGE_TOKEN: token,
    POOL_NAME: pool,
    SANDBOX_NAMESPACE: ns,
    PORT: String(port),
    METRICS_PORT: String(await freePort()),
    HOST: '127.0.0.1',
    ...store,
  });
  const url = `http://127.0.0.1:${port}`;
  const wakes: Wake[] = [];
  try {
    await waitUntil('the bridge to start', async () => (await fetch(`${url}/api/v1/health`, { headers: { authorization: `Bearer ${token}` } })).ok, 60_000);
    const client = createBridgeClient({ url, token, retries: 0, timeoutMs: 600_000 });
    for (const warmPool of [false, true]) {
      await setWarm(warmPool ? WARM : 0);
      for (const mib of SIZES) for (let round = 1; round <= ROUNDS; round++) wakes.push(await oneWake(client, mib, warmPool, round));
    }
  } finally {
    bridge.kill('SIGTERM');
    operator.kill('SIGTERM');
    log('cleaning up');
    await custom.deleteClusterCustomObject({ group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name: pool }).catch(() => undefined);
    await core.deleteNamespace({ name: ns }).catch(() => undefined);
    await kc.makeApiClient(k8s.CoordinationV1Api).deleteNamespacedLease({ name: `${pool}-lease`, namespace: 'default' }).catch(() => undefined);
  }
  report(wakes);
}

function report(wakes: Wake[]): void {
  const rows: string[][] = [];
  const groups: Record<string, unknown> = {};
  for (const mib of SIZES) {
    for (const warmPool of [false, true]) {
      const these = wakes.filter((w) => w.mib === mib && w.warmPool === warmPool);
      if (!these.length) continue;
      const ms = these.map((w) => w.ms);
      const p50 = percentile(ms, 50);
      const p99 = percentile(ms, 99);
      groups[`${mib}MiB-${warmPool ? 'warm' : 'cold'}`] = { n: these.length, p50, p99, servedWarm: these.filter((w) => w.servedWarm).length };
      rows.push([
        `${mib} MiB workspace, warm pool ${warmPool ? `on (${WARM})` : 'off'}`,
        String(these.length),
        `${(p50 / 1000).toFixed(2)} s / ${(p99 / 1000).toFixed(2)} s`,
        String(these.filter((w) => w.servedWarm).length),
        mib === 10 && warmPool ? '<= 1.5 s p50' : '',
      ]);
    }
  }
  const results = { date: new Date().toISOString(), node: process.version, cores: cpus().length, sleepAfterSeconds: SLEEP_AFTER_SECONDS, warm: WARM, groups, wakes };
  const table = [
    '| call to a sleeping box -> answered | n | p50 / p99 | woken into a warm pod | target |',
    '|---|---|---|---|---|',
    ...rows.map((r) => `| ${r.join(' | ')} |`),
  ].join('\n');
  const md =
    `# Wake bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}; \`npm run bench:wake\` ` +
    `(BENCH_WAKE_MIB=${SIZES.join(',')}, BENCH_WAKE_ROUNDS=${ROUNDS}, BENCH_WAKE_WARM=${WARM}); boxes of 250m / 256Mi on the real node (runc), ` +
    `incompressible workspaces, the local cluster's versitygw on loopback, operator and bridge as their own processes.\n\n${table}\n`;
  writeResults(ROOT, 'wake', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
