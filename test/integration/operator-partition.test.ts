// A leader cut off from the API server (its connection frozen: no answer, nothing closed, as
// with a SIGSTOPped or partitioned API server) must stop leading by its renew deadline, before
// the standby may take over, whatever its hung lease calls do; it exits, and once restarted (as
// the kubelet would) it is a standby while the new leader reconciles. The freeze is a proxy in
// front of the real API server that only the first replica uses.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { testKubeConfig, waitFor } from '../support/cluster.js';
import { Pools, deleteLease, installCrd, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';
import { TcpProxy } from '../support/tcp-proxy.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const shard = uniqueName('part');
const pools = new Pools(kc, shard);
const leaseName = `op-test-${shard}`;
const proxy = TcpProxy.forApiServer(kc);
const dir = mkdtempSync(join(tmpdir(), 'operator-partition-'));
const replicas: OperatorProcess[] = [];
const RENEW_DEADLINE_MS = 7000; // LEASE_DURATION_SECONDS 10, LEASE_RENEW_SECONDS 2 (the defaults)

beforeAll(async () => {
  await installCrd(kc);
  await proxy.start();
});

afterAll(async () => {
  proxy.thaw();
  await Promise.all(replicas.map((r) => r.stop('SIGKILL')));
  await proxy.stop();
  await pools.cleanup();
  await deleteLease(kc, leaseName);
  rmSync(dir, { recursive: true, force: true });
});

/** The wall-clock time (ms) of the first log line with this message (pino's ISO `time`). */
function loggedAt(op: OperatorProcess, msg: string): number | undefined {
  for (const line of op.logs().split('\n')) {
    if (!line.startsWith('{')) continue;
    const entry = JSON.parse(line) as { msg?: string; time?: string };
    if (entry.msg === msg && entry.time) return Date.parse(entry.time);
  }
  return undefined;
}

test('a partitioned leader stops by its renew deadline, before the standby starts; recovery after', async () => {
  const kubeconfig = proxy.writeKubeConfig(kc, join(dir, 'kubeconfig'));
  const a = await startOperator({ shard, leaseName, name: 'partitioned', env: { KUBECONFIG: kubeconfig } });
  replicas.push(a);
  await waitFor('the first replica to lead', async () => ((await a.metric('sandbox_operator_leader')) === 1 ? true : undefined), { timeoutMs: 30_000 });
  const b = await startOperator({ shard, leaseName, name: 'standby' });
  replicas.push(b);
  const { ns } = await pools.createReady();
  expect(await b.metric('sandbox_operator_reconcile_total')).toBe(0);

  proxy.freeze();
  const frozenAt = Date.now();
  const code = await Promise.race([a.exited, new Promise<'still running'>((resolve) => setTimeout(() => resolve('still running'), 20_000))]);
  const exitedMs = Date.now() - frozenAt;
  // It stopped by itself although every call it had in flight was hanging.
  expect(code).toBe(1);
  expect(a.logs()).toMatch(/"reason":"renew deadline passed".*"msg":"lost the leader lease; exiting/);
  const stoppedAt = loggedAt(a, 'no longer leader')!;
  expect(stoppedAt).toBeDefined();
  // The deadline counts from the last renew sent, at most one renew interval (2 s) before the freeze.
  expect(stoppedAt - frozenAt).toBeLessThanOrEqual(RENEW_DEADLINE_MS + 1500);

  await waitFor('the standby to lead', async () => ((await b.metric('sandbox_operator_leader')) === 1 ? true : undefined), {
    timeoutMs: 30_000,
    intervalMs: 100,
  });
  const startedAt = loggedAt(b, 'became leader')!;
  process.stderr.write(
    `[operator-partition] frozen leader stopped ${stoppedAt - frozenAt} ms into the freeze (exit seen at ${exitedMs} ms); ` +
      `the standby led ${startedAt - frozenAt} ms in: ${startedAt - stoppedAt} ms with no leader, none with two\n`,
  );
  expect(startedAt).toBeGreaterThan(stoppedAt);

  // The new leader reconciles: a deleted child object comes back.
  await core.deleteNamespacedResourceQuota({ name: 'sandbox-bridge-quota', namespace: ns });
  await waitFor('the new leader to repair the quota', async () =>
    core.readNamespacedResourceQuota({ name: 'sandbox-bridge-quota', namespace: ns }).then(
      () => true,
      () => undefined,
    ),
  { timeoutMs: 20_000, intervalMs: 200 });

  // Thawed and restarted (as its pod would be), the old leader is a standby; one leader remains.
  proxy.thaw();
  const again = await startOperator({ shard, leaseName, name: 'partitioned-restarted', env: { KUBECONFIG: kubeconfig } });
  replicas.push(again);
  await new Promise((resolve) => setTimeout(resolve, 4000));
  expect(await again.metric('sandbox_operator_leader')).toBe(0);
  expect(await b.metric('sandbox_operator_leader')).toBe(1);
}, 120_000);
