// Reconciles one SandboxPool, level-based: it reads the pool and everything it owns from the
// caches, makes the cluster match (children applied, due boxes reaped), writes status when it
// changed, and says when to look again. It never asks what event caused it to run.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { PartialObjectMetadata } from '../common/informer.js';
import { apiMessage, apiStatusCode, isConflict, isNotFound, makeApiClient } from '../common/kube.js';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS, seatName, seatNumberOf } from '../common/labels.js';
import { sleptBoxOf } from '../common/box-pod.js';
import { seatOf } from '../common/seats.js';
import { POOL_GROUP, POOL_PLURAL, POOL_VERSION, type SandboxPool, type SandboxPoolStatus } from '../common/pool.js';
import { countBoxes, type SeenBox } from './box-counter.js';
import { desiredChildren, isUpToDate, type Child } from './children.js';
import { EgressCaKeeper } from './egress-ca.js';
import type { EventRecorder } from './events.js';
import type { OperatorMetrics } from './metrics.js';
import { planReaps, type Reap } from './reaper.js';
import { sameStatus, setConditions, type ConditionInput } from './status.js';
import { WarmPods, freeSeats, planWarm, starving, type ShapeInput } from './warm-pool.js';
import { DEFAULT_SHAPE, warmShapes } from '../common/warm-shapes.js';

export const FIELD_MANAGER = 'sandbox-bridge-operator';

export interface Lister<T> {
  get(name: string, namespace?: string): T | undefined;
  list(namespace?: string): readonly T[];
}

export interface Caches {
  pools: Lister<SandboxPool>;
  pods: Lister<k8s.V1Pod>;
  /** Box Secrets as metadata only (common/informer.ts metadataOnly): no env, no credential. */
  secrets: Lister<PartialObjectMetadata>;
  namespaces: Lister<k8s.V1Namespace>;
  /** Namespaced children by kind. */
  children: Record<'ResourceQuota' | 'LimitRange' | 'NetworkPolicy', Lister<k8s.KubernetesObject>>;
  /** The egress CA's Secrets (whole: the key is what they hold) and ConfigMaps (operator/egress-ca.ts). */
  egressCa: { secrets: Lister<k8s.V1Secret>; configMaps: Lister<k8s.V1ConfigMap> };
}

export interface ReconcileResult {
  requeueAfterMs?: number;
}

export interface ReconcilerOptions {
  kc: k8s.KubeConfig;
  caches: Caches;
  log: Logger;
  metrics: OperatorMetrics;
  events: EventRecorder;
  now?: () => number;
  /** Boxes seen through watch events but possibly gone from the cache before a reconcile counted them. */
  seenBoxes: SeenBoxes;
  /** The namespaces the operator may use (namespaced RBAC); undefined: every namespace. */
  namespaces?: readonly string[];
  maxReapsPerPass?: number;
  deleteConcurrency?: number;
  orphanGraceMs?: number;
  requestTimeoutMs?: number;
  /** The boxd image and credential key warm boxes are made with (none without them), and the egress key if any (warm-pool.ts). */
  boxd?: { image: string; key: Buffer; egressKey?: Buffer };
  /** How long boxes trust a new egress CA before the gateway signs with it (default 180 s). */
  egressCaPropagationMs?: number;
}

/** Per-namespace record of box pods observed by watch events, drained once counted. */
export class SeenBoxes {
  private readonly byNamespace = new Map<string, Map<string, number>>();

  note(box: k8s.KubernetesObject): void {
    const { namespace, uid, creationTimestamp } = box.metadata ?? {};
    if (!namespace || !uid || !creationTimestamp) return;
    const map = this.byNamespace.get(namespace) ?? new Map<string, number>();
    map.set(uid, new Date(creationTimestamp).getTime());
    this.byNamespace.set(namespace, map);
  }

  list(namespace: string): SeenBox[] {
    return [...(this.byNamespace.get(namespace) ?? [])].map(([uid, createdAt]) => ({ uid, createdAt }));
  }

