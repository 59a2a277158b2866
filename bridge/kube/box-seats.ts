// The pool's global cap, exact across replicas: a box holds one of maxBoxes seats, each a tiny
// Secret with a fixed name (box-seat-<n>), so two replicas racing for a seat collide on the name
// and the API server lets one win. The namespace's ResourceQuota alone is not exact: its
// controller recounts pods from a cache, and a recount while creates are in flight (as boxes are
// deleted or warm pods given up) can undercount and admit more pods than the quota holds.
//
// A seat taken here is owned by its box's record, so deleting the record frees the seat (garbage
// collection). Such seats carry no box label: the operator's reaper never sees them. Warm pods
// hold seats of their own, made by the operator (common/seats.ts): a claim keeps the pod's seat.
import * as k8s from '@kubernetes/client-node';
import { BridgeError } from '../../common/errors.js';
import { ANNOTATIONS, LABELS, MANAGED_BY, SECRET_COMPONENTS, seatName, seatNumberOf } from '../../common/labels.js';
import { WARM_SEAT_START_MS, adoptionPatch, isWarmSeatOf, ownedBy, recordOwner } from '../../common/seats.js';
import type { KubeCall } from './instrument.js';

/** Seats tried before a create is refused: each lost race costs one API call. */
const SEAT_ATTEMPTS = 8;

export class BoxSeats {
  constructor(
    private readonly core: k8s.CoreV1Api,
    private readonly call: KubeCall,
    private readonly namespace: string,
  ) {}

  /**
   * Takes a free seat for the record: resolves with its number, or undefined when every seat
   * tried was taken. `held` are the seats this replica knows to be taken (its pod cache); the
   * others are tried in random order, so racing replicas seldom collide.
   */
  async take(poolName: string, maxBoxes: number, held: ReadonlySet<number>, record: { name: string; uid: string }): Promise<number | undefined> {
    const free: number[] = [];
    for (let n = 0; n < maxBoxes; n++) if (!held.has(n)) free.push(n);
    for (let i = free.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [free[i], free[j]] = [free[j]!, free[i]!];
    }
    for (const n of free.slice(0, SEAT_ATTEMPTS)) {
      const body: k8s.V1Secret = {
        apiVersion: 'v1',
        kind: 'Secret',
        type: 'Opaque',
        metadata: {
          name: seatName(n),
          namespace: this.namespace,
          labels: { [LABELS.managedBy]: MANAGED_BY, [LABELS.component]: SECRET_COMPONENTS.seat, [LABELS.pool]: poolName },
          ownerReferences: [recordOwner(record)],
        },
      };
      try {
        await this.call('take box seat', () => this.core.createNamespacedSecret({ namespace: this.namespace, body }));
        return n;
      } catch (err) {
        if (!(err instanceof BridgeError && err.type === 'conflict')) throw err;
        // Taken: by a box this cache has not seen yet, or by one deleted a moment ago whose seat
        // garbage collection has not removed yet (seconds on a busy API server). That one is
        // removed here and the seat taken.
        if (!(await this.reclaimOrphan(n))) continue;
        try {
          await this.call('take box seat', () => this.core.createNamespacedSecret({ namespace: this.namespace, body }));
          return n;
        } catch (again) {
          if (!(again instanceof BridgeError && again.type === 'conflict')) throw again;
        }
      }
    }
    return undefined;
  }

  /**
   * The seats the API server holds now (one list of the pool's seat Secrets: records' seats and
   * warm seats): what a create reads before answering that the pool is full, since this
   * replica's watch may still show seats freed meanwhile.
   */
  async liveHeld(poolName: string): Promise<Set<number>> {
    const selector = `${LABELS.component} in (${SECRET_COMPONENTS.seat},${SECRET_COMPONENTS.credential}),${LABELS.pool}=${poolName}`;
    const list = await this.call('list box seats', () => this.core.listNamespacedSecret({ namespace: this.namespace, labelSelector: selector }));
    const held = new Set<number>();
    for (const s of list.items) {
      const n = seatNumberOf(s.metadata?.name);
      if (n !== undefined) held.add(n);
    }
    return held;
  }

