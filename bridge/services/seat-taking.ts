// How a create gets a seat of the pool (bridge/kube/box-seats.ts, common/seats.ts) when it needs a
// new pod. Warm pods hold seats too: when every seat is held, an unclaimed warm pod is given up
// and its seat becomes the record's. What this replica's watch shows lags the API server, so
// some seats it counts as held are coming free: a warm pod the operator just shrank away (gone
// from the API server, still in the cache), a box just deleted (its seat goes by garbage
// collection). Those are waited for briefly; before a create answers that the pool is full
// (429), it reads the seats the API server holds and tries any the watch still shows held.
import type * as k8s from '@kubernetes/client-node';
import { LABELS } from '../../common/labels.js';
import { seatOf } from '../../common/seats.js';

/**
 * Seat takes retried while a seat or two are coming free, or a spare changed under us (150 ms
 * doubling, at most 1 s apart: ~5 s). The operator frees a seat it shrank away within a pass or
 * two; on a loaded cluster that took longer than the ~2.3 s of 4 retries (the CI's 12th box of 12
 * answered 429 with the seat freed a moment later).
 */
export const SEAT_RETRIES = 7;
const SEAT_RETRY_MAX_MS = 1000;
/** Unclaimed warm pods given up per round. */
const SPARES_PER_ROUND = 3;
/** Fresh reads of a warm pod being given up whose version keeps changing (a starting pod's status). */
const GIVE_UP_READS = 3;

/** What giving up a warm pod did: deleted it; found it changed (claimed, say); found it gone already. */
export type GiveUp = 'deleted' | 'changed' | 'gone';

export interface SeatIo {
  /** Seats held as this replica's watches show them (pods, sleeping boxes). */
  held(): Set<number>;
  /** Seats as the API server holds them now (one list). */
  liveHeld(): Promise<Set<number>>;
  /** Takes a free seat, not trying `held`; undefined when those tried were taken. */
  take(held: ReadonlySet<number>): Promise<number | undefined>;
  /** Unclaimed warm pods of the pool as the cache shows them, best to give up first. */
  spares(): k8s.V1Pod[];
  giveUp(pod: k8s.V1Pod): Promise<GiveUp>;
  /** Makes warm seat n (that pod's) the record's; false when it is not (freed, or another pod's). */
  adoptWarm(n: number, podName: string): Promise<boolean>;
  sleep(ms: number): Promise<void>;
}

/** A seat for the record, or undefined when the pool is full. */
export async function takeSeat(io: SeatIo, maxBoxes: number): Promise<number | undefined> {
  // Warm pods found gone while the cache still shows them: their seats are free, or freed within
  // moments (the operator frees a seat right after the pod it shrank away; the reaper otherwise).
  const goneSeats = new Set<number>();
  const goneNames = new Set<string>();
  const held = () => {
    const seats = io.held();
    for (const n of goneSeats) seats.delete(n);
    return seats;
  };
  for (let attempt = 0; ; attempt++) {
    const seat = await io.take(held());
    if (seat !== undefined) return seat;
    const spares = io.spares().filter((p) => !goneNames.has(p.metadata!.name!));
    // A spare that changed since the cache saw it (the kubelet's status, a claim) is looked at
    // again next round, as the watch shows it then: claimed, it is no spare any more.
    let changed = false;
    for (const spare of spares.slice(0, SPARES_PER_ROUND)) {
      const n = seatOf(spare);
      if (n === undefined) continue;
      const name = spare.metadata!.name!;
      const outcome = await io.giveUp(spare);
      if (outcome === 'changed') {
        changed = true;
        continue;
      }
      if (outcome === 'gone') {
        goneSeats.add(n);
        goneNames.add(name);
      }
      // Its pod deleted, or gone: no box can be served by it, so its seat may become the record's.
      if (await io.adoptWarm(n, name)) return n;
      const again = await io.take(held());
      if (again !== undefined) return again;
    }
    // Every seat taken, one or two by what is coming free (above) or by what the watches do not
    // show yet. Many unseen holders are creates in flight through other replicas: the pool is
    // full, and waiting would not help.
    const unseen = maxBoxes - held().size;
    if (attempt >= SEAT_RETRIES || (!changed && (unseen <= 0 || unseen > 2))) {
      // Full as the watch shows it; the API server may have freed some of those seats already
      // (a box deleted a moment ago: its seat goes with its record, its pod still in the cache).
      return io.take(await io.liveHeld());
    }
    await io.sleep(Math.min(150 * 2 ** attempt, SEAT_RETRY_MAX_MS));
  }
}

export interface WarmPodIo {
  /** Deletes the pod (grace 0) if it still has that uid and version. */
  delete(name: string, uid: string, resourceVersion: string): Promise<'deleted' | 'gone' | 'changed'>;
  /** The pod as the API server has it now; undefined when there is none of that name. */
  read(name: string): Promise<k8s.V1Pod | undefined>;
}

/**
 * Gives up an unclaimed warm pod: deleted, guarded by its version, so a concurrent claim wins. A
 * starting pod's version changes with each kubelet status update, faster than a loaded replica's
 * watch shows them (the CI's 12th box of 12 refused while a starting warm pod held the last
 * seat): on a conflict the pod is read again and deleted at the version read, as long as it is
 * still an unclaimed warm pod of the pool (a claim removes its warm label).
 */
export async function giveUpWarm(io: WarmPodIo, pod: k8s.V1Pod, poolName: string): Promise<GiveUp> {
  const name = pod.metadata!.name!;
  const uid = pod.metadata!.uid!;
  let version = pod.metadata!.resourceVersion!;
  for (let read = 0; ; read++) {
    const outcome = await io.delete(name, uid, version);
    if (outcome !== 'changed' || read >= GIVE_UP_READS) return outcome;
    const fresh = await io.read(name);
    if (!fresh || fresh.metadata?.uid !== uid) return 'gone';
    if (fresh.metadata?.labels?.[LABELS.warm] !== poolName || fresh.metadata?.deletionTimestamp) return 'changed';
    version = fresh.metadata!.resourceVersion!;
  }
}
