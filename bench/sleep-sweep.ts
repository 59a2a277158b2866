// Bench: what one sleep pass of the operator costs the API server, with and without bridge
// replicas running (#19: O(boxes due), independent of the number of replicas).
//
//   npm run bench:sleep-sweep   (BENCH_SWEEP_BOXES=1000 BENCH_SWEEP_REPLICAS=0,3,0)
//
// On simulated nodes of the bench's own (kwok, created here: tainted and labelled for this bench
// only, so no other pod lands on them and deleting them afterwards touches nothing else), one
// pool with BENCH_SWEEP_BOXES boxes made through a bridge. "Idle" is what the operator decides
// on: a box whose last call (its pod's last-active, else its creation) is older than the pool's
// idle.sleepAfterSeconds. The boxes are made with idle sleep off; then sleepAfterSeconds is set
// and the bench waits until every box is older than that, so all of them are due at once.
//
// A pass, once per entry of BENCH_SWEEP_REPLICAS: that many bridge replicas are started (each its
// own process, watching the pool), then a fresh operator process (a fresh leader: no per-box
// backoff from an earlier pass); the pass is over when the operator has tried every box
// (sandbox_operator_sleeps_total). Every process reaches the API server through an API proxy
// of its own (bench/api-requests.ts), which counts what it asked. On kwok's pods boxd does not
// run (their IPs are loopback 127.64.x.x here, so the operator's first boxd call is refused at
// once): every sleep fails at boxd and the box keeps running. That is the decision's cost (the
// lease taken and released on the record, an Event on a box's first failure), not a sleep's
// snapshot and pod delete; see the notes of bench/results/sleep-sweep.md.
//
// Before each pass the bridges' own requests are counted over BENCH_SWEEP_IDLE_SECONDS with
// nothing happening (what a replica costs at rest). Afterwards the bench deletes its pool,
// namespace, leases, events and nodes. Results: bench/results/sleep-sweep.md and .json.
import { randomBytes } from 'node:crypto';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { createBridgeClient } from '../client/index.js';
import { ANNOTATIONS, BOX_SELECTOR, LABELS } from '../common/labels.js';
import { POOL_GROUP, POOL_PLURAL, POOL_VERSION } from '../common/pool.js';
import { CountingProxy, calls, parsePath, tally, toObject, verbResource, type ApiRequest } from './api-requests.js';
import { logEntries, metric, startProgram, type Program } from './programs.js';
import { writeResults } from './results-file.js';
import { BOXD_IMAGE, createBenchPool, deletePool, ensureCluster, objectStoreEnv, waitUntil } from './setup.js';

const ROOT = process.cwd();
const BOXES = Number(process.env.BENCH_SWEEP_BOXES ?? 1000);
const REPLICAS = (process.env.BENCH_SWEEP_REPLICAS ?? '0,3,0').split(',').map(Number);
const IDLE_SECONDS = Number(process.env.BENCH_SWEEP_IDLE_SECONDS ?? 10);
const CREATE_CONCURRENCY = Number(process.env.BENCH_SWEEP_CREATE_CONCURRENCY ?? 6);
const PODS_PER_NODE = 110;
const NODES = Math.ceil((BOXES * 1.1) / PODS_PER_NODE);
const SLEEP_AFTER_SECONDS = 30;
/** After the last box is tried, requests still counted into the pass (a trailing status write). */
const TRAILING_MS = 3000;
/** A pass with no box tried for this long is over (and reported as such). */
const STALL_SECONDS = Number(process.env.BENCH_SWEEP_STALL_SECONDS ?? 60);
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const pool = `bench-sweep-${id}`;
const ns = `${pool}-boxes`;
const leaseName = `${pool}-leader`;
const NODE_LABEL = 'sandbox-bridge.io/bench-node';
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');

