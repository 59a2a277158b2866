// Bench: a cold start, create -> first exec answered, and where its time goes.
//
//   npm run bench:cold   (BENCH_COLD_N=20 per variant, BENCH_COLD_CPU=0.25, BENCH_COLD_MEMORY=64)
//
// On the local cluster's real node, no warm boxes (every create is a new pod), one bridge per
// variant (each its own process), creates alternating between the variants, one box at a time;
// each box is deleted and gone before the next create, so no pod start or stop races a
// measured one on the 2 cores. Variants:
// - `init-container`: boxd copied into an emptyDir by an init container (the default);
// - `image-volume`: boxd's image mounted as an image volume (BOXD_IMAGE_VOLUME=true; Kubernetes
//   1.35 image volumes, which need containerd >= 2.1 on the node): run only when the real node's
//   runtime has them (else reported as not run, with the runtime's version).
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
import { POOL_API_VERSION, POOL_GROUP, POOL_KIND, POOL_PLURAL, POOL_VERSION } from '../common/pool.js';
import { writeResults } from './results-file.js';
import { ON_REAL_NODE, REAL_NODE_LABEL, ensureCluster, kubectl, percentile, startBenchBridge, startBenchOperator, waitUntil } from './setup.js';

const ROOT = process.cwd();
const N = Number(process.env.BENCH_COLD_N ?? 20);
const CPU = Number(process.env.BENCH_COLD_CPU ?? 0.25);
const MEMORY = Number(process.env.BENCH_COLD_MEMORY ?? 64);
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const LOGS = join(ROOT, '.cluster/real-node/logs');
const id = randomBytes(3).toString('hex');
const pool = `bench-cold-${id}`;
const ns = `${pool}-boxes`;
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');

ensureCluster(ROOT, KUBECONFIG, []);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const log = (msg: string) => process.stderr.write(`[bench:cold] ${msg}\n`);
const ms = (v: number) => (Number.isFinite(v) ? `${v.toFixed(0)} ms` : '-');

interface Variant {
  name: 'init-container' | 'image-volume';
  env: Record<string, string>;
}

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
    const ref = `${ns}/${s.pod}"`;
    const add = kubelet.find((l) => l.includes('"SyncLoop ADD"') && l.includes(ref));
    s.add = add ? klogTime(add) : undefined;
    let sandbox: string | undefined;
    const containers = new Map<string, string>(); // container id -> name
    for (const line of containerd) {
      const at = containerdTime(line);
      if (at === undefined) continue;
      if (line.includes(`RunPodSandbox for &PodSandboxMetadata{Name:${s.pod},`)) {
        const done = /returns sandbox id \\"([0-9a-f]+)\\"/.exec(line);
        if (done) {
          sandbox = done[1];
          s.sandboxEnd = at;
        } else s.sandboxStart ??= at;
        continue;
      }
      if (!sandbox || !line.includes(sandbox) && ![...containers.keys()].some((c) => line.includes(c))) continue;
      const create = /CreateContainer within sandbox \\"[0-9a-f]+\\" for (container )?&ContainerMetadata\{Name:([^,]+),/.exec(line);
      if (create) {
        const made = /returns container id \\"([0-9a-f]+)\\"/.exec(line);
        if (made) containers.set(made[1]!, create[2]!);
        else if (create[2] === 'box') s.boxCreate ??= at;
        continue;
      }
      for (const [cid, name] of containers) {
        if (!line.includes(cid)) continue;
        if (name === 'box' && line.includes('StartContainer for') && line.includes('returns successfully')) s.boxStarted ??= at;
        if (name === 'boxd-install' && line.includes('shim disconnected')) s.initExited ??= at;
      }
    }
  }
}

