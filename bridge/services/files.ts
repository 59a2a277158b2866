// Files and archives in a box, through boxd. Uploads stream from the caller to the box (base64
// decoded on the fly); downloads stream back, except the spec's JSON read, which must hold the
// content whole (the route encodes it piece by piece). Every transfer holds its share of the
// replica's byte budget while it runs: the content of a JSON read, a pipe's buffers otherwise.
import { isUtf8 } from 'node:buffer';
import type { IncomingMessage } from 'node:http';
import { Transform, type Readable, type TransformCallback } from 'node:stream';
import { BridgeError } from '../../common/errors.js';
import type { BoxdClient } from '../../common/boxd-client.js';
import type { BoxConnector } from './box-connector.js';
import { resolvePath } from './box-paths.js';
import { HOLD_BYTES, type ByteBudget, type Hold } from './byte-budget.js';

export interface FileServiceDeps {
  connector: BoxConnector;
  boxd: BoxdClient;
  budget: ByteBudget;
  fileSizeLimit: number;
  archiveSizeLimit: number;
  archiveMaxEntries: number;
}

/** A JSON read: the file's bytes, held against the budget until release(). */
export interface FileContent {
  path: string;
  size: number;
  content: Buffer;
  /** text: valid UTF-8 (and base64 not asked for). */
  encoding: 'text' | 'base64';
  release(): void;
}

export class FileService {
  constructor(private readonly deps: FileServiceDeps) {}

  /** The spec's read: content as UTF-8 text, or base64 when asked or when it is not UTF-8. */
  async read(boxId: string, rawPath: string, asBase64: boolean, callerSignal?: AbortSignal): Promise<FileContent> {
    const path = resolvePath(rawPath, 'path');
    return this.deps.connector.call(boxId, async ({ target, signal }) => {
      const res = await this.deps.boxd.readFile(target, path, this.deps.fileSizeLimit, signal);
      const size = Number(res.headers['content-length']);
      let hold: Hold;
      try {
        if (!Number.isSafeInteger(size) || size < 0) throw new BridgeError('internal_error', `box ${boxId} answered a file read without its size`);
        // The bytes, and the pieces of their JSON encoding in flight.
        hold = this.deps.budget.reserve(size + HOLD_BYTES.pipe, 'file', `reading ${path} (${size} bytes)`);
      } catch (err) {
        res.destroy();
        throw err;
      }
      try {
        const content = await readExactly(res, size);
        return { path, size, content, encoding: !asBase64 && isUtf8(content) ? 'text' : 'base64', release: hold.release };
      } catch (err) {
        hold.release();
        throw err;
      }
    }, callerSignal);
  }

  /** The raw bytes as a stream (Accept: application/octet-stream), never held whole. */
  async download(boxId: string, rawPath: string): Promise<{ path: string; size: number; body: Readable }> {
    const path = resolvePath(rawPath, 'path');
    return this.piped('file', `downloading ${path}`, async (hold) =>
      this.deps.connector.call(boxId, async ({ target }) => {
        const res = await this.deps.boxd.readFile(target, path, this.deps.fileSizeLimit);
        res.once('close', hold.release);
        return { path, size: Number(res.headers['content-length'] ?? 0), body: res };
      }),
    );
  }

  /** Streams body into the file; base64 text is decoded on the way. */
  async write(boxId: string, rawPath: string, body: Readable, opts: { base64: boolean; contentLength?: number }) {
    const path = resolvePath(rawPath, 'path');
    const limit = this.deps.fileSizeLimit;
    const wireLimit = opts.base64 ? Math.ceil((limit * 4) / 3) + 4 : limit;
    if (opts.contentLength !== undefined && opts.contentLength > wireLimit) {
      throw new BridgeError('payload_too_large', `file content is ${opts.contentLength} bytes; the limit is ${limit}`);
    }
    return this.piped('file', `writing ${path}`, async (hold) => {
      const written = await this.deps.connector.call(boxId, ({ target, signal }) => {
        const content = opts.base64 ? body.pipe(new Base64Decoder()) : body;
        if (opts.base64) body.on('error', (err) => content.destroy(err));
        return this.deps.boxd.writeFile(target, path, content, {
          maxBytes: limit,
          ...(!opts.base64 && opts.contentLength !== undefined ? { contentLength: opts.contentLength } : {}),
          signal,
        });
      });
      hold.release();
      return { path, size: written.size, encoding: opts.base64 ? ('base64' as const) : ('text' as const) };
    });
  }

