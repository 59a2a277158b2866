// Warm boxes of a pool: pods of the pool's default shape, started ahead so that a create of
// that shape claims one (bridge/services/boxes.ts) instead of waiting for a new pod. planWarm()
// is the pure decision (how many to keep, which to start, which to let go); WarmPods carries it
// out. Part of the pool's reconcile: it runs whenever a box pod or the pool changes.
import type * as k8s from '@kubernetes/client-node';
import { boxdToken, newNonce } from '../common/boxd.js';
import { buildBoxPod, buildBoxSecret, warmShape, warmTemplateHash } from '../common/box-pod.js';
import { egressProxyCredential } from '../common/egress-proxy.js';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS, warmCredentialName } from '../common/labels.js';
import type { SandboxPool } from '../common/pool.js';
import { apiStatusCode } from '../common/kube.js';
import { ownerReference } from './children.js';

export interface WarmInput {
  pool: SandboxPool;
  /** The current template's digest (warmTemplateHash). */
  template: string;
  /** The pool's warm pods (labelled with the pool, not claimed), deleting ones included. */
  pods: readonly k8s.V1Pod[];
  /** Boxes of sessions that count against maxBoxes. */
  active: number;
  /** Boxes created in the last warm.windowSeconds (sizes the pool between count and max). */
  recentCreates: number;
  now: number;
}

export interface WarmPlan {
  desired: number;
  ready: number;
  /** New warm pods to start now. */
  create: number;
  /** Warm pods to let go now, with why. */
  remove: Array<{ pod: k8s.V1Pod; reason: 'stale' | 'surplus' | 'failed' | 'recycled' }>;
}

/** Never more than this many starts per pass: a burst of claims refills in steps, not a storm. */
const MAX_STARTS_PER_PASS = 20;

