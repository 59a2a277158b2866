// Bench: how many 404s per second one bridge replica answers for boxes that are gone, and what
// those answers cost the API server (#20: a box the bridge knows is gone answers from memory; at
// most one API read per miss, no LISTs on the request path).
//
//   npm run bench:not-found   (BENCH_404_RUNS=3 BENCH_404_SECONDS=10 BENCH_404_CONCURRENCY=8
//                              BENCH_404_BOXES=10)
//
// Two bridge replicas, each its own process, on one pool whose boxes go to the local cluster's
// simulated nodes (no boxd is needed to be deleted). The measured replica (A) reaches the API
// server through an API proxy of its own (bench/api-requests.ts) that counts what it asks, and
// its rate limit is raised out of the way. BENCH_404_BOXES boxes are created and deleted through
// A, as many through the other replica (B); then, in each run, a client polls all of those box ids
// through A as fast as BENCH_404_CONCURRENCY requests in flight allow for BENCH_404_SECONDS,
// alternating GET /boxes/{id}/status and POST /boxes/{id}/exec: answers per second, their
// latency, A's CPU per answer, and every API request A made meanwhile. Runs are BENCH_404_GAP
// seconds apart (longer than the bridge remembers a gone box, 5 s), so each starts with nothing
// remembered; A's requests over one such gap, with no client, are its cost at rest.
// Results: bench/results/not-found.md and .json.
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { createBridgeClient } from '../client/index.js';
import { CountingProxy, calls, named, tally, toObject, verbResource } from './api-requests.js';
import { startProgram, type Program } from './programs.js';
import { writeResults } from './results-file.js';
import { BOXD_IMAGE, createBenchPool, deletePool, ensureCluster, objectStoreEnv, percentile } from './setup.js';

const ROOT = process.cwd();
const RUNS = Number(process.env.BENCH_404_RUNS ?? 3);
const SECONDS = Number(process.env.BENCH_404_SECONDS ?? 10);
const CONCURRENCY = Number(process.env.BENCH_404_CONCURRENCY ?? 8);
const BOXES = Number(process.env.BENCH_404_BOXES ?? 10);
const GAP_SECONDS = Number(process.env.BENCH_404_GAP ?? 8);
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const pool = `bench-404-${id}`;
const ns = `${pool}-boxes`;
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');

