// A deduplicating, rate-limited, delaying work queue in the shape of client-go's workqueue:
// a key is queued at most once however many events arrive, is never handed to two workers at
// once (an add while it is processing marks it dirty and it is re-queued when done), failures
// back off exponentially per key, and addAfter keeps only the earliest timer per key.

export interface Timers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
  now(): number;
}

export const realTimers: Timers = {
  setTimeout: (fn, ms) => {
    const t = setTimeout(fn, ms);
    t.unref();
    return t;
  },
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
  // Monotonic: only durations and deadlines are computed from it, and a wall-clock step must not
  // move them.
  now: () => performance.now(),
};

export interface WorkQueueOptions {
  timers?: Timers;
  /** First retry delay after a failure; doubles per consecutive failure of the key. */
  baseBackoffMs?: number;
  maxBackoffMs?: number;
}

export class WorkQueue {
  private readonly queue: string[] = [];
  private readonly dirty = new Set<string>();
  private readonly processing = new Set<string>();
  private readonly delayed = new Map<string, { at: number; handle: unknown }>();
  private readonly failures = new Map<string, number>();
  private readonly waiters: Array<(key: string | undefined) => void> = [];
  private readonly timers: Timers;
  private readonly baseBackoffMs: number;
  private readonly maxBackoffMs: number;
  private shuttingDown = false;

  constructor(options: WorkQueueOptions = {}) {
    this.timers = options.timers ?? realTimers;
    this.baseBackoffMs = options.baseBackoffMs ?? 50;
    this.maxBackoffMs = options.maxBackoffMs ?? 60_000;
  }

  add(key: string): void {
    if (this.shuttingDown || this.dirty.has(key)) return;
    this.dirty.add(key);
    // A key being processed is re-queued by done(), so a worker never sees it twice at once.
    if (this.processing.has(key)) return;
    const waiter = this.waiters.shift();
    if (waiter) {
      this.dirty.delete(key);
      this.processing.add(key);
      waiter(key);
    } else {
      this.queue.push(key);
    }
  }

  /** Queue the key after delayMs; an earlier pending timer for the key wins. */
  addAfter(key: string, delayMs: number): void {
    if (this.shuttingDown) return;
    if (delayMs <= 0) return this.add(key);
    const at = this.timers.now() + delayMs;
    const pending = this.delayed.get(key);
    if (pending && pending.at <= at) return;
    if (pending) this.timers.clearTimeout(pending.handle);
    const handle = this.timers.setTimeout(() => {
      this.delayed.delete(key);
      this.add(key);
    }, delayMs);
    this.delayed.set(key, { at, handle });
  }

  /** Requeue after a failure with per-key exponential backoff. */
  addRateLimited(key: string): number {
    const n = this.failures.get(key) ?? 0;
    this.failures.set(key, n + 1);
    const delay = Math.min(this.baseBackoffMs * 2 ** n, this.maxBackoffMs);
    this.addAfter(key, delay);
    return delay;
  }

  /** Clears the key's failure count (call after a successful reconcile). */
  forget(key: string): void {
    this.failures.delete(key);
  }

  numRequeues(key: string): number {
    return this.failures.get(key) ?? 0;
  }

  /** Next key to process; undefined once the queue is shut down. */
  get(): Promise<string | undefined> {
    const key = this.queue.shift();
    if (key !== undefined) {
      this.dirty.delete(key);
      this.processing.add(key);
      return Promise.resolve(key);
    }
    if (this.shuttingDown) return Promise.resolve(undefined);
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  done(key: string): void {
    this.processing.delete(key);
    if (this.dirty.has(key)) {
      this.dirty.delete(key);
      this.add(key);
    }
  }

  len(): number {
    return this.queue.length;
  }

  shutDown(): void {
    this.shuttingDown = true;
    for (const { handle } of this.delayed.values()) this.timers.clearTimeout(handle);
    this.delayed.clear();
    for (const waiter of this.waiters.splice(0)) waiter(undefined);
  }
}
