// Files and archives in a box, through boxd. Uploads stream from the caller to the box (base64
// decoded on the fly); downloads stream back, except the spec's JSON read, which must hold the
// content whole and so takes it from a per-replica memory budget first.
import { Transform, type Readable, type TransformCallback } from 'node:stream';
import { BridgeError } from '../../common/errors.js';
import { readAll, type BoxdClient } from '../../common/boxd-client.js';
import type { BoxConnector } from './box-connector.js';
import { resolvePath } from './box-paths.js';
import type { ByteBudget } from './byte-budget.js';

export interface FileServiceDeps {
  connector: BoxConnector;
  boxd: BoxdClient;
  budget: ByteBudget;
  fileSizeLimit: number;
  archiveSizeLimit: number;
  archiveMaxEntries: number;
}

/** A JSON read holds the bytes, the encoded string and its serialization at once. */
const READ_MEMORY_FACTOR = 3;
const utf8 = new TextDecoder('utf-8', { fatal: true });

export class FileService {
  constructor(private readonly deps: FileServiceDeps) {}

  /** The spec's read: content as UTF-8 text, or base64 when asked or when it is not UTF-8. */
  async read(boxId: string, rawPath: string, asBase64: boolean) {
    const path = resolvePath(rawPath, 'path');
    return this.deps.connector.call(boxId, async ({ target, signal }) => {
      const res = await this.deps.boxd.readFile(target, path, this.deps.fileSizeLimit, signal);
      const size = Number(res.headers['content-length'] ?? 0);
      let release: () => void;
      try {
        release = this.deps.budget.reserve(size * READ_MEMORY_FACTOR, `reading ${path}`);
      } catch (err) {
        res.destroy();
        throw err;
      }
      try {
        const bytes = await readAll(res, this.deps.fileSizeLimit);
        let text: string | undefined;
        if (!asBase64) {
          try {
            text = utf8.decode(bytes);
          } catch {
            text = undefined; // not UTF-8: base64 instead
          }
        }
        return text !== undefined
          ? { path, size: bytes.length, content: text, encoding: 'text' as const }
          : { path, size: bytes.length, content: bytes.toString('base64'), encoding: 'base64' as const };
      } finally {
        release();
      }
    });
  }

  /** The raw bytes as a stream (Accept: application/octet-stream), never held whole. */
  async download(boxId: string, rawPath: string): Promise<{ path: string; size: number; body: Readable }> {
    const path = resolvePath(rawPath, 'path');
    return this.deps.connector.call(boxId, async ({ target }) => {
      const res = await this.deps.boxd.readFile(target, path, this.deps.fileSizeLimit);
      return { path, size: Number(res.headers['content-length'] ?? 0), body: res };
    });
  }

  /** Streams body into the file; base64 text is decoded on the way. */
  async write(boxId: string, rawPath: string, body: Readable, opts: { base64: boolean; contentLength?: number }) {
    const path = resolvePath(rawPath, 'path');
    const limit = this.deps.fileSizeLimit;
    const wireLimit = opts.base64 ? Math.ceil((limit * 4) / 3) + 4 : limit;
    if (opts.contentLength !== undefined && opts.contentLength > wireLimit) {
      throw new BridgeError('payload_too_large', `file content is ${opts.contentLength} bytes; the limit is ${limit}`);
    }
    return this.deps.connector.call(boxId, async ({ target, signal }) => {
      const content = opts.base64 ? body.pipe(new Base64Decoder()) : body;
      if (opts.base64) body.on('error', (err) => content.destroy(err));
      const written = await this.deps.boxd.writeFile(target, path, content, {
        maxBytes: limit,
        ...(!opts.base64 && opts.contentLength !== undefined ? { contentLength: opts.contentLength } : {}),
        signal,
      });
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
    return this.deps.connector.call(boxId, ({ target }) => this.deps.boxd.readArchive(target, path, q.gzip));
  }

  /** Extracts a tar (or tar.gz) stream into a directory; all or nothing. */
  async uploadArchive(boxId: string, rawPath: string, body: Readable, contentLength?: number) {
    const path = resolvePath(rawPath, 'path');
    if (contentLength !== undefined && contentLength > this.deps.archiveSizeLimit) {
      throw new BridgeError('payload_too_large', `archive is ${contentLength} bytes; the limit is ${this.deps.archiveSizeLimit}`);
    }
    return this.deps.connector.call(boxId, ({ target, signal }) =>
      this.deps.boxd.writeArchive(target, path, body, {
        maxBytes: this.deps.archiveSizeLimit,
        maxEntries: this.deps.archiveMaxEntries,
        ...(contentLength !== undefined ? { contentLength } : {}),
        signal,
      }),
    );
  }
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
