// A box's state beyond Running, and the lease of whoever moves it between states, on its record
// (docs/lifecycle.md "Leases and epochs"). Every write is a compare-and-swap on the record's
// resourceVersion; a write that lost to an unrelated change (an env update) is tried again as
// long as the lease on the record is still this holder's. Shared by the operator's sleeper and
// the bridge's waker.
import type * as k8s from '@kubernetes/client-node';
import type { BoxRecords, RecordChange } from './box-records.js';
import { ANNOTATIONS, LABELS } from './labels.js';

/** The record label's values: Running has none. */
export type BoxState = 'pending' | 'asleep' | 'waking' | 'failed';

export interface Lease {
  holder: string;
  epoch: number;
  /** When the holder last wrote it (ms since the epoch). */
  renewed: number;
  seconds: number;
}

export interface Held {
  record: k8s.V1Secret;
  lease: Lease;
}

const MAX_ATTEMPTS = 5;

export function stateOf(record: k8s.V1Secret | undefined): BoxState | undefined {
  const v = record?.metadata?.labels?.[LABELS.sleep];
  return v === 'pending' || v === 'asleep' || v === 'waking' || v === 'failed' ? v : undefined;
}

export function leaseOf(record: k8s.V1Secret | undefined): Lease | undefined {
  const raw = record?.metadata?.annotations?.[ANNOTATIONS.lease];
  if (!raw) return undefined;
  try {
    const l = JSON.parse(raw) as { holder?: unknown; epoch?: unknown; renewed?: unknown; seconds?: unknown };
    const renewed = typeof l.renewed === 'string' ? Date.parse(l.renewed) : NaN;
    if (typeof l.holder !== 'string' || typeof l.epoch !== 'number' || typeof l.seconds !== 'number' || !Number.isFinite(renewed)) return undefined;
    return { holder: l.holder, epoch: l.epoch, renewed, seconds: l.seconds };
  } catch {
    return undefined;
  }
}

/** A lease its holder stopped renewing: anyone may take it over. A garbled one counts as expired. */
export function leaseExpired(record: k8s.V1Secret | undefined, now: number): boolean {
  const lease = leaseOf(record);
  return !lease || lease.renewed + lease.seconds * 1000 <= now;
}

/** When the lease on the record expires (ms), or undefined without one. */
export function leaseExpiry(record: k8s.V1Secret | undefined): number | undefined {
  const lease = leaseOf(record);
  return lease ? lease.renewed + lease.seconds * 1000 : undefined;
}

/** The newest epoch any lease on this record had (0: none yet). */
export function epochOf(record: k8s.V1Secret | undefined): number {
  const n = Number(record?.metadata?.annotations?.[ANNOTATIONS.epoch] ?? 0);
  return Number.isSafeInteger(n) && n > 0 ? n : 0;
}

export interface BoxLeasesOptions {
  records: Pick<BoxRecords, 'read' | 'swap'>;
  /** Who takes leases here (a replica or operator process, unique per process). */
  identity: string;
  durationMs: number;
  now?: () => number;
}

export class BoxLeases {
  private readonly now: () => number;

  constructor(private readonly o: BoxLeasesOptions) {
    this.now = o.now ?? Date.now;
  }

  get durationMs(): number {
    return this.o.durationMs;
  }

  /**
   * Takes the box's lease for `state`, from the record as it was read: only when no live lease
   * is on it, and only if the record did not change since (the caller decided on what it read).
   */
  async take(record: k8s.V1Secret, state: BoxState, change: RecordChange = {}): Promise<Held | undefined> {
    if (!leaseExpired(record, this.now()) || record.metadata?.deletionTimestamp) return undefined;
    const lease = this.lease(epochOf(record) + 1);
    const taken = await this.o.records.swap(record, {
      ...change,
      labels: { ...change.labels, [LABELS.sleep]: state },
      annotations: { ...change.annotations, [ANNOTATIONS.lease]: formatLease(lease), [ANNOTATIONS.epoch]: String(lease.epoch) },
    });
    return taken ? { record: taken, lease } : undefined;
  }

  /** Writes change under the held lease, renewing it; undefined when the lease is no longer ours. */
  async update(held: Held, change: RecordChange = {}): Promise<Held | undefined> {
    const lease = { ...held.lease, renewed: this.now() };
    const written = await this.casHeld(held, { ...change, annotations: { ...change.annotations, [ANNOTATIONS.lease]: formatLease(lease) } });
    return written ? { record: written, lease } : undefined;
  }

