// GET /cluster/capacity: room for boxes, from watch caches only. The nodes counted are those a
// box of the pool could be scheduled on now: Ready, not cordoned, matching the pool's node
// selector, every NoSchedule/NoExecute taint tolerated by the pool. `total` is their allocatable
// cpu, memory and pods; `used` what scheduled pods on them request: every pod when the bridge
// watches all pods (CAPACITY_ALL_PODS), else the pool's boxes only (docs/capacity.md).
import type * as k8s from '@kubernetes/client-node';
import type { z } from 'zod';
import type { BoxPolicy } from '../../common/pool.js';
import { parseQuantity } from '../../common/quantity.js';
import type { BoxReader } from '../kube/box-cache.js';
import type { NodeReader } from '../kube/node-cache.js';
import type { PolicySource } from '../kube/policy.js';
import { podRequests, type PodRequests } from '../kube/pod-requests.js';
import type { ClusterCapacity } from '../schemas.js';

export type CapacityBody = z.output<typeof ClusterCapacity>;

export interface CapacityDeps {
  nodes: NodeReader;
  boxes: BoxReader;
  policy: PolicySource;
  /** Every scheduled pod's requests; without it only the boxes count as used. */
  allPods?: { requests(): Iterable<PodRequests> };
}

const MiB = 2 ** 20;

export class CapacityService {
  constructor(private readonly deps: CapacityDeps) {}

  async get(): Promise<CapacityBody> {
    await this.deps.nodes.synced();
    const spec = this.deps.policy.current();
    const counted = new Set<string>();
    const total = { cpu: 0, memory: 0, pods: 0 };
    for (const node of this.deps.nodes.list()) {
      if (!schedulableFor(node, spec.box)) continue;
      counted.add(node.metadata?.name ?? '');
      const a = node.status?.allocatable ?? {};
      total.cpu += quantity(a.cpu);
      total.memory += quantity(a.memory);
      total.pods += quantity(a.pods);
    }
    const used = { cpu: 0, memory: 0, pods: 0 };
    for (const r of this.deps.allPods?.requests() ?? this.boxRequests()) {
      if (!counted.has(r.node)) continue;
      used.cpu += r.cpu;
      used.memory += r.memory;
      used.pods += 1;
    }
    return {
      cpu: { used: cores(used.cpu), total: cores(total.cpu), unit: 'cores' },
      memory: { used: Math.round(used.memory / MiB), total: Math.round(total.memory / MiB), unit: 'MiB' },
      pods: { used: used.pods, total: total.pods },
      // Warm boxes count against max too (the quota counts every pod).
      boxes: { active: this.deps.boxes.activeCount(), warm: this.deps.boxes.warmReadyCount(this.deps.policy.poolName), max: spec.maxBoxes },
    };
  }

  private *boxRequests(): Iterable<PodRequests> {
    for (const pod of this.deps.boxes.all()) {
      const phase = pod.status?.phase;
      if (!pod.spec?.nodeName || phase === 'Succeeded' || phase === 'Failed') continue;
      yield { node: pod.spec.nodeName, ...podRequests(pod.spec) };
    }
  }
}

/** Whether a box of this policy could be scheduled on the node now. */
export function schedulableFor(node: k8s.V1Node, box: Pick<BoxPolicy, 'nodeSelector' | 'tolerations'>): boolean {
  if (node.spec?.unschedulable) return false;
  if (node.status?.conditions?.find((c) => c.type === 'Ready')?.status !== 'True') return false;
  const labels = node.metadata?.labels ?? {};
  for (const [key, value] of Object.entries(box.nodeSelector ?? {})) if (labels[key] !== value) return false;
  return (node.spec?.taints ?? []).every((taint) => taint.effect === 'PreferNoSchedule' || (box.tolerations ?? []).some((t) => tolerates(t, taint)));
}

/** Kubernetes' toleration matching (k8s.io/api/core/v1 Toleration.ToleratesTaint). */
export function tolerates(t: k8s.V1Toleration, taint: k8s.V1Taint): boolean {
  if (t.effect && t.effect !== taint.effect) return false;
  if (t.key && t.key !== taint.key) return false;
  if (t.operator === 'Exists') return true;
  return (t.value ?? '') === (taint.value ?? '');
}

function quantity(q: string | undefined): number {
  return q === undefined ? 0 : parseQuantity(q);
}

/** Cores to the millicore. */
function cores(value: number): number {
  return Math.round(value * 1000) / 1000;
}
