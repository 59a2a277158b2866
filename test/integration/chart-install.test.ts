// `helm install` of charts/sandbox-bridge into the local cluster: every rendered object is on
// the API server, the chart's pods pass `restricted` Pod Security, a `helm upgrade` keeps the
// generated keys, and the bridge, the operator and the egress gateway, each run with a token of
// the chart's own ServiceAccount (so with exactly the chart's RBAC), do their job: the bridge
// serves a box lifecycle, the operator reconciles the chart's pool and reaps, the gateway lists
// what it watches and becomes ready. `kubectl auth can-i` shows none can read a Secret or Pod
// outside the pool namespace. Removing one verb from the Role turns the matching call into the
// documented 403.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import * as k8s from '@kubernetes/client-node';
import { pino } from 'pino';
import { boxRecordName } from '../../common/labels.js';
import { startBridge, type RunningBridge } from '../../bridge/server.js';
import { ON_REAL_NODE, TEST_TOKEN, api, testConfig } from '../support/bridge.js';
import { LOCAL_BOX_IMAGE, realNodeAvailable, testKubeConfig, waitFor } from '../support/cluster.js';
import { boxPod, freePort, installCrd, startOperator, type OperatorProcess } from '../support/operator.js';
import { ANNOTATIONS, LABELS } from '../../common/labels.js';
import { POOL_GROUP, POOL_PLURAL, POOL_VERSION, type SandboxPool } from '../../common/pool.js';
import { TOKEN, helm, parseDocs, withValuesFile, CHART, type Doc } from '../chart/helm.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const rbac = kc.makeApiClient(k8s.RbacAuthorizationV1Api);
const objects = k8s.KubernetesObjectApi.makeApiClient(kc);

const id = randomBytes(3).toString('hex');
const release = `chart-${id}`;
const releaseNs = `chart-${id}-sys`;
const sandboxNs = `chart-${id}-boxes`;
const poolName = `chart-${id}`;
const bridgeName = `${release}-sandbox-bridge-bridge`;
const operatorName = `${release}-sandbox-bridge-operator`;
const gatewayName = `${release}-sandbox-bridge-egress-gateway`;
const kubeconfigEnv = { KUBECONFIG: process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG! };
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const pools = { group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL };
const strayPool = `chart-${id}-stray`;
const tmp = mkdtempSync(join(tmpdir(), 'chart-install-'));
// A box answers through boxd, which runs only on the real node (kwok pods run nothing).
const realNode = await realNodeAvailable(kc);
if (!realNode.available) console.warn(`SKIPPED the chart's box lifecycle test: ${realNode.reason}`);
const withRealNode = realNode.available ? test : test.skip;

let manifest: Doc[] = [];
let bridge: RunningBridge | undefined;
let operator: OperatorProcess | undefined;
let gateway: ChildProcess | undefined;
let saKc: k8s.KubeConfig;

/** A token of the chart's ServiceAccount `name`, as the kubelet would mount it. */
async function serviceAccountToken(name: string): Promise<string> {
  const tokenRequest = await core.createNamespacedServiceAccountToken({
    name,
    namespace: releaseNs,
    body: { spec: { audiences: [], expirationSeconds: 3600 } },
  });
  const token = tokenRequest.status?.token;
  if (!token) throw new Error(`no token issued for ServiceAccount ${name}`);
  return token;
}

/** A kubeconfig that authenticates as the chart's ServiceAccount `name`. */
async function serviceAccountKubeConfig(name: string): Promise<k8s.KubeConfig> {
  const cluster = kc.getCurrentCluster()!;
  const sa = new k8s.KubeConfig();
  sa.loadFromOptions({
    clusters: [{ name: 'local', server: cluster.server, caData: cluster.caData, caFile: cluster.caFile, skipTLSVerify: cluster.skipTLSVerify }],
    users: [{ name, token: await serviceAccountToken(name) }],
    contexts: [{ name: 'sa', cluster: 'local', user: name }],
    currentContext: 'sa',
  });
  return sa;
}

