// Bench: a box ready for its first command, warm against cold, and what a claim costs in API writes.
//
//   npm run bench:warm   (part of npm run bench; BENCH_WARM=20 BENCH_WARM_SERIAL=10
//                         BENCH_COLD_SERIAL=3 BENCH_ROUNDS=2 BENCH_CYCLES=5
//                         BENCH_BASELINE_ROOT=<a checkout whose dist/ is built>)
//
// On the local cluster's real node. With BENCH_BASELINE_ROOT, two sides side by side in one run:
// "baseline" (the programs of that checkout's dist/, e.g. a worktree of the commit before a
// change) and "change" (this checkout's dist/), each with its own pool, operator and bridge
// replicas (own processes), in alternating rounds (baseline, change, baseline, change, ...). Only
// the side being measured keeps warm boxes (the other's pool is scaled to 0), so both meet the
// same node. Without it, the change alone. Per round and side:
// 1. Serial: create -> first exec (`true`) answered, one box at a time, through the two replicas in
//    turn, each once the pool is refilled (no pod starting on the node): warm (the pool's default
//    shape), another memory size (a warm box resized in place where that exists, else a new pod),
//    and cold (another image: never served warm).
// 2. A burst of BENCH_WARM parallel creates (each followed by its first exec) through the two
//    replicas; every request's latency; claims per second (the creates alone over their wall time).
// 3. API writes per claim cycle: BENCH_CYCLES serial warm creates through a third replica and the
//    operator, both behind a counting API proxy (bench/api-requests.ts): the bridge's writes while
//    it answers the create (the claim), the operator's until the pool is refilled (the refill),
//    and both sides' for the box's delete. Leader-lease renewals are left out.
// The machine's load average is noted at every phase. Results go to bench/results/warm-pool.md and .json.
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import type { BridgeClient } from '../client/index.js';
import { LABELS } from '../common/labels.js';
import { POOL_GROUP, POOL_PLURAL, POOL_VERSION } from '../common/pool.js';
import { CountingProxy, calls, parsePath, tally, toObject, type ApiRequest } from './api-requests.js';
import { writeResults } from './results-file.js';
import { benchCluster, createAndExec, createPool, deletePool, installPoolCrd, percentile, REAL_NODE_LABEL, startBenchBridge, startBenchOperator, stats, waitUntil, warmBenchPoolSpec, warmReady as warmReadyIn } from './setup.js';

const ROOT = process.cwd();
const WARM = Number(process.env.BENCH_WARM ?? 20);
const WARM_SERIAL = Number(process.env.BENCH_WARM_SERIAL ?? 10);
const COLD_SERIAL = Number(process.env.BENCH_COLD_SERIAL ?? 3);
const RESIZE_SERIAL = Number(process.env.BENCH_RESIZE_SERIAL ?? 3);
/** Another image of the real node's (test/cluster/real-node/images.sh): no warm box serves it. */
const COLD_IMAGE = 'sandbox-bridge.local/box-tools:dev';
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 2);
const CYCLES = Number(process.env.BENCH_CYCLES ?? 5);
const BASELINE_ROOT = process.env.BENCH_BASELINE_ROOT;
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');
const WARM_MEMORY = 48;
const OTHER_MEMORY = 49;
const WRITE_METHODS = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);

const { kc, core, custom } = benchCluster(ROOT, KUBECONFIG);
const log = (msg: string) => process.stderr.write(`[bench:warm] ${msg}\n`);
const ms = (v: number) => `${v.toFixed(0)} ms`;
const load = () => loadavg()[0]!;
const sleep = (msOf: number) => new Promise((r) => setTimeout(r, msOf));

interface Replica {
  child: ChildProcess;
  client: BridgeClient;
}

interface Measured {
  serialWarm: number[];
  serialWarmCreate: number[];
  serialCold: number[];
  serialColdCreate: number[];
  /** Where each cold create's time went (ms): create -> scheduled, -> pod IP, -> box running, -> first exec answered. */
  coldSteps: { scheduled: number[]; ip: number[]; running: number[]; answered: number[] };
  /** Another memory size: resized in place where the side can, else a new pod. */
  serialOther: number[];
  serialOtherWarm: number;
  burst: number[];
  burstCreate: number[];
  claimRates: number[];
  warmMisses: number;
  errors: string[];
  /** Writes per claim cycle: the bridge's for the create, the operator's for the refill, both for the delete. */
  claimWrites: number[];
  refillWrites: number[];
  deleteWrites: number[];
  writeKinds: { claim: Record<string, number>; refill: Record<string, number>; delete: Record<string, number> } | undefined;
  loads: number[];
}

