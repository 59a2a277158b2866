// Keyed rate limits for both programs (rate-limiter-flexible, in this process's memory): a key
// gets `points` actions per window of `windowSeconds`, counted from its first action in that
// window. A rate with bursts maps onto it as `burst` actions per `burst / rate` seconds: the same
// average, and a whole burst allowed at once.
import { RateLimiterMemory, RateLimiterRes } from 'rate-limiter-flexible';

export interface LimitResult {
  allowed: boolean;
  /** Actions per window. */
  limit: number;
  /** Actions left in the current window. */
  remaining: number;
  /** Whole seconds until the window ends (at least 1). */
  resetSeconds: number;
}

export class KeyedLimiter {
  private readonly limiter: RateLimiterMemory;

  constructor(
    readonly points: number,
    readonly windowSeconds: number,
  ) {
    if (!(points >= 1) || !(windowSeconds > 0)) throw new RangeError(`invalid rate limit: ${points} per ${windowSeconds} s`);
    this.limiter = new RateLimiterMemory({ points, duration: windowSeconds });
  }

  /** `burst` actions at once, `ratePerSecond` on average. */
  static fromRate(ratePerSecond: number, burst: number): KeyedLimiter {
    return new KeyedLimiter(burst, burst / ratePerSecond);
  }

  /** Takes one action for `key`; never throws for an exhausted limit. */
  async take(key: string): Promise<LimitResult> {
    try {
      return this.result(true, await this.limiter.consume(key));
    } catch (err) {
      if (err instanceof RateLimiterRes) return this.result(false, err);
      throw err;
    }
  }

  private result(allowed: boolean, res: RateLimiterRes): LimitResult {
    return {
      allowed,
      limit: this.points,
      remaining: res.remainingPoints,
      resetSeconds: Math.max(1, Math.ceil(res.msBeforeNext / 1000)),
    };
  }
}
