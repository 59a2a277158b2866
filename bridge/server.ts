// Wires the bridge together (config -> Kubernetes clients -> caches -> services -> app) and
// runs it: API port, probe/metrics port, graceful shutdown. main.ts calls startBridge;
// integration tests do too, to run one or more real replicas in-process.
import type { IncomingMessage, Server } from 'node:http';
import type { Duplex } from 'node:stream';
import { readFileSync } from 'node:fs';
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { ApiHealth } from '../common/api-health.js';
import { apiServerProbe, loadKubeConfig, makeApiClient } from '../common/kube.js';
import { createLogger } from '../common/logger.js';
import { DEFAULT_BOX_IMAGE, withDefaults } from '../common/pool.js';
import { createProbeServer, listen } from '../common/probe-server.js';
import { createApp } from './app.js';
import { BoxdClient } from '../common/boxd-client.js';
import { boxdKey, egressKey, previewKey, snapshotKeys, trustProxySetting, type Config } from './config.js';
import { KeyedLimiter } from '../common/rate-limit.js';
import { admitUpgrade } from './http/auth.js';
import { portUpgrades } from './http/ports.js';
import { terminalUpgrades } from './http/terminals.js';
import { createTokenSource } from './http/tokens.js';
import { BoxCache } from './kube/box-cache.js';
import { BoxRecords } from '../common/box-records.js';
import { BoxSeats } from './kube/box-seats.js';
import { instrumentedCall } from './kube/instrument.js';
import { NodeCache } from './kube/node-cache.js';
import { PodRequestsCache } from './kube/pod-requests.js';
import { SleepingRecords } from './kube/sleeping-records.js';
import { WatchedPolicy, type PolicySource } from './kube/policy.js';
import { createMetrics } from './metrics.js';
import { BoxConnector } from './services/box-connector.js';
import { BoxService } from './services/boxes.js';
import { ByteBudget } from './services/byte-budget.js';
import { CapacityService } from './services/capacity.js';
import { ClusterService } from './services/cluster.js';
import { EnvService } from './services/env.js';
import { ExecService } from './services/exec.js';
import { FileService } from './services/files.js';
import { ProcessService } from './services/processes.js';
import { EnvSealer } from '../common/env-seal.js';
import { SnapshotService } from './services/snapshots.js';
import { SnapshotStore } from './services/snapshot-store.js';
import { BoxLeases } from '../common/box-lease.js';
import { objectStoreFrom } from '../common/object-store.js';
import { TerminalService } from './services/terminal.js';
import { BoxContextService } from './services/box-context.js';
import { EgressService } from './services/egress.js';
import { SessionOutputsService } from './services/session-outputs.js';
import { MemoryMountService } from './services/mounts.js';
import { PortService } from './services/ports.js';
import { ObserveService } from './services/observe.js';
import { PreviewSigner, PreviewUrls } from './services/preview-links.js';
import { mountsClient } from '../common/memory-store.js';

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
  // First, so a bad token configuration stops the start-up before any watch is opened.
  const tokens = createTokenSource({
    token: config.BRIDGE_TOKEN,
    tokenFile: config.BRIDGE_TOKEN_FILE,
    tokensFile: config.BRIDGE_TOKENS_FILE,
    log,
  });
  log.info({ tokenNames: tokens.names() }, 'bearer tokens loaded');

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
    tokenNames: () => tokens.names(),
    warmReady: () => cache.warmReadyCount(policy.poolName),
    budgetUsed: () => budget.inUse(),
  });
  // One budget for every byte a request holds (services/byte-budget.ts).
  const budget = new ByteBudget(config.TRANSFER_BUDGET_BYTES, { onRefused: (kind) => metrics.budgetRefusals.inc({ kind }) });
  metrics.budgetBytes.set(budget.total);
  await startWithin(cache.start(), config.STARTUP_TIMEOUT_MS, `the box watch in namespace ${namespace}`);

  // Not awaited: only the node views and capacity need them, and they answer 503 until synced.
  const nodes = new NodeCache(kc, log);
  void nodes.start();
  const allPods = config.CAPACITY_ALL_PODS ? new PodRequestsCache(kc, log) : undefined;
  void allPods?.start();

  const call = instrumentedCall(metrics);
  // Writes fail fast while the API server does not answer; reads keep coming from the caches.
  const health = new ApiHealth({
    probe: apiServerProbe(kc),
    probeTimeoutMs: config.KUBE_PROBE_TIMEOUT_MS,
    log,
    // The watches the data path reads may have frozen with the API server: reopen them at once.
    onChange: (up) => {
      if (!up) return;
      cache.resync();
      sleeping.resync();
    },
  });
  const core = makeApiClient(kc, k8s.CoreV1Api, config.KUBE_TIMEOUT_MS, { health });
  const key = boxdKey(config);
  const proxyKey = egressKey(config);
  if (!proxyKey) log.warn('no EGRESS_KEY or EGRESS_KEY_FILE: boxes get no egress proxy credential, and the gateway refuses those of gateway-mode pools (407)');
  const records = new BoxRecords(core, call, namespace);
  const sleeping = new SleepingRecords(kc, namespace, log);
  await startWithin(sleeping.start(), config.STARTUP_TIMEOUT_MS, `the sleeping box watch in namespace ${namespace}`);
  const seats = new BoxSeats(core, call, namespace);
  const boxd = new BoxdClient({
    deadlines: {
      connectMs: config.BOXD_CONNECT_TIMEOUT_MS,
      idleMs: config.BOXD_IDLE_TIMEOUT_MS,
      callMs: config.BOXD_CALL_TIMEOUT_MS,
      transferMs: config.BOXD_TRANSFER_TIMEOUT_MS,
    },
    answerLimitBytes: config.BOXD_ANSWER_LIMIT_BYTES,
    memory: { take: (n) => budget.reserve(n, 'answer', 'an answer from a box').release },
    onDeadline: (deadline) => metrics.boxdDeadlines.inc({ deadline }),
  });
  const boxes = new BoxService({
    core,
    call,
    cache,
    policy,
    records,
    sleeping,
    seats,
    boxd,
    boxdKey: key,
    egressKey: proxyKey,
    boxdImage: config.BOXD_IMAGE,
    namespace,
    namePrefix: config.BOX_NAME_PREFIX,
    nodes,
    onCreated: (path, seconds) => {
      metrics.boxesCreated.inc({ path });
      metrics.createDuration.observe({ path }, seconds);
    },
    onWarmMiss: (reason) => metrics.warmMisses.inc({ reason }),
  });
  const store = objectStoreFrom(config);
  const sealKeys = snapshotKeys(config);
  const snapshotStore = new SnapshotStore({
    boxd,
    policy,
    store,
    sealer: sealKeys.length ? new EnvSealer(sealKeys) : undefined,
    budget,
    onRestored: (outcome, seconds, bytes) => {
      metrics.snapshotDuration.observe({ operation: 'restore', outcome }, seconds);
      metrics.snapshotBytes.inc({ operation: 'restore' }, bytes);
    },
  });
  const connector = new BoxConnector({
    boxes,
    cache,
    records,
    leases: new BoxLeases({ records, identity: BoxConnector.identity, durationMs: config.BOX_LEASE_SECONDS * 1000 }),
    boxd,
    snapshots: snapshotStore,
    policy,
    core,
    call,
    key,
    namespace,
    startTimeoutMs: config.BOX_START_TIMEOUT_MS,
    podIpAnnotation: config.POD_IP_ANNOTATION || undefined,
    log,
    onWoken: (path, outcome, seconds) => {
      metrics.wakes.inc({ path, outcome });
      if (outcome === 'ok') metrics.wakeDuration.observe({ path }, seconds);
    },
    onFenced: (outcome) => metrics.fencesMet.inc({ outcome }),
    restoreMounts: async (woken, record): Promise<void> => {
      await sessionOutputs.restoreMounts(woken, record);
      await memoryMounts.restoreMounts(woken, record);
    },
  });
  const exec = new ExecService({
    connector,
    boxd,
    budget,
    maxExecsPerBox: () => policy.current().maxExecsPerBox,
    outputLimit: config.EXEC_OUTPUT_LIMIT_BYTES,
    onExecDone: (outcome, seconds) => metrics.execDuration.observe({ outcome }, seconds),
    onRateLimited: () => metrics.rateLimited.inc({ reason: 'execs' }),
  });
  const files = new FileService({
    connector,
    boxd,
    budget,
    fileSizeLimit: config.FILE_SIZE_LIMIT_BYTES,
    archiveSizeLimit: config.ARCHIVE_SIZE_LIMIT_BYTES,
    archiveMaxEntries: config.ARCHIVE_MAX_ENTRIES,
  });
  const processes = new ProcessService({ connector, boxd, budget, maxProcessesPerBox: config.MAX_PROCESSES_PER_BOX });
  const observe = new ObserveService({
    connector,
    boxd,
    budget,
    maxWatchesPerBox: config.FILE_WATCHES_PER_BOX,
    onSample: (pool, sample) => {
      metrics.boxCpuCores.observe({ pool }, sample.cpu.used_cores);
      metrics.boxMemoryBytes.observe({ pool }, sample.memory.used_bytes);
      if (sample.memory.limit_bytes) metrics.boxMemoryRatio.observe({ pool }, sample.memory.used_bytes / sample.memory.limit_bytes);
    },
  });
  const env = new EnvService({ connector, boxd, records });
  const snapshots = new SnapshotService({
    connector,
    boxd,
    snapshots: snapshotStore,
    boxes,
    env,
    records,
    policy,
    budget,
    onDone: (operation, outcome, seconds, bytes) => {
      metrics.snapshotDuration.observe({ operation, outcome }, seconds);
      metrics.snapshotBytes.inc({ operation }, bytes);
    },
  });
  const boxContext = new BoxContextService({ connector, boxes, records });
  const egress = new EgressService({ core, call, namespace, policy, boxes, records });
  const sessionOutputs: SessionOutputsService = new SessionOutputsService({ connector, boxes, records, boxd, store, policy, budget, log });
  const memoryMounts: MemoryMountService = new MemoryMountService({ connector, boxes, records, store, policy, client: mountsClient, log });
  if (!store) log.info('no object store configured (OBJECT_STORE_BUCKET): snapshot routes answer 501');
  const signingKey = previewKey(config);
  const ports = new PortService({
    connector,
    boxd,
    budget,
    boxes,
    records,
    limits: {
      maxConnectionsPerBox: config.PORT_MAX_CONNECTIONS_PER_BOX,
      bytesPerSecondPerBox: config.PORT_BYTES_PER_SECOND_PER_BOX,
      firstByteMs: config.PORT_FIRST_BYTE_TIMEOUT_MS,
      idleMs: config.PORT_IDLE_TIMEOUT_MS,
    },
    previews:
      config.PREVIEW_URL && signingKey
        ? {
            signer: new PreviewSigner(signingKey),
            urls: new PreviewUrls(config.PREVIEW_URL),
            defaultTtlSeconds: config.PREVIEW_TTL_SECONDS,
            maxTtlSeconds: config.PREVIEW_MAX_TTL_SECONDS,
          }
        : undefined,
  });
  const cluster = new ClusterService({
    core,
    version: makeApiClient(kc, k8s.VersionApi, config.KUBE_TIMEOUT_MS, { health }),
    custom: makeApiClient(kc, k8s.CustomObjectsApi, config.KUBE_TIMEOUT_MS, { health }),
    call,
    cache,
    sleeping,
    policy,
    boxes,
    namespace,
    bridgeVersion: BRIDGE_VERSION,
    startedAt,
    nodes,
    capacity: new CapacityService({ nodes, boxes: cache, policy, ...(allPods ? { allPods } : {}) }),
  });

  const limits = {
    requests: KeyedLimiter.fromRate(config.RATE_LIMIT_RPS, config.RATE_LIMIT_BURST),
    authFailures: new KeyedLimiter(config.RATE_LIMIT_AUTH_FAILURES_PER_MINUTE, 60),
  };
  const app = createApp({
    log,
    tokens,
    limits,
    metrics,
    boxes,
    env,
    exec,
    processes,
    files,
    snapshots,
    boxContext,
    egress,
    sessionOutputs,
    memoryMounts,
    ports,
    observe,
    cluster,
    version: BRIDGE_VERSION,
    trustProxy: trustProxySetting(config.TRUST_PROXY),
  });

  let shuttingDown = false;
  const apiServer: Server = app.listen(config.PORT, config.HOST);
  const terminals = terminalUpgrades({
    terminals: new TerminalService({ connector, boxd, budget }),
    log,
    admit: (req, presented) =>
      admitUpgrade(
        {
          tokens,
          failures: limits.authFailures,
          requests: limits.requests,
          scope: 'boxes:write',
          onFailure: (reason) => metrics.authFailures.inc({ reason }),
          onLimited: () => metrics.rateLimited.inc({ reason: 'auth_failures' }),
        },
        { ip: req.socket.remoteAddress },
        presented,
      ).then(() => undefined),
  });
  const portTraffic = portUpgrades({
    ports,
    log,
    trustProxy: trustProxySetting(config.TRUST_PROXY),
    failures: limits.authFailures,
    admit: (req) =>
      admitUpgrade(
        {
          tokens,
          failures: limits.authFailures,
          requests: limits.requests,
          scope: 'boxes:write',
          what: 'traffic to a port',
          onFailure: (reason) => metrics.authFailures.inc({ reason }),
          onLimited: () => metrics.rateLimited.inc({ reason: 'auth_failures' }),
        },
        { ip: req.socket.remoteAddress },
        /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '')?.[1],
      ).then(() => undefined),
  });
  // Upgrades bypass Express: a port's (the API route or a preview link), else a terminal.
  apiServer.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) =>
    portTraffic.handles(req) ? portTraffic.onUpgrade(req, socket, head) : terminals.onUpgrade(req, socket, head),
  );
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
      log.info('shutting down: no new requests; waiting for in-flight ones');
      const closed = new Promise<void>((resolve) => apiServer.close(() => resolve()));
      apiServer.closeIdleConnections();
      const grace = new Promise<void>((resolve) => setTimeout(resolve, config.SHUTDOWN_GRACE_MS).unref());
      await Promise.race([closed, grace]);
      apiServer.closeAllConnections();
      terminals.close();
      portTraffic.close();
      sleeping.stop();
      boxd.close();
      store?.close();
      tokens.close();
      health.stop();
      cache.stop();
      nodes.stop();
      allPods?.stop();
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
