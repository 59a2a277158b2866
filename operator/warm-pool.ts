// Warm boxes of a pool: pods of the pool's default shape, started ahead so that a create of
// that shape claims one (bridge/services/boxes.ts) instead of waiting for a new pod. planWarm()
// is the pure decision (how many to keep, which to start, which to let go); WarmPods carries it
// out. Part of the pool's reconcile: it runs whenever a box pod or the pool changes.
import type * as k8s from '@kubernetes/client-node';
import { boxdToken, newNonce } from '../common/boxd.js';
import { BOXD_INSTALL_CONTAINER, buildBoxPod, buildBoxSecret, warmShape, warmTemplateHash, type BoxShape } from '../common/box-pod.js';
import { formatCpu, formatMemory } from '../common/quantity.js';
import { DEFAULT_SHAPE, type WarmShape } from '../common/warm-shapes.js';
import { isWarmSeatOf } from '../common/seats.js';
import { egressProxyCredential } from '../common/egress-proxy.js';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS, seatName } from '../common/labels.js';
import type { SandboxPool } from '../common/pool.js';
import { apiStatusCode } from '../common/kube.js';
import { ownerReference } from './children.js';

/** One of the pool's warm shapes, as a pass plans it. */
export interface ShapeInput {
  /** Its id (common/warm-shapes.ts): "default", or "shape-<i>". */
  id: string;
  /** The digest of its current template (warmTemplateHash). */
  template: string;
  count: number;
  max?: number | undefined;
  /** Creates it served or would have served in the last warm.windowSeconds (sizes it between count and max). */
  recentCreates: number;
  /** Ready ones kept while its pods are replaced (a template change); default count. */
  minAvailable?: number | undefined;
}

export interface WarmInput {
  pool: SandboxPool;
  /** The shapes to keep, first served first when the room under maxBoxes is short. */
  shapes: ShapeInput[];
  /** The pool's warm pods (labelled with the pool, not claimed), deleting ones included. */
  pods: readonly k8s.V1Pod[];
  /** Boxes of sessions that count against maxBoxes. */
  active: number;
  /** Sleeping boxes: they keep their seats of maxBoxes, and warm pods hold seats too (common/seats.ts). */
  sleeping?: number;
  /**
   * Boxes of the pool the scheduler found no room for (Pending, Unschedulable) and that no warm
   * pod yielded to a moment ago: each gets one warm pod out of its way now.
   */
  starving?: number;
  /** The shapes' cpu (cores) by id: the largest warm pods yield first. */
  cpuOf?: ReadonlyMap<string, number>;
  now: number;
}

export interface ShapePlan {
  id: string;
  template: string;
  desired: number;
  ready: number;
  /** New warm pods of this shape to start now. */
  create: number;
}

export interface WarmPlan {
  desired: number;
  ready: number;
  shapes: ShapePlan[];
  /** Warm pods to let go now, with why. */
  remove: Array<{ pod: k8s.V1Pod; reason: 'stale' | 'surplus' | 'failed' | 'recycled' | 'yield' }>;
}

/** What a warm pod's boxd-install init container gets at most (it copies one static binary). */
const INSTALL_CPU = 0.1;
const INSTALL_MEMORY = 64 * 1024 * 1024;

/** Seat numbers a warm pod's start tries: each one held already costs one API call. */
const SEAT_ATTEMPTS = 8;

/** Never more than this many starts per pass: a burst of claims refills in steps, not a storm. */
const MAX_STARTS_PER_PASS = 20;

/** The warm shape a pod was made for: its annotation; older pods have none and were of the default shape. */
export function shapeIdOf(pod: k8s.V1Pod): string {
  return pod.metadata?.annotations?.[ANNOTATIONS.warmShape] ?? DEFAULT_SHAPE;
}

