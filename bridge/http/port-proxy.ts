// The HTTP side of traffic to a port in a box (docs/ports.md): what a reverse proxy does to the
// headers each way, and the relays that move an answer (or an upgraded connection) to the caller
// with backpressure, a deadline on quiet periods, and nothing held beyond the pipes' buffers.
// Shared by the authenticated route (/api/v1/boxes/:id/ports/:port/...) and preview links.
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { BridgeError } from '../../common/errors.js';
import type { BoxdPortAnswer } from '../../common/boxd-client.js';

/** Hop-by-hop headers (RFC 9110 7.6.1): never passed on, either way. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

/** How one request is passed on: where it came in, what belongs to the bridge rather than the app. */
export interface Forwarding {
  /** X-Forwarded-Proto / -Host / -For as the caller used the bridge (-For: earlier proxies', when trusted, and the caller). */
  proto: string;
  host: string;
  forwardedFor: string | undefined;
  /** X-Forwarded-Prefix: the path the app is served under ("" for a preview host of its own). */
  prefix: string;
  /** The caller's Authorization is the bridge's bearer token: never passed on. */
  dropAuthorization: boolean;
  /** A cookie of the bridge's (a preview link's): removed from the Cookie header. */
  dropCookie?: string;
  /** A query parameter of the bridge's (a preview link's token): removed from the path. */
  dropQuery?: string;
  /**
   * The app's Set-Cookie: Domain is always removed (cookies stay on the host they came from);
   * with a path, a cookie's Path is put under it (the app shares its host with others).
   */
  cookiePath?: string;
}

/** The headers the app gets: the caller's, without hop-by-hop ones and the bridge's own, plus X-Forwarded-*. */
export function requestHeaders(req: IncomingMessage, how: Forwarding): http.OutgoingHttpHeaders {
  const named = connectionTokens(req.headers.connection);
  const out: http.OutgoingHttpHeaders = {};
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!.toLowerCase();
    if (HOP_BY_HOP.has(name) || named.has(name) || name === 'host' || name === 'expect' || name.startsWith('x-boxd-')) continue;
    if (name === 'authorization' && how.dropAuthorization) continue;
    if (name.startsWith('x-forwarded-')) continue; // set below, as this bridge saw the request
    let value = raw[i + 1]!;
    if (name === 'cookie' && how.dropCookie) {
      value = withoutCookie(value, how.dropCookie);
      if (!value) continue;
    }
    const prev = out[name];
    // Cookie pairs are joined with "; ", every other repeated header with ", " (RFC 9110 5.3).
    out[name] = prev === undefined ? value : `${String(prev)}${name === 'cookie' ? '; ' : ', '}${value}`;
  }
  const upgrade = req.headers.upgrade;
  if (upgrade && named.has('upgrade')) {
    out.connection = 'Upgrade';
    out.upgrade = upgrade;
  }
  if (how.forwardedFor) out['x-forwarded-for'] = how.forwardedFor;
  out['x-forwarded-proto'] = how.proto;
  out['x-forwarded-host'] = how.host;
  if (how.prefix) out['x-forwarded-prefix'] = how.prefix;
  return out;
}

/** The app's answer headers for the caller, as a flat raw list (Set-Cookie may repeat). */
export function answerHeaders(res: IncomingMessage, how: Forwarding, upgrade = false): string[] {
  const named = connectionTokens(res.headers.connection);
  const out: string[] = [];
  const raw = res.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!.toLowerCase();
    if (name.startsWith('x-boxd-')) continue;
    if (HOP_BY_HOP.has(name) || named.has(name)) {
      if (!(upgrade && (name === 'connection' || name === 'upgrade'))) continue;
    }
    const value = name === 'set-cookie' ? confinedCookie(raw[i + 1]!, how.cookiePath) : raw[i + 1]!;
    out.push(raw[i]!, value);
  }
  return out;
}

