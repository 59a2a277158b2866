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
import { Worker } from 'node:worker_threads';
import { constants as zlib, createGunzip, createZstdCompress, createZstdDecompress } from 'node:zlib';
import type { BackupContext } from './box-context.js';
import type { BoxdClient, BoxdTarget } from './boxd-client.js';
import type { EnvSealer } from './env-seal.js';
import { BridgeError } from './errors.js';
import { PART_SIZE, PARTS_IN_FLIGHT, type ObjectStore, type UploadPart } from './object-store.js';
import type { CompressSetup, FromCompressor, ToCompressor } from './snapshot-compress-worker.js';
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
  const compression = new WorkspaceCompression(r.limits.bytes + UPLOAD_SLACK(r.limits.bytes));
  const workspaceKey = r.store.key(snapshotKey(r.pool, id, WORKSPACE_OBJECT));
  let stored: { bytes: number; sha256: string };
  // An archive cut short (boxd ends the response without its final chunk on a failure) fails
  // the feed, and with it the parts and so the upload: a truncated archive is never stored.
  const fed = compression.feed(tar);
  fed.catch(() => undefined); // its failure reaches the upload through the parts
  try {
    await r.store.uploadParts(workspaceKey, compression.parts(), {
      contentType: 'application/zstd',
      signal: r.signal,
      stop: () => compression.close(new Error('the upload failed')),
    });
    await fed;
    stored = await compression.result;
  } finally {
    compression.close(new Error('the snapshot ended'));
    tar.destroy(); // after a failure, releases boxd's stream
    await fed.catch(() => undefined); // no longer copying into the input slots
    await compression.release();
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
    size: stored.bytes,
    sha256: stored.sha256,
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

/** The compressor's input slots: boxd's tar is copied into these (a few socket reads each). */
const INPUT_SLOTS = 3;
const INPUT_BYTES = 1024 * 1024;
/**
 * What one snapshot's compression holds at most, whatever the workspace's size: the shared slots
 * (INPUT_SLOTS of INPUT_BYTES and PARTS_IN_FLIGHT + 1 parts) and the worker (its isolate, and
 * zstd's output buffers until its GC frees them: ~35 MiB measured, bench/results/snapshots.md).
 * The bridge reserves it from its memory budget before a snapshot starts.
 */
export const COMPRESSION_MEMORY_BYTES = INPUT_SLOTS * INPUT_BYTES + (PARTS_IN_FLIGHT + 1) * PART_SIZE + 48 * 1024 * 1024;
/** The slots of the last compression that ended, for the next one within SPARE_SLOTS_MS. */
let spareSlots: { input: SharedArrayBuffer; output: SharedArrayBuffer } | undefined;
let spareTimer: NodeJS.Timeout | undefined;
const SPARE_SLOTS_MS = 30_000;
const WORKER_FILE = new URL(`./snapshot-compress-worker.${import.meta.url.endsWith('.ts') ? 'ts' : 'js'}`, import.meta.url);

/**
 * A workspace tar compressed (zstd, ZSTD_LEVEL), counted and hashed in a worker thread
 * (common/snapshot-compress-worker.ts says why) into parts for the store's uploadParts. Memory:
 * INPUT_SLOTS of INPUT_BYTES and PARTS_IN_FLIGHT + 1 parts, shared with the worker, the worker's
 * isolate and zstd's output buffers until the worker's GC frees them (~35 MiB), whatever the
 * workspace's size; boxd's tar is read only as fast as the upload takes the parts.
 */
export class WorkspaceCompression {
  /** The compressed size and SHA-256 once every part was produced; rejects with the compression's failure. */
  readonly result: Promise<{ bytes: number; sha256: string }>;
  private readonly worker: Worker;
  private readonly input: SharedArrayBuffer;
  private readonly output: SharedArrayBuffer;
  private readonly freeInputs: number[] = [];
  private readonly ready: Array<{ slot: number; n: number }> = [];
  private finished = false;
  private failure: Error | undefined;
  private readonly settle: { resolve: (v: { bytes: number; sha256: string }) => void; reject: (err: Error) => void };
  /** feed() and parts() waiting for the worker. */
  private waiting: Array<() => void> = [];

  constructor(maxBytes: number) {
    const slots = spareSlots ?? { input: new SharedArrayBuffer(INPUT_SLOTS * INPUT_BYTES), output: new SharedArrayBuffer((PARTS_IN_FLIGHT + 1) * PART_SIZE) };
    spareSlots = undefined;
    this.input = slots.input;
    this.output = slots.output;
    for (let i = 0; i < INPUT_SLOTS; i++) this.freeInputs.push(i);
    const setup: CompressSetup = { input: this.input, inputBytes: INPUT_BYTES, output: this.output, partBytes: PART_SIZE, maxBytes, level: ZSTD_LEVEL };
    // A small heap: with the default's, the profile script's peak RSS was 248 MiB instead of 200.
    // (zstd's output buffers are external memory: V8 frees them after ~35 MiB whatever this.)
    this.worker = new Worker(WORKER_FILE, { workerData: setup, resourceLimits: { maxYoungGenerationSizeMb: 1, maxOldGenerationSizeMb: 64 } });
    let settle!: WorkspaceCompression['settle'];
    this.result = new Promise((resolve, reject) => (settle = { resolve, reject }));
    this.result.catch(() => undefined); // read by takeSnapshot only after a complete upload
    this.settle = settle;
    const fail = (err: Error) => this.close(err);
    this.worker.on('message', (m: FromCompressor) => {
      if (m.t === 'in-free') this.freeInputs.push(m.slot);
      else if (m.t === 'part') this.ready.push({ slot: m.slot, n: m.n });
      else if (m.t === 'done') {
        this.finished = true;
        this.settle.resolve({ bytes: m.bytes, sha256: m.sha256 });
        void this.worker.terminate();
      } else if (m.t === 'too-large') fail(new BridgeError('payload_too_large', `the snapshot is larger than its limit of ${maxBytes} bytes`));
      else fail(new BridgeError('internal_error', `compressing the snapshot failed: ${m.message}`));
      this.notify();
    });
    this.worker.on('error', (err) => fail(err));
    this.worker.on('exit', () => fail(new Error('the snapshot compressor stopped')));
  }

  /** Copies the tar into the input slots, each handed to the worker once full; then ends it. Rejects (and fails the parts) if the tar fails. */
  async feed(tar: Readable): Promise<void> {
    try {
      let slot = await this.freeInput();
      let filled = 0;
      for await (const chunk of tar as AsyncIterable<Buffer>) {
        for (let at = 0; at < chunk.length; ) {
          const n = chunk.copy(Buffer.from(this.input, slot * INPUT_BYTES + filled, INPUT_BYTES - filled), 0, at);
          filled += n;
          at += n;
          if (filled < INPUT_BYTES) continue;
          this.post({ t: 'in', slot, n: filled });
          slot = await this.freeInput();
          filled = 0;
        }
      }
      if (filled > 0) this.post({ t: 'in', slot, n: filled });
      this.post({ t: 'end' });
    } catch (err) {
      this.close(err as Error);
      throw err;
    }
  }

  /** The compressed parts in order, each on the worker's part slot it was filled in; done() gives the slot back. */
  async *parts(): AsyncGenerator<UploadPart> {
    for (;;) {
      const next = this.ready.shift();
      if (next) {
        yield { data: Buffer.from(this.output, next.slot * PART_SIZE, next.n), done: () => this.post({ t: 'free', slot: next.slot }) };
        continue;
      }
      if (this.failure) throw this.failure;
      if (this.finished) return;
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    }
  }

  /**
   * Once the worker has stopped, keeps the slots a while for the next compression: freed only
   * by a full GC of the caller's heap, which is now rare, the slots of one snapshot after
   * another would pile up (bench: the bridge's peak RSS). Call it only once nothing reads or
   * fills them any more: the feed and the upload have ended.
   */
  async release(): Promise<void> {
    await this.worker.terminate();
    if (spareSlots) return;
    spareSlots = { input: this.input, output: this.output };
    clearTimeout(spareTimer);
    spareTimer = setTimeout(() => (spareSlots = undefined), SPARE_SLOTS_MS).unref();
  }

  /** Stops the worker (a no-op once it has finished): a feed or parts waiting on it fail with err. */
  close(err: Error): void {
    if (this.finished || this.failure) return;
    this.failure = err;
    this.settle.reject(err);
    void this.worker.terminate();
    this.notify();
  }

  private async freeInput(): Promise<number> {
    for (;;) {
      const slot = this.freeInputs.shift();
      if (slot !== undefined) return slot;
      if (this.failure) throw this.failure;
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    }
  }

  private post(m: ToCompressor): void {
    if (!this.failure) this.worker.postMessage(m);
  }

  private notify(): void {
    const waiting = this.waiting;
    this.waiting = [];
    for (const wake of waiting) wake();
  }
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
