// The bearer tokens the bridge accepts: named, each with scopes. Sources, all optional but at
// least one token in total:
//   BRIDGE_TOKEN         one token in the environment          -> name "default", scope admin
//   BRIDGE_TOKEN_FILE    a file holding one token (a Secret key) -> name "default", scope admin
//   BRIDGE_TOKENS_FILE   a JSON list [{name, token | sha256, scopes}] (a Secret key)
// Files are re-read when they change (a mounted Secret is updated in place), so rotation is: add
// the new token, move clients to it, remove the old one; both are accepted in between. A file that
// does not exist contributes no token (a Secret may hold either key); a change that would leave
// the bridge with no valid token, or an invalid file, is refused and the previous tokens stay.
// Tokens are looked up by their SHA-256 digest; only names ever reach logs and metrics.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { Logger } from 'pino';
import { z } from 'zod';
import { describeIssues } from '../schemas.js';

export const SCOPES = ['boxes:read', 'boxes:contents', 'boxes:write', 'cluster:read', 'sandboxes:read', 'admin'] as const;
export type Scope = (typeof SCOPES)[number];

/** The name of the token from BRIDGE_TOKEN or BRIDGE_TOKEN_FILE. */
export const SINGLE_TOKEN_NAME = 'default';
const MIN_TOKEN_LENGTH = 16;

export interface Token {
  /** Label-safe: it appears in logs and as a metric label. */
  readonly name: string;
  readonly scopes: ReadonlySet<Scope>;
}

/**
 * admin implies every scope, and boxes:write implies boxes:contents: a token that may run
 * commands in a box can read any of its files anyway (docs/tokens.md).
 */
export function hasScope(token: Token, scope: Scope): boolean {
  return token.scopes.has('admin') || token.scopes.has(scope) || (scope === 'boxes:contents' && token.scopes.has('boxes:write'));
}

const TokenEntry = z
  .object({
    name: z.string().regex(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, 'must be a lower-case DNS label (it becomes a metric label)'),
    token: z.string().min(MIN_TOKEN_LENGTH, `must be at least ${MIN_TOKEN_LENGTH} characters`).optional(),
    sha256: z
      .string()
      .regex(/^[0-9a-f]{64}$/, 'must be 64 lower-case hex digits (sha256sum of the token)')
      .optional()
      .describe('The hex SHA-256 of the token, instead of the token itself'),
    scopes: z.array(z.enum(SCOPES)).min(1, 'needs at least one scope'),
  })
  .strict()
  .refine((e) => (e.token === undefined) !== (e.sha256 === undefined), 'give exactly one of token and sha256');

export const TokensFile = z.array(TokenEntry);
export type TokenEntry = z.infer<typeof TokenEntry>;

const digest = (value: string) => createHash('sha256').update(value, 'utf8').digest('hex');

/**
 * The accepted tokens, by digest. A presented value that was a token is remembered as it is, so
 * a client's next request costs a map lookup instead of a SHA-256 (4% of an exec's CPU under
 * load, bench/results/exec-profile.md). Only accepted values are kept: at most one per token
 * (no two values share a digest), so nothing a caller sends can grow it. A reload makes a new
 * set, so a removed token is forgotten with its set.
 */
export class TokenSet {
  private readonly accepted = new Map<string, Token>();

  private constructor(private readonly byDigest: ReadonlyMap<string, Token>) {}

  /** Throws an Error naming every problem (duplicate names or tokens, bad fields). */
  static from(entries: Array<{ entry: TokenEntry; from: string }>): TokenSet {
    const byDigest = new Map<string, Token>();
    const names = new Map<string, string>();
    const problems: string[] = [];
    for (const { entry, from } of entries) {
      const key = entry.sha256 ?? digest(entry.token!);
      const earlier = names.get(entry.name);
      if (earlier !== undefined) problems.push(`token name "${entry.name}" appears twice (${earlier} and ${from})`);
      else if (byDigest.has(key)) problems.push(`token "${entry.name}" (${from}) is the same token as "${byDigest.get(key)!.name}"`);
      names.set(entry.name, from);
      byDigest.set(key, { name: entry.name, scopes: new Set(entry.scopes) });
    }
    if (problems.length) throw new Error(problems.join('; '));
    return new TokenSet(byDigest);
  }

  identify(presented: string): Token | undefined {
    const known = this.accepted.get(presented);
    if (known) return known;
    const token = this.byDigest.get(digest(presented));
    if (token && this.accepted.size < this.byDigest.size) this.accepted.set(presented, token);
    return token;
  }