interface Side {
  name: 'baseline' | 'change';
  root: string;
  pool: string;
  ns: string;
  operator: ChildProcess;
  operatorProxy: CountingProxy;
  replicas: Replica[];
  counter: Replica;
  counterProxy: CountingProxy;
  m: Measured;
}

/** Non-watch writes, leader-lease renewals left out. */
function writes(requests: readonly ApiRequest[]): ApiRequest[] {
  return calls(requests).filter((r) => WRITE_METHODS.has(r.method) && parsePath(r.url).resource !== 'leases');
}

async function startSide(name: Side['name'], root: string): Promise<Side> {
  const pool = `bench-warm-${id}-${name === 'baseline' ? 'b' : 'c'}`;
  const ns = `${pool}-boxes`;
  const operatorProxy = new CountingProxy(kc);
  await operatorProxy.start();
  const operator = await startBenchOperator(root, operatorProxy.kubeconfigFile(), { pool, id: `${id}-${name}`, boxdKey });
  await createPool(custom, {
    name: pool,
    labels: { 'sandbox-bridge.io/bench': `${id}-${name}` },
    spec: { ...warmBenchPoolSpec({ namespace: ns, warm: WARM, memoryMi: WARM_MEMORY }), allowedImages: [COLD_IMAGE], warm: { count: 0 } },
  });
  const options = { token, boxdKey, pool, namespace: ns };
  const replicas = [await startBenchBridge(root, KUBECONFIG, options), await startBenchBridge(root, KUBECONFIG, options)];
  const counterProxy = new CountingProxy(kc);
  await counterProxy.start();
  const counter = await startBenchBridge(root, counterProxy.kubeconfigFile(), options);
  const m: Measured = {
    serialWarm: [],
    serialWarmCreate: [],
    serialCold: [],
    serialColdCreate: [],
    coldSteps: { scheduled: [], ip: [], running: [], answered: [] },
    serialOther: [],
    serialOtherWarm: 0,
    burst: [],
    burstCreate: [],
    claimRates: [],
    warmMisses: 0,
    errors: [],
    claimWrites: [],
    refillWrites: [],
    deleteWrites: [],
    writeKinds: undefined,
    loads: [],
  };
  return { name, root, pool, ns, operator, operatorProxy, replicas, counter, counterProxy, m };
}

async function setWarm(side: Side, count: number): Promise<void> {
  await custom.patchClusterCustomObject(
    { group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name: side.pool, body: { spec: { warm: { count } } } },
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
  );
}

const warmReady = (side: Side) => warmReadyIn(core, side.ns, side.pool);
const refilled = (side: Side) => waitUntil(`${side.name}: the pool refilled`, async () => (await warmReady(side)) >= WARM, 300_000);
const boxPodsGone = (side: Side) =>
  waitUntil(`${side.name}: boxes gone`, async () => (await core.listNamespacedPod({ namespace: side.ns, labelSelector: LABELS.boxId })).items.length === 0, 120_000);

/** Only this side keeps warm boxes: the other's go first, so both sides meet the same node. */
async function activate(side: Side, others: Side[]): Promise<void> {
  for (const o of others) {
    await setWarm(o, 0);
    await waitUntil(`${o.name}: its warm boxes gone`, async () => (await core.listNamespacedPod({ namespace: o.ns, labelSelector: `${LABELS.warm}=${o.pool}` })).items.length === 0, 120_000);
  }
  await setWarm(side, WARM);
  await refilled(side);
}

/**
 * When this process first saw each pod of a namespace scheduled, with an IP (sandbox and network
 * up, as the kubelet reports it) and with its box container running, from a watch: where a cold
 * start's time goes, at the watch's resolution (the pods' own timestamps have seconds).
 */
