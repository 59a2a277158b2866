// The pool's seats (docs/warm-pool.md "Caps and quota"): maxBoxes Secrets named box-seat-<n>,
// one per box or warm pod, so the global cap is exact across replicas (two creators of seat n
// collide on the name). A seat is held in one of two ways:
// - a record's seat (component box-seat, owned by the box's record): a cold box's, and any
//   sleeping box's; garbage collection frees it with the record;
// - a warm seat (component box-credential, owned by the pool): made by the operator with a warm
//   pod, whose credential it also holds (the pod mounts it), so a claim needs no seat write. It
//   is held while a pod with its seat label exists (warm, claimed or terminating) and reaped
//   after (operator/reaper.ts); a sleep adopts it into the box's record before the pod goes,
//   and a create that gives up a warm pod (unclaimed, or claimed and of no use) adopts that pod's seat.
import type * as k8s from '@kubernetes/client-node';
import { ANNOTATIONS, LABELS, MANAGED_BY, SECRET_COMPONENTS, seatName } from './labels.js';

/**
 * A warm seat is made right before its pod (operator/warm-pool.ts), whose create ends within one
 * API call's timeout: a warm seat older than this whose pod does not exist will not get one.
 */
export const WARM_SEAT_START_MS = 60_000;

/** A seat Secret's owner: the box's record. blockOwnerDeletion false: deleting the record is never held up by it. */
export function recordOwner(record: { name: string; uid: string }): k8s.V1OwnerReference {
  return { apiVersion: 'v1', kind: 'Secret', name: record.name, uid: record.uid, blockOwnerDeletion: false };
}

/** The seat a pod holds (its seat label), or undefined. */
export function seatOf(pod: Pick<k8s.V1Pod, 'metadata'> | undefined): number | undefined {
  const raw = pod?.metadata?.labels?.[LABELS.seat];
  const n = Number(raw);
  return raw !== undefined && raw !== '' && Number.isInteger(n) && n >= 0 ? n : undefined;
}

/** Whether a pod mounts its seat as its credential (a warm pod, claimed or not, made with a warm seat). */
export function holdsWarmSeat(pod: k8s.V1Pod): boolean {
  const seat = seatOf(pod);
  if (seat === undefined) return false;
  return pod.spec?.volumes?.some((v) => v.secret?.secretName === seatName(seat)) === true;
}

/**
 * What makes a seat Secret the record's: the merge patch turning a warm seat into a record's
 * seat, guarded by the version read (a reaper's delete judged on an older version then fails,
 * and so does this patch after that delete). `dropData`: the credential goes too (its pod is gone).
 */
export function adoptionPatch(seat: k8s.V1Secret, record: { name: string; uid: string }, dropData: boolean): object {
  return {
    metadata: {
      resourceVersion: seat.metadata!.resourceVersion,
      ownerReferences: [recordOwner(record)],
      // Out of the operator's view of box Secrets (the reaper judges warm seats only).
      labels: { [LABELS.component]: SECRET_COMPONENTS.seat, [LABELS.box]: null, [LABELS.managedBy]: MANAGED_BY },
    },
    ...(dropData ? { data: null } : {}),
  };
}

/**
 * Whether a seat Secret is still that warm pod's (not adopted by a record; made for that very pod:
 * a seat number freed and taken again is another pod's).
 */
export function isWarmSeatOf(seat: Pick<k8s.V1Secret, 'metadata'>, podName: string): boolean {
  return seat.metadata?.labels?.[LABELS.component] === SECRET_COMPONENTS.credential && seat.metadata?.annotations?.[ANNOTATIONS.warmPod] === podName;
}

/** Whether a seat Secret is the record's (adopted or taken by it). */
export function ownedBy(seat: Pick<k8s.V1Secret, 'metadata'>, recordUid: string): boolean {
  return seat.metadata?.ownerReferences?.some((o) => o.uid === recordUid) === true;
}
