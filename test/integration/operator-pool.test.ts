// The operator turns a SandboxPool into its namespace, quota, limit range and network policy,
// keeps them in line with the pool and repairs drift; the API server enforces the CRD's
// validation and, through the quota, the global box cap.
import * as k8s from '@kubernetes/client-node';
import { BOXD_PORT } from '../../common/boxd.js';
import { apiMessage } from '../../common/kube.js';
import { desiredNetworkPolicy } from '../../operator/children.js';
import { waitFor, testKubeConfig } from '../support/cluster.js';
import { Pools, boxPod, boxRecord, deleteLease, installCrd, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const net = kc.makeApiClient(k8s.NetworkingV1Api);
const shard = uniqueName('pool');
const pools = new Pools(kc, shard);
const leaseName = `op-test-${shard}`;
let operator: OperatorProcess;
beforeAll(async () => {
  await installCrd(kc);
  operator = await startOperator({ shard, leaseName });
});

afterAll(async () => {
  await pools.cleanup();
  await operator?.stop();
  await deleteLease(kc, leaseName);
});

test('a pool gets a labelled namespace, quota, limit range and network policy, all owned by it', async () => {
  const { name, ns } = await pools.createReady({ podSecurityLevel: 'baseline', maxBoxes: 20, quota: { cpu: '8', memory: '16Gi' } });
  const pool = await pools.get(name);
  const owner = expect.objectContaining({ kind: 'SandboxPool', name, uid: pool.metadata.uid, controller: true });

  const namespace = await core.readNamespace({ name: ns });
  expect(namespace.metadata?.labels).toMatchObject({
    'pod-security.kubernetes.io/enforce': 'baseline',
    'pod-security.kubernetes.io/audit': 'baseline',
    'pod-security.kubernetes.io/warn': 'baseline',
  });
  expect(namespace.metadata?.ownerReferences).toEqual([owner]);

  const quota = await core.readNamespacedResourceQuota({ name: 'sandbox-bridge-quota', namespace: ns });
  expect(quota.spec?.hard).toEqual({ pods: '20', 'limits.cpu': '8', 'limits.memory': '16Gi' });
  expect(quota.metadata?.ownerReferences).toEqual([owner]);

  const limits = await core.readNamespacedLimitRange({ name: 'sandbox-bridge-limits', namespace: ns });
  expect(limits.spec!.limits).toEqual([
    expect.objectContaining({
      type: 'Container',
      max: { cpu: '4', memory: '4Gi' },
      _default: { cpu: '1', memory: '512Mi' },
      defaultRequest: { cpu: '1', memory: '512Mi' },
    }),
  ]);

  const policy = await net.readNamespacedNetworkPolicy({ name: 'sandbox-bridge-boxes', namespace: ns });
  expect(policy.spec?.podSelector).toEqual({});
  expect(policy.spec?.policyTypes).toEqual(['Ingress', 'Egress']);
  // What the API server stored is what desiredNetworkPolicy built (its unit test pins the content).
  const desired = desiredNetworkPolicy(pool).spec as k8s.V1NetworkPolicySpec;
  expect(policy.spec?.ingress).toEqual(desired.ingress);
  expect(policy.spec?.egress).toEqual(desired.egress);
  expect(policy.spec?.ingress?.[0]?.ports).toEqual([{ protocol: 'TCP', port: BOXD_PORT }]);
  expect(policy.spec?.egress?.[1]?.to?.[0]?.ipBlock?.except).toContain('10.0.0.0/8');

  expect(pool.status).toMatchObject({ observedGeneration: 1, activeBoxes: 0, totalBoxesCreated: 0 });
  expect(pool.status?.conditions?.find((c) => c.type === 'Degraded')).toMatchObject({ status: 'False', reason: 'AsExpected' });
});

test('editing the pool makes the children follow', async () => {
  const { name, ns } = await pools.createReady({ quota: { cpu: '8' } });
  await pools.patchSpec(name, {
    podSecurityLevel: 'privileged',
    maxBoxes: 7,
    maxBoxesPerSession: 2,
    quota: null,
    box: { maxCpu: '2', defaultMemory: '256Mi' },
    egress: { allowedCIDRs: ['10.0.0.0/8', '8.8.8.8/32'], deniedCIDRs: ['10.96.0.0/12'] },
  });
  await pools.waitReady(name);
  await waitFor('children to follow the edit', async () => {
    const [nsObj, quota, limits, policy] = await Promise.all([
      core.readNamespace({ name: ns }),
      core.readNamespacedResourceQuota({ name: 'sandbox-bridge-quota', namespace: ns }),
      core.readNamespacedLimitRange({ name: 'sandbox-bridge-limits', namespace: ns }),
      net.readNamespacedNetworkPolicy({ name: 'sandbox-bridge-boxes', namespace: ns }),
    ]);
    const ok =
      nsObj.metadata?.labels?.['pod-security.kubernetes.io/enforce'] === 'privileged' &&
      JSON.stringify(quota.spec?.hard) === JSON.stringify({ pods: '7' }) &&
      limits.spec!.limits[0]?.max?.cpu === '2' &&
      limits.spec!.limits[0]?._default?.memory === '256Mi' &&
      JSON.stringify(policy.spec?.egress?.[1]) ===
        JSON.stringify({ to: [{ ipBlock: { cidr: '10.0.0.0/8', except: ['10.96.0.0/12'] } }, { ipBlock: { cidr: '8.8.8.8/32' } }] });
    return ok ? true : undefined;
  }, { timeoutMs: 10_000 });
  expect((await pools.get(name)).status?.observedGeneration).toBe(2);
});

test('a deleted or edited child is repaired', async () => {
  const { ns } = await pools.createReady();
  await core.deleteNamespacedResourceQuota({ name: 'sandbox-bridge-quota', namespace: ns });
  await net.deleteNamespacedNetworkPolicy({ name: 'sandbox-bridge-boxes', namespace: ns });
  await core.patchNamespacedLimitRange(
    { name: 'sandbox-bridge-limits', namespace: ns, body: [{ op: 'replace', path: '/spec/limits/0/max/cpu', value: '64' }] },
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.JsonPatch),
  );
  await core.patchNamespace(
    { name: ns, body: { metadata: { labels: { 'pod-security.kubernetes.io/enforce': 'privileged' } } } },
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
  );
  await waitFor('children to be repaired', async () => {
    const [nsObj, quota, limits, policy] = await Promise.all([
      core.readNamespace({ name: ns }),
      core.readNamespacedResourceQuota({ name: 'sandbox-bridge-quota', namespace: ns }),
      core.readNamespacedLimitRange({ name: 'sandbox-bridge-limits', namespace: ns }),
      net.readNamespacedNetworkPolicy({ name: 'sandbox-bridge-boxes', namespace: ns }),
    ]);
    return nsObj.metadata?.labels?.['pod-security.kubernetes.io/enforce'] === 'restricted' &&
      quota.spec?.hard?.pods === '50' &&
      limits.spec!.limits[0]?.max?.cpu === '4' &&
      policy.spec?.policyTypes?.includes('Egress')
      ? true
      : undefined;
  }, { timeoutMs: 10_000 });
});

