// Prometheus metrics of the bridge (served unauthenticated on METRICS_PORT).
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export interface BridgeMetrics {
  registry: Registry;
  httpDuration: Histogram<'method' | 'route' | 'status'>;
  execDuration: Histogram<'outcome'>;
  boxesActive: Gauge;
  boxesLimit: Gauge;
  healthy: Gauge;
  boxesCreated: Counter<'path'>;
  createDuration: Histogram<'path'>;
  warmMisses: Counter<'reason'>;
  warmReady: Gauge;
  rateLimited: Counter<'reason'>;
  tokenRequests: Counter<'token' | 'status'>;
  authFailures: Counter<'reason'>;
  tokens: Gauge<'token'>;
  kubeDuration: Histogram<'operation'>;
  kubeErrors: Counter<'operation' | 'code'>;
  snapshotDuration: Histogram<'operation' | 'outcome'>;
  snapshotBytes: Counter<'operation'>;
  fencesMet: Counter<'outcome'>;
  wakes: Counter<'path' | 'outcome'>;
  wakeDuration: Histogram<'path'>;
  budgetBytes: Gauge;
  budgetUsed: Gauge;
  budgetRefusals: Counter<'kind'>;
  boxdDeadlines: Counter<'deadline'>;
  boxCpuCores: Histogram<'pool'>;
  boxMemoryBytes: Histogram<'pool'>;
  boxMemoryRatio: Histogram<'pool'>;
}

/** Live state read at scrape time (the chart's PrometheusRule alerts on these). */
export interface MetricsState {
  /** The pool's global box cap (maxBoxes), which `kubectl edit sbp` can change. */
  maxBoxes?: () => number;
  /** Warm boxes ready to claim. */
  warmReady?: () => number;
  /** Whether GET /api/v1/health would say "ok" (caches synced and watching). */
  healthy?: () => boolean;
  /** Names of the bearer tokens this replica accepts now. */
  tokenNames?: () => string[];
  /** Bytes of the memory budget held by requests now. */
  budgetUsed?: () => number;
}