  names(): string[] {
    return [...this.byDigest.values()].map((t) => t.name).sort();
  }

  get size(): number {
    return this.byDigest.size;
  }
}

export interface TokenSource {
  /** The token a presented bearer value is, if any. */
  identify(presented: string): Token | undefined;
  /** Names of the accepted tokens (for logs and the token-info metric). */
  names(): string[];
  close(): void;
}

export interface TokenSourceOptions {
  token?: string | undefined;
  tokenFile?: string | undefined;
  tokensFile?: string | undefined;
  log: Logger;
  /** How often mounted files are checked for changes (Secret volumes swap a symlink). */
  intervalMs?: number;
}

/** Parses a tokens file's text; throws an Error saying what is wrong and where. */
export function parseTokensFile(text: string, path: string): TokenEntry[] {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new Error(`${path} is not valid JSON (${(err as Error).message})`, { cause: err });
  }
  const parsed = TokensFile.safeParse(json);
  if (!parsed.success) throw new Error(`${path}: ${describeIssues(parsed.error).replaceAll('body', 'list')}`);
  return parsed.data;
}

function readIfPresent(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new Error(`cannot read ${path} (${(err as Error).message})`, { cause: err });
  }
}

function singleToken(value: string, from: string): { entry: TokenEntry; from: string } {
  const token = value.trim();
  if (token.length < MIN_TOKEN_LENGTH) throw new Error(`the token in ${from} is shorter than ${MIN_TOKEN_LENGTH} characters`);
  return { entry: { name: SINGLE_TOKEN_NAME, token, scopes: ['admin'] }, from };
}

/** Reads every configured source once; throws when a source is invalid or there is no token at all. */
function load(o: TokenSourceOptions): TokenSet {
  const entries: Array<{ entry: TokenEntry; from: string }> = [];
  if (o.token !== undefined) entries.push(singleToken(o.token, 'BRIDGE_TOKEN'));
  if (o.tokenFile) {
    const text = readIfPresent(o.tokenFile);
    if (text !== undefined) entries.push(singleToken(text, o.tokenFile));
  }
  if (o.tokensFile) {
    const text = readIfPresent(o.tokensFile);
    if (text !== undefined) for (const entry of parseTokensFile(text, o.tokensFile)) entries.push({ entry, from: o.tokensFile });
  }
  const set = TokenSet.from(entries);
  if (set.size === 0) {
    const looked = [o.tokenFile, o.tokensFile].filter(Boolean).join(' and ');
    throw new Error(`no bearer token configured: ${looked ? `${looked} do(es) not exist or hold no token` : 'set BRIDGE_TOKEN, BRIDGE_TOKEN_FILE or BRIDGE_TOKENS_FILE'}`);
  }
  return set;
}

/** Loads the tokens (throwing at start-up when there are none) and follows file changes. */
export function createTokenSource(o: TokenSourceOptions): TokenSource {
  let current = load(o);
  const files = [o.tokenFile, o.tokensFile].filter((f): f is string => Boolean(f));
  // The files' texts as last read: a change is a different text, whatever the kubelet did to the
  // inode (Secret volumes swap a symlink). Polling the texts, rather than fs.watchFile's stat
  // baseline, also sees a file created before the watcher took its first stat.
  const texts = () => JSON.stringify(files.map((f) => readIfPresentOrError(f)));
  let seen = texts();
  const check = () => {
    const now = texts();
    if (now === seen) return;
    seen = now;
    try {
      const next = load(o);
      const before = current.names();
      current = next;
      o.log.info({ tokenNames: next.names(), previousTokenNames: before }, 'bearer tokens reloaded');
    } catch (err) {
      // Keep serving with the previous tokens rather than locking every client out.
      o.log.error({ err: (err as Error).message, tokenNames: current.names() }, 'could not reload the bearer tokens; keeping the previous ones');
    }
  };
  const timer = files.length ? setInterval(check, o.intervalMs ?? 2000) : undefined;
  timer?.unref();
  return {
    identify: (presented) => current.identify(presented),
    names: () => current.names(),
    close: () => clearInterval(timer),
  };
}

/** A file's text, undefined when absent, or the error reading it (compared, never thrown here). */
function readIfPresentOrError(path: string): string | undefined {
  try {
    return readIfPresent(path);
  } catch (err) {
    return `error: ${(err as Error).message}`;
  }
}
