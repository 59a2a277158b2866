// Traffic to a port a box's app listens on (docs/ports.md), over HTTP and WebSocket upgrades:
// - /api/v1/boxes/:id/ports/:port/<path>: with the bridge's bearer token (boxes:write), every method;
// - preview links: no bearer token, a signed token instead (host mode: the link's query once, then
//   a cookie of the preview host; path mode: /<prefix>/<token>/<path>). They are served before
//   the request log and every API middleware: their URL carries a secret, and their errors are for
//   browsers (a small HTML page when HTML is accepted).
// Moving bytes is port-proxy.ts's; reaching the box is services/ports.ts's.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { RequestHandler } from 'express';
import type { Logger } from 'pino';
import type { BoxdPortAnswer, BoxdPortRequest } from '../../common/boxd-client.js';
import { BridgeError } from '../../common/errors.js';
import type { KeyedLimiter } from '../../common/rate-limit.js';
import { PREVIEW_PARAM, type PreviewUrls } from '../services/preview-links.js';
import type { PortService } from '../services/ports.js';
import { sourceKey } from './auth.js';
import { relayAnswer, relayRefusedUpgrade, relayUpgrade, requestHeaders, withoutQuery, writeRaw, type Forwarding } from './port-proxy.js';

/** /boxes/:id/ports/:port[/path][?query], relative to /api/v1 (as the api router sees req.url). */
const API_PORT_PATH = /^\/boxes\/([^/?]+)\/ports\/([^/?]*)(.*)$/;
/** The same, as the server sees an upgrade's URL. */
export const PORT_UPGRADE_PATH = /^\/api\/v1\/boxes\/([^/?]+)\/ports\/([^/?]*)(.*)$/;

export interface PortHttpDeps {
  ports: PortService;
  log: Logger;
  /** Express's trust proxy setting: whether X-Forwarded-* that came in are believed. */
  trustProxy: boolean | number | string;
  /** Requests with a preview token that is not ours, per source address (the bridge's failed-auth limit). */
  failures: KeyedLimiter;
  /** Authenticates an upgrade on the API route (bearer token, rate, boxes:write). */
  admit: (req: IncomingMessage) => Promise<void>;
}

/** Where the app's request goes and how: the box, the port, its path, and what is the bridge's. */
interface Target {
  boxId: string;
  port: number;
  /** The app's path and query, escaped as they came ("/" at least). */
  path: string;
  how: Forwarding;
  /** Host mode, a token that came in the query: kept in a cookie of the preview host (Set-Cookie). */
  setCookie?: string;
}

/** The authenticated route, inside the api router (after authentication, the rate limit and the scope). */
export function portRoute(deps: Pick<PortHttpDeps, 'ports' | 'trustProxy'>): RequestHandler {
  return (req, res, next) => {
    const m = API_PORT_PATH.exec(req.url);
    if (!m) return next();
    let target: Target;
    try {
      target = apiTarget(m, req, deps.trustProxy);
    } catch (err) {
      return next(err);
    }
    forwardHttp(deps.ports, target, req, res).catch(next);
  };
}

/** Preview links over HTTP: before the request log and the API (their URL holds a secret). */
export function previewRoutes(deps: Omit<PortHttpDeps, 'admit'>): RequestHandler {
  return (req, res, next) => {
    const urls = deps.ports.previewUrls;
    if (!urls) return next();
    const found = previewRequest(urls, req);
    if (!found) return next();
    // A link without its trailing slash: relative URLs in the app's pages would miss the token.
    if (found.redirect && (req.method === 'GET' || req.method === 'HEAD')) {
      res.statusCode = 308;
      res.setHeader('Location', found.redirect);
      res.setHeader('Cache-Control', 'no-store');
      return res.end();
    }
    servePreview(deps, urls, found, req, sourceKey(req))
      .then((target) => forwardHttp(deps.ports, target, req, res))
      .catch((err: unknown) => answerError(res, req.headers.accept, err, deps.log));
  };
}

/** WebSocket (and any other) upgrades to ports: the API route and preview links. */
export function portUpgrades(deps: PortHttpDeps) {
  const open = new Set<Duplex>();
  const handle = async (req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> => {
    const urls = deps.ports.previewUrls;
    const preview = urls ? previewRequest(urls, req) : undefined;
    let target: Target;
    if (preview) {
      target = await servePreview(deps, urls!, preview, req, sourceKey({ ip: req.socket.remoteAddress }));
    } else {
      const m = PORT_UPGRADE_PATH.exec(req.url ?? '')!;
      await deps.admit(req);
      target = apiTarget(m, req, deps.trustProxy, '/api/v1');
    }
    await forwardUpgrade(deps.ports, target, req, socket, head);
  };
  return {
    /** Whether this upgrade is a port's (the terminal route takes the rest). */
    handles(req: IncomingMessage): boolean {
      if (PORT_UPGRADE_PATH.test(req.url ?? '')) return true;
      const urls = deps.ports.previewUrls;
      return urls !== undefined && previewRequest(urls, req) !== undefined;
    },
    onUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
      socket.on('error', () => undefined);
      open.add(socket);
      socket.once('close', () => open.delete(socket));
      handle(req, socket, head).catch((err: unknown) => {
        const e = asBridgeError(err, deps.log);
        const html = wantsHtml(req.headers.accept);
        writeRaw(socket, e.status, { 'Content-Type': html ? 'text/html; charset=utf-8' : 'application/json', ...e.headers }, html ? errorPage(e) : JSON.stringify(e.toJSON()));
      });
    },
    /** Closes every connection upgraded through a port (shutdown: they are not the server's any more). */
    close(): void {
      for (const socket of open) socket.destroy();
    },
  };
}

