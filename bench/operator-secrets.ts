// Bench: the operator's memory with many boxes whose records hold a large env. Each box is a pod
// on one of kwok's simulated nodes and its record Secret (as the bridge makes it: the env as JSON,
// base64 in the Secret's data) holding BENCH_ENV_KIB of env. The operator under test starts
// against them, fills its caches, reconciles the pool once (counting the boxes, reaping none),
// and runs on for BENCH_SETTLE_SECONDS; the bench reports its peak RSS (the kernel's VmHWM), RSS
// at the end, time to its caches being filled (/readyz) and CPU.
//
//   npm run bench:operator-secrets   (BENCH_BOXES=5000 BENCH_ENV_KIB=100 BENCH_NODES=50 by default)
//
// With BENCH_BASELINE_OPERATOR=<path of another build's dist/operator/main.js>, that build runs
// on the same boxes too, alternating with this checkout's, BENCH_RUNS times each (default 2):
// the before/after of a change. It needs the local cluster up (npm run cluster:up); it never
// starts or stops it. Simulated nodes beyond those there are added with kwokctl and removed
// afterwards, as bench:operator does; the pool, its namespace (waited for until gone) and the
// lease are deleted at the end.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { buildBoxSecret } from '../common/box-pod.js';
import { ANNOTATIONS, LABELS, MANAGED_BY, SECRET_COMPONENTS } from '../common/labels.js';
import { NODE_FLAGS } from '../common/node-flags.js';
import { writeResults } from './results-file.js';
import { createBenchPool, deletePool, freePort, kubectl as runKubectl, waitUntil } from './setup.js';

const ROOT = process.cwd();
const BOXES = Number(process.env.BENCH_BOXES ?? 5000);
const ENV_KIB = Number(process.env.BENCH_ENV_KIB ?? 100);
const NODES = Number(process.env.BENCH_NODES ?? 50);
const RUNS = Number(process.env.BENCH_RUNS ?? 2);
const SETTLE_MS = Number(process.env.BENCH_SETTLE_SECONDS ?? 15) * 1000;
// Bounded: the machine is shared, and each record is ~137 KB through the API server into etcd.
const CREATE_CONCURRENCY = Number(process.env.BENCH_CREATE_CONCURRENCY ?? 8);
const BASELINE = process.env.BENCH_BASELINE_OPERATOR;
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const poolName = `bench-secrets-${id}`;
const ns = `bench-secrets-${id}`;
const leaseName = `bench-secrets-${id}`;

const kubectl = (...args: string[]) => runKubectl(ROOT, KUBECONFIG, ...args);
function log(msg: string): void {
  process.stderr.write(`[bench] ${msg}\n`);
}

if (spawnSync(join(ROOT, '.cluster/bin/kubectl'), ['--kubeconfig', KUBECONFIG, 'get', '--raw', '/readyz'], { stdio: 'ignore' }).status !== 0) {
  process.stderr.write('bench: the local cluster is not up (npm run cluster:up starts it)\n');
  process.exit(2);
}
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);

async function mapLimit<T>(items: T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: limit }, async () => {
    while (next < items.length) await fn(items[next++]!);
  }));
}

/** Retries what the API server refuses for a moment (a busy etcd), not what it refuses for good. */
async function create(fn: () => Promise<unknown>): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await fn();
      return;
    } catch (err) {
      if (err instanceof k8s.ApiException && err.code === 409) return;
      if (attempt >= 5) throw err;
      await new Promise((r) => setTimeout(r, 500 * (attempt + 1)));
    }
  }
}

/** An env of `kib` KiB as JSON: values of random characters (nothing on the way compresses them). */
function envOf(kib: number): Record<string, string> {
  const env: Record<string, string> = {};
  for (let i = 0; i < kib; i++) env[`BENCH_VALUE_${String(i).padStart(4, '0')}`] = randomBytes(750).toString('base64').slice(0, 1024 - 24);
  return env;
}

function procStatus(pid: number, field: 'VmHWM' | 'VmRSS'): number {
  try {
    const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : 0;
  } catch {
    return 0;
  }
}

function cpuSeconds(pid: number): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return 0;
  }
}

interface Run {
  build: 'baseline' | 'this checkout';
  readySeconds: number;
  reconciledSeconds: number;
  peakRssMiB: number;
  endRssMiB: number;
  cpuSeconds: number;
  reaped: number;
}

