// Bench: a box ready for its first command, warm against cold.
//
//   npm run bench:warm   (part of npm run bench; BENCH_WARM=20 BENCH_WARM_SERIAL=30
//                         BENCH_COLD_SERIAL=10 BENCH_WARM_BURSTS=3 BENCH_COLD_BURSTS=1)
//
// On the local cluster's real node, with the operator keeping BENCH_WARM warm boxes and two
// bridge replicas (each its own process), side by side in one run:
// 1. Serial: create -> first exec (`true`) answered, one box at a time, through the replicas in
//    turn, each once the pool is refilled (no pod starting on the node); warm (the pool's default
//    shape) and cold (another memory size: never served warm).
// 2. Bursts: BENCH_WARM parallel creates (each followed by its first exec) through both replicas,
//    warm and cold; every request's latency.
// 3. Claims per second: the bursts' creates alone, over their wall time; errors counted.
// Results go to bench/results/warm-pool.md and .json.
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import type { BridgeClient } from '../client/index.js';
import { POOL_API_VERSION, POOL_GROUP, POOL_KIND, POOL_PLURAL, POOL_VERSION } from '../common/pool.js';
import { writeResults } from './results-file.js';
import {
  REAL_NODE_LABEL,
  createAndExec,
  ensureCluster,
  kubectl,
  percentile,
  startBenchBridge,
  startBenchOperator,
  stats,
  waitUntil,
  warmBenchPoolSpec,
  warmReady as warmReadyIn,
} from './setup.js';

const ROOT = process.cwd();
const WARM = Number(process.env.BENCH_WARM ?? 20);
const WARM_SERIAL = Number(process.env.BENCH_WARM_SERIAL ?? 30);
const COLD_SERIAL = Number(process.env.BENCH_COLD_SERIAL ?? 10);
const WARM_BURSTS = Number(process.env.BENCH_WARM_BURSTS ?? 3);
const COLD_BURSTS = Number(process.env.BENCH_COLD_BURSTS ?? 1);
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const pool = `bench-warm-${id}`;
const ns = `${pool}-boxes`;
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');
const WARM_MEMORY = 48;
const COLD_MEMORY = 49;

ensureCluster(ROOT, KUBECONFIG, []);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const log = (msg: string) => process.stderr.write(`[bench:warm] ${msg}\n`);

const ms = (v: number) => `${v.toFixed(0)} ms`;

const startBridge = () => startBenchBridge(ROOT, KUBECONFIG, { token, boxdKey, pool, namespace: ns });

const warmReady = () => warmReadyIn(core, ns, pool);

/**
 * When this process first saw each pod scheduled, with an IP (sandbox and network up, as the
 * kubelet reports it) and with its box container running, from a watch: where a cold start's
 * time goes, at the watch's resolution (milliseconds; the pods' own timestamps have seconds).
 */
function watchPodMilestones(): { seen: Map<string, { scheduled?: number; ip?: number; running?: number }>; stop: () => void } {
  const seen = new Map<string, { scheduled?: number; ip?: number; running?: number }>();
  let request: { abort: () => void } | undefined;
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
    .then((r) => (request = r as { abort: () => void }));
  return { seen, stop: () => request?.abort() };
}

