// The S3-compatible object store that holds snapshots, for bridge and operator alike: its
// settings (environment variables, validated with zod by each program's config) and a small
// client over @aws-sdk/client-s3, with streamed multipart uploads of its own (parts in flight in
// parallel, bounded). Every call is bounded in time (connect timeout, socket idle timeout, a
// deadline for small requests), and a store that cannot be reached becomes a 503
// cluster_unavailable with Retry-After, never a hang.
import { readFileSync } from 'node:fs';
import type { Readable } from 'node:stream';
import {
  AbortMultipartUploadCommand,
  CompleteMultipartUploadCommand,
  CreateMultipartUploadCommand,
  DeleteObjectsCommand,
  GetObjectCommand,
  HeadBucketCommand,
  ListMultipartUploadsCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  S3ServiceException,
  UploadPartCommand,
} from '@aws-sdk/client-s3';
import { z } from 'zod';
import { BridgeError } from './errors.js';

const int = (def: number, min = 0) => z.coerce.number().int().min(min).default(def);

/** The store's environment variables; both programs merge them into their config schema. */
export const ObjectStoreConfigSchema = z.object({
  /** The bucket; without it there is no store (snapshot routes answer 501, retention is off). */
  OBJECT_STORE_BUCKET: z.string().default(''),
  /** http(s) URL of an S3-compatible endpoint; empty: AWS S3 in OBJECT_STORE_REGION. */
  OBJECT_STORE_ENDPOINT: z.union([z.literal(''), z.url({ protocol: /^https?$/, error: 'must be an http(s) URL' })]).default(''),
  OBJECT_STORE_REGION: z.string().min(1).default('us-east-1'),
  /** Every key starts with this (no leading or trailing slash). */
  OBJECT_STORE_PREFIX: z
    .string()
    .regex(/^([A-Za-z0-9._-]+(\/[A-Za-z0-9._-]+)*)?$/, 'must be path segments of letters, digits, . _ - separated by /')
    .default('sandbox-bridge'),
  /** Path-style URLs (endpoint/bucket/key), which most S3-compatible servers need. */
  OBJECT_STORE_FORCE_PATH_STYLE: z.enum(['true', 'false']).default('false').transform((v) => v === 'true'),
  /** Static credentials (from a Secret); unset: the SDK's default chain (IRSA, Pod Identity, instance profile). */
  OBJECT_STORE_ACCESS_KEY_ID: z.string().optional(),
  OBJECT_STORE_SECRET_ACCESS_KEY: z.string().optional(),
  /** A PEM CA bundle to trust for an https endpoint with a private CA. */
  OBJECT_STORE_CA_FILE: z.string().optional(),
  /** A connection not established in this time counts as the store being down. */
  OBJECT_STORE_CONNECT_TIMEOUT_MS: int(2000, 100),
  /** Deadline of a small request (metadata, listing, delete). */
  OBJECT_STORE_TIMEOUT_MS: int(5000, 100),
  /** A streaming transfer with no byte moving for this long is abandoned. */
  OBJECT_STORE_IDLE_TIMEOUT_MS: int(20_000, 1000),
});
export type ObjectStoreConfig = z.infer<typeof ObjectStoreConfigSchema>;

/** Problems with a parsed store config that one field alone cannot show. */
export function objectStoreProblems(c: ObjectStoreConfig): string[] {
  const problems: string[] = [];
  if (Boolean(c.OBJECT_STORE_ACCESS_KEY_ID) !== Boolean(c.OBJECT_STORE_SECRET_ACCESS_KEY)) {
    problems.push('OBJECT_STORE_ACCESS_KEY_ID: set both OBJECT_STORE_ACCESS_KEY_ID and OBJECT_STORE_SECRET_ACCESS_KEY, or neither');
  }
  if (c.OBJECT_STORE_CA_FILE) {
    try {
      readFileSync(c.OBJECT_STORE_CA_FILE);
    } catch (err) {
      problems.push(`OBJECT_STORE_CA_FILE: cannot read ${c.OBJECT_STORE_CA_FILE} (${(err as Error).message})`);
    }
  }
  return problems;
}

