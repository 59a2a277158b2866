// The per-replica memory budget: holds, refusals, growth, and output held against it.
import { ByteBudget, HOLD_BYTES, HeldBytes } from './byte-budget.js';
import { EXEC_FRAME_LIMIT } from './exec.js';

test('a hold refuses what does not fit with 503 and Retry-After, what can never fit with 413, and gives bytes back once', () => {
  const refused: string[] = [];
  const budget = new ByteBudget(100, { onRefused: (kind) => refused.push(kind) });
  const a = budget.reserve(60, 'file');
  expect(() => budget.reserve(50, 'exec')).toThrow(expect.objectContaining({ type: 'cluster_unavailable', status: 503, headers: { 'Retry-After': '1' } }));
  expect(() => budget.reserve(101, 'file')).toThrow(expect.objectContaining({ type: 'payload_too_large' }));
  expect(refused).toEqual(['exec']);
  expect(budget.inUse()).toBe(60);
  a.release();
  a.release();
  expect(budget.inUse()).toBe(0);
  expect(a.bytes).toBe(0);
  budget.reserve(100, 'file');
  expect(budget.inUse()).toBe(100);
});

test('a hold grows only while the budget has room, and releases what it grew by', () => {
  const budget = new ByteBudget(100);
  const a = budget.reserve(10, 'exec');
  expect(a.tryGrow(80)).toBe(true);
  expect(a.tryGrow(20)).toBe(false);
  expect([a.bytes, budget.inUse()]).toEqual([90, 90]);
  a.release();
  expect(budget.inUse()).toBe(0);
  expect(a.tryGrow(1)).toBe(false); // released: nothing more is taken
  expect(budget.inUse()).toBe(0);
});

test('held output is copied into blocks the hold grows by, cut at the cap', () => {
  const budget = new ByteBudget(1024 * 1024);
  const hold = budget.reserve(0, 'exec');
  const out = new HeldBytes(hold, 100_000);
  for (let i = 0; i < 1000; i++) out.push(Buffer.alloc(150, i % 256));
  expect(out.size).toBe(100_000);
  expect(out.truncated).toBe(true);
  expect(out.short).toBe(false);
  const bytes = Buffer.concat(out.chunks());
  expect(bytes.length).toBe(100_000);
  expect(bytes[149]).toBe(0);
  expect(bytes[150]).toBe(1);
  // Blocks double from 4 KiB, the last one cut to the cap: what is counted is what is kept.
  expect(hold.bytes).toBe(100_000);
  expect(budget.inUse()).toBe(100_000);
  hold.release();
  expect(budget.inUse()).toBe(0);
});

test('output the budget has no room for is dropped and flagged, never held', () => {
  const budget = new ByteBudget(20 * 1024);
  const hold = budget.reserve(0, 'exec');
  const out = new HeldBytes(hold, 10 * 1024 * 1024);
  out.push(Buffer.alloc(4 * 1024, 1)); // the first 4 KiB block
  out.push(Buffer.alloc(30 * 1024, 2)); // an 8 KiB block fits, a 16 KiB one does not
  expect([out.size, out.truncated, out.short]).toEqual([12 * 1024, true, true]);
  expect(budget.inUse()).toBe(12 * 1024);
  expect(Buffer.concat(out.chunks()).subarray(4096).every((b) => b === 2)).toBe(true);
  out.push(Buffer.alloc(10));
  expect(out.size).toBe(12 * 1024);
});

test('an empty stream holds nothing', () => {
  const budget = new ByteBudget(10);
  const out = new HeldBytes(budget.reserve(0, 'exec'), 100);
  expect(out.chunks()).toEqual([]);
  expect([out.size, out.truncated, budget.inUse()]).toEqual([0, false, 0]);
});

test("an exec's hold covers what its relay may hold: a frame at the relay's bound with the chunk it came in, boxd's response buffer, one encoded output piece", () => {
  const KiB = 1024;
  const frameWithChunk = 2 * EXEC_FRAME_LIMIT; // a frame being assembled and the chunk it arrived in
  const responseBuffer = 64 * KiB; // the response's high-water mark
  const encodedPiece = 6 * 32 * KiB; // one output line or a one-piece answer: at most 6 bytes of JSON per byte of 32 KiB
  expect(frameWithChunk + responseBuffer + encodedPiece).toBeLessThanOrEqual(HOLD_BYTES.exec);
  // and boxd's largest exec frame (32 KiB, PROTOCOL.md) passes the relay's bound
  expect(EXEC_FRAME_LIMIT).toBeGreaterThanOrEqual(32 * KiB);
});
