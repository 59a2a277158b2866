// Pure planning of box housekeeping: which box pods and box Secrets to delete, and when the next
// one falls due (the reconciler requeues the pool for then instead of polling).
import type * as k8s from '@kubernetes/client-node';
import type { PartialObjectMetadata } from '../common/informer.js';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS, seatName, warmCredentialName } from '../common/labels.js';
import { RECORD_ORPHAN_GRACE_MS } from '../common/box-records.js';
import { seatOf } from '../common/seats.js';

/**
 * expired / succeeded / failed: a box pod; box_record: the record of a box reaped in the same
 * pass; orphaned_record: a record whose box has had no pod for the grace period; orphaned_secret:
 * a warm pod's credential with no pod of its name, or another box Secret whose owner pod is gone.
 */
export type ReapReason = 'expired' | 'succeeded' | 'failed' | 'box_record' | 'orphaned_record' | 'orphaned_secret';

export interface Reap {
  kind: 'Pod' | 'Secret';
  name: string;
  namespace: string;
  uid: string;
  /** The version judged: the delete fails if the object changed since (a warm seat a sleep just made its record's). */
  resourceVersion?: string;
  reason: ReapReason;
  /** For expired boxes: when they expired. */
  expiredAt?: Date;
}

export interface ReapPlan {
  reaps: Reap[];
  /** Boxes that keep running. */
  active: number;
  /** Earliest future instant at which something else falls due (ms since epoch). */
  nextDueAt?: number;
}

export interface ReapInput {
  pods: readonly k8s.V1Pod[];
  /** Box Secrets: their metadata is all the plan reads. */
  secrets: readonly PartialObjectMetadata[];
  defaultTtlSeconds: number;
  now: number;
  /**
   * How old a box Secret without its pod must be before it counts as orphaned: the Secret may
   * be observed before its pod reaches this replica's cache, and a freshly created box must not
   * lose its environment.
   */
  orphanGraceMs: number;
  /** UIDs whose delete was already sent and not yet observed, so they are not sent again. */
  pending?: ReadonlySet<string>;
}

/** When a box expires: its expires-at annotation, else creation + the pool's default TTL. */
export function expiryOf(pod: Pick<k8s.V1Pod, 'metadata'>, defaultTtlSeconds: number): number | undefined {
  const stamped = pod.metadata?.annotations?.[ANNOTATIONS.expiresAt];
  if (stamped) {
    const at = Date.parse(stamped);
    if (Number.isFinite(at)) return at;
  }
  const created = timestamp(pod.metadata?.creationTimestamp);
  return created === undefined ? undefined : created + defaultTtlSeconds * 1000;
}

