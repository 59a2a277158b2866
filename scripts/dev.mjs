// `npm run dev`: the operator and the bridge against a cluster, ready for an agent runtime.
//
// With KUBECONFIG pointing at a reachable cluster, that cluster is used. Otherwise the local
// cluster is brought up (test/cluster/up.sh, which also checks and repairs one that is already
// up), and brought down again on Ctrl-C if this run started it. A local cluster that is still
// missing a piece afterwards (metrics API, a Ready node, the real node when one is expected) is
// refused with a message naming what is missing, rather than used half-working.
//
// The SandboxPool CRD is applied and a pool "dev" is created or brought up to date (namespace
// "sandbox"; boxes go to the local real node when there is one, with the locally built box
// image). On the local cluster's real node the chart's egress gateway runs too (2 replicas in
// namespace "sandbox-bridge-dev", removed again on stop) and the pool points at it; the pool
// stays in direct mode until you switch it (docs/egress.md). The bridge gets a freshly generated token; URL, token and a curl line are printed and
// written to .dev/env, which is removed when dev stops.
//
// Supervision, like a kubelet's: a program that exits (the operator does so on purpose when it
// loses its lease, e.g. while the API server is frozen) is restarted with exponential backoff
// (1 s doubling to 30 s, back to 1 s after a minute of running), with the same token and ports,
// so .dev/env stays valid. dev itself only stops on Ctrl-C / SIGTERM / SIGHUP.
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { nodeFlagsFor } from '../dist/common/node-flags.js';
// The chart's gateway objects on the local real node: the tests' helper, built into dist/ with
// the benches that use it (npm run build).
import { deployGatewayOnRealNode } from '../dist/test/support/egress-gateway.js';
import { realNodeNetwork } from '../dist/test/support/test-hosts.js';

const root = join(import.meta.dirname, '..');
const POOL = process.env.DEV_POOL ?? 'dev';
const NAMESPACE = process.env.DEV_NAMESPACE ?? 'sandbox';
const PORT = Number(process.env.PORT ?? 8080);
const BRIDGE_METRICS_PORT = Number(process.env.METRICS_PORT ?? 9090);
const OPERATOR_METRICS_PORT = Number(process.env.OPERATOR_METRICS_PORT ?? BRIDGE_METRICS_PORT + 1);
const DEV_DIR = process.env.DEV_DIR ?? join(root, '.dev');
const ENV_FILE = join(DEV_DIR, 'env');
const REAL_NODE_LABEL = 'sandbox-bridge.io/real-node';
/** The box image test/cluster/real-node/images.sh builds into the real node's containerd. */
const LOCAL_BOX_IMAGE = 'sandbox-bridge.local/box:dev';
// The dev operator reconciles only the pool carrying this label with its own name as value,
// never other people's (or tests').
const DEV_LABEL = 'sandbox-bridge.io/dev';
const BACKOFF_START_MS = 1000;
const BACKOFF_MAX_MS = 30_000;
const STABLE_AFTER_MS = 60_000;
const GVISOR_RUNTIME_CLASS = 'gvisor';
const GATEWAY_NAMESPACE = process.env.DEV_GATEWAY_NAMESPACE ?? 'sandbox-bridge-dev';

const say = (msg) => process.stderr.write(`[dev] ${msg}\n`);
const children = [];
let startedCluster = false;
let gateway;
let stopping = false;

const kubectlBin = () => (existsSync(join(root, '.cluster/bin/kubectl')) ? join(root, '.cluster/bin/kubectl') : 'kubectl');

