// Wires the bridge together (config -> Kubernetes clients -> caches -> services -> app) and
// runs it: API port, probe/metrics port, graceful shutdown. main.ts calls startBridge;
// integration tests do too, to run one or more real replicas in-process.
import type { Server } from 'node:http';
import { readFileSync } from 'node:fs';
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { ApiHealth } from '../common/api-health.js';
import { apiServerProbe, loadKubeConfig, makeApiClient } from '../common/kube.js';
import { createLogger } from '../common/logger.js';
import { DEFAULT_BOX_IMAGE, withDefaults } from '../common/pool.js';
import { createProbeServer, listen } from '../common/probe-server.js';
import { createApp } from './app.js';
import { trustProxySetting, type Config } from './config.js';
import { fileToken, staticToken } from './http/auth.js';
import { TokenBuckets } from './http/token-bucket.js';
import { BoxCache } from './kube/box-cache.js';
import { instrumentedCall } from './kube/instrument.js';
import { PodExec } from './kube/pod-exec.js';
import { WatchedPolicy, type PolicySource } from './kube/policy.js';
import { createMetrics } from './metrics.js';
import { BoxCommands } from './services/box-commands.js';
import { BoxService } from './services/boxes.js';
import { ClusterService } from './services/cluster.js';
import { EnvStore } from './services/env-store.js';

/** The package version: package.json is one level up from bridge/, two from dist/bridge/. */
function packageVersion(): string {
  for (const candidate of ['../package.json', '../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(candidate, import.meta.url), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'sandbox-bridge' && pkg.version) return pkg.version;
    } catch {
      // try the next candidate
    }
  }
  return 'unknown';
}

export const BRIDGE_VERSION = packageVersion();

export interface RunningBridge {
  url: string;
  metricsUrl: string;
  namespace: string;
  log: Logger;
  /** Stops taking requests, lets in-flight ones finish (up to the grace period), stops watches. */
  close(): Promise<void>;
}

export interface StartOptions {
  kc?: k8s.KubeConfig;
  log?: Logger;
  /** A fixed policy instead of watching the SandboxPool (tests). */
  policy?: PolicySource;
}

