// The fetch wrapper under every client call: bearer auth, per-call deadlines via AbortSignal,
// retries with exponential backoff and full jitter, and one error class.
// Web-platform APIs only (fetch, AbortSignal, URL), so it runs in edge isolates as well as Node.
//
// What is retried (mayRetry): a request is sent again only when repeating it cannot do a thing
// twice. GET and DELETE, and a POST carrying an Idempotency-Key (create box: the bridge answers a
// repeated key with the box it already made), are retried on 429 and 503. Any other POST or PUT
// (exec, env, file writes) is retried only on a 429 the bridge typed rate_limited or
// quota_exceeded, which it sends before doing anything; a 503 may come after the command ran
// (a proxy, a replica dying mid-answer), so it is returned to the caller. No request is retried
// after a network error or timeout: the outcome is unknown.
import type { BridgeErrorType } from './types.js';

/** What went wrong when there is no bridge error body: no response, or a response we cannot use. */
export type ClientFailure = 'timeout' | 'aborted' | 'network_error' | 'http_error' | 'invalid_response' | 'sandbox_destroyed';

export class BridgeClientError extends Error {
  override readonly name = 'BridgeClientError';
  /** The client operation, e.g. "create", "exec". */
  readonly operation: string;
  /** HTTP status; 0 when no response arrived (timeout, abort, network failure). */
  readonly status: number;
  /** The bridge's error type from the body, or the client-side failure kind. */
  readonly type: BridgeErrorType | ClientFailure;
  /** The bridge's own message, when it sent one. */
  readonly detail: string | undefined;
  /** Retry-After in milliseconds, when the response carried one. */
  readonly retryAfterMs: number | undefined;
  /** X-Request-Id of the failed response: quote it when reading the bridge's logs. */
  readonly requestId: string | undefined;

  constructor(init: {
    operation: string;
    status: number;
    type: BridgeErrorType | ClientFailure;
    detail?: string;
    retryAfterMs?: number;
    requestId?: string;
    message?: string;
    cause?: unknown;
  }) {
    // "create failed: 401 unauthorized: wrong bearer token"; the status leads so logs grep well.
    const message =
      init.message ??
      `${init.operation} failed: ${init.status}${init.type !== 'http_error' ? ` ${init.type}` : ''}${init.detail ? `: ${init.detail}` : ''}`;
    super(message, { cause: init.cause });
    this.operation = init.operation;
    this.status = init.status;
    this.type = init.type;
    this.detail = init.detail;
    this.retryAfterMs = init.retryAfterMs;
    this.requestId = init.requestId;
  }
}

export type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

export interface RetryOptions {
  /** Retries after the first attempt (default 3; 0 disables retrying). */
  max?: number;
  /** First backoff ceiling; it doubles per retry (default 200 ms). */
  baseDelayMs?: number;
  /** Upper bound of the backoff ceiling (default 5000 ms). Retry-After may ask for longer. */
  maxDelayMs?: number;
  /** Called before each retry wait, e.g. to log it. */
  onRetry?: (info: { operation: string; attempt: number; status: number; type: string; delayMs: number }) => void;
}

export interface HttpConfig {
  /** Base URL of the API, ending in /api/v1 (no trailing slash). */
  apiUrl: string;
  token: string;
  fetch: FetchLike;
  timeoutMs: number;
  retry: Required<Omit<RetryOptions, 'onRetry'>> & Pick<RetryOptions, 'onRetry'>;
}

/** Per-call options every client method accepts. */
export interface CallOptions {
  /** Deadline for the whole call, retry waits included (default: the client's timeoutMs). */
  timeoutMs?: number;
  /** Cancels the call; combined with the deadline. */
  signal?: AbortSignal;
}

export interface RequestSpec extends CallOptions {
  operation: string;
  method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  path: string;
  query?: Record<string, string | number | boolean | undefined>;
  /** A JSON body (serialised here), raw text, or raw bytes. */
  json?: unknown;
  text?: string;
  bytes?: Uint8Array;
  /** How to read a 2xx response. */
  expect: 'json' | 'text';
  /** Sent as the Idempotency-Key header: the request may then be repeated like a GET. */
  idempotencyKey?: string;
}

/** Whether a failed attempt may be sent again (see the top of this file). */
export function mayRetry(spec: Pick<RequestSpec, 'method' | 'idempotencyKey'>, status: number, type: string): boolean {
  if (status === 429 && (type === 'rate_limited' || type === 'quota_exceeded')) return true; // refused before running
  if (status !== 429 && status !== 503) return false;
  return spec.method === 'GET' || spec.method === 'DELETE' || spec.idempotencyKey !== undefined;
}