function reachable(kubeconfig) {
  if (!kubeconfig || !existsSync(kubeconfig.split(':')[0])) return false;
  const probe = spawnSync(kubectlBin(), ['--request-timeout=5s', 'get', '--raw', '/readyz'], {
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
    return { kubeconfig: process.env.KUBECONFIG, local: false };
  }
  const kubeconfig = join(root, '.cluster/kubeconfig');
  const wasUp = reachable(kubeconfig);
  // up.sh reuses a running cluster after checking every component (restarting dead ones, and the
  // real node), or starts one; either way it ends with the whole cluster up or fails saying why.
  say(wasUp ? 'checking the local cluster that is already up (test/cluster/up.sh)' : 'KUBECONFIG is not set: bringing the local cluster up (test/cluster/up.sh)');
  const up = spawnSync('bash', [join(root, 'test/cluster/up.sh')], { stdio: ['ignore', 'inherit', 'inherit'] });
  startedCluster = !wasUp;
  if (up.status !== 0) throw new Error('test/cluster/up.sh could not bring the local cluster up; see above');
  return { kubeconfig, local: true };
}

/** What the local cluster lacks for dev to work (empty when nothing), and why the real node is absent. */
async function localClusterProblems(kc) {
  const problems = [];
  const registration = kc.makeApiClient(k8s.ApiregistrationV1Api);
  const metrics = await registration.readAPIService({ name: 'v1beta1.metrics.k8s.io' }).catch(() => undefined);
  if (!metrics?.status?.conditions?.some((c) => c.type === 'Available' && c.status === 'True')) {
    problems.push('the metrics API (metrics-server) is not available');
  }
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const ready = (n) => n.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True');
  const nodes = (await core.listNode()).items;
  if (!nodes.some(ready)) problems.push('no node is Ready');
  const unavailableFile = join(root, '.cluster/real-node.unavailable');
  const realNodeMissing = existsSync(unavailableFile) ? readFileSync(unavailableFile, 'utf8').split('\n')[0] : undefined;
  const realNode = nodes.find((n) => n.metadata?.labels?.[REAL_NODE_LABEL] === 'true');
  if (!realNodeMissing && !(realNode && ready(realNode))) {
    problems.push(`the real node is ${realNode ? 'not Ready' : 'missing'} although up.sh did not record why (.cluster/real-node.unavailable)`);
  }
  return { problems, realNodeMissing, hasRealNode: !!realNode && ready(realNode) };
}

async function applyPolicy(kc, hasRealNode) {
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

  // Placement follows the cluster as it is now: a pool left pointing at a real node that is gone
  // would make every create wait for a node that never comes.
  const box = hasRealNode
    ? {
        defaultImage: LOCAL_BOX_IMAGE,
        nodeSelector: { [REAL_NODE_LABEL]: 'true' },
        tolerations: [{ key: REAL_NODE_LABEL, operator: 'Exists', effect: 'NoSchedule' }],
      }
    : { defaultImage: LOCAL_BOX_IMAGE, nodeSelector: null, tolerations: null };
  if (!hasRealNode) say('no real node: boxes run on simulated nodes, which have no boxd: create/list/delete work, exec and files do not');
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
  const existing = await custom.getClusterCustomObject({ ...ref, name: POOL }).catch((err) => {
    if (err instanceof k8s.ApiException && err.code === 404) return undefined;
    throw err;
  });
  if (existing) {
    // A merge patch merges maps: clear the keys of an old nodeSelector that are not wanted now.
    const stale = Object.fromEntries(Object.keys(existing.spec?.box?.nodeSelector ?? {}).map((key) => [key, null]));
    const patch = { ...box, nodeSelector: box.nodeSelector === null ? null : { ...stale, ...box.nodeSelector } };
    await custom.patchClusterCustomObject(
      {
        ...ref,
        name: POOL,
        body: { metadata: { labels: { [DEV_LABEL]: POOL } }, spec: { box: patch, allowedRuntimeClassNames: gvisor ? [GVISOR_RUNTIME_CLASS] : [] } },
      },
      k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
    );
    say(`using the existing SandboxPool ${POOL} (placement updated)`);
  } else {
    const spec = {
      namespace: NAMESPACE,
      box: Object.fromEntries(Object.entries(box).filter(([, v]) => v !== null)),
      allowedRuntimeClassNames: gvisor ? [GVISOR_RUNTIME_CLASS] : [],
    };
    await custom.createClusterCustomObject({
      ...ref,
      body: { apiVersion: 'sandbox-bridge.io/v1alpha1', kind: 'SandboxPool', metadata: { name: POOL, labels: { [DEV_LABEL]: POOL } }, spec },
    });
    say(`created SandboxPool ${POOL} (namespace ${NAMESPACE}${gvisor ? `, runtime class ${GVISOR_RUNTIME_CLASS} allowed` : ''})`);
  }
}

/** Runs a program and keeps it running: restarts it with backoff whenever it exits. */
function supervise(name, entry, env) {
  const state = { name, child: undefined, restarts: 0, timer: undefined };
  let backoff = BACKOFF_START_MS;
  const start = () => {
    const startedAt = Date.now();
    const child = spawn(process.execPath, [...nodeFlagsFor(entry), join(root, entry)], { env: { ...process.env, ...env }, stdio: ['ignore', 'inherit', 'inherit'] });
    state.child = child;
    child.on('exit', (code, signal) => {
      if (stopping) return;
      if (Date.now() - startedAt >= STABLE_AFTER_MS) backoff = BACKOFF_START_MS;
      state.restarts++;
      say(`${name} exited (${signal ?? code}); restarting in ${backoff / 1000} s (restart ${state.restarts})`);
      state.timer = setTimeout(start, backoff);
      backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
    });
  };
  start();
  children.push(state);
  return state;
}

async function waitReady(url, what) {
  for (let i = 0; i < 600; i++) {
    const ok = await fetch(url, { signal: AbortSignal.timeout(2000) }).then((r) => r.ok, () => false);
    if (ok) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${what} did not become ready at ${url}`);
}

function removeEnvFile() {
  rmSync(ENV_FILE, { force: true });
}

async function stop(code = 0) {
  if (stopping) return;
  stopping = true;
  say('stopping');
  removeEnvFile();
  await Promise.all(
    children.map(
      ({ child, timer }) =>
        new Promise((resolve) => {
          clearTimeout(timer);
          if (!child || child.exitCode !== null || child.signalCode !== null) return resolve();
          child.once('exit', resolve);
          child.kill('SIGTERM');
          // The bridge lets in-flight execs finish for its grace period; do not wait forever.
          setTimeout(() => child.kill('SIGKILL'), 40_000).unref();
        }),
    ),
  );
  if (gateway && !startedCluster) await gateway.stop().catch((err) => say(`could not remove the egress gateway: ${err.message}`));
  if (startedCluster) spawnSync('bash', [join(root, 'test/cluster/down.sh')], { stdio: ['ignore', 'inherit', 'inherit'] });
  process.exit(code);
}

/**
 * A key kept in .dev/<name> between runs (made on first use): boxes, snapshots and proxy
 * credentials made by an earlier run stay usable only if their keys stay.
 */
function devKey(name) {
  const file = join(root, '.dev', name);
  if (existsSync(file)) return readFileSync(file, 'utf8').trim();
  mkdirSync(join(root, '.dev'), { recursive: true });
  const key = randomBytes(32).toString('hex');
  writeFileSync(file, `${key}\n`, { mode: 0o600 });
  return key;
}

/**
 * The chart's egress gateway on the local real node, when Services and in-cluster API access work
 * there (test/cluster/real-node/up.sh records why not), and the pool pointed at it.
 */
async function startGateway(kc, kubeconfig, egressKey) {
  const why = ['services.unavailable', 'in-cluster-api.unavailable'].map((f) => join(root, '.cluster', f)).find((f) => existsSync(f));
  process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG = kubeconfig;
  const net = realNodeNetwork();
  if (why || !net?.svcChain) {
    say(`no egress gateway: ${why ? readFileSync(why, 'utf8').split('\n')[0] : 'the real node has no Services (run test/cluster/up.sh again)'}`);
    return undefined;
  }
  // Its Role goes into the pool's namespace, which the operator makes.
  const core = kc.makeApiClient(k8s.CoreV1Api);
  for (let i = 0; !(await core.readNamespace({ name: NAMESPACE }).then(() => true, () => false)); i++) {
    if (i > 150) throw new Error(`the operator did not make namespace ${NAMESPACE}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  say(`starting the egress gateway (2 replicas, namespace ${GATEWAY_NAMESPACE})`);
  const gw = await deployGatewayOnRealNode({
    kc,
    net,
    poolNamespace: NAMESPACE,
    key: egressKey,
    resolverKey: randomBytes(32).toString('hex'),
    namespace: GATEWAY_NAMESPACE,
    release: 'dev',
  });
  await kc.makeApiClient(k8s.CustomObjectsApi).patchClusterCustomObject(
    { group: 'sandbox-bridge.io', version: 'v1alpha1', plural: 'sandboxpools', name: POOL, body: { spec: { egress: { gateway: gw.poolGateway } } } },
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
  );
  return gw;
}

/**
 * OBJECT_STORE_* of the local cluster's S3-compatible store (test/cluster/object-store/up.sh
 * writes them), or nothing: without a store, snapshots answer 501 and boxes never sleep.
 */
function devObjectStore(local) {
  const file = join(root, '.cluster/object-store/env');
  if (!local || !existsSync(file)) return {};
  const env = Object.fromEntries(
    readFileSync(file, 'utf8')
      .split('\n')
      .filter((line) => /^OBJECT_STORE_[A-Z_]+=/.test(line))
      .map((line) => [line.slice(0, line.indexOf('=')), line.slice(line.indexOf('=') + 1)]),
  );
  return { ...env, OBJECT_STORE_PREFIX: 'dev', SNAPSHOT_ENCRYPTION_KEY: devKey('snapshot-key') };
}

async function main() {
  // A file left by a dev that was killed outright points at nothing: never keep it.
  removeEnvFile();
  const { kubeconfig, local } = await chooseCluster();
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(kubeconfig);
  let hasRealNode = false;
  if (local) {
    const check = await localClusterProblems(kc);
    if (check.problems.length) {
      throw new Error(
        `the local cluster is only half up: ${check.problems.join('; ')}. ` +
          'Start it afresh with `npm run cluster:down && npm run dev` (logs: .cluster/kwok/clusters/*/logs/)',
      );
    }
    hasRealNode = check.hasRealNode;
    if (!hasRealNode) say(`no real node (${check.realNodeMissing}): boxes run on simulated nodes, where exec runs on this host (use workdir /tmp)`);
  } else {
    const realNodes = await kc.makeApiClient(k8s.CoreV1Api).listNode({ labelSelector: `${REAL_NODE_LABEL}=true` });
    hasRealNode = realNodes.items.length > 0;
  }
  await applyPolicy(kc, hasRealNode);

  const token = randomBytes(24).toString('base64url');
  // The key box credentials are derived from; boxes made by an earlier run keep theirs only
  // if the key stays, so it is kept in .dev/ between runs.
  const boxdKey = devKey('boxd-key');
  const boxdImage = process.env.BOXD_IMAGE ?? 'sandbox-bridge.local/boxd:dev';
  const egressKey = devKey('egress-key');
  const store = devObjectStore(local);
  if (!store.OBJECT_STORE_BUCKET) say('no local object store: snapshots answer 501 (run npm run cluster:up for one)');
  const common = { KUBECONFIG: kubeconfig, LOG_LEVEL: process.env.LOG_LEVEL ?? 'info', EGRESS_KEY: egressKey, ...store };
  supervise('operator', 'dist/operator/main.js', {
    ...common,
    // Warm boxes: the operator makes their pods and credentials with the bridge's image and key.
    BOXD_KEY: boxdKey,
    BOXD_IMAGE: boxdImage,
    METRICS_PORT: String(OPERATOR_METRICS_PORT),
    LEASE_NAME: `sandbox-bridge-operator-${POOL}`,
    POOL_SELECTOR: `${DEV_LABEL}=${POOL}`,
  });
  supervise('bridge', 'dist/bridge/main.js', {
    ...common,
    BRIDGE_TOKEN: token,
    BOXD_KEY: boxdKey,
    BOXD_IMAGE: boxdImage,
    POOL_NAME: POOL,
    SANDBOX_NAMESPACE: NAMESPACE,
    PORT: String(PORT),
    METRICS_PORT: String(BRIDGE_METRICS_PORT),
    HOST: '127.0.0.1',
  });
  await waitReady(`http://127.0.0.1:${OPERATOR_METRICS_PORT}/readyz`, 'the operator');
  await waitReady(`http://127.0.0.1:${BRIDGE_METRICS_PORT}/readyz`, 'the bridge');
  if (stopping) return;
  if (local && hasRealNode) {
    // Without it dev still serves direct-mode pools; a node too full to schedule it is the usual reason.
    gateway = await startGateway(kc, kubeconfig, egressKey).catch((err) => void say(`the egress gateway did not start: ${err.message.split('\n')[0]}`));
  }
  if (stopping) return;

  const url = `http://127.0.0.1:${PORT}`;
  mkdirSync(DEV_DIR, { recursive: true });
  // DEV_PID: a script can check the file is not stale (`kill -0 $DEV_PID`) if dev was SIGKILLed.
  writeFileSync(ENV_FILE, `BRIDGE_URL=${url}\nBRIDGE_TOKEN=${token}\nKUBECONFIG=${kubeconfig}\nDEV_PID=${process.pid}\n`, { mode: 0o600 });
  process.stderr.write(`
  sandbox-bridge is running.

    URL:    ${url}/api/v1
    token:  ${token}
    (also in ${ENV_FILE}: BRIDGE_URL, BRIDGE_TOKEN, KUBECONFIG; removed when dev stops)

    curl -s -H "Authorization: Bearer ${token}" ${url}/api/v1/health

    Agent runtime: SANDBOX_PROVIDER=cluster-bridge CLUSTER_BRIDGE_URL=${url} CLUSTER_BRIDGE_TOKEN=<token above>
    Metrics: http://127.0.0.1:${BRIDGE_METRICS_PORT}/metrics (bridge), http://127.0.0.1:${OPERATOR_METRICS_PORT}/metrics (operator)
${
  gateway
    ? `    Egress gateway: ${gateway.service}.${GATEWAY_NAMESPACE} (${gateway.serviceIP}:3128); the pool is in direct mode until you switch it:
      kubectl patch sbp ${POOL} --type merge -p '{"spec":{"egress":{"mode":"gateway","domains":{"allow":["example.com"]}}}}'
      (this machine's real node reaches only test hosts: see docs/local-cluster.md)
`
    : ''
}
  The operator and the bridge are restarted if they exit. Ctrl-C stops everything this started.
`);
}

for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => void stop(0));
// Whatever ends this process, the env file must not outlive it.
process.on('exit', removeEnvFile);
main().catch((err) => {
  say(`failed: ${err.message}`);
  void stop(1);
});
