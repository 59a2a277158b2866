// Wires watches to the work queue and the queue to the reconciler. Every watched object maps to
// the name of the pool it belongs to (pool itself; pool label on children; namespace for boxes
// and Secrets) and that name is queued; the queue collapses bursts into one reconcile.
// Caches run on every replica (a standby takes over warm); workers only on the leader.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { ResilientInformer, listPaged, slimMetadata, type MetadataOnly, type PartialObjectMetadata } from '../common/informer.js';
import { makeApiClient } from '../common/kube.js';
import { BOX_SELECTOR, LABELS, SECRET_COMPONENTS } from '../common/labels.js';
import { POOL_GROUP, POOL_PLURAL, POOL_VERSION, type SandboxPool } from '../common/pool.js';
import { CHILD_SELECTOR } from './children.js';
import { EGRESS_CA_SELECTOR } from './egress-ca.js';
import { ScopedCache } from './scoped-cache.js';
import { EventRecorder } from './events.js';
import { BoxHealthMonitor } from './health-monitor.js';
import type { OperatorMetrics } from './metrics.js';
import { PoolReconciler, SeenBoxes, type Caches, type Lister, type ReconcileResult } from './pool-reconciler.js';
import { SnapshotRetentionReconciler } from './snapshot-retention.js';
import { IdleSleepReconciler } from './idle-sleep.js';
import { NodeChecks } from './node-checks.js';
import { BoxdClient } from '../common/boxd-client.js';
import type { EnvSealer } from '../common/env-seal.js';
import type { ObjectStore } from '../common/object-store.js';
import type { WebhookNotifier } from './webhooks.js';
import { WorkQueue } from './work-queue.js';

export interface ControllerOptions {
  kc: k8s.KubeConfig;
  log: Logger;
  metrics: OperatorMetrics;
  identity: string;
  workers?: number;
  /** Only pools matching this label selector are watched and reconciled. */
  poolSelector?: string;
  /** The namespaces pools may use (watched one by one); undefined: every namespace. */
  namespaces?: readonly string[];
  maxReapsPerPass?: number;
  deleteConcurrency?: number;
  orphanGraceMs?: number;
  /** Box health reports (health-monitor.ts): the Pending threshold, and webhooks if configured. */
  stuckPendingMs?: number;
  webhooks?: WebhookNotifier;
  /** The object store of snapshots: with it, a second reconciler of each pool enforces snapshot retention. */
  snapshots?: { store: ObjectStore; sweepIntervalMs: number; incompleteGraceMs: number };
  /** The boxd image and credential key warm boxes are made with (none without them), and the egress key if any (warm-pool.ts). */
  boxd?: { image: string; key: Buffer; egressKey?: Buffer };
  /**
   * Idle sleep (operator/idle-sleep.ts): with the object store, the boxd key and the snapshot
   * env sealer, a third reconciler puts idle boxes to sleep and resumes abandoned leases.
   */
  sleep?: { sealer: EnvSealer; leaseMs: number; workers: number };
  /** Box PID limits (operator/node-checks.ts): read each box node's kubelet configuration, or (off) say they are unverified. */
  nodeChecks?: { enabled: boolean; intervalMs: number };
  /** How long boxes trust a new egress CA before the gateway signs with it (operator/egress-ca.ts). */
  egressCaPropagationMs?: number;
}

interface Reconciler {
  reconcile(name: string): Promise<ReconcileResult>;
}

const LIST_TIMEOUT_MS = 120_000;