export interface StoredObject {
  key: string;
  size: number;
  lastModified: Date;
}

/**
 * Multipart uploads: parts of PART_SIZE, at most PARTS_IN_FLIGHT of them on their way at once
 * (each its own request, in parallel), so an upload holds at most PARTS_IN_FLIGHT + 1 parts in
 * memory and reads its body only as fast as the store takes the parts.
 */
export const PART_SIZE = 8 * 1024 * 1024;
export const PARTS_IN_FLIGHT = 3;
/** S3's limit on the parts of one upload. */
const MAX_PARTS = 10_000;

/**
 * One part of an upload: PART_SIZE bytes (the last part fewer). done() is called once the store
 * has taken them, so their buffer may be filled again; a part that was never sent is not done.
 */
export interface UploadPart {
  data: Buffer;
  done(): void;
}

/** A body's chunks copied into parts of PART_SIZE, each buffer reused once its part is done. */
async function* partsOf(body: Readable): AsyncGenerator<UploadPart> {
  const spare: Buffer[] = [];
  const partOf = (buf: Buffer, n: number): UploadPart => ({ data: buf.subarray(0, n), done: () => void spare.push(buf) });
  let buf: Buffer = Buffer.allocUnsafe(PART_SIZE);
  let filled = 0;
  let parts = 0;
  for await (const chunk of body as AsyncIterable<Buffer>) {
    for (let at = 0; at < chunk.length; ) {
      const n = chunk.copy(buf, filled, at);
      filled += n;
      at += n;
      if (filled < PART_SIZE) continue;
      yield partOf(buf, filled);
      parts++;
      buf = spare.pop() ?? Buffer.allocUnsafe(PART_SIZE);
      filled = 0;
    }
  }
  if (filled > 0 || parts === 0) yield partOf(buf, filled);
}

/** The store, or undefined when OBJECT_STORE_BUCKET is unset. */
export function objectStoreFrom(config: ObjectStoreConfig): ObjectStore | undefined {
  return config.OBJECT_STORE_BUCKET ? new ObjectStore(config) : undefined;
}

export class ObjectStore {
  readonly bucket: string;
  readonly prefix: string;
  private readonly s3: S3Client;
  private readonly timeoutMs: number;

  constructor(config: ObjectStoreConfig) {
    this.bucket = config.OBJECT_STORE_BUCKET;
    this.prefix = config.OBJECT_STORE_PREFIX;
    this.timeoutMs = config.OBJECT_STORE_TIMEOUT_MS;
    const ca = config.OBJECT_STORE_CA_FILE ? readFileSync(config.OBJECT_STORE_CA_FILE) : undefined;
    this.s3 = new S3Client({
      region: config.OBJECT_STORE_REGION,
      ...(config.OBJECT_STORE_ENDPOINT ? { endpoint: config.OBJECT_STORE_ENDPOINT } : {}),
      forcePathStyle: config.OBJECT_STORE_FORCE_PATH_STYLE,
      ...(config.OBJECT_STORE_ACCESS_KEY_ID && config.OBJECT_STORE_SECRET_ACCESS_KEY
        ? { credentials: { accessKeyId: config.OBJECT_STORE_ACCESS_KEY_ID, secretAccessKey: config.OBJECT_STORE_SECRET_ACCESS_KEY } }
        : {}),
      // One retry: a store that is down should be reported quickly, not after a backoff series.
      maxAttempts: 2,
      // Checksums only where the S3 API requires them: many S3-compatible servers do not take
      // the aws-chunked trailing checksums the SDK would otherwise send.
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
      requestHandler: {
        connectionTimeout: config.OBJECT_STORE_CONNECT_TIMEOUT_MS,
        socketTimeout: config.OBJECT_STORE_IDLE_TIMEOUT_MS,
        httpAgent: { keepAlive: true, maxSockets: 64 },
        httpsAgent: { keepAlive: true, maxSockets: 64, ...(ca ? { ca } : {}) },
      },
    });
    // Parts are sent unsigned (x-amz-content-sha256: UNSIGNED-PAYLOAD, which S3 accepts on any
    // request): signing would hash every byte a second time, and the whole object's SHA-256 is
    // already computed as it streams (common/snapshot-writer.ts) and checked when it is read back.
    this.s3.middlewareStack.add(
      (next, context) => (args) => {
        const request = args.request as { headers?: Record<string, string> };
        if (context.commandName === 'UploadPartCommand' && request.headers) request.headers['x-amz-content-sha256'] = 'UNSIGNED-PAYLOAD';
        return next(args);
      },
      { step: 'build', name: 'sandboxBridgeUnsignedParts' },
    );
  }

