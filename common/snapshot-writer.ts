// Taking a snapshot: a box's /workspace (boxd's plain tar, compressed here with zstd, streamed
// box -> this process -> object store with backpressure, never held whole) plus its env (sealed)
// and metadata, under the layout of common/snapshots.ts. The bridge takes snapshots on request;
// the operator's idle sleep takes them before a box's pod goes. Both go through here, so both
// obey the same limits. Reading one back (workspaceReader) undoes the compression here too, so
// boxd only ever sees plain tars, whatever the snapshot's age.
//
// Why compress here and not in boxd: boxd's CPU is the box's (a quarter of a core is common),
// where even gzip -1 runs at ~50 MB/s; zstd -1 in this process runs on libuv's thread pool at
// ~0.5 GB/s per core with about gzip -1's ratio (bench/results/snapshots.md).
import { createHash } from 'node:crypto';
import { Transform, pipeline, type Readable, type TransformCallback } from 'node:stream';
import { constants as zlib, createGunzip, createZstdCompress, createZstdDecompress } from 'node:zlib';
import type { BackupContext } from './box-context.js';
import type { BoxdClient, BoxdTarget } from './boxd-client.js';
import type { EnvSealer } from './env-seal.js';
import { BridgeError } from './errors.js';
import type { ObjectStore } from './object-store.js';
import { indexKey } from './snapshot-index.js';
import { METADATA_OBJECT, WORKSPACE_OBJECT, newSnapshotId, snapshotKey, type SnapshotMetadata } from './snapshots.js';

export const WORKSPACE = '/workspace';
/** Compression's worst case over incompressible data, and tar headers: the upload may exceed the data this much. */
const UPLOAD_SLACK = (bytes: number) => Math.ceil(bytes * 0.01) + 4 * 1024 * 1024;
/** zstd's fastest regular level: compression that keeps up with the disk (docs/snapshots.md). */
const ZSTD_LEVEL = 1;
/** Output chunks of compression and decompression: few large chunks keep the per-chunk costs of streams and hashing small. */
const CHUNK_BYTES = 256 * 1024;

export interface SnapshotRequest {
  boxd: BoxdClient;
  target: BoxdTarget;
  signal: AbortSignal;
  store: ObjectStore;
  sealer: EnvSealer;
  pool: string;
  box: { box_id: string; session_id: string; image: string; cpu: string; memory: string };
  env: Record<string, string>;
  name?: string | undefined;
  createdAt: Date;
  expiresAt: Date;
  /** Data bytes and entries; boxd refuses a larger tree (413) before it sends a byte. */
  limits: { bytes: number; entries: number };
  /** The box's backup context (its record's): kept in the metadata and indexed (common/snapshot-index.ts). */
  context?: BackupContext | null | undefined;
}

/**
 * Streams the workspace into the store and writes the metadata last (the snapshot exists once it
 * is there); resolves with the metadata. A failure at any point leaves no metadata, so nothing
 * half-made is ever listed or restored.
 */
export async function takeSnapshot(r: SnapshotRequest): Promise<SnapshotMetadata> {
  const id = newSnapshotId(r.box.session_id, r.createdAt, r.expiresAt);
  // The store first: one that does not answer fails fast (its deadline), before any byte moves.
  await r.store.check();
  // Plain tar: boxd only reads files (sendfile), compression happens here.
  const tar = await r.boxd.readArchive(r.target, WORKSPACE, false, r.signal, { maxBytes: r.limits.bytes, maxEntries: r.limits.entries });
  const zstd = workspaceCompressor();
  const meter = new Meter({ maxBytes: r.limits.bytes + UPLOAD_SLACK(r.limits.bytes) });
  // pipeline propagates an archive cut short (boxd ends the response without its final chunk on
  // a failure) into the upload, which then fails: a truncated archive is never stored.
  pipeline(tar, zstd, meter, () => undefined);
  const workspaceKey = r.store.key(snapshotKey(r.pool, id, WORKSPACE_OBJECT));
  try {
    await r.store.upload(workspaceKey, meter, { contentType: 'application/zstd', signal: r.signal });
  } finally {
    meter.destroy(); // after a failure, releases boxd's stream too (pipeline)
  }
  const metadata: SnapshotMetadata = {
    version: 1,
    snapshot_id: id.id,
    ...(r.name ? { name: r.name } : {}),
    pool: r.pool,
    ...r.box,
    created_at: id.createdAt.toISOString(),
    expires_at: id.expiresAt.toISOString(),
    compression: 'zstd',
    size: meter.bytes,
    sha256: meter.digest(),
    limits: r.limits,
    ...(r.context ? { context: r.context } : {}),
    env: r.sealer.seal(r.env, id.id),
  };
  // The index marker before the metadata: every snapshot that exists is listed by its context.
  const marker = r.context ? r.store.key(indexKey(r.pool, r.context, id.id)) : undefined;
  try {
    if (marker) await r.store.putJson(marker, { snapshot_id: id.id });
    await r.store.putJson(r.store.key(snapshotKey(r.pool, id, METADATA_OBJECT)), metadata);
  } catch (err) {
    await r.store.delete([workspaceKey, ...(marker ? [marker] : [])]).catch(() => undefined);
    throw err;
  }
  return metadata;
}