export class Controller {
  private readonly log: Logger;
  private readonly informers: Array<ResilientInformer<k8s.KubernetesObject>> = [];
  private readonly pools: ResilientInformer<SandboxPool & k8s.KubernetesObject>;
  private readonly pods: ScopedCache<k8s.V1Pod>;
  private readonly secrets: ScopedCache<PartialObjectMetadata>;
  private readonly reconciler: PoolReconciler;
  private readonly retention: SnapshotRetentionReconciler | undefined;
  private readonly sleeper: IdleSleepReconciler | undefined;
  /** Idle sleep's queue: one key per box, `<namespace>/<box id>`. */
  private sleepQueue: WorkQueue | undefined;
  private readonly health: BoxHealthMonitor;
  private readonly nodeChecks: NodeChecks;
  private readonly seenBoxes = new SeenBoxes();
  private queue: WorkQueue | undefined;
  /** Snapshot retention's own queue of pool names (one worker: it waits on the store, not the API server). */
  private retentionQueue: WorkQueue | undefined;
  private running: Array<Promise<void>> = [];
  private synced: Promise<void> | undefined;

  constructor(private readonly o: ControllerOptions) {
    this.log = o.log.child({ component: 'controller' });
    const core = makeApiClient(o.kc, k8s.CoreV1Api, LIST_TIMEOUT_MS);
    const events = new EventRecorder(core, o.log, o.identity);
    this.health = new BoxHealthMonitor({
      events,
      poolOf: (pod) => this.poolOf(pod),
      metrics: o.metrics,
      ...(o.webhooks ? { webhooks: o.webhooks } : {}),
      stuckPendingMs: o.stuckPendingMs ?? 300_000,
      log: o.log.child({ component: 'box-health' }),
    });
    const nodeProxy = makeApiClient(o.kc, k8s.CoreV1Api, 10_000);
    this.nodeChecks = new NodeChecks({
      enabled: o.nodeChecks?.enabled ?? false,
      intervalMs: o.nodeChecks?.intervalMs ?? 3_600_000,
      readConfigz: (name, signal) => abortable(nodeProxy.connectGetNodeProxyWithPath({ name, path: 'configz' }), signal),
      poolOf: (pod) => this.poolOf(pod),
      events,
      metrics: o.metrics,
      log: o.log.child({ component: 'node-checks' }),
    });
    const net = makeApiClient(o.kc, k8s.NetworkingV1Api, LIST_TIMEOUT_MS);
    const custom = makeApiClient(o.kc, k8s.CustomObjectsApi, LIST_TIMEOUT_MS);
    /** A cache of `path`: with a list function, whole objects; with MetadataOnly, their metadata. */
    const informer = <T extends k8s.KubernetesObject>(
      path: string,
      list: (() => Promise<k8s.KubernetesListObject<T>>) | MetadataOnly<T>,
      selectors: { labelSelector?: string; fieldSelector?: string } = {},
    ) => {
      const how = typeof list === 'function' ? { list } : { metadataOnly: list };
      const inf = new ResilientInformer<T>({ kc: o.kc, path, ...how, log: this.log, ...selectors });
      this.informers.push(inf as unknown as ResilientInformer<k8s.KubernetesObject>);
      return inf;
    };
    const namespaces = o.namespaces;
    /** The box-side kinds: watched in each pool namespace, or across all of them. */
    const scoped = <T extends k8s.KubernetesObject>(
      resource: string,
      labelSelector: string,
      listIn: (namespace: string) => Promise<k8s.KubernetesListObject<T>>,
      listAll: () => Promise<k8s.KubernetesListObject<T>>,
    ) =>
      new ScopedCache<T>(
        (ns) =>
          ns === undefined
            ? informer(clusterWidePath(resource), listAll, { labelSelector })
            : informer(namespacedPath(resource, ns), () => listIn(ns), { labelSelector }),
        namespaces,
      );
    /** The same, as metadata only: the informer lists its own watch path (common/informer.ts). */
    const scopedMetadata = (resource: string, labelSelector: string, m: MetadataOnly<PartialObjectMetadata>) =>
      new ScopedCache<PartialObjectMetadata>((ns) => informer(ns === undefined ? clusterWidePath(resource) : namespacedPath(resource, ns), m, { labelSelector }), namespaces);

    this.pools = informer(
      `/apis/${POOL_GROUP}/${POOL_VERSION}/${POOL_PLURAL}`,
      () =>
        custom.listClusterCustomObject({
          group: POOL_GROUP,
          version: POOL_VERSION,
          plural: POOL_PLURAL,
          ...(o.poolSelector ? { labelSelector: o.poolSelector } : {}),
        }),
      o.poolSelector ? { labelSelector: o.poolSelector } : {},
    );
    this.pods = scoped<k8s.V1Pod>(
      'pods',
      BOX_SELECTOR,
      (namespace) => listPaged((page) => core.listNamespacedPod({ namespace, labelSelector: BOX_SELECTOR, ...page }), (pod) => slim(this.observed(pod))),
      () => listPaged((page) => core.listPodForAllNamespaces({ labelSelector: BOX_SELECTOR, ...page }), (pod) => slim(this.observed(pod))),
    );
    // Box Secrets by their metadata only: a record holds a box's env (up to ~900 KiB), and every
    // reader here needs only labels, annotations, owners and timestamps (reaper, warm pool, box
    // count, snapshot retention). Whole Secrets, 500 to a page, could pass the operator's memory limit.
    const secrets = scopedMetadata('secrets', BOX_SELECTOR, { trim: slim, timeoutMs: LIST_TIMEOUT_MS });
    this.secrets = secrets;
    // With namespaced RBAC the operator may read only the pool namespaces, by name (resourceNames),
    // which the API server allows for lists and watches with a metadata.name field selector.
    const namespaceCache = new ScopedCache<k8s.V1Namespace>(
      (ns) =>
        ns === undefined
          ? informer('/api/v1/namespaces', () => core.listNamespace({ labelSelector: CHILD_SELECTOR }), { labelSelector: CHILD_SELECTOR })
          : informer('/api/v1/namespaces', () => core.listNamespace({ fieldSelector: `metadata.name=${ns}` }), {
              fieldSelector: `metadata.name=${ns}`,
            }),
      namespaces,
    );
    const quotas = scoped<k8s.V1ResourceQuota>(
      'resourcequotas',
      CHILD_SELECTOR,
      (namespace) => core.listNamespacedResourceQuota({ namespace, labelSelector: CHILD_SELECTOR }),
      () => core.listResourceQuotaForAllNamespaces({ labelSelector: CHILD_SELECTOR }),
    );
    const limits = scoped<k8s.V1LimitRange>(
      'limitranges',
      CHILD_SELECTOR,
      (namespace) => core.listNamespacedLimitRange({ namespace, labelSelector: CHILD_SELECTOR }),
      () => core.listLimitRangeForAllNamespaces({ labelSelector: CHILD_SELECTOR }),
    );
    const policies = scoped<k8s.V1NetworkPolicy>(
      '/apis/networking.k8s.io/v1/networkpolicies',
      CHILD_SELECTOR,
      (namespace) => net.listNamespacedNetworkPolicy({ namespace, labelSelector: CHILD_SELECTOR }),
      () => net.listNetworkPolicyForAllNamespaces({ labelSelector: CHILD_SELECTOR }),
    );
    // The pool CAs of gateway-mode pools (operator/egress-ca.ts): one Secret and one ConfigMap per
    // pool namespace, whole (the reconciler reads the certificates and the rotation state).
    const caSecrets = scoped<k8s.V1Secret>(
      'secrets',
      EGRESS_CA_SELECTOR,
      (namespace) => core.listNamespacedSecret({ namespace, labelSelector: EGRESS_CA_SELECTOR }),
      () => core.listSecretForAllNamespaces({ labelSelector: EGRESS_CA_SELECTOR }),
    );
    const caConfigMaps = scoped<k8s.V1ConfigMap>(
      'configmaps',
      EGRESS_CA_SELECTOR,
      (namespace) => core.listNamespacedConfigMap({ namespace, labelSelector: EGRESS_CA_SELECTOR }),
      () => core.listConfigMapForAllNamespaces({ labelSelector: EGRESS_CA_SELECTOR }),
    );

    for (const event of ['add', 'update', 'delete'] as const) {
      this.pools.on(event, (pool) => {
        this.enqueue(pool.metadata.name);
        this.retentionQueue?.add(pool.metadata.name);
      });
      this.pods.on(event, (pod) => {
        if (event === 'delete') {
          this.health.forget(pod);
          this.nodeChecks.forgetPod(pod);
        } else slim(this.observed(pod));
        this.enqueueNamespace(pod.metadata?.namespace);
        this.sleeper?.observePod(pod, event === 'delete');
        const key = this.sleeper?.keyOf(pod, 'Pod');
        if (key) this.sleepQueue?.add(key);
      });
      secrets.on(event, (s) => {
        if (event !== 'delete') slim(s);
        if (event !== 'delete' && this.queue) this.seenBoxesFor(s);
        this.enqueueNamespace(s.metadata?.namespace);
        const key = this.sleeper?.keyOf(s, 'Secret');
        if (key) this.sleepQueue?.add(key);
      });
      for (const child of [namespaceCache, quotas, limits, policies, caSecrets, caConfigMaps] as Array<ScopedCache<k8s.KubernetesObject>>) {
        child.on(event, (obj) => {
          const pool = obj.metadata?.labels?.[LABELS.pool];
          if (pool) this.enqueue(pool);
        });
      }
    }

    const caches: Caches = {
      pools: this.pools as Lister<SandboxPool>,
      pods: this.pods,
      secrets,
      namespaces: namespaceCache,
      children: { ResourceQuota: quotas, LimitRange: limits, NetworkPolicy: policies },
      egressCa: { secrets: caSecrets, configMaps: caConfigMaps },
    };
    this.reconciler = new PoolReconciler({
      kc: o.kc,
      caches,
      log: o.log.child({ component: 'reconciler' }),
      metrics: o.metrics,
      events,
      seenBoxes: this.seenBoxes,
      ...(namespaces ? { namespaces } : {}),
      ...(o.maxReapsPerPass ? { maxReapsPerPass: o.maxReapsPerPass } : {}),
      ...(o.deleteConcurrency ? { deleteConcurrency: o.deleteConcurrency } : {}),
      ...(o.orphanGraceMs !== undefined ? { orphanGraceMs: o.orphanGraceMs } : {}),
      ...(o.boxd ? { boxd: o.boxd } : {}),
      ...(o.egressCaPropagationMs !== undefined ? { egressCaPropagationMs: o.egressCaPropagationMs } : {}),
    });
    if (o.snapshots) {
      this.retention = new SnapshotRetentionReconciler({
        ...o.snapshots,
        pools: this.pools as Lister<SandboxPool>,
        secrets,
        secretsSynced: () => secrets.informers.every((i) => i.hasSynced()),
        events,
        metrics: o.metrics,
        log: o.log.child({ component: 'snapshot-retention' }),
      });
    }
    if (o.sleep && o.snapshots && o.boxd) {
      this.sleeper = new IdleSleepReconciler({
        core: makeApiClient(o.kc, k8s.CoreV1Api, 15_000),
        pods: this.pods,
        secrets,
        poolOf: (ns) => this.pools.list().find((p) => p.spec?.namespace === ns),
        boxd: new BoxdClient(),
        key: o.boxd.key,
        store: o.snapshots.store,
        sealer: o.sleep.sealer,
        identity: o.identity,
        leaseMs: o.sleep.leaseMs,
        events,
        metrics: o.metrics,
        log: o.log.child({ component: 'idle-sleep' }),
      });
    }
  }

