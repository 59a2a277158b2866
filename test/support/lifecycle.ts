// What the box lifecycle tests share (docs/lifecycle.md): a pool whose boxes run on the real node,
// its operator as a real process (it decides sleeps), bridge replicas watching the pool (they
// wake), all on the local object store; and small probes of what a box looks like from outside.
import * as k8s from '@kubernetes/client-node';
import type { RunningBridge } from '../../bridge/server.js';
import { TEST_BOXD_IMAGE, TEST_BOXD_KEY, startTestBridge } from './bridge.js';
import { testKubeConfig } from './cluster.js';
import { localObjectStore } from './object-store.js';
import { Pools, installCrd, startOperator, uniqueName, type OperatorProcess } from './operator.js';

export const kc = testKubeConfig();
export const core = kc.makeApiClient(k8s.CoreV1Api);

/** A box lease in tests: short, so a dead holder's lease runs out within seconds. */
export const TEST_LEASE_SECONDS = 6;

export interface LifecycleEnv {
  pools: Pools;
  pool: { name: string; ns: string };
  operator: OperatorProcess;
  bridges: RunningBridge[];
  /** OBJECT_STORE_* and SNAPSHOT_ENCRYPTION_KEY, as the operator and bridges got them. */
  storeEnv: Record<string, string>;
  /** Starts one more bridge replica of the pool (extra settings on top). */
  addBridge(env?: Record<string, string>): Promise<RunningBridge>;
  /** Restarts the operator (after a kill), with the same settings. */
  restartOperator(): Promise<OperatorProcess>;
  stop(): Promise<void>;
}

export async function startLifecycle(o: {
  name: string;
  pool: Record<string, unknown>;
  bridges?: number;
  operatorEnv?: Record<string, string>;
  bridgeEnv?: Record<string, string>;
}): Promise<LifecycleEnv> {
  const store = await localObjectStore();
  if (!store.available) throw new Error(`no object store: ${store.reason}`);
  await installCrd(kc);
  const pools = new Pools(kc, uniqueName(o.name));
  const leaseName = uniqueName(`${o.name}-lease`);
  const operatorEnv = { ...store.env, BOXD_IMAGE: TEST_BOXD_IMAGE, BOXD_KEY: TEST_BOXD_KEY, BOX_LEASE_SECONDS: String(TEST_LEASE_SECONDS), ...o.operatorEnv };
  let operator = await startOperator({ leaseName, shard: pools.shard, env: operatorEnv });
  const pool = await pools.createReady(o.pool);
  const bridgeEnv = { POOL_NAME: pool.name, SANDBOX_NAMESPACE: pool.ns, BOX_LEASE_SECONDS: String(TEST_LEASE_SECONDS), ...store.env, ...o.bridgeEnv };
  const bridges = await Promise.all(Array.from({ length: o.bridges ?? 1 }, () => startTestBridge(kc, undefined, bridgeEnv)));
  const env: LifecycleEnv = {
    pools,
    pool,
    get operator() {
      return operator;
    },
    bridges,
    storeEnv: store.env,
    async addBridge(extra = {}) {
      const b = await startTestBridge(kc, undefined, { ...bridgeEnv, ...extra });
      bridges.push(b);
      return b;
    },
    async restartOperator() {
      await operator.stop();
      operator = await startOperator({ leaseName, shard: pools.shard, env: operatorEnv, name: uniqueName('operator') });
      return operator;
    },
    async stop() {
      await Promise.all(bridges.map((b) => b.close()));
      await operator.stop();
      await pools.cleanup();
    },
  };
  return env;
}

export async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 90_000, everyMs = 250): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** The pods of a box (cold ones are named after it, claimed warm ones carry its id). */
export async function boxPods(namespace: string, boxId: string): Promise<k8s.V1Pod[]> {
  return (await core.listNamespacedPod({ namespace, labelSelector: `sandbox-bridge.io/box-id=${boxId}` })).items;
}

export async function record(namespace: string, boxId: string): Promise<k8s.V1Secret | undefined> {
  return core.readNamespacedSecret({ name: boxId, namespace }).catch(() => undefined);
}

/** A metric summed over the label sets that carry `labels`, from a /metrics endpoint. */
export async function metricAt(base: string, name: string, labels: Record<string, string> = {}): Promise<number> {
  const text = await (await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(5000) })).text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) sum += Number(line.split(' ').at(-1));
  }
  return sum;
}

export function operatorMetric(op: OperatorProcess, name: string, labels: Record<string, string> = {}): Promise<number> {
  return metricAt(`http://127.0.0.1:${op.port}`, name, labels);
}

/** Events about an object (by uid) in a namespace. */
export async function eventsAbout(namespace: string, uid: string): Promise<k8s.CoreV1Event[]> {
  return (await core.listNamespacedEvent({ namespace, fieldSelector: `involvedObject.uid=${uid}` })).items;
}
