// Read-only views: health, cluster info and nodes, the sandbox list, pod logs and metrics.
import { createHash } from 'node:crypto';
import type * as k8s from '@kubernetes/client-node';
import type { z } from 'zod';
import { BridgeError } from '../../common/errors.js';
import { LABELS } from '../../common/labels.js';
import { formatCpu, formatMemory, parseQuantity } from '../../common/quantity.js';
import { boxState, sandboxSummary, sleepingSummary } from '../box-view.js';
import type { BoxReader } from '../kube/box-cache.js';
import type { KubeCall } from '../kube/instrument.js';
import type { NodeReader } from '../kube/node-cache.js';
import type { PolicySource } from '../kube/policy.js';
import type { SleepingReader } from '../kube/sleeping-records.js';
import type { SandboxList, SandboxesQuery } from '../schemas.js';
import type { BoxService } from './boxes.js';
import type { CapacityService } from './capacity.js';

type SandboxSummary = ReturnType<typeof sandboxSummary>;

/** One box's line of GET /sandboxes without its age, made once per pod object. */
interface SandboxEntry {
  summary: Omit<SandboxSummary, 'age_seconds'>;
  createdMs: number;
  /** JSON.stringify(summary) without its closing brace. */
  json: string;
}

export type SandboxListBody = z.output<typeof SandboxList>;

export interface ClusterServiceDeps {
  core: k8s.CoreV1Api;
  version: k8s.VersionApi;
  custom: k8s.CustomObjectsApi;
  call: KubeCall;
  cache: BoxReader;
  /** Records of sleeping boxes: listed with status Sleeping. */
  sleeping?: SleepingReader;
  policy: PolicySource;
  boxes: BoxService;
  namespace: string;
  bridgeVersion: string;
  startedAt: number;
  nodes: NodeReader;
  capacity: CapacityService;
  now?: () => Date;
}

export class ClusterService {
  private versionInfo: k8s.VersionInfo | undefined;
  private readonly now: () => Date;
  private readonly entryCache = new WeakMap<k8s.V1Pod | k8s.V1Secret, SandboxEntry>();
  private sorted: { version: string; entries: SandboxEntry[] } | undefined;
  private serialized: { key: string; json: string } | undefined;

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

