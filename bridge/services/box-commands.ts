// Running things in a box: commands (exec), file reads and writes. Each is one pods/exec call
// with a fixed script (box-scripts.ts); concurrency per box is capped, the box must be running,
// and a box deleted mid-command ends the request instead of leaving it hanging.
import { randomBytes } from 'node:crypto';
import { posix } from 'node:path';
import type * as k8s from '@kubernetes/client-node';
import { BridgeError } from '../../common/errors.js';
import { BOX_CONTAINER, WORKSPACE } from '../box-pod.js';
import { BoxGoneError, BoxStartTimeoutError, type BoxReader } from '../kube/box-cache.js';
import type { PodExec, PodExecResult } from '../kube/pod-exec.js';
import type { ExecRequest } from '../schemas.js';
import {
  EXEC_SCRIPT,
  KILL_SCRIPT,
  READ_DENIED,
  READ_IS_DIRECTORY,
  READ_NOT_FOUND,
  READ_SCRIPT,
  WRITE_SCRIPT,
  envBlock,
} from './box-scripts.js';
import type { BoxService } from './boxes.js';
import type { EnvStore } from './env-store.js';

export interface BoxCommandsDeps {
  podExec: PodExec;
  boxes: BoxService;
  cache: BoxReader;
  env: EnvStore;
  namespace: string;
  maxExecsPerBox: () => number;
  outputLimit: number;
  fileSizeLimit: number;
  startTimeoutMs: number;
  kubeTimeoutMs: number;
  onExecDone?: (outcome: 'ok' | 'nonzero' | 'timeout' | 'error', seconds: number) => void;
  onRateLimited?: () => void;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

export class BoxCommands {
  private readonly running = new Map<string, number>();

  constructor(private readonly deps: BoxCommandsDeps) {}

  async exec(boxId: string, req: ExecRequest) {
    const started = performance.now();
    const execId = randomBytes(8).toString('hex');
    const workdir = resolvePath(req.workdir, 'workdir');
    let outcome: 'ok' | 'nonzero' | 'timeout' | 'error' = 'error';
    try {
      // Env values go over stdin, so they never appear in the exec URL (and API server audit
      // logs). The Secret is read first, from the API server rather than a watch cache, so an
      // env set through another replica a moment ago is seen; a box without env then needs no
      // stdin stream at all, which is the cheaper exec (measured: bench/results/bridge.md).
      const pod = await this.deps.boxes.get(boxId); // 404/400 for unknown ids before any other call
      const env = await this.deps.env.read(boxId);
      const withEnv = Object.keys(env).length > 0;
      const result = await this.run(boxId, {
        pod,
        argv: ['sh', '-c', EXEC_SCRIPT, 'sandbox-exec', workdir, req.command, execId, withEnv ? 'env' : 'none'],
        ...(withEnv ? { stdin: envBlock(env) } : {}),
        timeoutMs: req.timeoutMs,
        onTimeout: (pod) => this.kill(pod, execId),
      });
      outcome = result.timedOut ? 'timeout' : result.exitCode === 0 ? 'ok' : 'nonzero';
      return {
        exit_code: result.exitCode,
        stdout: result.stdout.toString('utf8'),
        stderr: result.stderr.toString('utf8'),
        duration_ms: Math.round(performance.now() - started),
        timed_out: result.timedOut,
        stdout_truncated: result.stdoutTruncated,
        stderr_truncated: result.stderrTruncated,
      };
    } finally {
      this.deps.onExecDone?.(outcome, (performance.now() - started) / 1000);
    }
  }

  async readFile(boxId: string, rawPath: string, asBase64: boolean) {
    const path = resolvePath(rawPath, 'path');
    const limit = this.deps.fileSizeLimit;
    const result = await this.run(boxId, {
      argv: ['sh', '-c', READ_SCRIPT, 'sandbox-read', path, String(limit + 1)],
      outputLimit: limit + 1,
    });
    switch (result.exitCode) {
      case 0:
        break;
      case READ_NOT_FOUND:
        throw new BridgeError('not_found', `file ${path} not found in box ${boxId}`);
      case READ_IS_DIRECTORY:
        throw new BridgeError('invalid_request', `${path} is a directory`);
      case READ_DENIED:
        throw new BridgeError('forbidden', `permission denied reading ${path}`);
      default:
        throw new BridgeError('internal_error', `reading ${path} failed: ${result.stderr.toString('utf8').trim() || `exit ${result.exitCode}`}`);
    }
    if (result.stdout.length > limit) {
      throw new BridgeError('payload_too_large', `${path} is larger than the file size limit of ${limit} bytes`);
    }
    let text: string | undefined;
    if (!asBase64) {
      try {
        text = utf8.decode(result.stdout);
      } catch {
        text = undefined; // not UTF-8: fall back to base64
      }
    }
    return text !== undefined
      ? { path, size: result.stdout.length, content: text, encoding: 'text' as const }
      : { path, size: result.stdout.length, content: result.stdout.toString('base64'), encoding: 'base64' as const };
  }

