// Read-only views: health, cluster info and nodes, the sandbox list, pod logs and metrics.
import type * as k8s from '@kubernetes/client-node';
import { BridgeError } from '../../common/errors.js';
import { formatCpu, formatMemory, parseQuantity } from '../../common/quantity.js';
import { boxState, sandboxSummary } from '../box-pod.js';
import type { BoxReader } from '../kube/box-cache.js';
import type { KubeCall } from '../kube/instrument.js';
import type { PolicySource } from '../kube/policy.js';
import type { BoxService } from './boxes.js';

/** One pod's line of GET /sandboxes, serialized without its closing brace and age. */
interface SandboxEntry {
  created: string;
  name: string;
  json: string;
  createdMs: number;
}

export interface ClusterServiceDeps {
  core: k8s.CoreV1Api;
  version: k8s.VersionApi;
  custom: k8s.CustomObjectsApi;
  call: KubeCall;
  cache: BoxReader;
  policy: PolicySource;
  boxes: BoxService;
  namespace: string;
  bridgeVersion: string;
  startedAt: number;
  /** Nodes are listed at most this often (RBAC grants list/get on nodes, not watch). */
  nodeCacheMs?: number;
  now?: () => Date;
}

export class ClusterService {
  private versionInfo: k8s.VersionInfo | undefined;
  private nodes: { at: number; items: Promise<k8s.V1Node[]> } | undefined;
  private readonly now: () => Date;
  private readonly entryCache = new WeakMap<k8s.V1Pod, SandboxEntry>();
  private listed: { version: number; second: number; entries: SandboxEntry[]; json: string } | undefined;

  constructor(private readonly deps: ClusterServiceDeps) {
    this.now = deps.now ?? (() => new Date());
  }

  private async kubernetesVersion(): Promise<k8s.VersionInfo> {
    this.versionInfo ??= await this.deps.call('get version', () => this.deps.version.getCode());
    return this.versionInfo;
  }

  async health() {
    const { cache, policy } = this.deps;
    const version = await this.kubernetesVersion().catch(() => undefined);
    const healthy = cache.isHealthy() && policy.isHealthy() && version !== undefined;
    return {
      status: healthy ? ('ok' as const) : ('degraded' as const),
      version: this.deps.bridgeVersion,
      kubernetes: version?.gitVersion ?? 'unknown',
      namespace: this.deps.namespace,
      uptime_seconds: Math.floor((Date.now() - this.deps.startedAt) / 1000),
      active_boxes: cache.activeCount(),
      // Counted by the operator in the SandboxPool status, so no bridge restart resets it.
      total_boxes_created: policy.pool()?.status?.totalBoxesCreated ?? 0,
    };
  }

  private listNodes(): Promise<k8s.V1Node[]> {
    const maxAge = this.deps.nodeCacheMs ?? 5000;
    if (!this.nodes || Date.now() - this.nodes.at > maxAge) {
      const items = this.deps.call('list nodes', () => this.deps.core.listNode()).then((list) => list.items);
      this.nodes = { at: Date.now(), items };
      items.catch(() => (this.nodes = undefined)); // do not cache a failure
    }
    return this.nodes.items;
  }

  async clusterInfo() {
    const [version, nodes] = await Promise.all([this.kubernetesVersion(), this.listNodes()]);
    const sum = (pick: (n: k8s.V1Node) => Record<string, string> | undefined) => {
      let cpu = 0;
      let memory = 0;
      let pods = 0;
      for (const node of nodes) {
        const r = pick(node) ?? {};
        cpu += r.cpu ? parseQuantity(r.cpu) : 0;
        memory += r.memory ? parseQuantity(r.memory) : 0;
        pods += r.pods ? parseQuantity(r.pods) : 0;
      }
      return { cpu: formatCpu(cpu), memory: formatMemory(memory), pods: String(pods) };
    };
    return {
      version: version.gitVersion,
      platform: version.platform,
      nodes: nodes.length,
      capacity: sum((n) => n.status?.capacity),
      allocatable: sum((n) => n.status?.allocatable),
    };
  }

  async nodeList() {
    const nodes = await this.listNodes();
    // Running pods per node, counted from the box cache (the bridge watches only its namespace).
    const running = new Map<string, number>();
    for (const pod of this.deps.cache.list()) {
      if (pod.spec?.nodeName && boxState(pod) === 'Running') running.set(pod.spec.nodeName, (running.get(pod.spec.nodeName) ?? 0) + 1);
    }
    return {
      nodes: nodes.map((node) => {
        const ready = node.status?.conditions?.find((c) => c.type === 'Ready');
        const roles = Object.keys(node.metadata?.labels ?? {})
          .filter((l) => l.startsWith('node-role.kubernetes.io/'))
          .map((l) => l.slice('node-role.kubernetes.io/'.length));
        const cap = node.status?.capacity ?? {};
        const alloc = node.status?.allocatable ?? {};
        return {
          name: node.metadata?.name ?? '',
          status: ready?.status === 'True' ? 'Ready' : 'NotReady',
          roles,
          version: node.status?.nodeInfo?.kubeletVersion ?? '',
          cpu: { capacity: cap.cpu ?? '0', allocatable: alloc.cpu ?? '0' },
          memory: { capacity: cap.memory ?? '0', allocatable: alloc.memory ?? '0' },
          pods: { capacity: cap.pods ?? '0', allocatable: alloc.pods ?? '0', running: running.get(node.metadata?.name ?? '') ?? 0 },
        };
      }),
    };
  }

