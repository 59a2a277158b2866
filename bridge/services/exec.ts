// Commands in a box, through boxd: one call, answered whole (the spec's exec) or as a stream of
// output events. boxd enforces the timeout (killing the whole process tree), the per-stream
// output cap and the per-box concurrency cap, so all of them hold across every replica. What the
// bridge holds of a call (the frame relay, and the output of an answer given whole) comes out of
// the replica's byte budget before the command starts: a replica short of memory refuses with
// 503 and runs nothing.
import type { IncomingMessage } from 'node:http';
import { BridgeError, ERROR_STATUS, type ErrorType } from '../../common/errors.js';
import type { BoxdClient, BoxdExit } from '../../common/boxd-client.js';
import { FRAME, consumeFrames, frameJson } from '../boxd/frames.js';
import type { ExecRequest } from '../schemas.js';
import type { BoxConnector } from './box-connector.js';
import { resolvePath } from './box-paths.js';
import { HOLD_BYTES, HeldBytes, type ByteBudget } from './byte-budget.js';

export type OutputStream = 'stdout' | 'stderr';
export type ExecOutcome = 'ok' | 'nonzero' | 'timeout' | 'error';

/** Receives output as it arrives; a returned promise is awaited (backpressure). */
export type OutputSink = (stream: OutputStream, data: Buffer) => void | Promise<void>;

export interface ExecServiceDeps {
  connector: BoxConnector;
  boxd: BoxdClient;
  budget: ByteBudget;
  maxExecsPerBox: () => number;
  /** Per stream, per exec. */
  outputLimit: number;
  onExecDone?: (outcome: ExecOutcome, seconds: number) => void;
  onRateLimited?: () => void;
}

/** An exec answered whole: its output, held against the budget until release(). */
export interface ExecAnswer {
  exit_code: number;
  stdout: Buffer[];
  stderr: Buffer[];
  duration_ms: number;
  timed_out: boolean;
  /** Cut at the output limit by boxd, or here because the replica's budget had no room for more. */
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  /** Gives the memory of the output back; once the answer is sent (or given up). */
  release(): void;
}

/**
 * The largest frame an exec relay accepts: boxd's exec output frames carry at most 32 KiB
 * (PROTOCOL.md), and what the relay holds is reserved by that bound (HOLD_BYTES.exec).
 */
export const EXEC_FRAME_LIMIT = 64 * 1024;

/** A stream that ends without its exit frame: how long to wait for the watch to say the box is gone. */
const GONE_GRACE_MS = 2000;

export class ExecService {
  constructor(private readonly deps: ExecServiceDeps) {}