  async writeFile(boxId: string, rawPath: string, content: Buffer, encoding: 'text' | 'base64') {
    const path = resolvePath(rawPath, 'path');
    if (content.length > this.deps.fileSizeLimit) {
      throw new BridgeError('payload_too_large', `file content is ${content.length} bytes; the limit is ${this.deps.fileSizeLimit}`);
    }
    const result = await this.run(boxId, {
      argv: ['sh', '-c', WRITE_SCRIPT, 'sandbox-write', path, String(content.length)],
      stdin: content,
    });
    const written = Number(result.stdout.toString('utf8').trim());
    if (result.exitCode !== 0 || written !== content.length) {
      const why = result.stderr.toString('utf8').trim() || `exit ${result.exitCode}`;
      throw new BridgeError('invalid_request', `cannot write ${path}: ${why}`);
    }
    return { path, size: written, encoding };
  }

  /** Execs in flight on this replica (for graceful shutdown). */
  inFlight(): number {
    let n = 0;
    for (const count of this.running.values()) n += count;
    return n;
  }

  private async run(
    boxId: string,
    opts: {
      /** The box, when the caller has already looked it up. */
      pod?: k8s.V1Pod;
      argv: string[];
      stdin?: Buffer;
      timeoutMs?: number;
      outputLimit?: number;
      onTimeout?: (pod: string) => Promise<void>;
    },
  ): Promise<PodExecResult> {
    const pod = opts.pod ?? (await this.deps.boxes.get(boxId));
    const limit = this.deps.maxExecsPerBox();
    const current = this.running.get(boxId) ?? 0;
    if (current >= limit) {
      this.deps.onRateLimited?.();
      throw new BridgeError('rate_limited', `box ${boxId} already runs ${current} commands; the limit is ${limit} at a time`, {
        headers: { 'Retry-After': '1' },
      });
    }
    this.running.set(boxId, current + 1);
    const aborter = new AbortController();
    const unsubscribe = this.deps.cache.onGone(boxId, () =>
      aborter.abort(new BridgeError('not_found', `box ${boxId} was deleted while the command was running`)),
    );
    try {
      await this.waitUntilRunning(pod);
      return await this.deps.podExec.run({
        namespace: this.deps.namespace,
        pod: boxId,
        container: BOX_CONTAINER,
        argv: opts.argv,
        ...(opts.stdin ? { stdin: opts.stdin } : {}),
        outputLimit: opts.outputLimit ?? this.deps.outputLimit,
        timeoutMs: opts.timeoutMs ?? 0,
        ...(opts.onTimeout ? { onTimeout: () => opts.onTimeout!(boxId) } : {}),
        connectTimeoutMs: this.deps.kubeTimeoutMs,
        signal: aborter.signal,
      });
    } finally {
      unsubscribe();
      const left = (this.running.get(boxId) ?? 1) - 1;
      if (left > 0) this.running.set(boxId, left);
      else this.running.delete(boxId);
    }
  }

  private async waitUntilRunning(pod: k8s.V1Pod): Promise<void> {
    const name = pod.metadata!.name!;
    try {
      await this.deps.cache.waitUntilRunning(name, this.deps.startTimeoutMs);
    } catch (err) {
      if (err instanceof BoxGoneError) {
        throw err.phase
          ? new BridgeError('conflict', `${err.message}; create a new box`)
          : new BridgeError('not_found', `box ${name} not found`);
      }
      if (err instanceof BoxStartTimeoutError) throw new BridgeError('cluster_unavailable', err.message, { headers: { 'Retry-After': '5' } });
      throw err;
    }
  }

  /** Kills every process of one exec inside the box (best effort, bounded in time). */
  private async kill(boxId: string, execId: string): Promise<void> {
    await this.deps.podExec.run({
      namespace: this.deps.namespace,
      pod: boxId,
      container: BOX_CONTAINER,
      argv: ['sh', '-c', KILL_SCRIPT, 'sandbox-kill', execId],
      outputLimit: 4096,
      timeoutMs: 10_000,
      connectTimeoutMs: this.deps.kubeTimeoutMs,
    });
  }
}

/** Relative paths resolve under /workspace; NUL bytes are refused. */
export function resolvePath(path: string, field: string): string {
  if (path.length === 0) throw new BridgeError('invalid_request', `${field} must not be empty`);
  if (path.includes('\0')) throw new BridgeError('invalid_request', `${field} must not contain NUL bytes`);
  const absolute = path.startsWith('/') ? path : posix.join(WORKSPACE, path);
  const normalized = posix.normalize(absolute);
  return normalized.length > 1 && normalized.endsWith('/') ? normalized.slice(0, -1) : normalized;
}