export async function request<T>(config: HttpConfig, spec: RequestSpec): Promise<T> {
  const timeoutMs = spec.timeoutMs ?? config.timeoutMs;
  const deadline = Date.now() + timeoutMs;
  const timeout = AbortSignal.timeout(timeoutMs);
  const signal = spec.signal ? AbortSignal.any([timeout, spec.signal]) : timeout;
  const url = buildUrl(config.apiUrl, spec.path, spec.query);
  const headers: Record<string, string> = { authorization: `Bearer ${config.token}`, accept: spec.expect === 'json' ? 'application/json' : 'text/plain' };
  if (spec.idempotencyKey !== undefined) headers['idempotency-key'] = spec.idempotencyKey;
  let body: string | Uint8Array | undefined;
  if (spec.json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(spec.json);
  } else if (spec.text !== undefined) {
    headers['content-type'] = 'text/plain; charset=utf-8';
    body = spec.text;
  } else if (spec.bytes !== undefined) {
    headers['content-type'] = 'application/octet-stream';
    body = spec.bytes;
  }

  for (let attempt = 0; ; attempt++) {
    let response: Response;
    let text: string;
    try {
      response = await config.fetch(url, { method: spec.method, headers, body, signal });
      text = await response.text();
    } catch (err) {
      throw noResponseError(spec.operation, err, timeout, spec.signal, timeoutMs);
    }
    if (response.ok) return parseBody<T>(spec, response, text);

    const error = httpError(spec.operation, response, text);
    if (!mayRetry(spec, response.status, error.type) || attempt >= config.retry.max) throw error;
    const ceiling = Math.min(config.retry.maxDelayMs, config.retry.baseDelayMs * 2 ** attempt);
    // Full jitter spreads retrying clients apart; Retry-After is a floor, never shortened.
    const delayMs = Math.max(error.retryAfterMs ?? 0, Math.round(Math.random() * ceiling));
    // A wait that outlasts the deadline would end in a timeout: the bridge's answer says more.
    if (Date.now() + delayMs >= deadline) throw error;
    config.retry.onRetry?.({ operation: spec.operation, attempt: attempt + 1, status: response.status, type: error.type, delayMs });
    try {
      await sleep(delayMs, signal);
    } catch (err) {
      throw noResponseError(spec.operation, err, timeout, spec.signal, timeoutMs);
    }
  }
}

export function buildUrl(apiUrl: string, path: string, query: RequestSpec['query']): string {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query ?? {})) if (value !== undefined) params.set(name, String(value));
  const qs = params.toString();
  return `${apiUrl}${path}${qs ? `?${qs}` : ''}`;
}

function parseBody<T>(spec: RequestSpec, response: Response, text: string): T {
  if (spec.expect === 'text') return text as T;
  try {
    return JSON.parse(text) as T;
  } catch (err) {
    throw new BridgeClientError({
      operation: spec.operation,
      status: response.status,
      type: 'invalid_response',
      detail: `expected JSON, got ${JSON.stringify(text.slice(0, 80))}`,
      requestId: response.headers.get('x-request-id') ?? undefined,
      cause: err,
    });
  }
}

export function httpError(operation: string, response: Response, text: string): BridgeClientError {
  let type: BridgeErrorType | 'http_error' = 'http_error';
  let detail: string | undefined;
  try {
    const parsed = JSON.parse(text) as { error?: { type?: unknown; message?: unknown } };
    if (typeof parsed?.error?.type === 'string') {
      type = parsed.error.type as BridgeErrorType;
      detail = typeof parsed.error.message === 'string' ? parsed.error.message : undefined;
    }
  } catch {
    // Not the bridge's JSON (a proxy's HTML page, say): the status alone is the message.
  }
  return new BridgeClientError({
    operation,
    status: response.status,
    type,
    detail,
    retryAfterMs: parseRetryAfter(response.headers.get('retry-after')),
    requestId: response.headers.get('x-request-id') ?? undefined,
  });
}

/** Retry-After is delta-seconds or an HTTP date (RFC 9110 10.2.3). */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (!value) return undefined;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000;
  const date = Date.parse(trimmed);
  return Number.isNaN(date) ? undefined : Math.max(0, date - now);
}

export function noResponseError(operation: string, err: unknown, timeout: AbortSignal, caller: AbortSignal | undefined, timeoutMs: number): BridgeClientError {
  if (err instanceof BridgeClientError) return err;
  if (timeout.aborted) {
    return new BridgeClientError({ operation, status: 0, type: 'timeout', message: `${operation} failed: timed out after ${timeoutMs} ms`, cause: err });
  }
  if (caller?.aborted) {
    return new BridgeClientError({ operation, status: 0, type: 'aborted', message: `${operation} failed: aborted`, cause: caller.reason ?? err });
  }
  const reason = err instanceof Error ? (err.cause instanceof Error ? `${err.message} (${err.cause.message})` : err.message) : String(err);
  return new BridgeClientError({ operation, status: 0, type: 'network_error', message: `${operation} failed: ${reason}`, cause: err });
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
