// Box PID limits (operator/node-checks.ts) against the local cluster, the operator a real process:
// with NODE_CHECKS on it reads the kubelet configuration of each node running boxes through the
// API server's node proxy (GET /api/v1/nodes/<node>/proxy/configz) and exports
// sandbox_operator_node_pod_pids_limit{node}.
//   - the real node's kubelet sets podPidsLimit (test/cluster/real-node/up.sh): the gauge says it;
//   - a simulated (kwok) node has no kubelet the API server may proxy to (loopback address:
//     "address not allowed"): unknown, -1, said once in the log, no Event;
//   - a node whose kubelet sets no limit: a Node of this test's own (unschedulable, tainted)
//     whose kubelet endpoint is a stand-in HTTPS server on the real node's address, on this
//     machine, answering /configz with the real kubelet's configuration at the default
//     podPidsLimit -1. The real API server proxies to it as to any kubelet. 0, a warning, a
//     NodeWithoutPidLimit Event on the pool; read again after the interval, the gauge follows;
//   - with NODE_CHECKS off: the log says box PID limits are unverified, every box node is -1.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { LABELS } from '../../common/labels.js';
import { realNodeAvailable, realNodeBox, testKubeConfig, waitFor, waitRunning } from '../support/cluster.js';
import { Pools, boxPod, deleteLease, installCrd, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const shard = uniqueName('pids');
const pools = new Pools(kc, shard);
const realNode = await realNodeAvailable(kc);
if (!realNode.available) process.stderr.write(`\n[node-checks] SKIPPING the real-node cases: ${realNode.reason}\n`);
const onReal = realNode.available ? test : test.skip;
const INTERVAL_SECONDS = 5;
const GAUGE = 'sandbox_operator_node_pod_pids_limit';

let operator: OperatorProcess;
let pool = { name: '', ns: '' };

/** The gauge's value for `node` on `op`'s /metrics, or undefined while it has none. */
async function pidsLimit(op: OperatorProcess, node: string): Promise<number | undefined> {
  const text = await (await fetch(`http://127.0.0.1:${op.port}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${GAUGE}{node="${node}"} `));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

const waitGauge = (op: OperatorProcess, node: string, want: number, timeoutMs = 30_000) =>
  waitFor(`${GAUGE}{node="${node}"} to be ${want}`, async () => ((await pidsLimit(op, node)) === want ? true : undefined), { timeoutMs, intervalMs: 250 }).catch(
    async (err: unknown) => {
      throw new Error(`${String(err)} (it is ${await pidsLimit(op, node)})\noperator log:\n${op.logs()}`);
    },
  );

/** A box pod of the test pool: labelled as the bridge labels boxes. */
function poolBox(pod: k8s.V1Pod): k8s.V1Pod {
  pod.metadata!.labels = { ...pod.metadata!.labels, [LABELS.box]: 'true', [LABELS.pool]: pool.name, 'app.kubernetes.io/managed-by': 'sandbox-bridge' };
  return pod;
}

async function poolEvents(reason: string): Promise<k8s.CoreV1Event[]> {
  return (await core.listNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${pool.name},reason=${reason}` })).items;
}

beforeAll(async () => {
  await installCrd(kc);
  operator = await startOperator({ shard, leaseName: `op-test-${shard}`, env: { NODE_CHECKS: 'true', NODE_CHECK_INTERVAL_SECONDS: String(INTERVAL_SECONDS) } });
  pool = await pools.createReady();
}, 60_000);

afterAll(async () => {
  await operator?.stop();
  await deleteLease(kc, `op-test-${shard}`);
  await pools.cleanup();
}, 60_000);

onReal("the real node's kubelet sets podPidsLimit: the gauge reports what its configuration says, and nothing warns", async () => {
  const node = (realNode as { name: string }).name;
  const configz = (await core.connectGetNodeProxyWithPath({ name: node, path: 'configz' })) as unknown as { kubeletconfig: { podPidsLimit: number } };
  const limit = configz.kubeletconfig.podPidsLimit;
  expect(limit).toBeGreaterThan(0); // test/cluster/real-node/up.sh sets 4096
  const pod = poolBox(realNodeBox(uniqueName('pids-real'), 'exec sleep 3600'));
  await core.createNamespacedPod({ namespace: pool.ns, body: pod });
  await waitRunning(kc, pool.ns, pod.metadata!.name!);
  await waitGauge(operator, node, limit);
  expect(operator.logs()).toContain(`node ${node}: pods may have at most ${limit} PIDs each`);
  expect((await poolEvents('NodeWithoutPidLimit')).filter((e) => e.message?.includes(`Node ${node} `))).toEqual([]);
}, 120_000);

test('a simulated node has no kubelet configuration to read: unknown (-1), said once in the log, no Event', async () => {
  const name = uniqueName('pids-kwok');
  await core.createNamespacedPod({ namespace: pool.ns, body: poolBox(boxPod(name, pool.name)) });
  const node = await waitFor('the box to be scheduled on a kwok node', async () => (await core.readNamespacedPod({ namespace: pool.ns, name })).spec?.nodeName);
  await waitGauge(operator, node, -1);
  await waitFor('the log to say why', async () => (operator.logs().includes(`cannot read the kubelet configuration of node ${node}: its pod PID limit is unknown`) ? true : undefined));
  // The API server refused the proxy (kwok nodes report 127.0.0.1).
  expect(operator.logs()).toMatch(new RegExp(`"node":"${node}","err":"[^"]*address not allowed`));
  expect((await poolEvents('NodeWithoutPidLimit')).filter((e) => e.message?.includes(`Node ${node} `))).toEqual([]);
});

describe('a node whose kubelet sets no podPidsLimit', () => {
  const nodeName = uniqueName('pids-unlimited');
  const boxName = uniqueName('pids-box');
  let kubelet: https.Server | undefined;
  let answer = -1;
  const configzRequests: string[] = [];

  beforeAll(async () => {
    if (!realNode.available) return;
    // The stand-in kubelet: the real kubelet's configuration, with podPidsLimit as `answer`.
    const real = (await core.connectGetNodeProxyWithPath({ name: realNode.name, path: 'configz' })) as unknown as { kubeletconfig: Record<string, unknown> };
    const address = (await core.readNode({ name: realNode.name })).status!.addresses!.find((a) => a.type === 'InternalIP')!.address;
    const dir = mkdtempSync(join(tmpdir(), 'fake-kubelet-'));
    try {
      execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', join(dir, 'k'), '-out', join(dir, 'c'), '-days', '1', '-subj', `/CN=${address}`], { stdio: 'ignore' });
      kubelet = https.createServer({ key: readFileSync(join(dir, 'k')), cert: readFileSync(join(dir, 'c')) }, (req, res) => {
        configzRequests.push(`${req.method} ${req.url}`);
        if (req.url !== '/configz') return void res.writeHead(404).end();
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ kubeletconfig: { ...real.kubeletconfig, podPidsLimit: answer } }));
      });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    // On the real node's address: on this machine, and one the API server may proxy to (not loopback).
    await new Promise<void>((resolve) => kubelet!.listen(0, address, resolve));
    const port = (kubelet.address() as AddressInfo).port;
    // A Node nothing schedules to (unschedulable, tainted) and no kubelet manages.
    await core.createNode({
      body: {
        metadata: { name: nodeName, labels: { 'sandbox-bridge.io/test': 'true', 'kubernetes.io/hostname': nodeName } },
        spec: { unschedulable: true, taints: [{ key: 'sandbox-bridge.io/test-node', value: shard, effect: 'NoSchedule' }, { key: 'sandbox-bridge.io/test-node', value: shard, effect: 'NoExecute' }] },
      },
    });
    // A merge patch, not a read-modify-write: the node controller may write the new Node's status
    // in between (the CI once got 409 Conflict here).
    await core.patchNodeStatus(
      { name: nodeName, body: { status: { addresses: [{ type: 'InternalIP', address }], daemonEndpoints: { kubeletEndpoint: { Port: port } } } } },
      k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
    );
  }, 60_000);

  afterAll(async () => {
    await core.deleteNamespacedPod({ namespace: pool.ns, name: boxName, gracePeriodSeconds: 0 }).catch(() => undefined);
    await core.deleteNode({ name: nodeName }).catch(() => undefined);
    await new Promise<void>((resolve) => (kubelet ? kubelet.close(() => resolve()) : resolve()));
  }, 60_000);

  onReal('a box placed there: 0, a warning and a NodeWithoutPidLimit Event on the pool; after the interval the new setting shows', async () => {
    const pod = poolBox(boxPod(boxName, pool.name));
    pod.spec = { ...pod.spec!, nodeSelector: undefined, nodeName, tolerations: [{ operator: 'Exists' }] };
    await core.createNamespacedPod({ namespace: pool.ns, body: pod });
    await waitGauge(operator, nodeName, 0);
    expect(configzRequests).toContain('GET /configz');
    expect(operator.logs()).toContain(`node ${nodeName} runs boxes and its kubelet sets no pod PID limit (podPidsLimit)`);
    const events = await waitFor('the NodeWithoutPidLimit Event on the pool', async () => {
      const found = (await poolEvents('NodeWithoutPidLimit')).filter((e) => e.message?.includes(`Node ${nodeName} `));
      return found.length ? found : undefined;
    });
    expect(events[0]).toMatchObject({ type: 'Warning', involvedObject: { kind: 'SandboxPool', name: pool.name } });
    expect(events[0]!.message).toContain('runs 1 box of this pool and its kubelet sets no pod PID limit');

    // The kubelet now has a limit: the next read, an interval later, reports it.
    answer = 2048;
    const reads = configzRequests.length;
    await waitGauge(operator, nodeName, 2048, (INTERVAL_SECONDS + 20) * 1000);
    expect(configzRequests.length).toBeGreaterThan(reads);
  }, 90_000);
});

test('NODE_CHECKS off: the start says box PID limits are unverified, and every node running boxes reports -1', async () => {
  const offShard = uniqueName('pids-off');
  const off = await startOperator({ shard: offShard, leaseName: `op-test-${offShard}`, name: 'operator-off' });
  try {
    expect(off.logs()).toMatch(/box PID limits are unverified: the operator does not read node configurations .*operator\.nodeChecks\.enabled/);
    // The pods of this file's pool are in its cache too (box pods are watched cluster-wide).
    const name = uniqueName('pids-off');
    await core.createNamespacedPod({ namespace: pool.ns, body: poolBox(boxPod(name, pool.name)) });
    const node = await waitFor('the box to be scheduled', async () => (await core.readNamespacedPod({ namespace: pool.ns, name })).spec?.nodeName);
    await waitGauge(off, node, -1);
    if (realNode.available) expect([undefined, -1]).toContain(await pidsLimit(off, realNode.name));
    expect(off.logs()).not.toContain('cannot read the kubelet configuration');
  } finally {
    await off.stop();
    await deleteLease(kc, `op-test-${offShard}`);
  }
}, 60_000);
