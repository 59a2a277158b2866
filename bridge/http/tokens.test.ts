import { createHash } from 'node:crypto';
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { SINGLE_TOKEN_NAME, TokenSet, createTokenSource, hasScope, parseTokensFile } from './tokens.js';

const log = pino({ level: 'silent' });
const A = 'token-a-0123456789abcdef';
const B = 'token-b-0123456789abcdef';
let dir: string;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'tokens-'));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

/** Replaces a file the way the kubelet updates a Secret volume: a new file renamed over the old. */
function write(name: string, content: string): string {
  const path = join(dir, name);
  writeFileSync(`${path}.tmp`, content);
  renameSync(`${path}.tmp`, path);
  return path;
}

async function until(check: () => boolean, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}

test('the single-token configuration still works: that token is "default" with admin', () => {
  const source = createTokenSource({ token: A, log });
  const token = source.identify(A)!;
  expect(token.name).toBe(SINGLE_TOKEN_NAME);
  expect(hasScope(token, 'boxes:write')).toBe(true);
  expect(source.identify(B)).toBeUndefined();
  expect(source.identify('')).toBeUndefined();
  source.close();
});

test('a tokens file: names, scopes, a token given by its SHA-256 only', () => {
  const sha = createHash('sha256').update(B).digest('hex');
  const path = write(
    'tokens.json',
    JSON.stringify([
      { name: 'agents', token: A, scopes: ['boxes:read', 'boxes:write'] },
      { name: 'grafana', sha256: sha, scopes: ['cluster:read'] },
    ]),
  );
  const source = createTokenSource({ tokensFile: path, log });
  expect(source.names()).toEqual(['agents', 'grafana']);
  const agents = source.identify(A)!;
  expect([hasScope(agents, 'boxes:write'), hasScope(agents, 'cluster:read')]).toEqual([true, false]);
  expect(source.identify(B)?.name).toBe('grafana');
  source.close();
});

test('invalid tokens files are refused with every problem named', () => {
  expect(() => parseTokensFile('{', 'f')).toThrow(/f is not valid JSON/);
  expect(() => parseTokensFile(JSON.stringify([{ name: 'Bad_Name', token: 'short', scopes: ['root'] }]), 'f')).toThrow(
    /0\.name: must be a lower-case DNS label.*0\.token: must be at least 16 characters.*0\.scopes\.0/,
  );
  expect(() => parseTokensFile(JSON.stringify([{ name: 'x', scopes: ['admin'] }]), 'f')).toThrow(/exactly one of token and sha256/);
  expect(() => parseTokensFile(JSON.stringify([{ name: 'x', token: A, scopes: [] }]), 'f')).toThrow(/at least one scope/);
  const entry = (name: string, token: string) => ({ entry: { name, token, scopes: ['admin' as const] }, from: 'f' });
  expect(() => TokenSet.from([entry('a', A), entry('a', B)])).toThrow(/token name "a" appears twice/);
  expect(() => TokenSet.from([entry('a', A), entry('b', A)])).toThrow(/"b" \(f\) is the same token as "a"/);
});

test('no token at all stops the start-up, naming where it looked', () => {
  expect(() => createTokenSource({ tokenFile: join(dir, 'token'), tokensFile: join(dir, 'tokens.json'), log })).toThrow(
    /no bearer token configured: .*token and .*tokens\.json do\(es\) not exist/,
  );
});

test('rotation: add the new token, both work, remove the old one; never a moment without a token', async () => {
  const tokenFile = write('token', A); // the old single token
  const tokensFile = join(dir, 'tokens.json'); // not there yet
  const source = createTokenSource({ tokenFile, tokensFile, log, intervalMs: 20 });
  expect(source.names()).toEqual(['default']);

  write('tokens.json', JSON.stringify([{ name: 'agents-2', token: B, scopes: ['boxes:read', 'boxes:write'] }]));
  await until(() => source.identify(B) !== undefined);
  expect(source.identify(A)?.name).toBe('default');

  rmSync(tokenFile);
  await until(() => source.identify(A) === undefined);
  expect(source.names()).toEqual(['agents-2']);

  // A broken file or an empty set is refused: the previous tokens stay.
  write('tokens.json', '[{"name": "x"');
  await new Promise((r) => setTimeout(r, 200));
  expect(source.identify(B)?.name).toBe('agents-2');
  rmSync(tokensFile);
  await new Promise((r) => setTimeout(r, 200));
  expect(source.identify(B)?.name).toBe('agents-2');
  source.close();
});