  /** Starts every watch; resolves when all caches are filled. */
  startCaches(): Promise<void> {
    this.synced ??= Promise.all(this.informers.map((i) => i.start())).then(() => {
      this.log.info('caches synced');
    });
    return this.synced;
  }

  stopCaches(): void {
    for (const i of this.informers) i.stop();
  }

  cachesSynced(): boolean {
    return this.informers.every((i) => i.hasSynced());
  }

  /**
   * Begins reconciling (on becoming leader) once the caches are filled, so no decision is made
   * from a partial view; every known pool is then queued once.
   */
  startWorkers(): void {
    if (this.queue) return;
    const queue = new WorkQueue();
    this.queue = queue;
    const retentionQueue = this.retention ? new WorkQueue({ maxBackoffMs: 300_000 }) : undefined;
    this.retentionQueue = retentionQueue;
    const sleepQueue = this.sleeper ? new WorkQueue({ maxBackoffMs: 300_000 }) : undefined;
    this.sleepQueue = sleepQueue;
    const workers = this.o.workers ?? 2;
    void this.startCaches().then(() => {
      if (this.queue !== queue) return;
      for (const pool of this.pools.list()) {
        queue.add(pool.metadata.name);
        retentionQueue?.add(pool.metadata.name);
      }
      this.running = Array.from({ length: workers }, () => this.work(queue, this.reconciler));
      if (retentionQueue && this.retention) this.running.push(this.work(retentionQueue, this.retention));
      if (sleepQueue && this.sleeper) {
        // Every box once (level-based: each finds out when it falls due), then on events.
        for (const pod of this.pods.list()) {
          this.sleeper.observePod(pod, false);
          const key = this.sleeper.keyOf(pod, 'Pod');
          if (key) sleepQueue.add(key);
        }
        for (const pool of this.pools.list()) {
          for (const s of this.secrets.list(pool.spec?.namespace)) {
            const key = this.sleeper.keyOf(s, 'Secret');
            if (key) sleepQueue.add(key);
          }
        }
        for (let i = 0; i < (this.o.sleep?.workers ?? 2); i++) this.running.push(this.work(sleepQueue, this.sleeper));
      }
      this.health.startLeading();
      this.nodeChecks.startLeading();
      this.log.info({ workers }, 'workers started');
    });
  }

