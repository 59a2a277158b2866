// Two operator processes share a Lease: only the leader reconciles; when it dies without
// releasing the lease the standby takes over within 15 s; on SIGTERM a leader releases the lease
// and exits 0.
import * as k8s from '@kubernetes/client-node';
import { waitFor, testKubeConfig } from '../support/cluster.js';
import { Pools, deleteLease, installCrd, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const leases = kc.makeApiClient(k8s.CoordinationV1Api);
const shard = uniqueName('ha');
const pools = new Pools(kc, shard);
const leaseName = `op-test-${shard}`;
const replicas: OperatorProcess[] = [];
const poolName = uniqueName('sbp');
const ns = `${poolName}-boxes`;

async function leader(): Promise<{ leader: OperatorProcess; standby: OperatorProcess }> {
  return waitFor('exactly one leader', async () => {
    const gauges = await Promise.all(replicas.map((r) => r.metric('sandbox_operator_leader')));
    const leaders = replicas.filter((_, i) => gauges[i] === 1);
    const standbys = replicas.filter((_, i) => gauges[i] === 0);
    return leaders.length === 1 && standbys.length === 1 ? { leader: leaders[0]!, standby: standbys[0]! } : undefined;
  }, { timeoutMs: 20_000 });
}

beforeAll(async () => {
  await installCrd(kc);
  replicas.push(...(await Promise.all(['replica-a', 'replica-b'].map((name) => startOperator({ shard, leaseName, name })))));
});

afterAll(async () => {
  await pools.cleanup();
  await Promise.all(replicas.map((r) => r.stop('SIGKILL')));
  await deleteLease(kc, leaseName);
});

test('only the leader reconciles; when it dies the standby takes over within 15 s; SIGTERM releases the lease', async () => {
  const { leader: first, standby } = await leader();
  await pools.create(poolName, { namespace: ns });
  await pools.waitReady(poolName);
  expect(await first.metric('sandbox_operator_reconcile_total')).toBeGreaterThan(0);
  expect(await standby.metric('sandbox_operator_reconcile_total')).toBe(0);
  const lease = await leases.readNamespacedLease({ name: leaseName, namespace: 'default' });
  expect(lease.spec?.holderIdentity).toMatch(new RegExp(`^${first.name}_`));

  // Crash: no release, so the standby must wait for the lease to expire.
  const killedAt = Date.now();
  first.proc.kill('SIGKILL');
  await first.exited;
  await core.deleteNamespacedResourceQuota({ name: 'sandbox-bridge-quota', namespace: ns });

  await waitFor('the standby to repair the quota', async () =>
    core.readNamespacedResourceQuota({ name: 'sandbox-bridge-quota', namespace: ns }).then(
      () => true,
      () => undefined,
    ),
  { timeoutMs: 20_000, intervalMs: 100 });
  const takeoverMs = Date.now() - killedAt;
  expect(takeoverMs).toBeLessThanOrEqual(15_000);
  expect(await standby.metric('sandbox_operator_leader')).toBe(1);
  expect(await standby.metric('sandbox_operator_reconcile_total')).toBeGreaterThan(0);
  process.stderr.write(`[operator-leader] takeover after SIGKILL: ${takeoverMs} ms\n`);

  // Graceful stop: exit 0 and the lease is handed back at once.
  expect(await standby.stop('SIGTERM')).toBe(0);
  const released = await leases.readNamespacedLease({ name: leaseName, namespace: 'default' });
  expect(released.spec?.holderIdentity ?? '').toBe('');
  expect(released.spec?.leaseDurationSeconds).toBe(1);
}, 60_000);

test('a released lease is taken at once by a new replica', async () => {
  const next = await startOperator({ shard, leaseName, name: 'replica-c' });
  replicas.push(next);
  // Timed from readiness, not process start (which a loaded 2-core machine stretches): a released
  // lease is taken on the first try, well before the 10 s an unreleased one needs to expire.
  const ready = Date.now();
  await waitFor('the new replica to lead', async () => ((await next.metric('sandbox_operator_leader')) === 1 ? true : undefined));
  expect(Date.now() - ready).toBeLessThan(5000);
});

test('bad configuration stops the process with a clear message', async () => {
  const failed = await startOperator({ shard, leaseName, env: { LOG_LEVEL: 'chatty', METRICS_PORT: 'x' } }).then(
    () => undefined,
    (err: unknown) => String(err),
  );
  expect(failed).toMatch(/exited with 2/);
  expect(failed).toMatch(/invalid operator configuration/);
  expect(failed).toMatch(/LOG_LEVEL/);
  expect(failed).toMatch(/METRICS_PORT/);
});