function watchPodMilestones(ns: string): { seen: Map<string, Milestones>; stop: () => void } {
  const seen = new Map<string, Milestones>();
  let request: { abort: () => void } | undefined;
  let stopped = false;
  void new k8s.Watch(kc)
    .watch(
      `/api/v1/namespaces/${ns}/pods`,
      {},
      (_type: string, pod: k8s.V1Pod) => {
        const name = pod.metadata?.name;
        if (!name) return;
        const now = performance.now();
        const m = seen.get(name) ?? {};
        if (m.scheduled === undefined && pod.spec?.nodeName) m.scheduled = now;
        if (m.ip === undefined && pod.status?.podIP) m.ip = now;
        if (m.running === undefined && pod.status?.containerStatuses?.some((c) => c.name === 'box' && c.state?.running)) m.running = now;
        seen.set(name, m);
      },
      () => undefined,
    )
    .then((r) => {
      request = r as { abort: () => void };
      if (stopped) request.abort();
    });
  return {
    seen,
    stop: () => {
      stopped = true;
      request?.abort();
    },
  };
}

interface Milestones {
  scheduled?: number;
  ip?: number;
  running?: number;
}

/** Create -> first exec (`true`) answered, in ms; the create alone; whether a warm pod served it. */
async function createAndExecAs(client: BridgeClient, session: string, memory: number, image?: string) {
  const t0 = performance.now();
  const box = await client.createBox({ sessionId: session, memory, ...(image ? { image } : {}) });
  const create = performance.now() - t0;
  const r = await client.exec(box.box_id, { command: 'true' });
  if (r.exit_code !== 0) throw new Error(`first exec exited ${r.exit_code}`);
  return { total: performance.now() - t0, create, boxId: box.box_id, warm: box.pod_name !== box.box_id, t0 };
}

async function serial(side: Side, round: number): Promise<void> {
  const replica = (i: number) => side.replicas[i % 2]!.client;
  const milestones = watchPodMilestones(side.ns);
  try {
    for (let i = 0; i < WARM_SERIAL + RESIZE_SERIAL + COLD_SERIAL; i++) {
      const kind = i < WARM_SERIAL ? 'warm' : i < WARM_SERIAL + RESIZE_SERIAL ? 'other' : 'cold';
      // On a quiet node: the pool refilled (no pod starting) before each, so the figure is the
      // claim path's, not the cost of the refill racing it on 2 cores.
      await refilled(side);
      side.m.loads.push(load());
      const session = `s${round}-${i}-${randomBytes(2).toString('hex')}`;
      const r = await createAndExecAs(replica(i), session, kind === 'other' ? OTHER_MEMORY : WARM_MEMORY, kind === 'cold' ? COLD_IMAGE : undefined);
      if (kind === 'cold') {
        side.m.serialCold.push(r.total);
        side.m.serialColdCreate.push(r.create);
        const m = milestones.seen.get(r.boxId);
        if (m?.scheduled !== undefined && m.ip !== undefined && m.running !== undefined) {
          side.m.coldSteps.scheduled.push(m.scheduled - r.t0);
          side.m.coldSteps.ip.push(m.ip - m.scheduled);
          side.m.coldSteps.running.push(m.running - m.ip);
          side.m.coldSteps.answered.push(r.t0 + r.total - m.running);
        }
      } else if (kind === 'other') {
        side.m.serialOther.push(r.total);
        if (r.warm) side.m.serialOtherWarm++;
      } else if (r.warm) {
        side.m.serialWarm.push(r.total);
        side.m.serialWarmCreate.push(r.create);
      } else side.m.warmMisses++;
      await replica(i + 1).deleteBox(r.boxId);
    }
  } finally {
    milestones.stop();
  }
}

async function burst(side: Side, round: number): Promise<void> {
  await refilled(side);
  // Every replica's watch must show them all before the burst.
  await sleep(1000);
  side.m.loads.push(load());
  const replica = (i: number) => side.replicas[i % 2]!.client;
  const outcomes = await Promise.allSettled(Array.from({ length: WARM }, (_, i) => createAndExec(replica(i), `b${round}-${i}-${randomBytes(2).toString('hex')}`, WARM_MEMORY)));
  const ok = outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : []));
  side.m.errors.push(...outcomes.filter((o) => o.status === 'rejected').map((o) => String((o as PromiseRejectedResult).reason).slice(0, 200)));
  side.m.burst.push(...ok.filter((x) => x.warm).map((x) => x.total));
  side.m.burstCreate.push(...ok.filter((x) => x.warm).map((x) => x.create));
  side.m.warmMisses += ok.filter((x) => !x.warm).length;
  if (ok.length) side.m.claimRates.push((ok.length / Math.max(...ok.map((r) => r.create))) * 1000);
  log(`${side.name} burst: p50 ${ms(percentile(ok.map((x) => x.total), 50))}, ${ok.filter((x) => !x.warm).length} cold, ${outcomes.length - ok.length} errors (load ${load().toFixed(1)})`);
  await Promise.all(ok.map((r, i) => replica(i).deleteBox(r.boxId).catch(() => undefined)));
  await boxPodsGone(side);
}