export async function startBridge(config: Config, options: StartOptions = {}): Promise<RunningBridge> {
  const log = options.log ?? createLogger('sandbox-bridge', config.LOG_LEVEL);
  const kc = options.kc ?? loadKubeConfig();
  const startedAt = Date.now();

  const fallback = withDefaults({
    namespace: config.SANDBOX_NAMESPACE,
    box: { ...withDefaults({ namespace: '' }).box, defaultImage: config.BOX_DEFAULT_IMAGE ?? DEFAULT_BOX_IMAGE },
  });
  const watched = options.policy ? undefined : new WatchedPolicy(kc, config.POOL_NAME, fallback, log);
  await startWithin(watched?.start(), config.STARTUP_TIMEOUT_MS, 'the SandboxPool watch');
  const policy: PolicySource = options.policy ?? watched!;
  const namespace = policy.current().namespace;

  const cache = new BoxCache(kc, namespace, log);
  const metrics = createMetrics(() => cache.activeCount(), {
    maxBoxes: () => policy.current().maxBoxes,
    healthy: () => cache.isHealthy() && policy.isHealthy(),
  });
  await startWithin(cache.start(), config.STARTUP_TIMEOUT_MS, `the box watch in namespace ${namespace}`);

  const call = instrumentedCall(metrics);
  // Writes fail fast while the API server does not answer; reads keep coming from the caches.
  const health = new ApiHealth({ probe: apiServerProbe(kc), probeTimeoutMs: config.KUBE_PROBE_TIMEOUT_MS, log });
  const core = makeApiClient(kc, k8s.CoreV1Api, config.KUBE_TIMEOUT_MS, { health });
  const env = new EnvStore(core, call, namespace);
  const boxes = new BoxService({
    core,
    call,
    cache,
    policy,
    env,
    namespace,
    namePrefix: config.BOX_NAME_PREFIX,
    onCreated: () => metrics.boxesCreated.inc(),
  });
  const commands = new BoxCommands({
    podExec: new PodExec(kc),
    boxes,
    cache,
    env,
    namespace,
    maxExecsPerBox: () => policy.current().maxExecsPerBox,
    outputLimit: config.EXEC_OUTPUT_LIMIT_BYTES,
    fileSizeLimit: config.FILE_SIZE_LIMIT_BYTES,
    startTimeoutMs: config.BOX_START_TIMEOUT_MS,
    kubeTimeoutMs: config.KUBE_TIMEOUT_MS,
    onExecDone: (outcome, seconds) => metrics.execDuration.observe({ outcome }, seconds),
    onRateLimited: () => metrics.rateLimited.inc({ reason: 'execs' }),
  });
  const cluster = new ClusterService({
    core,
    version: makeApiClient(kc, k8s.VersionApi, config.KUBE_TIMEOUT_MS, { health }),
    custom: makeApiClient(kc, k8s.CustomObjectsApi, config.KUBE_TIMEOUT_MS, { health }),
    call,
    cache,
    policy,
    boxes,
    namespace,
    bridgeVersion: BRIDGE_VERSION,
    startedAt,
  });
  const tokens = config.BRIDGE_TOKEN_FILE ? fileToken(config.BRIDGE_TOKEN_FILE, log) : staticToken(config.BRIDGE_TOKEN!);

  const app = createApp({
    log,
    tokens,
    buckets: new TokenBuckets(config.RATE_LIMIT_RPS, config.RATE_LIMIT_BURST),
    metrics,
    boxes,
    commands,
    env,
    cluster,
    version: BRIDGE_VERSION,
    fileSizeLimit: config.FILE_SIZE_LIMIT_BYTES,
    trustProxy: trustProxySetting(config.TRUST_PROXY),
  });

  let shuttingDown = false;
  const apiServer: Server = app.listen(config.PORT, config.HOST);
  await new Promise<void>((resolve, reject) => {
    apiServer.once('listening', resolve);
    apiServer.once('error', reject);
  });
  // Execs may legitimately run for minutes; the default Node timeouts would cut them.
  apiServer.requestTimeout = 0;
  apiServer.headersTimeout = 60_000;
  apiServer.keepAliveTimeout = 65_000;

  const probes = createProbeServer({
    registry: metrics.registry,
    ready: () => !shuttingDown && cache.isHealthy() && policy.isHealthy(),
  });
  const probeAddress = await listen(probes, config.METRICS_PORT, config.HOST);
  const apiAddress = apiServer.address() as { port: number };
  const host = config.HOST === '0.0.0.0' ? '127.0.0.1' : config.HOST;
  log.info({ port: apiAddress.port, metricsPort: probeAddress.port, namespace, pool: config.POOL_NAME }, 'bridge listening');

  return {
    url: `http://${host}:${apiAddress.port}`,
    metricsUrl: `http://${host}:${probeAddress.port}`,
    namespace,
    log,
    async close() {
      if (shuttingDown) return;
      shuttingDown = true;
      log.info({ inFlightExecs: commands.inFlight() }, 'shutting down: no new requests; waiting for in-flight ones');
      const closed = new Promise<void>((resolve) => apiServer.close(() => resolve()));
      apiServer.closeIdleConnections();
      const grace = new Promise<void>((resolve) => setTimeout(resolve, config.SHUTDOWN_GRACE_MS).unref());
      await Promise.race([closed, grace]);
      apiServer.closeAllConnections();
      tokens.close();
      health.stop();
      cache.stop();
      watched?.stop();
      await new Promise<void>((resolve) => probes.close(() => resolve()));
      log.info('bridge stopped');
    },
  };
}

/** Fails start-up clearly instead of hanging when the Kubernetes API cannot be reached. */
async function startWithin(started: Promise<void> | undefined, ms: number, what: string): Promise<void> {
  if (!started) return;
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`could not start ${what} within ${ms} ms: is the Kubernetes API reachable?`)), ms);
  });
  try {
    await Promise.race([started, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
