// Bearer-token authentication. The token comes from BRIDGE_TOKEN or from a file (a mounted
// Secret) that is re-read when it changes, so rotating the Secret needs no restart.
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync, unwatchFile, watchFile } from 'node:fs';
import type { RequestHandler } from 'express';
import type { Logger } from 'pino';
import { BridgeError } from '../../common/errors.js';

export interface TokenSource {
  /** Constant-time check of a presented token. */
  matches(presented: string): boolean;
  close(): void;
}

const digest = (value: string) => createHash('sha256').update(value, 'utf8').digest();

/** Compares SHA-256 digests, so neither the length nor the content leaks through timing. */
function makeMatcher(expected: string) {
  const want = digest(expected);
  return (presented: string) => timingSafeEqual(digest(presented), want);
}

export function staticToken(token: string): TokenSource {
  const matches = makeMatcher(token);
  return { matches, close: () => undefined };
}

/** Reads the token from `path` now and whenever the file changes (polled: Secret volumes swap symlinks). */
export function fileToken(path: string, log: Logger, intervalMs = 2000): TokenSource {
  const read = () => {
    const token = readFileSync(path, 'utf8').trim();
    if (token.length < 16) throw new Error(`token in ${path} is shorter than 16 characters`);
    return token;
  };
  let matches = makeMatcher(read());
  const onChange = () => {
    try {
      matches = makeMatcher(read());
      log.info({ file: path }, 'bearer token reloaded');
    } catch (err) {
      // Keep serving with the previous token rather than locking every client out.
      log.error({ file: path, err: (err as Error).message }, 'could not reload the bearer token; keeping the previous one');
    }
  };
  watchFile(path, { interval: intervalMs }, onChange);
  return {
    matches: (presented) => matches(presented),
    close: () => unwatchFile(path, onChange),
  };
}

export function requireBearer(tokens: TokenSource): RequestHandler {
  return (req, res, next) => {
    const header = req.headers.authorization ?? '';
    const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
    if (!match || !tokens.matches(match[1]!)) {
      res.setHeader('WWW-Authenticate', 'Bearer realm="sandbox-bridge"');
      next(new BridgeError('unauthorized', match ? 'invalid bearer token' : 'missing bearer token (Authorization: Bearer <token>)'));
      return;
    }
    next();
  };
}
