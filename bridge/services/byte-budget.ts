// The one per-replica budget of bytes that requests may hold in memory at once: exec answers,
// JSON file reads, file and archive transfers, exec and process output streams, terminals, and
// boxd's JSON answers. A call takes its share before it starts and gives it back when it ends;
// a call that does not fit is refused at once with 503 and Retry-After (this replica is short of
// memory, another may not be), so the replica never grows towards its memory limit.
import { BridgeError } from '../../common/errors.js';

const KiB = 1024;
const MiB = 1024 * KiB;

/** What a hold is for: the label of refusals in the metrics. */
export type HoldKind = 'exec' | 'output' | 'terminal' | 'file' | 'archive' | 'answer' | 'port' | 'snapshot';

/**
 * What each kind of relay holds at most, by design (high watermarks and the largest frame),
 * reserved for its whole life.
 */
export const HOLD_BYTES = {
  /**
   * A relay of boxd frames (exec output, process output): one frame being assembled (the
   * protocol allows 1 MiB), the chunk it arrived in, and one encoded output line (at most 6
   * bytes of JSON per byte of a 32 KiB piece) waiting in the answer's buffer.
   */
  frames: 1.5 * MiB,
  /**
   * An exec's relay (answered whole or streamed): boxd's exec frames carry at most 32 KiB of
   * output, and the relay refuses any over EXEC_FRAME_LIMIT (64 KiB), so: a frame being
   * assembled together with the chunk it arrived in (128 KiB), what the response from boxd
   * buffers meanwhile (its 64 KiB high-water mark), and one encoded output line, or the JSON of
   * an answer sent in one piece (at most 6 bytes per byte of 32 KiB).
   */
  exec: 384 * KiB,
  /**
   * A terminal: a frame from boxd being assembled, the WebSocket's send buffer up to its high
   * watermark plus what one chunk adds, and one message from the caller (up to 1 MiB) on its
   * way to boxd.
   */
  terminal: 2.5 * MiB,
  /** A byte stream passed through (file and archive transfers, a request to a port): a chunk per side and the watermarks. */
  pipe: 256 * KiB,
} as const;

export interface Hold {
  /** Bytes held now. */
  readonly bytes: number;
  /** Takes n more bytes if the budget has them; false (and nothing taken) if not. */
  tryGrow(n: number): boolean;
  /** Gives everything back (once; later calls do nothing). */
  release(): void;
}

export interface ByteBudgetHooks {
  /** A call refused because the budget is spent. */
  onRefused?: (kind: HoldKind) => void;
}

export class ByteBudget {
  private used = 0;

  constructor(
    readonly total: number,
    private readonly hooks: ByteBudgetHooks = {},
  ) {}

  /**
   * Holds n bytes for a call, or refuses it: 413 when n exceeds the whole budget (it could
   * never fit), else 503 while the budget is spent.
   */
  reserve(n: number, kind: HoldKind, what: string = kind): Hold {
    if (n > this.total) throw new BridgeError('payload_too_large', `${what} needs ${n} bytes of memory; this bridge allows ${this.total}`);
    if (this.used + n > this.total) {
      this.hooks.onRefused?.(kind);
      throw new BridgeError(
        'cluster_unavailable',
        `this bridge replica is holding its whole memory budget for other calls (${what} needs ${n} bytes); retry shortly`,
        { headers: { 'Retry-After': '1' } },
      );
    }
    this.used += n;
    return this.hold(n);
  }

  inUse(): number {
    return this.used;
  }

  private hold(initial: number): Hold {
    let bytes = initial;
    let released = false;
    const take = (n: number): boolean => {
      if (released || this.used + n > this.total) return false;
      this.used += n;
      bytes += n;
      return true;
    };
    return {
      get bytes() {
        return released ? 0 : bytes;
      },
      tryGrow: take,
      release: () => {
        if (released) return;
        released = true;
        this.used -= bytes;
      },
    };
  }
}

/**
 * Bytes of one output stream held against a hold, up to a cap: copied into blocks the hold
 * grows by (so what is counted is what is kept, whatever the size of the chunks that brought
 * it). Bytes beyond the cap, or beyond what the budget can give, are dropped and `truncated` set.
 */
export class HeldBytes {
  private readonly blocks: Buffer[] = [];
  private last: Buffer | undefined;
  private used = 0;
  private length = 0;
  /** Bytes dropped because the budget had no room (as opposed to the cap). */
  short = false;
  truncated = false;

  constructor(
    private readonly hold: Hold,
    private readonly cap: number,
    /** Blocks start small (most output is a few lines) and double up to this size. */
    private readonly maxBlock = 64 * KiB,
  ) {}

  push(data: Buffer): void {
    let at = 0;
    while (at < data.length) {
      if (this.length >= this.cap) {
        this.truncated = true;
        return;
      }
      if (!this.last || this.used === this.last.length) {
        const size = Math.min(this.last ? this.last.length * 2 : 4 * KiB, this.maxBlock, this.cap - this.length);
        if (!this.hold.tryGrow(size)) {
          this.truncated = this.short = true;
          return;
        }
        this.last = Buffer.allocUnsafe(size);
        this.blocks.push(this.last);
        this.used = 0;
      }
      const n = Math.min(data.length - at, this.last.length - this.used, this.cap - this.length);
      data.copy(this.last, this.used, at, at + n);
      this.used += n;
      this.length += n;
      at += n;
    }
  }

  get size(): number {
    return this.length;
  }

  /** The bytes held, in order (views on the blocks; valid until the hold is released). */
  chunks(): Buffer[] {
    if (!this.last) return [];
    return [...this.blocks.slice(0, -1), this.last.subarray(0, this.used)];
  }
}