  /** Drops what a written count covers (created at or before the watermark second). */
  drain(namespace: string, watermark: string | undefined): void {
    const map = this.byNamespace.get(namespace);
    if (!map || !watermark) return;
    const limit = Math.floor(Date.parse(watermark) / 1000) * 1000 + 999;
    for (const [uid, at] of map) if (at <= limit) map.delete(uid);
    if (map.size === 0) this.byNamespace.delete(namespace);
  }

  forgetNamespace(namespace: string): void {
    this.byNamespace.delete(namespace);
  }
}

const NAMESPACE_RETRY_MS = 2000;
/** How long a box the scheduler found no room for waits after a warm pod yielded to it before the next one does. */
const YIELD_EVERY_MS = 3000;
/** A warm seat kept because the API server still shows its pod is looked at again after this. */
const SEAT_RECHECK_MS = 5000;

export class PoolReconciler {
  private readonly core: k8s.CoreV1Api;
  private readonly objects: k8s.KubernetesObjectApi;
  private readonly custom: k8s.CustomObjectsApi;
  private readonly now: () => number;
  /** Deletes sent and not yet seen in the cache: uid -> when sent. */
  private readonly deleting = new Map<string, number>();
  /** Boxes the scheduler found no room for, by pod uid -> when a warm pod last yielded to it. */
  private readonly yielded = new Map<string, number>();
  private readonly warmPods: WarmPods | undefined;
  private readonly egressCa: EgressCaKeeper;
  /** Pools told once that they ask for warm boxes this operator cannot make. */
  private readonly warnedNoBoxd = new Set<string>();

  constructor(private readonly o: ReconcilerOptions) {
    const timeout = o.requestTimeoutMs ?? 15_000;
    this.core = makeApiClient(o.kc, k8s.CoreV1Api, timeout);
    this.objects = makeApiClient(o.kc, k8s.KubernetesObjectApi, timeout);
    this.custom = makeApiClient(o.kc, k8s.CustomObjectsApi, timeout);
    this.now = o.now ?? Date.now;
    this.warmPods = o.boxd ? new WarmPods({ core: this.core, boxd: o.boxd }) : undefined;
    this.egressCa = new EgressCaKeeper({
      core: this.core,
      secrets: o.caches.egressCa.secrets,
      configMaps: o.caches.egressCa.configMaps,
      propagationMs: o.egressCaPropagationMs ?? 180_000,
      events: o.events,
      metrics: o.metrics,
      fieldManager: FIELD_MANAGER,
      now: this.now,
    });
  }