async function claimCycles(side: Side, round: number): Promise<void> {
  for (let c = 0; c < CYCLES; c++) {
    await refilled(side);
    await sleep(1500); // the refill's status writes settle
    side.m.loads.push(load());
    const b0 = side.counterProxy.mark();
    const o0 = side.operatorProxy.mark();
    const box = await side.counter.client.createBox({ sessionId: `w${round}-${c}-${randomBytes(2).toString('hex')}`, memory: WARM_MEMORY });
    const b1 = side.counterProxy.mark();
    if (box.pod_name === box.box_id) {
      side.m.warmMisses++;
      await side.counter.client.deleteBox(box.box_id);
      continue;
    }
    await refilled(side);
    await sleep(1500);
    const o1 = side.operatorProxy.mark();
    await side.counter.client.deleteBox(box.box_id);
    await boxPodsGone(side);
    await sleep(1500); // the reaper's and garbage collection's share of the delete
    const claim = writes(side.counterProxy.since(b0, b1));
    const refill = writes(side.operatorProxy.since(o0, o1));
    const del = [...writes(side.counterProxy.since(b1)), ...writes(side.operatorProxy.since(o1))];
    side.m.claimWrites.push(claim.length);
    side.m.refillWrites.push(refill.length);
    side.m.deleteWrites.push(del.length);
    side.m.writeKinds ??= { claim: toObject(tally(claim)), refill: toObject(tally(refill)), delete: toObject(tally(del)) };
  }
}