  /**
   * Ends the lease, leaving the box in `state` (null: Running, no label) with change applied;
   * undefined when the lease was no longer ours (nothing written).
   */
  async release(held: Held, state: BoxState | null, change: RecordChange = {}): Promise<k8s.V1Secret | undefined> {
    return this.casHeld(held, {
      ...change,
      labels: { ...change.labels, [LABELS.sleep]: state },
      annotations: { ...change.annotations, [ANNOTATIONS.lease]: null },
    });
  }

  /** A compare-and-swap that survives unrelated changes of the record, never a change of its lease. */
  private async casHeld(held: Held, change: RecordChange): Promise<k8s.V1Secret | undefined> {
    let record: k8s.V1Secret | undefined = held.record;
    for (let attempt = 0; attempt < MAX_ATTEMPTS && record; attempt++) {
      const written = await this.o.records.swap(record, change);
      if (written) return written;
      record = await this.o.records.read(record.metadata!.name!);
      const lease = leaseOf(record);
      if (!record || record.metadata?.deletionTimestamp || lease?.holder !== held.lease.holder || lease.epoch !== held.lease.epoch) return undefined;
    }
    return undefined;
  }

  private lease(epoch: number): Lease {
    return { holder: this.o.identity, epoch, renewed: this.now(), seconds: Math.ceil(this.o.durationMs / 1000) };
  }
}

function formatLease(l: Lease): string {
  return JSON.stringify({ holder: l.holder, epoch: l.epoch, renewed: new Date(l.renewed).toISOString(), seconds: l.seconds });
}

/**
 * Keeps a held lease renewed every third of its duration while its work runs, and is the one
 * writer of the record meanwhile (updates and renewals take turns). `signal` aborts when the lease
 * is lost: a renewal found another holder, or none succeeded for most of the lease's duration (the
 * API server unreachable), after which another party may take over — the work must stop.
 */
export class LeaseKeeper {
  private readonly aborter = new AbortController();
  private held: Held;
  private chain: Promise<unknown> = Promise.resolve();
  private timer: NodeJS.Timeout | undefined;
  private lastRenewal: number;
  private stopped = false;

  constructor(
    private readonly leases: BoxLeases,
    held: Held,
    private readonly now: () => number = Date.now,
  ) {
    this.held = held;
    this.lastRenewal = now();
    this.schedule();
  }

  get signal(): AbortSignal {
    return this.aborter.signal;
  }

  get current(): Held {
    return this.held;
  }

  /** Writes change under the lease (after any renewal in flight); undefined when it is lost. */
  update(change: RecordChange): Promise<Held | undefined> {
    return this.turn(async () => {
      if (this.aborter.signal.aborted) return undefined;
      const next = await this.leases.update(this.held, change);
      if (next) this.renewed(next);
      else this.lost('the lease was taken over');
      return next;
    });
  }

  /** Stops renewing (after a renewal in flight) and hands the lease back for its release. */
  async stop(): Promise<Held> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.chain.catch(() => undefined);
    return this.held;
  }

  private schedule(): void {
    if (this.stopped) return;
    const every = Math.max(100, Math.floor(this.leases.durationMs / 3));
    this.timer = setTimeout(() => {
      void this.turn(async () => {
        if (this.stopped || this.aborter.signal.aborted) return;
        try {
          const next = await this.leases.update(this.held);
          if (next) this.renewed(next);
          else this.lost('the lease was taken over');
        } catch {
          // The API server did not answer: tried again at the next turn, given up near expiry.
          if (this.now() - this.lastRenewal > this.leases.durationMs * 0.8) this.lost('the lease could not be renewed');
        }
      }).finally(() => this.schedule());
    }, every);
    this.timer.unref?.();
  }

  private renewed(next: Held): void {
    this.held = next;
    this.lastRenewal = this.now();
  }

  private lost(why: string): void {
    if (!this.aborter.signal.aborted) this.aborter.abort(new LeaseLostError(why));
  }

  private turn<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.chain.then(fn, fn);
    this.chain = next.catch(() => undefined);
    return next;
  }
}

export class LeaseLostError extends Error {
  constructor(why: string) {
    super(`lost the box's lease: ${why}`);
    this.name = 'LeaseLostError';
  }
}