export function planWarm(i: WarmInput): WarmPlan {
  const { maxBoxes, defaultTtlSeconds } = i.pool.spec;
  // Warm pods hold quota and seats too: never more than the room sessions leave (sleeping boxes
  // keep their seats), less one, so that a create of another shape finds a free seat instead of
  // racing the refill of a warm pod it displaced. Shapes are served in order.
  let room = Math.max(0, maxBoxes - i.active - (i.sleeping ?? 0) - 1);
  const live = i.pods.filter((p) => !p.metadata?.deletionTimestamp);
  const remove: WarmPlan['remove'] = [];
  const keep: k8s.V1Pod[] = [];
  for (const pod of live) {
    const phase = pod.status?.phase;
    const age = i.now - new Date(pod.metadata?.creationTimestamp ?? i.now).getTime();
    if (phase === 'Failed' || phase === 'Succeeded') remove.push({ pod, reason: 'failed' });
    // Recycled after the pool's box lifetime, like any box: no pod lives on indefinitely.
    else if (age > defaultTtlSeconds * 1000) remove.push({ pod, reason: 'recycled' });
    else keep.push(pod);
  }
  // A shape no longer kept: its pods go (not-ready ones and ready ones alike).
  const ids = new Set(i.shapes.map((s) => s.id));
  for (const pod of keep) if (!ids.has(shapeIdOf(pod))) remove.push({ pod, reason: 'stale' });
  const shapes: ShapePlan[] = [];
  let creates = 0;
  for (const shape of i.shapes) {
    const wanted = shape.max !== undefined && shape.max > shape.count ? Math.min(shape.max, Math.max(shape.count, shape.recentCreates)) : shape.count;
    const desired = Math.min(wanted, room);
    room -= desired;
    const mine = keep.filter((p) => shapeIdOf(p) === shape.id);
    const before = remove.length;
    const current = mine.filter((p) => p.metadata?.annotations?.[ANNOTATIONS.warmTemplate] === shape.template);
    const stale = mine.filter((p) => p.metadata?.annotations?.[ANNOTATIONS.warmTemplate] !== shape.template);
    const ready = mine.filter(isReady);
    const readyCurrent = current.filter(isReady);

    // Surplus of the current template (the pool shrank): not-ready ones go first.
    const surplus = current.length - desired;
    if (surplus > 0) {
      for (const pod of [...current].sort((a, b) => Number(isReady(a)) - Number(isReady(b))).slice(0, surplus)) {
        remove.push({ pod, reason: 'surplus' });
      }
    }
    // Old template: a stale pod that is not ready goes at once; a ready one only while at least
    // minAvailable ready pods remain without it (new ones start first, one beyond desired).
    const minAvailable = Math.min(shape.minAvailable ?? shape.count, desired);
    let available = ready.length;
    for (const pod of [...stale].sort((a, b) => Number(isReady(a)) - Number(isReady(b)))) {
      if (!isReady(pod)) remove.push({ pod, reason: 'stale' });
      else if (available - 1 >= minAvailable || readyCurrent.length >= desired) {
        remove.push({ pod, reason: 'stale' });
        available--;
      }
    }
    const staying = mine.length - (remove.length - before);
    const surge = stale.length > 0 ? 1 : 0;
    const missing = desired - Math.min(current.length, desired);
    const create = Math.max(0, Math.min(missing, desired + surge - staying, MAX_STARTS_PER_PASS - creates));
    creates += create;
    shapes.push({ id: shape.id, template: shape.template, desired, ready: readyCurrent.length, create });
  }
  // Warm boxes never starve real ones: while a box of the pool finds no room on the nodes, no
  // warm pod starts, those still unscheduled go (they would take the room a yield frees), and
  // one warm pod per starving box gives its room up (not ready ones first, then the largest).
  if ((i.starving ?? 0) > 0) {
    for (const s of shapes) s.create = 0;
    const going = new Set(remove.map((r) => r.pod));
    const left = keep.filter((p) => !going.has(p));
    for (const pod of left.filter(unscheduled)) remove.push({ pod, reason: 'yield' });
    const cpu = (p: k8s.V1Pod) => i.cpuOf?.get(shapeIdOf(p)) ?? 0;
    const holding = left.filter((p) => !unscheduled(p)).sort((a, b) => Number(isReady(a)) - Number(isReady(b)) || cpu(b) - cpu(a));
    for (const pod of holding.slice(0, i.starving)) remove.push({ pod, reason: 'yield' });
  }
  return {
    desired: shapes.reduce((n, s) => n + s.desired, 0),
    ready: shapes.reduce((n, s) => n + s.ready, 0),
    shapes,
    remove,
  };
}

/** The scheduler found no node for it (yet): it holds no node's room. */
export function unscheduled(pod: k8s.V1Pod): boolean {
  return pod.status?.conditions?.some((c) => c.type === 'PodScheduled' && c.status === 'False') === true;
}

/** A box of a session the scheduler found no room for: warm boxes yield to it. */
export function starving(pod: k8s.V1Pod): boolean {
  return (
    !pod.metadata?.labels?.[LABELS.warm] &&
    !pod.metadata?.deletionTimestamp &&
    pod.status?.phase === 'Pending' &&
    pod.status.conditions?.some((c) => c.type === 'PodScheduled' && c.status === 'False' && c.reason === 'Unschedulable') === true
  );
}

/** Ready to claim: running, its boxd answering the kubelet's readiness probe. */
export function isReady(pod: k8s.V1Pod): boolean {
  return (
    !pod.metadata?.deletionTimestamp &&
    pod.status?.phase === 'Running' &&
    pod.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') === true
  );
}