  /**
   * The spec's exec: the whole output and exit status in one answer. The output is held as
   * bytes, grown block by block from the budget; what the budget has no room for is dropped and
   * flagged as truncated, so a replica under pressure still answers every command it ran.
   * signal: the caller went away; boxd then kills the command (its connection closes).
   */
  async run(boxId: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecAnswer> {
    const hold = this.deps.budget.reserve(HOLD_BYTES.exec, 'exec', 'an exec');
    try {
      const out = { stdout: new HeldBytes(hold, this.deps.outputLimit), stderr: new HeldBytes(hold, this.deps.outputLimit) };
      // Read whole: boxd need not flush frame by frame.
      const exit = await this.execute(boxId, req, (stream, data) => out[stream].push(data), { signal, coalesce: true });
      return {
        exit_code: exit.exit_code,
        stdout: out.stdout.chunks(),
        stderr: out.stderr.chunks(),
        duration_ms: exit.duration_ms,
        timed_out: exit.timed_out,
        stdout_truncated: exit.stdout_truncated || out.stdout.truncated,
        stderr_truncated: exit.stderr_truncated || out.stderr.truncated,
        release: hold.release,
      };
    } catch (err) {
      hold.release();
      throw err;
    }
  }

  /** Runs the command, handing output to sink as it comes; resolves with how it ended. */
  async stream(boxId: string, req: ExecRequest, sink: OutputSink, opts: { signal?: AbortSignal; onStart?: () => void } = {}): Promise<BoxdExit> {
    const hold = this.deps.budget.reserve(HOLD_BYTES.exec, 'output', 'a streamed exec');
    try {
      return await this.execute(boxId, req, sink, { ...opts, coalesce: false });
    } finally {
      hold.release();
    }
  }

  private async execute(
    boxId: string,
    req: ExecRequest,
    sink: OutputSink,
    { signal, onStart, coalesce }: { signal?: AbortSignal | undefined; onStart?: (() => void) | undefined; coalesce: boolean },
  ): Promise<BoxdExit> {
    const started = performance.now();
    const cwd = resolvePath(req.workdir, 'workdir');
    let outcome: ExecOutcome = 'error';
    try {
      const exit = await this.deps.connector.call(
        boxId,
        async ({ target, signal: boxSignal }) => {
          // The client's deadline for an exec is the command's timeout plus time to kill it.
          const res = await this.deps.boxd.exec(
            target,
            {
              command: req.command,
              cwd,
              ...(req.env ? { env: req.env } : {}),
              ...(req.stdin !== undefined ? { stdin: Buffer.from(req.stdin, 'utf8').toString('base64') } : {}),
              timeout_ms: req.timeoutMs,
              max_output_bytes: this.deps.outputLimit,
              max_concurrent: this.deps.maxExecsPerBox(),
              ...(coalesce ? { coalesce } : {}),
            },
            boxSignal,
          );
          return relayOutput(res, sink, boxSignal, boxId, onStart);
        },
        signal,
      );
      outcome = exit.timed_out ? 'timeout' : exit.exit_code === 0 ? 'ok' : 'nonzero';
      return exit;
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'rate_limited') this.deps.onRateLimited?.();
      throw err;
    } finally {
      this.deps.onExecDone?.(outcome, (performance.now() - started) / 1000);
    }
  }
}

/**
 * Passes a boxd output stream's frames to sink and returns its exit frame. A stream that ends
 * without one means boxd went away: usually the box was deleted, which the watch reports.
 */
async function relayOutput(res: IncomingMessage, sink: OutputSink, boxSignal: AbortSignal, boxId: string, onStart?: () => void): Promise<BoxdExit> {
  let exit: BoxdExit | undefined;
  try {
    await consumeFrames(
      res,
      (frame) => {
        if (frame.type === FRAME.start) onStart?.();
        else if (frame.type === FRAME.stdout) return sink('stdout', frame.payload);
        else if (frame.type === FRAME.stderr) return sink('stderr', frame.payload);
        else if (frame.type === FRAME.exit) exit = frameJson<BoxdExit>(frame);
        else if (frame.type === FRAME.error) throw frameError(frame.payload);
      },
      EXEC_FRAME_LIMIT,
    );
  } catch (err) {
    if (boxSignal.aborted) throw boxSignal.reason;
    if (err instanceof BridgeError) throw err;
    // the connection broke: fall through to the missing-exit handling
  }
  if (exit) return exit;
  await abortedWithin(boxSignal, GONE_GRACE_MS);
  if (boxSignal.aborted) throw boxSignal.reason;
  throw new BridgeError('cluster_unavailable', `box ${boxId} stopped answering before the command ended`, { headers: { 'Retry-After': '5' } });
}

/** Resolves when signal aborts or after ms, whichever comes first. */
function abortedWithin(signal: AbortSignal, ms: number): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

function frameError(payload: Buffer): BridgeError {
  try {
    const e = JSON.parse(payload.toString('utf8')) as { type?: string; message?: string };
    const type = e.type && e.type in ERROR_STATUS ? (e.type as ErrorType) : 'internal_error';
    return new BridgeError(type, e.message ?? 'the box reported an error');
  } catch {
    return new BridgeError('internal_error', 'the box reported an error');
  }
}
