// The client of a box pod's mounts sidecar (boxd's mounts mode, boxd/mounts/; docs/mounts.md):
// bridge and operator call it at the pod's IP on its own port with the box's credential. Every
// call has a deadline; a sidecar that does not answer is a 503 the caller may retry.
import { Readable } from 'node:stream';
import type { ReadableStream as NodeWebStream } from 'node:stream/web';
import { BridgeError, ERROR_STATUS, type ErrorType } from './errors.js';

export interface MountsTarget {
  box: string;
  ip: string;
  /** The box's boxd credential (the sidecar takes the same; it refuses calls from the pod itself). */
  token: string;
}

export interface MountsClientOptions {
  port: number;
  /** Deadline of a call without a body, and the idle deadline of one that moves a file. */
  callMs?: number;
  /** Deadline of one file's transfer. */
  transferMs?: number;
}

const TOKEN_HEADER = 'X-Boxd-Token';

export class MountsClient {
  private readonly callMs: number;
  private readonly transferMs: number;

  constructor(private readonly options: MountsClientOptions) {
    this.callMs = options.callMs ?? 15_000;
    this.transferMs = options.transferMs ?? 300_000;
  }

  async stage(t: MountsTarget, name: string, readOnly: boolean, signal?: AbortSignal): Promise<void> {
    await this.json(t, 'POST', `/v1/memory/${encodeURIComponent(name)}/stage?read_only=${readOnly}`, undefined, signal);
  }

  async putStaged(t: MountsTarget, name: string, readOnly: boolean, path: string, body: Readable, signal?: AbortSignal): Promise<void> {
    const q = new URLSearchParams({ read_only: String(readOnly), path });
    await this.json(t, 'PUT', `/v1/memory/${encodeURIComponent(name)}/stage/file?${q}`, { body }, signal);
  }

  async commit(t: MountsTarget, name: string, readOnly: boolean, signal?: AbortSignal): Promise<void> {
    await this.json(t, 'POST', `/v1/memory/${encodeURIComponent(name)}/commit?read_only=${readOnly}`, undefined, signal);
  }

  /** The regular files of a read-write store in the box. */
  async list(t: MountsTarget, name: string, signal?: AbortSignal): Promise<Array<{ path: string; size: number; mtime: number }>> {
    const res = await this.json<{ files: Array<{ path: string; size: number; mtime: number }> }>(t, 'GET', `/v1/memory/${encodeURIComponent(name)}/files`, undefined, signal);
    return res.files;
  }

  /** One file of a read-write store, as a stream (the caller consumes it). */
  async read(t: MountsTarget, name: string, path: string, signal?: AbortSignal): Promise<Readable> {
    const res = await this.send(t, 'GET', `/v1/memory/${encodeURIComponent(name)}/file?${new URLSearchParams({ path })}`, undefined, signal, this.transferMs);
    if (!res.ok) throw await errorOf(res, t.box);
    return Readable.fromWeb(res.body as NodeWebStream<Uint8Array>);
  }

  private async json<T>(t: MountsTarget, method: string, path: string, upload: { body: Readable } | undefined, signal?: AbortSignal): Promise<T> {
    const res = await this.send(t, method, path, upload, signal, upload ? this.transferMs : this.callMs);
    if (!res.ok) throw await errorOf(res, t.box);
    return (await res.json()) as T;
  }

  private async send(t: MountsTarget, method: string, path: string, upload: { body: Readable } | undefined, signal: AbortSignal | undefined, ms: number): Promise<Response> {
    const deadline = AbortSignal.timeout(ms);
    const all = signal ? AbortSignal.any([signal, deadline]) : deadline;
    const host = t.ip.includes(':') ? `[${t.ip}]` : t.ip;
    try {
      return await fetch(`http://${host}:${this.options.port}${path}`, {
        method,
        // A streamed body goes chunked (the sidecar bounds what it writes itself).
        headers: { [TOKEN_HEADER]: t.token, ...(upload ? { 'Content-Type': 'application/octet-stream' } : {}) },
        signal: all,
        ...(upload ? { body: Readable.toWeb(upload.body) as ReadableStream<Uint8Array>, duplex: 'half' } : {}),
      } as RequestInit);
    } catch (err) {
      upload?.body.destroy();
      if (signal?.aborted) throw signal.reason;
      const why = deadline.aborted ? 'timed out' : ((err as { cause?: { code?: string } }).cause?.code ?? (err as Error).message);
      throw new BridgeError('cluster_unavailable', `the memory-store sidecar of box ${t.box} is not answering (${why}); retry`, { headers: { 'Retry-After': '2' }, cause: err });
    }
  }
}

/** The sidecar's JSON error as the API's: its type and message (safe to show) kept. */
async function errorOf(res: Response, box: string): Promise<BridgeError> {
  let type: ErrorType = 'internal_error';
  let message = `the memory-store sidecar of box ${box} answered ${res.status}`;
  try {
    const body = (await res.json()) as { error?: { type?: string; message?: string } };
    if (body.error?.type && body.error.type in ERROR_STATUS) type = body.error.type as ErrorType;
    if (body.error?.message) message = `box ${box}: ${body.error.message}`;
  } catch {
    // not JSON: the status says enough
  }
  // The sidecar's 401/403 are about the bridge's own credential or address: a fault of ours, not the caller's.
  if (type === 'unauthorized' || type === 'forbidden') type = 'internal_error';
  return new BridgeError(type, message, type === 'cluster_unavailable' ? { headers: { 'Retry-After': '2' } } : {});
}
