// A converged operator writes nothing: pod and record events keep queueing its pool's reconcile,
// and every one of those reconciles must find the namespace, quota, limit range and network
// policy as they should be and leave them alone, and its warm boxes (pods, their seats, the pool's
// warm status) as many as planned, also after a restart (caches filled by lists). Counted at an API proxy in front of the
// operator (every request it makes), not from the operator's own metrics.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { LABELS } from '../../common/labels.js';
import { ApiProxy } from '../support/api-proxy.js';
import { ON_SIMULATED_NODES, TEST_BOXD_IMAGE, TEST_BOXD_KEY } from '../support/bridge.js';
import { testKubeConfig, waitFor } from '../support/cluster.js';
import { Pools, boxPod, boxRecord, deleteLease, installCrd, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const shard = uniqueName('rest');
const pools = new Pools(kc, shard);
const leaseName = `op-test-${shard}`;
const dir = mkdtempSync(join(tmpdir(), 'operator-at-rest-'));
const proxy = new ApiProxy(kc);
let operator: OperatorProcess | undefined;

const IDLE_SECONDS = 60;
const TICK_MS = 2_000;
/** Warm boxes on kwok's nodes (Ready as soon as they are scheduled): the warm pool at rest, without the real node. */
const WARM = 2;
const BOXD = { BOXD_IMAGE: TEST_BOXD_IMAGE, BOXD_KEY: TEST_BOXD_KEY };

beforeAll(async () => {
  await installCrd(kc);
  await proxy.start();
  operator = await startOperator({ shard, leaseName, env: BOXD });
});

afterAll(async () => {
  await pools.cleanup();
  await operator?.stop();
  await deleteLease(kc, leaseName);
  await proxy.stop();
  rmSync(dir, { recursive: true, force: true });
});

test(`over ${IDLE_SECONDS} s of reconciles with nothing to change, the operator makes no write`, async () => {
  const { name: pool, ns } = await pools.createReady({ maxBoxes: 10, ...ON_SIMULATED_NODES, warm: { count: WARM } });
  const boxes = ['a', 'b', 'c'].map((s) => `${pool}-${s}`);
  for (const name of boxes) {
    await core.createNamespacedSecret({ namespace: ns, body: { ...boxRecord(name, pool), metadata: { ...boxRecord(name, pool).metadata, namespace: ns } } });
    await core.createNamespacedPod({ namespace: ns, body: boxPod(name, pool) });
  }
  for (const name of boxes) {
    await waitFor(`box ${name} running`, async () => ((await core.readNamespacedPod({ namespace: ns, name })).status?.phase === 'Running' ? true : undefined));
  }
  // Let the pool's status catch up with its boxes (a real change, written once).
  await waitFor('the pool to count its 3 boxes and its warm boxes', async () => {
    const status = (await pools.get(pool)).status;
    return status?.activeBoxes === 3 && status.warmReady === WARM ? true : undefined;
  });
  const warmPods = async () => (await core.listNamespacedPod({ namespace: ns, labelSelector: `${LABELS.warm}=${pool}` })).items.map((p) => p.metadata!.uid!).sort();
  const warmBefore = await warmPods();
  expect(warmBefore).toHaveLength(WARM);
  // A fresh operator, through the proxy: its caches now start from lists, whose items carry no
  // apiVersion or kind (the ones a running operator applied come from watch events, which do).
  await operator!.stop();
  await deleteLease(kc, leaseName);
  const kubeconfig = join(dir, 'kubeconfig');
  writeFileSync(kubeconfig, proxy.kubeConfig().exportConfig());
  operator = await startOperator({ shard, leaseName, env: { ...BOXD, KUBECONFIG: kubeconfig } });
  await new Promise((r) => setTimeout(r, 3_000));

  const from = proxy.requests.length;
  const reconcilesBefore = (await operator!.metric('sandbox_operator_reconcile_total')) ?? 0;
  const ticks = Math.floor((IDLE_SECONDS * 1000) / TICK_MS);
  for (let i = 0; i < ticks; i++) {
    // A pod event of the pool's namespace queues a pool reconcile; the annotation is not the operator's.
    const name = boxes[i % boxes.length]!;
    await core.patchNamespacedPod(
      { namespace: ns, name, body: { metadata: { annotations: { 'test.sandbox-bridge.io/tick': String(i) } } } },
      k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
    );
    await new Promise((r) => setTimeout(r, TICK_MS));
  }
  const reconciles = ((await operator!.metric('sandbox_operator_reconcile_total')) ?? 0) - reconcilesBefore;
  const made = proxy.requests.slice(from).filter((r) => !r.watch);
  // The leader lease is renewed on its own clock; everything else would be the reconciles'.
  const writes = made.filter((r) => r.method !== 'GET' && !/\/leases\//.test(r.url));
  const counts = new Map<string, number>();
  for (const r of made) counts.set(`${r.method} ${r.url.split('?')[0]}`, (counts.get(`${r.method} ${r.url.split('?')[0]}`) ?? 0) + 1);
  console.log(`${reconciles} reconciles in ${IDLE_SECONDS} s; operator requests: ${made.length} (${[...counts].map(([k, n]) => `${n} x ${k}`).join(', ')})`);
  expect(reconciles).toBeGreaterThanOrEqual(ticks / 2);
  expect(writes).toEqual([]);
  // The same warm pods all along (none let go and started again between two looks).
  expect(await warmPods()).toEqual(warmBefore);
}, 180_000);