ensureCluster(ROOT, KUBECONFIG, []);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const log = (msg: string) => process.stderr.write(`[bench:not-found] ${msg}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** CPU seconds (user + system) a process has used so far. */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime in clock ticks (USER_HZ 100)
}

interface Run {
  answers: number;
  perSecond: number;
  byStatus: Record<string, number>;
  p50Ms: number;
  p99Ms: number;
  byRoute: Record<string, { n: number; p50Ms: number; p99Ms: number }>;
  cpuMsPerAnswer: number;
  /** What replica A asked the API server meanwhile (not watches), and its watches. */
  apiCalls: number;
  apiWatches: number;
  apiByVerb: Record<string, number>;
  /** Record reads per box id polled, for ids deleted through A and through B. */
  readsPerId: { deletedHere: number; deletedElsewhere: number };
}

async function oneRun(url: string, pid: number, proxy: CountingProxy, here: string[], elsewhere: string[]): Promise<Run> {
  const ids = [...here, ...elsewhere];
  const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };
  const samples: Array<{ route: string; status: number; ms: number }> = [];
  const mark = proxy.mark();
  const cpu0 = cpuSeconds(pid);
  const started = performance.now();
  const deadline = started + SECONDS * 1000;
  let next = 0;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < deadline) {
        const n = next++;
        const box = ids[n % ids.length]!;
        const exec = Math.floor(n / ids.length) % 2 === 1;
        const t0 = performance.now();
        const res = exec
          ? await fetch(`${url}/api/v1/boxes/${box}/exec`, { method: 'POST', headers, body: JSON.stringify({ command: 'true' }) })
          : await fetch(`${url}/api/v1/boxes/${box}/status`, { headers });
        await res.arrayBuffer();
        samples.push({ route: exec ? 'POST /boxes/{id}/exec' : 'GET /boxes/{id}/status', status: res.status, ms: performance.now() - t0 });
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const cpu = cpuSeconds(pid) - cpu0;
  const made = proxy.since(mark);
  const madeCalls = calls(made);
  const byStatus: Record<string, number> = {};
  for (const s of samples) byStatus[s.status] = (byStatus[s.status] ?? 0) + 1;
  const byRoute: Run['byRoute'] = {};
  for (const route of new Set(samples.map((s) => s.route))) {
    const ms = samples.filter((s) => s.route === route).map((s) => s.ms);
    byRoute[route] = { n: ms.length, p50Ms: percentile(ms, 50), p99Ms: percentile(ms, 99) };
  }
  const reads = (group: string[]) => madeCalls.filter((r) => verbResource(r) === 'GET secrets' && group.includes(named(r) ?? '')).length / group.length;
  const ms = samples.map((s) => s.ms);
  return {
    answers: samples.length,
    perSecond: samples.length / seconds,
    byStatus,
    p50Ms: percentile(ms, 50),
    p99Ms: percentile(ms, 99),
    byRoute,
    cpuMsPerAnswer: (cpu * 1000) / samples.length,
    apiCalls: madeCalls.length,
    apiWatches: made.length - madeCalls.length,
    apiByVerb: toObject(tally(made)),
    readsPerId: { deletedHere: reads(here), deletedElsewhere: reads(elsewhere) },
  };
}

async function main(): Promise<void> {
  const load = loadavg().map((l) => l.toFixed(2)).join(' ');
  await createBenchPool(
    { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
    {
      name: pool,
      labels: { 'sandbox-bridge.io/bench': id },
      spec: {
        namespace: ns,
        maxBoxes: BOXES * 4,
        box: { defaultImage: 'sandbox-bridge.local/box:dev', defaultCpu: '100m', defaultMemory: '64Mi', nodeSelector: { type: 'kwok' } },
      },
    },
  );
  const store = objectStoreEnv(ROOT, `bench-${id}`);
  const env = { BRIDGE_TOKEN: token, BOXD_KEY: boxdKey, BOXD_IMAGE, POOL_NAME: pool, SANDBOX_NAMESPACE: ns, ...store };
  const proxy = new CountingProxy(kc);
  await proxy.start();
  const programs: Program[] = [];
  const runs: Run[] = [];
  let atRest: { calls: number; watches: number; byVerb: Record<string, number> } | undefined;
  try {
    const a = await startProgram(ROOT, 'dist/bridge/main.js', proxy.kubeconfigFile(), { ...env, RATE_LIMIT_RPS: '1000000', RATE_LIMIT_BURST: '1000000' });
    programs.push(a);
    const b = await startProgram(ROOT, 'dist/bridge/main.js', KUBECONFIG, env);
    programs.push(b);
    const url = `http://127.0.0.1:${a.port}`;
    const made = async (program: Program, prefix: string) => {
      const client = createBridgeClient({ url: `http://127.0.0.1:${program.port}`, token, retries: 2 });
      const ids: string[] = [];
      for (let i = 0; i < BOXES; i++) {
        const box = await client.createBox({ sessionId: `${prefix}-${i}` });
        await client.deleteBox(box.box_id);
        ids.push(box.box_id);
      }
      return ids;
    };
    const here = await made(a, 'here');
    const elsewhere = await made(b, 'elsewhere');
    log(`${here.length} boxes deleted through the measured replica, ${elsewhere.length} through the other`);
    await sleep(GAP_SECONDS * 1000); // the deletes have reached every watch, and A remembers none of the ids
    const rest = proxy.mark();
    const restFor = Math.max(GAP_SECONDS, SECONDS);
    await sleep(restFor * 1000);
    const idle = proxy.since(rest);
    atRest = { calls: calls(idle).length, watches: idle.length - calls(idle).length, byVerb: toObject(tally(idle)) };
    log(`at rest for ${restFor} s: ${atRest.calls} API requests`);
    for (let i = 0; i < RUNS; i++) {
      const run = await oneRun(url, a.child.pid!, proxy, here, elsewhere);
      runs.push(run);
      log(`run ${i + 1}: ${run.answers} answers (${run.perSecond.toFixed(0)}/s), ${run.apiCalls} API requests`);
      if (i < RUNS - 1) await sleep(GAP_SECONDS * 1000);
    }
    report(runs, atRest, restFor, load);
  } finally {
    await Promise.all(programs.map((p) => p.stop()));
    await proxy.stop();
    log('cleaning up');
    await deletePool(custom, pool);
    await core.deleteNamespace({ name: ns }).catch(() => undefined);
  }
}

