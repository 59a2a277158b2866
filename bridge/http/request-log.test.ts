// The request log: ids, the completion line only at an enabled level, req.log bound to the
// request and its token name, and never the bearer token.
import { Writable } from 'node:stream';
import express from 'express';
import { pino, type Logger } from 'pino';
import request from 'supertest';
import { BridgeError } from '../../common/errors.js';
import { errorHandler } from './errors.js';
import { requestLog } from './request-log.js';

const SECRET = 'bearer-secret-123';

function logged(level: string): { log: Logger; lines: () => Array<Record<string, unknown>> } {
  const out: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _e, done) {
      out.push(chunk.toString());
      done();
    },
  });
  const log = pino({ level }, sink);
  return { log, lines: () => out.join('').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>) };
}

function app(log: Logger) {
  const a = express();
  a.use(requestLog(a, log));
  a.use((req, res, next) => {
    if (req.headers.authorization === `Bearer ${SECRET}`) res.locals.token = { name: 'agents', scopes: new Set() };
    next();
  });
  a.get('/ok', (req, res) => {
    req.log.info({ step: 'inside' }, 'handler ran');
    res.json({ id: req.id });
  });
  a.get('/missing', (_req, _res, next) => next(new BridgeError('not_found', 'no such box')));
  a.get('/broken', () => {
    throw new Error('boom');
  });
  a.use(errorHandler);
  return a;
}

test('a sane X-Request-Id is kept, anything else replaced; the answer names it', async () => {
  const { log } = logged('warn');
  const kept = await request(app(log)).get('/ok').set('x-request-id', 'call-7.a_b');
  expect(kept.headers['x-request-id']).toBe('call-7.a_b');
  expect(kept.body).toEqual({ id: 'call-7.a_b' });
  const replaced = await request(app(log)).get('/ok').set('x-request-id', 'bad id\twith spaces');
  expect(replaced.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
});

test('at debug: a completion line per request, with the request, token name, status and time', async () => {
  const { log, lines } = logged('debug');
  await request(app(log)).get('/ok?x=1').set('authorization', `Bearer ${SECRET}`).set('x-request-id', 'r1');
  const done = lines().find((l) => l.msg === 'request completed')!;
  expect(done).toMatchObject({ level: 20, req: { id: 'r1', method: 'GET', url: '/ok?x=1' }, tokenName: 'agents', res: { statusCode: 200 } });
  expect(typeof done.responseTime).toBe('number');
  // The handler's own line is bound to the request and its token.
  expect(lines().find((l) => l.msg === 'handler ran')).toMatchObject({ req: { id: 'r1' }, tokenName: 'agents', step: 'inside' });
  expect(JSON.stringify(lines())).not.toContain(SECRET);
});

test('at warn: nothing for 2xx and 4xx, a request errored line for 5xx', async () => {
  const { log, lines } = logged('warn');
  await request(app(log)).get('/ok');
  await request(app(log)).get('/missing');
  expect(lines()).toEqual([]);
  await request(app(log)).get('/broken').set('x-request-id', 'r5');
  const errored = lines().filter((l) => l.msg === 'request errored');
  expect(errored).toHaveLength(1);
  expect(errored[0]).toMatchObject({ level: 50, req: { id: 'r5', url: '/broken' }, res: { statusCode: 500 }, err: { message: 'failed with status code 500' } });
});

test('at info: 4xx completion lines', async () => {
  const { log, lines } = logged('info');
  await request(app(log)).get('/missing').set('x-request-id', 'r4');
  expect(lines().find((l) => l.msg === 'request completed')).toMatchObject({ level: 30, req: { id: 'r4' }, res: { statusCode: 404 } });
});