/** `kubectl auth can-i` as one of the chart's ServiceAccounts: true for "yes". */
function canI(account: string, verb: string, resource: string, namespace?: string, subresource?: string): boolean {
  const res = spawnSync(
    join(process.cwd(), '.cluster/bin/kubectl'),
    [
      'auth',
      'can-i',
      verb,
      resource,
      ...(subresource ? [`--subresource=${subresource}`] : []),
      ...(namespace ? ['-n', namespace] : ['--all-namespaces']),
      `--as=system:serviceaccount:${releaseNs}:${account}`,
    ],
    { encoding: 'utf8', env: { ...process.env, ...kubeconfigEnv } },
  );
  if (res.status !== 0 && res.status !== 1) throw new Error(`kubectl auth can-i failed: ${res.stderr}`);
  return res.stdout.trim() === 'yes';
}

/** Whether the chart's bridge ServiceAccount may do `verb` on `resource` (asked as that account). */
async function allowed(verb: string, resource: string, namespace?: string, subresource?: string): Promise<boolean> {
  const group = resource === 'sandboxpools' ? 'sandbox-bridge.io' : '';
  const review = await saKc.makeApiClient(k8s.AuthorizationV1Api).createSelfSubjectAccessReview({
    body: { spec: { resourceAttributes: { group, verb, resource, ...(namespace ? { namespace } : {}), ...(subresource ? { subresource } : {}) } } },
  });
  return review.status?.allowed === true;
}

/** The release's values (install and upgrade). */
const values = {
  secret: { token: TOKEN },
  rbac: { targetNamespace: sandboxNs },
  pool: { name: poolName },
  // Boxes on the real node (boxd runs there), with the local box image.
  box: {
    defaultImage: LOCAL_BOX_IMAGE,
    defaultCpu: '100m',
    defaultMemory: '64Mi',
    nodeSelector: ON_REAL_NODE.box.nodeSelector,
    tolerations: ON_REAL_NODE.box.tolerations,
  },
  nodeSelector: { type: 'kwok' },
  operator: { nodeSelector: { type: 'kwok' } },
  // Its pods are made and scheduled (restricted Pod Security); the gateway itself runs below as a
  // local process with the chart's args and its ServiceAccount's token.
  egressGateway: { nodeSelector: { type: 'kwok' } },
};

beforeAll(async () => {
  // Helm creates crds/ only when absent (and never updates it); make sure this checkout's CRD is served.
  await installCrd(kc);
  // The release namespace enforces `restricted`, so the chart's own pods must pass it to be created.
  await core.createNamespace({
    body: { metadata: { name: releaseNs, labels: { 'sandbox-bridge.io/test': 'true', 'pod-security.kubernetes.io/enforce': 'restricted' } } },
  });
  const res = withValuesFile(values, (file) =>
    helm(['install', release, CHART, '--namespace', releaseNs, '-f', file, '--timeout', '60s'], {
      env: kubeconfigEnv,
      timeoutMs: 90_000,
    }),
  );
  if (res.status !== 0) throw new Error(`helm install failed:\n${res.stderr}`);
  const got = helm(['get', 'manifest', release, '--namespace', releaseNs], { env: kubeconfigEnv });
  manifest = parseDocs(got.stdout);

  saKc = await serviceAccountKubeConfig(bridgeName);
}, 120_000);

