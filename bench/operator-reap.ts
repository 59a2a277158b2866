// Bench: the operator reaps 10,000 already-expired boxes on a cluster of 1,000 simulated nodes.
// Targets: all deleted within 60 s of the operator starting, operator RSS <= 256 MiB.
//
//   npm run bench:operator                (BENCH_BOXES=10000 BENCH_NODES=1000 by default)
//
// Scales the local cluster to BENCH_NODES kwok nodes (test/cluster/up.sh), creates the boxes
// bound round-robin to those nodes (spec.nodeName, so creating them does not also benchmark the
// scheduler) with an expires-at in the past, then starts `node dist/operator/main.js` and
// measures: time until every delete was issued, time until every pod is gone from the API (kwok
// finalizes the graceful deletions), the operator's peak RSS (the kernel's VmHWM) and the CPU time it and the cluster used.
// Afterwards it deletes its pool, namespace and lease, and removes the nodes it added.
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { NODE_FLAGS } from '../common/node-flags.js';
import { writeResults } from './results-file.js';
import { clusterUp, createBenchPool, deletePool, ensureCluster, kubectl as runKubectl } from './setup.js';

const ROOT = process.cwd();
const BOXES = Number(process.env.BENCH_BOXES ?? 10_000);
const NODES = Number(process.env.BENCH_NODES ?? 1000);
const CREATE_CONCURRENCY = Number(process.env.BENCH_CREATE_CONCURRENCY ?? 64);
const KEEP_NODES = process.env.BENCH_KEEP_NODES === '1';
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const id = randomBytes(3).toString('hex');
const poolName = `bench-reap-${id}`;
const ns = `bench-reap-${id}`;
const leaseName = `bench-reap-${id}`;

ensureCluster(ROOT, KUBECONFIG, ['--nodes', String(NODES), '--no-real-node']);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);

function log(msg: string): void {
  process.stderr.write(`[bench] ${msg}\n`);
}

const kubectl = (...args: string[]) => runKubectl(ROOT, KUBECONFIG, ...args);

async function mapLimit<T>(items: T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: limit }, async () => {
    while (next < items.length) await fn(items[next++]!);
  }));
}

async function countBoxes(): Promise<number> {
  const page = await core.listNamespacedPod({ namespace: ns, labelSelector: 'sandbox-bridge.io/box=true', limit: 1 });
  return page.items.length + (page.metadata?.remainingItemCount ?? 0);
}

/** CPU seconds (user + system) a process has used so far; 0 once it is gone. */
function cpuSeconds(pid: number): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime in clock ticks (USER_HZ 100)
  } catch {
    return 0;
  }
}

/** The local cluster's processes whose CPU the bench reports beside the operator's (process names as /proc shows them, cut at 15 characters). */
function clusterPids(): Record<string, number[]> {
  const pids: Record<string, number[]> = {};
  for (const name of ['kube-apiserver', 'etcd', 'kwok-controller', 'kube-controller']) {
    const r = spawnSync('pgrep', ['-x', name], { encoding: 'utf8' });
    pids[name] = r.stdout.split('\n').filter(Boolean).map(Number);
  }
  return pids;
}

