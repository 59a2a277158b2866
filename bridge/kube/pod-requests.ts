// Resource requests of every scheduled, unfinished pod in the cluster, from a watch cache, for
// GET /cluster/capacity with CAPACITY_ALL_PODS=true. Off by default: it needs pods list/watch in
// every namespace, i.e. reading every pod spec in the cluster, which the bridge otherwise never
// does (docs/capacity.md). The cache keeps only name, node and summed requests per pod.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { ResilientInformer, listPaged } from '../../common/informer.js';
import { makeApiClient } from '../../common/kube.js';
import { parseQuantity } from '../../common/quantity.js';

export interface PodRequests {
  node: string;
  /** Cores and bytes the scheduler accounts for this pod. */
  cpu: number;
  memory: number;
}

const UNFINISHED = 'status.phase!=Succeeded,status.phase!=Failed';
const LIST_TIMEOUT_MS = 60_000;

/** Pods as the capacity view sees them (a trimmed pod carries its requests in a small record). */
type TrimmedPod = k8s.V1Pod & { requests?: PodRequests };

export class PodRequestsCache {
  private readonly informer: ResilientInformer<TrimmedPod>;

  constructor(kc: k8s.KubeConfig, log: Logger) {
    const core = makeApiClient(kc, k8s.CoreV1Api, LIST_TIMEOUT_MS);
    this.informer = new ResilientInformer<TrimmedPod>({
      kc,
      path: '/api/v1/pods',
      fieldSelector: UNFINISHED,
      log,
      list: () => listPaged((page) => core.listPodForAllNamespaces({ fieldSelector: UNFINISHED, ...page }), trim),
    });
    this.informer.on('add', trim);
    this.informer.on('update', trim);
  }

  start(): Promise<void> {
    return this.informer.start();
  }

  stop(): void {
    this.informer.stop();
  }

  hasSynced(): boolean {
    return this.informer.hasSynced();
  }

  /** Scheduled pods with their requests. */
  *requests(): Iterable<PodRequests> {
    for (const pod of this.informer.list()) if (pod.requests?.node) yield pod.requests;
  }
}

function trim(pod: TrimmedPod): void {
  if (pod.spec) {
    pod.requests = { node: pod.spec.nodeName ?? '', ...podRequests(pod.spec) };
    pod.spec = undefined;
  }
  const m = pod.metadata;
  if (m) pod.metadata = { name: m.name, namespace: m.namespace, uid: m.uid, resourceVersion: m.resourceVersion } as k8s.V1ObjectMeta;
  pod.status = undefined;
}

/**
 * What the scheduler reserves for a pod: the larger of its containers (plus sidecars, i.e. init
 * containers that keep running) and its largest ordinary init container, plus the pod overhead.
 */
export function podRequests(spec: k8s.V1PodSpec): { cpu: number; memory: number } {
  const request = (c: k8s.V1Container, name: 'cpu' | 'memory') => {
    const q = c.resources?.requests?.[name] ?? c.resources?.limits?.[name];
    return q === undefined ? 0 : parseQuantity(String(q));
  };
  const result = { cpu: 0, memory: 0 };
  for (const name of ['cpu', 'memory'] as const) {
    let running = 0;
    let initPeak = 0;
    for (const c of spec.initContainers ?? []) {
      if (c.restartPolicy === 'Always') running += request(c, name);
      else initPeak = Math.max(initPeak, running + request(c, name));
    }
    for (const c of spec.containers) running += request(c, name);
    const overhead = spec.overhead?.[name];
    result[name] = Math.max(running, initPeak) + (overhead === undefined ? 0 : parseQuantity(String(overhead)));
  }
  return result;
}
