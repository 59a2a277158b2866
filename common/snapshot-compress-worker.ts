// The compressing half of taking a snapshot (common/snapshot-writer.ts, takeSnapshot), in a worker
// thread: zstd, the count and the SHA-256 of the compressed bytes, and the store's parts. The
// caller copies boxd's tar into input slots of one SharedArrayBuffer, this worker fills part
// slots of another, and the upload sends the part slots as they are: zstd's output never becomes
// a buffer of the caller's heap. Why a thread: the caller's heap is large (the bridge's watch
// caches, the S3 client), and there the buffers allocated per chunk (zstd's output, boxd's socket
// reads) started a full mark-compact of that heap every few MiB: 36-45 per 200 MiB snapshot, V8's
// GC threads a third of the process's CPU (perf; bench/results/snapshots.md, Notes). This
// isolate's heap stays a few MiB, where the same garbage costs scavenges only; the caller keeps
// the socket reads (about half the mark-compacts). Only node: modules here: the file also runs
// as it is (type-stripped) under the unit tests.
import { createHash } from 'node:crypto';
import { parentPort, workerData } from 'node:worker_threads';
import { constants as zlib, createZstdCompress } from 'node:zlib';

export interface CompressSetup {
  /** Input slots of inputBytes each, filled by the caller. */
  input: SharedArrayBuffer;
  inputBytes: number;
  /** Part slots of partBytes each, filled here, sent by the caller. */
  output: SharedArrayBuffer;
  partBytes: number;
  /** More compressed bytes than this fail the snapshot (413). */
  maxBytes: number;
  level: number;
}

export type ToCompressor = { t: 'in'; slot: number; n: number } | { t: 'end' } | { t: 'free'; slot: number };
export type FromCompressor =
  | { t: 'in-free'; slot: number }
  | { t: 'part'; slot: number; n: number }
  | { t: 'done'; bytes: number; sha256: string }
  | { t: 'too-large' }
  | { t: 'error'; message: string };

const setup = workerData as CompressSetup;
const port = parentPort!;
const post = (m: FromCompressor) => port.postMessage(m);
const hash = createHash('sha256');
// Output chunks as large as zstd's own blocks allow: fewer callbacks and copies per byte.
const zstd = createZstdCompress({
  chunkSize: 1024 * 1024,
  params: { [zlib.ZSTD_c_compressionLevel]: setup.level, [zlib.ZSTD_c_checksumFlag]: 1 },
});
const free = Array.from({ length: setup.output.byteLength / setup.partBytes }, (_, i) => i);
let slot: number | undefined;
let filled = 0;
let bytes = 0;
let stash: Buffer | undefined; // the rest of an output chunk that found no free part slot
let failed = false;

/** Copies c into part slots, posting each full one; false when it ran out of slots (the rest stashed). */
function take(c: Buffer): boolean {
  for (let at = 0; at < c.length; ) {
    if (slot === undefined) {
      slot = free.shift();
      if (slot === undefined) {
        stash = c.subarray(at);
        return false;
      }
      filled = 0;
    }
    const view = Buffer.from(setup.output, slot * setup.partBytes + filled, setup.partBytes - filled);
    const n = c.copy(view, 0, at);
    filled += n;
    at += n;
    if (filled === setup.partBytes) {
      post({ t: 'part', slot, n: filled });
      slot = undefined;
    }
  }
  return true;
}

zstd.on('data', (c: Buffer) => {
  if (failed) return;
  bytes += c.length;
  if (bytes > setup.maxBytes) {
    failed = true;
    post({ t: 'too-large' });
    return;
  }
  hash.update(c);
  if (!take(c)) zstd.pause();
});
zstd.on('end', () => {
  if (failed) return;
  if (slot !== undefined && filled > 0) post({ t: 'part', slot, n: filled });
  post({ t: 'done', bytes, sha256: hash.digest('hex') });
});
zstd.on('error', (err) => {
  failed = true;
  post({ t: 'error', message: err.message });
});

port.on('message', (m: ToCompressor) => {
  if (m.t === 'in') {
    const chunk = Buffer.from(setup.input, m.slot * setup.inputBytes, m.n);
    zstd.write(chunk, () => post({ t: 'in-free', slot: m.slot }));
  } else if (m.t === 'end') {
    zstd.end();
  } else {
    free.push(m.slot);
    if (stash) {
      const rest = stash;
      stash = undefined;
      if (take(rest)) zstd.resume();
    }
  }
});
