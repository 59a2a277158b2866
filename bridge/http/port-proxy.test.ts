import { IncomingMessage } from 'node:http';
import { Socket } from 'node:net';
import { answerHeaders, confinedCookie, requestHeaders, withoutCookie, withoutQuery, type Forwarding } from './port-proxy.js';

function message(raw: string[]): IncomingMessage {
  const m = new IncomingMessage(new Socket());
  m.rawHeaders = raw;
  for (let i = 0; i < raw.length; i += 2) {
    const k = raw[i]!.toLowerCase();
    m.headers[k] = m.headers[k] === undefined ? raw[i + 1] : `${String(m.headers[k])}, ${raw[i + 1]}`;
  }
  return m;
}

const how: Forwarding = { proto: 'https', host: 'bridge.example.com', forwardedFor: '198.51.100.1', prefix: '/api/v1/boxes/b/ports/8000', dropAuthorization: true };

test('the request the app gets: no hop-by-hop or bridge headers, X-Forwarded-* as this bridge saw it', () => {
  const req = message([
    'Host', 'bridge.example.com', 'Connection', 'keep-alive, X-Secret-Hop', 'X-Secret-Hop', '1', 'Keep-Alive', 'timeout=5',
    'Transfer-Encoding', 'chunked', 'TE', 'trailers', 'Proxy-Authorization', 'Basic x', 'Expect', '100-continue',
    'Authorization', 'Bearer bridge-token', 'X-Boxd-Token', 'forged', 'X-Forwarded-For', '10.0.0.1', 'X-Forwarded-Host', 'evil',
    'Accept', 'text/html', 'Accept', 'application/json', 'Cookie', 'a=1', 'Cookie', 'b=2', 'Content-Type', 'text/plain',
  ]);
  expect(requestHeaders(req, how)).toEqual({
    accept: 'text/html, application/json',
    cookie: 'a=1; b=2',
    'content-type': 'text/plain',
    'x-forwarded-for': '198.51.100.1',
    'x-forwarded-proto': 'https',
    'x-forwarded-host': 'bridge.example.com',
    'x-forwarded-prefix': '/api/v1/boxes/b/ports/8000',
  });
  // A preview: the Authorization is the app's; the preview cookie is the bridge's.
  const preview = requestHeaders(message(['Authorization', 'Basic app', 'Cookie', 'x=1; sandbox_bridge_preview=tok; y=2']), { ...how, prefix: '', dropAuthorization: false, dropCookie: 'sandbox_bridge_preview' });
  expect(preview).toMatchObject({ authorization: 'Basic app', cookie: 'x=1; y=2' });
  expect(preview).not.toHaveProperty('x-forwarded-prefix');
  // An upgrade keeps what makes it one.
  expect(requestHeaders(message(['Connection', 'Upgrade', 'Upgrade', 'websocket', 'Sec-WebSocket-Key', 'k']), how)).toMatchObject({ connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-key': 'k' });
  expect(requestHeaders(message(['Upgrade', 'websocket']), how)).not.toHaveProperty('upgrade');
});

test("the app's answer headers: hop-by-hop and X-Boxd-* gone, cookies kept where the app is served", () => {
  const res = message([
    'Content-Type', 'text/html', 'Connection', 'close, X-Hop', 'X-Hop', '1', 'Transfer-Encoding', 'chunked', 'Keep-Alive', 'timeout=1',
    'X-Boxd-Proxied', '1', 'X-Boxd-Fence', '3', 'Set-Cookie', 'a=1; Domain=example.com; Path=/', 'Set-Cookie', 'b=2', 'Content-Length', '5',
  ]);
  expect(answerHeaders(res, { ...how, cookiePath: '/api/v1/boxes/b/ports/8000/' })).toEqual([
    'Content-Type', 'text/html', 'Set-Cookie', 'a=1; Path=/api/v1/boxes/b/ports/8000/', 'Set-Cookie', 'b=2; Path=/api/v1/boxes/b/ports/8000/', 'Content-Length', '5',
  ]);
  expect(answerHeaders(message(['Connection', 'Upgrade', 'Upgrade', 'websocket', 'Sec-WebSocket-Accept', 'x']), how, true)).toEqual(['Connection', 'Upgrade', 'Upgrade', 'websocket', 'Sec-WebSocket-Accept', 'x']);
});

test('cookies: never for another domain; under the prefix when the host is shared', () => {
  expect(confinedCookie('s=1; Domain=.preview.example.com; Path=/; HttpOnly; Secure')).toBe('s=1; Path=/; HttpOnly; Secure');
  expect(confinedCookie('s=1; path=/app; SameSite=Lax', '/preview/TOK/')).toBe('s=1; SameSite=Lax; Path=/preview/TOK/app');
  expect(confinedCookie('s=1', '/preview/TOK/')).toBe('s=1; Path=/preview/TOK/');
  expect(withoutCookie('a=1; sandbox_bridge_preview=x;b=2', 'sandbox_bridge_preview')).toBe('a=1; b=2');
  expect(withoutCookie('sandbox_bridge_preview=x', 'sandbox_bridge_preview')).toBe('');
});

test('the preview token leaves the query; the rest stays as it came', () => {
  expect(withoutQuery('/a?sandbox_bridge_preview=T', 'sandbox_bridge_preview')).toBe('/a');
  expect(withoutQuery('/a?x=%20&sandbox_bridge_preview=T&y', 'sandbox_bridge_preview')).toBe('/a?x=%20&y');
  expect(withoutQuery('/a%2Fb?x=1', 'sandbox_bridge_preview')).toBe('/a%2Fb?x=1');
  expect(withoutQuery('/', 'p')).toBe('/');
  expect(withoutQuery('/a?%E0=1&sandbox_bridge_preview=T', 'sandbox_bridge_preview')).toBe('/a?%E0=1');
});