export function planReaps(input: ReapInput): ReapPlan {
  const { now, pending } = input;
  const reaps: Reap[] = [];
  let active = 0;
  let nextDueAt: number | undefined;
  const due = (at: number) => {
    if (nextDueAt === undefined || at < nextDueAt) nextDueAt = at;
  };
  // By UID, not name: a box recreated under a reused name must not keep its predecessor's
  // Secret alive, nor lose its own to it.
  const livePods = new Set<string>();
  /** The credential Secret names of every pod there is, deleting ones too (they still mount it). */
  const podCredentials = new Set<string>();
  /** Names of every pod there is: a warm seat is kept while the pod it names exists. */
  const podNames = new Set<string>();
  /** Box ids with a pod that stays, and those whose pod this pass reaps. */
  const liveBoxes = new Set<string>();
  const reapedBoxes = new Set<string>();

  for (const pod of input.pods) {
    const { name, namespace, uid } = pod.metadata ?? {};
    if (!name || !namespace || !uid) continue;
    livePods.add(uid);
    podCredentials.add(warmCredentialName(name));
    // A warm pod's credential is also its seat, box-seat-<n> (common/seats.ts), naming its pod.
    podNames.add(name);
    const seat = seatOf(pod);
    if (seat !== undefined) podCredentials.add(seatName(seat));
    // Warm pods belong to no session: the warm pool (operator/warm-pool.ts) keeps them.
    if (pod.metadata?.labels?.[LABELS.warm]) continue;
    const boxId = pod.metadata?.labels?.[LABELS.boxId] ?? name;
    if (pod.metadata?.deletionTimestamp || pending?.has(uid)) continue;
    const phase = pod.status?.phase;
    if (phase === 'Succeeded' || phase === 'Failed') {
      reaps.push({ kind: 'Pod', name, namespace, uid, reason: phase === 'Succeeded' ? 'succeeded' : 'failed' });
      reapedBoxes.add(boxId);
      continue;
    }
    const expiry = expiryOf(pod, input.defaultTtlSeconds);
    if (expiry !== undefined && expiry <= now) {
      reaps.push({ kind: 'Pod', name, namespace, uid, reason: 'expired', expiredAt: new Date(expiry) });
      reapedBoxes.add(boxId);
      continue;
    }
    liveBoxes.add(boxId);
    active++;
    if (expiry !== undefined) due(expiry);
  }

  for (const secret of input.secrets) {
    const { name, namespace, uid } = secret.metadata ?? {};
    if (!name || !namespace || !uid) continue;
    if (secret.metadata?.deletionTimestamp || pending?.has(uid)) continue;
    const created = timestamp(secret.metadata?.creationTimestamp) ?? 0;
    const orphanAt = created + input.orphanGraceMs;
    if (secret.metadata?.labels?.[LABELS.component] === SECRET_COMPONENTS.record) {
      // A record is named after its box. Its pod may be on its way (a create in flight), so it
      // is an orphan only once no create could still make it (common/box-records.ts).
      const recordOrphanAt = created + Math.max(input.orphanGraceMs, RECORD_ORPHAN_GRACE_MS);
      if (reapedBoxes.has(name)) reaps.push({ kind: 'Secret', name, namespace, uid, reason: 'box_record' });
      else if (liveBoxes.has(name)) continue;
      else if (secret.metadata?.labels?.[LABELS.sleep]) {
        // A sleeping box (bridge/services/sleep.ts) has no pod: its TTL counts on in its record.
        // Its snapshot stays in the store until the pool's retention.
        const expiry = Date.parse(secret.metadata.annotations?.[ANNOTATIONS.expiresAt] ?? '');
        if (!Number.isFinite(expiry)) continue;
        if (expiry <= now) reaps.push({ kind: 'Secret', name, namespace, uid, reason: 'expired', expiredAt: new Date(expiry) });
        else due(expiry); // not counted active: it holds no pod, so no quota
      }
      else if (recordOrphanAt <= now) reaps.push({ kind: 'Secret', name, namespace, uid, reason: 'orphaned_record' });
      else due(recordOrphanAt);
      continue;
    }
    if (secret.metadata?.labels?.[LABELS.component] === SECRET_COMPONENTS.credential) {
      // A warm pod's credential (its seat) is made before its pod and owned by the pool
      // (operator/warm-pool.ts), so it goes by name: kept while a pod with its seat label exists
      // (warm, claimed or terminating; older ones: a pod of its name), an orphan when none has
      // appeared by the end of the grace. Judged on this version only: a sleep that made it its
      // box record's seat (the pod going next) changed it, and the delete then fails.
      const warmPod = secret.metadata?.annotations?.[ANNOTATIONS.warmPod];
      if (podCredentials.has(name) || (warmPod !== undefined && podNames.has(warmPod))) continue;
      if (orphanAt <= now) reaps.push({ kind: 'Secret', name, namespace, uid, resourceVersion: secret.metadata?.resourceVersion, reason: 'orphaned_secret' });
      else due(orphanAt);
      continue;
    } else {
      const owner = secret.metadata?.ownerReferences?.find((o) => o.kind === 'Pod')?.uid;
      if (owner && livePods.has(owner)) continue;
    }
    if (orphanAt <= now) reaps.push({ kind: 'Secret', name, namespace, uid, reason: 'orphaned_secret' });
    else due(orphanAt);
  }

  return nextDueAt === undefined ? { reaps, active } : { reaps, active, nextDueAt };
}

function timestamp(value: Date | string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const ms = value instanceof Date ? value.getTime() : Date.parse(value);
  return Number.isFinite(ms) ? ms : undefined;
}
