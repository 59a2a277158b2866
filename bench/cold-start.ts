// Bench: a cold start, create -> first exec answered, and where its time goes.
//
//   npm run bench:cold   (BENCH_COLD_N=20 per variant, BENCH_COLD_CPU=0.25, BENCH_COLD_MEMORY=64;
//                         BENCH_COLD_NODE_KEY / BENCH_COLD_LOGS: another node's label-and-taint
//                         key and its kubelet.log + containerd.log directory, for a prototype node)
//
// On the local cluster's real node, no warm boxes (every create is a new pod), one pool and one
// bridge per variant (each its own process), creates alternating between the variants, one box
// at a time; each box is deleted and gone before the next create, so no pod start or stop races
// a measured one on the 2 cores. Variants (the pool's spec.box.boxdDelivery, and where the
// bridge finds the new pod's address, its POD_IP_ANNOTATION):
// - `InitContainer`: boxd copied into an emptyDir by an init container (the default);
// - `ImageVolume`: boxd's image mounted as an image volume (Kubernetes 1.35 image volumes, which
//   need containerd >= 2.1 on the node): run only when the node's runtime has them (else
//   reported as not run, with the runtime's version);
// each with the address from the kubelet's status.podIP only, and, where it can matter (the
// image volume), also from the annotation Calico's CNI plugin writes (`+ CNI address`).
// Where the time goes, per create, in milliseconds from the node's own logs (kubelet's klog and
// containerd's timestamps, .cluster/real-node/logs/), this process's clock for the rest:
//   create sent -> the kubelet's SyncLoop ADD (bridge writes, scheduler, the kubelet's watch)
//   -> RunPodSandbox begins (the kubelet's volume setup) -> it returns (pause container, CNI)
//   -> the init container has exited (its create, start, copy) -> the box container's
//   CreateContainer begins (the kubelet noticing the exit: its PLEG relists every second)
//   -> the box container's StartContainer returns -> the first exec answered (boxd starting,
//   the bridge's probe, the exec).
// The machine's load average is noted with every create. Results: bench/results/cold-start.md/.json.
import { readFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import * as k8s from '@kubernetes/client-node';
import type { BridgeClient } from '../client/index.js';
import type { ChildProcess } from 'node:child_process';
import { type BoxdDelivery } from '../common/pool.js';
import { writeResults } from './results-file.js';
import { benchCluster, createPool, deletePool, installPoolCrd, percentile, REAL_NODE_LABEL, startBenchBridge, startBenchOperator, waitUntil } from './setup.js';

const ROOT = process.cwd();
const N = Number(process.env.BENCH_COLD_N ?? 20);
const CPU = Number(process.env.BENCH_COLD_CPU ?? 0.25);
const MEMORY = Number(process.env.BENCH_COLD_MEMORY ?? 64);
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const NODE_KEY = process.env.BENCH_COLD_NODE_KEY ?? REAL_NODE_LABEL;
const LOGS = process.env.BENCH_COLD_LOGS ?? join(ROOT, '.cluster/real-node/logs');
const ON_NODE = {
  nodeSelector: { [NODE_KEY]: 'true' },
  tolerations: [{ key: NODE_KEY, operator: 'Exists', effect: 'NoSchedule' }],
};
const id = randomBytes(3).toString('hex');
const CALICO_POD_IP = 'cni.projectcalico.org/podIP';
const poolOf = (v: Variant['name']) => `bench-cold-${id}-${VARIANTS.find((x) => x.name === v)!.key}`;
const nsOf = (v: Variant['name']) => `${poolOf(v)}-boxes`;
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');

const { kc, core, custom } = benchCluster(ROOT, KUBECONFIG);
const log = (msg: string) => process.stderr.write(`[bench:cold] ${msg}\n`);
const ipsSeen = new Map<string, number>();
const stopWatches: Array<() => void> = [];
const ms = (v: number) => (Number.isFinite(v) ? `${v.toFixed(0)} ms` : '-');

interface Variant {
  name: 'InitContainer' | 'ImageVolume' | 'ImageVolume + CNI address';
  key: string;
  delivery: BoxdDelivery;
  /** The bridge's POD_IP_ANNOTATION ('' : status.podIP only). */
  podIpAnnotation: string;
}

const VARIANTS: Variant[] = [
  { name: 'InitContainer', key: 'init', delivery: 'InitContainer', podIpAnnotation: '' },
  { name: 'ImageVolume', key: 'image', delivery: 'ImageVolume', podIpAnnotation: '' },
  { name: 'ImageVolume + CNI address', key: 'image-cni', delivery: 'ImageVolume', podIpAnnotation: CALICO_POD_IP },
];

/** One create, as the bench and the node's logs saw it (epoch ms). */
interface Sample {
  variant: Variant['name'];
  pod: string;
  load: number;
  t0: number;
  created: number;
  answered: number;
  add?: number;
  sandboxStart?: number;
  sandboxEnd?: number;
  initExited?: number;
  boxCreate?: number;
  boxStarted?: number;
  /** When this process's watch first saw the pod's IP (the kubelet reports it after its next relist). */
  ipSeen?: number;
}

/** When this process first saw each pod with an IP, from a watch of the namespace (epoch ms). */
function watchIps(namespace: string, seen: Map<string, number>): () => void {
  let request: { abort: () => void } | undefined;
  void new k8s.Watch(kc)
    .watch(
      `/api/v1/namespaces/${namespace}/pods`,
      {},
      (_type: string, pod: k8s.V1Pod) => {
        const name = pod.metadata?.name;
        if (name && pod.status?.podIP && !seen.has(`${pod.metadata?.uid}`)) seen.set(`${pod.metadata?.uid}`, Date.now());
      },
      () => undefined,
    )
    .then((r) => (request = r as { abort: () => void }));
  return () => request?.abort();
}

/** A klog line's time (`I1127 07:21:04.601715 ...`): the year is not in it, the machine's clock is UTC. */
function klogTime(line: string): number | undefined {
  const m = /^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{3})/.exec(line);
  if (!m) return undefined;
  const year = new Date().getUTCFullYear();
  return Date.UTC(year, Number(m[1]) - 1, Number(m[2]), Number(m[3]), Number(m[4]), Number(m[5]), Number(m[6]));
}

