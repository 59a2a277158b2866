// Bearer-token authentication, then the request-rate limit of the token it found. A request
// without a valid token counts against a smaller limit of failed attempts per source address,
// so a flood of bad tokens is answered cheaply and never uses up a real client's limit.
import type { Request, RequestHandler, Response } from 'express';
import { BridgeError } from '../../common/errors.js';
import type { KeyedLimiter, LimitResult } from '../../common/rate-limit.js';
import { hasScope, type Scope, type Token, type TokenSource } from './tokens.js';

const BEARER = /^Bearer\s+(\S+)\s*$/i;

export interface AuthOptions {
  tokens: TokenSource;
  /** Failed authentications per source address. */
  failures: KeyedLimiter;
  onFailure?: (reason: 'missing' | 'invalid') => void;
  onLimited?: () => void;
}

/** The token of an authenticated request (set by authenticate()). */
export function requestToken(res: Response): Token | undefined {
  return res.locals.token as Token | undefined;
}

export function authenticate(o: AuthOptions): RequestHandler {
  return async (req, res, next) => {
    const match = BEARER.exec(req.headers.authorization ?? '');
    const token = match ? o.tokens.identify(match[1]!) : undefined;
    if (token) {
      // The request's logger names the token from here on (http/request-log.ts).
      res.locals.token = token;
      return next();
    }
    o.onFailure?.(match ? 'invalid' : 'missing');
    const limit = await o.failures.take(sourceKey(req));
    if (!limit.allowed) {
      o.onLimited?.();
      return next(limited(res, limit, 'too many requests without a valid bearer token from this address'));
    }
    res.setHeader('WWW-Authenticate', 'Bearer realm="sandbox-bridge"');
    next(new BridgeError('unauthorized', match ? 'invalid bearer token' : 'missing bearer token (Authorization: Bearer <token>)'));
  };
}

/**
 * The checks of authenticate(), rateLimitByToken() and the route's scope, for a request Express
 * never sees (a WebSocket upgrade): resolves with the token, or rejects with the error to answer.
 */
export async function admitUpgrade(
  o: AuthOptions & { requests: KeyedLimiter; scope: Scope; what?: string },
  source: Pick<Request, 'ip'>,
  presented: string | undefined,
): Promise<Token> {
  const token = presented ? o.tokens.identify(presented) : undefined;
  if (!token) {
    o.onFailure?.(presented ? 'invalid' : 'missing');
    const limit = await o.failures.take(sourceKey(source));
    if (!limit.allowed) {
      o.onLimited?.();
      throw new BridgeError('rate_limited', 'too many requests without a valid bearer token from this address', {
        headers: { 'Retry-After': String(limit.resetSeconds) },
      });
    }
    throw new BridgeError('unauthorized', presented ? 'invalid bearer token' : 'missing bearer token (Authorization: Bearer <token>)');
  }
  const limit = await o.requests.take(token.name);
  if (!limit.allowed) throw new BridgeError('rate_limited', `token "${token.name}" is over its request rate`, { headers: { 'Retry-After': String(limit.resetSeconds) } });
  if (!hasScope(token, o.scope)) throw new BridgeError('forbidden', `token "${token.name}" lacks the scope ${o.scope}, which ${o.what ?? 'a terminal'} needs`);
  return token;
}

/** The request-rate limit per token name (after authenticate()). */
export function rateLimitByToken(limiter: KeyedLimiter, onLimited?: () => void): RequestHandler {
  return async (_req, res, next) => {
    const token = requestToken(res);
    if (!token) return next(new BridgeError('unauthorized', 'not authenticated'));
    const limit = await limiter.take(token.name);
    setLimitHeaders(res, limit, limiter.windowSeconds);
    if (limit.allowed) return next();
    onLimited?.();
    next(limited(res, limit, `token "${token.name}" is over its request rate (${limit.limit} per ${limiter.windowSeconds} s, per bridge replica)`));
  };
}

function setLimitHeaders(res: Response, limit: LimitResult, windowSeconds: number): void {
  res.setHeader('RateLimit-Policy', `${limit.limit};w=${Math.ceil(windowSeconds)}`);
  res.setHeader('RateLimit-Limit', String(limit.limit));
  res.setHeader('RateLimit-Remaining', String(limit.remaining));
  res.setHeader('RateLimit-Reset', String(limit.resetSeconds));
}

function limited(res: Response, limit: LimitResult, message: string): BridgeError {
  if (!res.hasHeader('RateLimit-Limit')) {
    res.setHeader('RateLimit-Limit', String(limit.limit));
    res.setHeader('RateLimit-Remaining', '0');
    res.setHeader('RateLimit-Reset', String(limit.resetSeconds));
  }
  return new BridgeError('rate_limited', `${message}; retry in ${limit.resetSeconds} s`, { headers: { 'Retry-After': String(limit.resetSeconds) } });
}

/**
 * The source a failed attempt is counted against: the client address (behind a proxy, the one
 * TRUST_PROXY lets Express take from X-Forwarded-For); IPv6 by its /64, which one host can fill.
 */
export function sourceKey(req: Pick<Request, 'ip'>): string {
  const ip = req.ip ?? 'unknown';
  if (!ip.includes(':') || ip.startsWith('::ffff:')) return ip;
  const [head = '', tail] = ip.split('::');
  const front = head ? head.split(':') : [];
  const back = tail ? tail.split(':') : [];
  const groups = tail === undefined ? front : [...front, ...Array<string>(Math.max(0, 8 - front.length - back.length)).fill('0'), ...back];
  return `${groups.slice(0, 4).map((g) => g.toLowerCase()).join(':')}::/64`;
}