  /** Stops taking work and waits for reconciles in flight. */
  async stopWorkers(): Promise<void> {
    const queue = this.queue;
    if (!queue) return;
    this.queue = undefined;
    this.health.stopLeading();
    this.nodeChecks.stopLeading();
    queue.shutDown();
    this.retentionQueue?.shutDown();
    this.retentionQueue = undefined;
    this.sleepQueue?.shutDown();
    this.sleepQueue = undefined;
    await Promise.all(this.running);
    this.running = [];
    this.log.info('workers stopped');
  }

  private async work(queue: WorkQueue, reconciler: Reconciler): Promise<void> {
    for (;;) {
      const key = await queue.get();
      if (key === undefined) return;
      this.o.metrics.queueDepth.set(queue.len());
      const end = this.o.metrics.reconcileDuration.startTimer();
      try {
        const result = await reconciler.reconcile(key);
        queue.forget(key);
        this.o.metrics.reconcileTotal.inc({ result: 'success' });
        if (result.requeueAfterMs !== undefined) queue.addAfter(key, result.requeueAfterMs);
      } catch (err) {
        const delay = queue.addRateLimited(key);
        this.o.metrics.reconcileTotal.inc({ result: 'error' });
        this.o.metrics.reconcileErrors.inc();
        this.log.warn({ pool: key, err: err instanceof Error ? err.message : String(err), retryInMs: delay }, 'reconcile failed');
      } finally {
        end();
        queue.done(key);
      }
    }
  }