ensureCluster(ROOT, KUBECONFIG, []);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const coordination = kc.makeApiClient(k8s.CoordinationV1Api);
const log = (msg: string) => process.stderr.write(`[bench:sleep-sweep] ${msg}\n`);
const store = objectStoreEnv(ROOT, `bench-${id}`);
const nodeNames = Array.from({ length: NODES }, (_, i) => `${pool}-node-${i}`);

// ---- the bench's simulated nodes ----

async function createNodes(): Promise<void> {
  for (const [i, name] of nodeNames.entries()) {
    // Pod addresses from a range of the bench's own, on loopback like the cluster's other simulated nodes.
    const cidr = `127.64.${200 + i}.0/24`;
    const resources = { cpu: '32', memory: '256Gi', pods: String(PODS_PER_NODE) };
    await core.createNode({
      body: {
        metadata: {
          name,
          annotations: { 'kwok.x-k8s.io/node': 'fake', 'node.alpha.kubernetes.io/ttl': '0', 'metrics.k8s.io/resource-metrics-path': `/metrics/nodes/${name}/metrics/resource` },
          labels: { 'kubernetes.io/hostname': name, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64', type: 'kwok-bench', [NODE_LABEL]: id },
        },
        spec: { podCIDR: cidr, podCIDRs: [cidr], taints: [{ key: NODE_LABEL, value: id, effect: 'NoSchedule' }] },
        status: {
          addresses: [{ address: '127.0.0.1', type: 'InternalIP' }],
          allocatable: resources,
          capacity: resources,
          nodeInfo: { architecture: 'amd64', operatingSystem: 'linux' } as k8s.V1NodeSystemInfo,
        },
      },
    });
  }
  await waitUntil(`${NODES} simulated nodes Ready`, async () => {
    const nodes = await core.listNode({ labelSelector: `${NODE_LABEL}=${id}` });
    return nodes.items.filter((n) => n.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')).length === NODES;
  }, 120_000, 500);
}

// ---- the boxes ----

async function createBoxes(bridge: Program): Promise<number> {
  const client = createBridgeClient({ url: `http://127.0.0.1:${bridge.port}`, token, retries: 3, timeoutMs: 60_000 });
  const started = performance.now();
  let next = 0;
  let made = 0;
  await Promise.all(
    Array.from({ length: CREATE_CONCURRENCY }, async () => {
      while (next < BOXES) {
        const i = next++;
        await client.createBox({ sessionId: `sweep-${i}` });
        if (++made % 200 === 0) log(`created ${made}/${BOXES} boxes (${((performance.now() - started) / 1000).toFixed(0)} s)`);
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  await waitUntil(`${BOXES} box pods running with an IP`, async () => (await runningBoxes()).length >= BOXES, 300_000, 1000);
  return seconds;
}

async function runningBoxes(): Promise<k8s.V1Pod[]> {
  const pods = await core.listNamespacedPod({ namespace: ns, labelSelector: BOX_SELECTOR });
  return pods.items.filter((p) => p.status?.phase === 'Running' && p.status.podIP && !p.metadata?.deletionTimestamp && !p.metadata?.labels?.[LABELS.warm]);
}

/** When the newest box was last active (its last-active annotation, else its creation). */
async function newestActivity(): Promise<number> {
  let newest = 0;
  for (const p of await runningBoxes()) {
    const stamped = Date.parse(p.metadata?.annotations?.[ANNOTATIONS.lastActive] ?? '');
    newest = Math.max(newest, Number.isFinite(stamped) ? stamped : new Date(p.metadata!.creationTimestamp!).getTime());
  }
  return newest;
}

async function setSleepAfter(seconds: number): Promise<void> {
  await custom.patchClusterCustomObject(
    { group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name: pool, body: { spec: { idle: { sleepAfterSeconds: seconds } } } },
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
  );
}

// ---- the programs ----

function bridgeEnv(): Record<string, string> {
  return {
    BRIDGE_TOKEN: token,
    BOXD_KEY: boxdKey,
    BOXD_IMAGE,
    POOL_NAME: pool,
    SANDBOX_NAMESPACE: ns,
    RATE_LIMIT_RPS: '100000',
    RATE_LIMIT_BURST: '100000',
    ...store,
  };
}

let operatorRuns = 0;
function startOperator(kubeconfig: string): Promise<Program> {
  return startProgram(ROOT, 'dist/operator/main.js', kubeconfig, {
    LEASE_NAMESPACE: 'default',
    LEASE_NAME: leaseName,
    POD_NAME: `${pool}-operator-${++operatorRuns}`,
    POOL_SELECTOR: `sandbox-bridge.io/bench=${id}`,
    WATCH_NAMESPACES: ns,
    LOG_LEVEL: process.env.BENCH_SWEEP_OPERATOR_LOG ?? 'warn',
    BOXD_IMAGE,
    BOXD_KEY: boxdKey,
    ...store,
  });
}

// ---- one pass ----

interface Counted {
  /** Requests other than watches (a watch is one long request). */
  calls: number;
  watches: number;
  byVerb: Record<string, number>;
  /** Requests the API server did not answer 2xx, by verb, resource and status. */
  refused: Record<string, number>;
}

interface Pass {
  replicas: number;
  boxesTried: number;
  outcomes: Record<string, number>;
  failures: Record<string, number>;
  /** Operator spawned -> its first lease taken (caches filled, leadership), and the pass: first lease taken -> last box tried. */
  startupSeconds: number;
  passSeconds: number;
  /** The operator's requests before its first lease (start-up), and from then to the end of the pass. */
  operatorStartup: Counted;
  operator: Counted;
  /** Per box due, in the pass. */
  perBox: { recordPatches: number; events: number; podReads: number; podDeletes: number; children: number; other: number };
  /** Each bridge replica over the pass (same window as the operator's). */
  bridges: Counted[];
  /** The bridges at rest before the pass (IDLE_SECONDS), per replica. */
  bridgesIdle: Counted[];
  leftInSleepState: number;
  /** The operator's 'watch failed; restarting' log lines in the pass, by cache and error. */
  operatorRelists: Record<string, number>;
}

function counted(requests: readonly ApiRequest[]): Counted {
  const c = calls(requests);
  const refused: Record<string, number> = {};
  for (const r of c) if (r.status < 200 || r.status > 299) refused[`${verbResource(r)} ${r.status || 'no answer'}`] = (refused[`${verbResource(r)} ${r.status || 'no answer'}`] ?? 0) + 1;
  return { calls: c.length, watches: requests.length - c.length, byVerb: toObject(tally(requests)), refused };
}

const CHILD_KINDS = ['namespaces', 'resourcequotas', 'limitranges', 'networkpolicies'];

async function pass(replicas: number): Promise<Pass> {
  const proxies: CountingProxy[] = [];
  const bridges: Program[] = [];
  let operator: Program | undefined;
  const opProxy = new CountingProxy(kc);
  try {
    for (let i = 0; i < replicas; i++) {
      const proxy = new CountingProxy(kc);
      await proxy.start();
      proxies.push(proxy);
      bridges.push(await startProgram(ROOT, 'dist/bridge/main.js', proxy.kubeconfigFile(), bridgeEnv()));
    }
    let bridgesIdle: Counted[] = [];
    if (replicas) {
      await new Promise((r) => setTimeout(r, 2000)); // start-up lists and watches done
      const idleFrom = proxies.map((p) => p.mark());
      await new Promise((r) => setTimeout(r, IDLE_SECONDS * 1000));
      bridgesIdle = proxies.map((p, i) => counted(p.since(idleFrom[i]!)));
    }
    await opProxy.start();
    const spawned = Date.now();
    operator = await startOperator(opProxy.kubeconfigFile());
    const op = operator;
    // Until every box was tried, or STALL_SECONDS pass without one more tried (then the pass is
    // reported as it stands: fewer boxes tried than due is a finding, not a bench failure).
    let seen = 0;
    let progressAt = Date.now();
    for (;;) {
      const n = (await metric(op, 'sandbox_operator_sleeps_total')) ?? 0;
      if (n >= BOXES) break;
      if (n > seen) [seen, progressAt] = [n, Date.now()];
      if (Date.now() - progressAt > STALL_SECONDS * 1000) {
        log(`  the operator tried ${n} of ${BOXES} boxes and no more for ${STALL_SECONDS} s: reporting the pass as it stands`);
        break;
      }
      await new Promise((r) => setTimeout(r, 250));
    }
    await new Promise((r) => setTimeout(r, TRAILING_MS));
    const ended = Date.now();
    const relists = logEntries(op).filter((e) => e.msg === 'watch failed; restarting');
    const outcomes: Record<string, number> = {};
    for (const outcome of ['slept', 'active', 'busy', 'too_large', 'error']) outcomes[outcome] = (await metric(op, 'sandbox_operator_sleeps_total', { outcome })) ?? 0;
    const inState = await core.listNamespacedSecret({ namespace: ns, labelSelector: LABELS.sleep });

    if (process.env.BENCH_SWEEP_OPERATOR_LOG) {
      // Diagnosis: the operator's own account of the pass, other than one line per box tried.
      for (const e of logEntries(op).filter((e) => !e.msg?.startsWith('idle sleep failed'))) {
        log(`  operator +${((Date.parse(e.time ?? '') - spawned) / 1000).toFixed(2)} s: ${e.msg} ${JSON.stringify({ kind: e.kind, err: e.err })}`);
      }
    }
    const tried = logEntries(op).filter((e) => e.msg?.startsWith('idle sleep failed'));
    const lastTried = tried.length ? Math.max(...tried.map((e) => Date.parse(e.time ?? '')).filter(Number.isFinite)) : ended - TRAILING_MS;
    const failures: Record<string, number> = {};
    for (const e of tried) {
      // The box differs per line; the reason does not.
      const reason = String(e.err ?? '?').replace(/box-[0-9a-z-]+/g, '<box>').replace(/\d+\.\d+\.\d+\.\d+(:\d+)?/g, '<pod IP>');
      failures[reason] = (failures[reason] ?? 0) + 1;
    }
    const all = opProxy.since(0);
    // No lease taken at all (no box tried): the whole run counts as the pass.
    const firstLease = all.find((r) => r.method === 'PATCH' && parsePath(r.url).resource === 'secrets')?.at ?? spawned;
    const inPass = (r: ApiRequest) => r.at >= firstLease && r.at <= ended;
    const opPass = all.filter(inPass);
    const boxesTried = Object.values(outcomes).reduce((a, b) => a + b, 0);
    const passCalls = calls(opPass);
    const per = (pred: (r: ApiRequest) => boolean) => passCalls.filter(pred).length / BOXES;
    const kindOf = (r: ApiRequest) => ({ verb: verbResource(r).split(' ')[0], resource: parsePath(r.url).resource });
    const isRecord = (r: ApiRequest) => kindOf(r).verb === 'PATCH' && kindOf(r).resource === 'secrets';
    const isEvent = (r: ApiRequest) => kindOf(r).verb === 'POST' && kindOf(r).resource === 'events';
    const isPodRead = (r: ApiRequest) => verbResource(r) === 'GET pods';
    const isPodDelete = (r: ApiRequest) => verbResource(r) === 'DELETE pods';
    const isChild = (r: ApiRequest) => kindOf(r).verb === 'PATCH' && CHILD_KINDS.includes(kindOf(r).resource);
    return {
      replicas,
      boxesTried,
      outcomes,
      failures,
      startupSeconds: (firstLease - spawned) / 1000,
      passSeconds: (lastTried - firstLease) / 1000,
      operatorStartup: counted(all.filter((r) => r.at < firstLease)),
      operator: counted(opPass),
      perBox: {
        recordPatches: per(isRecord),
        events: per(isEvent),
        podReads: per(isPodRead),
        podDeletes: per(isPodDelete),
        children: per(isChild),
        other: per((r) => ![isRecord, isEvent, isPodRead, isPodDelete, isChild].some((f) => f(r))),
      },
      bridges: proxies.map((p) => counted(p.since(0).filter(inPass))),
      bridgesIdle,
      leftInSleepState: inState.items.length,
      operatorRelists: relists.reduce<Record<string, number>>((acc, e) => {
        const k = `${String(e.informer)}: ${String(e.err)}`;
        acc[k] = (acc[k] ?? 0) + 1;
        return acc;
      }, {}),
    };
  } finally {
    await operator?.stop();
    await Promise.all(bridges.map((b) => b.stop()));
    await Promise.all([...proxies, opProxy].map((p) => p.stop()));
  }
}

// ---- cleanup ----

async function cleanup(): Promise<void> {
  log('cleaning up');
  await deletePool(custom, pool);
  await core.deleteNamespace({ name: ns }).catch(() => undefined);
  await waitUntil('the bench namespace to be gone', async () => {
    try {
      await core.readNamespace({ name: ns });
      return false;
    } catch (err) {
      return err instanceof k8s.ApiException && err.code === 404;
    }
  }, 300_000, 1000).catch((err: unknown) => log(String(err)));
  for (const name of nodeNames) {
    await core.deleteNode({ name }).catch(() => undefined);
    await coordination.deleteNamespacedLease({ name, namespace: 'kube-node-lease' }).catch(() => undefined);
  }
  await coordination.deleteNamespacedLease({ name: leaseName, namespace: 'default' }).catch(() => undefined);
  await core.deleteCollectionNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${pool}` }).catch(() => undefined);
}

// ---- main ----

async function main(): Promise<void> {
  const load = { start: loadavg().map((l) => l.toFixed(2)).join(' ') };
  const passes: Pass[] = [];
  let createSeconds = 0;
  try {
    log(`creating ${NODES} simulated nodes for ${BOXES} boxes`);
    await createNodes();
    await createBenchPool(
      { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
      {
        name: pool,
        labels: { 'sandbox-bridge.io/bench': id },
        spec: {
          namespace: ns,
          maxBoxes: BOXES * 2,
          defaultTtlSeconds: 4 * 3600,
          box: {
            defaultImage: 'sandbox-bridge.local/box:dev',
            defaultCpu: '100m',
            defaultMemory: '64Mi',
            nodeSelector: { [NODE_LABEL]: id },
            tolerations: [{ key: NODE_LABEL, operator: 'Exists', effect: 'NoSchedule' }],
          },
          idle: { sleepAfterSeconds: 0 },
          warm: { count: 0 },
        },
      },
    );
    // The pool's children (quota, policies) and the boxes, made as in an install: an operator
    // and a bridge, without proxies; idle sleep off meanwhile.
    const setupOperator = await startOperator(KUBECONFIG);
    const creator = await startProgram(ROOT, 'dist/bridge/main.js', KUBECONFIG, bridgeEnv());
    try {
      log(`creating ${BOXES} boxes through a bridge`);
      createSeconds = await createBoxes(creator);
      log(`${BOXES} boxes running after ${createSeconds.toFixed(0)} s`);
    } finally {
      await creator.stop();
      await setupOperator.stop();
    }
    await setSleepAfter(SLEEP_AFTER_SECONDS);
    const newest = await newestActivity();
    const wait = newest + SLEEP_AFTER_SECONDS * 1000 + 2000 - Date.now();
    if (wait > 0) {
      log(`waiting ${(wait / 1000).toFixed(0)} s until every box has been idle for ${SLEEP_AFTER_SECONDS} s`);
      await new Promise((r) => setTimeout(r, wait));
    }
    for (const replicas of REPLICAS) {
      log(`pass with ${replicas} bridge replica(s)`);
      const p = await pass(replicas);
      passes.push(p);
      log(
        `  ${p.boxesTried} of ${BOXES} boxes tried in ${p.passSeconds.toFixed(1)} s; operator ${p.operator.calls} requests in the pass (${(p.operator.calls / BOXES).toFixed(2)}/box), ` +
          `bridges ${p.bridges.map((b) => b.calls).join('+') || '-'}`,
      );
    }
  } finally {
    await cleanup();
  }
  load.start += ` -> ${loadavg().map((l) => l.toFixed(2)).join(' ')}`;
  report(passes, createSeconds, load.start);
}

function report(passes: Pass[], createSeconds: number, load: string): void {
  const f2 = (n: number) => n.toFixed(2);
  const name = (p: Pass, i: number) => `pass ${i + 1}: ${p.replicas} bridge replica${p.replicas === 1 ? '' : 's'}`;
  const bridgeCalls = (p: Pass) => p.bridges.reduce((a, b) => a + b.calls, 0);
  const total = (p: Pass) => p.operator.calls + bridgeCalls(p);
  const base = passes.find((p) => p.replicas === 0);
  const most = passes.reduce((a, p) => (p.replicas > a.replicas ? p : a), passes[0]!);
  const ratio = (fn: (p: Pass) => number) => (base && most !== base && fn(base) > 0 ? `${(fn(most) / fn(base)).toFixed(2)}x` : '');
  const row = (label: string, fn: (p: Pass) => string, r = '') => `| ${label} | ${passes.map(fn).join(' | ')} | ${r} |`;
  const summary = [
    `| measure | ${passes.map(name).join(' | ')} | ${most.replicas} / 0 replicas |`,
    `|---|${passes.map(() => '---|').join('')}---|`,
    row('boxes due / tried by the operator (outcome)', (p) => `${BOXES} / ${p.boxesTried} (${Object.entries(p.outcomes).filter(([, n]) => n).map(([o, n]) => `${o} ${n}`).join(', ')})`),
    row('operator start-up: spawned -> first lease taken', (p) => `${p.startupSeconds.toFixed(1)} s`),
    row('the pass: first lease taken -> last box tried', (p) => (p.boxesTried ? `${p.passSeconds.toFixed(1)} s (${(p.boxesTried / p.passSeconds).toFixed(0)} boxes/s)` : 'no box tried'), ratio((p) => p.passSeconds)),
    row('**operator API requests in the pass** (not watches)', (p) => `**${p.operator.calls}**`, ratio((p) => p.operator.calls)),
    row('… per box due', (p) => f2(p.operator.calls / BOXES), ratio((p) => p.operator.calls / BOXES)),
    row('… per box: record PATCH (lease take + release)', (p) => f2(p.perBox.recordPatches)),
    row('… per box: Event POST (first failure of the box)', (p) => f2(p.perBox.events)),
    row('… per box: pod GET / pod DELETE', (p) => `${f2(p.perBox.podReads)} / ${f2(p.perBox.podDeletes)}`),
    row('… per box: pool children re-applied (PATCH namespace, quota, limits, policy)', (p) => f2(p.perBox.children)),
    row('… per box: other (leader lease, pool status)', (p) => f2(p.perBox.other)),
    row('… answered other than 2xx', (p) => Object.entries(p.operator.refused).map(([k, n]) => `${k}: ${n}`).join(', ') || 'none'),
    row('operator start-up requests (lists, leader lease; not watches)', (p) => String(p.operatorStartup.calls)),
    row('**bridge API requests in the pass**, all replicas (not watches)', (p) => (p.replicas ? `**${bridgeCalls(p)}** (${p.bridges.map((b) => b.calls).join(' + ')})` : '-')),
    row('**all processes: API requests in the pass per box due**', (p) => `**${f2(total(p) / BOXES)}**`, ratio((p) => total(p) / BOXES)),
    row('records left in a sleep state after the pass', (p) => String(p.leftInSleepState)),
    row("operator log: 'watch failed; restarting' in the pass", (p) => Object.entries(p.operatorRelists).map(([k, n]) => `${n}x ${k}`).join('; ') || 'none'),
  ].join('\n');

  const keys = new Set<string>();
  for (const p of passes) {
    for (const c of [p.operatorStartup, p.operator, ...p.bridges]) for (const k of Object.keys(c.byVerb)) keys.add(k);
  }
  const byVerbCols = passes.flatMap((p, i) => [`${i + 1}: operator start-up`, `${i + 1}: operator pass`, ...(p.replicas ? [`${i + 1}: bridges in the pass (${p.replicas} summed)`] : [])]);
  const cell = (c: Counted, k: string) => String(c.byVerb[k] ?? 0);
  const byVerb = [
    `| request (pass number: process) | ${byVerbCols.join(' | ')} |`,
    `|---|${byVerbCols.map(() => '---|').join('')}`,
    ...[...keys].sort().map(
      (k) =>
        `| ${k} | ${passes
          .flatMap((p) => [cell(p.operatorStartup, k), cell(p.operator, k), ...(p.replicas ? [String(p.bridges.reduce((a, b) => a + (b.byVerb[k] ?? 0), 0))] : [])])
          .join(' | ')} |`,
    ),
  ].join('\n');

  const idlePasses = passes.filter((p) => p.bridgesIdle.length);
  const idleKeys = new Set(idlePasses.flatMap((p) => p.bridgesIdle.flatMap((b) => Object.keys(b.byVerb))));
  const idle = idlePasses.length
    ? [
        `| request, per second per replica (${IDLE_SECONDS} s at rest before the pass) | ${idlePasses.map((p) => `pass ${passes.indexOf(p) + 1}: ${p.bridgesIdle.map((_, i) => `replica ${i + 1}`).join(' / ')}`).join(' | ')} |`,
        `|---|${idlePasses.map(() => '---|').join('')}`,
        ...[...idleKeys].sort().map((k) => `| ${k} | ${idlePasses.map((p) => p.bridgesIdle.map((b) => ((b.byVerb[k] ?? 0) / IDLE_SECONDS).toFixed(1)).join(' / ')).join(' | ')} |`),
      ].join('\n')
    : '';

  const failures = [...new Set(passes.flatMap((p) => Object.keys(p.failures)))].map((f) => `- \`${f}\`: ${passes.map((p) => p.failures[f] ?? 0).join(' / ')}`).join('\n');
  const results = {
    date: new Date().toISOString(),
    node: process.version,
    cores: cpus().length,
    loadavg: load,
    boxes: BOXES,
    nodes: NODES,
    sleepAfterSeconds: SLEEP_AFTER_SECONDS,
    idleSeconds: IDLE_SECONDS,
    createSeconds,
    passes,
  };
  const md =
    `# Sleep sweep bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}, load average ${load}; \`npm run bench:sleep-sweep\` ` +
    `(BENCH_SWEEP_BOXES=${BOXES}, BENCH_SWEEP_REPLICAS=${REPLICAS.join(',')}). ${BOXES} idle boxes (made through a bridge in ${createSeconds.toFixed(0)} s) on ${NODES} ` +
    `simulated nodes of the bench's own, idle.sleepAfterSeconds ${SLEEP_AFTER_SECONDS}, every box due when the operator starts; ` +
    `a fresh operator per pass (SLEEP_WORKERS 2), operator and bridges each their own process behind an API proxy that counts its requests. ` +
    `boxd does not run on simulated nodes, so every sleep fails at its first boxd call (connection refused) and the box stays Running: ` +
    `this is the cost of deciding and trying, not of a snapshot and a pod delete. The pass: from the operator's first lease to its last box tried (+${TRAILING_MS / 1000} s).\n\n` +
    `${summary}\n\nRequests by verb and resource (watches are one long request each):\n\n${byVerb}\n\n` +
    (idle ? `Bridge replicas at rest (nothing calls them, no box changes):\n\n${idle}\n\n` : '') +
    `Why each sleep failed (operator log; count per pass):\n\n${failures}\n`;
  writeResults(ROOT, 'sleep-sweep', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