async function main() {
  const results: Record<string, unknown> = { date: new Date().toISOString(), node: process.version, cores: (await import('node:os')).cpus().length, warm: WARM, baselineRoot: BASELINE_ROOT ?? null };
  if ((await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` })).items.length === 0) {
    log('no real node: skipped');
    return;
  }
  installPoolCrd(ROOT, KUBECONFIG);
  const sides: Side[] = [];
  try {
    if (BASELINE_ROOT) sides.push(await startSide('baseline', BASELINE_ROOT));
    sides.push(await startSide('change', ROOT));
    for (let round = 0; round < ROUNDS; round++) {
      for (const side of sides) {
        log(`round ${round + 1}: ${side.name} (load ${load().toFixed(1)})`);
        await activate(side, sides.filter((s) => s !== side));
        await serial(side, round);
        await burst(side, round);
        await claimCycles(side, round);
      }
    }
  } finally {
    log('cleaning up');
    for (const s of sides) {
      for (const r of [...s.replicas, s.counter]) r.child.kill('SIGTERM');
      await deletePool(custom, s.pool);
      await core.deleteNamespace({ name: s.ns }).catch(() => undefined);
      await kc.makeApiClient(k8s.CoordinationV1Api).deleteNamespacedLease({ name: `${s.pool}-lease`, namespace: 'default' }).catch(() => undefined);
      s.operator.kill('SIGTERM');
      await s.counterProxy.stop();
      await s.operatorProxy.stop();
    }
  }

  const cols = sides.map((s) => s.name);
  const rows: Array<[string, ...string[]]> = [];
  const row = (what: string, f: (m: Measured) => string) => rows.push([what, ...sides.map((s) => f(s.m))]);
  const med = (v: number[]) => (v.length ? String(percentile(v, 50)) : '-');
  row('serial, warm: create -> first exec answered, p50 / p99 (n)', (m) => `${ms(percentile(m.serialWarm, 50))} / ${ms(percentile(m.serialWarm, 99))} (${m.serialWarm.length})`);
  row('serial, warm: POST /boxes alone, p50 / p99', (m) => `${ms(percentile(m.serialWarmCreate, 50))} / ${ms(percentile(m.serialWarmCreate, 99))}`);
  row(`serial, another memory size (${OTHER_MEMORY}Mi): create -> first exec answered, p50 (n; served warm, resized)`, (m) => `${ms(percentile(m.serialOther, 50))} (${m.serialOther.length}; ${m.serialOtherWarm})`);
  row('serial, cold (another image): create -> first exec answered, p50 (n)', (m) => `${ms(percentile(m.serialCold, 50))} (${m.serialCold.length})`);
  row('serial, cold: where the time goes, p50 (this process\'s pod watch): create -> scheduled / -> pod IP (sandbox, network) / -> box running (init container, start) / -> first exec answered', (m) =>
    [m.coldSteps.scheduled, m.coldSteps.ip, m.coldSteps.running, m.coldSteps.answered].map((v) => (v.length ? ms(percentile(v, 50)) : '-')).join(' / '),
  );
  row(`bursts of ${WARM} (2 replicas), warm: create -> first exec, p50 / p99 (n)`, (m) => `${ms(percentile(m.burst, 50))} / ${ms(percentile(m.burst, 99))} (${m.burst.length})`);
  row(`bursts of ${WARM}: POST /boxes alone, p50 / p99`, (m) => `${ms(percentile(m.burstCreate, 50))} / ${ms(percentile(m.burstCreate, 99))}`);
  row('claims per second (bursts: creates over their wall time)', (m) => m.claimRates.map((r) => r.toFixed(0)).join(', '));
  row('warm creates served cold; errors', (m) => `${m.warmMisses}; ${m.errors.length}`);
  row('API writes per claim cycle, median: claim (bridge, during POST /boxes)', (m) => med(m.claimWrites));
  row('API writes per claim cycle, median: refill (operator, until refilled)', (m) => med(m.refillWrites));
  row('API writes per claim cycle, median: delete (bridge and operator)', (m) => med(m.deleteWrites));
  row('load average (1 min) at the phases: min / median / max', (m) => `${Math.min(...m.loads).toFixed(1)} / ${percentile(m.loads, 50).toFixed(1)} / ${Math.max(...m.loads).toFixed(1)}`);
  for (const s of sides) {
    results[s.name] = {
      serialWarm: stats(s.m.serialWarm),
      serialWarmCreate: stats(s.m.serialWarmCreate),
      serialCold: stats(s.m.serialCold),
      serialColdCreate: stats(s.m.serialColdCreate),
      coldSteps: {
        createToScheduled: stats(s.m.coldSteps.scheduled),
        scheduledToIp: stats(s.m.coldSteps.ip),
        ipToRunning: stats(s.m.coldSteps.running),
        runningToFirstExec: stats(s.m.coldSteps.answered),
      },
      serialOtherSize: stats(s.m.serialOther),
      serialOtherSizeServedWarm: s.m.serialOtherWarm,
      burst: stats(s.m.burst),
      burstCreate: stats(s.m.burstCreate),
      claimsPerSecond: s.m.claimRates,
      warmMisses: s.m.warmMisses,
      errors: s.m.errors,
      writesPerCycle: { claim: s.m.claimWrites, refill: s.m.refillWrites, delete: s.m.deleteWrites, kinds: s.m.writeKinds },
      loads: s.m.loads,
    };
  }
  const table = [`| measure | ${cols.join(' | ')} |`, `|---|${cols.map(() => '---|').join('')}`, ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
  const kinds = sides
    .map((s) => `- ${s.name}: ${(['claim', 'refill', 'delete'] as const).map((k) => `${k} ${JSON.stringify(s.m.writeKinds?.[k] ?? {})}`).join('; ')}`)
    .join('\n');
  const md =
    `# Warm pool bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}; \`npm run bench:warm\`; ` +
    `${WARM} warm boxes kept by the operator, two bridge replicas (own processes) and a third behind a counting API proxy, ` +
    `boxes on the real node (runc); ${ROUNDS} alternating rounds${BASELINE_ROOT ? ' of baseline and change' : ''}.\n\n${table}\n\n` +
    `Writes of the first claim cycle, by verb and resource:\n\n${kinds}\n`;
  writeResults(ROOT, 'warm-pool', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
