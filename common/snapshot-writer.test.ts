// The stored form of a workspace: what takeSnapshot compresses, workspaceReader checks and
// decompresses for boxd. Pure streams, no store.
import { createHash, randomBytes } from 'node:crypto';
import { PassThrough, Readable } from 'node:stream';
import { gzipSync, zstdDecompressSync } from 'node:zlib';
import { PART_SIZE } from './object-store.js';
import { WorkspaceCompression, workspaceCompressor, workspaceReader } from './snapshot-writer.js';

/** A tar-like body: some random (incompressible) and some repetitive bytes. */
const TAR = Buffer.concat([randomBytes(300_000), Buffer.alloc(700_000, 'const x = 1;\n'), randomBytes(50_000)]);

async function compressed(data: Buffer): Promise<Buffer> {
  const parts: Buffer[] = [];
  const z = workspaceCompressor();
  Readable.from([data]).pipe(z);
  for await (const c of z as AsyncIterable<Buffer>) parts.push(c);
  return Buffer.concat(parts);
}

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/** Chunks of 64 KiB, as a store's body arrives. */
const body = (b: Buffer) => Readable.from(Array.from({ length: Math.ceil(b.length / 65536) }, (_, i) => b.subarray(i * 65536, (i + 1) * 65536)));

/** Reads the tar out: its bytes, whether it ended, and its error. */
async function drain(tar: Readable): Promise<{ out: Buffer; ended: boolean; error?: Error }> {
  const parts: Buffer[] = [];
  let ended = false;
  return new Promise((resolve) => {
    tar.on('data', (c: Buffer) => parts.push(c));
    tar.on('end', () => {
      ended = true;
      resolve({ out: Buffer.concat(parts), ended });
    });
    tar.on('error', (error) => resolve({ out: Buffer.concat(parts), ended, error }));
  });
}

test('a zstd workspace reads back as the plain tar, its stored bytes counted', async () => {
  const stored = await compressed(TAR);
  expect(stored.length).toBeLessThan(TAR.length); // the repetitive part compresses
  const r = workspaceReader({ compression: 'zstd', sha256: sha256(stored), size: stored.length }, body(stored));
  const { out, ended, error } = await drain(r.tar);
  expect(error).toBeUndefined();
  expect(ended).toBe(true);
  expect(out.equals(TAR)).toBe(true);
  expect(r.stored.bytes).toBe(stored.length);
});

test('a snapshot taken before zstd (no compression in its metadata) is gzip, and reads back too', async () => {
  const stored = gzipSync(TAR);
  const { out, error } = await drain(workspaceReader({ sha256: sha256(stored), size: stored.length }, body(stored)).tar);
  expect(error).toBeUndefined();
  expect(out.equals(TAR)).toBe(true);
});

test.each([
  ['another digest', (b: Buffer) => ({ sha256: sha256(Buffer.from('other')), size: b.length })],
  ['another size', (b: Buffer) => ({ sha256: sha256(b), size: b.length + 1 })],
])('stored bytes that do not match the metadata (%s) fail the tar before its end reaches boxd', async (_what, meta) => {
  const stored = await compressed(TAR);
  // Every stored byte arrives; the stored stream's end comes a moment later.
  const source = new PassThrough();
  const tar = workspaceReader({ compression: 'zstd', ...meta(stored) }, source).tar;
  let before = 0;
  tar.on('data', (c: Buffer) => (before += c.length));
  const drained = drain(tar);
  for (let at = 0; at < stored.length; at += 65536) source.write(stored.subarray(at, at + 65536));
  await new Promise((resolve) => setTimeout(resolve, 300));
  // The check passes or fails only at the stored stream's end; until then its last chunk is held
  // back, so the tar's last bytes have not come out, whatever the time given.
  expect(before).toBeLessThan(TAR.length);
  source.end();
  const { ended, error } = await drained;
  expect(ended).toBe(false);
  expect(error?.message).toMatch(/does not match its checksum/);
});

test('a stored workspace cut short fails the tar', async () => {
  const stored = await compressed(TAR);
  const cut = stored.subarray(0, stored.length - 100);
  const { ended, error } = await drain(workspaceReader({ compression: 'zstd', sha256: sha256(cut), size: cut.length }, body(cut)).tar);
  expect(ended).toBe(false);
  expect(error).toBeDefined();
});

describe('WorkspaceCompression (the worker thread takeSnapshot compresses in)', () => {
  /** 20 MiB, a few parts: random (incompressible) and repetitive bytes, in 64 KiB chunks like boxd's. */
  const BIG = Buffer.concat([randomBytes(12 << 20), Buffer.alloc(8 << 20, 'const x = 1;\n')]);

  async function run(data: Buffer, maxBytes: number, tar: Readable = body(data)) {
    const c = new WorkspaceCompression(maxBytes);
    const fed = c.feed(tar).catch((err: Error) => err);
    const parts: Buffer[] = [];
    try {
      for await (const p of c.parts()) {
        parts.push(Buffer.from(p.data)); // a copy: the slot is filled again once done
        p.done();
      }
      return { parts, result: await c.result, fed: await fed };
    } catch (error) {
      return { parts, error: error as Error, fed: await fed };
    } finally {
      c.close(new Error('test over'));
      await c.release();
    }
  }

  test('parts of PART_SIZE (the last fewer) that decompress to the tar, with their size and SHA-256', async () => {
    const { parts, result, error } = await run(BIG, 1 << 30);
    expect(error).toBeUndefined();
    expect(parts.length).toBeGreaterThan(1);
    for (const p of parts.slice(0, -1)) expect(p.length).toBe(PART_SIZE);
    const stored = Buffer.concat(parts);
    expect(result).toEqual({ bytes: stored.length, sha256: sha256(stored) });
    expect(zstdDecompressSync(stored).equals(BIG)).toBe(true);
  });

  test('more compressed bytes than the limit fail as payload_too_large', async () => {
    const { error } = await run(BIG, 4 << 20);
    expect(error).toMatchObject({ type: 'payload_too_large' });
  });

  test('a tar that fails mid-way fails the parts with its error (nothing complete is produced)', async () => {
    const cut = new PassThrough();
    cut.write(BIG.subarray(0, 10 << 20));
    setTimeout(() => cut.destroy(new Error('boxd ended the archive early')), 50);
    const { error, result, fed } = await run(BIG, 1 << 30, cut);
    expect(error?.message).toBe('boxd ended the archive early');
    expect(fed).toBe(error);
    expect(result).toBeUndefined();
  });
});
