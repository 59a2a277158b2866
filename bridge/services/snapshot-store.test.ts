import { BridgeError } from '../../common/errors.js';
import { RESTORE_MEMORY_BYTES } from '../../common/snapshot-writer.js';
import type { SnapshotMetadata } from '../../common/snapshots.js';
import { ByteBudget } from './byte-budget.js';
import { SnapshotStore, type SnapshotStoreDeps } from './snapshot-store.js';

const MiB = 1024 * 1024;
const metadata = { snapshot_id: 'snap-0123456789ab-000000001-0000001-01234567', compression: 'zstd', size: 1, sha256: 'x' } as SnapshotMetadata;

/** A snapshot store whose object is gone (what matters here is the budget around the restore). */
function restorer(budget: ByteBudget) {
  const reads: string[] = [];
  const deps = {
    store: {
      key: (...p: string[]) => p.join('/'),
      getStream: async (key: string) => {
        reads.push(key);
        expect(budget.inUse()).toBe(RESTORE_MEMORY_BYTES); // held while the restore runs
        return undefined;
      },
    },
    sealer: {},
    policy: { current: () => ({ box: { workspaceSizeLimit: '1Gi' }, snapshots: { maxEntries: 10 } }), poolName: 'p' },
    budget,
  } as unknown as SnapshotStoreDeps;
  return { store: new SnapshotStore(deps), reads };
}

const call = { target: { box: 'b', ip: '127.0.0.1', token: 't' }, signal: new AbortController().signal };

describe('a restore holds its worker memory from the replica budget', () => {
  test('held while it runs and given back after, whatever the outcome', async () => {
    const budget = new ByteBudget(192 * MiB);
    const { store, reads } = restorer(budget);
    await expect(store.restoreInto(call, metadata)).rejects.toMatchObject({ type: 'not_found' });
    expect(reads).toHaveLength(1);
    expect(budget.inUse()).toBe(0);
  });

  test('no room: 503 with Retry-After before the store is read', async () => {
    const budget = new ByteBudget(RESTORE_MEMORY_BYTES + MiB);
    const other = budget.reserve(RESTORE_MEMORY_BYTES, 'snapshot');
    const { store, reads } = restorer(budget);
    const err = await store.restoreInto(call, metadata).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BridgeError);
    expect(err).toMatchObject({ type: 'cluster_unavailable', headers: { 'Retry-After': '1' } });
    expect(reads).toEqual([]);
    other.release();
    await expect(store.restoreInto(call, metadata)).rejects.toMatchObject({ type: 'not_found' });
    expect(reads).toHaveLength(1);
  });
});
