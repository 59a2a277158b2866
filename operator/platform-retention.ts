// What snapshot retention sweeps beside the snapshots (issue 21): the index markers of snapshots
// by backup context (common/snapshot-index.ts) and the session outputs copied to the store
// (common/session-outputs.ts). Called by the retention reconciler once per sweep of a pool, after
// its snapshot deletes; both are one key listing of their own prefix, no object read.
import type { ObjectStore } from '../common/object-store.js';
import type { PartialObjectMetadata } from '../common/informer.js';
import { indexPoolPrefix, planIndexRetention } from '../common/snapshot-index.js';
import { mountedSessions, outputsPoolPrefix, planOutputsRetention } from '../common/session-outputs.js';

export interface SweepInput {
  store: ObjectStore;
  pool: string;
  /** Snapshot ids that still have objects after this sweep's deletes. */
  stored: ReadonlySet<string>;
  retentionSeconds: number;
  now: number;
  graceMs: number;
  /** The pool namespace's box records (metadata): sessions whose outputs a live box holds. */
  records: readonly PartialObjectMetadata[];
}

/** Deletes markers whose snapshot is gone and outputs past retention; resolves with how many of each. */
export async function sweepPlatformObjects(i: SweepInput): Promise<{ markers: number; outputSessions: number }> {
  const { store } = i;
  const indexPrefix = store.key(indexPoolPrefix(i.pool));
  const markers: Array<{ key: string; lastModified: Date }> = [];
  for await (const o of store.list(indexPrefix)) markers.push({ key: o.key.slice(indexPrefix.length), lastModified: o.lastModified });
  const markerDeletes = planIndexRetention({ markers, stored: i.stored, retentionSeconds: i.retentionSeconds, now: i.now, graceMs: i.graceMs });
  if (markerDeletes.length) await store.delete(markerDeletes.map((k) => indexPrefix + k));

  const outputsPrefix = store.key(outputsPoolPrefix(i.pool));
  const objects: Array<{ key: string; lastModified: Date }> = [];
  for await (const o of store.list(outputsPrefix)) objects.push({ key: o.key.slice(outputsPrefix.length), lastModified: o.lastModified });
  // Read after the listing, as for snapshots: outputs listed were copied before a record could be read without them.
  const outputs = planOutputsRetention({ objects, mounted: mountedSessions(i.records), retentionSeconds: i.retentionSeconds, now: i.now });
  if (outputs.deletes.length) await store.delete(outputs.deletes.map((k) => outputsPrefix + k));
  return { markers: markerDeletes.length, outputSessions: outputs.sessions };
}
