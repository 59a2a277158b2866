// 429 with Retry-After and RateLimit-* headers once a client exceeds its token bucket.
import type { RequestHandler } from 'express';
import { BridgeError } from '../../common/errors.js';
import type { TokenBuckets } from './token-bucket.js';

export function rateLimit(buckets: TokenBuckets, onLimited?: () => void): RequestHandler {
  return (req, res, next) => {
    const result = buckets.take(req.ip ?? 'unknown');
    res.setHeader('RateLimit-Limit', String(buckets.ratePerSecond));
    res.setHeader('RateLimit-Remaining', String(result.remaining));
    if (result.allowed) return next();
    onLimited?.();
    res.setHeader('RateLimit-Reset', String(result.retryAfterSeconds));
    next(
      new BridgeError('rate_limited', `too many requests: the limit is ${buckets.ratePerSecond}/s with bursts of ${buckets.burst}`, {
        headers: { 'Retry-After': String(result.retryAfterSeconds) },
      }),
    );
  };
}
