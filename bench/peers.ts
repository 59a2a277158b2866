// Bench: our warm boxes against kubernetes-sigs/agent-sandbox's, side by side on one cluster.
//
//   flock /tmp/sandbox-bridge-bench.lock npm run bench:peers
//   (BENCH_PEERS_WARM=20 BENCH_PEERS_SERIAL=20 BENCH_PEERS_BURSTS=3 BENCH_PEERS_REST_S=10)
//
// Both on the local cluster's real node, same image (sandbox-bridge.local/box:dev), same box
// (50m CPU / 48Mi, requests = limits), same warm-pool size, at the same time:
// - ours: the operator keeping the pool's warm boxes and two bridge replicas (own processes, as
//   bench:warm runs them); a claim is POST /boxes, the first command an exec through the bridge
//   (boxd in the box).
// - theirs: agent-sandbox's controller (built from its Go module by bench/peers/agent-sandbox.sh,
//   run on this host, CRDs from the module), a SandboxTemplate of the same pod and a
//   SandboxWarmPool; a claim is a SandboxClaim on the pool, ready when the Sandbox it gets reports
//   Ready (seen by a watch), the first command a kube exec (pods/exec): their core has no generic
//   in-box agent for an image like busybox.
// Measured alternating (ours, theirs, ours, ...), each claim cycle = claim, first command, delete,
// and the pool refilled (both pools at rest before the next):
// 1. serial: BENCH_PEERS_SERIAL cycles each: claim -> ready, claim -> first command answered;
// 2. bursts of BENCH_PEERS_WARM cycles at once, BENCH_PEERS_BURSTS each; claims per second;
// 3. served warm or cold, errors;
// 4. API requests per claim cycle, from the API server's apiserver_request_total (all clients),
//    less what the cluster does at rest (quiet windows of BENCH_PEERS_REST_S through the run, both
//    pools idle; the machine and cluster are shared); writes apart.
// 5. Accounting: the controllers restarted, each side's behind its own counting proxy
//    (bench/api-requests.ts), BENCH_PEERS_ACCOUNT=10 more serial cycles each: their own requests
//    per claim cycle exactly, whatever else uses the cluster, and at rest between cycles. Apart
//    from the timed parts, so the proxy's hop is in none of the latencies.
// Results go to bench/results/peers.md and .json.
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { BridgeClientError, type BridgeClient } from '../client/index.js';
import { LABELS } from '../common/labels.js';
import { milliValue } from '../common/quantity.js';
import { CountingProxy, calls, tally as tallyRequests } from './api-requests.js';
import { ApiWindows, add, isWrite, toObject, total, type Counts } from './peers/api-metrics.js';
import { AgentSandboxObjects, LAUNCH_TYPE_LABEL, buildAgentSandbox, installCrds, isReady, kubeExec, startController, templateSpec, uninstallCrds } from './peers/agent-sandbox.js';
import { writeResults } from './results-file.js';
import { benchCluster, createPool, deletePool, installPoolCrd, REAL_NODE_LABEL, startBenchBridge, startBenchOperator, stats, waitUntil, warmBenchPoolSpec } from './setup.js';

const ROOT = process.cwd();
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const WARM = Number(process.env.BENCH_PEERS_WARM ?? 20);
const SERIAL = Number(process.env.BENCH_PEERS_SERIAL ?? 20);
const BURSTS = Number(process.env.BENCH_PEERS_BURSTS ?? 3);
/** Each quiet window (the cluster's own rate): at the start, every 5 serial rounds, before each pair of bursts. */
const REST_S = Number(process.env.BENCH_PEERS_REST_S ?? 10);
/** After both pools are at rest again, what a cycle's last writes (status updates) get before the window closes. */
const SETTLE_MS = 2_000;
const CLAIM_TIMEOUT_MS = 120_000;
/** How long the bench waits for other pods on the real node to leave room for both pools. */
const ROOM_TIMEOUT_MS = 600_000;
const REST_TIMEOUT_MS = 300_000;
/** Serial cycles each in the accounting part (processes behind counting proxies). */
const ACCOUNT = Number(process.env.BENCH_PEERS_ACCOUNT ?? 10);
const IMAGE = 'sandbox-bridge.local/box:dev';
const CPU = '50m';
const MEMORY_MI = 48;

const id = randomBytes(3).toString('hex');
const pool = `bench-peers-${id}`;
const oursNs = `${pool}-boxes`;
const theirsNs = `${pool}-theirs`;
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');

const { kc, core, custom } = benchCluster(ROOT, KUBECONFIG);
const log = (msg: string) => process.stderr.write(`[bench:peers] ${msg}\n`);
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const load = () => loadavg().map((v) => v.toFixed(2)).join(' ');

/** One claim cycle: times from the claim's start (ms), whether a warm box served it. */
interface Cycle {
  ready: number;
  first: number;
  warm: boolean;
  /** performance.now() at the claim's start and when it was ready. */
  t0: number;
  readyAt: number;
  /** theirs: the claim's own Ready condition, when seen before the first command was answered. */
  claimReady?: number;
}

interface Side {
  name: 'ours' | 'theirs';
  /** Claim, wait for ready, first command, delete (awaited, not timed). */
  cycle(label: string, replica: number): Promise<Cycle>;
  /** The pool holds exactly WARM ready warm boxes, nothing claimed, nothing terminating. */
  atRest(): boolean;
  /**
   * After failed cycles: deletes the boxes they left (a create whose answer was lost, a delete
   * refused), so the pool gets back to rest; how many.
   */
  sweep?(): Promise<number>;
}