  async reconcile(name: string): Promise<ReconcileResult> {
    const pool = this.o.caches.pools.get(name);
    // Deleted: garbage collection removes what the pool owned (owner references).
    if (!pool) {
      this.o.events.forget(name);
      return {};
    }
    const log = this.o.log.child({ pool: name });
    const ns = pool.spec.namespace;
    const conditions: ConditionInput[] = [];
    let requeueAfterMs: number | undefined;
    const requeue = (ms: number) => {
      requeueAfterMs = requeueAfterMs === undefined ? ms : Math.min(requeueAfterMs, ms);
    };

    if (this.o.namespaces && !this.o.namespaces.includes(ns)) {
      // Without permissions there, every call would be refused: say what to change instead.
      const message =
        `namespace ${ns} is not one this operator may use (${this.o.namespaces.join(', ')}); ` +
        'add it to the chart value rbac.extraPoolNamespaces (or use rbac.namespaced=false) and upgrade the release';
      const conditions: ConditionInput[] = [
        { type: 'Ready', status: 'False', reason: 'NamespaceNotWatched', message },
        { type: 'Degraded', status: 'True', reason: 'NamespaceNotWatched', message },
      ];
      const written = await this.writeStatus(pool, conditions, 0, log, { warmReady: 0, warmDesired: 0 });
      return written === 'conflict' ? { requeueAfterMs: 100 } : {};
    }

    const rival = this.namespaceRival(pool);
    let childrenOk = false;
    let childError: string | undefined;
    if (rival) {
      const message = `namespace ${ns} is already used by SandboxPool ${rival}; pick another namespace`;
      conditions.push({ type: 'Ready', status: 'False', reason: 'NamespaceInUse', message });
      conditions.push({ type: 'Degraded', status: 'True', reason: 'NamespaceInUse', message });
    } else {
      childError = await this.applyChildren(pool, log).catch((err: unknown) => {
        if (err instanceof NamespaceUnavailable) {
          requeue(NAMESPACE_RETRY_MS);
          return err.message;
        }
        throw err;
      });
      childrenOk = childError === undefined;
    }

    // The pool CA (gateway mode; removed otherwise), once the namespace is in place.
    let caError: string | undefined;
    if (childrenOk) {
      const ca = await this.egressCa.reconcile(pool, log);
      caError = ca.error;
      if (ca.requeueAfterMs !== undefined) requeue(ca.requeueAfterMs);
    }

    // Reap, and keep warm boxes, only in a namespace this pool governs.
    let reapError: string | undefined;
    let active = 0;
    let warm: WarmStatus = { warmReady: 0, warmDesired: 0 };
    if (!rival) {
      const reaped = await this.reap(pool, log);
      reapError = reaped.error;
      active = reaped.active;
      if (reaped.requeueAfterMs !== undefined) requeue(reaped.requeueAfterMs);
      if (childrenOk) {
        const kept = await this.keepWarm(pool, active, log);
        warm = kept.status;
        if (kept.error) reapError ??= kept.error;
        if (kept.requeueAfterMs !== undefined) requeue(kept.requeueAfterMs);
      }
    }

    if (!rival) {
      if (childrenOk) {
        conditions.push({
          type: 'Ready',
          status: 'True',
          reason: 'Reconciled',
          message: 'namespace labels, resource quota, limit range and network policy are in place',
        });
      } else {
        conditions.push({ type: 'Ready', status: 'False', reason: 'ChildrenNotReady', message: childError ?? '' });
      }
      if (childError) conditions.push({ type: 'Degraded', status: 'True', reason: 'ApplyFailed', message: childError });
      else if (caError) conditions.push({ type: 'Degraded', status: 'True', reason: 'EgressCaFailed', message: caError });
      else if (reapError) conditions.push({ type: 'Degraded', status: 'True', reason: 'ReapFailed', message: reapError });
      else conditions.push({ type: 'Degraded', status: 'False', reason: 'AsExpected', message: 'no problems' });
    }

    const written = await this.writeStatus(pool, conditions, active, log, warm);
    if (written === 'conflict') requeue(100);
    if (childError && !rival) requeue(NAMESPACE_RETRY_MS);
    return requeueAfterMs === undefined ? {} : { requeueAfterMs };
  }

  /** The older pool (creation time, then name) that claims the same namespace, if any. */
  private namespaceRival(pool: SandboxPool): string | undefined {
    const key = (p: SandboxPool) => `${new Date(p.metadata.creationTimestamp ?? 0).toISOString()}/${p.metadata.name}`;
    const rival = this.o.caches.pools
      .list()
      .filter((p) => p.metadata.name !== pool.metadata.name && p.spec.namespace === pool.spec.namespace)
      .sort((a, b) => key(a).localeCompare(key(b)))[0];
    return rival && key(rival) < key(pool) ? rival.metadata.name : undefined;
  }

