// The piecewise JSON writer gives exactly JSON.stringify's text for any bytes and chunking.
import { randomBytes } from 'node:crypto';
import { JsonBytes, jsonPieces, jsonText } from './json-stream.js';

const split = (bytes: Buffer, sizes: number[]): Buffer[] => {
  const out: Buffer[] = [];
  for (let at = 0, i = 0; at < bytes.length; i++) {
    const n = sizes[i % sizes.length]!;
    out.push(bytes.subarray(at, at + n));
    at += n;
  }
  return out;
};

const samples: Array<[string, Buffer]> = [
  ['random bytes', randomBytes(200_000)],
  ['control characters', Buffer.from(Array.from({ length: 70_000 }, (_, i) => i % 32))],
  ['multi-byte text', Buffer.from('héllo wörld — 日本語 🎉 "quoted" \\ back\n'.repeat(3000))],
  ['nothing', Buffer.alloc(0)],
];

test.each(samples)('UTF-8 text of %s is JSON.stringify of the decoded string, however it is chunked', (_name, bytes) => {
  const expected = JSON.stringify({ exit_code: 1, stdout: new TextDecoder().decode(bytes), note: 'x', skipped: undefined, done: true });
  for (const sizes of [[bytes.length || 1], [1], [3, 5, 7], [40_000, 1], [65_536]]) {
    const doc = { exit_code: 1, stdout: new JsonBytes(split(bytes, sizes), 'utf8'), note: 'x', skipped: undefined, done: true };
    expect([...jsonPieces(doc)].join('')).toBe(expected);
  }
});

test.each(samples)('base64 of %s is the bytes base64-encoded, however they are chunked', (_name, bytes) => {
  for (const sizes of [[bytes.length || 1], [1], [2], [4, 5], [32_768, 2], [100_000]]) {
    const text = [...jsonPieces({ content: new JsonBytes(split(bytes, sizes), 'base64') })].join('');
    expect(text).toBe(JSON.stringify({ content: bytes.toString('base64') }));
  }
});

test('no piece is much larger than the 32 KiB piece it encodes, and an empty document is {}', () => {
  const pieces = [...jsonPieces({ stdout: new JsonBytes([Buffer.alloc(1024 * 1024)], 'utf8') })];
  expect(Math.max(...pieces.map((p) => p.length))).toBeLessThanOrEqual(6 * 32 * 1024);
  expect([...jsonPieces({})].join('')).toBe('{}');
});

test.each(samples)('a small document of %s at once is the same text as its pieces', (_name, bytes) => {
  for (const cut of [0, 1, 3, 32 * 1024]) {
    const part = bytes.subarray(0, Math.min(cut, bytes.length));
    const doc = { exit_code: 0, stdout: new JsonBytes(split(part, [5, 7]), 'utf8'), stderr: new JsonBytes([], 'utf8'), content: new JsonBytes(split(part, [2]), 'base64'), skipped: undefined, ok: true };
    expect(jsonText(doc)).toBe([...jsonPieces(doc)].join(''));
  }
});