/** How long a delete refused for now (503, 429: Retry-After) is tried again. */
const DELETE_RETRY_MS = 60_000;

/** Deletes a box through the bridge, again while it answers "retry later"; gone already is done. */
async function deleteBox(client: BridgeClient, boxId: string): Promise<void> {
  const until = performance.now() + DELETE_RETRY_MS;
  for (;;) {
    try {
      await client.deleteBox(boxId);
      return;
    } catch (err) {
      if (err instanceof BridgeClientError && err.status === 404) return;
      const later = err instanceof BridgeClientError && (err.status === 503 || err.status === 429 || err.status === 0);
      if (!later || performance.now() > until) throw err;
      await sleep(Math.min(err.retryAfterMs ?? 1000, 5000));
    }
  }
}

type PodCache = k8s.ObjectCache<k8s.V1Pod>;
const podReady = (p: k8s.V1Pod) => !p.metadata?.deletionTimestamp && (p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false);

let stopping = false;

/** A watch cache, started, that restarts itself after an error until the bench cleans up. */
async function started<T extends k8s.KubernetesObject>(informer: k8s.Informer<T> & k8s.ObjectCache<T>, what: string): Promise<k8s.Informer<T> & k8s.ObjectCache<T>> {
  informer.on('error', (err: unknown) => {
    if (stopping) return;
    log(`watch of ${what} failed (${String(err).slice(0, 120)}); restarting`);
    setTimeout(() => void (stopping ? undefined : informer.start().catch(() => undefined)), 1_000);
  });
  await informer.start();
  return informer;
}

/** Resolves when check() holds, re-checked on every event of the given informers; rejects after timeoutMs. */
function whenTrue<T>(informers: Array<Pick<k8s.Informer<k8s.KubernetesObject>, 'on' | 'off'>>, check: () => T | undefined, what: string, timeoutMs: number): Promise<T> {
  return new Promise((resolve, reject) => {
    const done = (fn: () => void) => {
      clearTimeout(timer);
      for (const inf of informers) inf.off('change', poke);
      fn();
    };
    const poke = () => {
      const v = check();
      if (v !== undefined) done(() => resolve(v));
    };
    const timer = setTimeout(() => done(() => reject(new Error(`timed out waiting for ${what}`))), timeoutMs);
    for (const inf of informers) inf.on('change', poke);
    poke();
  });
}

async function oursSide(bridges: BridgeClient[]): Promise<Side & { stop: () => void }> {
  const pods = await started(
    k8s.makeInformer<k8s.V1Pod>(kc, `/api/v1/namespaces/${oursNs}/pods`, () => core.listNamespacedPod({ namespace: oursNs })),
    'our pods',
  );
  const firstReady = new Map<string, number>();
  const seen = (p: k8s.V1Pod) => {
    if (podReady(p) && !firstReady.has(p.metadata!.name!)) firstReady.set(p.metadata!.name!, performance.now());
  };
  pods.on('add', seen);
  pods.on('update', seen);
  const cache: PodCache = pods;
  return {
    name: 'ours',
    stop: () => void pods.stop(),
    atRest: () => {
      const all = cache.list(oursNs);
      return all.length === WARM && all.every((p) => p.metadata?.labels?.[LABELS.warm] === pool && podReady(p));
    },
    async cycle(label, replica) {
      const client = bridges[replica % bridges.length]!;
      const t0 = performance.now();
      const box = await client.createBox({ sessionId: `${label}-${randomBytes(2).toString('hex')}`, memory: MEMORY_MI });
      const answered = performance.now();
      const warm = box.pod_name !== box.box_id;
      try {
        // A warm box is ready when POST /boxes answers (its agent answered the claim); a new pod
        // when it is also Ready (the first command goes ahead at once: the bridge waits for it).
        const ready = warm ? Promise.resolve(answered) : whenTrue([pods], () => firstReady.get(box.pod_name), `pod ${box.pod_name} Ready`, CLAIM_TIMEOUT_MS);
        ready.catch(() => undefined); // awaited below, after the exec
        const r = await client.exec(box.box_id, { command: 'true' });
        const first = performance.now() - t0;
        if (r.exit_code !== 0) throw new Error(`first exec exited ${r.exit_code}`);
        const readyAt = Math.max(answered, await ready);
        return { ready: readyAt - t0, first, warm, t0, readyAt };
      } finally {
        await deleteBox(bridges[(replica + 1) % bridges.length]!, box.box_id);
      }
    },
    async sweep() {
      const left = cache.list(oursNs).filter((p) => p.metadata?.labels?.[LABELS.boxId] && !p.metadata.deletionTimestamp);
      await Promise.all(left.map((p, i) => deleteBox(bridges[i % bridges.length]!, p.metadata!.labels![LABELS.boxId]!)));
      return left.length;
    },
  };
}

