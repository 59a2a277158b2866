// Observing a box without acting on it: file watches and the box's metrics (docs/api.md "File
// watch", "Box metrics"). Both go through the box connector as observers: they are not the box's
// activity (boxd does not count them either), so an open watch never keeps a box awake, and they
// never wake a sleeping box (409). A watch runs inside its connector call, so a box deleted
// meanwhile ends it; a sleep ends it in boxd (its fence), with an `end` line either way.
import type { IncomingMessage } from 'node:http';
import { StringDecoder } from 'node:string_decoder';
import type { BoxdClient, BoxdMetrics, BoxdMetricsSample } from '../../common/boxd-client.js';
import { BridgeError } from '../../common/errors.js';
import { LABELS } from '../../common/labels.js';
import type { BoxConnector } from './box-connector.js';
import { resolvePath } from './box-paths.js';
import { HOLD_BYTES, type ByteBudget } from './byte-budget.js';

/** One line of a watch (PROTOCOL.md "File watch"; the bridge adds the reason `deleted`). */
export interface WatchEvent {
  type: 'ready' | 'create' | 'write' | 'remove' | 'rename' | 'chmod' | 'overflow' | 'end';
  path?: string;
  from?: string;
  kind?: 'file' | 'dir';
  dropped?: number;
  reason?: string;
}

export interface ObserveServiceDeps {
  connector: Pick<BoxConnector, 'call'>;
  boxd: Pick<BoxdClient, 'watchFiles' | 'metrics'>;
  budget: ByteBudget;
  /** Watches of one box at once, across every replica (boxd counts them): 429 beyond. */
  maxWatchesPerBox: number;
  /** Pool-level histograms of box use (bridge/metrics.ts); per pool, never per box. */
  onSample?: (pool: string, sample: BoxdMetricsSample) => void;
}

/** A watch line from boxd longer than this is not boxd's: the stream is cut. */
const MAX_LINE_BYTES = 64 * 1024;
/** Boxes whose last observed sample is remembered (one observation per box per sample). */
const OBSERVED_SIZE = 10_000;

export class ObserveService {
  /** pod uid -> the time of the last sample observed into the histograms. */
  private readonly observed = new Map<string, string>();

  constructor(private readonly deps: ObserveServiceDeps) {}

  /**
   * Streams the watch's lines to `write` (which applies the caller's backpressure: boxd's queue
   * overflows, bounded, when the caller reads slowly) until it ends. Errors before the first line
   * throw (4xx JSON, 409 asleep, 503); after it, the stream ends with an `end` line: `deleted`
   * when the box went, boxd's reason otherwise.
   */
  async watch(boxId: string, q: { path: string; recursive: boolean }, write: (e: WatchEvent) => Promise<void>, signal: AbortSignal): Promise<void> {
    const path = resolvePath(q.path, 'path');
    const hold = this.deps.budget.reserve(HOLD_BYTES.pipe, 'output', `watching ${path}`);
    try {
      await this.deps.connector.call(
        boxId,
        async (call) => {
          const res = await this.deps.boxd.watchFiles(call.target, { path, recursive: q.recursive, max_watches: this.deps.maxWatchesPerBox }, call.signal);
          let ended = false;
          try {
            for await (const e of lines(res)) {
              if (e.type === 'end') {
                ended = true;
                await write({ type: 'end', reason: e.reason === 'shutdown' ? 'deleted' : (e.reason ?? 'closed') });
                return;
              }
              await write(e);
            }
          } catch (err) {
            if (signal.aborted) return; // the caller left
            if (!call.signal.aborted) throw err; // the connection to the box broke: an error line
          }
          // The box's pod went (deleted, or taken by a sleep whose end line was lost).
          if (!ended && !signal.aborted) await write({ type: 'end', reason: 'deleted' });
        },
        signal,
        { observe: true },
      );
    } finally {
      hold.release();
    }
  }

  /** The box's use now; with since, the samples boxd kept after it (10 minutes at 5 s). */
  async metrics(boxId: string, since: string | undefined, signal?: AbortSignal): Promise<Omit<BoxdMetrics, 'cgroup'> & { box_id: string }> {
    return this.deps.connector.call(
      boxId,
      async (call) => {
        const m = await this.deps.boxd.metrics(call.target, since, call.signal);
        this.observe(call.pod.metadata?.uid ?? '', call.pod.metadata?.labels?.[LABELS.pool] ?? '', m);
        const { cgroup: _cgroup, ...rest } = m;
        return { box_id: boxId, ...rest };
      },
      signal,
      { observe: true },
    );
  }

  /** Observes the newest sample boxd kept (or, before the first, this reading) once per box. */
  private observe(uid: string, pool: string, m: BoxdMetrics): void {
    if (!this.deps.onSample || !uid || !pool) return;
    const latest = m.history?.length ? m.history[m.history.length - 1]! : m;
    const key = m.history?.length ? latest.time : `now:${Math.floor(Date.parse(m.time) / (m.interval_seconds * 1000))}`;
    if (this.observed.get(uid) === key) return;
    this.observed.delete(uid);
    this.observed.set(uid, key);
    if (this.observed.size > OBSERVED_SIZE) this.observed.delete(this.observed.keys().next().value!);
    this.deps.onSample(pool, latest);
  }
}

/** boxd's NDJSON lines as events; a line that is not JSON or too long ends the stream with a 503. */
async function* lines(res: IncomingMessage): AsyncGenerator<WatchEvent> {
  const text = new StringDecoder('utf8');
  let rest = '';
  for await (const chunk of res as AsyncIterable<Buffer>) {
    rest += text.write(chunk);
    let nl: number;
    while ((nl = rest.indexOf('\n')) >= 0) {
      const line = rest.slice(0, nl);
      rest = rest.slice(nl + 1);
      if (line) yield parseLine(line);
    }
    if (rest.length > MAX_LINE_BYTES) {
      res.destroy();
      throw new BridgeError('internal_error', 'the box sent a watch line longer than 64 KiB');
    }
  }
  if (rest) yield parseLine(rest);
}

function parseLine(line: string): WatchEvent {
  try {
    return JSON.parse(line) as WatchEvent;
  } catch {
    throw new BridgeError('internal_error', 'the box sent a watch line that is not JSON');
  }
}
