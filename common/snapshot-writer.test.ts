// The stored form of a workspace and the worker that moves it (common/snapshot-worker.ts): what
// WorkspaceCompression reads from boxd and compresses, and what restoreWorkspace checks,
// decompresses and sends boxd. Against a real boxd built from boxd/ and run on this host over a
// temporary directory (no store: the parts are collected here, the stored bytes fed from memory).
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { gzipSync, zstdDecompressSync } from 'node:zlib';
import { BoxdClient, BoxdUnreachableError, type BoxdTarget } from './boxd-client.js';
import { PART_SIZE } from './object-store.js';
import { WorkspaceCompression, restoreWorkspace } from './snapshot-writer.js';

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const root = mkdtempSync(join(tmpdir(), 'sb-snapshot-writer-'));
/** boxd's binary and credential: a directory of its own, which its file routes refuse. */
const home = mkdtempSync(join(tmpdir(), 'sb-snapshot-writer-boxd-'));
const SRC = join(root, 'src');
let boxd: ChildProcess;
let client: BoxdClient;
let target: BoxdTarget;
let boxdPort: number;

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
  const port = (s.address() as { port: number }).port;
  await new Promise((resolve) => s.close(resolve));
  return port;
}

/** A tree like a workspace: a random (incompressible) file, a repetitive one, small files in a subdirectory. */
function makeTree(dir: string) {
  mkdirSync(join(dir, 'sub'), { recursive: true });
  writeFileSync(join(dir, 'model.bin'), randomBytes(12 << 20));
  writeFileSync(join(dir, 'app.log'), Buffer.alloc(8 << 20, 'const x = 1;\n'));
  for (let i = 0; i < 50; i++) writeFileSync(join(dir, 'sub', `f${i}.ts`), `export const v${i} = ${i};\n`.repeat(100));
}

/** Every file under dir, relative path -> digest. */
function digests(dir: string, at = ''): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of readdirSync(join(dir, at), { withFileTypes: true })) {
    const rel = join(at, e.name);
    if (e.isDirectory()) Object.assign(out, digests(dir, rel));
    else out[rel] = sha256(readFileSync(join(dir, rel)));
  }
  return out;
}