async function theirsSide(objs: AgentSandboxObjects, warmPool: string): Promise<Side & { stop: () => void }> {
  const sandboxes = await started(objs.sandboxInformer(kc), 'their sandboxes');
  const claims = await started(objs.claimInformer(kc), 'their claims');
  const pods = await started(
    k8s.makeInformer<k8s.V1Pod>(kc, `/api/v1/namespaces/${theirsNs}/pods`, () => core.listNamespacedPod({ namespace: theirsNs })),
    'their pods',
  );
  // claim uid -> when its Sandbox (owner reference) was first seen Ready, and which one
  const sandboxReady = new Map<string, { at: number; name: string; pod: string; launch?: string }>();
  const claimReady = new Map<string, number>();
  const onSandbox = (s: k8s.KubernetesObject) => {
    const owner = s.metadata?.ownerReferences?.find((o) => o.kind === 'SandboxClaim');
    if (!owner || s.metadata?.deletionTimestamp || !isReady(s) || sandboxReady.has(owner.uid)) return;
    const pod = s.metadata?.annotations?.['agents.x-k8s.io/pod-name'] ?? s.metadata!.name!;
    sandboxReady.set(owner.uid, { at: performance.now(), name: s.metadata!.name!, pod, launch: s.metadata?.labels?.[LAUNCH_TYPE_LABEL] });
  };
  const onClaim = (c: k8s.KubernetesObject) => {
    if (isReady(c) && !claimReady.has(c.metadata!.uid!)) claimReady.set(c.metadata!.uid!, performance.now());
  };
  sandboxes.on('add', onSandbox);
  sandboxes.on('update', onSandbox);
  claims.on('add', onClaim);
  claims.on('update', onClaim);
  return {
    name: 'theirs',
    stop: () => {
      void sandboxes.stop();
      void claims.stop();
      void pods.stop();
    },
    atRest: () => {
      const sbx = sandboxes.list(theirsNs);
      const all = (pods as PodCache).list(theirsNs);
      return claims.list(theirsNs).length === 0 && sbx.length === WARM && sbx.every((s) => isReady(s) && !s.metadata?.deletionTimestamp) && all.length === WARM && all.every(podReady);
    },
    async cycle(label) {
      const name = `${label}-${randomBytes(2).toString('hex')}`;
      const t0 = performance.now();
      const uid = await objs.claim(name, warmPool);
      try {
        const got = await whenTrue([sandboxes], () => sandboxReady.get(uid), `claim ${name}'s Sandbox Ready`, CLAIM_TIMEOUT_MS);
        const status = await kubeExec(kc, theirsNs, got.pod, 'true');
        const first = performance.now() - t0;
        if (status.status !== 'Success') throw new Error(`first kube exec: ${status.status} ${status.message ?? ''}`);
        // The adoption patch that labels the Sandbox warm comes before the Ready it reports.
        const launch = got.launch ?? sandboxes.get(got.name, theirsNs)?.metadata?.labels?.[LAUNCH_TYPE_LABEL];
        const claimAt = claimReady.get(uid);
        return { ready: got.at - t0, first, warm: launch === 'warm', t0, readyAt: got.at, ...(claimAt !== undefined ? { claimReady: claimAt - t0 } : {}) };
      } finally {
        await objs.deleteClaim(name);
      }
    },
  };
}

/**
 * CPU (millicores) the real node has left for the bench: its allocatable less the requests of the
 * pods on it that are not done, and who holds it. Both pools' warm boxes must fit at once (20 + 20
 * boxes of 50m fill its 2 cores), or one pool never gets all of its warm boxes.
 */