afterAll(async () => {
  await bridge?.close();
  await operator?.stop();
  gateway?.kill('SIGKILL');
  await custom.deleteClusterCustomObject({ ...pools, name: strayPool }).catch(() => undefined);
  await core.deleteCollectionNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${poolName}` }).catch(() => undefined);
  rmSync(tmp, { recursive: true, force: true });
  helm(['uninstall', release, '--namespace', releaseNs, '--timeout', '60s'], { env: kubeconfigEnv, timeoutMs: 90_000 });
  for (const name of [releaseNs, sandboxNs]) await core.deleteNamespace({ name, propagationPolicy: 'Background' }).catch(() => undefined);
}, 120_000);

test('every object helm rendered is on the API server', async () => {
  const kinds = manifest.map((d) => d.kind).sort();
  expect(kinds).toEqual(
    [
      'ClusterRole', 'ClusterRole', 'ClusterRoleBinding', 'ClusterRoleBinding', 'Deployment', 'Deployment', 'Namespace',
      'NetworkPolicy', 'NetworkPolicy', 'PodDisruptionBudget', 'PodDisruptionBudget', 'Role', 'Role', 'Role', 'Role',
      'RoleBinding', 'RoleBinding', 'RoleBinding', 'RoleBinding', 'SandboxPool', 'Secret', 'Secret', 'Service', 'Service', 'Service',
      'ServiceAccount', 'ServiceAccount',
      // the egress gateway: its Deployment, proxy and metrics Services, policy, PDB, RBAC (a Role in
      // the pool namespace) and its two key Secrets
      'ClusterRole', 'ClusterRoleBinding', 'Deployment', 'NetworkPolicy', 'PodDisruptionBudget', 'Role', 'RoleBinding',
      'Secret', 'Secret', 'Service', 'Service', 'ServiceAccount',
    ].sort(),
  );
  for (const doc of manifest) {
    const live = await objects.read({ apiVersion: doc.apiVersion, kind: doc.kind, metadata: { name: doc.metadata.name, namespace: doc.metadata.namespace ?? (isClusterScoped(doc.kind) ? undefined : releaseNs) } } as k8s.KubernetesObject & { metadata: { name: string } });
    expect(live.metadata?.labels?.['app.kubernetes.io/instance']).toBe(release);
  }
  const ns = await core.readNamespace({ name: sandboxNs });
  expect(ns.metadata?.labels?.['pod-security.kubernetes.io/enforce']).toBe('restricted');
  const pool = (await objects.read({ apiVersion: 'sandbox-bridge.io/v1alpha1', kind: 'SandboxPool', metadata: { name: poolName } })) as unknown as { spec: Record<string, unknown> };
  expect(pool.spec).toMatchObject({ namespace: sandboxNs, maxBoxes: 50, maxBoxesPerSession: 3, defaultTtlSeconds: 3600 });
  // The API server took the pool's gateway fields as the chart seeds them (CRD validation).
  expect(pool.spec.egress).toMatchObject({ mode: 'direct', gateway: { namespace: releaseNs, service: gatewayName, port: 3128 } });
});

test('helm upgrade keeps the generated keys (looked up, not generated again)', async () => {
  const names = [`${release}-sandbox-bridge-boxd-key`, `${release}-sandbox-bridge-egress-key`, `${release}-sandbox-bridge-egress-resolver-key`];
  const read = async () => Promise.all(names.map(async (name) => (await core.readNamespacedSecret({ name, namespace: releaseNs })).data?.key));
  const before = await read();
  for (const key of before) expect(Buffer.from(key!, 'base64').toString()).toMatch(/^[A-Za-z0-9]{64}$/);
  const res = withValuesFile(values, (file) =>
    helm(['upgrade', release, CHART, '--namespace', releaseNs, '-f', file, '--timeout', '60s'], { env: kubeconfigEnv, timeoutMs: 90_000 }),
  );
  expect({ status: res.status, stderr: res.stderr }).toMatchObject({ status: 0 });
  expect(await read()).toEqual(before);
  // Nothing rolled the pods for a key that did not change.
  const upgraded = parseDocs(helm(['get', 'manifest', release, '--namespace', releaseNs], { env: kubeconfigEnv }).stdout);
  for (const d of upgraded.filter((x) => x.kind === 'Deployment')) expect(d.spec.template.metadata.annotations?.['checksum/egress-key']).toBeUndefined();
}, 120_000);

test("the chart's pods pass restricted Pod Security (the ReplicaSets create them all)", async () => {
  const pods = await waitFor('2 bridge, 2 operator and 2 egress gateway pods', async () => {
    const list = await core.listNamespacedPod({ namespace: releaseNs, labelSelector: `app.kubernetes.io/instance=${release}` });
    return list.items.length === 6 ? list.items : undefined;
  });
  const components = pods.map((p) => p.metadata!.labels!['app.kubernetes.io/component']).sort();
  expect(components).toEqual(['bridge', 'bridge', 'egress-gateway', 'egress-gateway', 'operator', 'operator']);
}, 60_000);

test('ServiceAccount permissions: what the bridge needs where it needs it, nothing else', async () => {
  const expectations: Array<[string, string, string | undefined, string | undefined, boolean]> = [
    ['create', 'pods', sandboxNs, undefined, true],
    ['watch', 'pods', sandboxNs, undefined, true],
    ['patch', 'pods', sandboxNs, undefined, true], // claiming a warm box
    ['get', 'pods', sandboxNs, 'log', true],
    ['update', 'secrets', sandboxNs, undefined, true],
    ['delete', 'secrets', sandboxNs, undefined, true], // a box's record
    // Everything inside a box goes to boxd, never through the API server.
    ['create', 'pods', sandboxNs, 'exec', false],
    ['list', 'nodes', undefined, undefined, true],
    ['watch', 'nodes', undefined, undefined, true],
    ['watch', 'sandboxpools', undefined, undefined, true],
    // Namespaced: nothing in other namespaces, nothing cluster-wide.
    ['create', 'pods', 'default', undefined, false],
    ['list', 'pods', undefined, undefined, false],
    ['get', 'secrets', releaseNs, undefined, false],
    // Idle sleep watches the records of sleeping boxes (and swaps their marks).
    ['list', 'secrets', sandboxNs, undefined, true],
    ['patch', 'secrets', sandboxNs, undefined, true],
    ['list', 'secrets', releaseNs, undefined, false],
    ['update', 'sandboxpools', undefined, undefined, false],
  ];
  const results = [];
  for (const [verb, resource, ns, sub, _] of expectations) results.push([verb, resource, ns, sub, await allowed(verb, resource, ns, sub)]);
  expect(results).toEqual(expectations);
});

test('kubectl auth can-i: no program can read a Secret or Pod outside the pool namespace', () => {
  for (const account of [bridgeName, operatorName, gatewayName]) {
    for (const ns of ['default', 'kube-system', releaseNs]) {
      expect({ account, ns, getSecrets: canI(account, 'get', 'secrets', ns), listPods: canI(account, 'list', 'pods', ns) }).toEqual({
        account,
        ns,
        getSecrets: false,
        listPods: false,
      });
    }
    expect({ account, clusterWidePods: canI(account, 'list', 'pods'), clusterWideSecrets: canI(account, 'list', 'secrets') }).toEqual({
      account,
      clusterWidePods: false,
      clusterWideSecrets: false,
    });
    expect(canI(account, 'list', 'pods', sandboxNs)).toBe(true);
  }
  // The operator reaches namespaces only by name: its pool namespace, no other.
  expect(canI(operatorName, 'patch', `namespaces/${sandboxNs}`)).toBe(true);
  expect(canI(operatorName, 'patch', 'namespaces/default')).toBe(false);
  expect(canI(operatorName, 'list', 'namespaces')).toBe(false);
  expect(canI(operatorName, 'delete', 'secrets', sandboxNs)).toBe(true);
  // Idle sleep reads a box's record (its env is sealed into the snapshot) and takes its lease.
  expect(canI(operatorName, 'get', 'secrets', sandboxNs)).toBe(true);
  expect(canI(operatorName, 'patch', 'secrets', sandboxNs)).toBe(true);
  expect(canI(operatorName, 'get', 'secrets', 'default')).toBe(false);
  // Box PID limits are read only with operator.nodeChecks.enabled: by default no way to the kubelet API.
  for (const account of [bridgeName, operatorName, gatewayName]) expect({ account, nodeProxy: canI(account, 'get', 'nodes', undefined, 'proxy') }).toEqual({ account, nodeProxy: false });
  // The pool CA (Secret and ConfigMap sandbox-bridge-egress-ca) is the operator's to keep.
  expect(['create', 'update', 'watch'].map((verb) => canI(operatorName, verb, 'configmaps', sandboxNs))).toEqual([true, true, true]);
  expect(canI(operatorName, 'update', 'secrets', sandboxNs)).toBe(true);
  expect(canI(operatorName, 'list', 'configmaps', releaseNs)).toBe(false);
});

test('kubectl auth can-i: the egress gateway may list and watch what it keeps and create Events, nothing else', () => {
  const expectations: Array<[string, string, string | undefined, boolean]> = [
    ['list', 'sandboxpools.sandbox-bridge.io', undefined, true],
    ['watch', 'sandboxpools.sandbox-bridge.io', undefined, true],
    ['get', 'sandboxpools.sandbox-bridge.io', undefined, false],
    ['update', 'sandboxpools.sandbox-bridge.io', undefined, false],
    ['list', 'pods', sandboxNs, true],
    ['watch', 'pods', sandboxNs, true],
    ['list', 'secrets', sandboxNs, true],
    ['watch', 'secrets', sandboxNs, true],
    ['create', 'events', sandboxNs, true],
    ['patch', 'events', sandboxNs, false], // one new Event a minute at most, never patched
    // list/watch only: no get, no writes to what it reads.
    ['get', 'secrets', sandboxNs, false],
    ['get', 'pods', sandboxNs, false],
    ['create', 'pods', sandboxNs, false],
    ['patch', 'pods', sandboxNs, false],
    ['delete', 'secrets', sandboxNs, false],
    ['update', 'secrets', sandboxNs, false],
    ['list', 'configmaps', sandboxNs, false],
    ['create', 'events', releaseNs, false],
  ];
  expect(expectations.map(([verb, resource, ns]) => [verb, resource, ns, canI(gatewayName, verb, resource, ns)])).toEqual(expectations);
});

test('the egress gateway, run with the chart\'s args and only its ServiceAccount\'s token, lists what it watches and is ready', async () => {
  // The binary from gateway/ as it is now (gateway/build.sh, as the image is built).
  const bin = join(tmp, 'bin');
  const build = spawnSync('bash', [join(process.cwd(), 'gateway/build.sh'), bin], { encoding: 'utf8', timeout: 240_000 });
  expect({ status: build.status, stderr: build.stderr }).toMatchObject({ status: 0 });

  // The key files as the pod mounts them: the chart's generated Secrets.
  const keyFile = join(tmp, 'egress-key');
  const resolverKeyFile = join(tmp, 'egress-resolver-key');
  for (const [name, file] of [[`${release}-sandbox-bridge-egress-key`, keyFile], [`${release}-sandbox-bridge-egress-resolver-key`, resolverKeyFile]] as const) {
    writeFileSync(file, Buffer.from((await core.readNamespacedSecret({ name, namespace: releaseNs })).data!.key!, 'base64'), { mode: 0o600 });
  }
  const tokenFile = join(tmp, 'gateway-token');
  writeFileSync(tokenFile, await serviceAccountToken(gatewayName), { mode: 0o600 });
  const cluster = kc.getCurrentCluster()!;
  const caFile = cluster.caFile ?? join(tmp, 'api-ca.crt');
  if (!cluster.caFile) writeFileSync(caFile, Buffer.from(cluster.caData!, 'base64'));

  // The Deployment's args, with the pod's paths and ports mapped onto this machine; the API
  // server given directly instead of the in-cluster service account.
  const deployment = manifest.find((d) => d.kind === 'Deployment' && d.metadata.name === gatewayName)!;
  const args = deployment.spec.template.spec.containers[0].args as string[];
  expect(args).toContain(`-kube-namespace=${sandboxNs}`);
  const [proxyPort, metricsPort] = [await freePort(), await freePort()];
  const mapped: Record<string, string> = {
    '-listen=:3128': `-listen=127.0.0.1:${proxyPort}`,
    '-metrics-listen=:9090': `-metrics-listen=127.0.0.1:${metricsPort}`,
    '-key-file=/var/run/secrets/sandbox-bridge-egress/key': `-key-file=${keyFile}`,
    '-resolver-key-file=/var/run/secrets/sandbox-bridge-egress-resolver/key': `-resolver-key-file=${resolverKeyFile}`,
  };
  for (const pod of Object.keys(mapped)) expect(args).toContain(pod);
  let log = '';
  gateway = spawn(join(bin, 'egress-gateway'), [...args.map((a) => mapped[a] ?? a), `-kube-server=${cluster.server}`, `-kube-ca-file=${caFile}`, `-kube-token-file=${tokenFile}`], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  gateway.stdout!.on('data', (b: Buffer) => (log += b.toString()));
  gateway.stderr!.on('data', (b: Buffer) => (log += b.toString()));
  // Ready only once pools, box pods and records (and the pool CA Secrets) are listed.
  await waitFor('the gateway to be ready', async () => {
    if (gateway!.exitCode !== null) throw new Error(`egress-gateway exited ${gateway!.exitCode}`);
    return (await fetch(`http://127.0.0.1:${metricsPort}/readyz`)).status === 200 ? true : undefined;
  }, { timeoutMs: 30_000 }).catch((err: unknown) => {
    throw new Error(`${String(err)}\negress-gateway log:\n${log}`);
  });
  expect(log).not.toMatch(/forbidden/i); // (a 403 from the API server says "Forbidden")
  expect((await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).status).toBe(200);
  gateway.kill('SIGTERM');
  await new Promise((resolve) => gateway!.once('exit', resolve));
}, 300_000);