beforeAll(async () => {
  const bin = join(home, 'boxd');
  execFileSync('go', ['build', '-o', bin, '.'], { cwd: new URL('../boxd/', import.meta.url).pathname, env: { ...process.env, CGO_ENABLED: '0', GOTOOLCHAIN: process.env.GOTOOLCHAIN ?? 'auto' } });
  const token = randomBytes(16).toString('hex');
  mkdirSync(join(home, 'secret'));
  writeFileSync(join(home, 'secret', 'token'), token);
  const port = await freePort();
  boxd = spawn(bin, ['serve'], {
    env: { PATH: process.env.PATH, BOXD_PORT: String(port), BOXD_SECRET_DIR: join(home, 'secret'), BOXD_WORKDIR: root, BOXD_MOUNTS_PORT: String(await freePort()) },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  boxdPort = port;
  client = new BoxdClient({ port });
  target = { box: 'test-box', ip: '127.0.0.1', token };
  makeTree(SRC);
  for (let i = 0; ; i++) {
    try {
      await client.health(target);
      break;
    } catch (err) {
      if (i > 50) throw err;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}, 120_000);

afterAll(() => {
  client?.close();
  boxd?.kill();
  rmSync(root, { recursive: true, force: true });
  rmSync(home, { recursive: true, force: true });
});

/** Snapshots dir through the worker: the parts collected (copies), the result or the error. */
async function snapshot(opts: { path?: string; maxBytes?: number; entries?: number; target?: BoxdTarget; client?: BoxdClient; signal?: AbortSignal } = {}) {
  const c = new WorkspaceCompression({
    boxd: opts.client ?? client,
    target: opts.target ?? target,
    signal: opts.signal,
    path: opts.path ?? SRC,
    limits: { bytes: 1 << 30, entries: opts.entries ?? 100_000 },
    maxBytes: opts.maxBytes ?? 1 << 30,
  });
  const parts: Buffer[] = [];
  try {
    await c.opened;
    for await (const p of c.parts()) {
      parts.push(Buffer.from(p.data)); // a copy: the slot is filled again once done
      p.done();
    }
    return { parts, stored: Buffer.concat(parts), result: await c.result };
  } catch (error) {
    return { parts, error: error as Error };
  } finally {
    c.close(new Error('test over'));
    await c.release();
  }
}

/** 64 KiB chunks, as a store's body arrives. */
const body = (b: Buffer) => Readable.from(Array.from({ length: Math.ceil(b.length / 65536) }, (_, i) => b.subarray(i * 65536, (i + 1) * 65536)));

function restore(stored: Buffer, dest: string, metadata: { compression?: 'zstd'; sha256: string; size: number }, replace = true) {
  return restoreWorkspace({ boxd: client, target, metadata, body: body(stored), path: dest, limits: { bytes: 1 << 30, entries: 100_000 }, replace });
}

describe('a snapshot: boxd read, compressed, counted and hashed in the worker', () => {
  let taken: Awaited<ReturnType<typeof snapshot>>;
  beforeAll(async () => {
    taken = await snapshot();
  });

  test('parts of PART_SIZE (the last fewer), their size and SHA-256, zstd of a tar of the tree', () => {
    expect(taken.error).toBeUndefined();
    expect(taken.parts.length).toBeGreaterThan(1);
    for (const p of taken.parts.slice(0, -1)) expect(p.length).toBe(PART_SIZE);
    expect(taken.result).toEqual({ bytes: taken.stored!.length, sha256: sha256(taken.stored!) });
    const tar = zstdDecompressSync(taken.stored!);
    expect(tar.length).toBeGreaterThan(20 << 20); // the data, uncompressed
    expect(taken.stored!.length).toBeLessThan(tar.length); // the repetitive file compressed
  });

  test('restored (replace) into another directory: the same files, the stale one gone', async () => {
    const dest = join(root, 'dest');
    mkdirSync(dest, { recursive: true });
    writeFileSync(join(dest, 'stale.txt'), 'old');
    const r = await restore(taken.stored!, dest, { compression: 'zstd', sha256: taken.result!.sha256, size: taken.result!.bytes });
    expect(r.stored).toBe(taken.stored!.length);
    expect(r.written.entries).toBeGreaterThan(50);
    expect(digests(dest)).toEqual(digests(SRC));
  });

  test.each([
    ['another digest', (b: Buffer) => ({ sha256: sha256(Buffer.from('other')), size: b.length })],
    ['another size', (b: Buffer) => ({ sha256: sha256(b), size: b.length + 1 })],
  ])('stored bytes that do not match the metadata (%s): 500, and boxd changed nothing', async (_what, meta) => {
    const dest = join(root, `dest-mismatch-${randomBytes(3).toString('hex')}`);
    mkdirSync(dest);
    writeFileSync(join(dest, 'kept.txt'), 'mine');
    await expect(restore(taken.stored!, dest, { compression: 'zstd', ...meta(taken.stored!) })).rejects.toMatchObject({
      type: 'internal_error',
      message: expect.stringMatching(/does not match its checksum/),
    });
    // boxd removes its staging directory once it has seen the body break off: wait for it (bounded).
    for (let i = 0; i < 50 && readdirSync(dest).length > 1; i++) await new Promise((resolve) => setTimeout(resolve, 100));
    expect(digests(dest)).toEqual({ 'kept.txt': sha256(Buffer.from('mine')) });
  });

  test("boxd's refusal of the restore (more entries than its limits) is its error; the store's stream is released, nothing changed", async () => {
    const dest = join(root, 'dest-refused');
    mkdirSync(dest);
    const src = body(taken.stored!);
    await expect(
      restoreWorkspace({ boxd: client, target, metadata: { compression: 'zstd', sha256: taken.result!.sha256, size: taken.result!.bytes }, body: src, path: dest, limits: { bytes: 1 << 30, entries: 3 }, replace: true }),
    ).rejects.toMatchObject({ type: 'payload_too_large', message: expect.stringMatching(/entries/) });
    expect(src.destroyed).toBe(true);
    expect(readdirSync(dest)).toEqual([]);
  });

  test('a snapshot taken before zstd (gzip, no compression in its metadata) restores too', async () => {
    const gz = gzipSync(zstdDecompressSync(taken.stored!));
    const dest = join(root, 'dest-gzip');
    await restore(gz, dest, { sha256: sha256(gz), size: gz.length });
    expect(digests(dest)).toEqual(digests(SRC));
  });
});

test('more compressed bytes than the limit fail as payload_too_large', async () => {
  const { error } = await snapshot({ maxBytes: 4 << 20 });
  expect(error).toMatchObject({ type: 'payload_too_large', message: expect.stringMatching(/larger than its limit/) });
});

test("boxd's refusals are the errors BoxdClient gives: a tree over the limits (413), a wrong credential (500)", async () => {
  const over = await snapshot({ entries: 3 });
  expect(over.error).toMatchObject({ type: 'payload_too_large', message: expect.stringMatching(/entries/) });
  expect(over.parts).toEqual([]);
  const denied = await snapshot({ target: { ...target, token: 'wrong' } });
  expect(denied.error).toMatchObject({ type: 'internal_error', message: expect.stringMatching(/refused the bridge's credential/) });
  const missing = await snapshot({ path: join(root, 'nothing-here') });
  expect(missing.error).toMatchObject({ type: 'not_found' });
});

test('a boxd that is not there is BoxdUnreachableError (the connector decides what it means)', async () => {
  const port = await freePort();
  const { error } = await snapshot({ client: new BoxdClient({ port }) });
  expect(error).toBeInstanceOf(BoxdUnreachableError);
});

test("the caller's signal ends the snapshot with its reason", async () => {
  const reason = new Error('the caller gave up');
  const c = new AbortController();
  setTimeout(() => c.abort(reason), 30);
  const { error } = await snapshot({ signal: c.signal });
  expect(error).toBe(reason);
});

test('a boxd that stops answering fails the call with 503 once its health check goes unanswered (the idle deadline, counted)', async () => {
  const deadlines: string[] = [];
  const quick = new BoxdClient({ port: boxdPort, deadlines: { idleMs: 300 }, onDeadline: (d) => deadlines.push(d) });
  boxd.kill('SIGSTOP'); // the kernel still accepts the connection: the request meets silence
  const resume = setTimeout(() => boxd.kill('SIGCONT'), 3000); // bounded: a call that never fails then completes
  try {
    const { error } = await snapshot({ client: quick });
    expect(error).toMatchObject({ type: 'cluster_unavailable', message: expect.stringMatching(/stopped answering/) });
    expect(deadlines).toEqual(['idle']);
  } finally {
    clearTimeout(resume);
    boxd.kill('SIGCONT');
    quick.close();
  }
}, 10_000);