/**
 * A Set-Cookie kept to where the app is served: no Domain (a cookie for the preview domain would
 * reach every other box's previews), and under cookiePath when given (/preview/<token>/, or the
 * ports route's prefix: an app sharing its host must not set cookies for the rest of it).
 */
export function confinedCookie(setCookie: string, cookiePath?: string): string {
  const [pair, ...attrs] = setCookie.split(';');
  const kept = attrs.map((a) => a.trim()).filter((a) => a && !/^domain\s*=/i.test(a) && !(cookiePath && /^path\s*=/i.test(a)));
  if (cookiePath) {
    const given = /^path\s*=\s*(.*)$/i.exec(attrs.map((a) => a.trim()).find((a) => /^path\s*=/i.test(a)) ?? '')?.[1]?.trim() ?? '/';
    kept.push(`Path=${cookiePath.replace(/\/+$/, '')}${given.startsWith('/') ? given : `/${given}`}`);
  }
  return [pair!.trim(), ...kept].join('; ');
}

/** The Cookie header without the named cookie. */
export function withoutCookie(header: string, name: string): string {
  return header
    .split(';')
    .map((c) => c.trim())
    .filter((c) => c && c.split('=')[0]!.trim() !== name)
    .join('; ');
}

/** The path and query without one query parameter (the preview token in host mode). */
export function withoutQuery(pathAndQuery: string, param: string): string {
  const q = pathAndQuery.indexOf('?');
  if (q < 0) return pathAndQuery;
  const kept = pathAndQuery
    .slice(q + 1)
    .split('&')
    .filter((kv) => kv && decoded(kv.split('=')[0]!) !== param);
  return kept.length ? `${pathAndQuery.slice(0, q)}?${kept.join('&')}` : pathAndQuery.slice(0, q);
}

/** A query parameter's name decoded; one that is not valid percent-encoding stays as it came. */
function decoded(name: string): string {
  try {
    return decodeURIComponent(name.replace(/\+/g, ' '));
  } catch {
    return name;
  }
}

function connectionTokens(value: string | undefined): Set<string> {
  return new Set((value ?? '').split(',').map((t) => t.trim().toLowerCase()).filter(Boolean));
}

/**
 * Moves the app's answer to the caller: status, headers, then the body as it comes (a chunk at a
 * time, pausing the box's side while the caller's is backed up). Resolves when the answer ended
 * or either side went away; a quiet period of idleMs either way ends it.
 */
export function relayAnswer(answer: BoxdPortAnswer, res: ServerResponse, how: Forwarding, idleMs: number, signal: AbortSignal): Promise<void> {
  const from = answer.res;
  // Headers set before (security headers meant for the API's own answers) are not the app's.
  for (const name of res.getHeaderNames()) if (name !== 'x-request-id') res.removeHeader(name);
  const status = from.statusCode ?? 502;
  res.writeHead(status, from.statusMessage || http.STATUS_CODES[status] || '', answerHeaders(from, how));
  // A stream (no length: server-sent events, a long poll) shows its head at once; an answer of
  // known length goes out with its first bytes, in one write.
  if (from.headers['content-length'] === undefined) res.flushHeaders();
  return new Promise<void>((resolve) => {
    const quiet = new Quiet(idleMs, () => from.destroy(new BridgeError('gateway_timeout', `the app sent nothing for ${idleMs} ms`)));
    const finish = () => {
      quiet.stop();
      signal.removeEventListener('abort', onAbort);
      resolve();
    };
    const onAbort = () => {
      from.destroy();
      res.destroy();
    };
    signal.addEventListener('abort', onAbort, { once: true });
    from.on('data', (chunk: Buffer) => {
      quiet.touch();
      if (!res.write(chunk)) {
        from.pause();
        res.once('drain', () => from.resume());
      }
    });
    from.on('end', () => res.end(finish));
    // Cut off mid-answer (the app, the box, a deadline): the caller must see a broken answer,
    // never a short one taken for whole.
    from.on('error', () => {
      res.destroy();
      finish();
    });
    from.on('aborted', () => res.destroy());
    res.on('close', () => {
      if (!from.complete) from.destroy();
      finish();
    });
  });
}