  /** Applies the children that differ from the cache; returns an error message or undefined. */
  private async applyChildren(pool: SandboxPool, log: Logger): Promise<string | undefined> {
    const owned = await this.namespaceOwnership(pool);
    const failures: string[] = [];
    for (const child of desiredChildren(pool, owned)) {
      const live =
        child.kind === 'Namespace'
          ? this.o.caches.namespaces.get(child.metadata.name!)
          : this.o.caches.children[child.kind as keyof Caches['children']].get(child.metadata.name!, child.metadata.namespace);
      if (isUpToDate(child, live)) continue;
      try {
        await this.apply(child);
        this.o.metrics.childApplies.inc({ kind: child.kind });
        log.info({ kind: child.kind, name: child.metadata.name, repaired: live !== undefined }, 'applied child');
      } catch (err) {
        const message = `${child.kind} ${child.metadata.namespace ? `${child.metadata.namespace}/` : ''}${child.metadata.name}: ${apiMessage(err)}`;
        log.warn({ err: message }, 'apply failed');
        failures.push(message);
        // Without the namespace nothing inside it can be applied.
        if (child.kind === 'Namespace') break;
      }
    }
    return failures.length ? failures.join('; ') : undefined;
  }

  /**
   * Whether the pool owns (and so may garbage-collect) its namespace: yes if the operator creates
   * it or already owns it; no for a namespace that existed before the pool.
   */
  private async namespaceOwnership(pool: SandboxPool): Promise<boolean> {
    const name = pool.spec.namespace;
    let ns = this.o.caches.namespaces.get(name);
    if (!ns) {
      // The cache only holds labelled namespaces; a pre-existing one needs a direct look.
      ns = await this.core.readNamespace({ name }).catch((err: unknown) => {
        if (isNotFound(err)) return undefined;
        throw err;
      });
    }
    if (!ns) return true;
    if (ns.metadata?.deletionTimestamp) throw new NamespaceUnavailable(`namespace ${name} is terminating; waiting to recreate it`);
    const refs = ns.metadata?.ownerReferences ?? [];
    if (refs.some((r) => r.uid === pool.metadata.uid)) return true;
    if (refs.some((r) => r.kind === 'SandboxPool')) {
      throw new NamespaceUnavailable(`namespace ${name} still belongs to a deleted SandboxPool; waiting for it to go`);
    }
    return false;
  }

  private async apply(child: Child): Promise<void> {
    await this.objects.patch(child, undefined, undefined, FIELD_MANAGER, true, k8s.PatchStrategy.ServerSideApply);
  }

  private async reap(pool: SandboxPool, log: Logger): Promise<{ active: number; requeueAfterMs?: number; error?: string }> {
    const ns = pool.spec.namespace;
    const now = this.now();
    const pods = this.o.caches.pods.list(ns);
    // Forget sent deletes once the cache no longer shows the object live, or after a minute.
    const present = new Set<string>();
    for (const p of pods) if (p.metadata?.uid && !p.metadata.deletionTimestamp) present.add(p.metadata.uid);
    const secrets = this.o.caches.secrets.list(ns);
    for (const s of secrets) if (s.metadata?.uid) present.add(s.metadata.uid);
    for (const [uid, at] of this.deleting) if (!present.has(uid) || now - at > 60_000) this.deleting.delete(uid);

    const plan = planReaps({
      pods,
      secrets,
      defaultTtlSeconds: pool.spec.defaultTtlSeconds,
      now,
      orphanGraceMs: this.o.orphanGraceMs ?? 30_000,
      pending: new Set(this.deleting.keys()),
    });
    const max = this.o.maxReapsPerPass ?? 1000;
    const batch = plan.reaps.slice(0, max);
    const failures: string[] = [];
    let held = 0;
    await mapLimit(batch, this.o.deleteConcurrency ?? 32, async (reap) => {
      try {
        if (await this.seatStillHeld(reap)) {
          held++;
          return;
        }
        await this.deleteOne(reap);
        this.deleting.set(reap.uid, now);
        this.o.metrics.boxesReaped.inc({ reason: reap.reason });
        const event = reapEvent(reap);
        if (event) await this.o.events.record(pool, event);
      } catch (err) {
        // Gone already, or replaced by a new object of the same name: nothing to do.
        if (isNotFound(err) || isConflict(err)) return;
        failures.push(`${reap.kind} ${reap.name}: ${apiMessage(err)}`);
      }
    });
    await this.o.events.flush(pool);
    if (batch.length) log.info({ reaped: batch.length - failures.length, remaining: plan.reaps.length - batch.length }, 'reaped boxes');
    let requeueAfterMs: number | undefined;
    if (plan.reaps.length > batch.length) requeueAfterMs = 0;
    else if (failures.length) requeueAfterMs = 1000;
    else if (held) requeueAfterMs = SEAT_RECHECK_MS; // judged again once the caches may have caught up
    else if (plan.nextDueAt !== undefined) requeueAfterMs = Math.max(0, plan.nextDueAt - this.now());
    const error = failures.length ? `could not delete ${failures.length} object(s): ${failures.slice(0, 3).join('; ')}` : undefined;
    return { active: plan.active, ...(requeueAfterMs !== undefined ? { requeueAfterMs } : {}), ...(error ? { error } : {}) };
  }

