// Box housekeeping against the real API server: expired, finished and orphaned objects are
// deleted on time (timers, not polling), each reap is recorded as an Event on the pool, and
// totalBoxesCreated continues across an operator restart without double counting.
import * as k8s from '@kubernetes/client-node';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS } from '../../common/labels.js';
import { waitFor, testKubeConfig } from '../support/cluster.js';
import { Pools, boxPod, boxRecord, deleteLease, installCrd, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const shard = uniqueName('reap');
const pools = new Pools(kc, shard);
const leaseName = `op-test-${shard}`;
let operator: OperatorProcess;
/** When the pod was first seen deleted (deletionTimestamp set or gone), polling every 25 ms. */
async function deletedAt(ns: string, name: string, timeoutMs: number): Promise<number> {
  return waitFor(
    `pod ${name} to be deleted`,
    async () => {
      try {
        const pod = await core.readNamespacedPod({ name, namespace: ns });
        return pod.metadata?.deletionTimestamp ? Date.now() : undefined;
      } catch (err) {
        if (err instanceof k8s.ApiException && err.code === 404) return Date.now();
        throw err;
      }
    },
    { timeoutMs, intervalMs: 25 },
  );
}

beforeAll(async () => {
  await installCrd(kc);
  operator = await startOperator({ shard, leaseName, env: { ORPHAN_SECRET_GRACE_SECONDS: '1' } });
});

afterAll(async () => {
  await pools.cleanup();
  await operator?.stop();
  await deleteLease(kc, leaseName);
});

test('a box past its expires-at is deleted within 2 s of expiry, not before, and an Event records it', async () => {
  const { name, ns } = await pools.createReady();
  const expiry = Math.ceil(Date.now() / 1000) * 1000 + 3000;
  const expiresAt = new Date(expiry).toISOString().replace('.000Z', 'Z');
  await core.createNamespacedPod({ namespace: ns, body: boxPod('short-lived', name, { 'sandbox-bridge.io/expires-at': expiresAt }) });
  await core.createNamespacedPod({ namespace: ns, body: boxPod('long-lived', name, { 'sandbox-bridge.io/expires-at': '2099-01-01T00:00:00Z' }) });

  const at = await deletedAt(ns, 'short-lived', 10_000);
  expect(at).toBeGreaterThanOrEqual(expiry);
  expect(at - expiry).toBeLessThanOrEqual(2000);
  await expect(core.readNamespacedPod({ name: 'long-lived', namespace: ns })).resolves.toBeDefined();

  const event = await waitFor('the reap event', async () => {
    const events = await core.listNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${name}` });
    return events.items.find((e) => e.reason === 'BoxExpired');
  });
  expect(event.involvedObject.kind).toBe('SandboxPool');
  expect(event.message).toContain('short-lived');
  expect(await operator.metric('sandbox_operator_boxes_reaped_total')).toBeGreaterThanOrEqual(1);
});

test("without the annotation a box lives for the pool's defaultTtlSeconds from creation", async () => {
  const { name, ns } = await pools.createReady({ defaultTtlSeconds: 2 });
  const pod = await core.createNamespacedPod({ namespace: ns, body: boxPod('plain', name) });
  const expiry = new Date(pod.metadata!.creationTimestamp!).getTime() + 2000;
  const at = await deletedAt(ns, 'plain', 10_000);
  expect(at).toBeGreaterThanOrEqual(expiry);
  expect(at - expiry).toBeLessThanOrEqual(2000);
});

test('a finished box and an orphaned env Secret are deleted; a live box keeps its Secret', async () => {
  const { name, ns } = await pools.createReady();
  const finished = boxPod('finished', name);
  finished.spec!.nodeSelector = { 'sandbox-bridge.io/no-such-node': 'true' };
  await core.createNamespacedPod({ namespace: ns, body: finished });
  const live = await core.createNamespacedPod({ namespace: ns, body: boxPod('alive', name) });
  const secret = (n: string, owner?: k8s.V1Pod): k8s.V1Secret => ({
    metadata: {
      name: n,
      labels: { 'sandbox-bridge.io/box': 'true' },
      ...(owner ? { ownerReferences: [{ apiVersion: 'v1', kind: 'Pod', name: owner.metadata!.name!, uid: owner.metadata!.uid! }] } : {}),
    },
    stringData: { FOO: 'bar' },
  });
  await core.createNamespacedSecret({ namespace: ns, body: secret('alive-env', live) });
  await core.createNamespacedSecret({ namespace: ns, body: secret('ghost-env') });
  await core.replaceNamespacedPodStatus({
    name: 'finished',
    namespace: ns,
    body: { ...(await core.readNamespacedPod({ name: 'finished', namespace: ns })), status: { phase: 'Failed' } },
  });

  await deletedAt(ns, 'finished', 10_000);
  await waitFor('the orphaned Secret to go', async () =>
    core.readNamespacedSecret({ name: 'ghost-env', namespace: ns }).then(
      () => undefined,
      (err: unknown) => (err instanceof k8s.ApiException && err.code === 404 ? true : undefined),
    ),
  );
  await expect(core.readNamespacedSecret({ name: 'alive-env', namespace: ns })).resolves.toBeDefined();
  await expect(core.readNamespacedPod({ name: 'alive', namespace: ns })).resolves.toBeDefined();
  const reasons = await waitFor('both events', async () => {
    const events = await core.listNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${name}` });
    const r = events.items.map((e) => e.reason);
    return r.includes('BoxFinished') && r.includes('OrphanedSecretDeleted') ? r : undefined;
  });
  expect(reasons).toEqual(expect.arrayContaining(['BoxFinished', 'OrphanedSecretDeleted']));
});