export interface WarmPodsOptions {
  core: k8s.CoreV1Api;
  /**
   * The boxd image and credential key; without them the operator keeps no warm boxes. With an
   * egress key, each warm pod's Secret also holds the pod's egress proxy credential.
   */
  boxd: { image: string; key: Buffer; egressKey?: Buffer | undefined };
}

export class WarmPods {
  /** Seats (namespace/name) whose warm pod's create has not answered yet. */
  private readonly starting = new Set<string>();

  constructor(private readonly o: WarmPodsOptions) {}

  template(pool: SandboxPool, shape?: BoxShape): string {
    return warmTemplateHash(pool.spec, this.o.boxd.image, shape);
  }

  /**
   * Starts one warm pod and its seat (common/seats.ts): a Secret named box-seat-<n>, taken by
   * creating it (a seat another box or warm pod holds answers 409 and the next free number is
   * tried), which also holds the pod's credential; then the pod, labelled with its seat and
   * mounting it. The Secret first, so that no pod ever waits for a Secret that will not come (a
   * pod whose Secret is missing stays in ContainerCreating and would count as a warm box). It is
   * owned by the pool, not the pod, whose UID does not exist yet. What a crash leaves at each point:
   * - before the Secret is created: nothing; the next reconcile sees one warm pod fewer and starts one.
   * - after the Secret, before the pod (or the pod's create failed): a seat no pod holds; the
   *   reaper deletes it once the orphan grace has passed (operator/reaper.ts). A create the API
   *   server refused deletes it at once.
   * - after the pod's create was sent, answered or not: the pod, if made, finds its Secret and
   *   starts. Its seat stays while a pod with its seat label exists, claimed or not, and is reaped
   *   after (a sleep first makes it its box record's: it then goes with the record).
   * `seats` hands out the numbers to try, free as far as the operator's caches know.
   */
  async start(pool: SandboxPool, template: string, seats: () => number | undefined, warm: Pick<WarmShape, 'id' | 'shape'> = { id: DEFAULT_SHAPE, shape: warmShape(pool.spec) }): Promise<void> {
    const ns = pool.spec.namespace;
    const name = `box-warm-${newNonce().slice(0, 10)}`;
    const nonce = newNonce();
    const unowned = { ...ownerReference(pool), controller: false, blockOwnerDeletion: false };
    let seat: number | undefined;
    let seatUid: string | undefined;
    for (let attempt = 0; attempt < SEAT_ATTEMPTS && seat === undefined; attempt++) {
      const n = seats();
      if (n === undefined) break;
      const secret = buildBoxSecret({
        name: seatName(n),
        namespace: ns,
        poolName: pool.metadata.name,
        component: SECRET_COMPONENTS.credential,
        token: boxdToken(this.o.boxd.key, ns, name, nonce),
        // The gateway accepts it only once the pod is claimed (a box-id label): a warm pod reaches nothing.
        egressProxy: this.o.boxd.egressKey ? egressProxyCredential(this.o.boxd.egressKey, ns, name, nonce) : undefined,
        env: {},
        // Names its pod: no one mistakes it for the seat of a later warm pod given the same number.
        annotations: { [ANNOTATIONS.warmPod]: name },
        owner: unowned,
      });
      try {
        seatUid = (await this.o.core.createNamespacedSecret({ namespace: ns, body: secret })).metadata?.uid;
        seat = n;
      } catch (err) {
        if (apiStatusCode(err) !== 409) throw err; // held by a box the caches do not show yet
      }
    }
    if (seat === undefined) throw new NoSeatError(pool.spec.maxBoxes);
    // Until its pod's create has answered, the seat has no pod anyone can see: the reaper must not
    // take it for an orphan, however slow the API server is (seatsStarting).
    const starting = `${ns}/${seatName(seat)}`;
    this.starting.add(starting);
    try {
      await this.createPod(pool, name, nonce, seat, seatUid, template, warm, unowned);
    } finally {
      this.starting.delete(starting);
    }
  }

  /** Whether a warm seat's pod is being created by this operator right now. */
  seatStarting(namespace: string, seat: string): boolean {
    return this.starting.has(`${namespace}/${seat}`);
  }