test('the operator, with only the chart RBAC, reconciles the chart pool, reaps its boxes, and refuses a pool elsewhere', async () => {
  const deployment = manifest.find((d) => d.kind === 'Deployment' && d.metadata.name === operatorName)!;
  const env = Object.fromEntries(
    (deployment.spec.template.spec.containers[0].env as Array<{ name: string; value?: string }>).map((e) => [e.name, e.value]),
  );
  expect(env.WATCH_NAMESPACES).toBe(sandboxNs);
  const kubeconfig = join(tmp, 'operator.kubeconfig');
  writeFileSync(kubeconfig, (await serviceAccountKubeConfig(operatorName)).exportConfig(), { mode: 0o600 });
  operator = await startOperator({
    shard: 'unused',
    leaseName: operatorName,
    leaseNamespace: releaseNs,
    name: 'chart-operator',
    env: { KUBECONFIG: kubeconfig, WATCH_NAMESPACES: env.WATCH_NAMESPACES!, POOL_SELECTOR: `app.kubernetes.io/instance=${release}` },
  });

  const ready = await waitFor('the chart pool to be Ready', async () => {
    const pool = (await custom.getClusterCustomObject({ ...pools, name: poolName })) as SandboxPool;
    return pool.status?.conditions?.find((c) => c.type === 'Ready' && c.status === 'True') ? pool : undefined;
  }, { timeoutMs: 30_000 }).catch((err: unknown) => {
    throw new Error(`${String(err)}\noperator log:\n${operator?.logs()}`);
  });
  expect(ready.status?.conditions?.find((c) => c.type === 'Degraded')).toMatchObject({ status: 'False' });
  const policy = await kc.makeApiClient(k8s.NetworkingV1Api).readNamespacedNetworkPolicy({ name: 'sandbox-bridge-boxes', namespace: sandboxNs });
  expect(policy.spec?.ingress?.[0]?._from?.[0]?.namespaceSelector?.matchLabels).toEqual({ 'kubernetes.io/metadata.name': releaseNs });

  // An expired box is deleted (pods: delete in the pool namespace) and the event written (default).
  const expired = boxPod(`chart-${id}-expired`, poolName, { [ANNOTATIONS.expiresAt]: new Date(Date.now() - 1000).toISOString() });
  await core.createNamespacedPod({ namespace: sandboxNs, body: expired });
  await waitFor('the expired box to be reaped', async () => {
    const pods = await core.listNamespacedPod({ namespace: sandboxNs, fieldSelector: `metadata.name=${expired.metadata!.name}` });
    return pods.items.every((p) => p.metadata?.deletionTimestamp) ? true : undefined;
  }, { timeoutMs: 30_000 });
  await waitFor('the BoxExpired event', async () => {
    const events = await core.listNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${poolName},reason=BoxExpired` });
    return events.items.length ? true : undefined;
  });

  // A pool in a namespace the chart gave it no Role in: not Ready, saying what to change; nothing created there.
  await custom.createClusterCustomObject({
    ...pools,
    body: {
      apiVersion: `${POOL_GROUP}/${POOL_VERSION}`,
      kind: 'SandboxPool',
      metadata: { name: strayPool, labels: { 'app.kubernetes.io/instance': release } },
      spec: { namespace: `${strayPool}-boxes` },
    },
  });
  const stray = await waitFor('the stray pool to be reported', async () => {
    const pool = (await custom.getClusterCustomObject({ ...pools, name: strayPool })) as SandboxPool;
    return pool.status?.conditions?.find((c) => c.type === 'Ready') ? pool : undefined;
  });
  expect(stray.status?.conditions?.find((c) => c.type === 'Ready')).toMatchObject({
    status: 'False',
    reason: 'NamespaceNotWatched',
    message: expect.stringContaining('rbac.extraPoolNamespaces'),
  });
  expect((await core.listNamespace({ fieldSelector: `metadata.name=${strayPool}-boxes` })).items).toHaveLength(0);
  expect(operator.logs()).not.toMatch(/forbidden/i);
}, 120_000);

withRealNode('the bridge, with only the chart RBAC, serves a whole box lifecycle; a missing verb is a 403', async () => {
  bridge = await startBridge(testConfig({ POOL_NAME: poolName, SANDBOX_NAMESPACE: 'unused-fallback' }), {
    kc: saKc,
    log: pino({ level: process.env.BRIDGE_TEST_LOG ?? 'silent' }),
  });
  expect(bridge.namespace).toBe(sandboxNs); // from the chart's SandboxPool, watched with the SA's rights
  const call = api(bridge, TEST_TOKEN);

  const health = await call('GET', '/health');
  expect(health.status).toBe(200);
  expect(health.json).toMatchObject({ status: 'ok', namespace: sandboxNs });
  // The gauges the chart's PrometheusRule alerts on: the pool's cap, and health.
  const metrics = await (await fetch(`${bridge.metricsUrl}/metrics`)).text();
  expect(metrics).toMatch(/^sandbox_bridge_boxes_limit 50$/m);
  expect(metrics).toMatch(/^sandbox_bridge_healthy 1$/m);
  expect(metrics).toMatch(/^sandbox_bridge_process_start_time_seconds \d+/m);
  expect((await call('GET', '/cluster/nodes')).status).toBe(200);
  expect((await call('GET', '/cluster/info')).status).toBe(200);
  expect((await call('GET', '/cluster/capacity')).json).toMatchObject({ boxes: { active: 0, warm: 0, max: 50 }, cpu: { unit: 'cores' } });

  const created = await call('POST', '/boxes', { sessionId: `chart-${id}`, env: { GREETING: 'hello' } });
  expect(created.status).toBe(201);
  const boxId: string = created.json.box_id;
  expect(created.json).toMatchObject({ namespace: sandboxNs, image: LOCAL_BOX_IMAGE });

  await waitFor('the box to run', async () => {
    const s = await call('GET', `/boxes/${boxId}/status`);
    return s.json?.status === 'Running' ? true : undefined;
  }, { timeoutMs: 60_000 }).catch(async (err: unknown) => {
    const pod = (await core.listNamespacedPod({ namespace: sandboxNs, labelSelector: `${LABELS.boxId}=${boxId}` }).catch(() => undefined))?.items[0];
    throw new Error(`${String(err)}\npod status: ${JSON.stringify(pod?.status)}\nnodeSelector: ${JSON.stringify(pod?.spec?.nodeSelector)}`);
  });
  const list = await call('GET', '/sandboxes');
  expect(list.json.sandboxes.map((s: { name: string }) => s.name)).toContain(boxId);

  const env = await call('POST', `/boxes/${boxId}/env`, { envVars: { TARGET: 'chart' } });
  expect(env.status).toBe(200);
  expect(env.json.env_count).toBe(2);

  const exec = await call('POST', `/boxes/${boxId}/exec`, { command: 'pwd; echo "$GREETING $TARGET"' });
  expect(exec.status).toBe(200);
  expect(exec.json).toMatchObject({ exit_code: 0, stdout: '/workspace\nhello chart\n' });

  expect((await call('PUT', `/boxes/${boxId}/files?path=chart.txt`, 'chart file', { 'content-type': 'text/plain' })).status).toBe(200);
  const read = await call('GET', `/boxes/${boxId}/files?path=chart.txt`);
  expect(read.json).toMatchObject({ content: 'chart file', encoding: 'text' });
  expect((await call('GET', `/sandboxes/${boxId}/logs?tailLines=5`)).status).toBe(200);
  expect((await call('GET', '/sandboxes/metrics')).status).toBe(200);

  // Take `delete` on pods away from the chart's Role: DELETE /boxes/:id is then the documented 403.
  const role = await rbac.readNamespacedRole({ name: bridgeName, namespace: sandboxNs });
  const original = structuredClone(role.rules!);
  role.rules = role.rules!.map((r) => (r.resources?.includes('pods') && r.apiGroups?.includes('') ? { ...r, verbs: r.verbs.filter((v) => v !== 'delete') } : r));
  await rbac.replaceNamespacedRole({ name: bridgeName, namespace: sandboxNs, body: role });
  await waitFor('RBAC to drop delete', async () => ((await allowed('delete', 'pods', sandboxNs)) ? undefined : true));
  const denied = await call('DELETE', `/boxes/${boxId}`);
  expect(denied.status).toBe(403);
  expect(denied.json).toEqual({ error: { type: 'forbidden', message: expect.stringContaining('permissions do not allow') } });
  expect((await call('GET', `/boxes/${boxId}/status`)).status).toBe(200); // still there

  // Put it back: the delete succeeds and garbage collection takes the env Secret with the pod.
  const current = await rbac.readNamespacedRole({ name: bridgeName, namespace: sandboxNs });
  await rbac.replaceNamespacedRole({ name: bridgeName, namespace: sandboxNs, body: { ...current, rules: original } });
  await waitFor('RBAC to allow delete again', async () => ((await allowed('delete', 'pods', sandboxNs)) ? true : undefined));
  const deleted = await call('DELETE', `/boxes/${boxId}`);
  expect(deleted.status).toBe(200);
  expect(deleted.json).toMatchObject({ box_id: boxId, status: 'Terminated' });
  await waitFor('the box and its Secret to be gone', async () => {
    const pods = await core.listNamespacedPod({ namespace: sandboxNs, fieldSelector: `metadata.name=${boxId}` });
    const secrets = await core.listNamespacedSecret({ namespace: sandboxNs, fieldSelector: `metadata.name=${boxRecordName(boxId)}` });
    return pods.items.length === 0 && secrets.items.length === 0 ? true : undefined;
  }, { timeoutMs: 45_000 });
  expect((await call('DELETE', `/boxes/${boxId}`)).status).toBe(404);
}, 180_000);

function isClusterScoped(kind: string): boolean {
  return ['ClusterRole', 'ClusterRoleBinding', 'Namespace', 'SandboxPool', 'CustomResourceDefinition'].includes(kind);
}
