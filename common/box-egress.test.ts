// The pattern rules must be gateway/policy's (a box entry the bridge accepts is one the gateway
// can use), and credentials are checked without a value ever reaching a message.
import { BridgeError } from './errors.js';
import {
  MAX_CREDENTIALS_BYTES,
  boxAllowOf,
  checkBoxAllow,
  checkCredentials,
  covers,
  credentialHostsOf,
  matchPattern,
  normalizeHost,
  outside,
  patternProblem,
  EGRESS_CREDENTIALS_KEY,
} from './box-egress.js';
import { ANNOTATIONS } from './labels.js';

const gateway = (allow: string[]) => ({ mode: 'gateway', domains: { allow } });

function errorOf(fn: () => unknown): BridgeError {
  try {
    fn();
  } catch (err) {
    if (err instanceof BridgeError) return err;
    throw err;
  }
  throw new Error('did not throw');
}

test('patterns match as the gateway matches them', () => {
  // Cases as gateway/policy's tests state them (policy_test.go).
  const cases: Array<[string, string, boolean]> = [
    ['example.com', 'example.com', true],
    ['Example.COM.', 'example.com', true],
    ['example.com', 'a.example.com', false],
    ['*.example.com', 'a.example.com', true],
    ['*.example.com', 'a.b.example.com', true],
    ['*.example.com', 'example.com', false],
    ['*.example.com', 'badexample.com', false],
    ['*', 'anything.test', true],
    ['*', '10.0.0.1', false],
    ['*.0.0.1', '10.0.0.1', false],
    ['10.0.0.1', '10.0.0.1', true],
    ['::ffff:10.0.0.1', '10.0.0.1', true],
  ];
  for (const [pattern, host, want] of cases) expect(`${pattern} ${host} ${matchPattern(pattern, normalizeHost(host)!)}`).toBe(`${pattern} ${host} ${want}`);
  expect(normalizeHost('2001:DB8:0::1')).toBe('2001:db8::1');
  expect(normalizeHost('a..b')).toBeUndefined();
  expect(normalizeHost('a b')).toBeUndefined();
  expect(normalizeHost(`${'a'.repeat(64)}.com`)).toBeUndefined();
});

test('pattern syntax: *, *.name, a name or an IP address', () => {
  for (const ok of ['*', '*.github.com', 'github.com', 'pypi.org.', '10.1.2.3', '::1', 'under_score.test']) expect(patternProblem(ok)).toBeUndefined();
  for (const bad of ['*.', 'a*.b', '*.*.b', 'git hub.com', '*.10.0.0.1', '', 'https://x.test', 'x.test:443']) expect(patternProblem(bad)).toBeDefined();
});

test('covers and outside: a box entry is within the pool when every host it matches the pool matches', () => {
  expect(covers('*', '*.a.test')).toBe(true);
  expect(covers('*.test', '*.a.test')).toBe(true);
  expect(covers('*.a.test', '*.test')).toBe(false);
  expect(covers('*.a.test', 'a.test')).toBe(false);
  expect(covers('*.a.test', 'x.a.test')).toBe(true);
  expect(covers('a.test', '*.a.test')).toBe(false);
  expect(covers('*', '*')).toBe(true);
  expect(covers('*.a.test', '*')).toBe(false);
  expect(covers('*', '10.0.0.1')).toBe(false);
  expect(outside(['api.github.com', 'github.com', 'evil.test', '*.pythonhosted.org'], ['*.github.com', '*.pythonhosted.org'])).toEqual(['github.com', 'evil.test']);
});

