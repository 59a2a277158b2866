// What the benches share: the local cluster (started if need be), the SandboxPool CRD (a fresh
// cluster has none) and one pool over its own restricted namespace, the local object store's
// settings, free ports and percentiles.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { createBridgeClient, type BridgeClient } from '../client/index.js';
import { LABELS } from '../common/labels.js';
import { nodeFlagsFor } from '../common/node-flags.js';
import { POOL_API_VERSION, POOL_GROUP, POOL_KIND, POOL_PLURAL, POOL_VERSION } from '../common/pool.js';

/** kubectl from the local cluster's binaries; throws with its stderr on failure. */
export function kubectl(root: string, kubeconfig: string, ...args: string[]): string {
  const r = spawnSync(join(root, '.cluster/bin/kubectl'), ['--kubeconfig', kubeconfig, ...args], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`kubectl ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

/** Runs test/cluster/up.sh: starts the local cluster, or scales a running one (`--nodes N`). */
export function clusterUp(root: string, args: string[]): void {
  const up = spawnSync('bash', [join(root, 'test/cluster/up.sh'), ...args], { stdio: ['ignore', 'ignore', 'inherit'] });
  if (up.status !== 0) throw new Error(`test/cluster/up.sh ${args.join(' ')} failed`);
}

/**
 * Starts the local cluster with `up.sh args` unless it is already up, as the tests' global setup
 * does, so a bench runs on a fresh checkout too.
 */
export function ensureCluster(root: string, kubeconfig: string, args: string[]): void {
  const ready = spawnSync(join(root, '.cluster/bin/kubectl'), ['--kubeconfig', kubeconfig, 'get', '--raw', '/readyz'], { stdio: 'ignore' });
  if (ready.status !== 0) clusterUp(root, args);
}

/** The local cluster (started unless up) and the API clients a bench uses. */
export function benchCluster(root: string, kubeconfig: string): { kc: k8s.KubeConfig; core: k8s.CoreV1Api; custom: k8s.CustomObjectsApi } {
  ensureCluster(root, kubeconfig, []);
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(kubeconfig);
  return { kc, core: kc.makeApiClient(k8s.CoreV1Api), custom: kc.makeApiClient(k8s.CustomObjectsApi) };
}

/** The SandboxPool CRD as the chart ships it, applied and Established. */
export function installPoolCrd(root: string, kubeconfig: string): void {
  kubectl(root, kubeconfig, 'apply', '--server-side', '--force-conflicts', '--field-manager=sandbox-bridge-bench', '-f', join(root, 'charts/sandbox-bridge/crds/sandboxpools.sandbox-bridge.io.yaml'));
  kubectl(root, kubeconfig, 'wait', '--for=condition=Established', 'crd/sandboxpools.sandbox-bridge.io', '--timeout=30s');
}

/** A SandboxPool (the spec as sent: the API server fills in the CRD's defaults). */
export async function createPool(
  custom: k8s.CustomObjectsApi,
  pool: { name: string; labels: Record<string, string>; spec: { namespace: string } & Record<string, unknown> },
): Promise<void> {
  await custom.createClusterCustomObject({
    group: POOL_GROUP,
    version: POOL_VERSION,
    plural: POOL_PLURAL,
    body: { apiVersion: POOL_API_VERSION, kind: POOL_KIND, metadata: { name: pool.name, labels: pool.labels }, spec: pool.spec },
  });
}

/** Deletes a SandboxPool, if there is one (a bench's clean-up: nothing to report). */
export async function deletePool(custom: k8s.CustomObjectsApi, name: string): Promise<void> {
  await custom.deleteClusterCustomObject({ group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name }).catch(() => undefined);
}

/** The CRD, the pool's namespace made here (restricted Pod Security), and the pool. */
export async function createBenchPool(
  opts: { root: string; kubeconfig: string; core: k8s.CoreV1Api; custom: k8s.CustomObjectsApi },
  pool: { name: string; labels: Record<string, string>; spec: { namespace: string } & Record<string, unknown> },
): Promise<void> {
  installPoolCrd(opts.root, opts.kubeconfig);
  await opts.core.createNamespace({ body: { metadata: { name: pool.spec.namespace, labels: { 'pod-security.kubernetes.io/enforce': 'restricted' } } } });
  await createPool(opts.custom, pool);
}

/** A TCP port free on loopback right now. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
}

/** The nearest-rank percentile p (0-100) of values. */
export function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)] ?? NaN;
}

/** OBJECT_STORE_* settings of the local cluster's store (test/cluster/object-store/), with a key prefix and a fresh seal key. */
export function objectStoreEnv(root: string, prefix: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const line of readFileSync(join(root, '.cluster/object-store/env'), 'utf8').split('\n')) {
    const at = line.indexOf('=');
    if (at > 0) env[line.slice(0, at)] = line.slice(at + 1);
  }
  return { ...env, OBJECT_STORE_PREFIX: prefix, SNAPSHOT_ENCRYPTION_KEY: randomBytes(32).toString('hex') };
}

/** The boxd image the local cluster builds and imports (test/cluster/real-node/images.sh). */
export const BOXD_IMAGE = 'sandbox-bridge.local/boxd:dev';
export const REAL_NODE_LABEL = 'sandbox-bridge.io/real-node';
/** A pool's box placement on the local cluster's real node (where boxd runs). */
export const ON_REAL_NODE = {
  nodeSelector: { [REAL_NODE_LABEL]: 'true' },
  tolerations: [{ key: REAL_NODE_LABEL, operator: 'Exists', effect: 'NoSchedule' }],
};

/** Polls check until it holds (a failed check counts as not yet); throws after timeoutMs. */
export async function waitUntil(what: string, check: () => Promise<boolean>, timeoutMs = 180_000, everyMs = 250): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, everyMs));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** One of the programs (dist/bridge/main.js, dist/operator/main.js) as its own process, its output on ours. */
export function startProgram(root: string, kubeconfig: string, script: string, env: Record<string, string>): ChildProcess {
  return spawn(process.execPath, [...nodeFlagsFor(script), join(root, script)], {
    env: { PATH: process.env.PATH, KUBECONFIG: kubeconfig, LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
}

/** Warm pods of a pool that are ready (Ready, not being deleted). */
export async function warmReady(core: k8s.CoreV1Api, namespace: string, pool: string): Promise<number> {
  const pods = await core.listNamespacedPod({ namespace, labelSelector: `${LABELS.warm}=${pool}` });
  return pods.items.filter((p) => !p.metadata?.deletionTimestamp && p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')).length;
}

/**
 * The warm-pool benches' pool (bench:warm, bench:peers): boxes of 50m and memoryMi on the real
 * node, `warm` of them kept warm, room for warm + claimed + refilling ones.
 */
export function warmBenchPoolSpec(o: { namespace: string; warm: number; memoryMi: number }): { namespace: string } & Record<string, unknown> {
  return {
    namespace: o.namespace,
    maxBoxes: o.warm * 3 + 5,
    maxBoxesPerSession: 3,
    box: {
      defaultImage: 'sandbox-bridge.local/box:dev',
      // Boxes get what they request (Guaranteed QoS), and the real node's 2 allocatable cores
      // hold 40 such boxes at once (20 warm, 20 claimed: refills beyond that are scheduled as
      // claimed boxes go). At 10m a box's own start
      // (runc init, the boxd copy) and first command crawl under the CFS quota (measured:
      // 13 s to start, 300 ms for `true`); 50m is the least that does not.
      defaultCpu: '50m',
      defaultMemory: `${o.memoryMi}Mi`,
      ...ON_REAL_NODE,
    },
    warm: { count: o.warm },
  };
}

/** The operator as its own process for the pools labelled `sandbox-bridge.io/bench=<id>`, with its own lease. */
export async function startBenchOperator(root: string, kubeconfig: string, o: { pool: string; id: string; boxdKey: string; env?: Record<string, string> }): Promise<ChildProcess> {
  return startProgram(root, kubeconfig, 'dist/operator/main.js', {
    METRICS_PORT: String(await freePort()),
    METRICS_HOST: '127.0.0.1',
    LEASE_NAMESPACE: 'default',
    LEASE_NAME: `${o.pool}-lease`,
    POD_NAME: `${o.pool}-operator`,
    POOL_SELECTOR: `sandbox-bridge.io/bench=${o.id}`,
    BOXD_IMAGE,
    BOXD_KEY: o.boxdKey,
    ...o.env,
  });
}

/** A bridge replica as its own process on a free loopback port (rate limit out of the way), once it answers. */
export async function startBenchBridge(
  root: string,
  kubeconfig: string,
  o: { token: string; boxdKey: string; pool: string; namespace: string; env?: Record<string, string> },
): Promise<{ child: ChildProcess; client: BridgeClient }> {
  const port = await freePort();
  const child = startProgram(root, kubeconfig, 'dist/bridge/main.js', {
    BRIDGE_TOKEN: o.token,
    BOXD_KEY: o.boxdKey,
    BOXD_IMAGE,
    POOL_NAME: o.pool,
    SANDBOX_NAMESPACE: o.namespace,
    PORT: String(port),
    METRICS_PORT: String(await freePort()),
    HOST: '127.0.0.1',
    RATE_LIMIT_RPS: '100000',
    RATE_LIMIT_BURST: '100000',
    ...o.env,
  });
  const url = `http://127.0.0.1:${port}`;
  await waitUntil('a bridge to start', async () => (await fetch(`${url}/api/v1/health`, { headers: { authorization: `Bearer ${o.token}` } })).ok, 60_000);
  return { child, client: createBridgeClient({ url, token: o.token, retries: 0 }) };
}

/** Create -> first exec (`true`) answered, in ms; the create alone; whether a warm pod served it. */
export async function createAndExec(client: BridgeClient, session: string, memory: number): Promise<{ total: number; create: number; boxId: string; warm: boolean; t0: number }> {
  const t0 = performance.now();
  const box = await client.createBox({ sessionId: session, memory });
  const create = performance.now() - t0;
  const r = await client.exec(box.box_id, { command: 'true' });
  if (r.exit_code !== 0) throw new Error(`first exec exited ${r.exit_code}`);
  return { total: performance.now() - t0, create, boxId: box.box_id, warm: box.pod_name !== box.box_id, t0 };
}

/** n, p50, p99 and max of a sample. */
export const stats = (v: number[]) => ({ n: v.length, p50: percentile(v, 50), p99: percentile(v, 99), max: Math.max(...v) });
