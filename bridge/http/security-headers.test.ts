// The headers worked out once are exactly the ones helmet() sets on each response.
import express, { type RequestHandler } from 'express';
import helmet from 'helmet';
import request from 'supertest';
import { securityHeaders } from './security-headers.js';

async function headersOf(mw: RequestHandler): Promise<Record<string, string>> {
  const a = express();
  a.disable('x-powered-by');
  a.use(mw);
  a.get('/', (_req, res) => res.json({}));
  const res = await request(a).get('/');
  const { date: _date, etag: _etag, ...rest } = res.headers as Record<string, string>;
  return rest;
}

test('responses carry the headers helmet() would set, with the same values', async () => {
  const want = await headersOf(helmet());
  expect(Object.keys(want)).toEqual(expect.arrayContaining(['content-security-policy', 'strict-transport-security', 'x-content-type-options']));
  expect(await headersOf(securityHeaders())).toEqual(want);
});
