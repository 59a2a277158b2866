// Traffic to the ports of a box's apps and preview links, on the real node (issue 23; docs/ports.md).
// Apps in the boxes: busybox httpd (the box image's own; CGI scripts for server-sent events and
// the request as the app saw it) and portapp (boxd/internal/testkit/portapp, built static here and
// uploaded: busybox has no WebSocket server), each started as a background process on 127.0.0.1
// only. The operator runs as its own process (it decides sleeps), the bridges in-process: two in
// host mode (a preview host per box and port, reached here with a Host header) and one in path mode.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WebSocket } from 'ws';
import type { RunningBridge } from '../../bridge/server.js';
import { ON_REAL_NODE, TEST_TOKEN, api } from '../support/bridge.js';
import { realNodeAvailable } from '../support/cluster.js';
import { boxPods, kc, startLifecycle, until, type LifecycleEnv } from '../support/lifecycle.js';
import { localObjectStore } from '../support/object-store.js';

const realNode = await realNodeAvailable(kc);
const store = await localObjectStore();
const skipReason = !realNode.available ? `no real node: ${realNode.reason}` : !store.available ? `no object store: ${store.reason}` : undefined;
if (skipReason) console.warn(`SKIPPED ports tests on the real node: ${skipReason}`);
const suite = skipReason ? describe.skip : describe;

const SLEEP_AFTER_SECONDS = 4;
const SMALL = { cpu: 0.25, memory: 256 };
const HOST_PATTERN = 'http://{port}-{box}.preview.test';
const PREVIEW_KEY = randomBytes(32).toString('hex');
const PARAM = 'sandbox_bridge_preview';

type Call = ReturnType<typeof api>;
interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** A request to a bridge with the headers given (Host included: a preview host resolves nowhere here). */
function send(base: string, method: string, path: string, headers: Record<string, string> = {}, body?: Buffer | string): Promise<Answer> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const req = request({ host: url.hostname, port: url.port, method, path, headers, timeout: 60_000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.on('timeout', () => req.destroy(new Error(`${method} ${path}: no answer in 60 s`)));
    req.end(body);
  });
}

const auth = { authorization: `Bearer ${TEST_TOKEN}` };
const portPath = (box: string, port: number, rest = '/') => `/api/v1/boxes/${box}/ports/${port}${rest}`;
const previewHost = (box: string, port: number) => `${port}-${box}.preview.test`;
/** The path and query of a link (path mode: its host is not this test's bridge). */
const pathOf = (url: string) => {
  const u = new URL(url);
  return u.pathname + u.search;
};

/** CGI variables the app saw, from /cgi-bin/env (`env`). */
const cgiEnv = (body: string) => Object.fromEntries(body.split('\n').filter((l) => l.includes('=')).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));