  /**
   * GET /sandboxes, serialized. At 10,000 boxes building, sorting and stringifying the list
   * dominated the request, so: each pod's entry is serialized once (a changed pod is a new
   * object in the cache, so its WeakMap entry goes with it); the sorted order is kept until the
   * cache changes; and the finished document is reused within the same second while the cache
   * is unchanged. Ages are whole seconds counted from the start of the current second.
   */
  sandboxesJson(): string {
    const second = Math.floor(this.now().getTime() / 1000);
    const version = this.deps.cache.version();
    const listed = this.listed;
    if (listed?.version === version && listed.second === second) return listed.json;

    let entries: SandboxEntry[];
    if (listed?.version === version) {
      entries = listed.entries;
    } else {
      entries = [];
      for (const pod of this.deps.cache.list()) {
        let entry = this.entryCache.get(pod);
        if (!entry) {
          const { age_seconds: _age, ...summary } = sandboxSummary(pod, new Date(second * 1000));
          entry = { created: summary.created_at, name: summary.name, json: JSON.stringify(summary).slice(0, -1), createdMs: Date.parse(summary.created_at) || second * 1000 };
          this.entryCache.set(pod, entry);
        }
        entries.push(entry);
      }
      // Plain comparisons: ISO timestamps and DNS names sort correctly byte-wise (localeCompare
      // is far too slow here).
      entries.sort((a, b) => (a.created < b.created ? -1 : a.created > b.created ? 1 : a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    }
    const nowMs = second * 1000;
    const items = entries.map((e) => `${e.json},"age_seconds":${Math.max(0, Math.floor((nowMs - e.createdMs) / 1000))}}`);
    const json = `{"sandboxes":[${items.join(',')}],"total":${items.length},"namespace":${JSON.stringify(this.deps.namespace)}}`;
    this.listed = { version, second, entries, json };
    return json;
  }

  async logs(podName: string, tailLines?: number): Promise<string> {
    await this.deps.boxes.get(podName); // only boxes, never other pods of the namespace
    return this.deps.call('read box logs', () =>
      this.deps.core.readNamespacedPodLog({
        name: podName,
        namespace: this.deps.namespace,
        ...(tailLines !== undefined ? { tailLines } : {}),
      }),
    );
  }

  async metrics() {
    let list: { items?: PodMetrics[] };
    try {
      list = (await this.deps.call('list pod metrics', () =>
        this.deps.custom.listNamespacedCustomObject({
          group: 'metrics.k8s.io',
          version: 'v1beta1',
          namespace: this.deps.namespace,
          plural: 'pods',
        }),
      )) as { items?: PodMetrics[] };
    } catch (err) {
      if (err instanceof BridgeError && (err.type === 'not_found' || err.type === 'cluster_unavailable')) {
        throw new BridgeError(
          'internal_error',
          'pod metrics are unavailable: the metrics.k8s.io API is not served in this cluster (install metrics-server)',
          { cause: err },
        );
      }
      throw err;
    }
    const boxes = new Set(this.deps.cache.list().map((p) => p.metadata?.name));
    return {
      metrics: (list.items ?? [])
        .filter((m) => boxes.has(m.metadata.name))
        .map((m) => {
          let cpu = 0;
          let memory = 0;
          for (const c of m.containers ?? []) {
            cpu += parseQuantity(c.usage.cpu ?? '0');
            memory += parseQuantity(c.usage.memory ?? '0');
          }
          return {
            pod_name: m.metadata.name,
            namespace: m.metadata.namespace,
            cpu: formatCpu(cpu),
            memory: formatMemory(memory),
            timestamp: m.timestamp,
            window_seconds: parseDurationSeconds(m.window),
          };
        }),
    };
  }
}

interface PodMetrics {
  metadata: { name: string; namespace: string };
  timestamp: string;
  window: string;
  containers?: Array<{ name: string; usage: { cpu?: string; memory?: string } }>;
}

/** "30s", "1m0s", "15.5s" -> seconds. */
export function parseDurationSeconds(duration: string): number {
  let total = 0;
  for (const [, value, unit] of duration.matchAll(/(\d+(?:\.\d+)?)(h|ms|m|s)/g)) {
    const n = Number(value);
    total += unit === 'h' ? n * 3600 : unit === 'm' ? n * 60 : unit === 'ms' ? n / 1000 : n;
  }
  return total;
}
