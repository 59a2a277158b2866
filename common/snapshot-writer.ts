// Taking a snapshot: a box's /workspace (boxd's plain tar, compressed here with zstd, streamed
// box -> this process -> object store with backpressure, never held whole) plus its env (sealed)
// and metadata, under the layout of common/snapshots.ts. The bridge takes snapshots on request;
// the operator's idle sleep takes them before a box's pod goes. Both go through here, so both
// obey the same limits. Reading one back (restoreWorkspace) undoes the compression here too, so
// boxd only ever sees plain tars, whatever the snapshot's age. The bytes move in a worker thread
// (common/snapshot-worker.ts), which also makes boxd's archive calls.
//
// Why compress here and not in boxd: boxd's CPU is the box's (a quarter of a core is common),
// where even gzip -1 runs at ~50 MB/s; zstd -1 in this process runs at
// ~0.5 GB/s per core with about gzip -1's ratio (bench/results/snapshots.md).
import type { Readable } from 'node:stream';
import type { BackupContext } from './box-context.js';
import type { BoxdClient, BoxdTarget } from './boxd-client.js';
import type { EnvSealer } from './env-seal.js';
import { BridgeError } from './errors.js';
import { PART_SIZE, PARTS_IN_FLIGHT, storeError, type ObjectStore, type UploadPart } from './object-store.js';
import type { RestoreSetup, SnapshotSetup } from './snapshot-worker.js';
import { SnapshotWorker, boxdSettings, sharedSlots, workerCall } from './snapshot-worker-host.js';
import { archiveReadRequest, archiveWriteRequest } from './boxd-archive.js';
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
  /** The directory snapshotted; WORKSPACE unless a test or bench points boxd at another. */
  path?: string | undefined;
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
  const compression = new WorkspaceCompression({
    boxd: r.boxd,
    target: r.target,
    signal: r.signal,
    path: r.path ?? WORKSPACE,
    limits: r.limits,
    maxBytes: r.limits.bytes + UPLOAD_SLACK(r.limits.bytes),
  });
  const workspaceKey = r.store.key(snapshotKey(r.pool, id, WORKSPACE_OBJECT));
  let stored: { bytes: number; sha256: string };
  try {
    // boxd's answer first: a refusal (a tree over the limits, a fence) fails before any upload starts.
    await compression.opened;
    // An archive cut short (boxd ends the response without its final chunk on a failure) fails
    // the worker, and with it the parts and so the upload: a truncated archive is never stored.
    await r.store.uploadParts(workspaceKey, compression.parts(), {
      contentType: 'application/zstd',
      signal: r.signal,
      stop: () => compression.close(new Error('the upload failed')),
    });
    stored = await compression.result;
  } finally {
    compression.close(new Error('the snapshot ended')); // after a failure, releases boxd's stream
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

/**
 * What one snapshot's compression holds at most, whatever the workspace's size: the part slots
 * (PARTS_IN_FLIGHT + 1 parts, shared with the worker) and the worker: its isolate, boxd's socket
 * reads and zstd's output buffers until its GC frees them (external memory, freed only after some
 * tens of MiB of it). Measured: a process's peak RSS over its idle level during its first 210 MB
 * snapshot, +88 to +97 MiB in four runs (bench/results/snapshots.md, Notes). The bridge reserves
 * it from its memory budget before a snapshot starts.
 */
export const COMPRESSION_MEMORY_BYTES = (PARTS_IN_FLIGHT + 1) * PART_SIZE + 64 * 1024 * 1024;

/**
 * boxd's archive of a workspace, read, compressed (zstd, ZSTD_LEVEL), counted and hashed in a
 * worker thread (common/snapshot-worker.ts says why) into parts for the store's uploadParts.
 * The archive is read only as fast as the upload takes the parts. Memory: PARTS_IN_FLIGHT + 1
 * parts, shared with the worker, and the worker (COMPRESSION_MEMORY_BYTES), whatever the
 * workspace's size.
 */
export class WorkspaceCompression {
  /** The compressed size and SHA-256 once every part was produced; rejects with the snapshot's failure. */
  readonly result: Promise<{ bytes: number; sha256: string }>;
  /** Resolves once boxd answered 200 (its archive begins), rejects with its refusal or any failure before. */
  readonly opened: Promise<void>;
  private readonly worker: SnapshotWorker;
  private readonly output: SharedArrayBuffer;
  private readonly ready: Array<{ slot: number; n: number }> = [];
  private finished = false;

  constructor(r: { boxd: BoxdClient; target: BoxdTarget; signal?: AbortSignal | undefined; path: string; limits: { bytes: number; entries: number }; maxBytes: number }) {
    const settings = boxdSettings(r.boxd);
    this.output = sharedSlots((PARTS_IN_FLIGHT + 1) * PART_SIZE);
    // Plain tar: boxd only reads files (sendfile), compression happens in the worker.
    const request = archiveReadRequest(r.target, settings.port, r.path, false, { maxBytes: r.limits.bytes, maxEntries: r.limits.entries });
    const setup: SnapshotSetup = { role: 'snapshot', call: workerCall(request, settings), output: this.output, partBytes: PART_SIZE, maxBytes: r.maxBytes, level: ZSTD_LEVEL };
    let settle!: { resolve: (v: { bytes: number; sha256: string }) => void; reject: (err: Error) => void };
    this.result = new Promise((resolve, reject) => (settle = { resolve, reject }));
    this.result.catch(() => undefined); // read by takeSnapshot only after a complete upload
    let open!: { resolve: () => void; reject: (err: Error) => void };
    this.opened = new Promise((resolve, reject) => (open = { resolve, reject }));
    this.opened.catch(() => undefined);
    this.worker = new SnapshotWorker(
      setup,
      this.output,
      { target: r.target, settings, signal: r.signal },
      (m) => {
        if (m.t === 'open') open.resolve();
        else if (m.t === 'part') this.ready.push({ slot: m.slot, n: m.n });
        else if (m.t === 'done') {
          this.finished = true;
          this.worker.finish();
          settle.resolve({ bytes: m.bytes, sha256: m.sha256 });
        } else if (m.t === 'too-large') this.close(new BridgeError('payload_too_large', `the snapshot is larger than its limit of ${r.maxBytes} bytes`));
      },
      (err) => {
        open.reject(err);
        settle.reject(err);
      },
    );
  }

  /** The compressed parts in order, each on the worker's part slot it was filled in; done() gives the slot back. */
  async *parts(): AsyncGenerator<UploadPart> {
    for (;;) {
      const next = this.ready.shift();
      if (next) {
        yield { data: Buffer.from(this.output, next.slot * PART_SIZE, next.n), done: () => this.worker.post({ t: 'free', slot: next.slot }) };
        continue;
      }
      if (this.worker.failure) throw this.worker.failure;
      if (this.finished) return;
      await this.worker.wait();
    }
  }

  /** Keeps the part slots for the next snapshot; only once the upload no longer reads them. */
  release(): Promise<void> {
    return this.worker.release();
  }

  /** Stops the worker (a no-op once it has finished): parts() waiting on it fails with err. */
  close(err: Error): void {
    this.worker.close(err);
  }
}

/** The restore worker's input slots: the stored bytes are copied into these (a few socket reads each); one is held back until the check. */
const RESTORE_SLOTS = 4;
const RESTORE_SLOT_BYTES = 1024 * 1024;
/**
 * What one restore holds at most: its input slots, the store's stream feeding them, and the worker
 * (its isolate, decompression's output and the socket writes to boxd until its GC frees them).
 * Measured like COMPRESSION_MEMORY_BYTES: +48 to +71 MiB over the idle level during a 210 MB
 * restore (bench/results/snapshots.md, Notes). The bridge reserves it before a restore or wake reads the store.
 */
export const RESTORE_MEMORY_BYTES = RESTORE_SLOTS * RESTORE_SLOT_BYTES + 68 * 1024 * 1024;

export interface RestoreRequest {
  boxd: BoxdClient;
  target: BoxdTarget;
  signal?: AbortSignal | undefined;
  metadata: Pick<SnapshotMetadata, 'compression' | 'sha256' | 'size'>;
  /** The stored workspace object's bytes (the store's stream); consumed or destroyed here. */
  body: Readable;
  /** Where it goes in the box (WORKSPACE) and boxd's limits for the archive. */
  path: string;
  limits: { bytes: number; entries: number };
  /** The directory ends up holding exactly the snapshot (boxd swaps once the whole archive was accepted). */
  replace?: boolean | undefined;
}

/**
 * A stored workspace into the box: its bytes are copied into shared slots here, and a worker
 * thread (common/snapshot-worker.ts) counts and hashes them against the metadata's size and
 * SHA-256, decompresses them (zstd, or gzip for snapshots taken before) and sends boxd the plain
 * tar. The last slot is held back until the check has passed, so on a mismatch boxd's body never
 * ends and boxd, which commits an extraction only once its body has ended cleanly, changes
 * nothing. Resolves with boxd's answer and the stored bytes read.
 */
export async function restoreWorkspace(r: RestoreRequest): Promise<{ written: { path: string; entries: number; bytes: number }; stored: number }> {
  const settings = boxdSettings(r.boxd);
  const input = sharedSlots(RESTORE_SLOTS * RESTORE_SLOT_BYTES);
  const request = archiveWriteRequest(r.target, settings.port, r.path, { maxBytes: r.limits.bytes, maxEntries: r.limits.entries, replace: r.replace });
  const setup: RestoreSetup = {
    role: 'restore',
    call: workerCall(request, settings),
    input,
    inputBytes: RESTORE_SLOT_BYTES,
    compression: r.metadata.compression === 'zstd' ? 'zstd' : 'gzip',
    expect: { size: r.metadata.size, sha256: r.metadata.sha256 },
    chunkBytes: CHUNK_BYTES,
  };
  const free = Array.from({ length: RESTORE_SLOTS }, (_, i) => i);
  let settle!: { resolve: (v: { path: string; entries: number; bytes: number }) => void; reject: (err: Error) => void };
  const written = new Promise<{ path: string; entries: number; bytes: number }>((resolve, reject) => (settle = { resolve, reject }));
  written.catch(() => undefined);
  const worker: SnapshotWorker = new SnapshotWorker(
    setup,
    input,
    { target: r.target, settings, signal: r.signal },
    (m) => {
      if (m.t === 'in-free') free.push(m.slot);
      else if (m.t === 'mismatch') worker.close(new BridgeError('internal_error', 'the stored snapshot does not match its checksum; nothing was restored'));
      else if (m.t === 'written') {
        try {
          settle.resolve(JSON.parse(m.body) as { path: string; entries: number; bytes: number });
          worker.finish();
        } catch {
          worker.close(new BridgeError('internal_error', `box ${r.target.box} answered the restore with something other than JSON`));
        }
      }
    },
    (err) => {
      settle.reject(err);
      r.body.destroy(); // ends a wait for the store's next bytes
    },
  );
  const slot = async (): Promise<number> => {
    for (;;) {
      const s = free.shift();
      if (s !== undefined) return s;
      if (worker.failure) throw worker.failure;
      await worker.wait();
    }
  };
  let stored = 0;
  try {
    let at = await slot();
    let filled = 0;
    for await (const chunk of r.body as AsyncIterable<Buffer>) {
      stored += chunk.length;
      for (let from = 0; from < chunk.length; ) {
        const n = chunk.copy(Buffer.from(input, at * RESTORE_SLOT_BYTES + filled, RESTORE_SLOT_BYTES - filled), 0, from);
        filled += n;
        from += n;
        if (filled < RESTORE_SLOT_BYTES) continue;
        worker.post({ t: 'in', slot: at, n: filled });
        at = await slot();
        filled = 0;
      }
    }
    if (filled > 0) worker.post({ t: 'in', slot: at, n: filled });
    worker.post({ t: 'end' });
    return { written: await written, stored };
  } catch (err) {
    // The worker's failure if it failed (boxd's refusal, the check); else the store's read broke off.
    worker.close(r.signal?.aborted ? (r.signal.reason as Error) : storeError('read', err));
    throw worker.failure ?? err;
  } finally {
    worker.close(new Error('the restore ended'));
    r.body.destroy();
    await worker.release();
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
