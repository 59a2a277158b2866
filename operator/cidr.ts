// Just enough CIDR arithmetic to turn the pool's allowed and denied CIDRs into NetworkPolicy
// ipBlocks. The most specific entry of the two lists decides for an address (a tie goes to deny),
// like a routing table: an allowed 10.1.2.3/32 opens that one address inside a denied 10.0.0.0/8.
// NetworkPolicy ORs its ipBlocks and an `except` must lie strictly inside its `cidr`, so each
// allowed range becomes one ipBlock whose excepts are the denied ranges strictly inside it; an
// allowed range equal to a denied one is dropped.
import { isIPv4, isIPv6 } from 'node:net';

export interface Cidr {
  family: 4 | 6;
  /** Network address with host bits cleared. */
  addr: bigint;
  prefix: number;
}

export function parseCidr(text: string): Cidr {
  const slash = text.indexOf('/');
  if (slash < 0) throw new Error(`invalid CIDR "${text}"`);
  const ip = text.slice(0, slash);
  const prefix = Number(text.slice(slash + 1));
  const family = isIPv4(ip) ? 4 : isIPv6(ip) ? 6 : undefined;
  const bits = family === 4 ? 32 : 128;
  if (!family || !Number.isInteger(prefix) || prefix < 0 || prefix > bits) throw new Error(`invalid CIDR "${text}"`);
  const addr = family === 4 ? ipv4ToBigInt(ip) : ipv6ToBigInt(ip);
  return { family, addr: addr & mask(bits, prefix), prefix };
}

export function formatCidr(c: Cidr): string {
  return `${c.family === 4 ? bigIntToIpv4(c.addr) : bigIntToIpv6(c.addr)}/${c.prefix}`;
}

/** True when `inner` lies within `outer` (equal ranges included). */
export function contains(outer: Cidr, inner: Cidr): boolean {
  if (outer.family !== inner.family || outer.prefix > inner.prefix) return false;
  const bits = outer.family === 4 ? 32 : 128;
  return (inner.addr & mask(bits, outer.prefix)) === outer.addr;
}

export interface IpBlock {
  cidr: string;
  except?: string[];
}

/** The ipBlocks that allow what `allowed` and `denied` allow together, in canonical notation. */
export function egressIpBlocks(allowed: readonly string[], denied: readonly string[]): IpBlock[] {
  const deny = dedupe(denied.map(parseCidr));
  const blocks: IpBlock[] = [];
  for (const a of dedupe(allowed.map(parseCidr))) {
    if (deny.some((d) => d.family === a.family && d.prefix === a.prefix && d.addr === a.addr)) continue;
    const inside = deny.filter((d) => contains(a, d) && d.prefix > a.prefix);
    // A denied range inside another denied one adds nothing to the block.
    const except = inside.filter((d) => !inside.some((o) => o !== d && contains(o, d))).map(formatCidr);
    blocks.push(except.length ? { cidr: formatCidr(a), except } : { cidr: formatCidr(a) });
  }
  return blocks;
}

function dedupe(cidrs: Cidr[]): Cidr[] {
  const seen = new Set<string>();
  return cidrs.filter((c) => {
    const key = formatCidr(c);
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

function mask(bits: number, prefix: number): bigint {
  const all = (1n << BigInt(bits)) - 1n;
  return prefix === 0 ? 0n : (all >> BigInt(bits - prefix)) << BigInt(bits - prefix);
}

function ipv4ToBigInt(ip: string): bigint {
  return ip.split('.').reduce((acc, part) => (acc << 8n) | BigInt(Number(part)), 0n);
}

function bigIntToIpv4(n: bigint): string {
  return [24n, 16n, 8n, 0n].map((s) => String((n >> s) & 255n)).join('.');
}

function ipv6ToBigInt(ip: string): bigint {
  let text = ip;
  // An embedded IPv4 tail (::ffff:1.2.3.4) becomes two hextets.
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (v4) {
    const n = ipv4ToBigInt(v4[1]!);
    text = `${text.slice(0, v4.index)}${(n >> 16n).toString(16)}:${(n & 0xffffn).toString(16)}`;
  }
  const [head, tail] = text.split('::') as [string, string | undefined];
  const h = head ? head.split(':') : [];
  const t = tail ? tail.split(':') : [];
  const groups = tail === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t];
  return groups.reduce((acc, g) => (acc << 16n) | BigInt(parseInt(g, 16)), 0n);
}

function bigIntToIpv6(n: bigint): string {
  const groups = Array.from({ length: 8 }, (_, i) => Number((n >> BigInt(112 - 16 * i)) & 0xffffn));
  // Compress the longest run of zero groups (RFC 5952).
  let best = -1;
  let bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen && j - i > 1) [best, bestLen] = [i, j - i];
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (best < 0) return hex.join(':');
  return `${hex.slice(0, best).join(':')}::${hex.slice(best + bestLen).join(':')}`;
}
