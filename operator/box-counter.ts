// totalBoxesCreated without double counting across restarts and leader changes.
//
// The count lives in the pool's status next to a watermark: the creationTimestamp (second
// resolution, set by the API server) of the newest counted box, and the UIDs counted within that
// second. A box is new when it was created after the watermark second, or within it and its UID
// is not listed. The reconciler counts the boxes it can see (cache plus boxes observed through
// watch events since the last count, so short-lived boxes are not missed) and writes the new
// total and watermark with the pool's resourceVersion as a precondition, so a stale cache can
// never count from an old watermark. Limits: a box created and deleted while no operator was
// watching (all replicas down, or between a watch failure and its relist) is never seen; and a
// box whose creationTimestamp is older than the watermark when first seen (API servers with
// skewed clocks) is not counted.
import type { SandboxPoolStatus } from '../common/pool.js';

export interface SeenBox {
  uid: string;
  /** creationTimestamp in ms since epoch. */
  createdAt: number;
}

export interface BoxCount {
  total: number;
  watermark?: { creationTimestamp: string; uids: string[] };
  /** How many boxes this count added. */
  added: number;
}

export function countBoxes(status: SandboxPoolStatus | undefined, boxes: Iterable<SeenBox>): BoxCount {
  let total = status?.totalBoxesCreated ?? 0;
  const prior = status?.boxCountWatermark;
  let markSecond = prior ? toSecond(Date.parse(prior.creationTimestamp)) : -Infinity;
  let markUids = new Set(prior?.uids ?? []);
  const fresh = new Map<string, number>();
  for (const box of boxes) {
    const second = toSecond(box.createdAt);
    if (second < markSecond || (second === markSecond && markUids.has(box.uid))) continue;
    fresh.set(box.uid, second);
  }
  for (const second of fresh.values()) {
    total++;
    if (second > markSecond) {
      markSecond = second;
      markUids = new Set();
    }
  }
  for (const [uid, second] of fresh) if (second === markSecond) markUids.add(uid);
  const added = fresh.size;
  if (markSecond === -Infinity) return { total, added };
  return {
    total,
    added,
    watermark: { creationTimestamp: new Date(markSecond * 1000).toISOString().replace('.000Z', 'Z'), uids: [...markUids].sort() },
  };
}

function toSecond(ms: number): number {
  return Math.floor(ms / 1000);
}