  /**
   * A warm seat the caches show without its pod is freed only once the API server itself shows no
   * pod holding it: a seat freed under a live pod lets another box take its number, one box over
   * maxBoxes. The caches may lag its pod by more than the grace (a loaded API server), and its
   * pod's create may not have answered yet.
   */
  private async seatStillHeld(reap: Reap): Promise<boolean> {
    const n = reap.kind === 'Secret' && reap.reason === 'orphaned_secret' ? seatNumberOf(reap.name) : undefined;
    if (n === undefined) return false;
    if (this.warmPods?.seatStarting(reap.namespace, reap.name)) return true;
    const holders = await this.core.listNamespacedPod({ namespace: reap.namespace, labelSelector: `${LABELS.seat}=${n}`, limit: 1 });
    return holders.items.length > 0;
  }

  private async deleteOne(reap: Reap): Promise<void> {
    // The uid precondition keeps a delete from hitting a new box that reuses the name.
    const body: k8s.V1DeleteOptions = { preconditions: { uid: reap.uid, ...(reap.resourceVersion ? { resourceVersion: reap.resourceVersion } : {}) }, propagationPolicy: 'Background' };
    if (reap.kind === 'Pod') await this.core.deleteNamespacedPod({ name: reap.name, namespace: reap.namespace, body });
    else await this.core.deleteNamespacedSecret({ name: reap.name, namespace: reap.namespace, body });
  }

