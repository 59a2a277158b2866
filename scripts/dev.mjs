// `npm run dev`: the operator and the bridge against a cluster, ready for an agent runtime.
//
// With KUBECONFIG pointing at a reachable cluster, that cluster is used. Otherwise the local
// cluster (test/cluster/up.sh) is brought up, and brought down again on Ctrl-C. The SandboxPool
// CRD is applied and a pool "dev" is created (namespace "sandbox"; boxes go to the local real
// node when there is one). The bridge gets a freshly generated token; URL, token and a curl
// line are printed and written to .dev/env.
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { NODE_FLAGS } from '../dist/common/node-flags.js';

const root = join(import.meta.dirname, '..');
const POOL = process.env.DEV_POOL ?? 'dev';
const NAMESPACE = process.env.DEV_NAMESPACE ?? 'sandbox';
const PORT = Number(process.env.PORT ?? 8080);
const BRIDGE_METRICS_PORT = Number(process.env.METRICS_PORT ?? 9090);
const OPERATOR_METRICS_PORT = BRIDGE_METRICS_PORT + 1;
const REAL_NODE_LABEL = 'sandbox-bridge.io/real-node';
// The dev operator reconciles only pools carrying this label, never other people's (or tests').
const DEV_LABEL = 'sandbox-bridge.io/dev';
const GVISOR_RUNTIME_CLASS = 'gvisor';

const say = (msg) => process.stderr.write(`[dev] ${msg}\n`);
const children = [];
let startedCluster = false;
let stopping = false;

function reachable(kubeconfig) {
  if (!kubeconfig || !existsSync(kubeconfig.split(':')[0])) return false;
  const kubectl = existsSync(join(root, '.cluster/bin/kubectl')) ? join(root, '.cluster/bin/kubectl') : 'kubectl';
  const probe = spawnSync(kubectl, ['--request-timeout=5s', 'get', '--raw', '/readyz'], {
    env: { ...process.env, KUBECONFIG: kubeconfig },
    stdio: 'ignore',
  });
  return probe.status === 0;
}

async function chooseCluster() {
  if (process.env.KUBECONFIG) {
    if (!reachable(process.env.KUBECONFIG)) {
      throw new Error(`KUBECONFIG=${process.env.KUBECONFIG} does not reach a cluster; unset it to use the local one`);
    }
    say(`using the cluster in KUBECONFIG=${process.env.KUBECONFIG}`);
    return process.env.KUBECONFIG;
  }
  const local = join(root, '.cluster/kubeconfig');
  if (reachable(local)) {
    say('using the local cluster that is already up (.cluster/kubeconfig)');
    return local;
  }
  say('KUBECONFIG is not set: bringing the local cluster up (test/cluster/up.sh)');
  const up = spawnSync('bash', [join(root, 'test/cluster/up.sh')], { stdio: ['ignore', 'inherit', 'inherit'] });
  if (up.status !== 0) throw new Error('test/cluster/up.sh failed');
  startedCluster = true;
  return local;
}

