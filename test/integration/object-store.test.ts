// The object store client's streamed uploads against the local cluster's real S3 server
// (versitygw): bodies of every size around the part size arrive byte for byte (a multipart upload
// whose parts go in parallel, each copied once into a reused part buffer), a body that fails
// mid-way leaves neither an object nor an open upload, and a store that stops answering in the
// middle of an upload is a 503 with Retry-After within its idle timeout. No boxes: seconds.
import { createHash, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { BridgeError } from '../../common/errors.js';
import { ObjectStore, ObjectStoreConfigSchema } from '../../common/object-store.js';
import { localObjectStore } from '../support/object-store.js';
import { TcpProxy } from '../support/tcp-proxy.js';

const store = await localObjectStore();
if (!store.available) console.warn(`SKIPPED object store tests: ${store.reason}`);
const suite = store.available ? describe : describe.skip;
const env = store.available ? store.env : {};

const MiB = 1024 * 1024;
const PART = 8 * MiB; // common/object-store.ts PART_SIZE

/** size bytes of random data in chunks of uneven sizes (up to 300 KiB), as a network stream delivers them. */
function chunksOf(size: number): Buffer[] {
  const data = randomBytes(size);
  const chunks: Buffer[] = [];
  for (let at = 0; at < size; ) {
    const n = Math.min(size - at, 1 + Math.floor(Math.random() * 300 * 1024));
    chunks.push(data.subarray(at, at + n));
    at += n;
  }
  return chunks;
}

const sha256 = (chunks: Buffer[]) => chunks.reduce((h, c) => h.update(c), createHash('sha256')).digest('hex');

suite('streamed uploads to the real object store', () => {
  let s3: ObjectStore;
  const key = (name: string) => s3.key('uploads', name);

  async function stored(k: string): Promise<{ size: number; sha256: string } | undefined> {
    const got = await s3.getStream(k);
    if (!got) return undefined;
    const chunks: Buffer[] = [];
    for await (const c of got.body as AsyncIterable<Buffer>) chunks.push(c);
    return { size: chunks.reduce((n, c) => n + c.length, 0), sha256: sha256(chunks) };
  }

  async function openUploads(): Promise<string[]> {
    const open: string[] = [];
    for await (const u of s3.listUploads(s3.key(''))) open.push(u.key);
    return open;
  }

  beforeAll(() => {
    s3 = new ObjectStore(ObjectStoreConfigSchema.parse(env));
  });

  afterAll(async () => {
    const keys: string[] = [];
    for await (const o of s3.list(s3.key(''))) keys.push(o.key);
    await s3.delete(keys);
    for await (const u of s3.listUploads(s3.key(''))) await s3.abortUpload(u.key, u.uploadId);
    s3.close();
  });

  test.each([
    ['empty', 0],
    ['under a part', 1000],
    ['exactly a part', PART],
    ['a part and a byte', PART + 1],
    ['several parts and a tail', 4 * PART + 12_345],
  ])('a body %s arrives byte for byte, no upload left open', async (name, size) => {
    const chunks = chunksOf(size);
    await s3.upload(key(name), Readable.from(chunks), { contentType: 'application/octet-stream' });
    expect(await stored(key(name))).toEqual({ size, sha256: sha256(chunks) });
    expect(await openUploads()).toEqual([]);
  }, 60_000);

  test('a body that fails after two parts: the upload rejects, nothing is stored, no parts are left', async () => {
    const chunks = chunksOf(2 * PART + MiB);
    async function* failing() {
      yield* chunks;
      throw new Error('the box went away');
    }
    await expect(s3.upload(key('failed'), Readable.from(failing()), { contentType: 'application/octet-stream' })).rejects.toThrow();
    expect(await stored(key('failed'))).toBeUndefined();
    expect(await openUploads()).toEqual([]);
  }, 60_000);

  test('a store that stops answering mid-upload: a 503 with Retry-After within its idle timeout, no object', async () => {
    const proxy = new TcpProxy('127.0.0.1', Number(new URL(env.OBJECT_STORE_ENDPOINT!).port));
    await proxy.start();
    const via = new ObjectStore(
      ObjectStoreConfigSchema.parse({ ...env, OBJECT_STORE_ENDPOINT: `http://127.0.0.1:${proxy.port}`, OBJECT_STORE_IDLE_TIMEOUT_MS: '2000', OBJECT_STORE_TIMEOUT_MS: '1000' }),
    );
    try {
      const chunks = chunksOf(6 * PART);
      let sent = 0;
      async function* body() {
        for (const c of chunks) {
          sent += c.length;
          // Once two parts went, the store goes silent: open connections drop, new ones hang.
          if (sent > 2 * PART && proxy.mode === 'forward') proxy.set('blackhole');
          yield c;
        }
      }
      const t = performance.now();
      const err = await via.upload(key('silent'), Readable.from(body()), { contentType: 'application/octet-stream' }).then(
        () => undefined,
        (e: unknown) => e,
      );
      const seconds = (performance.now() - t) / 1000;
      expect(err).toBeInstanceOf(BridgeError);
      expect({ type: (err as BridgeError).type, retryAfter: (err as BridgeError).headers?.['Retry-After'] }).toEqual({ type: 'cluster_unavailable', retryAfter: '5' });
      // Idle timeout (2 s) of a part and of its one retry, and the abort's own deadline (1 s).
      expect(seconds).toBeLessThan(10);
    } finally {
      via.close();
      await proxy.stop();
    }
    expect(await stored(key('silent'))).toBeUndefined();
  }, 60_000);
});
