// Bench: how long a call to a sleeping box waits for it to wake.
//
//   npm run bench:wake   (part of npm run bench; BENCH_WAKE_MIB=10,100 BENCH_WAKE_ROUNDS=5
//                         BENCH_WAKE_WARM=2 BENCH_WAKE_MODES=cold,warm
//                         BENCH_WAKE_BASELINE=<a built checkout>)
//
// On the local cluster's real node, with its object store (versitygw on loopback), side by side
// in one run: for each workspace size (of incompressible data, so the archive is as large as the
// data) and with the warm pool off, then on, BENCH_WAKE_ROUNDS boxes are created with the
// workspace, left to sleep (the pool's idle time is 2 s), and then called: the wake latency is
// `exec true` sent -> answered (a new or warm pod, the workspace restored, then the command). The
// data is checked after each wake (not timed). With the warm pool on, each wake starts once the
// pool is refilled, so it measures the wake path and not a refill racing it on 2 cores.
//
// Sleeps are the operator's (docs/lifecycle.md: its leader decides them, operator/idle-sleep.ts),
// wakes the bridge's (bridge/services/box-connector.ts), each its own process. The operator has
// what idle sleep needs: the object store settings, BOXD_IMAGE and BOXD_KEY (the bridge's) and
// SNAPSHOT_ENCRYPTION_KEY (the bridge's, so the bridge can open the env the operator sealed). It
// reaches the API server through an API proxy (bench/api-requests.ts) that counts, per sleep, the
// requests naming the box's record or pod; the bridge talks to the API server directly, so the
// wake latency has no proxy in it. Also reported: how long after its last call each box was
// Sleeping, and the operator's own count of sleeps by outcome. The previous run's figures (the
// bench/results/wake.json found at start) are shown beside this run's.
//
// BENCH_WAKE_BASELINE: a second checkout, built (its dist/), whose operator and bridge run beside
// this one's with a pool of their own (the same boxd image, store and node); every round is taken
// by both, alternating which goes first, so both see the same machine. BENCH_WAKE_MODES limits
// the run to the warm pool off (cold) or on (warm).
// Results: bench/results/wake.md and .json; snapshots and objects are removed afterwards.
import { existsSync, readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { cpus, loadavg } from 'node:os';
import { join, resolve } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { createBridgeClient, type BridgeClient } from '../client/index.js';
import { LABELS } from '../common/labels.js';
import { ObjectStore, ObjectStoreConfigSchema } from '../common/object-store.js';
import { POOL_GROUP, POOL_PLURAL, POOL_VERSION } from '../common/pool.js';
import { CountingProxy, calls, named, verbResource } from './api-requests.js';
import { metric, startProgram, type Program } from './programs.js';
import { writeResults } from './results-file.js';
import { BOXD_IMAGE, createBenchPool, deletePool, ensureCluster, objectStoreEnv, ON_REAL_NODE, percentile, REAL_NODE_LABEL, waitUntil, warmReady } from './setup.js';

const ROOT = process.cwd();
const SIZES = (process.env.BENCH_WAKE_MIB ?? '10,100').split(',').map(Number);
const ROUNDS = Number(process.env.BENCH_WAKE_ROUNDS ?? 5);
const WARM = Number(process.env.BENCH_WAKE_WARM ?? 2);
const MODES = (process.env.BENCH_WAKE_MODES ?? 'cold,warm').split(',').map((m) => {
  if (m !== 'cold' && m !== 'warm') throw new Error(`BENCH_WAKE_MODES: cold or warm, not ${m}`);
  return m === 'warm';
});
const SLEEP_AFTER_SECONDS = 2;
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');
const previous = readPrevious();

ensureCluster(ROOT, KUBECONFIG, []);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const log = (msg: string) => process.stderr.write(`[bench:wake] ${msg}\n`);

/** A build under test: its operator and bridge, with a pool and namespace of their own. */
interface Variant {
  name: string;
  root: string;
  pool: string;
  ns: string;
  label: string;
  client?: BridgeClient;
  operator?: Program;
  bridge?: Program;
}

const variants: Variant[] = [{ name: 'this build', root: ROOT, pool: `bench-wake-${id}`, ns: `bench-wake-${id}-boxes`, label: id }];
if (process.env.BENCH_WAKE_BASELINE) {
  const root = resolve(process.env.BENCH_WAKE_BASELINE);
  for (const f of ['dist/bridge/main.js', 'dist/operator/main.js']) {
    if (!existsSync(join(root, f))) throw new Error(`BENCH_WAKE_BASELINE: ${root}/${f} is missing (build that checkout first)`);
  }
  variants.unshift({ name: 'baseline', root, pool: `bench-wake-${id}-b`, ns: `bench-wake-${id}-b-boxes`, label: `${id}-b` });
}

const warmPods = async (v: Variant) =>
  (await core.listNamespacedPod({ namespace: v.ns, labelSelector: `${LABELS.warm}=${v.pool}` })).items.filter((p) => !p.metadata?.deletionTimestamp);

async function setWarm(v: Variant, count: number): Promise<void> {
  await custom.patchClusterCustomObject(
    { group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name: v.pool, body: { spec: { warm: { count } } } },
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
  );
  await waitUntil(`${count} warm boxes`, async () => (count ? (await warmReady(core, v.ns, v.pool)) >= count : (await warmPods(v)).length === 0), 300_000);
}

/** The figures of the run before this one (bench/results/wake.json as found), to show beside ours. */
function readPrevious(): { date: string; groups: Record<string, { p50: number; p99: number }> } | undefined {
  const path = join(ROOT, 'bench/results/wake.json');
  if (!existsSync(path)) return undefined;
  try {
    const json = JSON.parse(readFileSync(path, 'utf8')) as { date?: string; groups?: Record<string, { p50: number; p99: number }> };
    return json.date && json.groups ? { date: json.date, groups: json.groups } : undefined;
  } catch {
    return undefined;
  }
}

interface Wake {
  variant: string;
  mib: number;
  warmPool: boolean;
  ms: number;
  servedWarm: boolean;
  /** The box's last call answered -> its status Sleeping (the idle time, then the operator's sleep). */
  toSleepMs: number;
  /** The operator's API requests naming the box's record or pod while it put the box to sleep, by verb and resource. */
  sleepRequests: Record<string, number>;
  /** The pod the box slept from was still terminating when the call went out. */
  oldPodTerminating: boolean;
  /** The machine's 1-minute load average when the call went out (the machine is shared). */
  load1: number;
}

async function oneWake(v: Variant, proxy: CountingProxy, mib: number, warmPool: boolean, round: number): Promise<Wake> {
  const client = v.client!;
  const { ns, pool } = v;
  const box = await client.createBox({ sessionId: `wake-${mib}-${warmPool ? 'warm' : 'cold'}-${round}` });
  const made = await client.exec(box.box_id, { command: `head -c ${mib * 1048576} /dev/urandom > data.bin && sha256sum data.bin | cut -c1-64`, timeoutMs: 300_000 });
  if (made.exit_code !== 0) throw new Error(`writing the workspace: exit ${made.exit_code} ${made.stderr}`);
  const lastCall = performance.now();
  const podName = (await client.status(box.box_id)).pod_name;
  const mark = proxy.mark();
  // Status reads do not count as activity, so polling does not keep the box awake.
  await waitUntil(`box ${box.box_id} to sleep`, async () => (await client.status(box.box_id)).status === 'Sleeping', 120_000, 100);
  const toSleepMs = performance.now() - lastCall;
  const sleepRequests: Record<string, number> = {};
  for (const r of calls(proxy.since(mark))) {
    if (named(r) !== box.box_id && named(r) !== podName) continue;
    sleepRequests[verbResource(r)] = (sleepRequests[verbResource(r)] ?? 0) + 1;
  }
  if (warmPool) await waitUntil(`${WARM} warm boxes`, async () => (await warmReady(core, ns, pool)) >= WARM, 300_000);
  // Not timed: whether the pod the box slept from is still terminating as the call goes out
  // (a new pod named after the box waits for it to be gone).
  const oldPodTerminating = Boolean((await core.readNamespacedPod({ name: podName, namespace: ns }).catch(() => undefined))?.metadata?.deletionTimestamp);
  const load1 = loadavg()[0]!;
  const t0 = performance.now();
  const answered = await client.exec(box.box_id, { command: 'true' });
  const ms = performance.now() - t0;
  if (answered.exit_code !== 0) throw new Error(`the call after the wake exited ${answered.exit_code}`);
  const check = await client.exec(box.box_id, { command: 'sha256sum data.bin | cut -c1-64' });
  if (check.stdout !== made.stdout) throw new Error(`${box.box_id}: the workspace differs after the wake`);
  const servedWarm = (await client.status(box.box_id)).pod_name.startsWith('box-warm-');
  await client.deleteBox(box.box_id);
  log(
    `${v.name}: ${mib} MiB, warm pool ${warmPool ? 'on' : 'off'}, round ${round}: asleep after ${(toSleepMs / 1000).toFixed(1)} s, woken in ${ms.toFixed(0)} ms ` +
      `(${servedWarm ? 'warm pod' : 'new pod'}${oldPodTerminating ? ', the old pod still terminating' : ''})`,
  );
  return { variant: v.name, mib, warmPool, ms, servedWarm, toSleepMs, sleepRequests, oldPodTerminating, load1 };
}

async function main() {
  if ((await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` })).items.length === 0) {
    log('no real node: skipped');
    return;
  }
  const load = loadavg().map((l) => l.toFixed(2)).join(' ');
  // The same store, boxd key and seal key for every program.
  const store = objectStoreEnv(ROOT, `bench-${id}`);
  const shared = { BOXD_IMAGE, BOXD_KEY: boxdKey, ...store };
  const proxy = new CountingProxy(kc);
  await proxy.start();
  const wakes: Wake[] = [];
  const sleeps: Record<string, Record<string, number>> = {};
  try {
    for (const v of variants) {
      await createBenchPool(
        { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
        {
          name: v.pool,
          labels: { 'sandbox-bridge.io/bench': v.label },
          spec: {
            namespace: v.ns,
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
      v.operator = await startProgram(v.root, 'dist/operator/main.js', proxy.kubeconfigFile(), {
        ...shared,
        LEASE_NAMESPACE: 'default',
        LEASE_NAME: `${v.pool}-lease`,
        POD_NAME: `${v.pool}-operator`,
        POOL_SELECTOR: `sandbox-bridge.io/bench=${v.label}`,
      });
      v.bridge = await startProgram(v.root, 'dist/bridge/main.js', KUBECONFIG, { ...shared, BRIDGE_TOKEN: token, POOL_NAME: v.pool, SANDBOX_NAMESPACE: v.ns });
      v.client = createBridgeClient({ url: `http://127.0.0.1:${v.bridge.port}`, token, retries: 0, timeoutMs: 600_000 });
    }
    for (const warmPool of MODES) {
      for (const v of variants) await setWarm(v, warmPool ? WARM : 0);
      for (const mib of SIZES) {
        for (let round = 1; round <= ROUNDS; round++) {
          for (const v of round % 2 ? variants : [...variants].reverse()) wakes.push(await oneWake(v, proxy, mib, warmPool, round));
        }
      }
    }
    for (const v of variants) {
      const counts: Record<string, number> = {};
      for (const outcome of ['slept', 'active', 'busy', 'too_large', 'error']) {
        const n = (await metric(v.operator!, 'sandbox_operator_sleeps_total', { outcome })) ?? 0;
        if (n > 0) counts[outcome] = n;
      }
      sleeps[v.name] = counts;
    }
  } catch (err) {
    for (const v of variants) {
      if (v.operator) log(`last output of the ${v.name} operator:\n${v.operator.lines.slice(-15).join('\n')}`);
      if (v.bridge) log(`last output of the ${v.name} bridge:\n${v.bridge.lines.slice(-15).join('\n')}`);
    }
    throw err;
  } finally {
    await Promise.all(variants.flatMap((v) => [v.operator?.stop(), v.bridge?.stop()]));
    await proxy.stop();
    log('cleaning up');
    for (const v of variants) {
      await deletePool(custom, v.pool);
      await core.deleteNamespace({ name: v.ns }).catch(() => undefined);
      await kc.makeApiClient(k8s.CoordinationV1Api).deleteNamespacedLease({ name: `${v.pool}-lease`, namespace: 'default' }).catch(() => undefined);
      await core.deleteCollectionNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${v.pool}` }).catch(() => undefined);
    }
    await removeSnapshots(store).catch((err: unknown) => log(`could not remove the bench's snapshots: ${String(err)}`));
  }
  report(wakes, sleeps, `${load} -> ${loadavg().map((l) => l.toFixed(2)).join(' ')}`);
}

/** Deletes every object the bench's runs left under its store prefix (sleep snapshots). */
async function removeSnapshots(env: Record<string, string>): Promise<void> {
  const store = new ObjectStore(ObjectStoreConfigSchema.parse(env));
  try {
    const keys: string[] = [];
    for await (const o of store.list(`${store.prefix}/`)) keys.push(o.key);
    await store.delete(keys);
  } finally {
    store.close();
  }
}

function report(wakes: Wake[], sleeps: Record<string, Record<string, number>>, load: string): void {
  const s = (ms: number) => `${(ms / 1000).toFixed(2)} s`;
  const rows: string[][] = [];
  const groups: Record<string, { n: number; p50: number; p99: number; servedWarm: number; oldPodTerminating: number; toSleepP50: number }> = {};
  const byVariant: Record<string, typeof groups> = {};
  for (const mib of SIZES) {
    for (const warmPool of MODES) {
      for (const v of variants) {
        const these = wakes.filter((w) => w.variant === v.name && w.mib === mib && w.warmPool === warmPool);
        if (!these.length) continue;
        const key = `${mib}MiB-${warmPool ? 'warm' : 'cold'}`;
        const ms = these.map((w) => w.ms);
        const p50 = percentile(ms, 50);
        const p99 = percentile(ms, 99);
        const toSleepP50 = percentile(these.map((w) => w.toSleepMs), 50);
        const group = { n: these.length, p50, p99, servedWarm: these.filter((w) => w.servedWarm).length, oldPodTerminating: these.filter((w) => w.oldPodTerminating).length, toSleepP50 };
        (byVariant[v.name] ??= {})[key] = group;
        if (v.root === ROOT) groups[key] = group;
        const before = v.root === ROOT ? previous?.groups[key] : undefined;
        rows.push([
          `${mib} MiB workspace, warm pool ${warmPool ? `on (${WARM})` : 'off'}`,
          v.name,
          String(these.length),
          `**${s(p50)}** / ${s(p99)}`,
          before ? `${s(before.p50)} / ${s(before.p99)}` : '',
          String(group.servedWarm),
          String(group.oldPodTerminating),
          s(toSleepP50),
          percentile(these.map((w) => w.load1), 50).toFixed(1),
          mib === 10 && warmPool ? '<= 0.4 s p50' : mib === 100 && warmPool ? '<= 0.6 s p50' : '',
        ]);
      }
    }
  }
  // The operator's requests per sleep (each naming the box's record or pod), over every sleep of this build.
  const ours = wakes.filter((w) => variants.find((v) => v.name === w.variant)?.root === ROOT);
  const perSleep: Record<string, number> = {};
  for (const w of ours) for (const [k, n] of Object.entries(w.sleepRequests)) perSleep[k] = (perSleep[k] ?? 0) + n / ours.length;
  const perSleepTotal = Object.values(perSleep).reduce((a, b) => a + b, 0);
  const results = {
    date: new Date().toISOString(),
    node: process.version,
    cores: cpus().length,
    loadavg: load,
    sleepAfterSeconds: SLEEP_AFTER_SECONDS,
    warm: WARM,
    variants: variants.map((v) => ({ name: v.name, root: v.root })),
    groups,
    byVariant,
    previous,
    operatorSleeps: sleeps,
    operatorRequestsPerSleep: perSleep,
    wakes,
  };
  const table = [
    `| call to a sleeping box -> answered | build | n | p50 / p99 | previous run p50 / p99 | woken into a warm pod | old pod still terminating at the call | last call -> Sleeping, p50 | load average (1 min) at the calls, median | target |`,
    '|---|---|---|---|---|---|---|---|---|---|',
    ...rows.map((r) => `| ${r.join(' | ')} |`),
  ].join('\n');
  const md =
    `# Wake bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}, load average ${load}; \`npm run bench:wake\` ` +
    `(BENCH_WAKE_MIB=${SIZES.join(',')}, BENCH_WAKE_ROUNDS=${ROUNDS}, BENCH_WAKE_WARM=${WARM}, BENCH_WAKE_MODES=${MODES.map((w) => (w ? 'warm' : 'cold')).join(',')}` +
    `${variants.length > 1 ? `, BENCH_WAKE_BASELINE=${variants[0]!.root}` : ''}); boxes of 250m / 256Mi on the real node (runc), ` +
    `incompressible workspaces, the local cluster's versitygw on loopback; the operator (its own process) puts boxes to sleep after ` +
    `${SLEEP_AFTER_SECONDS} s idle, the bridge (its own process) wakes them${variants.length > 1 ? '; the builds alternate round by round, each with its own operator, bridge and pool' : ''}. ` +
    `Previous run: ${previous ? previous.date : 'none found'}.\n\n${table}\n\n` +
    `Sleeps counted by the operators (sandbox_operator_sleeps_total): ${Object.entries(sleeps).map(([v, c]) => `${v}: ${Object.entries(c).map(([o, n]) => `${o} ${n}`).join(', ') || 'none'}`).join('; ')}. ` +
    `This build's API requests per sleep, naming the box's record or pod (mean over ${ours.length} sleeps, through an API proxy): ` +
    `${perSleepTotal.toFixed(1)} (${Object.entries(perSleep).sort(([a], [b]) => a.localeCompare(b)).map(([k, n]) => `${k} ${n.toFixed(1)}`).join(', ')}).\n`;
  writeResults(ROOT, 'wake', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