/** A containerd line's time (`time="2026-11-27T07:21:04.919532772Z"`). */
function containerdTime(line: string): number | undefined {
  const m = /^time="([^"]+)"/.exec(line);
  return m ? Date.parse(m[1]!.replace(/(\.\d{3})\d*Z$/, '$1Z')) : undefined;
}

/** Fills in a sample's node-side milestones from the kubelet's and containerd's logs. */
function fromNodeLogs(samples: Sample[]): void {
  const kubelet = readFileSync(join(LOGS, 'kubelet.log'), 'utf8').split('\n');
  const containerd = readFileSync(join(LOGS, 'containerd.log'), 'utf8').split('\n');
  for (const s of samples) {
    const ref = `${nsOf(s.variant)}/${s.pod}"`;
    // Box names repeat across runs (a digest of the session): only lines from this create on.
    const since = s.t0 - 1000;
    const add = kubelet.find((l) => l.includes('"SyncLoop ADD"') && l.includes(ref) && (klogTime(l) ?? 0) >= since);
    s.add = add ? klogTime(add) : undefined;
    let sandbox: string | undefined;
    const containers = new Map<string, string>(); // container id -> name
    for (const line of containerd) {
      const at = containerdTime(line);
      if (at === undefined || at < since) continue;
      // containerd 1.6 logs `&PodSandboxMetadata{Name:<pod>,...}`, 2.x `name:\"<pod>\"`.
      if (line.includes('RunPodSandbox for ') && (line.includes(`{Name:${s.pod},`) || line.includes(`name:\\"${s.pod}\\"`))) {
        const done = /returns sandbox id \\"([0-9a-f]+)\\"/.exec(line);
        if (done) {
          sandbox = done[1];
          s.sandboxEnd = at;
        } else s.sandboxStart ??= at;
        continue;
      }
      if (!sandbox || !line.includes(sandbox) && ![...containers.keys()].some((c) => line.includes(c))) continue;
      const create = /CreateContainer within sandbox \\"[0-9a-f]+\\" for (?:container )?(?:&ContainerMetadata\{Name:([^,]+),|name:\\"([^\\]+)\\")/.exec(line);
      if (create) {
        const name = create[1] ?? create[2]!;
        const made = /returns container id \\"([0-9a-f]+)\\"/.exec(line);
        if (made) containers.set(made[1]!, name);
        else if (name === 'box') s.boxCreate ??= at;
        continue;
      }
      for (const [cid, name] of containers) {
        if (!line.includes(cid)) continue;
        if (name === 'box' && line.includes('StartContainer for') && line.includes('returns successfully')) s.boxStarted ??= at;
        // 1.6: the container's shim goes; 2.x (one shim per pod): an exit event.
        if (name === 'boxd-install' && (line.includes('shim disconnected') || line.includes('received container exit event'))) s.initExited ??= at;
      }
    }
  }
}

async function nodeRuntime(): Promise<string> {
  const nodes = await core.listNode({ labelSelector: `${NODE_KEY}=true` });
  return nodes.items[0]?.status?.nodeInfo?.containerRuntimeVersion ?? '';
}

/** containerd >= 2.1 mounts image volumes (CRI Mount.image). */
function hasImageVolumes(runtime: string): boolean {
  const m = /^containerd:\/\/v?(\d+)\.(\d+)/.exec(runtime);
  return Boolean(m && (Number(m[1]) > 2 || (Number(m[1]) === 2 && Number(m[2]) >= 1)));
}

async function podGone(name: string, namespace: string): Promise<boolean> {
  try {
    await core.readNamespacedPod({ name, namespace });
    return false;
  } catch {
    return true;
  }
}

async function once(variant: Variant, client: BridgeClient, i: number): Promise<Sample> {
  const load = loadavg()[0]!;
  const t0 = Date.now();
  const box = await client.createBox({ sessionId: `cold-${id}-${variant.name}-${i}`, cpu: CPU, memory: MEMORY });
  const uid = (await core.readNamespacedPod({ name: box.pod_name, namespace: nsOf(variant.name) }).catch(() => undefined))?.metadata?.uid;
  const created = Date.now();
  const r = await client.exec(box.box_id, { command: 'true' });
  const answered = Date.now();
  if (r.exit_code !== 0) throw new Error(`first exec exited ${r.exit_code}`);
  await client.deleteBox(box.box_id);
  await waitUntil(`box ${box.pod_name} gone`, () => podGone(box.pod_name, nsOf(variant.name)), 60_000);
  return { variant: variant.name, pod: box.pod_name, load, t0, created, answered, ...(uid && ipsSeen.has(uid) ? { ipSeen: ipsSeen.get(uid)! } : {}) };
}

const stat = (v: Array<number | undefined>) => {
  const xs = v.filter((x): x is number => x !== undefined && Number.isFinite(x));
  return { n: xs.length, p50: percentile(xs, 50), p99: percentile(xs, 99) };
};

/** Each phase's p50 / p99 of a variant's samples. */
function phases(samples: Sample[]) {
  const d = (a: number | undefined, b: number | undefined) => (a !== undefined && b !== undefined ? b - a : undefined);
  return {
    total: stat(samples.map((s) => s.answered - s.t0)),
    post: stat(samples.map((s) => s.created - s.t0)),
    toAdd: stat(samples.map((s) => d(s.t0, s.add))),
    volumes: stat(samples.map((s) => d(s.add, s.sandboxStart))),
    sandbox: stat(samples.map((s) => d(s.sandboxStart, s.sandboxEnd))),
    initContainer: stat(samples.map((s) => d(s.sandboxEnd, s.initExited))),
    noticeExit: stat(samples.map((s) => d(s.initExited, s.boxCreate))),
    toBoxCreate: stat(samples.map((s) => d(s.sandboxEnd, s.boxCreate))),
    boxContainer: stat(samples.map((s) => d(s.boxCreate, s.boxStarted))),
    toAnswer: stat(samples.map((s) => d(s.boxStarted, s.answered))),
    sandboxToIp: stat(samples.map((s) => d(s.sandboxEnd, s.ipSeen))),
    ipToAnswer: stat(samples.map((s) => d(s.ipSeen, s.answered))),
    load: stat(samples.map((s) => s.load)),
  };
}

async function main() {
  if ((await core.listNode({ labelSelector: `${NODE_KEY}=true` })).items.length === 0) {
    log('no real node: skipped');
    return;
  }
  const runtime = await nodeRuntime();
  const imageVolumes = hasImageVolumes(runtime);
  const variants = VARIANTS.filter((v) => v.delivery === 'InitContainer' || imageVolumes);
  if (!imageVolumes) log(`the node runs ${runtime}: no image volumes (containerd >= 2.1), ImageVolume not run`);

  installPoolCrd(ROOT, KUBECONFIG);
  const operator = await startBenchOperator(ROOT, KUBECONFIG, { pool: `bench-cold-${id}`, id, boxdKey });
  const bridges: ChildProcess[] = [];
  const samples: Sample[] = [];
  const errors: string[] = [];
  try {
    for (const v of variants) {
      await createPool(custom, {
        name: poolOf(v.name),
        labels: { 'sandbox-bridge.io/bench': id },
        spec: {
          namespace: nsOf(v.name),
          maxBoxes: 10,
          maxBoxesPerSession: 3,
          box: { defaultImage: 'sandbox-bridge.local/box:dev', defaultCpu: `${Math.round(CPU * 1000)}m`, defaultMemory: `${MEMORY}Mi`, boxdDelivery: v.delivery, ...ON_NODE },
          warm: { count: 0 },
        },
      });
      // The namespace and its NetworkPolicy (the operator's) in place before the first create.
      await waitUntil('the pool namespace and its NetworkPolicy', async () => {
        const policies = await kc.makeApiClient(k8s.NetworkingV1Api).listNamespacedNetworkPolicy({ namespace: nsOf(v.name) });
        return policies.items.length > 0;
      }, 60_000);
    }
    for (const v of variants) stopWatches.push(watchIps(nsOf(v.name), ipsSeen));
    const clients: BridgeClient[] = [];
    for (const v of variants) {
      const b = await startBenchBridge(ROOT, KUBECONFIG, { token, boxdKey, pool: poolOf(v.name), namespace: nsOf(v.name), env: { POD_IP_ANNOTATION: v.podIpAnnotation } });
      bridges.push(b.child);
      clients.push(b.client);
    }
    // One create per variant first, not measured: images, caches and connections warmed up.
    for (const [k, v] of variants.entries()) await once(v, clients[k]!, -1);
    for (let i = 0; i < N; i++) {
      for (const [k, v] of variants.entries()) {
        try {
          const s = await once(v, clients[k]!, i);
          samples.push(s);
          log(`${v.name} ${i + 1}/${N}: ${s.answered - s.t0} ms (load ${s.load.toFixed(1)})`);
        } catch (err) {
          errors.push(`${v.name}: ${String(err).slice(0, 200)}`);
          log(`${v.name} ${i + 1}/${N} failed: ${String(err).slice(0, 200)}`);
        }
      }
    }
  } finally {
    for (const b of bridges) b.kill('SIGTERM');
    for (const stop of stopWatches) stop();
    log('cleaning up');
    for (const v of variants) {
      await deletePool(custom, poolOf(v.name));
      await core.deleteNamespace({ name: nsOf(v.name) }).catch(() => undefined);
    }
    operator.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 2000));
    await kc.makeApiClient(k8s.CoordinationV1Api).deleteNamespacedLease({ name: `bench-cold-${id}-lease`, namespace: 'default' }).catch(() => undefined);
  }

  fromNodeLogs(samples);
  const byVariant = Object.fromEntries(variants.map((v) => [v.name, phases(samples.filter((s) => s.variant === v.name))]));
  const results = { date: new Date().toISOString(), node: process.version, cores: cpus().length, runtime, cpu: CPU, memoryMi: MEMORY, n: N, variants: byVariant, errors, samples };

  const rows: Array<[string, (p: ReturnType<typeof phases>) => string]> = [
    ['create -> first exec answered, p50 / p99 (n)', (p) => `**${ms(p.total.p50)}** / ${ms(p.total.p99)} (${p.total.n})`],
    ['of which POST /boxes answered', (p) => `${ms(p.post.p50)} / ${ms(p.post.p99)}`],
    ['create sent -> kubelet SyncLoop ADD (bridge writes, scheduler, kubelet watch)', (p) => `${ms(p.toAdd.p50)} / ${ms(p.toAdd.p99)}`],
    ['-> RunPodSandbox begins (kubelet volume setup)', (p) => `${ms(p.volumes.p50)} / ${ms(p.volumes.p99)}`],
    ['-> RunPodSandbox returns (pause container, Calico CNI)', (p) => `${ms(p.sandbox.p50)} / ${ms(p.sandbox.p99)}`],
    ['-> box container CreateContainer begins', (p) => `${ms(p.toBoxCreate.p50)} / ${ms(p.toBoxCreate.p99)}`],
    ['&nbsp;&nbsp;of which: init container create, start, copy, exit', (p) => `${ms(p.initContainer.p50)} / ${ms(p.initContainer.p99)}`],
    ['&nbsp;&nbsp;of which: the kubelet noticing the exit (PLEG relist, 1 s period)', (p) => `${ms(p.noticeExit.p50)} / ${ms(p.noticeExit.p99)}`],
    ['-> box container StartContainer returns', (p) => `${ms(p.boxContainer.p50)} / ${ms(p.boxContainer.p99)}`],
    ['-> first exec answered (boxd start, the bridge\'s probe, the exec)', (p) => `${ms(p.toAnswer.p50)} / ${ms(p.toAnswer.p99)}`],
    ['the pod IP: RunPodSandbox returned -> seen on a watch (the kubelet reports it after its next PLEG relist)', (p) => `${ms(p.sandboxToIp.p50)} / ${ms(p.sandboxToIp.p99)}`],
    ['the pod IP seen -> first exec answered (the bridge waits for the IP, then probes boxd every 25 ms)', (p) => `${ms(p.ipToAnswer.p50)} / ${ms(p.ipToAnswer.p99)}`],
    ['load average (1 min) at the creates, p50 / max', (p) => `${p.load.p50.toFixed(1)} / ${p.load.p99.toFixed(1)}`],
  ];
  const names = variants.map((v) => v.name);
  const table = [
    `| phase (p50 / p99) | ${names.join(' | ')} |`,
    `|---|${names.map(() => '---').join('|')}|`,
    ...rows.map(([label, f]) => `| ${label} | ${names.map((n) => f(byVariant[n]!)).join(' | ')} |`),
  ].join('\n');
  const md =
    `# Cold start bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}; \`npm run bench:cold\`; ` +
    `boxes of ${Math.round(CPU * 1000)}m / ${MEMORY}Mi on the node labelled ${NODE_KEY} (${runtime}, runc), no warm boxes, one pool (spec.box.boxdDelivery) and bridge (POD_IP_ANNOTATION: "+ CNI address" takes Calico's) per variant, ` +
    `creates alternating between variants, one box at a time (each deleted and gone before the next); n=${N} per variant. ` +
    `Phases from the kubelet's and containerd's logs; errors: ${errors.length}.\n\n${table}\n`;
  writeResults(ROOT, 'cold-start', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
