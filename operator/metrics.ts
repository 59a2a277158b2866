// Prometheus metrics of the operator, on their own registry (served by common/probe-server).
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export function createOperatorMetrics(registry = new Registry()) {
  collectDefaultMetrics({ register: registry, prefix: 'sandbox_operator_' });
  return {
    registry,
    reconcileTotal: new Counter({
      name: 'sandbox_operator_reconcile_total',
      help: 'Reconciles of SandboxPools, by result (success, error).',
      labelNames: ['result'] as const,
      registers: [registry],
    }),
    reconcileErrors: new Counter({
      name: 'sandbox_operator_reconcile_errors_total',
      help: 'Reconciles that failed and were requeued with backoff.',
      registers: [registry],
    }),
    reconcileDuration: new Histogram({
      name: 'sandbox_operator_reconcile_duration_seconds',
      help: 'Time to reconcile one SandboxPool.',
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers: [registry],
    }),
    boxesReaped: new Counter({
      name: 'sandbox_operator_boxes_reaped_total',
      help: 'Box pods and Secrets deleted by the operator, by reason (expired, succeeded, failed, box_record, orphaned_record, orphaned_secret).',
      labelNames: ['reason'] as const,
      registers: [registry],
    }),
    snapshotsDeleted: new Counter({
      name: 'sandbox_operator_snapshots_deleted_total',
      help: 'Snapshots deleted from the object store by retention, by reason (expired; incomplete: left by a snapshot that failed mid-way).',
      labelNames: ['reason'] as const,
      registers: [registry],
    }),
    warmReady: new Gauge({
      name: 'sandbox_operator_warm_ready',
      help: 'Warm boxes ready to claim, by pool (as of the pool\'s last reconcile).',
      labelNames: ['pool'] as const,
      registers: [registry],
    }),
    boxFailures: new Counter({
      name: 'sandbox_operator_box_failures_total',
      help: 'Box failures reported (each occurrence once), by reason (oom_killed, crashed, image_pull_failed, stuck_pending, evicted) and pool.',
      labelNames: ['reason', 'pool'] as const,
      registers: [registry],
    }),
    webhookDeliveries: new Counter({
      name: 'sandbox_operator_webhook_deliveries_total',
      help: 'Box-failure webhook deliveries by result (delivered, failed: gave up after retries or refused, dropped: queue full).',
      labelNames: ['result'] as const,
      registers: [registry],
    }),
    webhookRetries: new Counter({
      name: 'sandbox_operator_webhook_retries_total',
      help: 'Webhook delivery attempts that were retried after a network error, timeout, 429 or 5xx.',
      registers: [registry],
    }),
    childApplies: new Counter({
      name: 'sandbox_operator_child_applies_total',
      help: 'Server-side applies of pool children (creations and drift repairs), by kind.',
      labelNames: ['kind'] as const,
      registers: [registry],
    }),
    leader: new Gauge({
      name: 'sandbox_operator_leader',
      help: '1 while this replica holds the leader lease, else 0.',
      registers: [registry],
    }),
    queueDepth: new Gauge({
      name: 'sandbox_operator_work_queue_depth',
      help: 'Pools waiting to be reconciled.',
      registers: [registry],
    }),
    sleeps: new Counter({
      name: 'sandbox_operator_sleeps_total',
      help: 'Idle sleeps tried, by outcome: slept; active or busy (a call or a young background process kept the box awake); too_large (over the pool snapshot limits); error.',
      labelNames: ['outcome'] as const,
      registers: [registry],
    }),
    sleepDuration: new Histogram({
      name: 'sandbox_operator_sleep_duration_seconds',
      help: 'From taking a box lease to its pod deleted, for sleeps that happened.',
      buckets: [0.25, 0.5, 1, 2, 5, 10, 30, 60, 180, 600],
      registers: [registry],
    }),
    leasesResumed: new Counter({
      name: 'sandbox_operator_box_leases_resumed_total',
      help: 'Box leases taken over after their holder stopped renewing them, by the state they were in and what became of the box.',
      labelNames: ['state', 'outcome'] as const,
      registers: [registry],
    }),
    nodePodPidsLimit: new Gauge({
      name: 'sandbox_operator_node_pod_pids_limit',
      help: 'Per node running boxes: the most PIDs a pod may have there (the kubelet\'s podPidsLimit); 0: no limit; -1: unknown (NODE_CHECKS off, or the node\'s kubelet configuration could not be read). Exported by the leader.',
      labelNames: ['node'] as const,
      registers: [registry],
    }),
    boxesFailed: new Counter({
      name: 'sandbox_operator_boxes_failed_total',
      help: 'Boxes that became Failed (lost their workspace), by reason.',
      labelNames: ['reason'] as const,
      registers: [registry],
    }),
  };
}

export type OperatorMetrics = ReturnType<typeof createOperatorMetrics>;
