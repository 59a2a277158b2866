// Which nodes count for capacity, and what counts as used; pure logic over hand-made objects.
import type * as k8s from '@kubernetes/client-node';
import { withDefaults } from '../../common/pool.js';
import type { BoxReader } from '../kube/box-cache.js';
import { staticPolicy } from '../kube/policy.js';
import { podRequests } from '../kube/pod-requests.js';
import { CapacityService, schedulableFor, tolerates } from './capacity.js';

function node(name: string, o: { labels?: Record<string, string>; ready?: boolean; cordoned?: boolean; taints?: k8s.V1Taint[] } = {}): k8s.V1Node {
  return {
    metadata: { name, labels: o.labels ?? { pool: 'boxes' } },
    spec: { unschedulable: o.cordoned, taints: o.taints },
    status: {
      allocatable: { cpu: '4', memory: '8Gi', pods: '10' },
      conditions: [{ type: 'Ready', status: o.ready === false ? 'False' : 'True' }],
    },
  };
}

function box(name: string, nodeName: string | undefined, cpu: string, memory: string, phase = 'Running'): k8s.V1Pod {
  return {
    metadata: { name },
    spec: { nodeName, containers: [{ name: 'box', resources: { requests: { cpu, memory }, limits: { cpu, memory } } }] },
    status: { phase },
  };
}

test('nodes count when Ready, not cordoned, selected by the pool and every hard taint tolerated', () => {
  const box = { nodeSelector: { pool: 'boxes' }, tolerations: [{ key: 'dedicated', operator: 'Equal', value: 'boxes', effect: 'NoSchedule' }] };
  expect(schedulableFor(node('a'), box)).toBe(true);
  expect(schedulableFor(node('b', { ready: false }), box)).toBe(false);
  expect(schedulableFor(node('c', { cordoned: true }), box)).toBe(false);
  expect(schedulableFor(node('d', { labels: { pool: 'other' } }), box)).toBe(false);
  expect(schedulableFor(node('e', { taints: [{ key: 'dedicated', value: 'boxes', effect: 'NoSchedule' }] }), box)).toBe(true);
  expect(schedulableFor(node('f', { taints: [{ key: 'dedicated', value: 'gpu', effect: 'NoSchedule' }] }), box)).toBe(false);
  expect(schedulableFor(node('g', { taints: [{ key: 'x', effect: 'PreferNoSchedule' }] }), box)).toBe(true);
  expect(schedulableFor(node('h', { taints: [{ key: 'x', effect: 'NoExecute' }] }), {})).toBe(false);
});

test('toleration matching follows Kubernetes', () => {
  const taint = { key: 'k', value: 'v', effect: 'NoSchedule' };
  expect(tolerates({ operator: 'Exists' }, taint)).toBe(true);
  expect(tolerates({ key: 'k', operator: 'Exists', effect: 'NoExecute' }, taint)).toBe(false);
  expect(tolerates({ key: 'k', value: 'v' }, taint)).toBe(true);
  expect(tolerates({ key: 'k', value: 'w' }, taint)).toBe(false);
  expect(tolerates({ key: 'other', operator: 'Exists' }, taint)).toBe(false);
});

test('a pod reserves its containers and sidecars, or its largest init container, plus overhead', () => {
  const c = (cpu: string, restartPolicy?: string): k8s.V1Container => ({ name: 'c', resources: { requests: { cpu, memory: '1Mi' } }, ...(restartPolicy ? { restartPolicy } : {}) });
  expect(podRequests({ containers: [c('500m'), c('250m')] }).cpu).toBe(0.75);
  expect(podRequests({ initContainers: [c('2')], containers: [c('500m')] }).cpu).toBe(2);
  expect(podRequests({ initContainers: [c('100m', 'Always'), c('1')], containers: [c('500m')] }).cpu).toBeCloseTo(1.1);
  expect(podRequests({ containers: [c('1')], overhead: { cpu: '250m' } }).cpu).toBe(1.25);
  expect(podRequests({ containers: [{ name: 'x', resources: { limits: { memory: '2Mi' } } }] }).memory).toBe(2 * 2 ** 20);
});

test('capacity: totals of the counted nodes; used by the boxes, or by every pod when all pods are watched', async () => {
  const nodes = [node('a'), node('b'), node('cordoned', { cordoned: true }), node('other', { labels: {} })];
  const boxes = [box('b1', 'a', '500m', '256Mi'), box('b2', 'b', '1', '512Mi'), box('pending', undefined, '1', '1Gi', 'Pending'), box('done', 'a', '1', '1Gi', 'Failed'), box('elsewhere', 'other', '1', '1Gi')];
  const reader = { list: () => boxes, all: () => boxes, activeCount: () => 3, warmReadyCount: () => 0 } as unknown as BoxReader;
  const policy = staticPolicy('p', withDefaults({ namespace: 'ns', maxBoxes: 40, box: { ...withDefaults({ namespace: '' }).box, nodeSelector: { pool: 'boxes' } } }));
  const nodeReader = { list: () => nodes, synced: () => Promise.resolve() };

  const service = new CapacityService({ nodes: nodeReader, boxes: reader, policy });
  expect(await service.get()).toEqual({
    cpu: { used: 1.5, total: 8, unit: 'cores' },
    memory: { used: 768, total: 16384, unit: 'MiB' },
    pods: { used: 2, total: 20 },
    boxes: { active: 3, warm: 0, max: 40 },
  });

  const allPods = { requests: () => [{ node: 'a', cpu: 0.5, memory: 256 * 2 ** 20 }, { node: 'b', cpu: 2, memory: 2 ** 30 }, { node: 'other', cpu: 3, memory: 0 }] };
  expect(await new CapacityService({ nodes: nodeReader, boxes: reader, policy, allPods }).get()).toMatchObject({
    cpu: { used: 2.5, total: 8 },
    memory: { used: 1280, total: 16384 },
    pods: { used: 2, total: 20 },
  });
});
