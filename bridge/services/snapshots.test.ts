import { BridgeError } from '../../common/errors.js';
import { COMPRESSION_MEMORY_BYTES } from '../../common/snapshot-writer.js';
import { ByteBudget } from './byte-budget.js';
import { SnapshotService, type SnapshotServiceDeps } from './snapshots.js';

const MiB = 1024 * 1024;

/** A snapshot service whose box call fails at once (what matters here is the budget around it). */
function service(budget: ByteBudget) {
  const calls: string[] = [];
  const deps = {
    connector: {
      call: async (boxId: string) => {
        calls.push(boxId);
        expect(budget.inUse()).toBe(COMPRESSION_MEMORY_BYTES); // held while the snapshot runs
        throw new BridgeError('not_found', `box ${boxId} not found`);
      },
    },
    snapshots: { configured: () => ({ store: {}, sealer: undefined }), pool: 'p' },
    policy: { current: () => ({ snapshots: { retentionSeconds: 3600 } }) },
    budget,
  } as unknown as SnapshotServiceDeps;
  return { snapshots: new SnapshotService(deps), calls };
}

describe('a snapshot holds its compression memory from the replica budget', () => {
  test('held while it runs and given back after, whatever the outcome', async () => {
    const budget = new ByteBudget(192 * MiB);
    const { snapshots, calls } = service(budget);
    await expect(snapshots.create('box-a')).rejects.toMatchObject({ type: 'not_found' });
    expect(calls).toEqual(['box-a']);
    expect(budget.inUse()).toBe(0);
  });

  test('no room: 503 with Retry-After before the box is touched', async () => {
    const budget = new ByteBudget(COMPRESSION_MEMORY_BYTES + MiB);
    const other = budget.reserve(COMPRESSION_MEMORY_BYTES, 'snapshot');
    const { snapshots, calls } = service(budget);
    const err = await snapshots.create('box-a').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BridgeError);
    expect(err).toMatchObject({ type: 'cluster_unavailable', headers: { 'Retry-After': '1' } });
    expect(calls).toEqual([]);
    other.release();
    await expect(snapshots.create('box-a')).rejects.toMatchObject({ type: 'not_found' });
    expect(calls).toEqual(['box-a']);
  });
});
