import express from 'express';
import { pino } from 'pino';
import request from 'supertest';
import { KeyedLimiter } from '../../common/rate-limit.js';
import { authenticate, rateLimitByToken, sourceKey } from './auth.js';
import { errorHandler } from './errors.js';
import { requireScope, requiredScope } from './scopes.js';
import { createTokenSource, hasScope, type Scope } from './tokens.js';

const READER = 'reader-token-0123456789';
const WRITER = 'writer-token-0123456789';

function app(o: { requests?: KeyedLimiter; failures?: KeyedLimiter } = {}) {
  const tokens = createTokenSource({
    token: 'admin-token-0123456789',
    log: pino({ level: 'silent' }),
  });
  // The tokens file format, without a file: identify() is all the middleware uses.
  const scoped = new Map([
    [READER, { name: 'reader', scopes: new Set(['boxes:read', 'sandboxes:read'] as const) }],
    [WRITER, { name: 'writer', scopes: new Set(['boxes:write'] as const) }],
  ]);
  const source = { ...tokens, identify: (t: string) => scoped.get(t) ?? tokens.identify(t) };
  const a = express();
  a.set('trust proxy', true);
  const api = express.Router();
  api.use(authenticate({ tokens: source, failures: o.failures ?? new KeyedLimiter(3, 60) }));
  api.use(rateLimitByToken(o.requests ?? new KeyedLimiter(1000, 1)));
  api.use(requireScope());
  api.all('/{*rest}', (_req, res) => {
    res.json({ ok: true });
  });
  a.use('/api/v1', api);
  a.use(errorHandler);
  return a;
}

test('missing and wrong tokens are 401; failed attempts from one source are then 429, a valid token from it is not', async () => {
  const a = app();
  const from = (ip: string) => ({ 'x-forwarded-for': ip });
  expect((await request(a).get('/api/v1/health').set(from('10.0.0.1'))).status).toBe(401);
  for (let i = 0; i < 2; i++) {
    const res = await request(a).get('/api/v1/health').set(from('10.0.0.1')).set('authorization', 'Bearer wrong-token-xxxxxxxx');
    expect(res.status).toBe(401);
    expect(res.headers['www-authenticate']).toContain('Bearer');
  }
  const limited = await request(a).get('/api/v1/health').set(from('10.0.0.1')).set('authorization', 'Bearer wrong');
  expect(limited.status).toBe(429);
  expect(limited.body.error.type).toBe('rate_limited');
  expect(Number(limited.headers['retry-after'])).toBeGreaterThan(0);
  expect(limited.headers['ratelimit-remaining']).toBe('0');
  // The real client behind the same address is unaffected; another address still gets 401.
  expect((await request(a).get('/api/v1/health').set(from('10.0.0.1')).set('authorization', `Bearer ${READER}`)).status).toBe(200);
  expect((await request(a).get('/api/v1/health').set(from('10.0.0.2'))).status).toBe(401);
});

test('the request rate is per token name, with RateLimit-* headers', async () => {
  const a = app({ requests: new KeyedLimiter(2, 30) });
  const get = (token: string) => request(a).get('/api/v1/health').set('authorization', `Bearer ${token}`);
  const first = await get(READER);
  expect(first.headers).toMatchObject({ 'ratelimit-limit': '2', 'ratelimit-remaining': '1', 'ratelimit-policy': '2;w=30' });
  await get(READER);
  const limited = await get(READER);
  expect(limited.status).toBe(429);
  expect(limited.body.error.message).toContain('token "reader" is over its request rate');
  expect(Number(limited.headers['retry-after'])).toBeGreaterThan(0);
  expect(Number(limited.headers['ratelimit-reset'])).toBeGreaterThan(0);
  expect((await get(WRITER)).status).toBe(200);
});

test('403 forbidden names the missing scope; admin passes everything', async () => {
  const a = app();
  const res = await request(a).post('/api/v1/boxes').set('authorization', `Bearer ${READER}`).send({});
  expect(res.status).toBe(403);
  expect(res.body.error).toEqual({
    type: 'forbidden',
    message: expect.stringContaining('token "reader" lacks the scope boxes:write, which POST /api/v1/boxes needs'),
  });
  expect((await request(a).get('/api/v1/boxes/b1/status').set('authorization', `Bearer ${READER}`)).status).toBe(200);
  expect((await request(a).get('/api/v1/boxes/b1/status').set('authorization', `Bearer ${WRITER}`)).status).toBe(403);
  expect((await request(a).get('/api/v1/cluster/capacity').set('authorization', `Bearer ${READER}`)).body.error.message).toContain('cluster:read');
  expect((await request(a).get('/api/v1/cluster/capacity').set('authorization', 'Bearer admin-token-0123456789')).status).toBe(200);
});

test('the scope table', () => {
  expect(requiredScope('GET', '/health')).toBeUndefined();
  expect(requiredScope('GET', '/openapi.json')).toBeUndefined();
  // Contents (what is inside a box) need boxes:contents; facts about it boxes:read.
  for (const path of ['/boxes/b/files', '/boxes/b/files/list', '/boxes/b/files/watch', '/boxes/{id}/files/watch', '/boxes/b/archive', '/boxes/b/processes/p1/output', '/boxes/{id}/files', '/boxes/{id}/processes/{pid}/output']) {
    expect([path, requiredScope('GET', path)]).toEqual([path, 'boxes:contents']);
  }
  for (const path of ['/boxes/b/status', '/boxes/b/processes', '/boxes/b/processes/p1', '/boxes/b/metrics', '/snapshots/s1']) {
    expect([path, requiredScope('GET', path)]).toEqual([path, 'boxes:read']);
  }
  expect(requiredScope('PUT', '/boxes/b/files')).toBe('boxes:write');
  expect(requiredScope('GET', '/boxes/b/pty')).toBe('boxes:write');
  expect(requiredScope('DELETE', '/boxes/b')).toBe('boxes:write');
  expect(requiredScope('GET', '/snapshots')).toBe('boxes:read');
  expect(requiredScope('GET', '/cluster/nodes')).toBe('cluster:read');
  expect(requiredScope('GET', '/sandboxes/metrics')).toBe('sandboxes:read');
  expect(requiredScope('GET', '/sandboxes/x/logs')).toBe('sandboxes:read');
  expect(requiredScope('GET', '/something-new')).toBe('admin');
});

test('boxes:write implies boxes:contents (it can run cat); nothing else implies anything but admin', () => {
  const token = (...scopes: Scope[]) => ({ name: 't', scopes: new Set(scopes) });
  expect(hasScope(token('boxes:write'), 'boxes:contents')).toBe(true);
  expect(hasScope(token('boxes:read'), 'boxes:contents')).toBe(false);
  expect(hasScope(token('boxes:contents'), 'boxes:write')).toBe(false);
  expect(hasScope(token('boxes:contents'), 'boxes:read')).toBe(false);
  expect(hasScope(token('admin'), 'boxes:contents')).toBe(true);
});

test('failed attempts count per IPv4 address, and per /64 for IPv6', () => {
  expect(sourceKey({ ip: '10.1.2.3' })).toBe('10.1.2.3');
  expect(sourceKey({ ip: '::ffff:10.1.2.3' })).toBe('::ffff:10.1.2.3');
  expect(sourceKey({ ip: '2001:db8:1:2:3:4:5:6' })).toBe('2001:db8:1:2::/64');
  expect(sourceKey({ ip: '2001:DB8::1' })).toBe('2001:db8:0:0::/64');
  expect(sourceKey({ ip: '::1' })).toBe('0:0:0:0::/64');
});