/** How a workspace tar is compressed for the store (workspaceReader undoes it). */
export function workspaceCompressor(): Transform {
  return createZstdCompress({
    chunkSize: CHUNK_BYTES,
    params: { [zlib.ZSTD_c_compressionLevel]: ZSTD_LEVEL, [zlib.ZSTD_c_checksumFlag]: 1 },
  });
}

/**
 * A stored workspace as boxd takes it, a plain tar: the stored bytes (body) checked against the
 * metadata's size and digest, then decompressed (zstd, or gzip for snapshots taken before). The
 * check holds the stored stream's last chunk back until it has passed, so on a mismatch the tar
 * fails before it ends, and boxd, which commits an extraction only once its body has ended
 * cleanly, changes nothing. `stored` counts the stored bytes read so far.
 */
export function workspaceReader(metadata: Pick<SnapshotMetadata, 'compression' | 'sha256' | 'size'>, body: Readable): { tar: Readable; stored: Meter } {
  const stored = new Meter({ sha256: metadata.sha256, size: metadata.size });
  const tar = metadata.compression === 'zstd' ? createZstdDecompress({ chunkSize: CHUNK_BYTES }) : createGunzip({ chunkSize: CHUNK_BYTES });
  pipeline(body, stored, tar, () => undefined);
  return { tar, stored };
}

/**
 * Counts and hashes the bytes passing through, failing past maxBytes. Given the expected digest
 * and size it verifies them, holding the last chunk back until it has: on a mismatch the stream
 * fails before its end reaches boxd, which then sees an incomplete body and changes nothing.
 */
export class Meter extends Transform {
  bytes = 0;
  private readonly hash = createHash('sha256');
  private held: Buffer | undefined;
  private hex: string | undefined;

  constructor(private readonly expect: { sha256?: string; size?: number; maxBytes?: number } = {}) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    this.bytes += chunk.length;
    if (this.expect.maxBytes !== undefined && this.bytes > this.expect.maxBytes) {
      return done(new BridgeError('payload_too_large', `the snapshot is larger than its limit of ${this.expect.maxBytes} bytes`));
    }
    this.hash.update(chunk);
    if (this.expect.sha256 === undefined) return done(null, chunk);
    const previous = this.held;
    this.held = chunk;
    done(null, previous);
  }

  override _flush(done: TransformCallback): void {
    this.hex = this.hash.digest('hex');
    if (this.expect.sha256 === undefined) return done();
    if (this.hex !== this.expect.sha256 || this.bytes !== this.expect.size) {
      return done(new BridgeError('internal_error', 'the stored snapshot does not match its checksum; nothing was restored'));
    }
    done(null, this.held);
  }

  digest(): string {
    return this.hex ?? this.hash.copy().digest('hex');
  }
}

/** A pool's snapshot limits now (data bytes, entries). */
export function snapshotLimits(spec: { box: { workspaceSizeLimit: string }; snapshots: { maxBytes?: string; maxEntries: number } }, parse: (q: string) => number) {
  return { bytes: parse(spec.snapshots.maxBytes ?? spec.box.workspaceSizeLimit), entries: spec.snapshots.maxEntries };
}

/** What a restore of this snapshot accepts: the pool's limits now, or the ones it was taken under if larger. */
export function restoreLimits(metadata: Pick<SnapshotMetadata, 'limits'>, now: { bytes: number; entries: number }) {
  return { bytes: Math.max(now.bytes, metadata.limits?.bytes ?? 0), entries: Math.max(now.entries, metadata.limits?.entries ?? 0) };
}
