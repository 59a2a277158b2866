// Snapshots: a box's /workspace (boxd's tar, zstd-compressed here, streamed box -> bridge -> object store with
// backpressure, never held whole) plus its env (sealed, common/env-seal.ts) and metadata (common/snapshot-writer.ts), in the object
// store under the layout of common/snapshots.ts. Restore = fork: a new box gets the workspace and
// env. A delete with a final snapshot deletes the box only once the snapshot is stored.
// Free of Express types.
import { backupContextOf, type BackupContext } from '../../common/box-context.js';
import { envOf } from '../../common/box-records.js';
import { sessionHash } from '../../common/labels.js';
import { parseQuantity } from '../../common/quantity.js';
import { METADATA_OBJECT, parseSnapshotId, sessionPrefix, snapshotKey, type SnapshotId, type SnapshotMetadata } from '../../common/snapshots.js';
import { contextMatches, indexKey, indexQuery, indexedSnapshot, type ContextFilter } from '../../common/snapshot-index.js';
import { COMPRESSION_MEMORY_BYTES, snapshotLimits, takeSnapshot } from '../../common/snapshot-writer.js';
import type { ByteBudget } from './byte-budget.js';
import { boxStatus } from '../box-view.js';
import type { BoxdClient } from '../../common/boxd-client.js';
import type { BoxRecords } from '../../common/box-records.js';
import type { PolicySource } from '../kube/policy.js';
import type { CreateBoxRequest } from '../schemas.js';
import type { BoxConnector } from './box-connector.js';
import type { SnapshotStore } from './snapshot-store.js';
import type { BoxService } from './boxes.js';
import type { EnvService } from './env.js';

const MiB = 1024 * 1024;
/** Snapshots read at once to answer a listing. */
const LIST_CONCURRENCY = 8;

export interface SnapshotServiceDeps {
  connector: BoxConnector;
  boxd: BoxdClient;
  /** The store side: metadata, restore, discard (snapshot-store.ts). */
  snapshots: SnapshotStore;
  boxes: Pick<BoxService, 'create' | 'delete'>;
  env: Pick<EnvService, 'merge'>;
  records: Pick<BoxRecords, 'readOwn'>;
  policy: PolicySource;
  /** The replica's memory budget: a snapshot's compression holds COMPRESSION_MEMORY_BYTES of it while it runs. */
  budget: Pick<ByteBudget, 'reserve'>;
  onDone?: (operation: 'create', outcome: 'ok' | 'error', seconds: number, bytes: number) => void;
  now?: () => Date;
}

/** What the API says about a snapshot (never its env). */
export interface SnapshotView {
  snapshot_id: string;
  box_id: string;
  session_id: string;
  size: number;
  created_at: string;
  expires_at: string;
  name?: string;
  image: string;
  cpu: string;
  memory: string;
  /** The box's backup context when it was taken (PUT /boxes/{id}/context), or null. */
  context: BackupContext | null;
}

/** GET /snapshots: a box session's snapshots, or those of a backup context (a tenant, narrowed by environment and/or session). */
export type SnapshotQuery = { limit: number } & ({ tenant_id?: undefined; session_id: string } | ContextFilter);

export class SnapshotService {
  private readonly now: () => Date;

  constructor(private readonly deps: SnapshotServiceDeps) {
    this.now = deps.now ?? (() => new Date());
  }

  /** Snapshots the box: its workspace, env and metadata. 201 body. */
  async create(boxId: string, req: { ttlSeconds?: number; name?: string } = {}): Promise<SnapshotView> {
    const { store, sealer } = this.configured();
    const spec = this.deps.policy.current();
    // Before anything starts: a replica out of memory for it answers 503 at once, the box untouched.
    const hold = this.deps.budget.reserve(COMPRESSION_MEMORY_BYTES, 'snapshot', 'a snapshot');
    const started = performance.now();
    let bytes = 0;
    try {
      const snapshot = await this.deps.connector.call(boxId, async ({ pod, target, signal }): Promise<SnapshotView> => {
        const box = boxStatus(pod, this.now());
        const createdAt = this.now();
        // A request may ask for a shorter life than the pool's retention, never a longer one.
        const ttl = Math.min(req.ttlSeconds ?? spec.snapshots.retentionSeconds, spec.snapshots.retentionSeconds);
        // The record first (env, backup context): a box without its record fails before any byte moves.
        const record = await this.deps.records.readOwn(pod, boxId);
        const metadata = await takeSnapshot({
          boxd: this.deps.boxd,
          target,
          signal,
          store,
          sealer,
          pool: this.pool,
          box: { box_id: box.box_id, session_id: box.session_id, image: box.image, cpu: box.cpu, memory: box.memory },
          env: envOf(record),
          context: backupContextOf(record),
          name: req.name,
          createdAt,
          expiresAt: new Date(createdAt.getTime() + ttl * 1000),
          limits: snapshotLimits(spec, parseQuantity),
        });
        bytes = metadata.size;
        return view(metadata);
      });
      this.deps.onDone?.('create', 'ok', (performance.now() - started) / 1000, bytes);
      return snapshot;
    } catch (err) {
      this.deps.onDone?.('create', 'error', (performance.now() - started) / 1000, bytes);
      throw err;
    } finally {
      hold.release();
    }
  }

