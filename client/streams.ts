// Streaming calls: NDJSON output (streamed exec, process output), raw byte downloads and
// uploads, and the terminal WebSocket. Web-platform APIs only (fetch, ReadableStream,
// TextDecoder, WebSocket), so they run in edge isolates too. Streams are never retried: part of
// one may already have taken effect.
import { encodeBase64 } from './base64.js';
import { BridgeClientError, buildUrl, httpError, noResponseError, type HttpConfig } from './http.js';
import type { OutputEvent } from './types.js';

export interface StreamSpec {
  operation: string;
  method: 'GET' | 'POST' | 'PUT';
  path: string;
  query?: Record<string, string | number | boolean | undefined>;
  json?: unknown;
  body?: Uint8Array | ReadableStream<Uint8Array>;
  accept: string;
  /** Deadline of the whole stream (default: none beyond the caller's signal). */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** Sends the request and returns the 2xx response with its body unread. */
export async function openStream(config: HttpConfig, spec: StreamSpec): Promise<Response> {
  const signals = [spec.signal, spec.timeoutMs !== undefined ? AbortSignal.timeout(spec.timeoutMs) : undefined].filter((s): s is AbortSignal => !!s);
  const signal = signals.length ? AbortSignal.any(signals) : undefined;
  const headers: Record<string, string> = { authorization: `Bearer ${config.token}`, accept: spec.accept };
  let body: RequestInit['body'];
  if (spec.json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(spec.json);
  } else if (spec.body !== undefined) {
    headers['content-type'] = 'application/octet-stream';
    body = spec.body as RequestInit['body'];
  }
  let response: Response;
  try {
    const init: RequestInit & { duplex?: 'half' } = { method: spec.method, headers, body, signal };
    if (body instanceof ReadableStream) init.duplex = 'half'; // required by fetch for streamed uploads
    response = await config.fetch(buildUrl(config.apiUrl, spec.path, spec.query), init);
  } catch (err) {
    throw noResponseError(spec.operation, err, signal ?? new AbortController().signal, spec.signal, spec.timeoutMs ?? 0);
  }
  if (!response.ok) throw httpError(spec.operation, response, await response.text().catch(() => ''));
  return response;
}

/** The lines of an NDJSON response as objects; an error line becomes a BridgeClientError. */
export async function* ndjsonEvents(operation: string, response: Response): AsyncGenerator<OutputEvent> {
  if (!response.body) return;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffered += done ? decoder.decode() : decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, newline).trim();
        buffered = buffered.slice(newline + 1);
        if (line) yield parseLine(operation, response, line);
      }
      if (done) break;
    }
    if (buffered.trim()) yield parseLine(operation, response, buffered.trim());
  } finally {
    reader.releaseLock();
    await response.body.cancel().catch(() => undefined);
  }
}

function parseLine(operation: string, response: Response, line: string): OutputEvent {
  let event: OutputEvent;
  try {
    event = JSON.parse(line) as OutputEvent;
  } catch (err) {
    throw new BridgeClientError({ operation, status: response.status, type: 'invalid_response', detail: `not JSON: ${line.slice(0, 80)}`, cause: err });
  }
  if (event.type === 'error') {
    throw new BridgeClientError({ operation, status: response.status, type: event.error.type as never, detail: event.error.message });
  }
  return event;
}

/** Every byte of a response body. */
export async function responseBytes(response: Response): Promise<Uint8Array> {
  return new Uint8Array(await response.arrayBuffer());
}

export const PTY_PROTOCOL = 'sandbox-bridge.pty.v1';
const BEARER_PROTOCOL_PREFIX = 'sandbox-bridge.bearer.';

/** A terminal in a box: bytes in and out, resizable; `exited` resolves with the shell's exit code. */
export interface Terminal {
  readonly socket: WebSocket;
  /** Resolves once the terminal is open. */
  readonly opened: Promise<void>;
  /** Resolves with the exit code when the shell ends (undefined if the connection just closed). */
  readonly exited: Promise<number | undefined>;
  write(data: string | Uint8Array): void;
  resize(cols: number, rows: number): void;
  /** Closes the terminal's input (the shell sees end of file). */
  eof(): void;
  onData(listener: (bytes: Uint8Array) => void): void;
  close(): void;
}

/**
 * Opens GET /boxes/:id/pty as a WebSocket (the global WebSocket of browsers, Node 22+, and edge
 * runtimes). The token travels as a subprotocol, since WebSocket clients cannot set headers.
 */
export function openTerminal(config: HttpConfig, path: string, size: { cols: number; rows: number }, WebSocketImpl: typeof WebSocket = globalThis.WebSocket): Terminal {
  if (!WebSocketImpl) throw new TypeError('no WebSocket available in this runtime');
  const url = buildUrl(config.apiUrl, path, { cols: size.cols, rows: size.rows }).replace(/^http/, 'ws');
  const bearer = BEARER_PROTOCOL_PREFIX + encodeBase64(new TextEncoder().encode(config.token)).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  const socket = new WebSocketImpl(url, [PTY_PROTOCOL, bearer]);
  socket.binaryType = 'arraybuffer';
  const listeners: Array<(bytes: Uint8Array) => void> = [];
  let exitCode: number | undefined;
  const opened = new Promise<void>((resolve, reject) => {
    socket.addEventListener('open', () => resolve(), { once: true });
    socket.addEventListener('error', () => reject(new BridgeClientError({ operation: 'terminal', status: 0, type: 'network_error', message: 'terminal failed: the WebSocket could not be opened' })), { once: true });
  });
  opened.catch(() => undefined);
  const exited = new Promise<number | undefined>((resolve) => socket.addEventListener('close', () => resolve(exitCode), { once: true }));
  socket.addEventListener('message', (event: MessageEvent) => {
    if (typeof event.data === 'string') {
      try {
        const control = JSON.parse(event.data) as { type?: string; exit_code?: number };
        if (control.type === 'exit') exitCode = control.exit_code;
      } catch {
        // not a control message: ignore
      }
      return;
    }
    const bytes = new Uint8Array(event.data as ArrayBuffer);
    for (const listener of listeners) listener(bytes);
  });
  return {
    socket,
    opened,
    exited,
    write: (data) => socket.send(typeof data === 'string' ? new TextEncoder().encode(data) : data),
    resize: (cols, rows) => socket.send(JSON.stringify({ type: 'resize', cols, rows })),
    eof: () => socket.send(JSON.stringify({ type: 'eof' })),
    onData: (listener) => listeners.push(listener),
    close: () => socket.close(1000),
  };
}