async function runOperator(build: Run['build'], script: string): Promise<Run> {
  const port = await freePort();
  const op: ChildProcess = spawn(join(ROOT, 'node_modules/.bin/node'), [...NODE_FLAGS.operator, script], {
    env: {
      PATH: process.env.PATH,
      KUBECONFIG,
      METRICS_PORT: String(port),
      METRICS_HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      LEASE_NAME: leaseName,
      POD_NAME: 'bench',
      POOL_SELECTOR: `sandbox-bridge.io/bench=${id}`,
    },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  const exited = new Promise((r) => op.once('exit', r));
  const start = Date.now();
  const metric = async (name: string) => {
    const text = await fetch(`http://127.0.0.1:${port}/metrics`).then((r) => r.text());
    return text.split('\n').filter((l) => l.startsWith(name)).reduce((a, l) => a + Number(l.split(' ').pop()), 0);
  };
  try {
    await waitUntil(`${build}: caches filled`, async () => (await fetch(`http://127.0.0.1:${port}/readyz`)).ok, 600_000, 100);
    const readySeconds = (Date.now() - start) / 1000;
    await waitUntil(`${build}: the pool reconciled`, async () => (await metric('sandbox_operator_reconcile_total{result="success"}')) >= 1, 300_000, 100);
    const reconciledSeconds = (Date.now() - start) / 1000;
    await new Promise((r) => setTimeout(r, SETTLE_MS));
    const run: Run = {
      build,
      readySeconds,
      reconciledSeconds,
      peakRssMiB: procStatus(op.pid!, 'VmHWM'),
      endRssMiB: procStatus(op.pid!, 'VmRSS'),
      cpuSeconds: cpuSeconds(op.pid!),
      reaped: await metric('sandbox_operator_boxes_reaped_total'),
    };
    log(`${build}: peak RSS ${run.peakRssMiB.toFixed(0)} MiB, caches filled in ${readySeconds.toFixed(1)} s`);
    return run;
  } finally {
    op.kill('SIGTERM');
    await exited;
  }
}

async function main(): Promise<void> {
  const kwokNodes = () => kubectl('get', 'nodes', '-l', 'type=kwok', '-o', 'name').trim().split('\n').filter(Boolean);
  const before = kwokNodes().length;
  const kwokctl = (replicas: number) =>
    spawnSync(join(ROOT, '.cluster/bin/kwokctl'), ['scale', 'node', '--name', 'sandbox-bridge', '--config', join(ROOT, '.cluster/kwok.yaml'), '--replicas', String(replicas)], {
      env: { ...process.env, KWOK_WORKDIR: join(ROOT, '.cluster/kwok') },
      stdio: 'ignore',
    });
  try {
    if (before < NODES) {
      log(`adding simulated nodes: ${before} -> ${NODES}`);
      kwokctl(NODES);
      await waitUntil(`${NODES} simulated nodes`, async () => kwokNodes().length >= NODES, 120_000, 1000);
    }
    const nodes = kwokNodes().map((n) => n.replace('node/', '')).slice(0, NODES);

    await createBenchPool(
      { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
      { name: poolName, labels: { 'sandbox-bridge.io/bench': id }, spec: { namespace: ns, maxBoxes: BOXES * 2, defaultTtlSeconds: 86_400 } },
    );
    const expires = new Date(Date.now() + 86_400_000).toISOString().replace(/\.\d{3}Z$/, 'Z');
    const env = envOf(ENV_KIB);
    const createStart = Date.now();
    let made = 0;
    await mapLimit(Array.from({ length: BOXES }, (_, i) => i), CREATE_CONCURRENCY, async (i) => {
      const box = `box-bench${id}-${i}`;
      const record = buildBoxSecret({ name: box, namespace: ns, poolName, component: SECRET_COMPONENTS.record, token: randomBytes(32).toString('hex'), env });
      await create(() => core.createNamespacedSecret({ namespace: ns, body: record }));
      await create(() =>
        core.createNamespacedPod({
          namespace: ns,
          body: {
            metadata: {
              name: box,
              labels: { [LABELS.box]: 'true', [LABELS.pool]: poolName, [LABELS.boxId]: box, [LABELS.managedBy]: MANAGED_BY },
              annotations: { [ANNOTATIONS.expiresAt]: expires },
            },
            spec: {
              nodeName: nodes[i % nodes.length],
              automountServiceAccountToken: false,
              enableServiceLinks: false,
              securityContext: { runAsNonRoot: true, runAsUser: 65534, runAsGroup: 65534, seccompProfile: { type: 'RuntimeDefault' } },
              containers: [{
                name: 'box',
                image: 'sandbox-bridge.local/box:dev',
                resources: { requests: { cpu: '10m', memory: '16Mi' }, limits: { cpu: '10m', memory: '16Mi' } },
                securityContext: { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } },
              }],
            },
          },
        }),
      );
      if (++made % 500 === 0) log(`created ${made}/${BOXES} boxes (${((Date.now() - createStart) / 1000).toFixed(0)} s)`);
    });
    const createSeconds = (Date.now() - createStart) / 1000;
    const envBytes = Buffer.byteLength(JSON.stringify(env));
    const recordBytes = Buffer.byteLength(JSON.stringify(buildBoxSecret({ name: 'x', namespace: ns, poolName, component: SECRET_COMPONENTS.record, token: 'x'.repeat(64), env })));
    log(`created ${BOXES} boxes in ${createSeconds.toFixed(0)} s; env ${(envBytes / 1024).toFixed(0)} KiB, a record ${(recordBytes / 1024).toFixed(0)} KiB as JSON`);

    const builds: Array<[Run['build'], string]> = [];
    for (let r = 0; r < RUNS; r++) {
      if (BASELINE) builds.push(['baseline', BASELINE]);
      builds.push(['this checkout', join(ROOT, 'dist/operator/main.js')]);
    }
    const runs: Run[] = [];
    for (const [build, script] of builds) runs.push(await runOperator(build, script));

    const pool = (await custom.getClusterCustomObject({ group: 'sandbox-bridge.io', version: 'v1alpha1', plural: 'sandboxpools', name: poolName })) as {
      status?: { totalBoxesCreated?: number; activeBoxes?: number };
    };
    const host = `${cpus().length} cores, Node ${process.versions.node}`;
    const command = `${BASELINE ? `BENCH_BASELINE_OPERATOR=${BASELINE} ` : ''}BENCH_BOXES=${BOXES} BENCH_ENV_KIB=${ENV_KIB} BENCH_NODES=${NODES} BENCH_RUNS=${RUNS} npm run bench:operator-secrets`;
    const rows = runs.map((r) => `| ${r.build} | ${r.peakRssMiB.toFixed(0)} MiB | ${r.endRssMiB.toFixed(0)} MiB | ${r.readySeconds.toFixed(1)} s | ${r.reconciledSeconds.toFixed(1)} s | ${r.cpuSeconds.toFixed(1)} s | ${r.reaped} |`);
    const md = [
      '# Operator memory with large box Secrets',
      '',
      `${new Date().toISOString()} — ${host}`,
      '',
      `    ${command}`,
      '',
      `${BOXES} boxes (pods on ${nodes.length} simulated nodes), each with a record Secret holding ${(envBytes / 1024).toFixed(0)} KiB of env (${(recordBytes / 1024).toFixed(0)} KiB per Secret as JSON, its data base64); setup took ${createSeconds.toFixed(0)} s. Each operator ran until its caches were filled and the pool reconciled, then ${SETTLE_MS / 1000} s more.`,
      '',
      '| operator | peak RSS | RSS at end | caches filled | pool reconciled | CPU | reaped |',
      '|---|---|---|---|---|---|---|',
      ...rows,
      '',
      `Pool status afterwards: activeBoxes ${pool.status?.activeBoxes ?? '?'}, totalBoxesCreated ${pool.status?.totalBoxesCreated ?? '?'} (both should be ${BOXES}).`,
      '',
    ].join('\n');
    process.stdout.write(`\n${md}\n`);
    writeResults(ROOT, 'operator-secrets', md, {
      date: new Date().toISOString(),
      command,
      boxes: BOXES,
      envBytes,
      recordBytes,
      nodes: nodes.length,
      createSeconds,
      runs,
      status: pool.status,
    });
  } finally {
    log('cleaning up');
    await deletePool(custom, poolName);
    await core.deleteNamespace({ name: ns }).catch(() => undefined);
    await kc.makeApiClient(k8s.CoordinationV1Api).deleteNamespacedLease({ name: leaseName, namespace: 'default' }).catch(() => undefined);
    await core.deleteCollectionNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${poolName}` }).catch(() => undefined);
    await waitUntil('the namespace to go', async () => !(await core.readNamespace({ name: ns }).then(() => true, () => false)), 900_000, 2000).catch((err: unknown) =>
      log(err instanceof Error ? err.message : String(err)),
    );
    if (kwokNodes().length > before) {
      log(`removing the simulated nodes added: back to ${before}`);
      kwokctl(before);
    }
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