async function realNodeRoom(): Promise<{ free: number; holders: string }> {
  const node = (await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` })).items[0]!;
  const pods = (await core.listPodForAllNamespaces({ fieldSelector: `spec.nodeName=${node.metadata!.name}` })).items.filter(
    (p) => p.status?.phase !== 'Succeeded' && p.status?.phase !== 'Failed',
  );
  const request = (p: k8s.V1Pod) => {
    const sum = (cs: k8s.V1Container[] | undefined) => (cs ?? []).reduce((a, c) => a + Number(milliValue(c.resources?.requests?.cpu ?? 0)), 0);
    const init = Math.max(0, ...(p.spec?.initContainers ?? []).map((c) => Number(milliValue(c.resources?.requests?.cpu ?? 0))));
    return Math.max(init, sum(p.spec?.containers));
  };
  const byNs = new Map<string, { pods: number; milli: number }>();
  for (const p of pods) {
    const e = byNs.get(p.metadata!.namespace!) ?? { pods: 0, milli: 0 };
    byNs.set(p.metadata!.namespace!, { pods: e.pods + 1, milli: e.milli + request(p) });
  }
  const used = [...byNs.values()].reduce((a, e) => a + e.milli, 0);
  const holders = [...byNs].map(([ns, e]) => `${ns}: ${e.pods} pods, ${e.milli}m`).join('; ');
  return { free: Number(milliValue(node.status!.allocatable!.cpu!)) - used, holders: holders || 'nothing' };
}

/** SIGTERM, and SIGKILL if it has not exited after 15 s. */
function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const kill = setTimeout(() => child.kill('SIGKILL'), 15_000);
    child.once('exit', () => {
      clearTimeout(kill);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

/** What the accounting part found for one side: its processes' requests in its own cycles, and between them. */
interface Accounting {
  cycles: number;
  errors: string[];
  own: Counts;
  ownSeconds: number;
  rest: Counts;
  restSeconds: number;
}

interface Tally {
  ready: number[];
  first: number[];
  claimReady: number[];
  warm: number;
  cold: number;
  errors: string[];
  claimsPerSecond: number[];
  /** Boxes failed cycles left, deleted afterwards (Side.sweep). */
  swept: number;
}
const tally = (): Tally => ({ ready: [], first: [], claimReady: [], warm: 0, cold: 0, errors: [], claimsPerSecond: [], swept: 0 });
const record = (t: Tally, c: Cycle) => {
  t.ready.push(c.ready);
  t.first.push(c.first);
  if (c.claimReady !== undefined) t.claimReady.push(c.claimReady);
  if (c.warm) t.warm++;
  else t.cold++;
};

async function main() {
  const results: Record<string, unknown> = {
    date: new Date().toISOString(),
    node: process.version,
    cores: cpus().length,
    loadAverage: { start: load() },
    warm: WARM,
    box: { image: IMAGE, cpu: CPU, memory: `${MEMORY_MI}Mi` },
  };
  if ((await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` })).items.length === 0) {
    log('no real node: skipped');
    return;
  }
  const need = 2 * WARM * Number(milliValue(CPU));
  const room = await realNodeRoom();
  if (room.free < need) {
    log(`the real node has ${room.free}m of CPU free, both pools need ${need}m; held by ${room.holders}. Waiting up to ${ROOM_TIMEOUT_MS / 60_000} min`);
    await waitUntil('room on the real node', async () => (await realNodeRoom()).free >= need, ROOM_TIMEOUT_MS, 5_000).catch(async () => {
      throw new Error(`the real node has no room for ${2 * WARM} boxes of ${CPU} (${need}m): held by ${(await realNodeRoom()).holders}`);
    });
  }
  results.realNodeAtStart = await realNodeRoom();
  const peer = buildAgentSandbox(ROOT);
  results.agentSandbox = {
    module: 'sigs.k8s.io/agent-sandbox',
    version: peer.version,
    build: 'bench/peers/agent-sandbox.sh: go get + go build of cmd/agent-sandbox-controller from the Go module proxy (CGO off, -trimpath), cached in ~/.cache/sandbox-bridge/agent-sandbox-<version>/',
    crds: "the module's k8s/crds, conversion strategy None (the controller runs with --enable-webhook=false)",
    flags: '--extensions --leader-elect=false --enable-webhook=false, metrics and probes on loopback; the rest its defaults',
  };
  log(`agent-sandbox ${peer.version} from ${peer.dir}`);
  installPoolCrd(ROOT, KUBECONFIG);
  const crds = installCrds(ROOT, KUBECONFIG, peer.dir);

  const controllerLog = join(tmpdir(), `${pool}-agent-sandbox.log`);
  const children: ChildProcess[] = [];
  const stops: Array<() => void> = [];
  const objs = new AgentSandboxObjects(kc, theirsNs);
  const api = new ApiWindows(ROOT, KUBECONFIG);
  const ours = tally();
  const theirs = tally();
  const oursBurst = tally();
  const theirsBurst = tally();
  let accounting: Record<'ours' | 'theirs', Accounting> | undefined;
  try {
    let ourProcs: ChildProcess[] = [await startBenchOperator(ROOT, KUBECONFIG, { pool, id, boxdKey })];
    children.push(...ourProcs);
    await createPool(custom, { name: pool, labels: { 'sandbox-bridge.io/bench': id }, spec: warmBenchPoolSpec({ namespace: oursNs, warm: WARM, memoryMi: MEMORY_MI }) });
    const bridgeProcs = [];
    for (let i = 0; i < 2; i++) bridgeProcs.push(await startBenchBridge(ROOT, KUBECONFIG, { token, boxdKey, pool, namespace: oursNs }));
    ourProcs.push(...bridgeProcs.map((b) => b.child));
    children.push(...bridgeProcs.map((b) => b.child));

    await core.createNamespace({ body: { metadata: { name: theirsNs, labels: { 'pod-security.kubernetes.io/enforce': 'restricted' } } } });
    let theirProc = await startController(peer.dir, KUBECONFIG, controllerLog);
    children.push(theirProc);
    log(`agent-sandbox controller log: ${controllerLog}`);
    await objs.template(pool, templateSpec({ image: IMAGE, cpu: CPU, memory: `${MEMORY_MI}Mi` }));
    await objs.warmPool(pool, pool, WARM);

    await waitUntil(`namespace ${oursNs}`, async () => Boolean(await core.readNamespace({ name: oursNs })), 60_000);
    const clients = bridgeProcs.map((b) => b.client);
    const sideOurs = await oursSide(clients);
    const sideTheirs = await theirsSide(objs, pool);
    stops.push(sideOurs.stop, sideTheirs.stop);
    const bothAtRest = () => waitUntil('both pools at rest (warm boxes ready, nothing claimed or terminating)', async () => sideOurs.atRest() && sideTheirs.atRest(), REST_TIMEOUT_MS, 100);

    log(`waiting for ${WARM} warm boxes each`);
    await waitUntil(`${WARM} warm boxes each`, async () => sideOurs.atRest() && sideTheirs.atRest(), 600_000, 500);
    // One unmeasured cycle each: first connections, code paths warmed.
    for (const side of [sideOurs, sideTheirs]) {
      await side.cycle('warmup', 0);
      await bothAtRest();
    }
    log(`quiet windows of ${REST_S} s through the run: the cluster's own rate of requests`);
    await api.rest(REST_S * 1000);
    results.loadAverage = { ...(results.loadAverage as object), ready: load() };

    // Other engineers' tests share the real node: if they hold its room past the waits, the
    // figures so far are still reported, with the reason the run stopped.
    try {
      // 1. serial, alternating
      for (let i = 0; i < SERIAL; i++) {
        if (i > 0 && i % 5 === 0) {
          await bothAtRest();
          await api.rest(REST_S * 1000);
        }
        for (const [side, t] of [
          [sideOurs, ours],
          [sideTheirs, theirs],
        ] as const) {
          await bothAtRest();
          await api.measure(`${side.name} serial`, async () => {
            try {
              record(t, await side.cycle(`serial-${i}`, i));
            } catch (err) {
              t.errors.push(String(err).slice(0, 300));
              t.swept += (await side.sweep?.()) ?? 0;
            }
            await bothAtRest();
            await sleep(SETTLE_MS);
          });
        }
        if (i % 5 === 4) log(`serial ${i + 1}/${SERIAL}: ours first-command p50 ${stats(ours.first).p50.toFixed(0)} ms, theirs ${stats(theirs.first).p50.toFixed(0)} ms`);
      }
      results.loadAverage = { ...(results.loadAverage as object), serial: load() };

      // 2. bursts, alternating
      for (let b = 0; b < BURSTS; b++) {
        await bothAtRest();
        await api.rest(REST_S * 1000);
        for (const [side, t] of [
          [sideOurs, oursBurst],
          [sideTheirs, theirsBurst],
        ] as const) {
          await bothAtRest();
          await api.measure(`${side.name} burst`, async () => {
            const start = performance.now();
            const outcomes = await Promise.allSettled(Array.from({ length: WARM }, (_, i) => side.cycle(`burst${b}-${i}`, i)));
            const ok = outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : []));
            for (const c of ok) record(t, c);
            t.errors.push(...outcomes.filter((o) => o.status === 'rejected').map((o) => String((o as PromiseRejectedResult).reason).slice(0, 300)));
            if (ok.length) t.claimsPerSecond.push((ok.length / (Math.max(...ok.map((c) => c.readyAt)) - start)) * 1000);
            log(`${side.name} burst ${b + 1}/${BURSTS}: ready p50 ${stats(ok.map((c) => c.ready)).p50.toFixed(0)} ms, ${ok.filter((c) => !c.warm).length} cold, ${WARM - ok.length} errors`);
            if (ok.length < WARM) t.swept += (await side.sweep?.()) ?? 0;
            await bothAtRest();
            await sleep(SETTLE_MS);
          });
        }
      }
      results.loadAverage = { ...(results.loadAverage as object), bursts: load() };

      // 5. accounting
      if (ACCOUNT > 0) {
        log(`accounting: each side's processes again behind a counting proxy, ${ACCOUNT} serial cycles each`);
        const proxies = { ours: new CountingProxy(kc), theirs: new CountingProxy(kc) };
        await proxies.ours.start();
        await proxies.theirs.start();
        stops.push(() => void proxies.ours.stop(), () => void proxies.theirs.stop());
        await Promise.all([...ourProcs, theirProc].map(stopChild));
        const proxied = proxies.ours.kubeconfigFile();
        ourProcs = [await startBenchOperator(ROOT, proxied, { pool, id, boxdKey })];
        const again = [];
        for (let i = 0; i < 2; i++) again.push(await startBenchBridge(ROOT, proxied, { token, boxdKey, pool, namespace: oursNs }));
        ourProcs.push(...again.map((b) => b.child));
        clients.splice(0, clients.length, ...again.map((b) => b.client));
        theirProc = await startController(peer.dir, proxies.theirs.kubeconfigFile(), `${controllerLog}.proxied`);
        children.push(...ourProcs, theirProc);
        await bothAtRest();
        await sleep(5_000); // start-up lists and watches out of the way
        const acct = { ours: newAccounting(), theirs: newAccounting() };
        const from = { ours: proxies.ours.mark(), theirs: proxies.theirs.mark(), at: performance.now() };
        for (let i = 0; i < ACCOUNT; i++) {
          for (const side of [sideOurs, sideTheirs]) {
            await bothAtRest();
            const proxy = proxies[side.name];
            const a = acct[side.name];
            const mark = proxy.mark();
            const t0 = performance.now();
            try {
              await side.cycle(`acct-${i}`, i);
            } catch (err) {
              a.errors.push(String(err).slice(0, 300));
            }
            await bothAtRest();
            await sleep(SETTLE_MS);
            a.cycles++;
            a.own = add(a.own, tallyRequests(calls(proxy.since(mark))));
            a.ownSeconds += (performance.now() - t0) / 1000;
          }
        }
        for (const name of ['ours', 'theirs'] as const) {
          const a = acct[name];
          a.rest = add(tallyRequests(calls(proxies[name].since(from[name]))), a.own, -1);
          a.restSeconds = (performance.now() - from.at) / 1000 - a.ownSeconds;
        }
        accounting = acct;
      }
    } catch (err) {
      results.stoppedEarly = `${String(err).slice(0, 300)}; the real node: ${(await realNodeRoom()).holders}`;
      log(`stopped early: ${String(results.stoppedEarly)}`);
    }
  } finally {
    log('cleaning up');
    stopping = true;
    for (const stop of stops) stop();
    await deletePool(custom, pool);
    await core.deleteNamespace({ name: oursNs }).catch(() => undefined);
    await objs.deleteAll();
    await core.deleteNamespace({ name: theirsNs }).catch(() => undefined);
    // Their Sandboxes go with the namespace while their controller still runs; then the CRDs.
    await waitUntil(`namespace ${theirsNs} gone`, async () => !(await core.readNamespace({ name: theirsNs }).then(() => true, () => false)), 180_000, 1_000).catch((err: unknown) => log(String(err)));
    await Promise.all(children.map(stopChild));
    // After the operator is gone: until then it renews (re-creates) its lease.
    await kc.makeApiClient(k8s.CoordinationV1Api).deleteNamespacedLease({ name: `${pool}-lease`, namespace: 'default' }).catch(() => undefined);
    try {
      uninstallCrds(ROOT, KUBECONFIG, crds);
    } catch (err) {
      log(`could not remove agent-sandbox's CRDs: ${String(err).slice(0, 300)}`);
    }
  }
  results.loadAverage = { ...(results.loadAverage as object), end: load() };
  report(results, { ours, theirs, oursBurst, theirsBurst }, api, accounting);
}