  /** A key under the configured prefix. */
  key(...parts: string[]): string {
    return [this.prefix, ...parts].filter(Boolean).join('/');
  }

  close(): void {
    this.s3.destroy();
  }

  /** Whether the bucket answers, within the deadline of a small request. */
  async check(): Promise<void> {
    await this.run('check the bucket', (abortSignal) => this.s3.send(new HeadBucketCommand({ Bucket: this.bucket }), { abortSignal }));
  }

  /**
   * Streams body into key. A body of one part at most is one PUT; a larger one a multipart
   * upload whose parts (PART_SIZE) are copied once, from the body's chunks into reused part
   * buffers, and sent PARTS_IN_FLIGHT at a time: memory per upload is bounded, and the body is
   * read only as fast as the store takes it. A failure aborts the upload (no parts left behind) and rejects.
   */
  async upload(key: string, body: Readable, opts: { contentType: string; signal?: AbortSignal }): Promise<void> {
    await this.uploadParts(key, partsOf(body), { ...opts, stop: () => body.destroy() });
  }

  /**
   * Uploads parts as they come (each PART_SIZE but the last; see UploadPart), PARTS_IN_FLIGHT at
   * a time; one part at most is one PUT. The next part is asked for only once fewer than
   * PARTS_IN_FLIGHT are on their way, so a producer with PARTS_IN_FLIGHT + 1 part buffers fills
   * one while the others are sent, and never waits for a buffer the upload merely holds. A
   * failure calls opts.stop (which must end a wait for the next part), aborts the multipart
   * upload (no parts left behind) and rejects.
   */
  async uploadParts(key: string, parts: AsyncIterable<UploadPart>, opts: { contentType: string; signal?: AbortSignal; stop?: () => void }): Promise<void> {
    const stop = new AbortController(); // ends the parts in flight once one failed
    const abortSignal = opts.signal ? AbortSignal.any([opts.signal, stop.signal]) : stop.signal;
    const target = { Bucket: this.bucket, Key: key };
    let uploadId: string | undefined;
    const failure: { err?: unknown; failed: boolean } = { failed: false };
    const sent: Array<{ PartNumber: number; ETag: string }> = [];
    const inFlight = new Set<Promise<void>>();
    let count = 0;
    const send = async (part: UploadPart) => {
      const PartNumber = ++count;
      if (PartNumber > MAX_PARTS) throw new BridgeError('payload_too_large', `the object is larger than ${MAX_PARTS} parts of ${PART_SIZE} bytes`);
      uploadId ??= await this.run('upload', (s) =>
        this.s3.send(new CreateMultipartUploadCommand({ ...target, ContentType: opts.contentType }), { abortSignal: AbortSignal.any([s, abortSignal]) }),
      ).then((r) => r.UploadId!);
      if (failure.failed) throw failure.err;
      const uploading: Promise<void> = this.s3
        .send(new UploadPartCommand({ ...target, UploadId: uploadId, PartNumber, Body: part.data, ContentLength: part.data.length }), { abortSignal })
        .then(
          (res) => {
            sent.push({ PartNumber, ETag: res.ETag! });
            part.done(); // the request is done with its bytes
          },
          (err: unknown) => {
            if (!failure.failed) Object.assign(failure, { failed: true, err });
            stop.abort();
            opts.stop?.(); // a wait for the next part ends too
          },
        )
        .finally(() => inFlight.delete(uploading));
      inFlight.add(uploading);
      // The next part is asked for once a request has ended: the producer fills it meanwhile.
      while (inFlight.size >= PARTS_IN_FLIGHT) await Promise.race(inFlight);
    };
    let first: UploadPart | undefined; // held until a second part shows the body needs a multipart upload
    try {
      for await (const part of parts) {
        if (failure.failed) break;
        if (count === 0 && !first) {
          first = part;
          continue;
        }
        if (first) await send(first);
        first = undefined;
        await send(part);
      }
      if (failure.failed) throw failure.err;
      if (count === 0) {
        // One part at most: a plain PUT (its body is small enough to be signed).
        await this.s3.send(new PutObjectCommand({ ...target, Body: first?.data ?? Buffer.alloc(0), ContentType: opts.contentType }), { abortSignal });
        first?.done();
        return;
      }
      await Promise.all(inFlight);
      if (failure.failed) throw failure.err;
      sent.sort((a, b) => a.PartNumber - b.PartNumber);
      // No deadline of a small request: a store may take a while to assemble a large object (the
      // socket's idle timeout still bounds a store that stops answering).
      await this.s3.send(new CompleteMultipartUploadCommand({ ...target, UploadId: uploadId, MultipartUpload: { Parts: sent } }), { abortSignal });
    } catch (err) {
      stop.abort();
      opts.stop?.();
      await Promise.allSettled(inFlight);
      if (uploadId) await this.abortUpload(key, uploadId).catch(() => undefined);
      const cause = failure.failed ? failure.err : err;
      if (opts.signal?.aborted) throw opts.signal.reason;
      throw storeError('upload', cause);
    }
  }