  /**
   * Snapshots newest first: a box session's (its key prefix), or a backup context's (its index,
   * common/snapshot-index.ts): either way one listing of exactly the keys wanted, then the
   * metadata of at most `limit` of them.
   */
  async list(q: SnapshotQuery): Promise<{ snapshots: SnapshotView[] }> {
    const { store } = this.configured();
    const ids: SnapshotId[] = [];
    if (q.tenant_id === undefined) {
      for await (const o of store.list(store.key(sessionPrefix(this.pool, sessionHash(q.session_id))))) {
        if (!o.key.endsWith(`/${METADATA_OBJECT}`)) continue;
        const id = parseSnapshotId(o.key.split('/').at(-2) ?? '');
        if (id) ids.push(id);
      }
    } else {
      const query = indexQuery(this.pool, q);
      for await (const o of store.list(store.key(query.prefix))) {
        const id = indexedSnapshot(o.key, query);
        if (id) ids.push(id);
      }
    }
    ids.sort((a, b) => b.createdAt.getTime() - a.createdAt.getTime() || b.id.localeCompare(a.id));
    const wanted = (m: SnapshotMetadata) => (q.tenant_id === undefined ? m.session_id === q.session_id : contextMatches(m.context, q));
    // Markers whose snapshot is gone (deleted, never completed) are skipped: read on until `limit` are found.
    const found: SnapshotView[] = [];
    for (let at = 0; at < ids.length && found.length < q.limit; at += LIST_CONCURRENCY) {
      const batch = await Promise.all(
        ids.slice(at, at + LIST_CONCURRENCY).map((id) => store.getJson<SnapshotMetadata>(store.key(snapshotKey(this.pool, id, METADATA_OBJECT)))),
      );
      for (const m of batch) if (m && found.length < q.limit && wanted(m)) found.push(view(m));
    }
    return { snapshots: found };
  }

  async get(snapshotId: string): Promise<SnapshotView> {
    return view(await this.metadata(snapshotId));
  }

  async delete(snapshotId: string): Promise<{ snapshot_id: string; deleted: true }> {
    const metadata = await this.metadata(snapshotId); // 400 / 404 first
    await this.discard(snapshotId);
    // Its index marker after it (retention removes one left by a failure here).
    if (metadata.context) await this.configured().store.delete([this.configured().store.key(indexKey(this.pool, metadata.context, snapshotId))]).catch(() => undefined);
    return { snapshot_id: snapshotId, deleted: true };
  }

  /**
   * Restore = fork: a new box (the request's fields, defaulting to the snapshot's image, cpu and
   * memory) with the snapshot's workspace and env (the request's env wins). The snapshot is
   * read and its env opened before the box is made; a restore that fails deletes the new box.
   * A create repeated with the same Idempotency-Key gets the same box and restores into it again.
   */
  async fork(req: CreateBoxRequest & { snapshot_id: string }, idempotencyKey?: string) {
    const metadata = await this.metadata(req.snapshot_id);
    const env = this.configured().sealer.open(metadata.env, metadata.snapshot_id);
    const { snapshot_id: snapshotId, ...create } = req;
    const box = await this.deps.boxes.create(
      {
        ...create,
        image: create.image ?? metadata.image,
        cpu: create.cpu ?? parseQuantity(metadata.cpu),
        memory: create.memory ?? Math.max(1, Math.round(parseQuantity(metadata.memory) / MiB)),
      },
      idempotencyKey,
    );
    try {
      await this.restore(box.box_id, metadata, { ...env, ...create.env });
    } catch (err) {
      await this.deps.boxes.delete(box.box_id).catch(() => undefined);
      throw err;
    }
    return { ...box, snapshot_id: snapshotId };
  }

  /**
   * Restores a snapshot's workspace into a running box (the platform's restoreWorkspaceBackup):
   * /workspace becomes exactly the snapshot's — boxd takes the whole archive before anything
   * there changes, then swaps. The box keeps its id, env, processes and everything outside
   * /workspace (a fork from the snapshot is the way to get its env too).
   */
  async restoreInPlace(boxId: string, snapshotId: string): Promise<{ box_id: string; snapshot_id: string; entries: number; bytes: number }> {
    const metadata = await this.metadata(snapshotId);
    const written = await this.deps.connector.call(boxId, (call) => this.deps.snapshots.restoreInto(call, metadata, { replace: true }));
    return { box_id: boxId, snapshot_id: snapshotId, entries: written.entries, bytes: written.bytes };
  }

  /**
   * Snapshots the box, then deletes it: the delete is sent only once the snapshot is stored, so
   * a store that fails leaves the box as it was (and the caller gets the store's error).
   */
  async deleteWithSnapshot(boxId: string) {
    const snapshot = await this.create(boxId);
    return { ...(await this.deps.boxes.delete(boxId)), snapshot };
  }

  /** Whether deletes of the pool's boxes take a final snapshot unless the request says otherwise. */
  snapshotOnDelete(): boolean {
    return this.deps.policy.current().snapshots.onDelete;
  }

  private metadata(snapshotId: string): Promise<SnapshotMetadata> {
    return this.deps.snapshots.metadata(snapshotId);
  }

  private get pool(): string {
    return this.deps.snapshots.pool;
  }

  private configured() {
    return this.deps.snapshots.configured();
  }

  private async restore(boxId: string, metadata: SnapshotMetadata, env: Record<string, string>): Promise<void> {
    await this.deps.connector.call(boxId, (call) => this.deps.snapshots.restoreInto(call, metadata));
    // Through the env service: the box's Secret first (durable), then boxd.
    if (Object.keys(env).length > 0) await this.deps.env.merge(boxId, env);
  }

  private discard(snapshotId: string): Promise<void> {
    return this.deps.snapshots.discard(snapshotId);
  }
}

function view(m: SnapshotMetadata): SnapshotView {
  return {
    snapshot_id: m.snapshot_id,
    box_id: m.box_id,
    session_id: m.session_id,
    size: m.size,
    created_at: m.created_at,
    expires_at: m.expires_at,
    ...(m.name ? { name: m.name } : {}),
    image: m.image,
    cpu: m.cpu,
    memory: m.memory,
    context: m.context ?? null,
  };
}