const newAccounting = (): Accounting => ({ cycles: 0, errors: [], own: new Map(), ownSeconds: 0, rest: new Map(), restSeconds: 0 });

function report(
  results: Record<string, unknown>,
  t: { ours: Tally; theirs: Tally; oursBurst: Tally; theirsBurst: Tally },
  api: ApiWindows,
  accounting: Record<'ours' | 'theirs', Accounting> | undefined,
) {
  // Cycles tried in each tally's windows (a failed one ran its windows too).
  const tried = (x: Tally) => Math.max(1, x.ready.length + x.errors.length);
  const cycles = { 'ours serial': tried(t.ours), 'theirs serial': tried(t.theirs), 'ours burst': tried(t.oursBurst), 'theirs burst': tried(t.theirsBurst) };
  const perCycle = (name: string, kind: 'serial' | 'burst', which: 'raw' | 'net') => {
    const key = `${name} ${kind}` as keyof typeof cycles;
    const c: Counts = which === 'net' ? api.net(key) : (api.raw.get(key) ?? new Map());
    return new Map([...c].map(([k, v]) => [k, v / cycles[key]]));
  };
  const apiOf = (name: string, kind: 'serial' | 'burst') => {
    const net = perCycle(name, kind, 'net');
    const raw = perCycle(name, kind, 'raw');
    return {
      all: total(net),
      writes: total(net, isWrite),
      rawAll: total(raw),
      rawWrites: total(raw, isWrite),
      writesByVerbResource: toObject(new Map([...net].filter(([k]) => isWrite(k)))),
      readsAndExecByVerbResource: toObject(new Map([...net].filter(([k]) => !isWrite(k)))),
      windowSeconds: api.seconds.get(`${name} ${kind}`) ?? 0,
    };
  };
  const rest = api.restRate();
  const summary = (x: Tally) => ({ ready: stats(x.ready), first: stats(x.first), claimReady: x.claimReady.length ? stats(x.claimReady) : undefined, warm: x.warm, cold: x.cold, errors: x.errors, swept: x.swept, claimsPerSecond: x.claimsPerSecond });
  results.ours = { serial: summary(t.ours), bursts: summary(t.oursBurst), api: { serial: apiOf('ours', 'serial'), burst: apiOf('ours', 'burst') } };
  results.theirs = { serial: summary(t.theirs), bursts: summary(t.theirsBurst), api: { serial: apiOf('theirs', 'serial'), burst: apiOf('theirs', 'burst') } };
  results.apiAtRest = { writesPerSecond: rest.writes, requestsPerSecond: rest.all, seconds: rest.seconds, writesPerSecondEachWindow: api.restWrites, byVerbResource: toObject(rest.counts) };

  const ms = (v: number) => (Number.isFinite(v) ? `${v.toFixed(0)} ms` : '-');
  const pp = (x: number[]) => `${ms(stats(x).p50)} / ${ms(stats(x).p99)}`;
  const ratio = (a: number, b: number) => (Number.isFinite(a / b) ? `${(a / b).toFixed(2)}x` : '-');
  const median = (v: number[]) => stats(v).p50;
  const rows: Array<[string, string, string, string]> = [];
  const both = (label: string, a: Tally, b: Tally) => {
    rows.push([`${label} (n=${a.ready.length} / ${b.ready.length}): claim -> ready, p50 / p99`, pp(a.ready), pp(b.ready), ratio(median(a.ready), median(b.ready))]);
    rows.push([`${label}: claim -> first command answered, p50 / p99`, pp(a.first), pp(b.first), ratio(median(a.first), median(b.first))]);
    rows.push([`${label}: served warm / cold; errors (boxes they left, deleted after)`, `${a.warm} / ${a.cold}; ${a.errors.length} (${a.swept})`, `${b.warm} / ${b.cold}; ${b.errors.length} (${b.swept})`, '']);
  };
  both('serial', t.ours, t.theirs);
  both(`bursts of ${WARM}`, t.oursBurst, t.theirsBurst);
  rows.push([
    `bursts of ${WARM}: claims per second (claims over the time to the last one ready), each burst`,
    t.oursBurst.claimsPerSecond.map((r) => r.toFixed(1)).join(', '),
    t.theirsBurst.claimsPerSecond.map((r) => r.toFixed(1)).join(', '),
    ratio(median(t.oursBurst.claimsPerSecond), median(t.theirsBurst.claimsPerSecond)),
  ]);
  if (t.theirs.claimReady.length) {
    rows.push([
      `theirs: claim -> the SandboxClaim itself Ready, serial / bursts p50 (n=${t.theirs.claimReady.length} / ${t.theirsBurst.claimReady.length}: those seen before their first command was answered)`,
      '',
      `${ms(median(t.theirs.claimReady))} / ${ms(median(t.theirsBurst.claimReady))}`,
      '',
    ]);
  }
  for (const kind of ['serial', 'burst'] as const) {
    const a = apiOf('ours', kind);
    const b = apiOf('theirs', kind);
    rows.push([`API requests per claim cycle, ${kind === 'serial' ? 'serial' : 'bursts'}: all / writes (net of the cluster at rest)`, `${a.all.toFixed(1)} / ${a.writes.toFixed(1)}`, `${b.all.toFixed(1)} / ${b.writes.toFixed(1)}`, ratio(a.writes, b.writes)]);
    rows.push([`… as counted (at rest not taken out): all / writes`, `${a.rawAll.toFixed(1)} / ${a.rawWrites.toFixed(1)}`, `${b.rawAll.toFixed(1)} / ${b.rawWrites.toFixed(1)}`, '']);
  }
  const top = (o: Record<string, number>) =>
    Object.entries(o)
      .slice(0, 6)
      .map(([k, v]) => `${k} ${v.toFixed(1)}`)
      .join(', ');
  if (accounting) {
    // The client's own requests per cycle: ours talks to a bridge (none); theirs makes the claim,
    // deletes it and runs its first command through the API server.
    const client: Record<'ours' | 'theirs', Counts> = {
      ours: new Map(),
      theirs: new Map([
        ['POST sandboxclaims', 1],
        ['DELETE sandboxclaims', 1],
        ['CONNECT pods/exec', 1],
      ]),
    };
    const perCycleOf = (name: 'ours' | 'theirs') => add(add(new Map(), accounting[name].own, 1 / Math.max(1, accounting[name].cycles)), client[name]);
    const restOf = (name: 'ours' | 'theirs') => add(new Map(), accounting[name].rest, 1 / Math.max(1e-9, accounting[name].restSeconds));
    const a = { ours: perCycleOf('ours'), theirs: perCycleOf('theirs') };
    const r = { ours: restOf('ours'), theirs: restOf('theirs') };
    results.accounting = Object.fromEntries(
      (['ours', 'theirs'] as const).map((name) => [
        name,
        {
          cycles: accounting[name].cycles,
          errors: accounting[name].errors,
          perCycle: { all: total(a[name]), writes: total(a[name], isWrite), client: toObject(client[name]), byVerbResource: toObject(a[name]) },
          atRest: { seconds: accounting[name].restSeconds, requestsPerSecond: total(r[name]), writesPerSecond: total(r[name], isWrite), byVerbResource: toObject(r[name]) },
        },
      ]),
    );
    const n = `${accounting.ours.cycles} / ${accounting.theirs.cycles}`;
    rows.push([
      `own API requests per claim cycle, counted at a proxy (serial, n=${n}; ours: 2 bridges + operator; theirs: controller + the client's claim, delete and kube exec): all / writes`,
      `${total(a.ours).toFixed(1)} / ${total(a.ours, isWrite).toFixed(1)}`,
      `${total(a.theirs).toFixed(1)} / ${total(a.theirs, isWrite).toFixed(1)}`,
      ratio(total(a.ours, isWrite), total(a.theirs, isWrite)),
    ]);
    rows.push([
      '… the same processes between cycles (at rest): requests / writes per second',
      `${total(r.ours).toFixed(2)} / ${total(r.ours, isWrite).toFixed(2)}`,
      `${total(r.theirs).toFixed(2)} / ${total(r.theirs, isWrite).toFixed(2)}`,
      '',
    ]);
    const writes = (c: Counts) => toObject(new Map([...c].filter(([k]) => isWrite(k))));
    rows.push(['… own writes per claim cycle, largest', top(writes(a.ours)), top(writes(a.theirs)), '']);
  }
  rows.push(['writes per serial cycle, largest', top(apiOf('ours', 'serial').writesByVerbResource), top(apiOf('theirs', 'serial').writesByVerbResource), '']);
  rows.push(['writes per burst cycle, largest', top(apiOf('ours', 'burst').writesByVerbResource), top(apiOf('theirs', 'burst').writesByVerbResource), '']);

  const acc = results.accounting as Record<'ours' | 'theirs', { perCycle: { writes: number } }> | undefined;
  const ownWrites = acc ? { ours: acc.ours.perCycle.writes, theirs: acc.theirs.perCycle.writes } : undefined;
  const la = results.loadAverage as Record<string, string>;
  const peer = results.agentSandbox as { version: string };
  const table = ['| measure | ours | agent-sandbox | ours / theirs |', '|---|---|---|---|', ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
  const md = [
    '# Peers: our warm boxes against kubernetes-sigs/agent-sandbox',
    '',
    `${results.date} — ${results.cores} cores, Node ${results.node}; \`npm run bench:peers\`. Load average (1/5/15 min): ` +
      `${la.start} at the start, ${la.ready} with both pools warm, ${la.serial} after the serial part, ${la.bursts} after the bursts.`,
    ...(results.stoppedEarly ? ['', `**Stopped early** (the figures are those measured until then): ${String(results.stoppedEarly)}`] : []),
    '',
    `Same cluster, the real node (runc), image \`${IMAGE}\`, boxes of ${CPU} / ${MEMORY_MI}Mi (requests = limits), ${WARM} warm boxes each, ` +
      `both running at once and measured alternating (ours, theirs, ...); a claim cycle is claim, first command, delete, pool refilled ` +
      `(both pools at rest before the next). agent-sandbox ${peer.version} (\`sigs.k8s.io/agent-sandbox\`), its controller built from its Go module by ` +
      '`bench/peers/agent-sandbox.sh` and run on this host (`--extensions --leader-elect=false --enable-webhook=false`, otherwise its defaults), ' +
      "its CRDs from the module with conversion strategy None. Ours: the operator and two bridge replicas, each its own process.",
    '',
    `- **ours**: claim = \`POST /boxes\`; ready = its answer (a warm box's agent answered the claim; a new pod also Ready); first command = \`exec true\` through the bridge to boxd in the box.`,
    "- **agent-sandbox**: claim = a SandboxClaim on the SandboxWarmPool; ready = the Sandbox it gets reports Ready (seen by a watch); first command = `sh -c true` by kube exec (`pods/exec` through the API server and the kubelet): agent-sandbox's core has no generic in-box agent for an image like busybox (its sandbox runtime is a separate image), so a user of a plain image runs commands this way.",
    `- API requests: the API server's \`apiserver_request_total\` (every client: bridges, operator, controller, scheduler, kubelet, garbage collector, the bench's claims, deletes and execs), scraped around each cycle (serial) or burst, per claim cycle, less the cluster's own rate at rest: ${rest.writes.toFixed(2)} writes/s and ${rest.all.toFixed(2)} requests/s over ${api.restWrites.length} quiet windows of ${REST_S} s with both pools idle (writes/s in each: ${api.restWrites.map((w) => w.toFixed(1)).join(', ')}); the cluster is shared, so the net figures are as steady as that rate. Writes are POST, PUT, PATCH, APPLY, DELETE; an exec is a CONNECT (not a write).`,
    `- Own requests: last, each side's processes are restarted behind a counting proxy of their own (\`bench/api-requests.ts\`) for ${ACCOUNT} more serial cycles each, apart from the timed parts: exact for those processes whatever else uses the cluster (the kubelet, scheduler, garbage collector and other controllers are only in the API server's totals).`,
    '',
    table,
    '',
    whatItMeans(t, apiOf, results.realNodeAtStart as { free: number; holders: string }, ownWrites),
  ].join('\n');
  writeResults(ROOT, 'peers', md, results);
  process.stdout.write(`${md}\n`);
}

function whatItMeans(
  t: { ours: Tally; theirs: Tally; oursBurst: Tally; theirsBurst: Tally },
  apiOf: (name: string, kind: 'serial' | 'burst') => { writes: number },
  room: { free: number; holders: string },
  own: { ours: number; theirs: number } | undefined,
): string {
  const p = (x: number[], q: number) => stats(x)[q === 50 ? 'p50' : 'p99'];
  const ms = (v: number) => `${v.toFixed(0)} ms`;
  const cmp = (a: number, b: number) => (a <= b ? `ours ${ms(a)} vs ${ms(b)}: ahead by ${ms(b - a)}` : `ours ${ms(a)} vs ${ms(b)}: behind by ${ms(a - b)}`);
  const lines = [
    '## What it means',
    '',
    `- Serial, a box that answers its first command: ${cmp(p(t.ours.first, 50), p(t.theirs.first, 50))} (p50). Ours answers through boxd already running in the box; theirs needs a kube exec, which is most of its figure. Their claim -> ready alone: ${cmp(p(t.ours.ready, 50), p(t.theirs.ready, 50))}.`,
    `- Issue 24's target for the claim path: our serial claim -> first command p50 at or under their claim -> ready p50: ${ms(p(t.ours.first, 50))} vs ${ms(p(t.theirs.ready, 50))} (${p(t.ours.first, 50) <= p(t.theirs.ready, 50) ? 'met' : 'not met'}); in bursts ${ms(p(t.oursBurst.first, 50))} vs ${ms(p(t.theirsBurst.ready, 50))} (${p(t.oursBurst.first, 50) <= p(t.theirsBurst.ready, 50) ? 'met' : 'not met'}), and our burst p99 to first command at most half of theirs: ${ms(p(t.oursBurst.first, 99))} vs ${ms(p(t.theirsBurst.first, 99))} (${p(t.oursBurst.first, 99) <= 0.5 * p(t.theirsBurst.first, 99) ? 'met' : 'not met'}).`,
    `- Bursts of ${WARM} with ${WARM} warm boxes ready: ${t.oursBurst.cold} of our ${t.oursBurst.ready.length} claims and ${t.theirsBurst.cold} of their ${t.theirsBurst.ready.length} were served by a new pod. A new pod (a miss, or a refill) waits for room: the real node had ${room.free}m of CPU free for the bench at the start (${room.holders}), and both pools' ${2 * WARM} warm boxes of ${CPU} take ${2 * WARM * Number(milliValue(CPU))}m of it, so a new pod is scheduled only as claimed boxes are deleted, and its first command takes seconds; misses set the p99.`,
    `- API writes per claim cycle, all clients (net of rest): serial ${apiOf('ours', 'serial').writes.toFixed(1)} ours vs ${apiOf('theirs', 'serial').writes.toFixed(1)} theirs, bursts ${apiOf('ours', 'burst').writes.toFixed(1)} vs ${apiOf('theirs', 'burst').writes.toFixed(1)}; the JSON lists them by verb and resource.` +
      (own ? ` The controllers' own (at the proxies): ${own.ours.toFixed(1)} ours vs ${own.theirs.toFixed(1)} theirs, which are exact; the rest of a cycle's writes are the kubelet's, the scheduler's and the garbage collector's (pod status, binding, events), about the same for both, plus whatever else ran on the cluster.` : ''),
    '- Caveats: one 2-core machine runs the API server, etcd, the kubelet, containerd, both controllers and the bench, so figures move with the load average; agent-sandbox runs without its webhooks (defaulting, validation, conversion) and with the admin kubeconfig; the API server counts include requests of anything else that used the cluster during a window.',
  ];
  return lines.join('\n');
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
    process.exit(1);
  },
);