test('an invalid pool is rejected by the API server with a clear message', async () => {
  const rejection = await pools
    .create(uniqueName('bad'), {
      namespace: 'kube-system',
      maxBoxes: 2,
      maxBoxesPerSession: 3,
      box: { defaultCpu: '8', maxCpu: '4' } as never,
      egress: { allowedCIDRs: ['10.0.0.1/8'], deniedCIDRs: [] },
    })
    .then(
      () => undefined,
      (err: unknown) => err,
    );
  expect(rejection).toBeInstanceOf(k8s.ApiException);
  expect((rejection as k8s.ApiException<unknown>).code).toBe(422);
  const message = apiMessage(rejection);
  expect(message).toMatch(/maxBoxesPerSession must not exceed maxBoxes/);
  expect(message).toMatch(/box.defaultCpu must not exceed box.maxCpu/);
  expect(message).toMatch(/must be a CIDR with no host bits set/);
  expect(message).toMatch(/namespace must be a dedicated sandbox namespace/);

  const { name } = await pools.createReady();
  const immutable = await pools.patchSpec(name, { namespace: 'elsewhere' }).then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(apiMessage(immutable)).toMatch(/namespace is immutable/);
});

test('the API server rejects the 51st box through the quota', async () => {
  const { name, ns } = await pools.createReady();
  await waitFor('the quota to be counted', async () => {
    const q = await core.readNamespacedResourceQuota({ name: 'sandbox-bridge-quota', namespace: ns });
    return q.status?.hard?.pods === '50' ? true : undefined;
  });
  // Each box with its record, as the bridge makes them: the operator counts boxes by records.
  await Promise.all(Array.from({ length: 50 }, (_, i) => core.createNamespacedSecret({ namespace: ns, body: boxRecord(`box-${i}`, name) })));
  const results = await Promise.allSettled(
    Array.from({ length: 50 }, (_, i) => core.createNamespacedPod({ namespace: ns, body: boxPod(`box-${i}`, name) })),
  );
  expect(results.filter((r) => r.status === 'rejected')).toEqual([]);
  const rejection = await core.createNamespacedPod({ namespace: ns, body: boxPod('box-50', name) }).then(
    () => undefined,
    (err: unknown) => err,
  );
  expect((rejection as k8s.ApiException<unknown>).code).toBe(403);
  expect(apiMessage(rejection)).toMatch(/exceeded quota: sandbox-bridge-quota.*pods=1, used: pods=50, limited: pods=50/);

  const status = await waitFor('status to count the boxes', async () => {
    const p = await pools.get(name);
    return p.status?.activeBoxes === 50 && p.status.totalBoxesCreated === 50 ? p.status : undefined;
  }, { timeoutMs: 10_000 });
  expect(status.boxCountWatermark?.uids.length).toBeGreaterThan(0);
});