  /**
   * Keeps the pool's warm boxes: as many ready as planWarm() says, replaced when their template
   * changes. Failures are reported (Degraded) and retried, never fatal to the reconcile.
   */
  private async keepWarm(pool: SandboxPool, active: number, log: Logger): Promise<{ status: WarmStatus; requeueAfterMs?: number; error?: string }> {
    const { warm } = pool.spec;
    const shapes = warmShapes(pool.spec);
    const ns = pool.spec.namespace;
    const pods = this.o.caches.pods.list(ns).filter((p) => p.metadata?.labels?.[LABELS.warm] === pool.metadata.name);
    if (!this.warmPods) {
      if (shapes.length && !this.warnedNoBoxd.has(pool.metadata.name)) {
        this.warnedNoBoxd.add(pool.metadata.name);
        log.warn('the pool asks for warm boxes, but this operator has no BOXD_IMAGE and BOXD_KEY to make them');
      }
      return { status: { warmReady: 0, warmDesired: 0 } };
    }
    const now = this.now();
    const since = now - warm.windowSeconds * 1000;
    let recordsCreated = 0;
    // Recent demand per warm shape: box pods made in the window, by the shape that served or
    // would have served them (their warm-demand annotation, written by the bridge).
    const demand = new Map<string, number>();
    // Seats held as far as the caches show (common/seats.ts): by pods, sleeping boxes and warm seats.
    const held = new Set<number>();
    let sleeping = 0;
    for (const p of this.o.caches.pods.list(ns)) {
      const seat = seatOf(p);
      if (seat !== undefined) held.add(seat);
      const served = p.metadata?.annotations?.[ANNOTATIONS.warmDemand];
      if (served && Date.parse(p.metadata?.annotations?.[ANNOTATIONS.createdAt] ?? '') >= since) demand.set(served, (demand.get(served) ?? 0) + 1);
    }
    for (const s of this.o.caches.secrets.list(ns)) {
      const component = s.metadata?.labels?.[LABELS.component];
      const warmSeat = component === SECRET_COMPONENTS.credential ? seatNumberOf(s.metadata?.name) : undefined;
      if (warmSeat !== undefined) held.add(warmSeat);
      if (component !== SECRET_COMPONENTS.record) continue;
      if (new Date(s.metadata?.creationTimestamp ?? 0).getTime() >= since) recordsCreated++;
      const state = s.metadata?.labels?.[LABELS.sleep];
      const seat = sleptBoxOf(s as k8s.V1Secret)?.seat;
      if (state && state !== 'failed') {
        sleeping++;
        if (seat !== undefined) held.add(seat);
      }
    }
    const inputs: ShapeInput[] = shapes.map((w) => ({
      id: w.id,
      template: this.warmPods!.template(pool, w.shape),
      count: w.count,
      max: w.max,
      // The single form: every create counts, as before there were shapes (any create is served
      // by the default shape, resized if need be).
      recentCreates: shapes.length === 1 && w.id === DEFAULT_SHAPE ? Math.max(recordsCreated, demand.get(w.id) ?? 0) : (demand.get(w.id) ?? 0),
      ...(w.id === DEFAULT_SHAPE ? { minAvailable: warm.minAvailable } : {}),
    }));
    // Boxes the scheduler found no room for: each gets one warm pod out of its way, then as many
    // seconds for the scheduler to try again before the next (a level-based retry, not a storm).
    const starvingBoxes = this.o.caches.pods.list(ns).filter(starving);
    for (const [uid, at] of this.yielded) if (now - at > 60_000) this.yielded.delete(uid);
    const due = starvingBoxes.filter((p) => now - (this.yielded.get(p.metadata!.uid!) ?? 0) >= YIELD_EVERY_MS);
    const cpuOf = new Map(shapes.map((w) => [w.id, w.shape.cpuCores]));
    const plan = planWarm({ pool, shapes: inputs, pods: pods.filter((p) => !this.deleting.has(p.metadata?.uid ?? '')), active, sleeping, starving: due.length, cpuOf, now });
    for (const p of due) this.yielded.set(p.metadata!.uid!, now);
    const seats = freeSeats(pool.spec.maxBoxes, held);
    const failures: string[] = [];
    const warmSeat = (pod: k8s.V1Pod) => {
      const n = seatOf(pod);
      return n === undefined ? undefined : this.o.caches.secrets.get(seatName(n), ns);
    };
    for (const { pod, reason } of plan.remove) {
      try {
        const seat = warmSeat(pod);
        await this.warmPods.remove(pod, seat?.metadata?.labels?.[LABELS.component] === SECRET_COMPONENTS.credential ? seat : undefined);
        this.deleting.set(pod.metadata!.uid!, now);
        log.info({ pod: pod.metadata?.name, reason }, 'warm box let go');
      } catch (err) {
        if (!isNotFound(err) && !isConflict(err)) failures.push(`remove ${pod.metadata?.name}: ${apiMessage(err)}`);
      }
    }
    const starts = plan.shapes.flatMap((p) => Array.from({ length: p.create }, () => ({ plan: p, warm: shapes.find((w) => w.id === p.id)! })));
    await mapLimit(starts, 4, async ({ plan: p, warm: w }) => {
      try {
        await this.warmPods!.start(pool, p.template, seats, w);
      } catch (err) {
        failures.push(`start: ${apiMessage(err)}`);
      }
    });
    if (starts.length) log.info({ started: starts.length - failures.length, desired: plan.desired, ready: plan.ready }, 'warm boxes started');
    this.o.metrics.warmReady.set({ pool: pool.metadata.name }, plan.ready);
    // Sized by recent creates: look again when the window has moved on.
    const resize = shapes.some((w) => w.max !== undefined && w.max > w.count) ? warm.windowSeconds * 1000 : undefined;
    const retry = failures.length ? 2000 : starvingBoxes.length ? YIELD_EVERY_MS : undefined;
    const requeueAfterMs = retry ?? resize;
    return {
      status: { warmReady: plan.ready, warmDesired: plan.desired },
      ...(requeueAfterMs !== undefined ? { requeueAfterMs } : {}),
      ...(failures.length ? { error: `warm boxes: ${failures.slice(0, 3).join('; ')}` } : {}),
    };
  }

