// The store side of snapshots (common/snapshots.ts layout): a snapshot's metadata, restoring its
// workspace into a box through a call the caller holds, and deleting it. Needs no box lookup, so
// the box connector uses it to wake a box, and the snapshot service to fork one.
import type { BoxdClient } from '../../common/boxd-client.js';
import type { EnvSealer } from '../../common/env-seal.js';
import { BridgeError } from '../../common/errors.js';
import type { ObjectStore } from '../../common/object-store.js';
import { parseQuantity } from '../../common/quantity.js';
import { RESTORE_MEMORY_BYTES, WORKSPACE, restoreLimits, restoreWorkspace, snapshotLimits } from '../../common/snapshot-writer.js';
import { METADATA_OBJECT, WORKSPACE_OBJECTS, parseSnapshotId, snapshotKey, workspaceObject, type SnapshotMetadata } from '../../common/snapshots.js';
import type { PolicySource } from '../kube/policy.js';
import type { BoxCall } from './box-connector.js';
import type { ByteBudget } from './byte-budget.js';

export interface SnapshotStoreDeps {
  boxd: BoxdClient;
  policy: PolicySource;
  /** Undefined when no object store is configured: every snapshot route then answers 501. */
  store: ObjectStore | undefined;
  sealer: EnvSealer | undefined;
  onRestored?: (outcome: 'ok' | 'error', seconds: number, bytes: number) => void;
  /** The replica's memory budget: a restore holds RESTORE_MEMORY_BYTES of it while it runs (none: not counted). */
  budget?: Pick<ByteBudget, 'reserve'> | undefined;
}

export class SnapshotStore {
  constructor(private readonly deps: SnapshotStoreDeps) {}

  /**
   * Deletes a snapshot's objects (also an idle sleep's, given up after its snapshot was taken).
   * Metadata first: from then on the snapshot is gone for every reader, even if the second
   * delete fails (the operator removes a workspace object left without metadata).
   */
  async discard(snapshotId: string): Promise<void> {
    const { store } = this.configured();
    const id = parseSnapshotId(snapshotId);
    if (!id) return;
    await store.delete([store.key(snapshotKey(this.pool, id, METADATA_OBJECT))]);
    await store.delete(WORKSPACE_OBJECTS.map((o) => store.key(snapshotKey(this.pool, id, o))));
  }

  /** Whether snapshots are configured (idle sleep needs them). */
  get available(): boolean {
    return Boolean(this.deps.store && this.deps.sealer);
  }

  /** The snapshot's workspace into the box: merged, or with `replace` exactly the snapshot's. */
  async restoreInto({ target, signal }: Pick<BoxCall, 'target' | 'signal'>, metadata: SnapshotMetadata, opts: { replace?: boolean; path?: string } = {}): Promise<{ entries: number; bytes: number }> {
    const { store } = this.configured();
    const id = parseSnapshotId(metadata.snapshot_id)!;
    const limits = restoreLimits(metadata, snapshotLimits(this.deps.policy.current(), parseQuantity));
    // Before anything starts: a replica out of memory for it answers 503 at once, the box untouched.
    const hold = this.deps.budget?.reserve(RESTORE_MEMORY_BYTES, 'snapshot', 'a restore');
    const started = performance.now();
    let bytes = 0;
    try {
      const object = await store.getStream(store.key(snapshotKey(this.pool, id, workspaceObject(metadata))), signal);
      if (!object) throw new BridgeError('not_found', `snapshot ${metadata.snapshot_id} not found (deleted while restoring)`);
      // Checked against its digest and decompressed (in a worker thread): boxd gets a plain tar.
      const { written, stored } = await restoreWorkspace({
        boxd: this.deps.boxd,
        target,
        signal,
        metadata,
        body: object.body,
        path: opts.path ?? WORKSPACE,
        limits,
        replace: opts.replace,
      });
      bytes = stored;
      this.deps.onRestored?.('ok', (performance.now() - started) / 1000, bytes);
      return { entries: written.entries, bytes: written.bytes };
    } catch (err) {
      this.deps.onRestored?.('error', (performance.now() - started) / 1000, bytes);
      throw err;
    } finally {
      hold?.release();
    }
  }

  async metadata(snapshotId: string): Promise<SnapshotMetadata> {
    const { store } = this.configured();
    const id = parseSnapshotId(snapshotId);
    if (!id) throw new BridgeError('invalid_request', `"${snapshotId}" is not a snapshot id`);
    const metadata = await store.getJson<SnapshotMetadata>(store.key(snapshotKey(this.pool, id, METADATA_OBJECT)));
    if (!metadata || metadata.snapshot_id !== snapshotId) throw new BridgeError('not_found', `snapshot ${snapshotId} not found`);
    return metadata;
  }

  get pool(): string {
    return this.deps.policy.poolName;
  }

  configured(): { store: ObjectStore; sealer: EnvSealer } {
    const { store, sealer } = this.deps;
    if (!store || !sealer) {
      throw new BridgeError(
        'not_implemented',
        'snapshots need an object store: set objectStore.bucket (and endpoint, region, credentials) in the chart, ' +
          'or OBJECT_STORE_BUCKET, OBJECT_STORE_ENDPOINT and SNAPSHOT_ENCRYPTION_KEY_FILE for the bridge (docs/snapshots.md)',
      );
    }
    return { store, sealer };
  }
}
