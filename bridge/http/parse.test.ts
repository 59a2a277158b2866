// jsonBody answers every body as express.json({ limit, strict: true }) does (status and error
// body through the API's error handler), whichever path it takes.
import { once } from 'node:events';
import http from 'node:http';
import { gzipSync } from 'node:zlib';
import express, { type RequestHandler } from 'express';
import request from 'supertest';
import { errorHandler } from './errors.js';
import { jsonBody } from './parse.js';

const LIMIT = 1024;

function app(parser: RequestHandler) {
  const a = express();
  a.post('/', parser, (req, res) => {
    res.json({ body: req.body === undefined ? 'undefined' : req.body });
  });
  a.use(errorHandler);
  return a;
}

const cases: Array<[string, (r: request.Test) => request.Test]> = [
  ['an object', (r) => r.set('content-type', 'application/json').send('{"command":"echo hi","env":{"A":"1"}}')],
  ['an array with spaces before it', (r) => r.set('content-type', 'application/json; charset=utf-8').send(' \n\t[1,2]')],
  ['an empty body', (r) => r.set('content-type', 'application/json').set('content-length', '0').send('')],
  ['a JSON string (strict)', (r) => r.set('content-type', 'application/json').send('"text"')],
  ['a literal (strict)', (r) => r.set('content-type', 'application/json').send('true')],
  ['broken JSON', (r) => r.set('content-type', 'application/json').send('{"command":')],
  ['UTF-8 text', (r) => r.set('content-type', 'application/json').send(Buffer.from('{"command":"echo héllo 🎉"}'))],
  ['a byte order mark', (r) => r.set('content-type', 'application/json').send(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{"a":1}')]))],
  ['over the limit', (r) => r.set('content-type', 'application/json').send(`{"a":"${'x'.repeat(LIMIT)}"}`)],
  ['exactly the limit', (r) => r.set('content-type', 'application/json').send(`{"a":"${'x'.repeat(LIMIT - 8)}"}`)],
  ['another type', (r) => r.set('content-type', 'text/plain').send('{"a":1}')],
  ['another charset', (r) => r.set('content-type', 'application/json; charset=latin1').send('{"a":1}')],
  ['gzip', (r) => r.set('content-type', 'application/json').set('content-encoding', 'gzip').send(gzipSync('{"a":1}'))],
  ['application/json with another parameter', (r) => r.set('content-type', 'application/json; foo=bar').send('{"a":1}')],
];

test.each(cases)('%s: the same answer as express.json', async (_name, send) => {
  const want = await send(request(app(express.json({ limit: LIMIT, strict: true }))).post('/'));
  const got = await send(request(app(jsonBody(LIMIT))).post('/'));
  expect({ status: got.status, body: got.body as unknown }).toEqual({ status: want.status, body: want.body as unknown });
});

test.each([
  ['over the limit', 2 * LIMIT, 413],
  ['within it', LIMIT / 2, 200],
])('a body sent in chunks (no Content-Length), %s: as express.json', async (_name, size, status) => {
  const answers = [];
  for (const parser of [express.json({ limit: LIMIT, strict: true }), jsonBody(LIMIT)]) {
    const server = app(parser).listen(0, '127.0.0.1');
    await once(server, 'listening');
    const { port } = server.address() as { port: number };
    const req = http.request({ port, host: '127.0.0.1', method: 'POST', path: '/', headers: { 'content-type': 'application/json' } });
    const text = `{"a":"${'x'.repeat(size)}"}`;
    req.write(text.slice(0, 10));
    req.end(text.slice(10));
    const [res] = (await once(req, 'response')) as [http.IncomingMessage];
    let body = '';
    for await (const chunk of res) body += String(chunk);
    answers.push({ status: res.statusCode, body: JSON.parse(body) as unknown, chunked: req.getHeader('content-length') === undefined });
    server.close();
  }
  expect(answers[0]).toMatchObject({ status, chunked: true });
  expect(answers[1]).toEqual(answers[0]);
});
