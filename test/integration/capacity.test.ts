// GET /cluster/capacity through the real bridge on simulated nodes of this test's own (kwok
// manages any node with its annotation), so the expected figures are exact: which nodes count
// (Ready, not cordoned, selected and tolerated by the pool), what counts as used (boxes only, or
// every pod with CAPACITY_ALL_PODS), and that a change to a node shows through the watch.
import { randomBytes } from 'node:crypto';
import * as k8s from '@kubernetes/client-node';
import { withDefaults } from '../../common/pool.js';
import { ClusterCapacity } from '../../bridge/schemas.js';
import type { RunningBridge } from '../../bridge/server.js';
import { api, startTestBridge, testClient, testPolicy } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, restrictedPod, testKubeConfig, waitFor } from '../support/cluster.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const id = randomBytes(3).toString('hex');
const LABEL = 'sandbox-bridge.io/capacity-test';
const TAINT = 'sandbox-bridge.io/capacity-test-taint';
const names = { a: `cap-${id}-a`, b: `cap-${id}-b`, cordoned: `cap-${id}-cordoned`, tainted: `cap-${id}-tainted` };
let namespace: string;
const bridges: RunningBridge[] = [];

function simulatedNode(name: string, spec: k8s.V1NodeSpec = {}): k8s.V1Node {
  const resources = { cpu: '4', memory: '8Gi', pods: '10' };
  return {
    metadata: { name, annotations: { 'kwok.x-k8s.io/node': 'fake' }, labels: { [LABEL]: id, 'kubernetes.io/hostname': name } },
    spec,
    status: { allocatable: resources, capacity: resources, addresses: [{ type: 'InternalIP', address: '127.0.0.1' }] },
  };
}

beforeAll(async () => {
  await Promise.all([
    core.createNode({ body: simulatedNode(names.a) }),
    core.createNode({ body: simulatedNode(names.b) }),
    core.createNode({ body: simulatedNode(names.cordoned, { unschedulable: true }) }),
    core.createNode({ body: simulatedNode(names.tainted, { taints: [{ key: TAINT, value: 'yes', effect: 'NoSchedule' }] }) }),
  ]);
  for (const name of Object.values(names)) {
    await waitFor(`node ${name} to be Ready`, async () => {
      const n = await core.readNode({ name });
      return n.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ? true : undefined;
    });
  }
  namespace = await createTestNamespace(kc, 'capacity', { 'pod-security.kubernetes.io/enforce': 'restricted' });
});

afterAll(async () => {
  await Promise.all(bridges.map((b) => b.close()));
  await deleteTestNamespace(kc, namespace);
  await Promise.all(Object.values(names).map((name) => core.deleteNode({ name }).catch(() => undefined)));
});

const box = withDefaults({ namespace: '' }).box;

test('nodes boxes can use, what the boxes request, the pool headroom; a cordon shows through the watch', async () => {
  const boxesOnly = await startTestBridge(kc, testPolicy(namespace, { maxBoxes: 7, box: { ...box, nodeSelector: { [LABEL]: id } } }));
  bridges.push(boxesOnly);
  const call = api(boxesOnly);
  for (const sessionId of ['cap-1', 'cap-2']) expect((await call('POST', '/boxes', { sessionId, cpu: 0.5, memory: 256 })).status).toBe(201);
  const placed = await waitFor('both boxes to be scheduled', async () => {
    const pods = (await core.listNamespacedPod({ namespace })).items;
    return pods.length === 2 && pods.every((p) => p.spec?.nodeName) ? pods : undefined;
  });
  expect(placed.map((p) => p.spec!.nodeName).every((n) => n === names.a || n === names.b)).toBe(true);

  const client = testClient(boxesOnly);
  const expected = {
    cpu: { used: 1, total: 8, unit: 'cores' },
    memory: { used: 512, total: 16384, unit: 'MiB' },
    pods: { used: 2, total: 20 },
    boxes: { active: 2, warm: 0, max: 7 },
  };
  const capacity = await waitFor('capacity to count both boxes', async () => {
    const c = await client.getCapacity();
    return c.pods.used === 2 ? c : undefined;
  });
  expect(capacity).toEqual(expected);
  expect(ClusterCapacity.parse(capacity)).toEqual(capacity);

  // Cordoning a node takes it, and the box on it, out of the figures.
  const onB = placed.filter((p) => p.spec!.nodeName === names.b).length;
  await core.patchNode({ name: names.b, body: { spec: { unschedulable: true } } }, k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch));
  try {
    const cordoned = await waitFor('capacity to drop the cordoned node', async () => {
      const c = await client.getCapacity();
      return c.cpu.total === 4 ? c : undefined;
    });
    expect(cordoned).toEqual({ ...expected, cpu: { ...expected.cpu, used: 0.5 * (2 - onB), total: 4 }, memory: { ...expected.memory, used: 256 * (2 - onB), total: 8192 }, pods: { used: 2 - onB, total: 10 } });
  } finally {
    await core.patchNode({ name: names.b, body: { spec: { unschedulable: false } } }, k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch));
  }
});

test('CAPACITY_ALL_PODS: every scheduled pod on the counted nodes is used; a tolerated taint counts its node', async () => {
  const other = restrictedPod('not-a-box', {
    nodeSelector: { 'kubernetes.io/hostname': names.tainted },
    tolerations: [{ key: TAINT, operator: 'Exists', effect: 'NoSchedule' }],
  });
  other.spec!.containers[0]!.resources = { requests: { cpu: '1', memory: '1Gi' }, limits: { cpu: '1', memory: '1Gi' } };
  await core.createNamespacedPod({ namespace, body: other });
  const allPods = await startTestBridge(
    kc,
    testPolicy(namespace, { box: { ...box, nodeSelector: { [LABEL]: id }, tolerations: [{ key: TAINT, operator: 'Equal', value: 'yes', effect: 'NoSchedule' }] } }),
    { CAPACITY_ALL_PODS: 'true' },
  );
  bridges.push(allPods);
  const client = testClient(allPods);
  const capacity = await waitFor('capacity to count the other pod', async () => {
    const c = await client.getCapacity().catch(() => undefined);
    return c && c.pods.used === 3 ? c : undefined;
  });
  // Nodes a, b and the tainted one; the two boxes of the first test and the other pod.
  expect(capacity).toEqual({
    cpu: { used: 2, total: 12, unit: 'cores' },
    memory: { used: 1536, total: 24576, unit: 'MiB' },
    pods: { used: 3, total: 30 },
    boxes: { active: 2, warm: 0, max: 50 },
  });
});
