// Standard base64 (RFC 4648, with padding) for Uint8Array. Our own, because Buffer is Node-only
// and btoa/atob work on "binary strings", which would need a string copy of every byte anyway.

const ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
const DECODE = new Int16Array(128).fill(-1);
for (let i = 0; i < ALPHABET.length; i++) DECODE[ALPHABET.charCodeAt(i)] = i;

export function encodeBase64(bytes: Uint8Array): string {
  const parts: string[] = [];
  // Chunks keep String.fromCharCode's argument list small (engines cap it).
  const CHUNK = 3 * 8192;
  for (let start = 0; start < bytes.length; start += CHUNK) {
    const end = Math.min(start + CHUNK, bytes.length);
    const codes: number[] = [];
    let i = start;
    for (; i + 2 < end; i += 3) {
      const n = (bytes[i]! << 16) | (bytes[i + 1]! << 8) | bytes[i + 2]!;
      codes.push(
        ALPHABET.charCodeAt(n >>> 18),
        ALPHABET.charCodeAt((n >>> 12) & 63),
        ALPHABET.charCodeAt((n >>> 6) & 63),
        ALPHABET.charCodeAt(n & 63),
      );
    }
    const rest = end - i;
    if (rest > 0) {
      const n = (bytes[i]! << 16) | (rest === 2 ? bytes[i + 1]! << 8 : 0);
      codes.push(ALPHABET.charCodeAt(n >>> 18), ALPHABET.charCodeAt((n >>> 12) & 63));
      codes.push(rest === 2 ? ALPHABET.charCodeAt((n >>> 6) & 63) : 61, 61); // 61 is '='
    }
    parts.push(String.fromCharCode(...codes));
  }
  return parts.join('');
}

export function decodeBase64(text: string): Uint8Array {
  const clean = text.replace(/[\s=]+/g, '');
  if (clean.length % 4 === 1) throw new Error('invalid base64: bad length');
  const out = new Uint8Array(Math.floor((clean.length * 3) / 4));
  let bits = 0;
  let value = 0;
  let o = 0;
  for (let i = 0; i < clean.length; i++) {
    const code = clean.charCodeAt(i);
    const digit = code < 128 ? DECODE[code]! : -1;
    if (digit < 0) throw new Error(`invalid base64: unexpected character at ${i}`);
    value = ((value << 6) | digit) & 0xffff; // only the last < 14 bits are pending
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[o++] = (value >>> bits) & 0xff;
    }
  }
  return out;
}