  private async listNodes(): Promise<readonly k8s.V1Node[]> {
    await this.deps.nodes.synced();
    return this.deps.nodes.list();
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
   * GET /sandboxes: the boxes matching the filter, oldest first (then by name), a page at a time
   * when a limit is given. A continue token names the last box of its page, so the next page
   * starts after it whatever was created or deleted in between. Ages are whole seconds counted
   * from the start of the current second.
   */
  listSandboxes(query: SandboxesQuery = {}): SandboxListBody {
    const page = this.page(query);
    return {
      sandboxes: page.entries.map((e) => ({ ...e.summary, age_seconds: ageSeconds(e, page.nowMs) })),
      ...page.tail,
    };
  }

  /**
   * listSandboxes as JSON: exactly JSON.stringify(listSandboxes(query)) (a test holds it to
   * that), made faster because at 10,000 boxes building and stringifying the objects dominated
   * the request (twice the time, measured in-process): each entry's JSON is made once, by
   * JSON.stringify, and only its age appended per request. The document is also reused for the
   * same query within the same second while the cache is unchanged (dashboards poll it).
   */
  sandboxesJson(query: SandboxesQuery = {}): string {
    const key = `${this.listVersion()}|${Math.floor(this.now().getTime() / 1000)}|${JSON.stringify(query)}`;
    if (this.serialized?.key === key) return this.serialized.json;
    const page = this.page(query);
    const items = page.entries.map((e) => `${e.json},"age_seconds":${ageSeconds(e, page.nowMs)}}`);
    const json = `{"sandboxes":[${items.join(',')}],${JSON.stringify(page.tail).slice(1)}`;
    this.serialized = { key, json };
    return json;
  }

  private page(query: SandboxesQuery): { entries: SandboxEntry[]; nowMs: number; tail: Omit<SandboxListBody, 'sandboxes'> } {
    const nowMs = Math.floor(this.now().getTime() / 1000) * 1000;
    const sorted = this.sortedEntries();
    const filter = filterKey(query);
    const start = query.continue ? firstAfter(sorted, decodeContinue(query.continue, filter)) : 0;
    const limit = query.limit ?? Infinity;
    const entries: SandboxEntry[] = [];
    let total = 0;
    let more = false;
    for (let i = 0; i < sorted.length; i++) {
      const e = sorted[i]!;
      if ((query.session_id !== undefined && e.summary.session_id !== query.session_id) || (query.status !== undefined && e.summary.status !== query.status)) {
        continue;
      }
      total++;
      if (i < start) continue;
      if (entries.length < limit) entries.push(e);
      else more = true;
    }
    const last = entries.at(-1)?.summary;
    const tail: Omit<SandboxListBody, 'sandboxes'> = { total, namespace: this.deps.namespace };
    if (more && last) tail.continue = encodeContinue({ c: last.created_at, n: last.name, f: filter });
    return { entries, nowMs, tail };
  }

  /**
   * Every box's entry in list order. Each pod's entry is made once (a changed pod is a new object
   * in the cache, so its WeakMap entry goes with it); the order is kept until the cache changes.
   */
  private sortedEntries(): SandboxEntry[] {
    const version = this.listVersion();
    if (this.sorted?.version === version) return this.sorted.entries;
    const entries: SandboxEntry[] = [];
    for (const pod of this.deps.cache.list()) {
      // The pod a box slept in, still terminating, is not the box: its Sleeping entry below is.
      if (pod.metadata?.deletionTimestamp && this.deps.boxes.sleepingRecord(pod.metadata.labels?.[LABELS.boxId] ?? pod.metadata.name ?? '')) continue;
      let entry = this.entryCache.get(pod);
      if (!entry) {
        const { age_seconds: _age, ...summary } = sandboxSummary(pod);
        entry = { summary, createdMs: Date.parse(summary.created_at) || 0, json: JSON.stringify(summary).slice(0, -1) };
        this.entryCache.set(pod, entry);
      }
      entries.push(entry);
    }
    for (const record of this.deps.sleeping?.list() ?? []) {
      if (!this.deps.boxes.sleepingRecord(record.metadata?.name ?? '')) continue;
      let entry = this.entryCache.get(record);
      if (!entry) {
        const { age_seconds: _age, ...summary } = sleepingSummary(record);
        entry = { summary, createdMs: Date.parse(summary.created_at) || 0, json: JSON.stringify(summary).slice(0, -1) };
        this.entryCache.set(record, entry);
      }
      entries.push(entry);
    }
    entries.sort((a, b) => compareEntry(a.summary.created_at, a.summary.name, b.summary.created_at, b.summary.name));
    this.sorted = { version, entries };
    return entries;
  }

  /** Changes whenever a box pod or a sleeping box's record does. */
  private listVersion(): string {
    return `${this.deps.cache.version()}.${this.deps.sleeping?.version() ?? 0}`;
  }

  capacity() {
    return this.deps.capacity.get();
  }

  async logs(podName: string, tailLines?: number): Promise<string> {
    // Only boxes (by pod name, or by box id), never other pods of the namespace.
    const box = this.deps.cache.pod(podName);
    if (!box || box.metadata?.labels?.[LABELS.warm]) podName = (await this.deps.boxes.get(podName)).metadata!.name!;
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

function ageSeconds(e: SandboxEntry, nowMs: number): number {
  return Math.max(0, Math.floor((nowMs - e.createdMs) / 1000));
}

/**
 * Plain comparisons: ISO timestamps and DNS names sort correctly byte-wise (localeCompare is far
 * too slow at 10,000 boxes).
 */
function compareEntry(createdA: string, nameA: string, createdB: string, nameB: string): number {
  if (createdA !== createdB) return createdA < createdB ? -1 : 1;
  return nameA < nameB ? -1 : nameA > nameB ? 1 : 0;
}

/** Where a page ended, and which filter it belongs to. */
interface ContinuePosition {
  c: string;
  n: string;
  f: string;
}

function filterKey(query: SandboxesQuery): string {
  return createHash('sha256')
    .update(`${query.session_id ?? ''}\u0000${query.status ?? ''}`)
    .digest('base64url')
    .slice(0, 12);
}

function encodeContinue(position: ContinuePosition): string {
  return Buffer.from(JSON.stringify(position)).toString('base64url');
}

function decodeContinue(token: string, filter: string): ContinuePosition {
  let position: Partial<ContinuePosition> | undefined;
  try {
    position = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as Partial<ContinuePosition>;
  } catch {
    position = undefined;
  }
  if (typeof position?.c !== 'string' || typeof position.n !== 'string' || typeof position.f !== 'string') {
    throw new BridgeError('invalid_request', 'continue: not a continue token of GET /sandboxes');
  }
  if (position.f !== filter) throw new BridgeError('invalid_request', 'continue: the token belongs to a list with another session_id or status filter');
  return position as ContinuePosition;
}

/** Index of the first entry after the position (binary search over the sorted entries). */
function firstAfter(entries: readonly SandboxEntry[], p: ContinuePosition): number {
  let lo = 0;
  let hi = entries.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    const e = entries[mid]!.summary;
    if (compareEntry(e.created_at, e.name, p.c, p.n) <= 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
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