  /**
   * Deletes seat n when it is a record's seat whose record is gone (a deleted box's, garbage
   * collection not done yet): guarded by its uid and version, so a seat taken again meanwhile is
   * never touched. A warm seat only when its pod is gone for good (reclaimWarmOrphan). True when
   * the seat is free now.
   */
  private async reclaimOrphan(n: number): Promise<boolean> {
    const seat = await this.readSeat(n);
    if (!seat) return true;
    if (seat.metadata?.labels?.[LABELS.component] === SECRET_COMPONENTS.credential) return this.reclaimWarmOrphan(seat);
    const owner = seat.metadata?.ownerReferences?.[0];
    if (seat.metadata?.labels?.[LABELS.component] !== SECRET_COMPONENTS.seat || owner?.kind !== 'Secret' || !owner.uid) return false;
    try {
      const record = await this.call('read box record', () => this.core.readNamespacedSecret({ name: owner.name, namespace: this.namespace }));
      if (record.metadata?.uid === owner.uid && !record.metadata?.deletionTimestamp) return false; // its box holds it
    } catch (err) {
      if (!(err instanceof BridgeError && err.type === 'not_found')) throw err;
    }
    return this.deleteAsRead(seat, 'free orphaned box seat');
  }

  /**
   * A warm seat whose pod is gone (a claimed box deleted a moment ago, its pod removed): the
   * reaper frees it once its watch shows the pod gone, seconds later on a loaded cluster, while a
   * create finding the pool full would answer 429. Freed here when the pod it names does not exist
   * (read now) and the seat is older than a warm start can take (common/seats.ts), guarded by its
   * uid and version (an adoption meanwhile makes the delete fail).
   */
  private async reclaimWarmOrphan(seat: k8s.V1Secret): Promise<boolean> {
    const podName = seat.metadata?.annotations?.[ANNOTATIONS.warmPod];
    const created = Date.parse(String(seat.metadata?.creationTimestamp ?? ''));
    if (!podName || !Number.isFinite(created) || Date.now() - created < WARM_SEAT_START_MS) return false;
    try {
      await this.call('read warm pod', () => this.core.readNamespacedPod({ name: podName, namespace: this.namespace }));
      return false; // its pod holds it
    } catch (err) {
      if (!(err instanceof BridgeError && err.type === 'not_found')) throw err;
    }
    return this.deleteAsRead(seat, 'free orphaned warm seat');
  }

  /**
   * Deletes a seat as it was read, guarded by its uid and version: one taken or adopted meanwhile
   * is never touched. True when it is gone now; false when it changed.
   */
  private async deleteAsRead(seat: k8s.V1Secret, operation: string): Promise<boolean> {
    try {
      await this.call(operation, () =>
        this.core.deleteNamespacedSecret({
          name: seat.metadata!.name!,
          namespace: this.namespace,
          body: { preconditions: { uid: seat.metadata!.uid!, resourceVersion: seat.metadata!.resourceVersion! } },
        }),
      );
      return true;
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'not_found') return true;
      if (err instanceof BridgeError && err.type === 'conflict') return false;
      throw err;
    }
  }

  private async readSeat(n: number): Promise<k8s.V1Secret | undefined> {
    try {
      return await this.call('read box seat', () => this.core.readNamespacedSecret({ name: seatName(n), namespace: this.namespace }));
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'not_found') return undefined;
      throw err;
    }
  }

  /**
   * Frees warm seat n of a pod deleted a moment ago (grace 0: gone), as the operator frees the
   * seat of a warm pod it lets go, instead of leaving it to the reaper's next look. Only that pod's
   * seat as read now: one adopted by a record or made for a later pod is left alone.
   */
  async freeWarm(n: number, podName: string): Promise<void> {
    const seat = await this.readSeat(n);
    if (seat && isWarmSeatOf(seat, podName)) await this.deleteAsRead(seat, 'free box seat');
  }

  /**
   * Makes warm seat n the record's: for a create that gave up an unclaimed warm pod (deleted,
   * guarded by its version, so it can no longer be claimed) to get its seat. True when the seat is
   * now the record's; false when it is gone (the reaper was first: the number is free again) or
   * is not that pod's warm seat (freed and taken again for a later warm pod meanwhile).
   */
  async adoptWarm(n: number, podName: string, record: { name: string; uid: string }): Promise<boolean> {
    for (let attempt = 0; attempt < 3; attempt++) {
      let seat: k8s.V1Secret;
      try {
        seat = await this.call('read box seat', () => this.core.readNamespacedSecret({ name: seatName(n), namespace: this.namespace }));
      } catch (err) {
        if (err instanceof BridgeError && err.type === 'not_found') return false;
        throw err;
      }
      if (ownedBy(seat, record.uid)) return true;
      if (!isWarmSeatOf(seat, podName)) return false;
      try {
        await this.call('adopt box seat', () =>
          this.core.patchNamespacedSecret(
            { name: seatName(n), namespace: this.namespace, body: adoptionPatch(seat, record, true) },
            k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
          ),
        );
        return true;
      } catch (err) {
        if (err instanceof BridgeError && err.type === 'not_found') return false;
        if (!(err instanceof BridgeError && err.type === 'conflict')) throw err;
      }
    }
    return false;
  }
}
