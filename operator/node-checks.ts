// Box PID limits (docs/security.md, "PID limits"). Kubernetes has no per-pod field for a PID
// limit: the kubelet's podPidsLimit (KubeletConfiguration) caps every pod on its node, and its
// default (-1) is no cap, so one box's fork bomb can take every PID of the node from every pod on
// it. A box cannot see the cap (with cgroup namespaces its own cgroup's pids.max reads "max"),
// so the operator reads it where it is set: the kubelet's configuration, through the API
// server's node proxy (GET /api/v1/nodes/<node>/proxy/configz). That needs `get` on
// `nodes/proxy`, which also reaches the rest of the kubelet API, so it is opt-in
// (NODE_CHECKS=true, the chart's operator.nodeChecks.enabled).
//
// Which nodes: those the pod cache shows running boxes, each read once, again when it is new
// (no box there before, or not read within the interval) and after NODE_CHECK_INTERVAL_SECONDS.
// What comes of it: the gauge sandbox_operator_node_pod_pids_limit{node} (the cap; 0 none;
// -1 unknown: the check is off, or the node's configuration could not be read), exported by the
// leader for the nodes running boxes; and for a node with no cap, a warning in the log and a
// Warning Event (NodeWithoutPidLimit) on every pool with boxes there.
import type * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { apiMessage, apiStatusCode } from '../common/kube.js';
import { LABELS } from '../common/labels.js';
import type { SandboxPool } from '../common/pool.js';
import type { EventRecorder } from './events.js';
import type { OperatorMetrics } from './metrics.js';

/** The gauge's value for a node whose limit is not known: the check is off, or the read failed. */
export const PIDS_UNKNOWN = -1;
/** The gauge's value for a node whose kubelet sets no pod PID limit. */
export const PIDS_UNLIMITED = 0;
export const NO_PID_LIMIT_REASON = 'NodeWithoutPidLimit';

/**
 * The pod PID limit a kubelet's /configz answer says it applies: a positive number, or 0 for
 * none; undefined when the answer is not a kubelet configuration. The kubelet sets pids.max on a
 * pod's cgroup only for podPidsLimit > 0 (pkg/kubelet/cm/pod_container_manager_linux.go); its
 * default is -1, and a configuration without the field (a kubelet older than the field) has none.
 */
export function podPidsLimitOf(configz: unknown): number | undefined {
  let body = configz;
  if (typeof body === 'string') {
    try {
      body = JSON.parse(body);
    } catch {
      return undefined;
    }
  }
  const config = (body as { kubeletconfig?: unknown } | null | undefined)?.kubeletconfig;
  if (!config || typeof config !== 'object' || Array.isArray(config)) return undefined;
  const limit = (config as { podPidsLimit?: unknown }).podPidsLimit;
  if (limit === undefined || limit === null) return PIDS_UNLIMITED;
  if (typeof limit !== 'number' || !Number.isInteger(limit)) return undefined;
  return limit > 0 ? limit : PIDS_UNLIMITED;
}

/** When to read a node again after `failures` failed reads in a row: 30 s doubling, at most the interval. */
export function retryDelayMs(failures: number, intervalMs: number): number {
  return Math.min(intervalMs, 30_000 * 2 ** Math.max(0, Math.min(failures - 1, 20)));
}

export interface NodeChecksOptions {
  /** Off: nothing is read; the log says once that box PID limits are unverified, the gauge says unknown. */
  enabled: boolean;
  /** The node's kubelet configuration (GET /api/v1/nodes/<node>/proxy/configz), as the API server answered it. */
  readConfigz: (node: string, signal: AbortSignal) => Promise<unknown>;
  /** The pool a box pod belongs to (by its pool label or namespace), if this operator handles it. */
  poolOf: (pod: k8s.V1Pod) => SandboxPool | undefined;
  events: Pick<EventRecorder, 'record'>;
  metrics: Pick<OperatorMetrics, 'nodePodPidsLimit'>;
  log: Logger;
  /** How often a node running boxes is read again. */
  intervalMs: number;
  /** Deadline of one read. */
  timeoutMs?: number;
  /** Nodes read at once. */
  concurrency?: number;
  now?: () => number;
}

interface Box {
  node: string;
  namespace: string;
  poolLabel: string;
}