  async putJson(key: string, value: unknown): Promise<void> {
    const body = JSON.stringify(value);
    await this.run('write', (abortSignal) =>
      this.s3.send(new PutObjectCommand({ Bucket: this.bucket, Key: key, Body: body, ContentType: 'application/json' }), { abortSignal }),
    );
  }

  /** The parsed JSON at key, or undefined when there is no such object. */
  async getJson<T>(key: string): Promise<T | undefined> {
    return this.run('read', async (abortSignal) => {
      try {
        const res = await this.s3.send(new GetObjectCommand({ Bucket: this.bucket, Key: key }), { abortSignal });
        return JSON.parse(await res.Body!.transformToString('utf8')) as T;
      } catch (err) {
        if (isNoSuchKey(err)) return undefined;
        throw err;
      }
    });
  }

  /** The object's bytes as a stream (undefined when missing); the caller must consume or destroy it. */
  async getStream(key: string, signal?: AbortSignal): Promise<{ body: Readable; size: number } | undefined> {
    try {
      // No overall deadline: the body may legitimately take minutes; the socket idle timeout bounds a stall.
      const res = await this.s3.send(new GetObjectCommand({ Bucket: this.bucket, Key: key }), signal ? { abortSignal: signal } : {});
      return { body: res.Body as Readable, size: Number(res.ContentLength ?? 0) };
    } catch (err) {
      if (isNoSuchKey(err)) return undefined;
      if (signal?.aborted) throw signal.reason;
      throw storeError('read', err);
    }
  }

