// One command in a box through the pods/exec subresource (client-node's Exec, websocket).
// Output is kept per stream up to a cap; the exit code comes from the status channel only.
import { PassThrough, Writable } from 'node:stream';
import * as k8s from '@kubernetes/client-node';
import { BridgeError } from '../../common/errors.js';

export interface PodExecRequest {
  namespace: string;
  pod: string;
  container: string;
  argv: string[];
  /** Written to the command's stdin, which is then closed; without it the command gets none. */
  stdin?: Buffer;
  outputLimit: number;
  /** Stops waiting and calls onTimeout; 0 for none. */
  timeoutMs: number;
  onTimeout?: () => Promise<void>;
  /** Websocket connect timeout. */
  connectTimeoutMs: number;
  /** Abort (e.g. the box was deleted): the promise rejects with this signal's reason. */
  signal?: AbortSignal;
}

export interface PodExecResult {
  exitCode: number;
  timedOut: boolean;
  stdout: Buffer;
  stderr: Buffer;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
}

/** Collects up to `limit` bytes and remembers whether more came. */
class CappedSink extends Writable {
  private readonly chunks: Buffer[] = [];
  private size = 0;
  truncated = false;

  constructor(private readonly limit: number) {
    super();
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, done: (error?: Error | null) => void): void {
    const room = this.limit - this.size;
    if (chunk.length > room) this.truncated = true;
    if (room > 0) {
      const part = chunk.length > room ? chunk.subarray(0, room) : chunk;
      this.chunks.push(part);
      this.size += part.length;
    }
    done();
  }

  value(): Buffer {
    return Buffer.concat(this.chunks, this.size);
  }
}

const STDIN_CHUNK = 256 * 1024;

export class PodExec {
  private readonly exec: k8s.Exec;

  constructor(kc: k8s.KubeConfig) {
    this.exec = new k8s.Exec(kc);
  }

  async run(req: PodExecRequest): Promise<PodExecResult> {
    const stdout = new CappedSink(req.outputLimit);
    const stderr = new CappedSink(req.outputLimit);
    const stdin = req.stdin ? new PassThrough() : null;
    let status: k8s.V1Status | undefined;

    const ws = await withTimeout(
      this.exec.exec(req.namespace, req.pod, req.container, req.argv, stdout, stderr, stdin, false, (s) => {
        status = s;
      }),
      req.connectTimeoutMs,
      () => new BridgeError('cluster_unavailable', `exec in box ${req.pod}: no answer from the Kubernetes API within ${req.connectTimeoutMs} ms`),
    ).catch((err: unknown) => {
      throw connectError(err, req.pod);
    });

    return new Promise<PodExecResult>((resolve, reject) => {
      let timedOut = false;
      let settled = false;
      const finish = (fn: () => void) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        req.signal?.removeEventListener('abort', onAbort);
        fn();
      };
      const result = (exitCode: number): PodExecResult => ({
        exitCode,
        timedOut,
        stdout: stdout.value(),
        stderr: stderr.value(),
        stdoutTruncated: stdout.truncated,
        stderrTruncated: stderr.truncated,
      });
      const onAbort = () => {
        ws.close();
        finish(() => reject(req.signal?.reason));
      };
      req.signal?.addEventListener('abort', onAbort);
      if (req.signal?.aborted) onAbort();

      if (stdin && req.stdin) {
        for (let i = 0; i < req.stdin.length; i += STDIN_CHUNK) stdin.write(req.stdin.subarray(i, i + STDIN_CHUNK));
        stdin.end();
      }

      const timer =
        req.timeoutMs > 0
          ? setTimeout(() => {
              timedOut = true;
              // Kill the command's processes in the box first: closing the stream alone can
              // leave them running.
              void (req.onTimeout?.() ?? Promise.resolve())
                .catch(() => undefined)
                .finally(() => {
                  ws.close();
                  finish(() => resolve(result(124)));
                });
            }, req.timeoutMs)
          : undefined;

      ws.on('error', (err: Error) =>
        finish(() => reject(new BridgeError('cluster_unavailable', `exec in box ${req.pod}: stream failed (${err.message})`))),
      );
      ws.on('close', () => {
        if (timedOut) return; // the timeout path answers
        finish(() => {
          if (!status) {
            reject(new BridgeError('internal_error', `exec in box ${req.pod}: the stream ended without an exit status`));
            return;
          }
          try {
            resolve(result(exitCodeFromStatus(status)));
          } catch (err) {
            reject(err);
          }
        });
      });
    });
  }
}

/**
 * The exit code in an exec status frame. A kubelet reports a non-zero exit as reason
 * NonZeroExitCode with an ExitCode cause; some runtimes (and kwok's simulation) only put
 * "exit status N" / "exit code N" into the message. Anything else is an error, never 0.
 */
export function exitCodeFromStatus(status: k8s.V1Status): number {
  if (status.status === 'Success') return 0;
  const cause = status.details?.causes?.find((c) => c.reason === 'ExitCode');
  if (cause?.message !== undefined && /^\d+$/.test(cause.message)) return Number(cause.message);
  const inMessage = /exit (?:status|code):? (\d+)\s*$/.exec(status.message ?? '');
  if (inMessage) return Number(inMessage[1]);
  throw new BridgeError('internal_error', `exec failed: ${status.message ?? status.reason ?? 'unknown error'}`);
}

function connectError(err: unknown, pod: string): BridgeError {
  if (err instanceof BridgeError) return err;
  const message = (err as { message?: string })?.message ?? String(err);
  const code = /Unexpected server response: (\d+)/.exec(message)?.[1];
  switch (code) {
    case '404':
      return new BridgeError('not_found', `box ${pod} not found`);
    case '401':
    case '403':
      return new BridgeError('forbidden', `exec in box ${pod}: the bridge's Kubernetes permissions do not allow pods/exec (${message})`);
    case '400':
      return new BridgeError('conflict', `exec in box ${pod}: the box is not running`);
    case undefined:
      return new BridgeError('cluster_unavailable', `exec in box ${pod}: Kubernetes API unreachable (${message})`);
    default:
      return new BridgeError('cluster_unavailable', `exec in box ${pod}: Kubernetes API error (${message})`);
  }
}

function withTimeout<T extends { close(): void }>(promise: Promise<T>, ms: number, error: () => Error): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let expired = false;
    const timer = setTimeout(() => {
      expired = true;
      reject(error());
    }, ms);
    promise.then(
      (v) => {
        clearTimeout(timer);
        if (expired) v.close(); // opened after we gave up: nobody will read it
        else resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}