test("a warm seat is not freed while the API server shows a pod holding it, though the operator's caches do not (issue 24: a pool over maxBoxes)", async () => {
  const { name, ns } = await pools.createReady();
  // Its pod as a lagging cache would hide it: with the seat label but outside the caches' selector.
  const holder = boxPod('holder', name);
  holder.metadata!.labels = { [LABELS.seat]: '3' };
  await core.createNamespacedPod({ namespace: ns, body: holder });
  const seat = (n: number): k8s.V1Secret => ({
    metadata: {
      name: `box-seat-${n}`,
      labels: { [LABELS.box]: 'true', [LABELS.component]: SECRET_COMPONENTS.credential, [LABELS.pool]: name },
      annotations: { [ANNOTATIONS.warmPod]: `box-warm-${n}` },
    },
    stringData: { token: 'x' },
  });
  await core.createNamespacedSecret({ namespace: ns, body: seat(3) });
  await core.createNamespacedSecret({ namespace: ns, body: seat(4) }); // no pod at all: an orphan
  const gone = (n: number) =>
    core.readNamespacedSecret({ name: `box-seat-${n}`, namespace: ns }).then(
      () => undefined,
      (err: unknown) => (err instanceof k8s.ApiException && err.code === 404 ? true : undefined),
    );
  await waitFor('the orphaned seat to go', () => gone(4));
  // Well past the 1 s grace, with the orphan's reap done: the held seat stays.
  await new Promise((r) => setTimeout(r, 2000));
  await expect(core.readNamespacedSecret({ name: 'box-seat-3', namespace: ns })).resolves.toBeDefined();
  // Its pod gone, it is freed on a later look.
  await core.deleteNamespacedPod({ name: 'holder', namespace: ns, gracePeriodSeconds: 0 });
  await waitFor('the seat to be freed once its pod is gone', () => gone(3), { timeoutMs: 20_000 });
});

test('totalBoxesCreated survives an operator restart without double counting', async () => {
  const { name, ns } = await pools.createReady();
  // The operator counts boxes by their records (one per box, cold or claimed warm).
  for (const i of [0, 1, 2]) {
    await core.createNamespacedSecret({ namespace: ns, body: boxRecord(`b${i}`, name) });
    await core.createNamespacedPod({ namespace: ns, body: boxPod(`b${i}`, name) });
  }
  await waitFor('three boxes counted', async () => ((await pools.get(name)).status?.totalBoxesCreated === 3 ? true : undefined));
  // A deleted box stays counted.
  await core.deleteNamespacedPod({ name: 'b0', namespace: ns, gracePeriodSeconds: 0 });

  expect(await operator.stop('SIGTERM')).toBe(0);
  operator = await startOperator({ shard, leaseName, env: { ORPHAN_SECRET_GRACE_SECONDS: '1' } });
  await core.createNamespacedSecret({ namespace: ns, body: boxRecord('b3', name) });
  await core.createNamespacedPod({ namespace: ns, body: boxPod('b3', name) });
  const status = await waitFor('the fourth box counted', async () => {
    const s = (await pools.get(name)).status;
    return s?.totalBoxesCreated === 4 && s.activeBoxes === 3 ? s : undefined;
  }, { timeoutMs: 20_000 });
  expect(status.totalBoxesCreated).toBe(4);
  // Stays at 4 (nothing recounted as the new leader settles).
  await new Promise((r) => setTimeout(r, 1000));
  expect((await pools.get(name)).status?.totalBoxesCreated).toBe(4);
});