async function main() {
  const results: Record<string, unknown> = { date: new Date().toISOString(), node: process.version, cores: (await import('node:os')).cpus().length, warm: WARM };
  const rows: Array<[string, string, string]> = [];
  if ((await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` })).items.length === 0) {
    log('no real node: skipped');
    return;
  }
  kubectl(ROOT, KUBECONFIG, 'apply', '--server-side', '--force-conflicts', '--field-manager=sandbox-bridge-bench', '-f', join(ROOT, 'charts/sandbox-bridge/crds/sandboxpools.sandbox-bridge.io.yaml'));
  kubectl(ROOT, KUBECONFIG, 'wait', '--for=condition=Established', 'crd/sandboxpools.sandbox-bridge.io', '--timeout=30s');
  const operator = await startBenchOperator(ROOT, KUBECONFIG, { pool, id, boxdKey });
  const bridges: Array<{ child: ChildProcess; client: BridgeClient }> = [];
  try {
    await custom.createClusterCustomObject({
      group: POOL_GROUP,
      version: POOL_VERSION,
      plural: POOL_PLURAL,
      body: {
        apiVersion: POOL_API_VERSION,
        kind: POOL_KIND,
        metadata: { name: pool, labels: { 'sandbox-bridge.io/bench': id } },
        spec: warmBenchPoolSpec({ namespace: ns, warm: WARM, memoryMi: WARM_MEMORY }),
      },
    });
    bridges.push(await startBridge(), await startBridge());
    const replica = (i: number) => bridges[i % 2]!.client;
    log(`waiting for ${WARM} warm boxes`);
    await waitUntil(`${WARM} warm boxes`, async () => (await warmReady()) >= WARM, 300_000);

    // 1. serial
    const serial = { warm: [] as number[], warmCreate: [] as number[], cold: [] as number[], coldCreate: [] as number[], warmMisses: 0 };
    const milestones = watchPodMilestones();
    const coldSteps = { scheduled: [] as number[], ip: [] as number[], running: [] as number[], answered: [] as number[] };
    for (let i = 0; i < WARM_SERIAL + COLD_SERIAL; i++) {
      const cold = i % Math.ceil((WARM_SERIAL + COLD_SERIAL) / COLD_SERIAL) === 0 && serial.cold.length < COLD_SERIAL;
      // Serial claims are measured on a quiet node: the pool refilled (no pod starting) before
      // each, so the figure is the claim path's, not the cost of the refill racing it on 2 cores.
      await waitUntil('the pool refilled', async () => (await warmReady()) >= WARM, 300_000);
      const r = await createAndExec(replica(i), `serial-${i}`, cold ? COLD_MEMORY : WARM_MEMORY);
      if (cold) {
        serial.cold.push(r.total);
        serial.coldCreate.push(r.create);
        const m = milestones.seen.get(r.boxId);
        if (m?.scheduled !== undefined && m.ip !== undefined && m.running !== undefined) {
          coldSteps.scheduled.push(m.scheduled - r.t0);
          coldSteps.ip.push(m.ip - m.scheduled);
          coldSteps.running.push(m.running - m.ip);
          coldSteps.answered.push(r.t0 + r.total - m.running);
        }
      } else if (r.warm) {
        serial.warm.push(r.total);
        serial.warmCreate.push(r.create);
      } else serial.warmMisses++;
      await replica(i + 1).deleteBox(r.boxId);
    }
    milestones.stop();
    results.coldSteps = {
      createToScheduled: stats(coldSteps.scheduled),
      scheduledToIp: stats(coldSteps.ip),
      ipToRunning: stats(coldSteps.running),
      runningToFirstExec: stats(coldSteps.answered),
    };
    results.serial = {
      warm: stats(serial.warm),
      warmCreate: stats(serial.warmCreate),
      cold: stats(serial.cold),
      coldCreate: stats(serial.coldCreate),
      warmMisses: serial.warmMisses,
    };
    log(`serial: warm p50 ${ms(percentile(serial.warm, 50))}, cold p50 ${ms(percentile(serial.cold, 50))}`);

    // 2. bursts (3. claims per second from the same runs)
    const burst = async (memory: number, label: string) => {
      const t0 = performance.now();
      const createdAt: number[] = [];
      const outcomes = await Promise.allSettled(
        Array.from({ length: WARM }, async (_, i) => {
          const r = await createAndExec(replica(i), `${label}-${i}-${randomBytes(2).toString('hex')}`, memory);
          createdAt.push(performance.now() - t0);
          return r;
        }),
      );
      const ok = outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : []));
      const errors = outcomes.filter((o) => o.status === 'rejected').map((o) => String((o as PromiseRejectedResult).reason).slice(0, 200));
      await Promise.all(ok.map((r, i) => replica(i).deleteBox(r.boxId).catch(() => undefined)));
      return { ok, errors, claimsWallMs: Math.max(...ok.map((r) => r.create)), createdAt };
    };
    const bursts = { warm: [] as number[], warmCreate: [] as number[], cold: [] as number[], warmErrors: [] as string[], coldErrors: [] as string[], warmMisses: 0, claimRates: [] as number[] };
    for (let b = 0; b < WARM_BURSTS; b++) {
      await waitUntil(`${WARM} warm boxes`, async () => (await warmReady()) >= WARM, 300_000);
      const r = await burst(WARM_MEMORY, `wburst${b}`);
      bursts.warm.push(...r.ok.filter((x) => x.warm).map((x) => x.total));
      bursts.warmCreate.push(...r.ok.filter((x) => x.warm).map((x) => x.create));
      bursts.warmMisses += r.ok.filter((x) => !x.warm).length;
      bursts.warmErrors.push(...r.errors);
      bursts.claimRates.push((r.ok.length / r.claimsWallMs) * 1000);
      log(`warm burst ${b + 1}: p50 ${ms(percentile(r.ok.map((x) => x.total), 50))}, ${r.errors.length} errors`);
    }
    for (let b = 0; b < COLD_BURSTS; b++) {
      await waitUntil(`${WARM} warm boxes`, async () => (await warmReady()) >= WARM, 300_000);
      const r = await burst(COLD_MEMORY, `cburst${b}`);
      bursts.cold.push(...r.ok.map((x) => x.total));
      bursts.coldErrors.push(...r.errors);
      log(`cold burst ${b + 1}: p50 ${ms(percentile(r.ok.map((x) => x.total), 50))}, ${r.errors.length} errors`);
    }
    results.bursts = {
      warm: stats(bursts.warm),
      warmCreate: stats(bursts.warmCreate),
      cold: stats(bursts.cold),
      warmMisses: bursts.warmMisses,
      warmErrors: bursts.warmErrors,
      coldErrors: bursts.coldErrors,
      claimsPerSecond: bursts.claimRates,
    };

    const s = results.serial as Record<'warm' | 'warmCreate' | 'cold' | 'coldCreate', ReturnType<typeof stats>>;
    const wb = stats(bursts.warm);
    const cb = stats(bursts.cold);
    rows.push([`serial, warm (n=${s.warm.n}): create -> first exec answered, p50 / p99`, `${ms(s.warm.p50)} / ${ms(s.warm.p99)}`, '<= 50 ms p50']);
    rows.push([`serial, cold (n=${s.cold.n}): create -> first exec answered, p50 / p99`, `${ms(s.cold.p50)} / ${ms(s.cold.p99)}`, '<= 1 s p50']);
    rows.push(['serial: of which POST /boxes alone, warm / cold (p50)', `${ms(s.warmCreate.p50)} / ${ms(s.coldCreate.p50)}`, '']);
    const cs = results.coldSteps as Record<string, ReturnType<typeof stats>>;
    rows.push([
      'serial, cold, where the time goes (p50, as this process\'s pod watch saw it): create -> scheduled / -> pod IP (sandbox, network) / -> box container running (init container, start) / -> first exec answered',
      `${ms(cs.createToScheduled!.p50)} / ${ms(cs.scheduledToIp!.p50)} / ${ms(cs.ipToRunning!.p50)} / ${ms(cs.runningToFirstExec!.p50)}`,
      '',
    ]);
    rows.push(['serial: cold / warm (p50)', `${(s.cold.p50 / s.warm.p50).toFixed(1)}x`, '']);
    rows.push([`bursts of ${WARM}, 2 replicas, warm (n=${wb.n}): create -> first exec, p50 / p99`, `${ms(wb.p50)} / ${ms(wb.p99)}`, '<= 50 ms p50, <= 150 ms p99']);
    rows.push([`bursts of ${WARM}, 2 replicas, cold (n=${cb.n}): create -> first exec, p50 / p99`, `${ms(cb.p50)} / ${ms(cb.p99)}`, '']);
    rows.push([`claims per second, 2 replicas (bursts of ${WARM}, creates alone over their wall time)`, bursts.claimRates.map((r) => r.toFixed(0)).join(', '), '>= 100/s']);
    rows.push(['errors (warm bursts / cold bursts); warm creates served cold', `${bursts.warmErrors.length} / ${bursts.coldErrors.length}; ${bursts.warmMisses + serial.warmMisses}`, '0']);
  } finally {
    for (const b of bridges) b.child.kill('SIGTERM');
    log('cleaning up');
    await custom.deleteClusterCustomObject({ group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name: pool }).catch(() => undefined);
    await core.deleteNamespace({ name: ns }).catch(() => undefined);
    await kc.makeApiClient(k8s.CoordinationV1Api).deleteNamespacedLease({ name: `${pool}-lease`, namespace: 'default' }).catch(() => undefined);
    operator.kill('SIGTERM');
  }

  const table = ['| measure | value | target |', '|---|---|---|', ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
  const md =
    `# Warm pool bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}; \`npm run bench:warm\`; ` +
    `${WARM} warm boxes kept by the operator, two bridge replicas (own processes), boxes on the real node (runc).\n\n${table}\n`;
  writeResults(ROOT, 'warm-pool', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