export function planWarm(i: WarmInput): WarmPlan {
  const { warm, maxBoxes, defaultTtlSeconds } = i.pool.spec;
  const wanted = warm.max !== undefined && warm.max > warm.count ? Math.min(warm.max, Math.max(warm.count, i.recentCreates)) : warm.count;
  // Warm pods hold quota too: never more than the room sessions leave, less one, so that a create
  // of another shape finds a free slot instead of racing the refill of a warm pod it displaced.
  const desired = Math.max(0, Math.min(wanted, maxBoxes - i.active - 1));
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
  const current = keep.filter((p) => p.metadata?.annotations?.[ANNOTATIONS.warmTemplate] === i.template);
  const stale = keep.filter((p) => p.metadata?.annotations?.[ANNOTATIONS.warmTemplate] !== i.template);
  const ready = keep.filter(isReady);
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
  const minAvailable = Math.min(warm.minAvailable ?? warm.count, desired);
  let available = ready.length;
  for (const pod of [...stale].sort((a, b) => Number(isReady(a)) - Number(isReady(b)))) {
    if (!isReady(pod)) remove.push({ pod, reason: 'stale' });
    else if (available - 1 >= minAvailable || readyCurrent.length >= desired) {
      remove.push({ pod, reason: 'stale' });
      available--;
    }
  }
  const staying = keep.length - remove.filter((r) => r.reason !== 'failed' && r.reason !== 'recycled').length;
  const surge = stale.length > 0 ? 1 : 0;
  const missing = desired - Math.min(current.length, desired);
  const create = Math.max(0, Math.min(missing, desired + surge - staying, MAX_STARTS_PER_PASS));
  return { desired, ready: readyCurrent.length, create, remove };
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
  constructor(private readonly o: WarmPodsOptions) {}

  template(pool: SandboxPool): string {
    return warmTemplateHash(pool.spec, this.o.boxd.image);
  }

  /**
   * Starts one warm pod and its credential Secret: the Secret first, then the pod, so that no
   * pod ever waits for a Secret that will not come (a pod whose Secret is missing stays in
   * ContainerCreating and would count as a warm box). The Secret is named after the pod
   * (warmCredentialName) and owned by the pool, not the pod, whose UID does not exist yet. What a
   * crash leaves at each point:
   * - before the Secret is created: nothing; the next reconcile sees one warm pod fewer and starts one.
   * - after the Secret, before the pod (or the pod's create failed): a Secret no pod of its name
   *   uses; the reaper deletes it once the orphan grace has passed (operator/reaper.ts). A create
   *   the API server refused deletes it at once.
   * - after the pod's create was sent, answered or not: the pod, if made, finds its Secret and
   *   starts. Its Secret stays while a pod of its name exists, claimed or not, and is reaped after.
   * Since a claimed pod keeps its name and its Secret (boxd read its credential from it), the
   * reaper, not garbage collection, deletes a warm credential once its pod is gone; deleting the
   * pool deletes them all.
   */
  async start(pool: SandboxPool, template: string): Promise<void> {
    const ns = pool.spec.namespace;
    const name = `box-warm-${newNonce().slice(0, 10)}`;
    const nonce = newNonce();
    const unowned = { ...ownerReference(pool), controller: false, blockOwnerDeletion: false };
    const secret = buildBoxSecret({
      name: warmCredentialName(name),
      namespace: ns,
      poolName: pool.metadata.name,
      component: SECRET_COMPONENTS.credential,
      token: boxdToken(this.o.boxd.key, ns, name, nonce),
      // The gateway accepts it only once the pod is claimed (a box-id label): a warm pod reaches nothing.
      egressProxy: this.o.boxd.egressKey ? egressProxyCredential(this.o.boxd.egressKey, ns, name, nonce) : undefined,
      env: {},
      owner: unowned,
    });
    await this.o.core.createNamespacedSecret({ namespace: ns, body: secret });
    const pod = buildBoxPod({
      name,
      namespace: ns,
      poolName: pool.metadata.name,
      shape: warmShape(pool.spec),
      box: pool.spec.box,
      egress: pool.spec.egress,
      boxdImage: this.o.boxd.image,
      nonce,
      secretName: warmCredentialName(name),
    });
    pod.metadata!.labels![LABELS.warm] = pool.metadata.name;
    pod.metadata!.annotations![ANNOTATIONS.warmTemplate] = template;
    // Deleting the pool takes its unclaimed warm pods along; a claim replaces this owner.
    pod.metadata!.ownerReferences = [unowned];
    // Ready when boxd answers: what makes a warm pod claimable.
    pod.spec!.containers[0]!.readinessProbe = { httpGet: { path: '/v1/health', port: 'boxd' }, periodSeconds: 2, failureThreshold: 1 };
    try {
      await this.o.core.createNamespacedPod({ namespace: ns, body: pod });
    } catch (err) {
      // Refused (quota, invalid): no pod will use the Secret. Anything else (a timeout, a 5xx)
      // may have made the pod after all: its Secret stays, and the reaper judges it by name.
      if (refused(err)) {
        await this.o.core.deleteNamespacedSecret({ name: warmCredentialName(name), namespace: ns }).catch(() => undefined);
      }
      throw err;
    }
  }

  /**
   * Lets a warm pod go, at once (it holds nobody's data) and only if it is still unclaimed: the
   * delete carries the resource version this pass saw, so a claim that just happened wins.
   */
  async remove(pod: k8s.V1Pod): Promise<void> {
    await this.o.core.deleteNamespacedPod({
      name: pod.metadata!.name!,
      namespace: pod.metadata!.namespace!,
      // Options in the body: the API server ignores query options when a DELETE has a body.
      body: { gracePeriodSeconds: 0, preconditions: { uid: pod.metadata!.uid!, resourceVersion: pod.metadata!.resourceVersion! } },
    });
  }
}

/** The API server answered that it did not make the object: a 4xx other than 409 (a pod of that name exists). */
function refused(err: unknown): boolean {
  const status = apiStatusCode(err);
  return status !== undefined && status >= 400 && status < 500 && status !== 409;
}
