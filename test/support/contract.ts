// Holds real answers of the bridge to its contract: the route table (bridge/api-routes.ts) that
// the OpenAPI document is generated from. api() (support/bridge.ts) checks every answer it gets;
// checkedFetch() does the same for the client's requests; expectSchema() checks one value.
// A check fails with a ContractError naming the route, the status and what is wrong.
import type { z } from 'zod';
import { API_ROUTES, NDJSON, type ApiRoute, type Content } from '../../bridge/api-routes.js';
import { errorStatuses } from '../../bridge/openapi.js';
import { ErrorBody, describeIssues } from '../../bridge/schemas.js';
import { ERROR_STATUS } from '../../common/errors.js';
import type { FetchLike } from '../../client/http.js';

export class ContractError extends Error {
  override readonly name = 'ContractError';
}

// Routes with fewer path parameters first, so a fixed segment wins (/sandboxes/metrics).
const MATCHERS = API_ROUTES.map((route) => ({
  route,
  params: (route.path.match(/\{/g) ?? []).length,
  // A trailing {path} spans segments (GET /sessions/{sessionId}/outputs/{path}), and may be empty
  // (/boxes/{id}/ports/{port}/); other parameters are one each.
  regex: new RegExp(`^${route.path.replace(/[.]/g, '\\.').replace(/\{path\}$/, '.*').replace(/\{[^}]+\}/g, '[^/]+')}$`),
})).sort((a, b) => a.params - b.params);

/** The route of the table that serves `method path` (path under /api/v1, query allowed). */
export function routeOf(method: string, path: string): ApiRoute | undefined {
  const pathname = path.split('?')[0]!;
  return MATCHERS.find((m) => m.route.method === method.toLowerCase() && m.regex.test(pathname))?.route;
}

/**
 * Parses `value` with `schema` and fails unless it matches exactly: no field the schema does not
 * name (zod would silently drop it; the document says additionalProperties: false).
 */
export function expectSchema<S extends z.ZodType>(schema: S, value: unknown, where = 'value'): z.output<S> {
  const result = schema.safeParse(value);
  if (!result.success) throw new ContractError(`${where} does not match its schema: ${describeIssues(result.error)}\n${JSON.stringify(value).slice(0, 2000)}`);
  const extra = unknownFields(value, result.data, '');
  if (extra.length) throw new ContractError(`${where} has fields its schema does not name: ${extra.join(', ')}\n${JSON.stringify(value).slice(0, 2000)}`);
  return result.data;
}

/** Fields of `input` that parsing dropped (the schemas of answers transform nothing else). */
function unknownFields(input: unknown, output: unknown, at: string): string[] {
  if (Array.isArray(input) && Array.isArray(output)) return input.flatMap((item, i) => unknownFields(item, output[i], `${at}[${i}]`));
  if (!isObject(input) || !isObject(output)) return [];
  return Object.keys(input).flatMap((key) => (key in output ? unknownFields(input[key], output[key], `${at}.${key}`) : [`${at}.${key}`.slice(1) || key]));
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** What the table says an answer with this status and Content-Type carries. */
export function documentedBody(method: string, path: string, status: number, contentType: string | null): { what: string; payload: Content[string] } {
  const route = routeOf(method, path);
  const what = `${method.toUpperCase()} ${path.split('?')[0]} -> ${status}`;
  // A port's answers are its app's, whatever their status and type.
  if (route?.proxied) return { what, payload: 'bytes' };
  const media = (contentType ?? '').split(';')[0]!.trim().toLowerCase();
  if (status >= 400) {
    if (route && !errorStatuses(route).includes(status)) {
      throw new ContractError(`${what}: the document does not list this status for ${route.method.toUpperCase()} ${route.path} (it lists ${errorStatuses(route).join(', ')})`);
    }
    if (media !== 'application/json') throw new ContractError(`${what}: an error answer must be application/json, not ${media || 'without a type'}`);
    return { what, payload: ErrorBody };
  }
  if (!route) throw new ContractError(`${what}: no route of the document serves this`);
  const answer = route.responses[status];
  if (!answer) throw new ContractError(`${what}: the document lists ${Object.keys(route.responses).join(', ')} for ${route.method.toUpperCase()} ${route.path}`);
  const payload = answer.content?.[media];
  if (!payload) throw new ContractError(`${what}: Content-Type ${media || '(none)'} is not documented (${Object.keys(answer.content ?? {}).join(', ') || 'no body'})`);
  return { what, payload };
}

function checkError(what: string, status: number, value: unknown): void {
  const body = expectSchema(ErrorBody, value, what);
  if (ERROR_STATUS[body.error.type] !== status) throw new ContractError(`${what}: error type ${body.error.type} belongs with status ${ERROR_STATUS[body.error.type]}`);
}

/** Checks a whole answer (path under /api/v1); throws a ContractError for any mismatch. */
export function checkAnswer(method: string, path: string, status: number, contentType: string | null, text: string): void {
  const { what, payload } = documentedBody(method, path, status, contentType);
  if (payload === 'bytes' || payload === 'text') return;
  if (status >= 400) return checkError(what, status, parseJson(what, text));
  if ((contentType ?? '').startsWith(NDJSON)) {
    for (const line of text.split('\n')) if (line.trim()) checkLine(what, payload, line);
    return;
  }
  expectSchema(payload, parseJson(what, text), what);
}

function checkLine(what: string, schema: z.ZodType, line: string): void {
  const value = parseJson(what, line);
  // A stream that fails after it began ends with an error line, which must be a proper error.
  if (isObject(value) && value.type === 'error') expectSchema(ErrorBody, { error: value.error }, `${what} (error line)`);
  else expectSchema(schema, value, `${what} (line)`);
}

function parseJson(what: string, text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new ContractError(`${what}: not JSON: ${text.slice(0, 200)}`);
  }
}

/**
 * fetch for a client under test (createBridgeClient({ fetch: checkedFetch() })): every answer is
 * checked; NDJSON streams line by line as the client reads them (a bad line errors the stream).
 */
export function checkedFetch(inner: FetchLike = (input, init) => fetch(input, init)): FetchLike {
  return async (input, init) => {
    const res = await inner(input, init);
    const url = new URL(input);
    const path = url.pathname.replace(/^\/api\/v1/, '') + url.search;
    const method = init.method ?? 'GET';
    const type = res.headers.get('content-type');
    const { what, payload } = documentedBody(method, path, res.status, type);
    if (payload === 'bytes' || payload === 'text' || !res.body) return res;
    if (res.status < 400 && (type ?? '').startsWith(NDJSON)) {
      return new Response(res.body.pipeThrough(lineChecker(what, payload)), { status: res.status, statusText: res.statusText, headers: res.headers });
    }
    checkAnswer(method, path, res.status, type, await res.clone().text());
    return res;
  };
}

function lineChecker(what: string, schema: z.ZodType): TransformStream<Uint8Array, Uint8Array> {
  const decoder = new TextDecoder();
  let buffered = '';
  const take = (final: boolean) => {
    const lines = buffered.split('\n');
    buffered = final ? '' : lines.pop()!;
    for (const line of lines) if (line.trim()) checkLine(what, schema, line);
  };
  return new TransformStream({
    transform(chunk, controller) {
      buffered += decoder.decode(chunk, { stream: true });
      take(false);
      controller.enqueue(chunk);
    },
    flush() {
      buffered += decoder.decode();
      take(true);
    },
  });
}