  private enqueue(name: string): void {
    this.queue?.add(name);
  }

  private enqueueNamespace(namespace: string | undefined): void {
    if (!namespace || !this.queue) return;
    for (const pool of this.pools.list()) if (pool.spec?.namespace === namespace) this.queue.add(pool.metadata.name);
  }

  private observed(pod: k8s.V1Pod): k8s.V1Pod {
    this.health.observe(pod);
    this.nodeChecks.observePod(pod);
    return pod;
  }

  /** The pool a box pod belongs to: its pool label, else the pool governing its namespace. */
  private poolOf(pod: k8s.V1Pod): SandboxPool | undefined {
    const ns = pod.metadata?.namespace;
    const labelled = this.pools.get(pod.metadata?.labels?.[LABELS.pool] ?? '');
    if (labelled?.spec?.namespace === ns) return labelled;
    return this.pools.list().find((p) => p.spec?.namespace === ns);
  }

  /** A box is counted by its record (made once per box, cold or claimed warm), seen as it arrives. */
  private seenBoxesFor(secret: PartialObjectMetadata): void {
    const ns = secret.metadata?.namespace;
    if (secret.metadata?.labels?.[LABELS.component] !== SECRET_COMPONENTS.record) return;
    if (ns && this.pools.list().some((p) => p.spec?.namespace === ns)) this.seenBoxes.note(secret);
  }
}