async function applyPolicy(kc) {
  const crdApi = kc.makeApiClient(k8s.ApiextensionsV1Api);
  const crd = k8s.loadYaml(readFileSync(join(root, 'charts/sandbox-bridge/crds/sandboxpools.sandbox-bridge.io.yaml'), 'utf8'));
  try {
    await crdApi.createCustomResourceDefinition({ body: crd });
    say('installed the SandboxPool CRD');
  } catch (err) {
    if (!(err instanceof k8s.ApiException && err.code === 409)) throw err;
  }
  for (let i = 0; i < 50; i++) {
    const live = await crdApi.readCustomResourceDefinition({ name: crd.metadata.name });
    if (live.status?.conditions?.some((c) => c.type === 'Established' && c.status === 'True')) break;
    await new Promise((r) => setTimeout(r, 200));
  }

  const core = kc.makeApiClient(k8s.CoreV1Api);
  const realNodes = await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` });
  const box = realNodes.items.length
    ? { nodeSelector: { [REAL_NODE_LABEL]: 'true' }, tolerations: [{ key: REAL_NODE_LABEL, operator: 'Exists', effect: 'NoSchedule' }] }
    : {};
  if (!realNodes.items.length && startedCluster) {
    say('no real node: boxes run on simulated nodes, where exec runs on this host (use workdir /tmp)');
  }
  // The pool's NetworkPolicy admits only bridge pods to boxd; this bridge runs on the host, and
  // traffic from a node to its own pods is not subject to NetworkPolicy (network-policy.test.ts
  // checks that under the real node's enforcer).
  // The real node's gVisor RuntimeClass (test/cluster/real-node/up.sh), when runsc runs here:
  // a box asks for it with {"runtimeClassName": "gvisor"}.
  const gvisor = await kc
    .makeApiClient(k8s.NodeV1Api)
    .readRuntimeClass({ name: GVISOR_RUNTIME_CLASS })
    .then(() => true, () => false);
  const custom = kc.makeApiClient(k8s.CustomObjectsApi);
  const ref = { group: 'sandbox-bridge.io', version: 'v1alpha1', plural: 'sandboxpools' };
  try {
    await custom.getClusterCustomObject({ ...ref, name: POOL });
    say(`using the existing SandboxPool ${POOL}`);
  } catch {
    await custom.createClusterCustomObject({
      ...ref,
      body: {
        apiVersion: 'sandbox-bridge.io/v1alpha1',
        kind: 'SandboxPool',
        metadata: { name: POOL, labels: { [DEV_LABEL]: 'true' } },
        spec: { namespace: NAMESPACE, box, allowedRuntimeClassNames: gvisor ? [GVISOR_RUNTIME_CLASS] : [] },
      },
    });
    say(`created SandboxPool ${POOL} (namespace ${NAMESPACE}${gvisor ? `, runtime class ${GVISOR_RUNTIME_CLASS} allowed` : ''})`);
  }
}

function run(name, entry, env) {
  const child = spawn(process.execPath, [...NODE_FLAGS, join(root, entry)], { env: { ...process.env, ...env }, stdio: ['ignore', 'inherit', 'inherit'] });
  child.on('exit', (code, signal) => {
    if (!stopping) {
      say(`${name} exited (${signal ?? code}); stopping`);
      void stop(1);
    }
  });
  children.push(child);
  return child;
}

async function waitReady(url, what) {
  for (let i = 0; i < 300; i++) {
    const ok = await fetch(url).then((r) => r.ok, () => false);
    if (ok) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${what} did not become ready at ${url}`);
}

async function stop(code = 0) {
  if (stopping) return;
  stopping = true;
  say('stopping');
  await Promise.all(
    children.map(
      (c) =>
        new Promise((resolve) => {
          if (c.exitCode !== null) return resolve();
          c.once('exit', resolve);
          c.kill('SIGTERM');
        }),
    ),
  );
  if (startedCluster) spawnSync('bash', [join(root, 'test/cluster/down.sh')], { stdio: ['ignore', 'inherit', 'inherit'] });
  process.exit(code);
}

async function main() {
  const kubeconfig = await chooseCluster();
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(kubeconfig);
  await applyPolicy(kc);

  const token = randomBytes(24).toString('base64url');
  const common = { KUBECONFIG: kubeconfig, LOG_LEVEL: process.env.LOG_LEVEL ?? 'info' };
  run('operator', 'dist/operator/main.js', { ...common, METRICS_PORT: String(OPERATOR_METRICS_PORT), LEASE_NAME: 'sandbox-bridge-operator-dev',
    POOL_SELECTOR: `${DEV_LABEL}=true`,
  });
  run('bridge', 'dist/bridge/main.js', {
    ...common,
    BRIDGE_TOKEN: token,
    POOL_NAME: POOL,
    SANDBOX_NAMESPACE: NAMESPACE,
    PORT: String(PORT),
    METRICS_PORT: String(BRIDGE_METRICS_PORT),
    HOST: '127.0.0.1',
  });
  await waitReady(`http://127.0.0.1:${OPERATOR_METRICS_PORT}/readyz`, 'the operator');
  await waitReady(`http://127.0.0.1:${BRIDGE_METRICS_PORT}/readyz`, 'the bridge');

  const url = `http://127.0.0.1:${PORT}`;
  mkdirSync(join(root, '.dev'), { recursive: true });
  writeFileSync(join(root, '.dev/env'), `BRIDGE_URL=${url}\nBRIDGE_TOKEN=${token}\nKUBECONFIG=${kubeconfig}\n`, { mode: 0o600 });
  process.stderr.write(`
  sandbox-bridge is running.

    URL:    ${url}/api/v1
    token:  ${token}
    (also in .dev/env: BRIDGE_URL, BRIDGE_TOKEN, KUBECONFIG)

    curl -s -H "Authorization: Bearer ${token}" ${url}/api/v1/health

    Agent runtime: SANDBOX_PROVIDER=cluster-bridge CLUSTER_BRIDGE_URL=${url} CLUSTER_BRIDGE_TOKEN=<token above>
    Metrics: http://127.0.0.1:${BRIDGE_METRICS_PORT}/metrics (bridge), http://127.0.0.1:${OPERATOR_METRICS_PORT}/metrics (operator)

  Ctrl-C stops everything this started.
`);
}

process.on('SIGINT', () => void stop(0));
process.on('SIGTERM', () => void stop(0));
main().catch((err) => {
  say(`failed: ${err.message}`);
  void stop(1);
});
