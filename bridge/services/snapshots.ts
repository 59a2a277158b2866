// Snapshots: a box's /workspace (boxd's gzip tar, streamed box -> bridge -> object store with
// backpressure, never held whole) plus its env (sealed, env-seal.ts) and metadata, in the object
// store under the layout of common/snapshots.ts. Restore = fork: a new box gets the workspace and
// env. A delete with a final snapshot deletes the box only once the snapshot is stored.
// Free of Express types.
import { createHash } from 'node:crypto';
import { Transform, pipeline, type Readable, type TransformCallback } from 'node:stream';
import { BridgeError } from '../../common/errors.js';
import { sessionHash } from '../../common/labels.js';
import type { ObjectStore } from '../../common/object-store.js';
import { parseQuantity } from '../../common/quantity.js';
import {
  METADATA_OBJECT,
  WORKSPACE_OBJECT,
  newSnapshotId,
  parseSnapshotId,
  sessionPrefix,
  snapshotKey,
  type SnapshotId,
  type SnapshotMetadata,
} from '../../common/snapshots.js';
import { WORKSPACE, boxStatus } from '../box-pod.js';
import type { BoxdClient } from '../../common/boxd-client.js';
import type { BoxRecords } from '../../common/box-records.js';
import type { PolicySource } from '../kube/policy.js';
import type { CreateBoxRequest } from '../schemas.js';
import type { BoxConnector, CallOptions } from './box-connector.js';
import type { BoxService } from './boxes.js';
import type { EnvService } from './env.js';
import type { EnvSealer } from '../../common/env-seal.js';

const MiB = 1024 * 1024;
/** Snapshots read at once to answer a listing. */
const LIST_CONCURRENCY = 8;

export interface SnapshotServiceDeps {
  connector: BoxConnector;
  boxd: BoxdClient;
  boxes: Pick<BoxService, 'create' | 'delete'>;
  env: Pick<EnvService, 'merge'>;
  records: Pick<BoxRecords, 'readEnv'>;
  policy: PolicySource;
  /** Undefined when no object store is configured: every route then answers 501. */
  store: ObjectStore | undefined;
  sealer: EnvSealer | undefined;
  /** Most entries a restore may write into a box. */
  maxEntries: number;
  onDone?: (operation: 'create' | 'restore', outcome: 'ok' | 'error', seconds: number, bytes: number) => void;
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
}

export class SnapshotService {
  private readonly now: () => Date;

  constructor(private readonly deps: SnapshotServiceDeps) {
    this.now = deps.now ?? (() => new Date());
  }

  /** Snapshots the box: its workspace, env and metadata. 201 body. */
  async create(boxId: string, req: { ttlSeconds?: number; name?: string } = {}, options: CallOptions = {}): Promise<SnapshotView> {
    const { store, sealer } = this.configured();
    const retention = this.deps.policy.current().snapshots.retentionSeconds;
    const started = performance.now();
    let bytes = 0;
    try {
      const snapshot = await this.deps.connector.call(boxId, async ({ pod, target, signal }): Promise<SnapshotView> => {
        const box = boxStatus(pod, this.now());
        const createdAt = this.now();
        // A request may ask for a shorter life than the pool's retention, never a longer one.
        const ttl = Math.min(req.ttlSeconds ?? retention, retention);
        const id = newSnapshotId(box.session_id, createdAt, new Date(createdAt.getTime() + ttl * 1000));
        // The env and the store first: a box without its Secret, or a store that does not
        // answer, fails fast (within the store's deadline), before any byte moves.
        const env = await this.deps.records.readEnv(pod, boxId);
        await store.check();
        const tar = await this.deps.boxd.readArchive(target, WORKSPACE, true, signal);
        const meter = new Meter();
        // pipeline propagates an archive cut short (boxd ends the response without its final
        // chunk on a failure) into the upload, which then fails: a truncated archive is never stored.
        pipeline(tar, meter, () => undefined);
        const workspaceKey = store.key(snapshotKey(this.pool, id, WORKSPACE_OBJECT));
        try {
          await store.upload(workspaceKey, meter, { contentType: 'application/gzip', signal });
        } finally {
          meter.destroy(); // after a failure, releases boxd's stream too (pipeline)
        }
        bytes = meter.bytes;
        const metadata: SnapshotMetadata = {
          version: 1,
          snapshot_id: id.id,
          ...(req.name ? { name: req.name } : {}),
          pool: this.pool,
          box_id: box.box_id,
          session_id: box.session_id,
          image: box.image,
          cpu: box.cpu,
          memory: box.memory,
          created_at: id.createdAt.toISOString(),
          expires_at: id.expiresAt.toISOString(),
          size: meter.bytes,
          sha256: meter.digest(),
          env: sealer.seal(env, id.id),
        };
        try {
          // Written last: the snapshot exists (is listed, restorable, confirmed) once this is stored.
          await store.putJson(store.key(snapshotKey(this.pool, id, METADATA_OBJECT)), metadata);
        } catch (err) {
          await store.delete([workspaceKey]).catch(() => undefined);
          throw err;
        }
        return view(metadata);
      }, undefined, options);
      this.deps.onDone?.('create', 'ok', (performance.now() - started) / 1000, bytes);
      return snapshot;
    } catch (err) {
      this.deps.onDone?.('create', 'error', (performance.now() - started) / 1000, bytes);
      throw err;
    }
  }

