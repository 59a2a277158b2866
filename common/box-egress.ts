// A box's egress policy and credentials (docs/egress.md "Where the policy lives"), as the bridge
// keeps them on the box's record for the egress gateway to read:
//   - its allow list (a narrowing of its pool's spec.egress.domains.allow): the record annotation
//     ANNOTATIONS.egress, JSON {"allow": [...]}; absent means the pool's list (an object, so a
//     box deny list can join it without a new name: the gateway's policy.Box has one);
//   - its credentials: the record Secret's data key EGRESS_CREDENTIALS_KEY, JSON
//     {host: {Header-Name: value}}. A data key the box pod's volume does not project (it lists
//     only token and env, common/box-pod.ts), which no snapshot reads (only env is sealed into
//     one) and which no answer or log line carries.
// The pattern rules are gateway/policy's (policy.go), ported line for line so the bridge refuses
// exactly what the gateway would: a box entry outside the pool's allow list never allows anything.
import type * as k8s from '@kubernetes/client-node';
import { isIP } from 'node:net';
import { BridgeError } from './errors.js';
import { ANNOTATIONS } from './labels.js';

/** The record Secret's data key holding the box's credentials (never projected into the pod). */
export const EGRESS_CREDENTIALS_KEY = 'egress-credentials';

/** Bounds: a pool or box list, the hosts with credentials, headers per host, one value, all credentials. */
export const MAX_PATTERNS = 256;
export const MAX_CREDENTIAL_HOSTS = 64;
export const MAX_HEADERS_PER_HOST = 16;
export const MAX_HEADER_VALUE_BYTES = 8 * 1024;
export const MAX_CREDENTIALS_BYTES = 64 * 1024;

/** Lower-cases a host name and drops one trailing dot; undefined when it is neither an IP literal nor a DNS name. */
export function normalizeHost(host: string): string | undefined {
  if (isIP(host)) return canonicalIp(host);
  const h = host.replace(/\.$/, '').toLowerCase();
  if (h === '' || h.length > 253) return undefined;
  for (const label of h.split('.')) {
    if (label === '' || label.length > 63 || !/^[a-z0-9_-]+$/.test(label)) return undefined;
  }
  return h;
}

/** Whether pattern matches host (normalized): exact, `*.name` (at least one more label, not name itself), `*` (any DNS name, never an IP). */
export function matchPattern(pattern: string, host: string): boolean {
  const p = pattern.replace(/\.$/, '').toLowerCase();
  const hostIsIp = isIP(host) !== 0;
  if (p === '*') return !hostIsIp;
  if (p.startsWith('*.')) return !hostIsIp && host.endsWith(p.slice(1)) && host.length > p.length - 1;
  if (isIP(p)) return hostIsIp && canonicalIp(p) === host;
  return p === host;
}

/** Why a list entry is not `*`, `*.name`, a host name or an IP literal; undefined when it is one. */
export function patternProblem(p: string): string | undefined {
  if (p === '*') return undefined;
  let rest = p;
  if (p.startsWith('*.')) {
    rest = p.slice(2);
    if (isIP(rest)) return `"${p}": a wildcard over an IP address`;
  }
  if (rest.includes('*') || normalizeHost(rest) === undefined) return `"${p}": want a host name, *.name, * or an IP address`;
  return undefined;
}

/** Whether every host p matches is also matched by outer (gateway/policy Covers). */
export function covers(outer: string, p: string): boolean {
  const o = outer.replace(/\.$/, '').toLowerCase();
  const q = p.replace(/\.$/, '').toLowerCase();
  if (o === q) return true;
  if (q === '*') return false;
  if (q.startsWith('*.')) return o === '*' || (o.startsWith('*.') && q.slice(1).endsWith(o.slice(1)));
  const h = normalizeHost(q);
  return h !== undefined && matchPattern(o, h);
}

/** The entries of a box's allow list not within the pool's: they could never allow anything. */
export function outside(boxAllow: readonly string[], poolAllow: readonly string[]): string[] {
  return boxAllow.filter((p) => !poolAllow.some((o) => covers(o, p)));
}

/** Checks a list of patterns; the message names every bad entry. */
export function checkPatterns(list: readonly string[], what: string): void {
  if (list.length > MAX_PATTERNS) throw new BridgeError('invalid_request', `${what}: ${list.length} entries; the limit is ${MAX_PATTERNS}`);
  const problems = list.map(patternProblem).filter((p): p is string => p !== undefined);
  if (problems.length) throw new BridgeError('invalid_request', `${what}: ${problems.join('; ')}`);
}

/**
 * Checks a box's allow list against its pool's: 400 naming the entries outside it. In direct
 * mode nothing reads the list, so setting one is refused rather than silently ignored.
 */
export function checkBoxAllow(allow: readonly string[], pool: { mode: string; domains: { allow: readonly string[] } }, poolName: string): void {
  requireGatewayMode(pool, poolName);
  checkPatterns(allow, 'egress.allow');
  const out = outside(allow, pool.domains.allow);
  if (out.length) {
    throw new BridgeError(
      'invalid_request',
      `egress.allow entries outside pool ${poolName}'s spec.egress.domains.allow: ${out.map((p) => JSON.stringify(p)).join(', ')}`,
    );
  }
}

