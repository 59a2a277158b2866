// Bench: one bridge replica's memory under an output flood.
//
//   npm run bench:memory   (BENCH_MEMORY_EXECS=20 BENCH_MEMORY_MIB=10 BENCH_MEMORY_ROUNDS=3;
//                           BENCH_MEMORY_BUDGET=<bytes> sets the bridge's TRANSFER_BUDGET_BYTES)
//
// On the local cluster's real node, one bridge as its own process (so its RSS is its own), one
// box: each round sends BENCH_MEMORY_EXECS concurrent plain execs (answered whole, JSON), each
// writing BENCH_MEMORY_MIB of random bytes to stdout and as much to stderr (random bytes are the
// worst case for the JSON answer: invalid UTF-8 and control characters), and samples the
// bridge's RSS every 50 ms. Reported per round: peak RSS (sampled, and the kernel's VmHWM),
// answers by status, how many 200s were truncated, the answer sizes, and the bridge's budget
// refusals. Results: bench/results/memory.md and .json.
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { load } from 'js-yaml';
import { writeResults } from './results-file.js';
import { BOXD_IMAGE, createBenchPool, deletePool, ensureCluster, freePort, ON_REAL_NODE, percentile, REAL_NODE_LABEL, startProgram, waitUntil } from './setup.js';

const ROOT = process.cwd();
const EXECS = Number(process.env.BENCH_MEMORY_EXECS ?? 20);
const MIB = Number(process.env.BENCH_MEMORY_MIB ?? 10);
const ROUNDS = Number(process.env.BENCH_MEMORY_ROUNDS ?? 3);
const BUDGET = process.env.BENCH_MEMORY_BUDGET;
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const pool = `bench-memory-${id}`;
const ns = `${pool}-boxes`;
const token = randomBytes(24).toString('hex');

ensureCluster(ROOT, KUBECONFIG, []);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const log = (msg: string) => process.stderr.write(`[bench:memory] ${msg}\n`);

/** The chart's default bridge memory limit (values.yaml resources.limits.memory), as written there. */
function chartMemoryLimit(): string {
  const values = load(readFileSync(join(ROOT, 'charts/sandbox-bridge/values.yaml'), 'utf8')) as { resources: { limits: { memory: string } } };
  return values.resources.limits.memory;
}

/** VmRSS and VmHWM of a process, in MiB. */
function memoryOf(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(status)![1]);
  return { rss: kib('VmRSS') / 1024, peak: kib('VmHWM') / 1024 };
}

interface Answer {
  status: number;
  truncated: boolean;
  bytes: number;
  ms: number;
}

/** One plain exec, its answer read as a stream (only its size and its last bytes are kept). */
async function execOnce(url: string, box: string, command: string): Promise<Answer> {
  const t0 = performance.now();
  const res = await fetch(`${url}/api/v1/boxes/${box}/exec`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ command, timeoutMs: 300_000 }),
  });
  let bytes = 0;
  let tail = '';
  const decoder = new TextDecoder();
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    bytes += chunk.length;
    tail = (tail + decoder.decode(chunk, { stream: true })).slice(-200);
  }
  return { status: res.status, truncated: /"(stdout|stderr)_truncated":true/.test(tail), bytes, ms: performance.now() - t0 };
}