  /** Every object under prefix (a key prefix, e.g. "a/b/"), page by page. */
  async *list(prefix: string): AsyncGenerator<StoredObject> {
    let token: string | undefined;
    do {
      const page = await this.run('list', (abortSignal) =>
        this.s3.send(new ListObjectsV2Command({ Bucket: this.bucket, Prefix: prefix, ...(token ? { ContinuationToken: token } : {}) }), { abortSignal }),
      );
      for (const o of page.Contents ?? []) {
        if (o.Key) yield { key: o.Key, size: Number(o.Size ?? 0), lastModified: o.LastModified ?? new Date(0) };
      }
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
  }

  /** Deletes keys (absent ones count as deleted), 1000 per request. */
  async delete(keys: readonly string[]): Promise<void> {
    for (let i = 0; i < keys.length; i += 1000) {
      const batch = keys.slice(i, i + 1000);
      const res = await this.run('delete', (abortSignal) =>
        this.s3.send(
          new DeleteObjectsCommand({ Bucket: this.bucket, Delete: { Objects: batch.map((Key) => ({ Key })), Quiet: true } }),
          { abortSignal },
        ),
      );
      const failed = (res.Errors ?? []).filter((e) => e.Code !== 'NoSuchKey');
      if (failed.length) {
        throw new BridgeError('cluster_unavailable', `object store refused to delete ${failed.length} object(s) (${failed[0]?.Code}: ${failed[0]?.Message})`, {
          headers: { 'Retry-After': '5' },
        });
      }
    }
  }

  /** Multipart uploads under prefix that were started and never completed or aborted. */
  async *listUploads(prefix: string): AsyncGenerator<{ key: string; uploadId: string; initiated: Date }> {
    let keyMarker: string | undefined;
    let idMarker: string | undefined;
    do {
      const page = await this.run('list uploads', (abortSignal) =>
        this.s3.send(
          new ListMultipartUploadsCommand({
            Bucket: this.bucket,
            Prefix: prefix,
            ...(keyMarker ? { KeyMarker: keyMarker } : {}),
            ...(idMarker ? { UploadIdMarker: idMarker } : {}),
          }),
          { abortSignal },
        ),
      );
      for (const u of page.Uploads ?? []) {
        if (u.Key && u.UploadId) yield { key: u.Key, uploadId: u.UploadId, initiated: u.Initiated ?? new Date(0) };
      }
      keyMarker = page.IsTruncated ? page.NextKeyMarker : undefined;
      idMarker = page.IsTruncated ? page.NextUploadIdMarker : undefined;
    } while (keyMarker);
  }

  async abortUpload(key: string, uploadId: string): Promise<void> {
    await this.run('abort upload', (abortSignal) =>
      this.s3.send(new AbortMultipartUploadCommand({ Bucket: this.bucket, Key: key, UploadId: uploadId }), { abortSignal }),
    ).catch((err: unknown) => {
      if (!(err instanceof BridgeError && err.type === 'not_found')) throw err;
    });
  }

  /** Runs a small request under the store's deadline, mapping failures to API errors. */
  private async run<T>(what: string, fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
    try {
      return await fn(AbortSignal.timeout(this.timeoutMs));
    } catch (err) {
      throw storeError(what, err);
    }
  }
}

function isNoSuchKey(err: unknown): boolean {
  return err instanceof S3ServiceException && (err.name === 'NoSuchKey' || err.name === 'NotFound' || err.$metadata?.httpStatusCode === 404);
}

/**
 * A store failure as the API reports it: unreachable, timed out or overloaded is a 503 the
 * caller may retry; a store that refuses our credentials or lacks the bucket is a 500 naming the
 * setting to fix (retrying will not help). Never includes credentials.
 */
export function storeError(what: string, err: unknown): BridgeError {
  if (err instanceof BridgeError) return err;
  const e = err as { name?: string; code?: string; message?: string; $metadata?: { httpStatusCode?: number } };
  const status = e?.$metadata?.httpStatusCode;
  const name = e?.name ?? e?.code ?? 'Error';
  if (err instanceof S3ServiceException && status !== undefined && status < 500) {
    if (name === 'NoSuchBucket') {
      return new BridgeError('internal_error', `object store: the bucket does not exist (check OBJECT_STORE_BUCKET) during ${what}`, { cause: err });
    }
    if (status === 403 || name === 'InvalidAccessKeyId' || name === 'SignatureDoesNotMatch' || name === 'AccessDenied') {
      return new BridgeError('internal_error', `object store refused the bridge's credentials during ${what} (${name}); check the object store settings`, { cause: err });
    }
    if (status === 404) return new BridgeError('not_found', `object store: not found during ${what}`, { cause: err });
    return new BridgeError('internal_error', `object store answered ${status} ${name} during ${what}`, { cause: err });
  }
  const reason = status !== undefined ? `${status} ${name}` : e?.code ?? (name === 'AbortError' || name === 'TimeoutError' ? 'timed out' : name);
  return new BridgeError('cluster_unavailable', `the object store is unavailable (${what}: ${reason}); retry later`, {
    headers: { 'Retry-After': '5' },
    cause: err,
  });
}