function report(runs: Run[], atRest: { calls: number; byVerb: Record<string, number> }, restSeconds: number, load: string): void {
  const median = (values: number[]) => percentile(values, 50);
  const med = (fn: (r: Run) => number) => median(runs.map(fn));
  const row = (label: string, fn: (r: Run) => string, m: string) => `| ${label} | ${runs.map(fn).join(' | ')} | ${m} |`;
  const ms = (n: number) => `${n.toFixed(2)} ms`;
  const routes = Object.keys(runs[0]?.byRoute ?? {});
  const verbs = [...new Set(runs.flatMap((r) => Object.keys(r.apiByVerb)).concat(Object.keys(atRest.byVerb)))].sort();
  const table = [
    `| measure | ${runs.map((_, i) => `run ${i + 1}`).join(' | ')} | median |`,
    `|---|${runs.map(() => '---|').join('')}---|`,
    row('answers (by status)', (r) => `${r.answers} (${Object.entries(r.byStatus).map(([s, n]) => `${s}: ${n}`).join(', ')})`, String(med((r) => r.answers))),
    row('**404s per second, one replica**', (r) => r.perSecond.toFixed(0), `**${med((r) => r.perSecond).toFixed(0)}**`),
    row('latency p50 / p99', (r) => `${ms(r.p50Ms)} / ${ms(r.p99Ms)}`, `${ms(med((r) => r.p50Ms))} / ${ms(med((r) => r.p99Ms))}`),
    ...routes.map((route) => row(`… ${route} p50 / p99`, (r) => `${ms(r.byRoute[route]!.p50Ms)} / ${ms(r.byRoute[route]!.p99Ms)}`, `${ms(med((r) => r.byRoute[route]!.p50Ms))} / ${ms(med((r) => r.byRoute[route]!.p99Ms))}`)),
    row('replica CPU per answer', (r) => ms(r.cpuMsPerAnswer), ms(med((r) => r.cpuMsPerAnswer))),
    row('**API requests the replica made meanwhile** (not watches)', (r) => String(r.apiCalls), `**${med((r) => r.apiCalls)}**`),
    row('… per 1,000 answers', (r) => ((r.apiCalls * 1000) / r.answers).toFixed(2), med((r) => (r.apiCalls * 1000) / r.answers).toFixed(2)),
    row('… record GETs per box id, ids deleted through this replica / through the other', (r) => `${r.readsPerId.deletedHere.toFixed(1)} / ${r.readsPerId.deletedElsewhere.toFixed(1)}`, `${med((r) => r.readsPerId.deletedHere).toFixed(1)} / ${med((r) => r.readsPerId.deletedElsewhere).toFixed(1)}`),
    ...verbs.map((v) => row(`… ${v}`, (r) => String(r.apiByVerb[v] ?? 0), String(med((r) => r.apiByVerb[v] ?? 0)))),
    `| the same replica at rest, ${restSeconds} s without a client (not watches) | ${atRest.calls} (${Object.entries(atRest.byVerb).map(([k, n]) => `${k}: ${n}`).join(', ') || 'none'}) |${runs.slice(1).map(() => ' |').join('')} |`,
  ].join('\n');
  const results = {
    date: new Date().toISOString(),
    node: process.version,
    cores: cpus().length,
    loadavg: `${load} -> ${loadavg().map((l) => l.toFixed(2)).join(' ')}`,
    runs: RUNS,
    seconds: SECONDS,
    concurrency: CONCURRENCY,
    boxIds: BOXES * 2,
    atRest: { seconds: restSeconds, ...atRest },
    results: runs,
  };
  const md =
    `# Not-found bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}, load average ${results.loadavg}; \`npm run bench:not-found\` ` +
    `(BENCH_404_RUNS=${RUNS}, BENCH_404_SECONDS=${SECONDS}, BENCH_404_CONCURRENCY=${CONCURRENCY}, BENCH_404_BOXES=${BOXES}). ` +
    `One bridge replica (its own process, behind an API proxy that counts its requests, rate limit raised) polled by one client ` +
    `with ${CONCURRENCY} requests in flight for ${SECONDS} s per run, alternating GET /boxes/{id}/status and POST /boxes/{id}/exec ` +
    `over ${BOXES * 2} deleted box ids (${BOXES} deleted through this replica, ${BOXES} through another one); runs ${GAP_SECONDS} s apart, ` +
    `so each starts with no id remembered. Client and bridge share the machine's cores.\n\n${table}\n`;
  writeResults(ROOT, 'not-found', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