export function requireGatewayMode(pool: { mode: string }, poolName: string): void {
  if (pool.mode !== 'gateway') {
    throw new BridgeError('conflict', `pool ${poolName}'s egress mode is ${pool.mode}: a box's domain policy and credentials apply only with spec.egress.mode: gateway`);
  }
}

/** Framing, hop-by-hop and proxy headers: never credentials (the gateway refuses them too). */
const FORBIDDEN_HEADERS = new Set([
  'host',
  'connection',
  'content-length',
  'transfer-encoding',
  'upgrade',
  'te',
  'trailer',
  'keep-alive',
  'proxy-connection',
]);
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$/;

/**
 * Checks a credentials document {host: {Header-Name: value}} and returns it with hosts
 * normalized. Messages name hosts and header names, never a value (a value is a secret).
 */
export function checkCredentials(creds: Record<string, Record<string, string>>): Record<string, Record<string, string>> {
  const hosts = Object.keys(creds);
  if (hosts.length > MAX_CREDENTIAL_HOSTS) throw new BridgeError('invalid_request', `credentials for ${hosts.length} hosts; the limit is ${MAX_CREDENTIAL_HOSTS}`);
  const out: Record<string, Record<string, string>> = {};
  let bytes = 0;
  for (const host of hosts) {
    const h = normalizeHost(host);
    // Credentials go to one exact host: a wildcard would hand them to every name under it.
    if (h === undefined) throw new BridgeError('invalid_request', `credentials: ${JSON.stringify(host)} is not a host name or IP address (exact names only, no wildcards)`);
    if (out[h]) throw new BridgeError('invalid_request', `credentials: host ${h} is given twice`);
    const headers = creds[host]!;
    const names = Object.keys(headers);
    if (names.length === 0 || names.length > MAX_HEADERS_PER_HOST) {
      throw new BridgeError('invalid_request', `credentials for ${h}: give 1 to ${MAX_HEADERS_PER_HOST} headers`);
    }
    const seen = new Set<string>();
    for (const name of names) {
      const lower = name.toLowerCase();
      if (!HEADER_NAME.test(name)) throw new BridgeError('invalid_request', `credentials for ${h}: ${JSON.stringify(name.slice(0, 128))} is not a header name`);
      if (FORBIDDEN_HEADERS.has(lower) || lower.startsWith('proxy-')) {
        throw new BridgeError('invalid_request', `credentials for ${h}: header ${name} is a framing, hop-by-hop or proxy header, not a credential`);
      }
      if (seen.has(lower)) throw new BridgeError('invalid_request', `credentials for ${h}: header ${name} is given twice (names are case-insensitive)`);
      seen.add(lower);
      const value = headers[name]!;
      // Visible ASCII, space and tab only (what an HTTP/1.1 field value may carry safely), and not empty.
      if (value.length === 0 || !/^[\t\x20-\x7e]+$/.test(value)) {
        throw new BridgeError('invalid_request', `credentials for ${h}: the value of header ${name} must be 1 or more visible ASCII characters, spaces or tabs`);
      }
      if (value.length > MAX_HEADER_VALUE_BYTES) {
        throw new BridgeError('invalid_request', `credentials for ${h}: the value of header ${name} is over ${MAX_HEADER_VALUE_BYTES} bytes`);
      }
      bytes += h.length + name.length + value.length;
    }
    out[h] = { ...headers };
  }
  if (bytes > MAX_CREDENTIALS_BYTES) throw new BridgeError('payload_too_large', `credentials total ${bytes} bytes; the limit is ${MAX_CREDENTIALS_BYTES}`);
  return out;
}

/** The box's own allow list from its record; null when it has none (the pool's applies). */
export function boxAllowOf(record: Pick<k8s.V1Secret, 'metadata'> | undefined): string[] | null {
  const raw = record?.metadata?.annotations?.[ANNOTATIONS.egress];
  if (raw === undefined) return null;
  try {
    const v = (JSON.parse(raw) as { allow?: unknown } | null)?.allow;
    if (v === undefined) return null;
    return Array.isArray(v) && v.every((p) => typeof p === 'string') ? v : [];
  } catch {
    return []; // unreadable: allow nothing rather than the pool's whole list
  }
}

/** The annotation change that sets (or, with null, removes) a box's allow list. */
export function allowAnnotation(allow: readonly string[] | null): Record<string, string | null> {
  return { [ANNOTATIONS.egress]: allow === null ? null : JSON.stringify({ allow }) };
}

/** Hosts the record has credentials for (sorted); never the values. */
export function credentialHostsOf(record: Pick<k8s.V1Secret, 'data'> | undefined): string[] {
  const raw = record?.data?.[EGRESS_CREDENTIALS_KEY];
  if (!raw) return [];
  try {
    const v = JSON.parse(Buffer.from(raw, 'base64').toString('utf8')) as Record<string, unknown>;
    return Object.keys(v).sort();
  } catch {
    return [];
  }
}

function canonicalIp(ip: string): string {
  if (isIP(ip) === 4) return ip;
  // IPv4-mapped IPv6 to IPv4, as Go's Unmap does; other IPv6 left as written, lower-cased.
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(ip);
  // Otherwise the compressed lower-case form (as Go's netip prints it), e.g. 2001:DB8:0::1 -> 2001:db8::1.
  return m ? m[1]! : new URL(`http://[${ip}]/`).hostname.slice(1, -1);
}