interface NodeState {
  /** Box pods on the node now, by UID. */
  boxes: Set<string>;
  /** The limit last read (PIDS_UNLIMITED for none); undefined: never read. */
  limit?: number;
  /** When it was last read successfully, and when it is due again. */
  readAt?: number;
  dueAt: number;
  failures: number;
  reading: boolean;
  /** Pools told about this node's missing limit since it was last read. */
  warned: Set<string>;
}

export class NodeChecks {
  private readonly boxes = new Map<string, Box>();
  private readonly nodes = new Map<string, NodeState>();
  private readonly now: () => number;
  private leading = false;
  private timer: NodeJS.Timeout | undefined;
  private readonly queue: string[] = [];
  private active = 0;
  private abort = new AbortController();
  private forbiddenLogged = false;

  constructor(private readonly o: NodeChecksOptions) {
    this.now = o.now ?? Date.now;
    if (!o.enabled) {
      o.log.warn(
        'box PID limits are unverified: the operator does not read node configurations (NODE_CHECKS, the chart value operator.nodeChecks.enabled). ' +
          "Each node running boxes needs the kubelet's podPidsLimit, or one box can exhaust the node's PIDs (docs/security.md); " +
          'sandbox_operator_node_pod_pids_limit reports -1 (unknown)',
      );
    }
  }

  /** A box pod as the watch (or the initial list) delivers it, before the cache trims its spec. */
  observePod(pod: k8s.V1Pod): void {
    const m = pod.metadata;
    // Without a spec the pod has been trimmed already, i.e. was seen at list time: nothing new.
    if (!pod.spec || !m?.uid) return;
    const node = pod.spec.nodeName;
    const phase = pod.status?.phase;
    if (!node || phase === 'Succeeded' || phase === 'Failed' || m.deletionTimestamp) {
      this.forgetPod(pod);
      return;
    }
    const before = this.boxes.get(m.uid);
    if (before?.node === node) return;
    if (before) this.leave(m.uid, before);
    const box = { node, namespace: m.namespace ?? '', poolLabel: m.labels?.[LABELS.pool] ?? '' };
    this.boxes.set(m.uid, box);
    let state = this.nodes.get(node);
    if (!state) {
      state = { boxes: new Set(), dueAt: this.now(), failures: 0, reading: false, warned: new Set() };
      this.nodes.set(node, state);
    }
    state.boxes.add(m.uid);
    if (!this.leading) return;
    this.export(node, state);
    if (state.limit === PIDS_UNLIMITED) this.warnPools(node, state);
    // A node's first box: read it if it is new or was last read longer than the interval ago.
    if (state.boxes.size === 1) this.tick();
  }

  /** The pod is gone (or no longer running on a node). */
  forgetPod(pod: k8s.V1Pod): void {
    const uid = pod.metadata?.uid;
    const box = uid ? this.boxes.get(uid) : undefined;
    if (uid && box) this.leave(uid, box);
  }

  /** On becoming leader: export the gauge for every node running boxes, read those that are due. */
  startLeading(): void {
    if (this.leading) return;
    this.leading = true;
    this.abort = new AbortController();
    for (const [node, state] of this.nodes) {
      if (state.boxes.size === 0) continue;
      this.export(node, state);
      if (state.limit === PIDS_UNLIMITED) this.warnPools(node, state);
    }
    this.tick();
  }

  stopLeading(): void {
    this.leading = false;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.abort.abort();
    this.queue.length = 0;
    this.o.metrics.nodePodPidsLimit.reset();
  }

  /** The last limit read for a node (tests, debugging). */
  limitOf(node: string): number | undefined {
    return this.nodes.get(node)?.limit;
  }

  private leave(uid: string, box: Box): void {
    this.boxes.delete(uid);
    const state = this.nodes.get(box.node);
    if (!state) return;
    state.boxes.delete(uid);
    if (state.boxes.size > 0) return;
    // No box there any more: its series goes; what was read is kept for the interval.
    this.o.metrics.nodePodPidsLimit.remove({ node: box.node });
    state.warned.clear();
  }

  private export(node: string, state: NodeState): void {
    if (!this.leading) return;
    this.o.metrics.nodePodPidsLimit.set({ node }, this.o.enabled && state.limit !== undefined ? state.limit : PIDS_UNKNOWN);
  }

