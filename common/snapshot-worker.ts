// The byte-moving half of snapshots, in a worker thread (common/snapshot-worker-host.ts starts it):
//
//   snapshot: GET boxd's archive (a plain tar) -> zstd -> count, SHA-256 -> part slots of a
//             SharedArrayBuffer, which the caller's upload sends as they are;
//   restore:  the stored bytes the caller copies into input slots -> count, SHA-256 -> zstd (or
//             gzip) decompression -> PUT to boxd's archive route; the last input held back until
//             the digest and size passed, so on a mismatch boxd's body never ends and it changes
//             nothing.
//
// Why a thread: the caller's heap is large (the bridge's watch caches, the S3 client), and there
// the buffers allocated per chunk (boxd's socket reads, zstd's output) started a full
// mark-compact of that heap every few MiB: 36-45 per 200 MiB snapshot, V8's GC threads a third
// of the process's CPU (perf; bench/results/snapshots.md, Notes). This isolate's heap stays a few
// MiB, where the same garbage costs scavenges only. boxd's requests are made here, their shape
// (route, query, credential header) made by the caller from common/boxd-archive.ts; their
// deadlines are boxd-client.ts's: connect, total, and a quiet connection asks the caller to probe
// boxd's health. Failures go back as data; the caller maps them to the errors BoxdClient gives.
// Only node: modules here (types aside): the file also runs as it is (type-stripped) under the
// unit tests.
import { createHash } from 'node:crypto';
import http from 'node:http';
import type { Socket } from 'node:net';
import { parentPort, workerData } from 'node:worker_threads';
import { constants as zlib, createGunzip, createZstdCompress, createZstdDecompress } from 'node:zlib';
import type { BoxdRequestShape } from './boxd-archive.js';

/** A call to boxd from here, with boxd-client.ts's deadlines. */
export interface BoxdCallSetup {
  request: BoxdRequestShape;
  connectMs: number;
  idleMs: number;
  totalMs: number;
  /** The header of a fenced refusal (boxd-archive.ts FENCE_HEADER), sent back with the refusal. */
  fenceHeader: string;
  errorBodyLimit: number;
}

export interface SnapshotSetup {
  role: 'snapshot';
  call: BoxdCallSetup;
  /** Part slots of partBytes each, filled here, sent by the caller. */
  output: SharedArrayBuffer;
  partBytes: number;
  /** More compressed bytes than this fail the snapshot (413). */
  maxBytes: number;
  level: number;
}

export interface RestoreSetup {
  role: 'restore';
  call: BoxdCallSetup;
  /** Input slots of inputBytes each, filled by the caller with the stored bytes. */
  input: SharedArrayBuffer;
  inputBytes: number;
  compression: 'zstd' | 'gzip';
  /** The stored object's size and SHA-256 (the metadata's). */
  expect: { size: number; sha256: string };
  chunkBytes: number;
}

export type WorkerSetup = SnapshotSetup | RestoreSetup;

/** Why a call to boxd failed, as data (snapshot-worker-host.ts makes the error BoxdClient would). */
export type BoxdCallFailure =
  | { kind: 'unreachable'; code: string }
  | { kind: 'deadline'; which: 'connect' | 'idle' | 'total' }
  | { kind: 'lost'; code: string }
  | { kind: 'broken'; message: string }
  | { kind: 'refused'; status: number; fence: string | undefined; body: string };

export type ToWorker =
  | { t: 'alive'; ok: boolean }
  // snapshot
  | { t: 'free'; slot: number }
  // restore
  | { t: 'in'; slot: number; n: number }
  | { t: 'end' };

export type FromWorker =
  | { t: 'quiet' }
  | { t: 'boxd'; failure: BoxdCallFailure }
  | { t: 'error'; message: string }
  // snapshot
  | { t: 'open' }
  | { t: 'part'; slot: number; n: number }
  | { t: 'done'; bytes: number; sha256: string }
  | { t: 'too-large' }
  // restore
  | { t: 'in-free'; slot: number }
  | { t: 'mismatch' }
  | { t: 'written'; body: string };