suite('ports and preview links on the real node', () => {
  let env: LifecycleEnv;
  let bridgeA: RunningBridge;
  let bridgeB: RunningBridge;
  let pathBridge: RunningBridge;
  let call: Call;
  let boxA: string;
  let boxB: string;
  let buildDir: string;
  /** box -> the process id of its httpd (a background process). */
  const httpdOf = new Map<string, string>();

  const exec = async (box: string, command: string) => {
    const r = await call('POST', `/boxes/${box}/exec`, { command, timeoutMs: 30_000 });
    expect({ status: r.status, exit: r.json?.exit_code, stderr: r.json?.stderr }).toMatchObject({ status: 200, exit: 0 });
    return r.json.stdout as string;
  };

  /** A box with a site (index, CGI scripts) served by busybox httpd on 127.0.0.1:8000, and portapp on 127.0.0.1:8001. */
  const appBox = async (sessionId: string, name: string, portapp: Buffer | undefined) => {
    const created = await call('POST', '/boxes', { sessionId, ...SMALL });
    expect(created.status).toBe(201);
    const box = created.json.box_id as string;
    await exec(
      box,
      `mkdir -p site/cgi-bin && echo 'hello from ${name}' > site/index.html && echo 'sub page' > site/sub.html && ` +
        `printf '#!/bin/sh\\nprintf "Content-Type: text/plain\\\\r\\\\n\\\\r\\\\n"\\nenv\\n' > site/cgi-bin/env && ` +
        `printf '#!/bin/sh\\nprintf "Content-Type: text/plain\\\\r\\\\n\\\\r\\\\n"\\nwc -c\\n' > site/cgi-bin/count && ` +
        `printf '#!/bin/sh\\nsleep 5\\nprintf "Content-Type: text/plain\\\\r\\\\n\\\\r\\\\nlate\\\\n"\\n' > site/cgi-bin/slow && ` +
        `printf '#!/bin/sh\\nprintf "Content-Type: text/event-stream\\\\r\\\\nCache-Control: no-cache\\\\r\\\\n\\\\r\\\\n"\\nfor i in 1 2 3; do printf "data: %%s\\\\n\\\\n" $i; sleep 1; done\\n' > site/cgi-bin/sse && ` +
        'chmod +x site/cgi-bin/*',
    );
    const httpd = await call('POST', `/boxes/${box}/processes`, { command: 'httpd -f -p 127.0.0.1:8000 -h /workspace/site', tag: 'httpd' });
    expect(httpd.status).toBe(201);
    httpdOf.set(box, httpd.json.process_id as string);
    if (portapp) {
      const put = await call('PUT', `/boxes/${box}/files?path=portapp`, portapp, { 'content-type': 'application/octet-stream' });
      expect(put.status).toBe(200);
      await exec(box, 'chmod +x portapp');
      expect((await call('POST', `/boxes/${box}/processes`, { command: './portapp -listen 127.0.0.1:8001', tag: 'portapp' })).status).toBe(201);
    }
    await until(`the apps of ${name} to listen`, async () => {
      const [a, b] = await Promise.all([send(bridgeA.url, 'GET', portPath(box, 8000), auth), portapp ? send(bridgeA.url, 'GET', portPath(box, 8001), auth) : { status: 200 }]);
      return a.status === 200 && b.status === 200 ? true : undefined;
    }, 30_000);
    return box;
  };

  const preview = async (box: string, port: number, bridge = bridgeA, extra: Record<string, unknown> = {}) => {
    const r = await api(bridge)('POST', `/boxes/${box}/ports/${port}/preview`, extra);
    expect(r.status).toBe(200);
    expect(r.json).toMatchObject({ box_id: box, port, url: expect.any(String), expires_at: expect.any(String) });
    return r.json as { url: string; expires_at: string };
  };
  const tokenOf = (url: string) => new URL(url).searchParams.get(PARAM)!;

  beforeAll(async () => {
    buildDir = mkdtempSync(join(tmpdir(), 'portapp-'));
    execFileSync('go', ['build', '-trimpath', '-ldflags=-s -w', '-o', join(buildDir, 'portapp'), './internal/testkit/portapp'], {
      cwd: join(process.cwd(), 'boxd'),
      env: { ...process.env, CGO_ENABLED: '0' },
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    env = await startLifecycle({
      name: 'ports',
      pool: { maxBoxes: 10, box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: SLEEP_AFTER_SECONDS } },
      bridges: 2,
      bridgeEnv: { PREVIEW_URL: HOST_PATTERN, PREVIEW_KEY },
    });
    [bridgeA, bridgeB] = env.bridges as [RunningBridge, RunningBridge];
    // Path mode, with tight bounds to see them: 2 connections per box, 1.5 s to a first byte, 2 s of quiet.
    pathBridge = await env.addBridge({
      PREVIEW_URL: 'http://bridge.test/preview',
      PORT_MAX_CONNECTIONS_PER_BOX: '2',
      PORT_FIRST_BYTE_TIMEOUT_MS: '1500',
      PORT_IDLE_TIMEOUT_MS: '2000',
    });
    call = api(bridgeA);
    const portapp = readFileSync(join(buildDir, 'portapp'));
    [boxA, boxB] = await Promise.all([appBox('ports-a', 'box A', portapp), appBox('ports-b', 'box B', undefined)]);
  }, 240_000);

  afterAll(async () => {
    await env?.stop();
    if (buildDir) rmSync(buildDir, { recursive: true, force: true });
  }, 60_000);

  test('an app in the box answers through the port route: every method, bodies both ways, the bridge token kept from it', async () => {
    const page = await send(bridgeA.url, 'GET', portPath(boxA, 8000, '/'), auth);
    expect(page).toMatchObject({ status: 200, body: 'hello from box A\n' });
    expect(page.headers['content-security-policy']).toBeUndefined(); // the API's security headers are not the app's
    const head = await send(bridgeA.url, 'HEAD', portPath(boxA, 8000, '/sub.html'), auth);
    expect(head).toMatchObject({ status: 200, body: '' });
    expect(head.headers['content-length']).toBe('9');
    expect((await send(bridgeA.url, 'GET', portPath(boxA, 8000, '/missing.html'), auth)).status).toBe(404); // the app's own 404

    // The CGI environment: what httpd was sent.
    const seen = cgiEnv((await send(bridgeA.url, 'GET', portPath(boxA, 8000, '/cgi-bin/env?x=1&y=%20z'), { ...auth, cookie: 'c=1', 'x-custom': 'v' })).body);
    expect(seen).toMatchObject({ QUERY_STRING: 'x=1&y=%20z', HTTP_COOKIE: 'c=1', HTTP_X_CUSTOM: 'v', HTTP_X_FORWARDED_PROTO: 'http', HTTP_X_FORWARDED_PREFIX: `/api/v1/boxes/${boxA}/ports/8000` });
    expect(seen.HTTP_X_FORWARDED_FOR).toBeTruthy();
    expect(JSON.stringify(seen)).not.toContain(TEST_TOKEN);
    expect(Object.keys(seen).filter((k) => /^HTTP_(AUTHORIZATION|X_BOXD)/.test(k))).toEqual([]); // request headers (HTTP_*), not the box's env

    // A 2 MiB upload streamed to the app (wc -c), and portapp's view of the request.
    const upload = await send(bridgeA.url, 'POST', portPath(boxA, 8000, '/cgi-bin/count'), { ...auth, 'content-type': 'application/octet-stream' }, Buffer.alloc(2 << 20, 7));
    expect(upload).toMatchObject({ status: 200, body: `${2 << 20}\n` });
    const echoed = JSON.parse((await send(bridgeA.url, 'PUT', portPath(boxA, 8001, '/echo/a%2Fb?q=1'), { ...auth, connection: 'x-hop', 'x-hop': '1' }, 'abc')).body);
    expect(echoed).toMatchObject({ method: 'PUT', path: '/echo/a%2Fb', query: 'q=1', host: 'localhost:8001', body_bytes: 3 });
    expect(Object.keys(echoed.headers)).not.toEqual(expect.arrayContaining(['Authorization']));
    expect(echoed.headers['X-Hop']).toBeUndefined();
    // Cookies the app sets stay under the route's path and lose any Domain.
    const cookies = await send(bridgeA.url, 'GET', portPath(boxA, 8001, '/cookie'), auth);
    expect(cookies.headers['set-cookie']).toEqual([`plain=1; Path=/api/v1/boxes/${boxA}/ports/8001/`, `wide=2; HttpOnly; Path=/api/v1/boxes/${boxA}/ports/8001/app`, `bare=3; Path=/api/v1/boxes/${boxA}/ports/8001/`]);
  });

  test('errors of the bridge and the box are JSON: nothing listening, bad port, unknown box, scope', async () => {
    const nothing = await call('GET', `/boxes/${boxA}/ports/8009/`);
    expect(nothing).toMatchObject({ status: 502, json: { error: { type: 'bad_gateway', message: expect.stringContaining('nothing listens on port 8009') } } });
    expect((await call('GET', `/boxes/${boxA}/ports/0/`)).status).toBe(400);
    expect((await call('GET', `/boxes/${boxA}/ports/7771/v1/health`)).status).toBe(403); // boxd's own
    expect((await call('GET', '/boxes/box-000000000000-0/ports/8000/')).status).toBe(404);
    expect((await send(bridgeA.url, 'GET', portPath(boxA, 8000), {})).status).toBe(401);
  });

  test('server-sent events stream through without being buffered', async () => {
    const began = performance.now();
    const res = await fetch(`${bridgeA.url}${portPath(boxA, 8000, '/cgi-bin/sse')}`, { headers: auth });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    const reader = res.body!.getReader();
    const arrivals: number[] = [];
    let text = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
      while (arrivals.length < (text.match(/data: /g) ?? []).length) arrivals.push(performance.now() - began);
    }
    expect(text).toBe('data: 1\n\ndata: 2\n\ndata: 3\n\n');
    // The script sleeps 1 s after each event: each arrived when written, not at the end.
    expect(arrivals[1]! - arrivals[0]!).toBeGreaterThan(700);
    expect(arrivals[2]! - arrivals[1]!).toBeGreaterThan(700);
  });

  test('a WebSocket echo round-trips through the port route and through preview links', async () => {
    const roundTrip = async (url: string, headers: Record<string, string>) => {
      const ws = new WebSocket(url, { headers });
      const messages: string[] = [];
      const opened = new Promise<void>((resolve, reject) => {
        ws.once('open', () => resolve());
        ws.once('unexpected-response', (_req, res) => reject(new Error(`upgrade refused: ${res.statusCode}`)));
        ws.once('error', reject);
      });
      ws.on('message', (data, binary) => messages.push(binary ? `bin:${(data as Buffer).length}` : String(data)));
      await opened;
      ws.send('ping over the bridge');
      ws.send(Buffer.alloc(100_000, 1));
      await until('the echoes', async () => (messages.length >= 3 ? true : undefined), 10_000, 50);
      ws.close();
      return messages;
    };
    const base = bridgeA.url.replace('http', 'ws');
    expect(await roundTrip(`${base}${portPath(boxA, 8001, '/socket')}`, auth)).toEqual(['hello /socket', 'ping over the bridge', 'bin:100000']);
    const link = await preview(boxA, 8001);
    expect(await roundTrip(`${base}/socket?${PARAM}=${tokenOf(link.url)}`, { host: previewHost(boxA, 8001) })).toEqual(['hello /socket', 'ping over the bridge', 'bin:100000']);
    const pathLink = await preview(boxA, 8001, pathBridge);
    expect(await roundTrip(`${pathBridge.url.replace('http', 'ws')}${pathOf(pathLink.url)}socket`, {})).toEqual(['hello /socket', 'ping over the bridge', 'bin:100000']);
    // Without the bridge token the route refuses the upgrade.
    await expect(roundTrip(`${base}${portPath(boxA, 8001, '/socket')}`, {})).rejects.toThrow(/401/);
  });

  test('a preview link opens the port without the bridge token, on any replica; the app never sees the token', async () => {
    const link = await preview(boxA, 8000);
    expect(new URL(link.url).host).toBe(previewHost(boxA, 8000));
    const token = tokenOf(link.url);
    const first = await send(bridgeA.url, 'GET', `/?${PARAM}=${token}`, { host: previewHost(boxA, 8000) });
    expect(first).toMatchObject({ status: 200, body: 'hello from box A\n' });
    // The token is kept in a cookie of that host only (no Domain), for the page's other requests.
    const cookie = String(first.headers['set-cookie']);
    expect(cookie).toMatch(new RegExp(`^${PARAM}=${token.replace(/[.]/g, '\\.')}; Path=/; Max-Age=\\d+; HttpOnly; SameSite=Lax$`));
    expect(first.headers['x-request-id']).toBeUndefined(); // not the API's request log
    for (const bridge of [bridgeA, bridgeB]) {
      const sub = await send(bridge.url, 'GET', '/sub.html', { host: previewHost(boxA, 8000), cookie: `other=1; ${PARAM}=${token}` });
      expect(sub).toMatchObject({ status: 200, body: 'sub page\n' });
    }
    const seen = cgiEnv((await send(bridgeB.url, 'GET', `/cgi-bin/env?a=1&${PARAM}=${token}`, { host: previewHost(boxA, 8000), cookie: `other=1; ${PARAM}=${token}` })).body);
    expect(seen).toMatchObject({ QUERY_STRING: 'a=1', HTTP_COOKIE: 'other=1', HTTP_X_FORWARDED_HOST: previewHost(boxA, 8000) });
    expect(JSON.stringify(seen)).not.toContain(token);
    // With no bearer token on a preview, an Authorization header is the app's own (portapp shows what it got).
    const appLink = await preview(boxA, 8001);
    const echoed = JSON.parse((await send(bridgeA.url, 'GET', `/echo?${PARAM}=${tokenOf(appLink.url)}`, { host: previewHost(boxA, 8001), authorization: 'Basic YXBwOmxvZ2lu' })).body);
    expect(echoed).toMatchObject({ path: '/echo', query: '', headers: { Authorization: ['Basic YXBwOmxvZ2lu'], 'X-Forwarded-Host': [previewHost(boxA, 8001)] } });
    // Path mode: the token in the path; relative links work under it.
    const pathLink = await preview(boxA, 8000, pathBridge);
    expect(pathLink.url).toMatch(/^http:\/\/bridge\.test\/preview\/[^/]+\/$/);
    expect(await send(pathBridge.url, 'GET', pathOf(pathLink.url))).toMatchObject({ status: 200, body: 'hello from box A\n' });
    expect(await send(pathBridge.url, 'GET', `${pathOf(pathLink.url)}sub.html`)).toMatchObject({ status: 200, body: 'sub page\n' });
    const bare = await send(pathBridge.url, 'GET', pathOf(pathLink.url).replace(/\/$/, ''));
    expect(bare.status).toBe(308);
    expect(bare.headers.location).toBe(pathOf(pathLink.url));
    // Scope: making a link is boxes:write; no bearer token at all is 401.
    expect((await send(bridgeA.url, 'POST', `/api/v1/boxes/${boxA}/ports/8000/preview`, { 'content-type': 'application/json' }, '{}')).status).toBe(401);
    for (const [path, body] of [
      [`/boxes/${boxA}/ports/70000/preview`, {}],
      [`/boxes/${boxA}/ports/x/preview`, {}],
      [`/boxes/${boxA}/ports/8000/preview`, { expires_in_seconds: 10 ** 9 }],
      [`/boxes/${boxA}/ports/8000/preview`, { expires_in_seconds: 0 }],
      [`/boxes/${boxA}/ports/8000/preview`, { port: 8001 }],
    ] as const) {
      const r = await call('POST', path, body);
      expect({ path, body, status: r.status, type: r.json?.error?.type }).toEqual({ path, body, status: 400, type: 'invalid_request' });
    }
    expect((await call('POST', '/boxes/box-000000000000-0/ports/8000/preview', {})).status).toBe(404);
  });

  test("a preview link for box A can never reach box B", async () => {
    const link = await preview(boxA, 8000);
    const token = tokenOf(link.url);
    // A's token on B's host (in the query or the cookie), or on another port of A: refused.
    for (const [host, headers, path] of [
      [previewHost(boxB, 8000), {}, `/?${PARAM}=${token}`],
      [previewHost(boxB, 8000), { cookie: `${PARAM}=${token}` }, '/'],
      [previewHost(boxA, 8001), { cookie: `${PARAM}=${token}` }, '/'],
    ] as const) {
      const r = await send(bridgeA.url, 'GET', path, { host, ...headers });
      expect({ host, status: r.status, type: JSON.parse(r.body).error.type }).toEqual({ host, status: 404, type: 'not_found' });
    }
    // A forged token (B's box id in A's signed token) and no token: refused; a browser gets a page.
    const forged = token.replace(boxA, boxB);
    const page = await send(bridgeA.url, 'GET', `/?${PARAM}=${forged}`, { host: previewHost(boxB, 8000), accept: 'text/html' });
    expect(page.status).toBe(404);
    expect(page.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(page.body).toContain('Preview not found');
    expect((await send(bridgeA.url, 'GET', '/', { host: previewHost(boxB, 8000) })).status).toBe(401);
    // B's own link reaches B.
    const linkB = await preview(boxB, 8000);
    expect(await send(bridgeB.url, 'GET', `/?${PARAM}=${tokenOf(linkB.url)}`, { host: previewHost(boxB, 8000) })).toMatchObject({ status: 200, body: 'hello from box B\n' });
    // Path mode: A's link serves A, whatever is appended to it.
    const pathA = pathOf((await preview(boxA, 8000, pathBridge)).url);
    expect(await send(pathBridge.url, 'GET', `${pathA}..%2F..%2F`)).toMatchObject({ body: expect.not.stringContaining('box B') });
    expect((await send(pathBridge.url, 'GET', pathA.replace(boxA, boxB))).status).toBe(404);
  });

  test('a link stops working when it expires and when its port\'s links are revoked', async () => {
    const short = await preview(boxA, 8000, bridgeA, { expires_in_seconds: 2 });
    const open = (url: string, bridge = bridgeA, accept = '*/*') => send(bridge.url, 'GET', `/?${PARAM}=${tokenOf(url)}`, { host: previewHost(boxA, 8000), accept });
    expect((await open(short.url)).status).toBe(200);
    await new Promise((r) => setTimeout(r, 2500));
    const expired = await open(short.url);
    expect({ status: expired.status, type: JSON.parse(expired.body).error.type }).toEqual({ status: 410, type: 'gone' });
    expect((await open(short.url, bridgeA, 'text/html')).body).toContain('This preview link has expired');

    // Revoked: through the replica that revoked at once, through another within 5 s.
    const link = await preview(boxA, 8000);
    expect((await open(link.url, bridgeB)).status).toBe(200);
    const otherPort = await preview(boxA, 8001);
    expect((await call('DELETE', `/boxes/${boxA}/ports/8000/preview`)).json).toMatchObject({ box_id: boxA, port: 8000, revoked_at: expect.any(String) });
    expect((await open(link.url)).status).toBe(410);
    // Only that port's links: one to 8001 still opens.
    expect((await send(bridgeA.url, 'GET', `/echo?${PARAM}=${tokenOf(otherPort.url)}`, { host: previewHost(boxA, 8001) })).status).toBe(200);
    await until('the other replica to see the revocation', async () => ((await open(link.url, bridgeB)).status === 410 ? true : undefined), 10_000, 500);
    const fresh = await preview(boxA, 8000);
    expect((await open(fresh.url, bridgeB)).status).toBe(200);

  }, 180_000);

  test('the bounds: connections per box (429), the first byte (504), quiet streams closed', async () => {
    const pathA = pathOf((await preview(boxA, 8001, pathBridge)).url);
    // Two streams held open (portapp's server-sent events, one every second) fill the box's two connections.
    const streams = [0, 1].map(() => fetch(`${pathBridge.url}${pathA}sse?n=6&every_ms=1000`));
    const held = await Promise.all(streams);
    expect(held.map((r) => r.status)).toEqual([200, 200]);
    const third = await send(pathBridge.url, 'GET', `${pathA}`);
    expect({ status: third.status, retry: third.headers['retry-after'], type: JSON.parse(third.body).error.type }).toEqual({ status: 429, retry: '1', type: 'rate_limited' });
    await Promise.all(held.map((r) => r.body!.cancel()));
    await until('the streams to be let go', async () => ((await send(pathBridge.url, 'GET', pathA)).status === 200 ? true : undefined), 10_000, 200);

    // An app that takes 5 s to begin its answer: 504 after 1.5 s.
    const httpdPath = pathOf((await preview(boxA, 8000, pathBridge)).url);
    const began = performance.now();
    const slow = await send(pathBridge.url, 'GET', `${httpdPath}cgi-bin/slow`);
    expect({ status: slow.status, type: JSON.parse(slow.body).error.type }).toEqual({ status: 504, type: 'gateway_timeout' });
    expect(performance.now() - began).toBeLessThan(4500);

    // A stream quiet for longer than 2 s is closed (events every 4 s).
    const quiet = await fetch(`${pathBridge.url}${pathA}sse?n=3&every_ms=4000`);
    const reader = quiet.body!.getReader();
    const t0 = performance.now();
    const first = await reader.read();
    expect(Buffer.from(first.value!).toString()).toContain('event 1');
    await expect(
      (async () => {
        for (;;) if ((await reader.read()).done) return;
      })(),
    ).rejects.toThrow();
    expect(performance.now() - t0).toBeLessThan(3900);
  }, 60_000);

  test('traffic through a port keeps its box awake; a preview request wakes a sleeping box; a deleted box is not reached', async () => {
    // Box B's httpd moves from a background process (which keeps a box awake by itself) to a daemon started by a command.
    const stopped = await call('POST', `/boxes/${boxB}/processes/${httpdOf.get(boxB)}/signal`, { signal: 'KILL' });
    expect(stopped.status).toBe(200);
    await until('the background httpd to exit', async () => ((await call('GET', `/boxes/${boxB}/processes/${httpdOf.get(boxB)}`)).json.status === 'exited' ? true : undefined), 10_000);
    await exec(boxB, 'httpd -p 127.0.0.1:8000 -h /workspace/site');
    const link = await preview(boxB, 8000);
    const open = () => send(bridgeB.url, 'GET', `/?${PARAM}=${tokenOf(link.url)}`, { host: previewHost(boxB, 8000), accept: 'text/html' });
    const pod = (await boxPods(env.pool.ns, boxB))[0]!.metadata!.uid;
    const until3 = Date.now() + SLEEP_AFTER_SECONDS * 3 * 1000;
    while (Date.now() < until3) {
      expect(await open()).toMatchObject({ status: 200, body: 'hello from box B\n' });
      await new Promise((r) => setTimeout(r, 1000));
    }
    expect((await boxPods(env.pool.ns, boxB)).map((p) => p.metadata!.uid)).toEqual([pod]);
    // Left alone it sleeps; opening the link wakes it (its processes are not restored: nothing listens).
    await until(`box ${boxB} to sleep`, async () => ((await call('GET', `/boxes/${boxB}/status`)).json.status === 'Sleeping' ? true : undefined), 90_000, 500);
    const woken = await open();
    expect({ status: woken.status, body: woken.body }).toMatchObject({ status: 502, body: expect.stringContaining('Nothing is listening on this port') });
    // Woken: a new pod (the kubelet reports it Running a moment after its boxd answered).
    expect((await boxPods(env.pool.ns, boxB)).map((p) => p.metadata!.uid)).not.toContain(pod);
    await until('the woken box to be reported Running', async () => ((await call('GET', `/boxes/${boxB}/status`)).json.status === 'Running' ? true : undefined), 30_000);
    await exec(boxB, 'httpd -p 127.0.0.1:8000 -h /workspace/site');
    expect(await open()).toMatchObject({ status: 200, body: 'hello from box B\n' });

    // Deleted: the link and the route answer 404 at once.
    expect((await call('DELETE', `/boxes/${boxB}`)).status).toBe(200);
    const gone = await open();
    expect(gone.status).toBe(404);
    expect((await call('GET', `/boxes/${boxB}/ports/8000/`)).status).toBe(404);
  }, 180_000);
});