  /** Reads every node running boxes that is due, drops what is long unused, and waits for the next one due. */
  private tick(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    if (!this.leading || !this.o.enabled) return;
    const now = this.now();
    let next: number | undefined;
    for (const [node, state] of this.nodes) {
      if (state.boxes.size === 0) {
        if (!state.reading && (state.readAt === undefined || now - state.readAt >= this.o.intervalMs)) this.nodes.delete(node);
        continue;
      }
      if (state.reading) continue;
      if (state.dueAt <= now) this.enqueue(node);
      else if (next === undefined || state.dueAt < next) next = state.dueAt;
    }
    if (next === undefined) return;
    this.timer = setTimeout(() => this.tick(), Math.max(0, next - now) + 10);
    this.timer.unref();
  }

  private enqueue(node: string): void {
    const state = this.nodes.get(node);
    if (!state || state.reading || this.queue.includes(node)) return;
    this.queue.push(node);
    this.drain();
  }

  private drain(): void {
    while (this.leading && this.active < (this.o.concurrency ?? 4) && this.queue.length > 0) {
      const node = this.queue.shift()!;
      const state = this.nodes.get(node);
      if (!state || state.boxes.size === 0) continue;
      this.active++;
      state.reading = true;
      void this.read(node, state).finally(() => {
        state.reading = false;
        this.active--;
        this.drain();
        this.tick();
      });
    }
  }

  private async read(node: string, state: NodeState): Promise<void> {
    const signal = AbortSignal.any([this.abort.signal, AbortSignal.timeout(this.o.timeoutMs ?? 10_000)]);
    let limit: number | undefined;
    let problem: string;
    try {
      limit = podPidsLimitOf(await this.o.readConfigz(node, signal));
      problem = 'the answer is not a kubelet configuration';
    } catch (err) {
      if (!this.leading) return;
      problem = apiMessage(err);
      if (apiStatusCode(err) === 403) {
        if (!this.forbiddenLogged) {
          this.forbiddenLogged = true;
          this.o.log.error(
            { node, err: problem },
            'cannot check box PID limits: the operator may not get nodes/proxy (the chart grants it with operator.nodeChecks.enabled); every node reports -1 (unknown)',
          );
        }
        problem = 'forbidden';
      }
    }
    if (!this.leading) return;
    const now = this.now();
    if (limit === undefined) {
      state.failures++;
      state.dueAt = now + retryDelayMs(state.failures, this.o.intervalMs);
      if (state.failures === 1 && problem !== 'forbidden') {
        this.o.log.warn(
          { node, err: problem, retryInS: Math.round((state.dueAt - now) / 1000) },
          `cannot read the kubelet configuration of node ${node}: its pod PID limit is unknown${state.limit === undefined ? ' (-1)' : `; keeping the last one read (${state.limit})`}`,
        );
      }
      this.export(node, state);
      return;
    }
    const changed = state.limit !== limit;
    state.failures = 0;
    state.limit = limit;
    state.readAt = now;
    state.dueAt = now + this.o.intervalMs;
    state.warned.clear();
    this.export(node, state);
    if (limit === PIDS_UNLIMITED) {
      this.o.log.warn(
        { node, boxes: state.boxes.size },
        `node ${node} runs boxes and its kubelet sets no pod PID limit (podPidsLimit): one box can exhaust the node's PIDs for every pod on it; set podPidsLimit in the kubelet configuration (docs/security.md)`,
      );
      this.warnPools(node, state);
    } else if (changed) {
      this.o.log.info({ node, podPidsLimit: limit }, `node ${node}: pods may have at most ${limit} PIDs each`);
    }
  }

  /** A Warning Event on each pool with boxes on a node without a limit, once per read of the node. */
  private warnPools(node: string, state: NodeState): void {
    const count = new Map<string, { pool: SandboxPool; boxes: number }>();
    for (const uid of state.boxes) {
      const box = this.boxes.get(uid);
      if (!box) continue;
      const pool = this.o.poolOf({ metadata: { namespace: box.namespace, labels: { [LABELS.pool]: box.poolLabel } } });
      if (!pool) continue;
      const entry = count.get(pool.metadata.name) ?? { pool, boxes: 0 };
      entry.boxes++;
      count.set(pool.metadata.name, entry);
    }
    for (const [name, { pool, boxes }] of count) {
      if (state.warned.has(name)) continue;
      state.warned.add(name);
      void this.o.events.record(pool, {
        type: 'Warning',
        reason: NO_PID_LIMIT_REASON,
        message:
          `Node ${node} runs ${boxes} box${boxes === 1 ? '' : 'es'} of this pool and its kubelet sets no pod PID limit (podPidsLimit): ` +
          "one box can exhaust the node's PIDs for every pod on it. Set podPidsLimit in the node's kubelet configuration (docs/security.md).",
      });
    }
  }
}