  async list(boxId: string, q: { path: string; recursive: boolean; limit: number }) {
    const path = resolvePath(q.path, 'path');
    return this.deps.connector.call(boxId, ({ target, signal }) => this.deps.boxd.listFiles(target, { ...q, path }, signal));
  }

  async delete(boxId: string, q: { path: string; recursive: boolean }) {
    const path = resolvePath(q.path, 'path');
    return this.deps.connector.call(boxId, ({ target, signal }) => this.deps.boxd.deleteFile(target, path, q.recursive, signal));
  }

  /** A tar (optionally gzip) stream of a directory or file. */
  async downloadArchive(boxId: string, q: { path: string; gzip: boolean }): Promise<Readable> {
    const path = resolvePath(q.path, 'path');
    return this.piped('archive', `reading the archive of ${path}`, (hold) =>
      this.deps.connector.call(boxId, async ({ target }) => {
        const res = await this.deps.boxd.readArchive(target, path, q.gzip);
        res.once('close', hold.release);
        return res;
      }),
    );
  }

  /** Extracts a tar (or tar.gz) stream into a directory; all or nothing. */
  async uploadArchive(boxId: string, rawPath: string, body: Readable, contentLength?: number) {
    const path = resolvePath(rawPath, 'path');
    if (contentLength !== undefined && contentLength > this.deps.archiveSizeLimit) {
      throw new BridgeError('payload_too_large', `archive is ${contentLength} bytes; the limit is ${this.deps.archiveSizeLimit}`);
    }
    return this.piped('archive', `extracting an archive into ${path}`, async (hold) => {
      const written = await this.deps.connector.call(boxId, ({ target, signal }) =>
        this.deps.boxd.writeArchive(target, path, body, {
          maxBytes: this.deps.archiveSizeLimit,
          maxEntries: this.deps.archiveMaxEntries,
          ...(contentLength !== undefined ? { contentLength } : {}),
          signal,
        }),
      );
      hold.release();
      return written;
    });
  }

  /**
   * Runs a transfer with a pipe's share of the budget (refused with 503 before anything moves
   * when there is none). fn releases the hold when its stream is done; a failure releases it here.
   */
  private async piped<T>(kind: 'file' | 'archive', what: string, fn: (hold: Hold) => Promise<T>): Promise<T> {
    const hold = this.deps.budget.reserve(HOLD_BYTES.pipe, kind, what);
    try {
      return await fn(hold);
    } catch (err) {
      hold.release();
      throw err;
    }
  }
}

/** Exactly size bytes of a stream, into one buffer (no second copy); more or fewer fail the read. */
async function readExactly(stream: IncomingMessage, size: number): Promise<Buffer> {
  const bytes = Buffer.allocUnsafe(size);
  let at = 0;
  try {
    for await (const chunk of stream as AsyncIterable<Buffer>) {
      if (at + chunk.length > size) throw new BridgeError('internal_error', `the box sent more than the ${size} bytes it announced`);
      chunk.copy(bytes, at);
      at += chunk.length;
    }
  } catch (err) {
    stream.destroy();
    throw err;
  }
  if (at !== size) throw new BridgeError('cluster_unavailable', `the box sent ${at} of the ${size} bytes it announced`, { headers: { 'Retry-After': '1' } });
  return bytes;
}

/**
 * Base64 text to bytes, streaming: whitespace is ignored, anything else outside the alphabet
 * (or data after padding) fails the upload with a 400, and the box keeps the old file.
 */
export class Base64Decoder extends Transform {
  private rest = '';
  private padded = false;

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    const text = this.rest + chunk.toString('latin1').replace(/\s+/g, '');
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text) || (this.padded && text.length > 0)) return done(invalidBase64());
    const usable = text.length - (text.length % 4);
    if (usable > 0) {
      if (text.slice(0, usable).includes('=')) this.padded = true;
      this.push(Buffer.from(text.slice(0, usable), 'base64'));
    }
    this.rest = text.slice(usable);
    done();
  }

  override _flush(done: TransformCallback): void {
    done(this.rest.length ? invalidBase64() : undefined);
  }
}

function invalidBase64(): BridgeError {
  return new BridgeError('invalid_request', 'base64=true but the body is not valid base64');
}