test('a box allow list outside its pool is a 400 naming the entries; in direct mode a 409', () => {
  const e = errorOf(() => checkBoxAllow(['api.github.com', 'evil.test', '*'], gateway(['*.github.com']), 'p1'));
  expect(e.status).toBe(400);
  expect(e.message).toContain('"evil.test", "*"');
  expect(e.message).not.toContain('api.github.com');
  expect(errorOf(() => checkBoxAllow(['x y'], gateway(['*']), 'p1')).status).toBe(400);
  expect(() => checkBoxAllow(['api.github.com'], gateway(['*.github.com']), 'p1')).not.toThrow();
  expect(() => checkBoxAllow([], gateway([]), 'p1')).not.toThrow(); // [] allows nothing: a valid narrowing
  expect(errorOf(() => checkBoxAllow(['a.test'], { mode: 'direct', domains: { allow: ['*'] } }, 'p1')).status).toBe(409);
});

test('credentials: hosts normalized, headers checked, no value in any message', () => {
  const SECRET = 'Bearer s3cr3t-value';
  expect(checkCredentials({ 'API.GitHub.com.': { Authorization: SECRET } })).toEqual({ 'api.github.com': { Authorization: SECRET } });
  const refused: Array<Record<string, Record<string, string>>> = [
    { '*.github.com': { Authorization: SECRET } }, // exact hosts only
    { 'a b': { Authorization: SECRET } },
    { 'a.test': {} },
    { 'a.test': { 'Bad Name': SECRET } },
    { 'a.test': { 'X-Ok:': SECRET } },
    { 'a.test': { Host: SECRET } },
    { 'a.test': { 'proxy-authorization': SECRET } },
    { 'a.test': { 'Proxy-Anything': SECRET } },
    { 'a.test': { Connection: SECRET } },
    { 'a.test': { 'Transfer-Encoding': SECRET } },
    { 'a.test': { TE: SECRET } },
    { 'a.test': { Authorization: `${SECRET}\r\nX-Injected: 1` } },
    { 'a.test': { Authorization: `${SECRET}\u00e9` } },
    { 'a.test': { Authorization: '' } },
    { 'a.test': { Authorization: SECRET, authorization: SECRET } },
    { 'a.test': { Authorization: SECRET }, 'A.TEST': { Authorization: SECRET } },
    { 'a.test': { Authorization: 'x'.repeat(8 * 1024 + 1) } },
  ];
  for (const body of refused) {
    const e = errorOf(() => checkCredentials(body));
    expect(e.status).toBe(400);
    expect(e.message).not.toContain('s3cr3t');
  }
  const many = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`h${i}.test`, { Authorization: SECRET }]));
  expect(errorOf(() => checkCredentials(many)).status).toBe(400);
  const big = Object.fromEntries(Array.from({ length: 10 }, (_, i) => [`h${i}.test`, { Authorization: `${SECRET}${'x'.repeat(8000)}` }]));
  const e = errorOf(() => checkCredentials(big));
  expect(e.status).toBe(413);
  expect(e.message).toContain(String(MAX_CREDENTIALS_BYTES));
});

test('the record: the allow annotation and the credential hosts', () => {
  expect(boxAllowOf({ metadata: {} })).toBeNull();
  expect(boxAllowOf({ metadata: { annotations: { [ANNOTATIONS.egress]: '{"allow":["a.test"]}' } } })).toEqual(['a.test']);
  expect(boxAllowOf({ metadata: { annotations: { [ANNOTATIONS.egress]: '{}' } } })).toBeNull();
  // Unreadable: nothing allowed, never the pool's whole list.
  expect(boxAllowOf({ metadata: { annotations: { [ANNOTATIONS.egress]: '{' } } })).toEqual([]);
  expect(boxAllowOf({ metadata: { annotations: { [ANNOTATIONS.egress]: '{"allow":"a.test"}' } } })).toEqual([]);
  const data = { [EGRESS_CREDENTIALS_KEY]: Buffer.from(JSON.stringify({ 'b.test': { A: 'v' }, 'a.test': { A: 'v' } })).toString('base64') };
  expect(credentialHostsOf({ data })).toEqual(['a.test', 'b.test']);
  expect(credentialHostsOf({})).toEqual([]);
});
