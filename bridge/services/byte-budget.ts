// A per-replica budget of bytes that requests may hold in memory at once (file contents that
// the JSON API must carry whole). A request that does not fit is refused at once with 429 and
// Retry-After instead of pushing the replica towards its memory limit.
import { BridgeError } from '../../common/errors.js';

export class ByteBudget {
  private used = 0;

  constructor(private readonly total: number) {}

  /** Takes n bytes of the budget; the returned function gives them back (once). */
  reserve(n: number, what: string): () => void {
    if (n > this.total) throw new BridgeError('payload_too_large', `${what} needs ${n} bytes of memory; this bridge allows ${this.total}`);
    if (this.used + n > this.total) {
      throw new BridgeError('rate_limited', `too many large transfers on this bridge replica right now (${what}); retry shortly`, {
        headers: { 'Retry-After': '1' },
      });
    }
    this.used += n;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.used -= n;
    };
  }

  inUse(): number {
    return this.used;
  }
}