async function nodeRuntime(): Promise<string> {
  const nodes = await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` });
  return nodes.items[0]?.status?.nodeInfo?.containerRuntimeVersion ?? '';
}

/** containerd >= 2.1 mounts image volumes (CRI Mount.image). */
function hasImageVolumes(runtime: string): boolean {
  const m = /^containerd:\/\/v?(\d+)\.(\d+)/.exec(runtime);
  return Boolean(m && (Number(m[1]) > 2 || (Number(m[1]) === 2 && Number(m[2]) >= 1)));
}

async function podGone(name: string): Promise<boolean> {
  try {
    await core.readNamespacedPod({ name, namespace: ns });
    return false;
  } catch {
    return true;
  }
}

async function once(variant: Variant, client: BridgeClient, i: number): Promise<Sample> {
  const load = loadavg()[0]!;
  const t0 = Date.now();
  const box = await client.createBox({ sessionId: `cold-${variant.name}-${i}`, cpu: CPU, memory: MEMORY });
  const created = Date.now();
  const r = await client.exec(box.box_id, { command: 'true' });
  const answered = Date.now();
  if (r.exit_code !== 0) throw new Error(`first exec exited ${r.exit_code}`);
  await client.deleteBox(box.box_id);
  await waitUntil(`box ${box.pod_name} gone`, () => podGone(box.pod_name), 60_000);
  return { variant: variant.name, pod: box.pod_name, load, t0, created, answered };
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
    load: stat(samples.map((s) => s.load)),
  };
}

async function main() {
  if ((await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` })).items.length === 0) {
    log('no real node: skipped');
    return;
  }
  const runtime = await nodeRuntime();
  const variants: Variant[] = [{ name: 'init-container', env: { BOXD_IMAGE_VOLUME: 'false' } }];
  if (hasImageVolumes(runtime)) variants.push({ name: 'image-volume', env: { BOXD_IMAGE_VOLUME: 'true' } });
  else log(`the real node runs ${runtime}: no image volumes (containerd >= 2.1), image-volume not run`);

  kubectl(ROOT, KUBECONFIG, 'apply', '--server-side', '--force-conflicts', '--field-manager=sandbox-bridge-bench', '-f', join(ROOT, 'charts/sandbox-bridge/crds/sandboxpools.sandbox-bridge.io.yaml'));
  kubectl(ROOT, KUBECONFIG, 'wait', '--for=condition=Established', 'crd/sandboxpools.sandbox-bridge.io', '--timeout=30s');
  const operator = await startBenchOperator(ROOT, KUBECONFIG, { pool, id, boxdKey });
  const bridges: ChildProcess[] = [];
  const samples: Sample[] = [];
  const errors: string[] = [];
  try {
    await custom.createClusterCustomObject({
      group: POOL_GROUP,
      version: POOL_VERSION,
      plural: POOL_PLURAL,
      body: {
        apiVersion: POOL_API_VERSION,
        kind: POOL_KIND,
        metadata: { name: pool, labels: { 'sandbox-bridge.io/bench': id } },
        spec: {
          namespace: ns,
          maxBoxes: 10,
          maxBoxesPerSession: 3,
          box: { defaultImage: 'sandbox-bridge.local/box:dev', defaultCpu: `${Math.round(CPU * 1000)}m`, defaultMemory: `${MEMORY}Mi`, ...ON_REAL_NODE },
          warm: { count: 0 },
        },
      },
    });
    // The namespace and its NetworkPolicy (the operator's) in place before the first create.
    await waitUntil('the pool namespace and its NetworkPolicy', async () => {
      const policies = await kc.makeApiClient(k8s.NetworkingV1Api).listNamespacedNetworkPolicy({ namespace: ns });
      return policies.items.length > 0;
    }, 60_000);
    const clients: BridgeClient[] = [];
    for (const v of variants) {
      const b = await startBenchBridge(ROOT, KUBECONFIG, { token, boxdKey, pool, namespace: ns, env: v.env });
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
    log('cleaning up');
    await custom.deleteClusterCustomObject({ group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name: pool }).catch(() => undefined);
    await core.deleteNamespace({ name: ns }).catch(() => undefined);
    operator.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 2000));
    await kc.makeApiClient(k8s.CoordinationV1Api).deleteNamespacedLease({ name: `${pool}-lease`, namespace: 'default' }).catch(() => undefined);
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
    `boxes of ${Math.round(CPU * 1000)}m / ${MEMORY}Mi on the real node (${runtime}, runc), no warm boxes, one bridge per variant, ` +
    `creates alternating between variants, one box at a time (each deleted and gone before the next); n=${N} per variant. ` +
    `Phases from the kubelet's and containerd's logs; errors: ${errors.length}.\n\n${table}\n`;
  writeResults(ROOT, 'cold-start', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