const setup = workerData as WorkerSetup;
const port = parentPort!;
const post = (m: FromWorker) => port.postMessage(m);
/** Set once anything failed: later events (the socket's close, zstd's end) say nothing more. */
let failed = false;
const fail = (m: FromWorker) => {
  if (failed) return;
  failed = true;
  post(m);
};
let onAlive: (ok: boolean) => void = () => undefined;

/**
 * Sends setup.request with boxd-client.ts's deadlines; onResponse gets a 2xx answer, a refusal
 * is read (its first errorBodyLimit bytes) and reported. body, if any, is piped once boxd
 * accepted the call (100-continue).
 */
function boxdCall(c: BoxdCallSetup, onResponse: (res: http.IncomingMessage) => void, body?: NodeJS.ReadableStream): http.ClientRequest {
  const r = c.request;
  const req = http.request({ host: r.host, port: r.port, method: r.method, path: r.path, headers: r.headers, agent: false, timeout: 0 });
  let connected = false;
  let answered = false;
  const failCall = (failure: BoxdCallFailure) => {
    fail({ t: 'boxd', failure });
    req.destroy();
  };
  const total = setTimeout(() => failCall({ kind: 'deadline', which: 'total' }), c.totalMs);
  let unwatch = () => {};
  req.on('socket', (socket: Socket) => {
    const timer = setTimeout(() => failCall({ kind: 'deadline', which: 'connect' }), c.connectMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      connected = true;
      unwatch = watchQuiet(socket, c.idleMs, () => failCall({ kind: 'deadline', which: 'idle' }));
    });
    socket.once('close', () => clearTimeout(timer));
  });
  req.on('close', () => {
    clearTimeout(total);
    unwatch();
  });
  req.on('error', (err: NodeJS.ErrnoException) => {
    if (!connected) failCall({ kind: 'unreachable', code: err.code ?? err.message });
    else if (!answered) failCall({ kind: 'lost', code: err.code ?? err.message });
  });
  req.on('response', (res) => {
    answered = true;
    res.on('error', (err) => failCall({ kind: 'broken', message: err.message }));
    const status = res.statusCode ?? 500;
    if (status < 300) return onResponse(res);
    const fence = res.headers[c.fenceHeader];
    void readText(res, c.errorBodyLimit).then((text) =>
      failCall({ kind: 'refused', status, fence: Array.isArray(fence) ? fence[0] : fence, body: text }),
    );
  });
  if (!body) req.end();
  else req.once('continue', () => body.pipe(req));
  return req;
}

/** No byte either way for idleMs: ask the caller whether boxd answers its health check; no: fail. */
function watchQuiet(socket: Socket, idleMs: number, fail: () => void): () => void {
  let stopped = false;
  let probing = false;
  const quiet = () => {
    if (stopped || probing) return;
    probing = true;
    onAlive = (ok) => {
      probing = false;
      if (stopped) return;
      if (!ok) fail();
      else socket.setTimeout(idleMs); // Node reports a quiet socket once: arm it again
    };
    post({ t: 'quiet' });
  };
  socket.setTimeout(idleMs);
  socket.on('timeout', quiet);
  return () => {
    stopped = true;
    socket.off('timeout', quiet);
    socket.setTimeout(0);
  };
}