export function createMetrics(activeBoxes: () => number = () => 0, state: MetricsState = {}): BridgeMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'sandbox_bridge_' });
  return {
    registry,
    httpDuration: new Histogram({
      name: 'sandbox_bridge_http_request_duration_seconds',
      help: 'API request duration by route template and status code',
      labelNames: ['method', 'route', 'status'],
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120, 600],
      registers: [registry],
    }),
    execDuration: new Histogram({
      name: 'sandbox_bridge_exec_duration_seconds',
      help: 'Duration of commands run in boxes, by outcome (ok, nonzero, timeout, error)',
      labelNames: ['outcome'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 120, 600],
      registers: [registry],
    }),
    boxesActive: new Gauge({
      name: 'sandbox_bridge_boxes_active',
      help: 'Boxes in the sandbox namespace (from the watch cache)',
      registers: [registry],
      collect() {
        this.set(activeBoxes());
      },
    }),
    boxesLimit: new Gauge({
      name: 'sandbox_bridge_boxes_limit',
      help: 'Global box cap of the pool this bridge serves (SandboxPool spec.maxBoxes)',
      registers: [registry],
      collect() {
        if (state.maxBoxes) this.set(state.maxBoxes());
      },
    }),
    healthy: new Gauge({
      name: 'sandbox_bridge_healthy',
      help: '1 when the health endpoint reports status "ok" (box and pool watches synced), else 0',
      registers: [registry],
      collect() {
        this.set(state.healthy === undefined || state.healthy() ? 1 : 0);
      },
    }),
    boxesCreated: new Counter({
      name: 'sandbox_bridge_boxes_created_total',
      help: 'Boxes created by this replica, by path: warm (a warm box claimed) or cold (a new pod)',
      labelNames: ['path'],
      registers: [registry],
    }),
    createDuration: new Histogram({
      name: 'sandbox_bridge_box_create_duration_seconds',
      help: 'POST /boxes until the box is made, by path (warm: claimed and answering; cold: pod created)',
      labelNames: ['path'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5],
      registers: [registry],
    }),
    warmMisses: new Counter({
      name: 'sandbox_bridge_warm_misses_total',
      help: 'Creates a warm shape serves made as a new pod instead, by reason (none_ready, all_taken, resize_no_room, resize_infeasible, resize_deferred, resize_timeout: docs/warm-pool.md)',
      labelNames: ['reason'],
      registers: [registry],
    }),
    warmReady: new Gauge({
      name: 'sandbox_bridge_warm_ready',
      help: "Warm boxes ready to claim in the pool this bridge serves (from the watch cache)",
      registers: [registry],
      collect() {
        if (state.warmReady) this.set(state.warmReady());
      },
    }),
    rateLimited: new Counter({
      name: 'sandbox_bridge_rate_limited_total',
      help: 'Requests refused with 429, by reason (requests: over a token\'s rate, auth_failures: too many failed authentications from one source, execs, quota)',
      labelNames: ['reason'],
      registers: [registry],
    }),
    tokenRequests: new Counter({
      name: 'sandbox_bridge_token_requests_total',
      help: 'Authenticated API requests by token name and HTTP status',
      labelNames: ['token', 'status'],
      registers: [registry],
    }),
    authFailures: new Counter({
      name: 'sandbox_bridge_auth_failures_total',
      help: 'Requests without a valid bearer token, by reason (missing, invalid)',
      labelNames: ['reason'],
      registers: [registry],
    }),
    tokens: new Gauge({
      name: 'sandbox_bridge_tokens',
      help: 'Bearer tokens this replica accepts, by name (1 each): after a rotation, every replica should show the new name',
      labelNames: ['token'],
      registers: [registry],
      collect() {
        if (!state.tokenNames) return;
        this.reset();
        for (const name of state.tokenNames()) this.set({ token: name }, 1);
      },
    }),
    kubeDuration: new Histogram({
      name: 'sandbox_bridge_kube_api_duration_seconds',
      help: 'Kubernetes API call duration by operation',
      labelNames: ['operation'],
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 15],
      registers: [registry],
    }),
    kubeErrors: new Counter({
      name: 'sandbox_bridge_kube_api_errors_total',
      help: 'Failed Kubernetes API calls by operation and HTTP status (0: unreachable)',
      labelNames: ['operation', 'code'],
      registers: [registry],
    }),
    snapshotDuration: new Histogram({
      name: 'sandbox_bridge_snapshot_duration_seconds',
      help: 'Snapshots taken (operation=create) and restored into boxes (operation=restore), by outcome (ok, error)',
      labelNames: ['operation', 'outcome'],
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600],
      registers: [registry],
    }),
    snapshotBytes: new Counter({
      name: 'sandbox_bridge_snapshot_bytes_total',
      help: 'Compressed workspace bytes moved to (create) and from (restore) the object store',
      labelNames: ['operation'],
      registers: [registry],
    }),
    fencesMet: new Counter({
      name: 'sandbox_bridge_box_fences_met_total',
      help:
        'Calls that met an idle sleep\'s write fence (docs/lifecycle.md), by what followed: aborted (the sleep gave up, the box ran on), ' +
        'slept (the sleep had deleted the pod; the call woke the box), taken_over (the sleeper had stopped; this replica lifted the fence)',
      labelNames: ['outcome'],
      registers: [registry],
    }),
    wakes: new Counter({
      name: 'sandbox_bridge_box_wakes_total',
      help: 'Sleeping boxes woken by a call, by path (warm: a warm pod claimed, cold: a new pod) and outcome (ok, error, failed: its snapshot was gone)',
      labelNames: ['path', 'outcome'],
      registers: [registry],
    }),
    wakeDuration: new Histogram({
      name: 'sandbox_bridge_box_wake_duration_seconds',
      help: 'From a call finding its box asleep to the box answering with its workspace restored, by path (warm, cold)',
      labelNames: ['path'],
      buckets: [0.25, 0.5, 1, 1.5, 2.5, 5, 10, 30, 60, 120],
      registers: [registry],
    }),
    budgetBytes: new Gauge({
      name: 'sandbox_bridge_memory_budget_bytes',
      help: 'The memory budget of this replica: bytes requests may hold at once (TRANSFER_BUDGET_BYTES)',
      registers: [registry],
    }),
    budgetUsed: new Gauge({
      name: 'sandbox_bridge_memory_budget_used_bytes',
      help: 'Bytes of the memory budget held by requests now (exec answers, file reads, transfers, output streams, terminals)',
      registers: [registry],
      collect() {
        if (state.budgetUsed) this.set(state.budgetUsed());
      },
    }),
    budgetRefusals: new Counter({
      name: 'sandbox_bridge_memory_budget_refusals_total',
      help: 'Requests refused with 503 because the memory budget was spent, by kind (exec, output, terminal, file, archive, answer)',
      labelNames: ['kind'],
      registers: [registry],
    }),
    boxdDeadlines: new Counter({
      name: 'sandbox_bridge_boxd_deadlines_total',
      help: 'Calls into boxes ended by a deadline, by deadline (connect, idle: quiet and no answer to a health check, total)',
      labelNames: ['deadline'],
      registers: [registry],
    }),
    // Box use by pool, never by box (cardinality): observed when a box's metrics are read, at
    // most once per box per boxd sample (services/observe.ts; docs/api.md "Box metrics").
    boxCpuCores: new Histogram({
      name: 'sandbox_bridge_box_cpu_used_cores',
      help: 'CPU cores boxes used (over boxd\'s last 5 s), by pool; observed when a box\'s metrics are read, at most once per box per sample',
      labelNames: ['pool'],
      buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8],
      registers: [registry],
    }),
    boxMemoryBytes: new Histogram({
      name: 'sandbox_bridge_box_memory_used_bytes',
      help: 'Memory boxes used (working set), by pool; observed when a box\'s metrics are read, at most once per box per sample',
      labelNames: ['pool'],
      buckets: [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192].map((mi) => mi * 1024 * 1024),
      registers: [registry],
    }),
    boxMemoryRatio: new Histogram({
      name: 'sandbox_bridge_box_memory_used_ratio',
      help: 'Memory boxes used as a share of their limit, by pool (boxes near 1 are near an OOM kill); observed with sandbox_bridge_box_memory_used_bytes',
      labelNames: ['pool'],
      buckets: [0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1],
      registers: [registry],
    }),
  };
}
