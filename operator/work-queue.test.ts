import { WorkQueue, type Timers } from './work-queue.js';

class FakeTimers implements Timers {
  time = 0;
  private nextId = 0;
  private readonly pending = new Map<number, { at: number; fn: () => void }>();
  now(): number {
    return this.time;
  }
  setTimeout(fn: () => void, ms: number): unknown {
    const id = this.nextId++;
    this.pending.set(id, { at: this.time + ms, fn });
    return id;
  }
  clearTimeout(handle: unknown): void {
    this.pending.delete(handle as number);
  }
  advance(ms: number): void {
    this.time += ms;
    for (const [id, t] of [...this.pending].sort((a, b) => a[1].at - b[1].at)) {
      if (t.at <= this.time) {
        this.pending.delete(id);
        t.fn();
      }
    }
  }
  count(): number {
    return this.pending.size;
  }
}

test('many adds of one key queue it once', async () => {
  const q = new WorkQueue();
  for (let i = 0; i < 100; i++) q.add('a');
  q.add('b');
  expect(q.len()).toBe(2);
  expect(await q.get()).toBe('a');
  expect(await q.get()).toBe('b');
  expect(q.len()).toBe(0);
});

test('a key added while processing is re-queued once when done, never handed out twice at once', async () => {
  const q = new WorkQueue();
  q.add('a');
  const key = await q.get();
  q.add('a');
  q.add('a');
  expect(q.len()).toBe(0);
  q.done(key!);
  expect(q.len()).toBe(1);
  expect(await q.get()).toBe('a');
});

test('a waiting worker receives a key as soon as it is added', async () => {
  const q = new WorkQueue();
  const next = q.get();
  q.add('x');
  expect(await next).toBe('x');
});

test('addAfter keeps the earliest timer per key', () => {
  const timers = new FakeTimers();
  const q = new WorkQueue({ timers });
  q.addAfter('a', 1000);
  q.addAfter('a', 5000);
  q.addAfter('a', 200);
  expect(timers.count()).toBe(1);
  timers.advance(199);
  expect(q.len()).toBe(0);
  timers.advance(1);
  expect(q.len()).toBe(1);
  timers.advance(10_000);
  expect(q.len()).toBe(1);
});

test('failures back off exponentially per key until forgotten', () => {
  const q = new WorkQueue({ timers: new FakeTimers(), baseBackoffMs: 10, maxBackoffMs: 50 });
  expect(q.addRateLimited('a')).toBe(10);
  expect(q.addRateLimited('a')).toBe(20);
  expect(q.addRateLimited('a')).toBe(40);
  expect(q.addRateLimited('a')).toBe(50);
  expect(q.addRateLimited('b')).toBe(10);
  expect(q.numRequeues('a')).toBe(4);
  q.forget('a');
  expect(q.addRateLimited('a')).toBe(10);
});

test('shutDown releases waiting workers and drops timers', async () => {
  const timers = new FakeTimers();
  const q = new WorkQueue({ timers });
  q.addAfter('a', 100);
  const waiting = q.get();
  q.shutDown();
  expect(await waiting).toBeUndefined();
  expect(timers.count()).toBe(0);
  q.add('b');
  expect(await q.get()).toBeUndefined();
});
