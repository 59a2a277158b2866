// Entry point: `node dist/operator/main.js`. Caches start at once on every replica; the replica
// holding the lease runs the workers. SIGTERM stops the workers, releases the lease (so the
// standby takes over at once) and exits 0.
//
// Losing the lease (renew deadline passed, or another holder seen) exits 1, deliberately, as
// controller-runtime does: exiting is the one way to be sure that no reconcile in flight, no
// queued retry and no API call of this process acts after the deadline, when a standby may
// already lead. The kubelet restarts the pod (and `npm run dev` restarts the process) as a
// fresh standby with warm-up caches; the other replica meanwhile leads. The cost is a restart
// per lost lease, which a brief API-server stall does not cause: the deadline is 7 s of failed
// renewals.
import type { Server } from 'node:http';
import { loadKubeConfig } from '../common/kube.js';
import { createLogger } from '../common/logger.js';
import { createProbeServer, listen } from '../common/probe-server.js';
import { loadOrExit } from '../common/config.js';
import { surviveUndiciInformationalErrors } from '../common/undici-guard.js';
import { loadConfig } from './config.js';
import { Controller } from './controller.js';
import { LeaderElector } from './leader-election.js';
import { createOperatorMetrics } from './metrics.js';
import { createWebhooks } from './webhooks.js';
import { objectStoreFrom } from '../common/object-store.js';
import { EnvSealer } from '../common/env-seal.js';

async function main(): Promise<void> {
  const config = loadOrExit(() => loadConfig(), 'sandbox-bridge operator: ');
  const log = createLogger('sandbox-bridge-operator', config.LOG_LEVEL);
  surviveUndiciInformationalErrors(log);
  const kc = loadKubeConfig(config.KUBECONFIG);
  const metrics = createOperatorMetrics();
  metrics.leader.set(0);

  const webhooks = createWebhooks(config, log, metrics);
  const store = objectStoreFrom(config);
  if (!store) log.info('no object store configured (OBJECT_STORE_BUCKET): snapshot retention and idle sleep are off');
  const sleeps = store && config.boxd && config.snapshotKeys.length > 0;
  if (store && !sleeps) log.info('idle sleep is off: it needs BOXD_KEY (and BOXD_IMAGE) and SNAPSHOT_ENCRYPTION_KEY besides the object store');
  if (!config.egressKey) log.warn('no EGRESS_KEY or EGRESS_KEY_FILE: warm boxes get no egress proxy credential, and the gateway refuses those of gateway-mode pools (407)');
  const controller = new Controller({
    kc,
    log,
    metrics,
    identity: config.identity,
    workers: config.WORKERS,
    poolSelector: config.POOL_SELECTOR,
    ...(config.WATCH_NAMESPACES.length ? { namespaces: config.WATCH_NAMESPACES } : {}),
    maxReapsPerPass: config.REAP_BATCH,
    deleteConcurrency: config.REAP_CONCURRENCY,
    orphanGraceMs: config.ORPHAN_SECRET_GRACE_SECONDS * 1000,
    ...(config.boxd ? { boxd: { ...config.boxd, ...(config.egressKey ? { egressKey: config.egressKey } : {}) } } : {}),
    ...(sleeps ? { sleep: { sealer: new EnvSealer(config.snapshotKeys), leaseMs: config.BOX_LEASE_SECONDS * 1000, workers: config.SLEEP_WORKERS } } : {}),
    stuckPendingMs: config.STUCK_PENDING_SECONDS * 1000,
    nodeChecks: { enabled: config.NODE_CHECKS, intervalMs: config.NODE_CHECK_INTERVAL_SECONDS * 1000 },
    egressCaPropagationMs: config.EGRESS_CA_PROPAGATION_SECONDS * 1000,
    ...(webhooks ? { webhooks } : {}),
    ...(store
      ? { snapshots: { store, sweepIntervalMs: config.SNAPSHOT_SWEEP_SECONDS * 1000, incompleteGraceMs: config.SNAPSHOT_INCOMPLETE_GRACE_SECONDS * 1000 } }
      : {}),
  });

  let shuttingDown = false;
  const elector = new LeaderElector({
    kc,
    namespace: config.LEASE_NAMESPACE,
    name: config.LEASE_NAME,
    identity: config.identity,
    log,
    leaseDurationSeconds: config.LEASE_DURATION_SECONDS,
    retryIntervalMs: config.LEASE_RENEW_SECONDS * 1000,
    renewDeadlineMs: (config.LEASE_DURATION_SECONDS - config.LEASE_RENEW_SECONDS) * 1000 - 1000,
    onStartedLeading: () => {
      metrics.leader.set(1);
      controller.startWorkers();
    },
    onStoppedLeading: (reason) => {
      metrics.leader.set(0);
      if (shuttingDown) return;
      // Another replica may already be reconciling: stop everything now (see the top of this file).
      log.error({ reason }, 'lost the leader lease; exiting so the process restarts as a standby');
      log.flush?.();
      process.exit(1);
    },
  });

  const probes: Server = createProbeServer({ registry: metrics.registry, ready: () => !shuttingDown && controller.cachesSynced() });
  const address = await listen(probes, config.METRICS_PORT, config.METRICS_HOST);
  log.info({ identity: config.identity, namespaces: config.WATCH_NAMESPACES.length ? config.WATCH_NAMESPACES : 'all', metricsPort: address.port, lease: `${config.LEASE_NAMESPACE}/${config.LEASE_NAME}` }, 'operator starting');

  const shutdown = async (signal: string) => {
    if (shuttingDown) return;
    shuttingDown = true;
    log.info({ signal }, 'shutting down');
    // Workers first, so nothing reconciles after the lease is handed over.
    await controller.stopWorkers();
    await elector.stop(true);
    webhooks?.stop();
    controller.stopCaches();
    probes.close();
    log.info('stopped');
    log.flush?.();
    process.exit(0);
  };
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
  process.on('SIGINT', () => void shutdown('SIGINT'));

  // Campaign at once; the caches fill in parallel and workers wait for them.
  const synced = controller.startCaches();
  elector.start();
  await synced;
}

main().catch((err: unknown) => {
  process.stderr.write(`sandbox-bridge operator: fatal: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exit(1);
});
