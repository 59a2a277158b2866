// JSON answers that carry large byte contents (an exec's output, a file read) without building
// the document in memory. JSON.stringify of 10 MiB of random output makes a string of ~25 MB
// and a body buffer as large again, on top of the bytes and their decoded text; here the bytes
// are decoded (UTF-8) or encoded (base64) and escaped one piece at a time, each piece written
// with backpressure. The text is the same as JSON.stringify's of the decoded document.
import { once } from 'node:events';
import { TextDecoder } from 'node:util';
import type { Response } from 'express';

/** Raw bytes sent as a JSON string: UTF-8 text (invalid sequences replaced) or base64. */
export class JsonBytes {
  constructor(
    readonly chunks: readonly Buffer[],
    readonly encoding: 'utf8' | 'base64',
  ) {}
}

export type JsonField = JsonBytes | string | number | boolean | null | undefined;

/** Bytes per piece: boxd's read size, so a piece's JSON is at most ~200 KiB. */
const PIECE = 32 * 1024;
/** base64 pieces are whole groups of 3 bytes. */
const B64_PIECE = PIECE - (PIECE % 3);

/** The document's JSON text in pieces (fields in order; undefined ones left out, as JSON.stringify does). */
export function* jsonPieces(doc: Record<string, JsonField>): Generator<string> {
  let first = true;
  for (const [key, value] of Object.entries(doc)) {
    if (value === undefined) continue;
    const head = `${first ? '{' : ','}${JSON.stringify(key)}:`;
    first = false;
    if (!(value instanceof JsonBytes)) {
      yield head + JSON.stringify(value);
      continue;
    }
    yield `${head}"`;
    for (const text of value.encoding === 'utf8' ? utf8Pieces(value.chunks) : base64Pieces(value.chunks)) {
      if (text) yield JSON.stringify(text).slice(1, -1);
    }
    yield '"';
  }
  yield first ? '{}' : '}';
}

function* utf8Pieces(chunks: readonly Buffer[]): Generator<string> {
  // Streaming decode never splits a character (or a surrogate pair) across pieces.
  const decoder = new TextDecoder('utf-8');
  for (const chunk of chunks) {
    for (let at = 0; at < chunk.length; at += PIECE) yield decoder.decode(chunk.subarray(at, at + PIECE), { stream: true });
  }
  yield decoder.decode();
}

function* base64Pieces(chunks: readonly Buffer[]): Generator<string> {
  let rest = Buffer.alloc(0); // 0-2 bytes left over from the previous chunk
  for (const chunk of chunks) {
    let at = 0;
    if (rest.length) {
      at = Math.min(3 - rest.length, chunk.length);
      rest = Buffer.concat([rest, chunk.subarray(0, at)]);
      if (rest.length < 3) continue;
      yield rest.toString('base64');
    }
    const end = chunk.length - ((chunk.length - at) % 3);
    for (; at < end; at += B64_PIECE) yield chunk.subarray(at, Math.min(at + B64_PIECE, end)).toString('base64');
    rest = Buffer.from(chunk.subarray(end)); // a copy: it outlives the chunk
  }
  if (rest.length) yield rest.toString('base64');
}

const utf8 = new TextDecoder('utf-8');

/** Bytes of content in the document's JsonBytes fields. */
function contentBytes(doc: Record<string, JsonField>): number {
  let n = 0;
  for (const value of Object.values(doc)) if (value instanceof JsonBytes) for (const chunk of value.chunks) n += chunk.length;
  return n;
}

/** The document's JSON text at once: the same text as jsonPieces' (for small documents). */
export function jsonText(doc: Record<string, JsonField>): string {
  const plain: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(doc)) {
    if (!(value instanceof JsonBytes)) plain[key] = value;
    else {
      const bytes = value.chunks.length === 1 ? value.chunks[0]! : Buffer.concat(value.chunks);
      plain[key] = value.encoding === 'utf8' ? utf8.decode(bytes) : bytes.toString('base64');
    }
  }
  return JSON.stringify(plain);
}

/**
 * Answers with the document as JSON; rejects if the caller goes away (signal). Up to one piece
 * of content (most exec answers) it goes out as one body with its length: one write, no chunked
 * encoding, and no more text held than one piece of the piecewise path would.
 */
export async function sendJson(res: Response, status: number, doc: Record<string, JsonField>, signal?: AbortSignal): Promise<void> {
  res.status(status).setHeader('Content-Type', 'application/json; charset=utf-8');
  if (contentBytes(doc) <= PIECE) {
    const body = jsonText(doc);
    res.setHeader('Content-Length', Buffer.byteLength(body));
    res.end(body);
    return;
  }
  for (const piece of jsonPieces(doc)) {
    if (res.destroyed) return;
    if (!res.write(piece)) await once(res, 'drain', signal ? { signal } : {});
  }
  res.end();
}