async function readText(res: http.IncomingMessage, limit: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > limit) break;
      chunks.push(chunk);
    }
  } catch {
    // what arrived is what there is
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** GET the archive, compress it, fill the part slots (the caller frees them once sent). */
function snapshot(s: SnapshotSetup): (m: ToWorker) => void {
  const hash = createHash('sha256');
  // Output chunks as large as zstd's own blocks allow: fewer callbacks and copies per byte.
  const zstd = createZstdCompress({
    chunkSize: 1024 * 1024,
    params: { [zlib.ZSTD_c_compressionLevel]: s.level, [zlib.ZSTD_c_checksumFlag]: 1 },
  });
  const free = Array.from({ length: s.output.byteLength / s.partBytes }, (_, i) => i);
  let slot: number | undefined;
  let filled = 0;
  let bytes = 0;
  let stash: Buffer | undefined; // the rest of an output chunk that found no free part slot

  /** Copies c into part slots, posting each full one; false when it ran out of slots (the rest stashed). */
  const take = (c: Buffer): boolean => {
    for (let at = 0; at < c.length; ) {
      if (slot === undefined) {
        slot = free.shift();
        if (slot === undefined) {
          stash = c.subarray(at);
          return false;
        }
        filled = 0;
      }
      const view = Buffer.from(s.output, slot * s.partBytes + filled, s.partBytes - filled);
      const n = c.copy(view, 0, at);
      filled += n;
      at += n;
      if (filled === s.partBytes) {
        post({ t: 'part', slot, n: filled });
        slot = undefined;
      }
    }
    return true;
  };
  zstd.on('data', (c: Buffer) => {
    if (failed) return;
    bytes += c.length;
    if (bytes > s.maxBytes) return fail({ t: 'too-large' });
    hash.update(c);
    if (!take(c)) zstd.pause();
  });
  zstd.on('end', () => {
    if (failed) return;
    if (slot !== undefined && filled > 0) post({ t: 'part', slot, n: filled });
    post({ t: 'done', bytes, sha256: hash.digest('hex') });
  });
  zstd.on('error', (err) => fail({ t: 'error', message: err.message }));
  // An archive cut short (boxd ends its response without the final chunk on a failure) fails the
  // response ('broken'), never ends zstd: a truncated archive is never complete here.
  boxdCall(s.call, (res) => {
    post({ t: 'open' });
    res.pipe(zstd);
  });
  return (m) => {
    if (m.t !== 'free') return;
    free.push(m.slot);
    if (stash) {
      const rest = stash;
      stash = undefined;
      if (take(rest)) zstd.resume();
    }
  };
}

/** Check and decompress the stored bytes the caller sends, PUT them to boxd as a plain tar. */
function restore(s: RestoreSetup): (m: ToWorker) => void {
  const hash = createHash('sha256');
  const unpack = s.compression === 'zstd' ? createZstdDecompress({ chunkSize: s.chunkBytes }) : createGunzip({ chunkSize: s.chunkBytes });
  unpack.on('error', (err) => {
    fail({ t: 'error', message: `decompressing the snapshot failed: ${err.message}` });
    req.destroy();
  });
  let bytes = 0;
  let held: { slot: number; n: number } | undefined; // the last input, until the check passed
  const send = (h: { slot: number; n: number }) => unpack.write(Buffer.from(s.input, h.slot * s.inputBytes, h.n), () => post({ t: 'in-free', slot: h.slot }));
  const req = boxdCall(
    s.call,
    (res) => {
      void readText(res, 1024 * 1024).then((body) => {
        if (!failed) post({ t: 'written', body });
      });
    },
    unpack,
  );
  return (m) => {
    if (failed) return;
    if (m.t === 'in') {
      bytes += m.n;
      hash.update(Buffer.from(s.input, m.slot * s.inputBytes, m.n));
      if (held) send(held);
      held = { slot: m.slot, n: m.n };
    } else if (m.t === 'end') {
      if (bytes !== s.expect.size || hash.digest('hex') !== s.expect.sha256) {
        // boxd sees a body that never ended: it commits nothing.
        fail({ t: 'mismatch' });
        req.destroy();
        return;
      }
      if (held) send(held);
      unpack.end();
    }
  };
}

const handle = setup.role === 'snapshot' ? snapshot(setup) : restore(setup);
port.on('message', (m: ToWorker) => {
  if (m.t === 'alive') onAlive(m.ok);
  else handle(m);
});