// ---- forwarding ----

async function forwardHttp(ports: PortService, target: Target, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const gone = new AbortController();
  const onClose = () => {
    if (!res.writableFinished) gone.abort(new BridgeError('invalid_request', 'the caller went away'));
  };
  res.on('close', onClose);
  try {
    const request: BoxdPortRequest = { method: req.method ?? 'GET', path: target.path, headers: requestHeaders(req, target.how), ...(hasBody(req) ? { body: req } : {}) };
    await ports.open(
      target.boxId,
      target.port,
      request,
      (answer, signal) => {
        if (target.setCookie) answer.res.rawHeaders.push('Set-Cookie', target.setCookie);
        return relayAnswer(answer, res, target.how, ports.limits.idleMs, signal);
      },
      gone.signal,
    );
  } finally {
    res.off('close', onClose);
  }
}

async function forwardUpgrade(ports: PortService, target: Target, req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
  const gone = new AbortController();
  const onClose = () => gone.abort(new BridgeError('invalid_request', 'the caller went away'));
  socket.once('close', onClose);
  try {
    const request: BoxdPortRequest = { method: req.method ?? 'GET', path: target.path, headers: requestHeaders(req, target.how) };
    await ports.open(
      target.boxId,
      target.port,
      request,
      (answer: BoxdPortAnswer, signal) => {
        if (target.setCookie) answer.res.rawHeaders.push('Set-Cookie', target.setCookie);
        return answer.upgraded ? relayUpgrade(answer, socket, head, target.how, ports.limits.idleMs, signal) : relayRefusedUpgrade(answer, socket, target.how);
      },
      gone.signal,
    );
  } finally {
    socket.off('close', onClose);
  }
}

function hasBody(req: IncomingMessage): boolean {
  const length = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (length !== undefined && length !== '0');
}

// ---- the authenticated route ----

function apiTarget(m: RegExpExecArray, req: IncomingMessage, trustProxy: PortHttpDeps['trustProxy'], mount = ''): Target {
  const boxId = decodeURIComponent(m[1]!);
  const port = portNumber(m[2]!);
  const rest = m[3]!;
  const prefix = `${mount || '/api/v1'}/boxes/${m[1]}/ports/${port}`;
  return {
    boxId,
    port,
    path: rest === '' ? '/' : rest.startsWith('?') ? `/${rest}` : rest,
    how: {
      ...forwarded(req, trustProxy),
      prefix,
      // The bearer token is the bridge's; the app's cookies stay under this route.
      dropAuthorization: true,
      cookiePath: `${prefix}/`,
    },
  };
}

function portNumber(text: string): number {
  if (!/^[1-9][0-9]{0,4}$/.test(text) || Number(text) > 65535) throw new BridgeError('invalid_request', `the port must be a number from 1 to 65535, not "${text}"`);
  return Number(text);
}

// ---- preview links ----

interface PreviewRequest {
  /** Host mode: the box and port the host names. */
  host?: { boxId: string; port: number };
  token: string | undefined;
  /** The token came in the link's query (host mode): kept in a cookie from now on. */
  fromQuery: boolean;
  path: string;
  prefix: string;
  /** Path mode, a link without its trailing slash: where to send the browser. */
  redirect?: string;
}

function previewRequest(urls: PreviewUrls, req: IncomingMessage): PreviewRequest | undefined {
  const url = req.url ?? '/';
  if (urls.mode === 'host') {
    const host = urls.matchHost(req.headers.host);
    if (!host) return undefined;
    const query = new URLSearchParams(url.includes('?') ? url.slice(url.indexOf('?') + 1) : '');
    const fromQuery = query.get(PREVIEW_PARAM) ?? undefined;
    const token = fromQuery ?? cookieValue(req.headers.cookie, urls.cookieName);
    return { host, token, fromQuery: fromQuery !== undefined, path: withoutQuery(url, PREVIEW_PARAM) || '/', prefix: '' };
  }
  const m = urls.matchPath(url);
  if (!m) return undefined;
  const prefix = `${urls.prefix}/${m.token}`;
  return { token: m.token, fromQuery: false, path: m.rest, prefix, ...(m.bare ? { redirect: `${prefix}/${url.slice(prefix.length).replace(/^\//, '')}` } : {}) };
}

