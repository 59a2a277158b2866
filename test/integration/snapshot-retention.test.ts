// Snapshot retention end to end: the operator as its own process, the local cluster's real S3
// store (versitygw), a bridge taking a real snapshot. Objects of snapshots taken long ago are put
// into the store as a bridge would have left them (an expired one, one past a pool retention
// shortened since, and a multipart upload a failed bridge never finished); the operator deletes
// exactly those, and keeps the live snapshot.
import { CreateMultipartUploadCommand, S3Client } from '@aws-sdk/client-s3';
import type { RunningBridge } from '../../bridge/server.js';
import { ObjectStore, ObjectStoreConfigSchema } from '../../common/object-store.js';
import { METADATA_OBJECT, WORKSPACE_OBJECT, newSnapshotId, poolPrefix, snapshotKey } from '../../common/snapshots.js';
import { ON_REAL_NODE, TEST_BOXD_IMAGE, TEST_BOXD_KEY, api, startTestBridge } from '../support/bridge.js';
import { realNodeAvailable, testKubeConfig, waitFor } from '../support/cluster.js';
import { localObjectStore } from '../support/object-store.js';
import { Pools, installCrd, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';

const kc = testKubeConfig();
const realNode = await realNodeAvailable(kc);
const store = await localObjectStore();
const skipReason = !realNode.available ? `no real node: ${realNode.reason}` : !store.available ? `no object store: ${store.reason}` : undefined;
if (skipReason) console.warn(`SKIPPED snapshot retention tests: ${skipReason}`);
const suite = skipReason ? describe.skip : describe;
const storeEnv = store.available ? store.env : {};
const HOUR = 3_600_000;

suite('snapshot retention in the operator, on the real store', () => {
  const pools = new Pools(kc, uniqueName('retention'));
  let operator: OperatorProcess;
  let pool: { name: string; ns: string };
  let bridge: RunningBridge;
  let s3: ObjectStore;

  beforeAll(async () => {
    await installCrd(kc);
    operator = await startOperator({
      leaseName: uniqueName('retention-lease'),
      shard: pools.shard,
      // Sweeps every 2 s; an unfinished upload is abandoned after 1 s (the defaults: 300 s, 1 h).
      env: { ...storeEnv, BOXD_IMAGE: TEST_BOXD_IMAGE, BOXD_KEY: TEST_BOXD_KEY, SNAPSHOT_SWEEP_SECONDS: '2', SNAPSHOT_INCOMPLETE_GRACE_SECONDS: '1' },
    });
    pool = await pools.createReady({ box: ON_REAL_NODE.box, snapshots: { retentionSeconds: 3600 } });
    bridge = await startTestBridge(kc, undefined, { POOL_NAME: pool.name, SANDBOX_NAMESPACE: pool.ns, ...storeEnv });
    s3 = new ObjectStore(ObjectStoreConfigSchema.parse(storeEnv));
  }, 120_000);

  afterAll(async () => {
    s3?.close();
    await bridge?.close();
    await operator?.stop();
    await pools.cleanup();
  }, 60_000);

  test('expired snapshots, ones past a shortened retention and abandoned uploads go; a live snapshot stays', async () => {
    const call = api(bridge);
    const created = await call('POST', '/boxes', { sessionId: 'retained', cpu: 0.25, memory: 256 });
    expect(created.status).toBe(201);
    expect((await call('POST', `/boxes/${created.json.box_id}/exec`, { command: 'echo kept > kept.txt' })).json.exit_code).toBe(0);
    const live = await call('POST', `/boxes/${created.json.box_id}/snapshots`, { name: 'live' });
    expect(live.status).toBe(201);

    const now = Date.now();
    // Expired an hour ago; and taken two hours ago to be kept a day, beyond the pool's 1 h.
    const expired = newSnapshotId('old-session', new Date(now - 2 * HOUR), new Date(now - HOUR));
    const pastRetention = newSnapshotId('old-session', new Date(now - 2 * HOUR), new Date(now + 24 * HOUR));
    const planted: string[] = [];
    for (const id of [expired, pastRetention]) {
      for (const object of [WORKSPACE_OBJECT, METADATA_OBJECT] as const) {
        const key = s3.key(snapshotKey(pool.name, id, object));
        await s3.putJson(key, { planted: true });
        planted.push(key);
      }
    }
    // A workspace upload its bridge never completed (killed mid-snapshot).
    const unfinished = newSnapshotId('old-session', new Date(now), new Date(now + HOUR));
    const raw = new S3Client({
      region: storeEnv.OBJECT_STORE_REGION!,
      endpoint: storeEnv.OBJECT_STORE_ENDPOINT!,
      forcePathStyle: true,
      credentials: { accessKeyId: storeEnv.OBJECT_STORE_ACCESS_KEY_ID!, secretAccessKey: storeEnv.OBJECT_STORE_SECRET_ACCESS_KEY! },
    });
    try {
      await raw.send(new CreateMultipartUploadCommand({ Bucket: storeEnv.OBJECT_STORE_BUCKET!, Key: s3.key(snapshotKey(pool.name, unfinished, WORKSPACE_OBJECT)) }));
    } finally {
      raw.destroy();
    }
    const prefix = s3.key(poolPrefix(pool.name));
    const keys = async () => {
      const found: string[] = [];
      for await (const o of s3.list(prefix)) found.push(o.key);
      return found;
    };
    const uploads = async () => {
      const found: string[] = [];
      for await (const u of s3.listUploads(prefix)) found.push(u.key);
      return found;
    };
    expect(await uploads()).toHaveLength(1);

    await waitFor(
      'the operator to delete the expired objects and abort the upload',
      async () => {
        const present = await keys();
        return planted.every((k) => !present.includes(k)) && (await uploads()).length === 0 ? true : undefined;
      },
      { timeoutMs: 60_000, intervalMs: 500 },
    );
    // The live snapshot: both objects still there, and it still forks.
    const left = await keys();
    expect(left.filter((k) => k.includes(live.json.snapshot_id))).toHaveLength(2);
    expect((await call('GET', `/snapshots/${live.json.snapshot_id}`)).status).toBe(200);
    expect(await operator.metric('sandbox_operator_snapshots_deleted_total')).toBeGreaterThanOrEqual(2);
    await call('DELETE', `/boxes/${created.json.box_id}`);
  }, 180_000);
});
