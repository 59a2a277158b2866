// boxd's archive routes (boxd/PROTOCOL.md "Archives") and its error answers, as plain data: the
// request a call sends (method, path with its query, headers) and the API error a refusal maps
// to. The bridge's BoxdClient speaks them on the main thread; the snapshot worker
// (common/snapshot-worker.ts) sends the same requests from its own thread, so their shape lives
// here once. No runtime imports but errors.ts: this is data, not a client.
import { ERROR_STATUS, type ErrorType } from './errors.js';

/** The header boxd takes the per-box credential in (not Authorization: pods/proxy strips that). */
export const TOKEN_HEADER = 'x-boxd-token';
/** The header a fenced refusal carries: the epoch of the fence that refused it (PROTOCOL.md "Fence"). */
export const FENCE_HEADER = 'x-boxd-fence';
export const ARCHIVE_ROUTE = '/v1/archive';
/** The most of an error body read (boxd's are a line of JSON). */
export const ERROR_BODY_LIMIT = 64 * 1024;

export type BoxdQuery = Record<string, string | number | boolean | undefined>;

/** One HTTP request to a box's boxd, ready to send. */
export interface BoxdRequestShape {
  host: string;
  port: number;
  method: 'GET' | 'PUT';
  /** The route with its query. */
  path: string;
  headers: Record<string, string>;
}

export function queryString(query: BoxdQuery | undefined): string {
  if (!query) return '';
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== undefined) params.set(k, String(v));
  const s = params.toString();
  return s ? `?${s}` : '';
}

/** GET /v1/archive's query: with limits, boxd refuses (413) a tree over them before it sends a byte. */
export function archiveReadQuery(path: string, gzip: boolean, limits?: { maxBytes: number; maxEntries: number }): BoxdQuery {
  return { path, gzip, ...(limits ? { max_bytes: limits.maxBytes, max_entries: limits.maxEntries } : {}) };
}

/** PUT /v1/archive's query; replace: path ends up holding exactly the archive. */
export function archiveWriteQuery(path: string, opts: { maxBytes: number; maxEntries: number; replace?: boolean | undefined }): BoxdQuery {
  return { path, max_bytes: opts.maxBytes, max_entries: opts.maxEntries, ...(opts.replace ? { replace: 'true' } : {}) };
}

/** The archive GET of path (a plain tar, or gzip) under limits, to the box at target. */
export function archiveReadRequest(
  target: { ip: string; token: string },
  port: number,
  path: string,
  gzip: boolean,
  limits?: { maxBytes: number; maxEntries: number },
): BoxdRequestShape {
  return { host: target.ip, port, method: 'GET', path: ARCHIVE_ROUTE + queryString(archiveReadQuery(path, gzip, limits)), headers: { [TOKEN_HEADER]: target.token } };
}

/**
 * The archive PUT into path. Its body is streamed, so it is sent only once boxd accepted the
 * call (100-continue): a call refused before it starts leaves the body unread.
 */
export function archiveWriteRequest(
  target: { ip: string; token: string },
  port: number,
  path: string,
  opts: { maxBytes: number; maxEntries: number; replace?: boolean | undefined },
): BoxdRequestShape {
  return {
    host: target.ip,
    port,
    method: 'PUT',
    path: ARCHIVE_ROUTE + queryString(archiveWriteQuery(path, opts)),
    headers: { [TOKEN_HEADER]: target.token, expect: '100-continue' },
  };
}

/** What a boxd refusal means: a sleep's fence (BoxdFencedError), or an API error. */
export type BoxdRefusal = { fence: number } | { fence?: undefined; type: ErrorType; message: string; headers: Record<string, string> };

/**
 * boxd's answer of status >= 300 (its JSON error body, at most ERROR_BODY_LIMIT bytes of it, or
 * undefined when unread) as the API's error: boxd's error types are the API's; a 401 means our
 * credential for the box is wrong (the caller did nothing wrong); a 409 with FENCE_HEADER is a fence.
 */
export function boxdRefusal(box: string, status: number, fenceHeader: string | string[] | undefined, body: string | undefined): BoxdRefusal {
  const fence = Number(fenceHeader);
  if (status === 409 && Number.isInteger(fence) && fence > 0) return { fence };
  let type: ErrorType = status >= 500 || status === 401 ? 'internal_error' : 'invalid_request';
  let message = `boxd answered ${status}`;
  try {
    const parsed = JSON.parse(body ?? '') as { error?: { type?: string; message?: string } };
    if (parsed.error?.type && parsed.error.type in ERROR_STATUS) type = parsed.error.type as ErrorType;
    if (parsed.error?.message) message = parsed.error.message;
  } catch {
    // not boxd's JSON: keep the generic message
  }
  if (status === 401) return { type: 'internal_error', message: `box ${box} refused the bridge's credential (${message})`, headers: {} };
  return { type, message, headers: type === 'rate_limited' ? { 'Retry-After': '1' } : {} };
}