/** A counter of the bridge's /metrics, summed over its labels. */
async function metric(metricsUrl: string, name: string): Promise<number> {
  const text = await (await fetch(`${metricsUrl}/metrics`)).text();
  return text
    .split('\n')
    .filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `))
    .reduce((sum, l) => sum + Number(l.split(' ').pop()), 0);
}

interface Round {
  round: number;
  baselineMiB: number;
  peakSampledMiB: number;
  vmHwmMiB: number;
  statuses: Record<string, number>;
  truncated: number;
  answerBytes: { min: number; max: number };
  p50Ms: number;
  wallMs: number;
  budgetRefusals: number;
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
        maxBoxes: 4,
        maxExecsPerBox: EXECS,
        box: { defaultImage: 'sandbox-bridge.local/box:dev', defaultCpu: '1', defaultMemory: '256Mi', ...ON_REAL_NODE },
      },
    },
  );
  const [port, metricsPort] = [await freePort(), await freePort()];
  const bridge = startProgram(ROOT, KUBECONFIG, 'dist/bridge/main.js', {
    BOXD_IMAGE,
    BOXD_KEY: randomBytes(32).toString('hex'),
    BRIDGE_TOKEN: token,
    POOL_NAME: pool,
    SANDBOX_NAMESPACE: ns,
    PORT: String(port),
    METRICS_PORT: String(metricsPort),
    HOST: '127.0.0.1',
    ...(BUDGET ? { TRANSFER_BUDGET_BYTES: BUDGET } : {}),
  });
  const url = `http://127.0.0.1:${port}`;
  const metricsUrl = `http://127.0.0.1:${metricsPort}`;
  const rounds: Round[] = [];
  let budgetBytes = 0;
  try {
    await waitUntil('the bridge to start', async () => (await fetch(`${metricsUrl}/readyz`)).ok, 60_000);
    budgetBytes = await metric(metricsUrl, 'sandbox_bridge_memory_budget_bytes');
    const created = await fetch(`${url}/api/v1/boxes`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ sessionId: `bench-memory-${id}` }),
    });
    if (created.status !== 201) throw new Error(`create: ${created.status} ${await created.text()}`);
    const box = ((await created.json()) as { box_id: string }).box_id;
    const warm = await execOnce(url, box, 'true');
    if (warm.status !== 200) throw new Error(`first exec: ${warm.status}`);
    const bytes = MIB * 1024 * 1024;
    const command = `head -c ${bytes} /dev/urandom; head -c ${bytes} /dev/urandom >&2`;
    for (let round = 1; round <= ROUNDS; round++) {
      const refusedBefore = await metric(metricsUrl, 'sandbox_bridge_memory_budget_refusals_total');
      const baseline = memoryOf(bridge.pid!).rss;
      const samples: number[] = [];
      const sampler = setInterval(() => samples.push(memoryOf(bridge.pid!).rss), 50);
      const t0 = performance.now();
      const answers = await Promise.all(Array.from({ length: EXECS }, () => execOnce(url, box, command)));
      const wallMs = performance.now() - t0;
      clearInterval(sampler);
      const statuses: Record<string, number> = {};
      for (const a of answers) statuses[a.status] = (statuses[a.status] ?? 0) + 1;
      const r: Round = {
        round,
        baselineMiB: baseline,
        peakSampledMiB: Math.max(baseline, ...samples),
        vmHwmMiB: memoryOf(bridge.pid!).peak,
        statuses,
        truncated: answers.filter((a) => a.status === 200 && a.truncated).length,
        answerBytes: { min: Math.min(...answers.map((a) => a.bytes)), max: Math.max(...answers.map((a) => a.bytes)) },
        p50Ms: percentile(
          answers.map((a) => a.ms),
          50,
        ),
        wallMs,
        budgetRefusals: (await metric(metricsUrl, 'sandbox_bridge_memory_budget_refusals_total')) - refusedBefore,
      };
      rounds.push(r);
      log(
        `round ${round}: peak RSS ${r.peakSampledMiB.toFixed(0)} MiB (VmHWM ${r.vmHwmMiB.toFixed(0)}), from ${baseline.toFixed(0)}; ` +
          `${JSON.stringify(statuses)}, ${r.truncated} truncated, ${(wallMs / 1000).toFixed(1)} s`,
      );
      await new Promise((resolve) => setTimeout(resolve, 2000)); // let the collector catch up between rounds
    }
  } finally {
    bridge.kill('SIGTERM');
    log('cleaning up');
    await deletePool(custom, pool);
    await core.deleteNamespace({ name: ns }).catch(() => undefined);
  }
  report(rounds, budgetBytes);
}

function report(rounds: Round[], budgetBytes: number): void {
  const fmt = (s: Record<string, number>) =>
    Object.entries(s)
      .map(([status, n]) => `${n} x ${status}`)
      .join(', ');
  const rows = rounds.map((r) =>
    [
      String(r.round),
      `${r.baselineMiB.toFixed(0)} MiB`,
      `${r.peakSampledMiB.toFixed(0)} MiB`,
      `${r.vmHwmMiB.toFixed(0)} MiB`,
      fmt(r.statuses),
      String(r.truncated),
      `${(r.answerBytes.min / 1e6).toFixed(1)}-${(r.answerBytes.max / 1e6).toFixed(1)} MB`,
      `${(r.p50Ms / 1000).toFixed(1)} s / ${(r.wallMs / 1000).toFixed(1)} s`,
    ].join(' | '),
  );
  const peaks = rounds.map((r) => r.peakSampledMiB);
  const results = {
    date: new Date().toISOString(),
    node: process.version,
    cores: cpus().length,
    execs: EXECS,
    mibPerStream: MIB,
    budgetBytes,
    medianPeakMiB: percentile(peaks, 50),
    maxPeakMiB: Math.max(...peaks),
    rounds,
  };
  const table = [
    '| round | RSS before | peak RSS (sampled) | VmHWM | answers | 200s truncated | answer sizes | call p50 / round |',
    '|---|---|---|---|---|---|---|---|',
    ...rows.map((r) => `| ${r} |`),
  ].join('\n');
  const md =
    `# Memory bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}; \`npm run bench:memory\` ` +
    `(BENCH_MEMORY_EXECS=${EXECS}, BENCH_MEMORY_MIB=${MIB}, BENCH_MEMORY_ROUNDS=${ROUNDS}); one bridge process (memory budget ` +
    `${(budgetBytes / 1048576).toFixed(0)} MiB${BUDGET ? '' : ', the default'}), one box of 1 core / 256Mi on the real node; each round ${EXECS} concurrent plain execs, ` +
    `each writing ${MIB} MiB of random bytes to stdout and ${MIB} MiB to stderr. The chart's bridge memory limit is ${chartMemoryLimit()}.\n\n` +
    `Peak RSS over the rounds: median ${results.medianPeakMiB.toFixed(0)} MiB, max ${results.maxPeakMiB.toFixed(0)} MiB.\n\n${table}\n`;
  writeResults(ROOT, 'memory', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