  private async createPod(
    pool: SandboxPool,
    name: string,
    nonce: string,
    seat: number,
    seatUid: string | undefined,
    template: string,
    warm: Pick<WarmShape, 'id' | 'shape'>,
    unowned: k8s.V1OwnerReference,
  ): Promise<void> {
    const ns = pool.spec.namespace;
    const pod = buildBoxPod({
      name,
      namespace: ns,
      poolName: pool.metadata.name,
      shape: warm.shape,
      box: pool.spec.box,
      egress: pool.spec.egress,
      boxdImage: this.o.boxd.image,
      nonce,
      secretName: seatName(seat),
    });
    pod.metadata!.labels![LABELS.warm] = pool.metadata.name;
    pod.metadata!.labels![LABELS.seat] = String(seat);
    pod.metadata!.annotations![ANNOTATIONS.warmTemplate] = template;
    pod.metadata!.annotations![ANNOTATIONS.warmShape] = warm.id;
    // A claim may resize the box container in place (down as well as up); an init container
    // cannot be resized, and the pod's requests are the larger of it and the box's: a small one
    // keeps a box resized down counted at its new size (quota, scheduler). boxd from an image
    // volume (the pool's boxdDelivery) has no install container.
    const install = pod.spec!.initContainers?.find((c) => c.name === BOXD_INSTALL_CONTAINER);
    const small = { cpu: formatCpu(Math.min(warm.shape.cpuCores, INSTALL_CPU)), memory: formatMemory(Math.min(warm.shape.memoryBytes, INSTALL_MEMORY)) };
    if (install) install.resources = { requests: small, limits: small };
    // Deleting the pool takes its unclaimed warm pods along; a claim replaces this owner.
    pod.metadata!.ownerReferences = [unowned];
    // Ready when boxd answers: what makes a warm pod claimable.
    pod.spec!.containers[0]!.readinessProbe = { httpGet: { path: '/v1/health', port: 'boxd' }, periodSeconds: 2, failureThreshold: 1 };
    try {
      await this.o.core.createNamespacedPod({ namespace: ns, body: pod });
    } catch (err) {
      // Refused (quota, invalid): no pod will hold the seat. Anything else (a timeout, a 5xx)
      // may have made the pod after all: its seat stays, and the reaper judges it by its pod.
      if (refused(err)) {
        await this.o.core.deleteNamespacedSecret({ name: seatName(seat), namespace: ns, body: { preconditions: { uid: seatUid } } }).catch(() => undefined);
      }
      throw err;
    }
  }

  /**
   * Lets a warm pod go, at once (it holds nobody's data) and only if it is still unclaimed: the
   * delete carries the resource version this pass saw, so a claim that just happened wins.
   */
  async remove(pod: k8s.V1Pod, seat?: Pick<k8s.V1Secret, 'metadata'>): Promise<void> {
    await this.o.core.deleteNamespacedPod({
      name: pod.metadata!.name!,
      namespace: pod.metadata!.namespace!,
      // Options in the body: the API server ignores query options when a DELETE has a body.
      body: { gracePeriodSeconds: 0, preconditions: { uid: pod.metadata!.uid!, resourceVersion: pod.metadata!.resourceVersion! } },
    });
    // Unclaimed when it went, it can no longer be claimed: its seat is free at once (the reaper
    // would free it on a later pass). Only that pod's seat, as the cache saw it: one changed
    // since (adopted by a record) is left alone.
    if (seat?.metadata?.uid && isWarmSeatOf(seat, pod.metadata!.name!)) {
      await this.o.core
        .deleteNamespacedSecret({
          name: seat.metadata.name!,
          namespace: pod.metadata!.namespace!,
          body: { preconditions: { uid: seat.metadata.uid, resourceVersion: seat.metadata.resourceVersion } },
        })
        .catch(() => undefined);
    }
  }
}

/** The API server answered that it did not make the object: a 4xx other than 409 (a pod of that name exists). */
function refused(err: unknown): boolean {
  const status = apiStatusCode(err);
  return status !== undefined && status >= 400 && status < 500 && status !== 409;
}

/** Every seat of the pool is held (by boxes, sleeping ones included, and warm pods). */
export class NoSeatError extends Error {
  constructor(maxBoxes: number) {
    super(`no free seat of the pool's ${maxBoxes} (maxBoxes) for a warm box`);
  }
}

/**
 * The seat numbers a pass of the warm pool tries, in random order (bridge replicas taking seats
 * at once then seldom collide with it): those of 0..maxBoxes-1 that no pod, sleeping box or warm
 * seat the caches show holds. One list per pass, so concurrent starts never try the same number.
 */
export function freeSeats(maxBoxes: number, held: ReadonlySet<number>): () => number | undefined {
  const free: number[] = [];
  for (let n = 0; n < maxBoxes; n++) if (!held.has(n)) free.push(n);
  for (let i = free.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [free[i], free[j]] = [free[j]!, free[i]!];
  }
  return () => free.pop();
}