/** `call`, or its abort when `signal` fires first. */
function abortable<T>(call: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason as Error);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason as Error);
    signal.addEventListener('abort', onAbort, { once: true });
    call.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/** The watch path of `resource` across namespaces: `pods` (core) or `/apis/<group>/<version>/<plural>`. */
function clusterWidePath(resource: string): string {
  return resource.startsWith('/apis') ? resource : `/api/v1/${resource}`;
}

/** The watch path of `resource` in one namespace. */
function namespacedPath(resource: string, namespace: string): string {
  if (!resource.startsWith('/apis')) return `/api/v1/namespaces/${namespace}/${resource}`;
  const plural = resource.slice(resource.lastIndexOf('/') + 1);
  return `${resource.slice(0, resource.lastIndexOf('/'))}/namespaces/${namespace}/${plural}`;
}

/**
 * Keeps only what the reaper and the warm pool read from cached boxes and Secrets (metadata
 * without managed fields, the pod phase and Ready condition; no pod spec; Secrets arrive as
 * metadata only): with 10,000 boxes that is most of the operator's memory. The handler receives
 * the very object the informer caches, and this cache is private to the controller, so trimming
 * it in place is safe. Parts are replaced by small fresh objects or set to undefined, never
 * `delete`d, which would leave V8 objects in larger dictionary mode.
 */
function slim<T extends k8s.KubernetesObject & { spec?: unknown; status?: unknown; data?: unknown; stringData?: unknown }>(obj: T): T {
  if (obj.metadata) obj.metadata = slimMetadata(obj.metadata);
  if (obj.data !== undefined) obj.data = undefined;
  if (obj.stringData !== undefined) obj.stringData = undefined;
  if (obj.spec !== undefined) obj.spec = undefined;
  const status = obj.status as { phase?: string; podIP?: string; conditions?: Array<{ type: string; status: string; reason?: string }> } | undefined;
  if (status && typeof status === 'object') {
    // The Ready condition tells warm boxes that can be claimed (operator/warm-pool.ts); the pod
    // IP is where idle sleep reaches the box's boxd (operator/idle-sleep.ts); a box the scheduler
    // found no room for makes warm boxes yield to it (PodScheduled False, Unschedulable).
    const ready = status.conditions?.find((c) => c.type === 'Ready');
    const unscheduled = status.conditions?.find((c) => c.type === 'PodScheduled' && c.status === 'False');
    const conditions = [
      ...(ready ? [{ type: 'Ready', status: ready.status }] : []),
      ...(unscheduled ? [{ type: 'PodScheduled', status: 'False', reason: unscheduled.reason }] : []),
    ];
    obj.status = { phase: status.phase, ...(status.podIP ? { podIP: status.podIP } : {}), ...(conditions.length ? { conditions } : {}) } as T['status'];
  }
  return obj;
}
