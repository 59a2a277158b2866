// The caller's half of common/snapshot-worker.ts: starts the worker, answers its health-probe
// requests through the caller's BoxdClient, maps its boxd failures to the errors BoxdClient gives
// (so a snapshot or restore fails the same whichever thread made the call), ends it on the
// caller's signal, and keeps one set of shared slots for the next worker.
import { Worker } from 'node:worker_threads';
import { ERROR_BODY_LIMIT, FENCE_HEADER, boxdRefusal, type BoxdRequestShape } from './boxd-archive.js';
import { BoxdDeadlineError, BoxdFencedError, BoxdUnreachableError, type BoxdClient, type BoxdDeadlines, type BoxdTarget } from './boxd-client.js';
import { BridgeError } from './errors.js';
import type { BoxdCallFailure, BoxdCallSetup, FromWorker, ToWorker, WorkerSetup } from './snapshot-worker.js';

const WORKER_FILE = new URL(`./snapshot-worker.${import.meta.url.endsWith('.ts') ? 'ts' : 'js'}`, import.meta.url);

/** What the worker needs of the caller's BoxdClient: where boxd listens, its deadlines, its health probe and deadline metric. */
export interface BoxdSettings {
  port: number;
  deadlines: BoxdDeadlines;
  alive(t: BoxdTarget): Promise<boolean>;
  onDeadline?: ((deadline: 'connect' | 'idle' | 'total') => void) | undefined;
}

/** The client's settings, for the worker's calls to behave as the client's own. */
export function boxdSettings(boxd: BoxdClient): BoxdSettings {
  return boxd.workerSettings();
}

/** A call the worker makes to boxd: its request and the client's deadlines for a transfer. */
export function workerCall(request: BoxdRequestShape, settings: Pick<BoxdSettings, 'deadlines'>): BoxdCallSetup {
  const d = settings.deadlines;
  return { request, connectMs: d.connectMs, idleMs: d.idleMs, totalMs: d.transferMs, fenceHeader: FENCE_HEADER, errorBodyLimit: ERROR_BODY_LIMIT };
}

/** The error BoxdClient gives for the same failure (boxd-client.ts request() and errorOf()). */
export function boxdFailureError(f: BoxdCallFailure, t: BoxdTarget, settings: BoxdSettings): Error {
  switch (f.kind) {
    case 'unreachable':
      return new BoxdUnreachableError(t.box, f.code);
    case 'lost':
      return new BridgeError('cluster_unavailable', `lost the connection to box ${t.box} (${f.code})`, { headers: { 'Retry-After': '1' } });
    case 'broken':
      return new Error(f.message);
    case 'deadline':
      settings.onDeadline?.(f.which);
      if (f.which === 'connect') return new BoxdUnreachableError(t.box, 'ETIMEDOUT');
      if (f.which === 'total') return new BoxdDeadlineError(t.box, `did not finish the call within ${settings.deadlines.transferMs} ms`);
      return new BoxdDeadlineError(t.box, `stopped answering (nothing for ${settings.deadlines.idleMs} ms, and no answer to a health check)`);
    case 'refused': {
      const r = boxdRefusal(t.box, f.status, f.fence, f.body);
      if (r.fence !== undefined) return new BoxdFencedError(t.box, r.fence);
      return new BridgeError(r.type, r.message, { headers: r.headers });
    }
  }
}

/** One set of shared slots kept for the next worker of the same size (SPARE_MS), so successive ones do not pile up until a full GC. */
const spare = new Map<number, { buf: SharedArrayBuffer; timer: NodeJS.Timeout }>();
const SPARE_MS = 30_000;

export function sharedSlots(bytes: number): SharedArrayBuffer {
  const kept = spare.get(bytes);
  if (!kept) return new SharedArrayBuffer(bytes);
  clearTimeout(kept.timer);
  spare.delete(bytes);
  return kept.buf;
}

function keepSlots(buf: SharedArrayBuffer): void {
  if (spare.has(buf.byteLength)) return;
  spare.set(buf.byteLength, { buf, timer: setTimeout(() => spare.delete(buf.byteLength), SPARE_MS).unref() });
}

/**
 * A worker of common/snapshot-worker.ts: role messages go to onMessage; a failure (the worker's,
 * boxd's, the caller's signal) closes it once, and `failure` says which.
 */
export class SnapshotWorker {
  failure: Error | undefined;
  private readonly worker: Worker;
  private waiting: Array<() => void> = [];
  private stopped = false;
  private readonly unlisten: () => void;

  constructor(
    setup: WorkerSetup,
    private readonly slots: SharedArrayBuffer,
    private readonly ctx: { target: BoxdTarget; settings: BoxdSettings; signal?: AbortSignal | undefined },
    onMessage: (m: FromWorker) => void,
    private readonly onClose: (err: Error) => void,
  ) {
    // A small heap: with the default's, the profile script's peak RSS was 248 MiB instead of 200.
    this.worker = new Worker(WORKER_FILE, { workerData: setup, resourceLimits: { maxYoungGenerationSizeMb: 1, maxOldGenerationSizeMb: 64 } });
    this.worker.on('message', (m: FromWorker) => {
      if (m.t === 'quiet') {
        void ctx.settings.alive(ctx.target).then((ok) => this.post({ t: 'alive', ok }));
        return;
      }
      if (m.t === 'boxd') this.close(boxdFailureError(m.failure, ctx.target, ctx.settings));
      else if (m.t === 'error') this.close(new BridgeError('internal_error', m.message));
      else onMessage(m);
      this.notify();
    });
    this.worker.on('error', (err) => this.close(err));
    this.worker.on('exit', () => this.close(new Error('the snapshot worker stopped')));
    const signal = ctx.signal;
    const onAbort = () => this.close(signal?.reason instanceof Error ? signal.reason : new Error('aborted'));
    signal?.addEventListener('abort', onAbort, { once: true });
    this.unlisten = () => signal?.removeEventListener('abort', onAbort);
    if (signal?.aborted) onAbort();
  }

  post(m: ToWorker): void {
    if (!this.failure && !this.stopped) this.worker.postMessage(m);
  }

  /** The worker finished its work: it is stopped, nothing failed. */
  finish(): void {
    this.stopped = true;
    this.unlisten();
    void this.worker.terminate();
  }

  /** Stops the worker (a no-op once it finished or failed); whoever waits on it fails with err. */
  close(err: Error): void {
    if (this.stopped || this.failure) return;
    this.failure = err;
    this.unlisten();
    void this.worker.terminate();
    this.onClose(err);
    this.notify();
  }

  /** Resolves at the worker's next message or failure. */
  wait(): Promise<void> {
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  /** Once nothing reads or fills the slots any more (the worker stopped, the caller's feed and upload ended): keeps them for the next worker. */
  async release(): Promise<void> {
    await this.worker.terminate();
    keepSlots(this.slots);
  }

  private notify(): void {
    const waiting = this.waiting;
    this.waiting = [];
    for (const wake of waiting) wake();
  }
}
