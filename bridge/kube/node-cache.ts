// Nodes, from a watch cache (the bridge's ClusterRole: nodes list, watch): cluster info, the node
// list and capacity read them without an API round trip. Node objects hold nothing secret, and a
// node changes rarely (kubelets report through Leases), so the watch is cheap even at 1,000 nodes.
// The cache is trimmed to what those views read.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { BridgeError } from '../../common/errors.js';
import { ResilientInformer, listPaged } from '../../common/informer.js';
import { makeApiClient } from '../../common/kube.js';

export interface NodeReader {
  list(): readonly k8s.V1Node[];
  /**
   * Resolves once the first list has filled the cache; rejects with 503 cluster_unavailable if
   * that takes longer than a few seconds (a bridge just started answers instead of failing).
   */
  synced(): Promise<void>;
}

const SYNC_WAIT_MS = 5000;

const LIST_TIMEOUT_MS = 60_000;

export class NodeCache implements NodeReader {
  private readonly informer: ResilientInformer<k8s.V1Node>;
  private started: Promise<void> | undefined;

  constructor(kc: k8s.KubeConfig, log: Logger) {
    const core = makeApiClient(kc, k8s.CoreV1Api, LIST_TIMEOUT_MS);
    this.informer = new ResilientInformer<k8s.V1Node>({
      kc,
      path: '/api/v1/nodes',
      log,
      list: () => listPaged((page) => core.listNode(page), trimNode),
    });
    this.informer.on('add', trimNode);
    this.informer.on('update', trimNode);
  }

  /** Starts the watch; the bridge does not wait for it (only the node views need it). */
  start(): Promise<void> {
    this.started ??= this.informer.start();
    return this.started;
  }

  stop(): void {
    this.informer.stop();
  }

  list(): readonly k8s.V1Node[] {
    return this.informer.list();
  }

  async synced(): Promise<void> {
    if (this.informer.hasSynced()) return;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_resolve, reject) => {
      timer = setTimeout(
        () =>
          reject(
            new BridgeError('cluster_unavailable', 'the node watch has not filled its cache yet (Kubernetes API unreachable, or RBAC without nodes list/watch?)', {
              headers: { 'Retry-After': '5' },
            }),
          ),
        SYNC_WAIT_MS,
      );
    });
    try {
      await Promise.race([this.start(), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }
}

/** Keeps labels, schedulability, taints, resources, the Ready condition and the kubelet version. */
export function trimNode(node: k8s.V1Node): void {
  const m = node.metadata;
  if (m) node.metadata = { name: m.name, uid: m.uid, resourceVersion: m.resourceVersion, labels: m.labels } as k8s.V1ObjectMeta;
  const spec = node.spec;
  if (spec) node.spec = { unschedulable: spec.unschedulable, taints: spec.taints } as k8s.V1NodeSpec;
  const status = node.status;
  if (status) {
    node.status = {
      capacity: status.capacity,
      allocatable: status.allocatable,
      conditions: status.conditions?.filter((c) => c.type === 'Ready').map((c) => ({ type: c.type, status: c.status }) as k8s.V1NodeCondition),
      nodeInfo: status.nodeInfo ? ({ kubeletVersion: status.nodeInfo.kubeletVersion } as k8s.V1NodeSystemInfo) : undefined,
    } as k8s.V1NodeStatus;
  }
}