/**
 * Joins the caller's connection to the app's upgraded one: the 101 with the app's headers, then
 * bytes both ways with backpressure. Resolves when either side closes (then both are closed), or
 * after idleMs with no byte either way.
 */
export function relayUpgrade(answer: Extract<BoxdPortAnswer, { upgraded: object }>, client: Duplex, clientHead: Buffer, how: Forwarding, idleMs: number, signal: AbortSignal): Promise<void> {
  const { socket: app, head } = answer.upgraded;
  const headers = answerHeaders(answer.res, how, true);
  const lines = [`HTTP/1.1 101 ${answer.res.statusMessage || 'Switching Protocols'}`];
  for (let i = 0; i + 1 < headers.length; i += 2) lines.push(`${headers[i]}: ${headers[i + 1]}`);
  client.write(`${lines.join('\r\n')}\r\n\r\n`);
  if (head.length) client.write(head);
  if (clientHead.length) app.write(clientHead);
  return new Promise<void>((resolve) => {
    const quiet = new Quiet(idleMs, () => end());
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      quiet.stop();
      signal.removeEventListener('abort', end);
      app.destroy();
      client.destroy();
      resolve();
    };
    signal.addEventListener('abort', end, { once: true });
    const pipe = (from: Duplex, to: Duplex) => {
      from.on('data', (chunk: Buffer) => {
        quiet.touch();
        if (!to.write(chunk)) {
          from.pause();
          to.once('drain', () => from.resume());
        }
      });
      // A half-close passes on (the other way may still have bytes to send); a close ends both.
      from.on('end', () => to.end());
      from.on('close', end);
      from.on('error', end);
    };
    pipe(app, client);
    pipe(client, app);
  });
}

/** A timer armed again by every byte: fires after ms without one. */
class Quiet {
  private last = performance.now();
  private readonly timer: NodeJS.Timeout;

  constructor(ms: number, fire: () => void) {
    // Checked a few times per period rather than re-armed per chunk (a chunk is frequent, a check cheap).
    this.timer = setInterval(() => {
      if (performance.now() - this.last >= ms) fire();
    }, Math.max(100, Math.floor(ms / 4)));
    this.timer.unref();
  }

  touch(): void {
    this.last = performance.now();
  }

  stop(): void {
    clearInterval(this.timer);
  }
}

/** An answer written on a raw connection (an upgrade that did not happen), then the connection closed. */
export function writeRaw(socket: Duplex, status: number, headers: Record<string, string>, body: string | Buffer): void {
  if (socket.destroyed) return;
  const all = { ...headers, 'Content-Length': String(Buffer.byteLength(body)), Connection: 'close' };
  const lines = Object.entries(all).map(([k, v]) => `${k}: ${v}`);
  socket.end(Buffer.concat([Buffer.from(`HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? 'Error'}\r\n${lines.join('\r\n')}\r\n\r\n`), Buffer.from(body)]));
}

/** The app refused the upgrade (a 4xx, say): its answer goes to the caller as it is, then the connection closes. */
export function relayRefusedUpgrade(answer: BoxdPortAnswer, client: Duplex, how: Forwarding): Promise<void> {
  const headers = answerHeaders(answer.res, how);
  const lines = [`HTTP/1.1 ${answer.res.statusCode ?? 502} ${answer.res.statusMessage ?? ''}`, 'Connection: close'];
  for (let i = 0; i + 1 < headers.length; i += 2) if (headers[i]!.toLowerCase() !== 'content-length') lines.push(`${headers[i]}: ${headers[i + 1]}`);
  client.write(`${lines.join('\r\n')}\r\n\r\n`);
  return new Promise<void>((resolve) => {
    answer.res.pipe(client);
    answer.res.on('end', resolve);
    answer.res.on('error', () => {
      client.destroy();
      resolve();
    });
    client.on('close', () => {
      answer.res.destroy();
      resolve();
    });
  });
}