  private async writeStatus(
    pool: SandboxPool,
    wanted: ConditionInput[],
    active: number,
    log: Logger,
    warm: WarmStatus,
  ): Promise<'unchanged' | 'written' | 'conflict'> {
    const ns = pool.spec.namespace;
    // One record per box ever made (a cold pod or a claimed warm one); warm pods are no boxes.
    const candidates = [...this.o.seenBoxes.list(ns)];
    for (const s of this.o.caches.secrets.list(ns)) {
      if (s.metadata?.labels?.[LABELS.component] === SECRET_COMPONENTS.record && s.metadata.uid && s.metadata.creationTimestamp) {
        candidates.push({ uid: s.metadata.uid, createdAt: new Date(s.metadata.creationTimestamp).getTime() });
      }
    }
    const count = countBoxes(pool.status, candidates);
    const status: SandboxPoolStatus = {
      observedGeneration: pool.metadata.generation,
      conditions: setConditions(pool.status?.conditions, wanted, pool.metadata.generation, new Date(this.now())),
      activeBoxes: active,
      totalBoxesCreated: count.total,
      ...(count.watermark ? { boxCountWatermark: count.watermark } : {}),
      ...warm,
    };
    if (sameStatus(pool.status, status)) {
      this.o.seenBoxes.drain(ns, count.watermark?.creationTimestamp);
      return 'unchanged';
    }
    try {
      // A replace carries the cached resourceVersion: if the cache is behind our own last write,
      // the API server refuses it, so a count is never added twice to the same watermark.
      await this.custom.replaceClusterCustomObjectStatus({
        group: POOL_GROUP,
        version: POOL_VERSION,
        plural: POOL_PLURAL,
        name: pool.metadata.name,
        body: { ...pool, status },
      });
      this.o.seenBoxes.drain(ns, count.watermark?.creationTimestamp);
      return 'written';
    } catch (err) {
      if (isConflict(err)) return 'conflict';
      if (apiStatusCode(err) === 404) return 'unchanged';
      log.warn({ err: apiMessage(err) }, 'status write failed');
      throw err;
    }
  }
}

class NamespaceUnavailable extends Error {}

type WarmStatus = Required<Pick<SandboxPoolStatus, 'warmReady' | 'warmDesired'>>;

function reapEvent(reap: Reap): { type: 'Normal'; reason: string; message: string } | undefined {
  switch (reap.reason) {
    case 'expired':
      return { type: 'Normal', reason: 'BoxExpired', message: `Deleted box ${reap.name}: expired at ${reap.expiredAt?.toISOString()}` };
    case 'succeeded':
    case 'failed':
      return { type: 'Normal', reason: 'BoxFinished', message: `Deleted box ${reap.name}: its pod ${reap.reason}` };
    case 'box_record':
      return undefined; // its box's event says it
    case 'orphaned_record':
      return { type: 'Normal', reason: 'OrphanedRecordDeleted', message: `Deleted the record of box ${reap.name}: the box has no pod` };
    case 'orphaned_secret':
      return { type: 'Normal', reason: 'OrphanedSecretDeleted', message: `Deleted Secret ${reap.name}: its pod is gone` };
  }
}

async function mapLimit<T>(items: readonly T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await fn(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}
