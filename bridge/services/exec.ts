// Commands in a box, through boxd: one call, answered whole (the spec's exec) or as a stream of
// output events. boxd enforces the timeout (killing the whole process tree), the per-stream
// output cap and the per-box concurrency cap, so all of them hold across every replica.
import type { IncomingMessage } from 'node:http';
import { BridgeError, ERROR_STATUS, type ErrorType } from '../../common/errors.js';
import type { BoxdClient, BoxdExit } from '../../common/boxd-client.js';
import { FRAME, frameJson, readFrames } from '../boxd/frames.js';
import type { ExecRequest } from '../schemas.js';
import type { BoxConnector } from './box-connector.js';
import { resolvePath } from './box-paths.js';

export type OutputStream = 'stdout' | 'stderr';
export type ExecOutcome = 'ok' | 'nonzero' | 'timeout' | 'error';

/** Receives output as it arrives; a returned promise is awaited (backpressure). */
export type OutputSink = (stream: OutputStream, data: Buffer) => void | Promise<void>;

export interface ExecServiceDeps {
  connector: BoxConnector;
  boxd: BoxdClient;
  maxExecsPerBox: () => number;
  /** Per stream, per exec. */
  outputLimit: number;
  onExecDone?: (outcome: ExecOutcome, seconds: number) => void;
  onRateLimited?: () => void;
}

/** Beyond the command's own timeout: time for boxd to kill it and answer. */
const TIMEOUT_GRACE_MS = 15_000;
/** A stream that ends without its exit frame: how long to wait for the watch to say the box is gone. */
const GONE_GRACE_MS = 2000;

export class ExecService {
  constructor(private readonly deps: ExecServiceDeps) {}

  /** The spec's exec: the whole output and exit status in one answer. */
  async run(boxId: string, req: ExecRequest) {
    const out: Record<OutputStream, Buffer[]> = { stdout: [], stderr: [] };
    const exit = await this.stream(boxId, req, (stream, data) => {
      out[stream].push(data);
    });
    return {
      exit_code: exit.exit_code,
      stdout: Buffer.concat(out.stdout).toString('utf8'),
      stderr: Buffer.concat(out.stderr).toString('utf8'),
      duration_ms: exit.duration_ms,
      timed_out: exit.timed_out,
      stdout_truncated: exit.stdout_truncated,
      stderr_truncated: exit.stderr_truncated,
    };
  }

  /** Runs the command, handing output to sink as it comes; resolves with how it ended. */
  async stream(boxId: string, req: ExecRequest, sink: OutputSink, opts: { signal?: AbortSignal; onStart?: () => void } = {}): Promise<BoxdExit> {
    const started = performance.now();
    const cwd = resolvePath(req.workdir, 'workdir');
    let outcome: ExecOutcome = 'error';
    try {
      const exit = await this.deps.connector.call(
        boxId,
        async ({ target, signal: boxSignal }) => {
          const deadline = AbortSignal.timeout(req.timeoutMs + TIMEOUT_GRACE_MS);
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
            },
            AbortSignal.any([boxSignal, deadline]),
          );
          return relayOutput(res, sink, boxSignal, boxId, opts.onStart);
        },
        opts.signal,
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
    for await (const frame of readFrames(res)) {
      if (frame.type === FRAME.start) onStart?.();
      else if (frame.type === FRAME.stdout) await sink('stdout', frame.payload);
      else if (frame.type === FRAME.stderr) await sink('stderr', frame.payload);
      else if (frame.type === FRAME.exit) exit = frameJson<BoxdExit>(frame);
      else if (frame.type === FRAME.error) throw frameError(frame.payload);
    }
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