  /** The session's snapshots, newest first. */
  async list(sessionId: string, limit: number): Promise<{ snapshots: SnapshotView[] }> {
    const { store } = this.configured();
    const ids: SnapshotId[] = [];
    for await (const o of store.list(store.key(sessionPrefix(this.pool, sessionHash(sessionId))))) {
      if (!o.key.endsWith(`/${METADATA_OBJECT}`)) continue;
      const id = parseSnapshotId(o.key.split('/').at(-2) ?? '');
      if (id) ids.push(id);
    }
    ids.sort((a, b) => b.createdAt.getTime() - a.createdAt.getTime() || b.id.localeCompare(a.id));
    const wanted = ids.slice(0, limit);
    const found: Array<SnapshotView | undefined> = new Array(wanted.length);
    let next = 0;
    const worker = async () => {
      while (next < wanted.length) {
        const i = next++;
        const metadata = await store.getJson<SnapshotMetadata>(store.key(snapshotKey(this.pool, wanted[i]!, METADATA_OBJECT)));
        // Deleted between the listing and the read: simply not listed.
        found[i] = metadata && metadata.session_id === sessionId ? view(metadata) : undefined;
      }
    };
    await Promise.all(Array.from({ length: Math.min(LIST_CONCURRENCY, wanted.length) }, worker));
    return { snapshots: found.filter((s): s is SnapshotView => s !== undefined) };
  }

  async get(snapshotId: string): Promise<SnapshotView> {
    return view(await this.metadata(snapshotId));
  }

  async delete(snapshotId: string): Promise<{ snapshot_id: string; deleted: true }> {
    await this.metadata(snapshotId); // 400 / 404 first
    await this.discard(snapshotId);
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

  /** Restores a snapshot's workspace and env into an existing box (for fork, and for wake). */
  async restoreInto(boxId: string, snapshotId: string): Promise<void> {
    const metadata = await this.metadata(snapshotId);
    await this.restore(boxId, metadata, this.configured().sealer.open(metadata.env, metadata.snapshot_id));
  }

  /** Restores a snapshot's workspace into a box being woken (its env is in its record already). */
  async restoreWorkspace(boxId: string, snapshotId: string): Promise<void> {
    await this.restore(boxId, await this.metadata(snapshotId), {}, { internal: true });
  }

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
    await store.delete([store.key(snapshotKey(this.pool, id, WORKSPACE_OBJECT))]);
  }

  /** Whether snapshots are configured (idle sleep needs them). */
  get available(): boolean {
    return Boolean(this.deps.store && this.deps.sealer);
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

  private async restore(boxId: string, metadata: SnapshotMetadata, env: Record<string, string>, options: CallOptions = {}): Promise<void> {
    const { store } = this.configured();
    const id = parseSnapshotId(metadata.snapshot_id)!;
    const maxBytes = parseQuantity(this.deps.policy.current().box.workspaceSizeLimit);
    const started = performance.now();
    let bytes = 0;
    try {
      await this.deps.connector.call(boxId, async ({ target, signal }) => {
        const object = await store.getStream(store.key(snapshotKey(this.pool, id, WORKSPACE_OBJECT)), signal);
        if (!object) throw new BridgeError('not_found', `snapshot ${metadata.snapshot_id} not found (deleted while restoring)`);
        const check = new Meter(metadata.sha256, metadata.size);
        pipeline(object.body as Readable, check, () => undefined);
        try {
          await this.deps.boxd.writeArchive(target, WORKSPACE, check, { maxBytes, maxEntries: this.deps.maxEntries, contentLength: metadata.size, signal });
        } finally {
          check.destroy(); // after a refusal, releases the store's stream too (pipeline)
        }
        bytes = check.bytes;
      }, undefined, options);
      // Through the env service: the box's Secret first (durable), then boxd.
      if (Object.keys(env).length > 0) await this.deps.env.merge(boxId, env);
      this.deps.onDone?.('restore', 'ok', (performance.now() - started) / 1000, bytes);
    } catch (err) {
      this.deps.onDone?.('restore', 'error', (performance.now() - started) / 1000, bytes);
      throw err;
    }
  }

  private async metadata(snapshotId: string): Promise<SnapshotMetadata> {
    const { store } = this.configured();
    const id = parseSnapshotId(snapshotId);
    if (!id) throw new BridgeError('invalid_request', `"${snapshotId}" is not a snapshot id`);
    const metadata = await store.getJson<SnapshotMetadata>(store.key(snapshotKey(this.pool, id, METADATA_OBJECT)));
    if (!metadata || metadata.snapshot_id !== snapshotId) throw new BridgeError('not_found', `snapshot ${snapshotId} not found`);
    return metadata;
  }

  private get pool(): string {
    return this.deps.policy.poolName;
  }

  private configured(): { store: ObjectStore; sealer: EnvSealer } {
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
  };
}

/**
 * Counts and hashes the bytes passing through. Given the expected digest and size it verifies
 * them, holding the last chunk back until it has: on a mismatch the stream fails before its end
 * reaches boxd, which then sees an incomplete body and changes nothing.
 */
class Meter extends Transform {
  bytes = 0;
  private readonly hash = createHash('sha256');
  private held: Buffer | undefined;
  private hex: string | undefined;

  constructor(
    private readonly expectedSha256?: string,
    private readonly expectedSize?: number,
  ) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    this.bytes += chunk.length;
    this.hash.update(chunk);
    if (this.expectedSha256 === undefined) return done(null, chunk);
    const previous = this.held;
    this.held = chunk;
    done(null, previous);
  }

  override _flush(done: TransformCallback): void {
    this.hex = this.hash.digest('hex');
    if (this.expectedSha256 === undefined) return done();
    if (this.hex !== this.expectedSha256 || this.bytes !== this.expectedSize) {
      return done(new BridgeError('internal_error', 'the stored snapshot does not match its checksum; nothing was restored'));
    }
    done(null, this.held);
  }

  digest(): string {
    return this.hex ?? this.hash.copy().digest('hex');
  }
}
