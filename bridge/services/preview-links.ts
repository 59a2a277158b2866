// Preview links (docs/ports.md): URLs a browser opens without the bridge's token, each reaching
// one port of one box until it expires. A link carries a token signed with PREVIEW_KEY (HMAC-SHA256):
//
//     <box id>.<port>.<expires, unix s>.<generation>.<record>.<signature, base64url>
//
// `record` is the first 8 hex digits of the UID of the box's record, so a box deleted and made
// again under the same id (ids repeat per session slot) is never reached by the old box's links;
// `generation` is the port's preview generation (in the box's record) when the link was made, and
// revoking the port's links moves it on. Pure: no I/O here.
import { createHmac, timingSafeEqual } from 'node:crypto';

export interface PreviewClaims {
  boxId: string;
  port: number;
  /** Unix seconds. */
  expiresAt: number;
  generation: number;
  /** The first 8 hex digits of the box record's UID. */
  record: string;
}

const BOX = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const TOKEN = /^([a-z0-9][-a-z0-9]{0,62})\.([1-9][0-9]{0,4})\.([1-9][0-9]{0,11})\.(0|[1-9][0-9]{0,9})\.([0-9a-f]{8})\.([A-Za-z0-9_-]{43})$/;

export class PreviewSigner {
  constructor(private readonly key: Buffer) {
    if (key.length < 32) throw new Error('the preview key must be at least 32 bytes');
  }

  sign(c: PreviewClaims): string {
    if (!BOX.test(c.boxId) || !(c.port >= 1 && c.port <= 65535) || !/^[0-9a-f]{8}$/.test(c.record)) throw new Error('claims out of shape');
    const payload = `${c.boxId}.${c.port}.${c.expiresAt}.${c.generation}.${c.record}`;
    return `${payload}.${this.mac(payload).toString('base64url')}`;
  }

  /** The claims of a token signed with this key, or undefined (malformed, or not ours). Expiry is the caller's. */
  verify(token: string): PreviewClaims | undefined {
    const m = TOKEN.exec(token);
    if (!m) return undefined;
    const payload = token.slice(0, token.lastIndexOf('.'));
    const given = Buffer.from(m[6]!, 'base64url');
    const want = this.mac(payload);
    if (given.length !== want.length || !timingSafeEqual(given, want)) return undefined;
    const port = Number(m[2]);
    if (port > 65535) return undefined;
    return { boxId: m[1]!, port, expiresAt: Number(m[3]), generation: Number(m[4]), record: m[5]! };
  }

  private mac(payload: string): Buffer {
    return createHmac('sha256', this.key).update(`sandbox-bridge-preview:v1:${payload}`).digest();
  }
}

/** The first 8 hex digits of a record UID (a link's `record` claim). */
export function recordTag(uid: string): string {
  return uid.replace(/-/g, '').slice(0, 8).toLowerCase();
}

/**
 * Where preview links are served (PREVIEW_URL):
 * - host mode, `https://{port}-{box}.preview.example.com`: one host per box and port (wildcard DNS
 *   and certificate); the token rides in the link's query once, then in a cookie of that host;
 * - path mode, `https://bridge.example.com/preview`: every link under one host,
 *   `/preview/<token>/...` (no wildcard DNS needed; apps must use relative URLs).
 */
export class PreviewUrls {
  readonly mode: 'host' | 'path';
  readonly scheme: 'http' | 'https';
  /** Path mode: the prefix links are served under ("/preview"). */
  readonly prefix: string;
  private readonly host: string;
  private readonly hostPattern?: RegExp;
  private readonly hostOrder: Array<'port' | 'box'> = [];

  constructor(url: string) {
    const m = /^(https?):\/\/([^/?#]+)(\/[^?#]*)?$/.exec(url.trim());
    if (!m) throw new Error('must be an http(s) URL: https://{port}-{box}.preview.example.com, or https://host/prefix');
    this.scheme = m[1] as 'http' | 'https';
    this.host = m[2]!.toLowerCase();
    const path = (m[3] ?? '').replace(/\/+$/, '');
    const placeholders = [...this.host.matchAll(/\{(port|box)\}/g)].map((p) => p[1] as 'port' | 'box');
    if (placeholders.length) {
      if (placeholders.length !== 2 || new Set(placeholders).size !== 2) throw new Error('a host pattern must name {port} and {box} once each');
      if (path) throw new Error('a host pattern has no path: links are served at the root of their own host');
      if (!/^[a-z0-9.{}:-]+$/.test(this.host)) throw new Error(`"${this.host}" is not a host pattern`);
      this.mode = 'host';
      this.prefix = '';
      this.hostOrder = placeholders;
      const source = this.host
        .split(/(\{port\}|\{box\})/)
        .map((part) => (part === '{port}' ? '([1-9][0-9]{0,4})' : part === '{box}' ? '([a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)' : part.replace(/[.*+?^$()|[\]\\]/g, '\\$&')))
        .join('');
      this.hostPattern = new RegExp(`^${source}$`);
    } else {
      if (!path || path.startsWith('/api/') || path === '/api') throw new Error('path mode needs a prefix of its own, such as https://bridge.example.com/preview');
      if (!/^(\/[A-Za-z0-9._~-]+)+$/.test(path)) throw new Error(`"${path}" is not a plain path prefix`);
      this.mode = 'path';
      this.prefix = path;
    }
  }

  /**
   * Host mode: the cookie that keeps a link's token on its host once opened (host-only; with
   * https, __Host- prefixed, so no other host, sub- or parent domain can set or read it).
   */
  get cookieName(): string {
    return this.scheme === 'https' ? `__Host-${PREVIEW_PARAM}` : PREVIEW_PARAM;
  }

  /** The link for a token. */
  urlFor(boxId: string, port: number, token: string): string {
    if (this.mode === 'path') return `${this.scheme}://${this.host}${this.prefix}/${token}/`;
    const host = this.host.replace('{port}', String(port)).replace('{box}', boxId);
    const label = host.split('.').find((l) => l.includes(boxId));
    if (label && label.length > 63) throw new Error(`the preview host label "${label}" is longer than DNS allows (63)`);
    return `${this.scheme}://${host}/?${PREVIEW_PARAM}=${token}`;
  }

  /** Host mode: the box and port a request's Host names (lower-cased, with its port if the pattern has one). */
  matchHost(host: string | undefined): { boxId: string; port: number } | undefined {
    if (!this.hostPattern || !host) return undefined;
    const m = this.hostPattern.exec(host.toLowerCase());
    if (!m) return undefined;
    const at = (name: 'port' | 'box') => m[this.hostOrder.indexOf(name) + 1]!;
    const port = Number(at('port'));
    return port <= 65535 ? { boxId: at('box'), port } : undefined;
  }

  /** Path mode: the token and the app's path (escaped, "/" at least; `bare` when the link lacks its trailing slash). */
  matchPath(pathAndQuery: string): { token: string; rest: string; bare: boolean } | undefined {
    if (this.mode !== 'path' || !pathAndQuery.startsWith(`${this.prefix}/`)) return undefined;
    const after = pathAndQuery.slice(this.prefix.length + 1);
    const cut = after.search(/[/?]/);
    const token = cut < 0 ? after : after.slice(0, cut);
    if (!token) return undefined;
    const rest = cut < 0 ? '/' : after[cut] === '?' ? `/${after.slice(cut)}` : after.slice(cut);
    return { token, rest, bare: cut < 0 || after[cut] === '?' };
  }
}

/** Host mode: the query parameter a link carries its token in. */
export const PREVIEW_PARAM = 'sandbox_bridge_preview';