async function servePreview(deps: Omit<PortHttpDeps, 'admit'>, urls: PreviewUrls, p: PreviewRequest, req: IncomingMessage, source: string): Promise<Target> {
  if (!p.token) throw new BridgeError('unauthorized', 'this preview needs its link (the one with the token): open it again');
  let claims;
  try {
    claims = await deps.ports.checkPreview(p.token, p.host);
  } catch (err) {
    // A token that is not ours counts as a failed authentication of its source.
    if (err instanceof BridgeError && err.type === 'not_found') {
      const limit = await deps.failures.take(source);
      if (!limit.allowed) throw new BridgeError('rate_limited', 'too many requests with bad preview links from this address', { headers: { 'Retry-After': String(limit.resetSeconds) } });
    }
    throw err;
  }
  const how: Forwarding = {
    ...forwarded(req, deps.trustProxy),
    prefix: p.prefix,
    // No bearer token comes with a preview: an Authorization header is the app's (its own login).
    dropAuthorization: false,
    ...(urls.mode === 'host' ? { dropCookie: urls.cookieName } : { cookiePath: `${p.prefix}/` }),
  };
  const target: Target = { boxId: claims.boxId, port: claims.port, path: p.path, how };
  if (p.fromQuery) {
    const maxAge = Math.max(0, claims.expiresAt - Math.floor(Date.now() / 1000));
    // Host-only (no Domain): no other preview host sees it. With https: __Host- prefixed, and
    // partitioned (CHIPS) so a link still works inside another site's iframe.
    const attrs = urls.scheme === 'https' ? 'Secure; HttpOnly; SameSite=None; Partitioned' : 'HttpOnly; SameSite=Lax';
    target.setCookie = `${urls.cookieName}=${p.token}; Path=/; Max-Age=${maxAge}; ${attrs}`;
  }
  return target;
}

function cookieValue(header: string | undefined, name: string): string | undefined {
  for (const part of (header ?? '').split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

// ---- forwarded headers ----

function trusted(trustProxy: PortHttpDeps['trustProxy']): boolean {
  return trustProxy !== false && trustProxy !== 0 && trustProxy !== '';
}

function protoOf(req: IncomingMessage, trustProxy: PortHttpDeps['trustProxy']): string {
  const given = trusted(trustProxy) ? String(req.headers['x-forwarded-proto'] ?? '').split(',')[0]!.trim() : '';
  if (given === 'http' || given === 'https') return given;
  return (req.socket as { encrypted?: boolean }).encrypted ? 'https' : 'http';
}

/** X-Forwarded-* as a reverse proxy sets them: earlier proxies' only when TRUST_PROXY says they are ours. */
function forwarded(req: IncomingMessage, trustProxy: PortHttpDeps['trustProxy']): Pick<Forwarding, 'proto' | 'host' | 'forwardedFor'> {
  const trust = trusted(trustProxy);
  const prior = trust ? req.headers['x-forwarded-for'] : undefined;
  const host = (trust ? String(req.headers['x-forwarded-host'] ?? '').split(',')[0]!.trim() : '') || req.headers.host || '';
  return { proto: protoOf(req, trustProxy), host, forwardedFor: [prior, req.socket.remoteAddress].filter(Boolean).join(', ') || undefined };
}

// ---- errors for browsers ----

function asBridgeError(err: unknown, log: Logger): BridgeError {
  if (err instanceof BridgeError) return err;
  log.error({ err }, 'port request failed');
  return new BridgeError('internal_error', 'internal error; see the bridge logs');
}

function answerError(res: ServerResponse, accept: string | undefined, err: unknown, log: Logger): void {
  const e = asBridgeError(err, log);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  for (const [k, v] of Object.entries(e.headers)) res.setHeader(k, v);
  res.setHeader('Cache-Control', 'no-store');
  res.statusCode = e.status;
  if (wantsHtml(accept)) {
    // The bridge's own page: nothing on it runs, loads or frames anything.
    res.setHeader('Content-Type', 'text/html; charset=utf-8');
    res.setHeader('Content-Security-Policy', "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'");
    res.setHeader('X-Content-Type-Options', 'nosniff');
    res.end(errorPage(e));
  } else {
    res.setHeader('Content-Type', 'application/json');
    res.end(JSON.stringify(e.toJSON()));
  }
}

function wantsHtml(accept: string | undefined): boolean {
  return /\btext\/html\b/i.test(accept ?? '');
}

function errorPage(e: BridgeError): string {
  const title = e.status === 410 ? 'This preview link has expired' : e.status === 404 ? 'Preview not found' : e.status === 502 ? 'Nothing is listening on this port' : 'Preview unavailable';
  const esc = (s: string) => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="robots" content="noindex"><title>${esc(title)}</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:36em;margin:4em auto;padding:0 1em;color:#222}code{color:#666}</style></head>
<body><h1>${esc(title)}</h1><p>${esc(e.message)}</p><p><code>${e.status} ${esc(e.type)}</code></p></body></html>\n`;
}