/** Current RSS, or with `peak` the kernel's high-water mark of it (VmHWM), in MiB; 0 once gone. */
function rssMiB(pid: number, peak = false): number {
  try {
    const m = new RegExp(`${peak ? 'VmHWM' : 'VmRSS'}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : 0;
  } catch {
    return 0;
  }
}

async function main(): Promise<void> {
  const kwokNodes = () => kubectl('get', 'nodes', '-l', 'type=kwok', '-o', 'name').trim().split('\n').filter(Boolean);
  const before = kwokNodes();
  if (before.length < NODES) {
    log(`scaling the cluster from ${before.length} to ${NODES} simulated nodes`);
    clusterUp(ROOT, ['--nodes', String(NODES), '--no-real-node']);
  }
  const nodes = kwokNodes().map((n) => n.replace('node/', '')).slice(0, NODES);
  log(`${nodes.length} simulated nodes`);

  await createBenchPool(
    { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
    { name: poolName, labels: { 'sandbox-bridge.io/bench': id }, spec: { namespace: ns, maxBoxes: BOXES * 2, defaultTtlSeconds: 3600 } },
  );

  const expired = new Date(Date.now() - 60_000).toISOString();
  const createStart = Date.now();
  let created = 0;
  await mapLimit(Array.from({ length: BOXES }, (_, i) => i), CREATE_CONCURRENCY, async (i) => {
    for (let attempt = 0; ; attempt++) {
      try {
        await core.createNamespacedPod({
          namespace: ns,
          body: {
            metadata: {
              name: `box-${i}`,
              labels: { 'sandbox-bridge.io/box': 'true', 'sandbox-bridge.io/pool': poolName, 'app.kubernetes.io/managed-by': 'sandbox-bridge' },
              annotations: { 'sandbox-bridge.io/expires-at': expired },
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
        });
        break;
      } catch (err) {
        if (err instanceof k8s.ApiException && err.code === 409) break;
        if (attempt >= 5) throw err;
        await new Promise((r) => setTimeout(r, 200 * (attempt + 1)));
      }
    }
    if (++created % 1000 === 0) log(`created ${created}/${BOXES} boxes (${((Date.now() - createStart) / 1000).toFixed(1)} s)`);
  });
  const createSeconds = (Date.now() - createStart) / 1000;
  log(`created ${BOXES} expired boxes in ${createSeconds.toFixed(1)} s (${(BOXES / createSeconds).toFixed(0)}/s)`);

  // The operator under test: the real entry point, scoped to this bench's pool.
  const components = clusterPids();
  const cpuOf = () => Object.fromEntries(Object.entries(components).map(([k, pids]) => [k, pids.reduce((a, p) => a + cpuSeconds(p), 0)]));
  const cpuBefore = cpuOf();
  const port = 19000 + Math.floor(Math.random() * 1000);
  const start = Date.now();
  const op = spawn(join(ROOT, 'node_modules/.bin/node'), [...NODE_FLAGS.operator, join(ROOT, 'dist/operator/main.js')], {
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

  const reapedTotal = async () => {
    const text = await fetch(`http://127.0.0.1:${port}/metrics`).then((r) => r.text()).catch(() => '');
    return text.split('\n').filter((l) => l.startsWith('sandbox_operator_boxes_reaped_total{')).reduce((a, l) => a + Number(l.split(' ').pop()), 0);
  };
  let issuedAt: number | undefined;
  let goneAt: number | undefined;
  const deadline = start + 300_000;
  while (Date.now() < deadline && goneAt === undefined) {
    await new Promise((r) => setTimeout(r, 250));
    if (issuedAt === undefined && (await reapedTotal()) >= BOXES) issuedAt = Date.now();
    const left = await countBoxes().catch(() => BOXES);
    if (left === 0) goneAt = Date.now();
  }
  const pool = (await custom.getClusterCustomObject({ group: 'sandbox-bridge.io', version: 'v1alpha1', plural: 'sandboxpools', name: poolName })) as {
    status?: { totalBoxesCreated?: number; activeBoxes?: number };
  };
  const cpuAfter = cpuOf();
  const operatorCpu = cpuSeconds(op.pid!);
  const peakRss = rssMiB(op.pid!, true);
  const finalRss = rssMiB(op.pid!);
  op.kill('SIGTERM');
  await new Promise((r) => op.once('exit', r));

  const secs = (t: number | undefined) => (t === undefined ? 'not reached' : `${((t - start) / 1000).toFixed(1)} s`);
  const rows: Array<[string, string, string]> = [
    ['simulated nodes', String(nodes.length), ''],
    ['expired boxes', String(BOXES), ''],
    ['box creation (setup)', `${createSeconds.toFixed(1)} s`, ''],
    ['operator start -> all deletes issued', secs(issuedAt), ''],
    ['operator start -> all boxes gone', secs(goneAt), '<= 60 s'],
    ['operator peak RSS', `${peakRss.toFixed(0)} MiB`, '<= 256 MiB'],
    ['operator RSS at end', `${finalRss.toFixed(0)} MiB`, ''],
    ['CPU used meanwhile: operator / ' + Object.keys(cpuAfter).join(' / '), [operatorCpu, ...Object.keys(cpuAfter).map((k) => cpuAfter[k]! - cpuBefore[k]!)].map((s) => `${s.toFixed(0)} s`).join(' / '), ''],
    ['status.totalBoxesCreated', String(pool.status?.totalBoxesCreated ?? '?'), `= ${BOXES}`],
    ['status.activeBoxes', String(pool.status?.activeBoxes ?? '?'), '= 0'],
  ];
  const table = ['| measure | value | target |', '|---|---|---|', ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
  const host = `${process.env.BENCH_HOST ?? ''}${(await import('node:os')).cpus().length} cores, Node ${process.versions.node}`;
  const md = `# Operator reap bench\n\n${new Date().toISOString()} — ${host}\n\n${table}\n`;
  process.stdout.write(`\n${table}\n`);
  writeResults(ROOT, 'operator-reap', md, {
    date: new Date().toISOString(),
    nodes: nodes.length,
    boxes: BOXES,
    createSeconds,
    issuedSeconds: issuedAt && (issuedAt - start) / 1000,
    goneSeconds: goneAt && (goneAt - start) / 1000,
    peakRssMiB: Math.round(peakRss),
    cpuSeconds: { operator: operatorCpu, ...Object.fromEntries(Object.keys(cpuAfter).map((k) => [k, cpuAfter[k]! - cpuBefore[k]!])) },
    totalBoxesCreated: pool.status?.totalBoxesCreated,
  });


  log('cleaning up');
  await deletePool(custom, poolName);
  await core.deleteNamespace({ name: ns }).catch(() => undefined);
  await kc.makeApiClient(k8s.CoordinationV1Api).deleteNamespacedLease({ name: leaseName, namespace: 'default' }).catch(() => undefined);
  await core.deleteCollectionNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${poolName}` }).catch(() => undefined);
  if (!KEEP_NODES && before.length < NODES) {
    // Through kwokctl, as up.sh scaled up: nodes deleted behind its back made the next scale-up
    // (e.g. the bridge bench's) wait for nodes that were still going away.
    log(`scaling back to ${before.length} simulated nodes`);
    spawnSync(join(ROOT, '.cluster/bin/kwokctl'), ['scale', 'node', '--name', 'sandbox-bridge', '--config', join(ROOT, '.cluster/kwok.yaml'), '--replicas', String(before.length)], {
      env: { ...process.env, KWOK_WORKDIR: join(ROOT, '.cluster/kwok') },
      stdio: 'ignore',
    });
  }

}

main().catch((err: unknown) => {
  process.stderr.write(`bench failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
