// The client with an injected fetch: request shapes, retries and backoff, timeouts, error
// shapes, lazy box creation, idempotent destroy, configuration from the environment.
import { randomBytes } from 'node:crypto';
import {
  BridgeClientError,
  ClusterBridgeSandbox,
  SandboxConfigError,
  clusterBridgeConfig,
  clusterBridgeSandboxFactory,
  createBridgeClient,
  decodeBase64,
  encodeBase64,
  parseRetryAfter,
  selectSandboxProvider,
  type BridgeClientOptions,
} from './index.js';

interface Seen {
  method: string;
  url: URL;
  headers: Record<string, string>;
  body: string | undefined;
}

type Reply = Response | ((req: Seen, init: RequestInit) => Response | Promise<Response>);

const json = (status: number, body: unknown, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });
const bridgeError = (status: number, type: string, message: string, headers: Record<string, string> = {}) =>
  json(status, { error: { type, message } }, headers);

/** A fetch that answers from a script, in order, and records what it was asked. */
function scriptedFetch(...replies: Reply[]) {
  const seen: Seen[] = [];
  const fetch = async (input: string, init: RequestInit) => {
    const req: Seen = {
      method: init.method ?? 'GET',
      url: new URL(input),
      headers: Object.fromEntries(new Headers(init.headers).entries()),
      body: init.body as string | undefined,
    };
    seen.push(req);
    const reply = replies.shift();
    if (!reply) throw new Error(`unexpected request ${req.method} ${input}`);
    return typeof reply === 'function' ? reply(req, init) : reply;
  };
  return { fetch, seen };
}

const BASE = 'https://bridge.example.com';
function client(fetch: BridgeClientOptions['fetch'], extra: Partial<BridgeClientOptions> = {}) {
  return createBridgeClient({ url: BASE, token: 'tok', fetch, retries: { max: 3, baseDelayMs: 1, maxDelayMs: 4 }, ...extra });
}

const CREATED = {
  box_id: 'box-0123456789ab-0',
  status: 'Pending',
  namespace: 'sbx',
  pod_name: 'box-0123456789ab-0',
  image: 'sandbox-bridge.local/box:dev',
  cpu: '500m',
  memory: '256Mi',
  created_at: '2025-01-01T00:00:00.000Z',
};
const EXEC_OK = { exit_code: 0, stdout: 'hi\n', stderr: '', duration_ms: 12, timed_out: false, stdout_truncated: false, stderr_truncated: false };

describe('requests', () => {
  test('every endpoint: method, path, query, auth header and body', async () => {
    const { fetch, seen } = scriptedFetch(
      ...Array.from({ length: 16 }, (_, i) => (i === 4 ? new Response('line\n', { status: 200 }) : json(200, { ok: i }))),
    );
    const c = createBridgeClient({ url: `${BASE}/`, token: 'tok', fetch });
    await c.health();
    await c.clusterInfo();
    await c.nodes();
    await c.sandboxes();
    expect(await c.logs('box a/1', { tailLines: 20 })).toBe('line\n');
    await c.metrics();
    await c.createBox({ sessionId: 's1', cpu: 0.5, memory: 256 });
    await c.deleteBox('box-1');
    await c.exec('box-1', { command: 'echo hi', workdir: '/tmp' });
    await c.readFile('box-1', 'dir/a b.txt', { base64: true });
    await c.writeFile('box-1', 'a.txt', 'héllo');
    await c.setEnv('box-1', { A: '1' });
    await c.status('box-1');
    await c.openapi();
    await c.getCapacity();
    await c.sandboxes({ sessionId: 's 1', status: 'Running', limit: 50, continue: 'abc' });

    expect(seen.map((r) => `${r.method} ${r.url.pathname}${r.url.search}`)).toEqual([
      'GET /api/v1/health',
      'GET /api/v1/cluster/info',
      'GET /api/v1/cluster/nodes',
      'GET /api/v1/sandboxes',
      'GET /api/v1/sandboxes/box%20a%2F1/logs?tailLines=20',
      'GET /api/v1/sandboxes/metrics',
      'POST /api/v1/boxes',
      'DELETE /api/v1/boxes/box-1',
      'POST /api/v1/boxes/box-1/exec',
      'GET /api/v1/boxes/box-1/files?path=dir%2Fa+b.txt&base64=true',
      'PUT /api/v1/boxes/box-1/files?path=a.txt',
      'POST /api/v1/boxes/box-1/env',
      'GET /api/v1/boxes/box-1/status',
      'GET /api/v1/openapi.json',
      'GET /api/v1/cluster/capacity',
      'GET /api/v1/sandboxes?session_id=s+1&status=Running&limit=50&continue=abc',
    ]);
    for (const r of seen) expect(r.headers.authorization).toBe('Bearer tok');
    expect(seen.filter((r) => r.headers['idempotency-key']).map((r) => `${r.method} ${r.url.pathname}`)).toEqual(['POST /api/v1/boxes']);
    expect(JSON.parse(seen[6]!.body!)).toEqual({ sessionId: 's1', cpu: 0.5, memory: 256 });
    expect(seen[6]!.headers['content-type']).toBe('application/json');
    expect(JSON.parse(seen[8]!.body!)).toEqual({ command: 'echo hi', workdir: '/tmp' });
    expect(seen[10]!.body).toBe('héllo');
    expect(seen[10]!.headers['content-type']).toMatch(/^text\/plain/);
    expect(JSON.parse(seen[11]!.body!)).toEqual({ envVars: { A: '1' } });
    expect(seen[0]!.body).toBeUndefined();
  });

  test('bytes are written as base64 with base64=true', async () => {
    const bytes = new Uint8Array([0, 1, 2, 253, 254, 255]);
    const { fetch, seen } = scriptedFetch(json(200, { path: '/workspace/b', size: 6, encoding: 'base64' }));
    await client(fetch).writeFile('box-1', 'b', bytes);
    expect(seen[0]!.url.searchParams.get('base64')).toBe('true');
    expect(seen[0]!.body).toBe(Buffer.from(bytes).toString('base64'));
  });

  test('a base URL that already ends in /api/v1 is not doubled', async () => {
    const { fetch, seen } = scriptedFetch(json(200, {}));
    await createBridgeClient({ url: `${BASE}/prefix/api/v1/`, token: 't', fetch }).health();
    expect(seen[0]!.url.pathname).toBe('/prefix/api/v1/health');
  });

  test('bad options fail at construction', () => {
    expect(() => createBridgeClient({ url: 'not a url', token: 't' })).toThrow(/not a valid URL/);
    expect(() => createBridgeClient({ url: 'ftp://x', token: 't' })).toThrow(/http\(s\)/);
    expect(() => createBridgeClient({ url: BASE, token: '' })).toThrow(/token is empty/);
  });
});

describe('errors', () => {
  test('carry status, bridge type, detail and request id; message leads with "<op> failed: <status>"', async () => {
    const { fetch } = scriptedFetch(bridgeError(401, 'unauthorized', 'wrong bearer token', { 'x-request-id': 'req-1' }));
    const err = (await client(fetch).createBox({ sessionId: 's' }).catch((e: unknown) => e)) as BridgeClientError;
    expect(err).toBeInstanceOf(BridgeClientError);
    expect(err).toBeInstanceOf(Error);
    expect(err.message).toBe('create failed: 401 unauthorized: wrong bearer token');
    expect(err.message.startsWith('create failed: 401')).toBe(true);
    expect(err).toMatchObject({ name: 'BridgeClientError', operation: 'create', status: 401, type: 'unauthorized', detail: 'wrong bearer token', requestId: 'req-1' });
  });

  test('a non-JSON error (a proxy page) keeps the status', async () => {
    const { fetch } = scriptedFetch(new Response('<html>Bad gateway</html>', { status: 502 }));
    const err = (await client(fetch).health().catch((e: unknown) => e)) as BridgeClientError;
    expect(err.message).toBe('health failed: 502');
    expect(err).toMatchObject({ status: 502, type: 'http_error' });
  });

  test('a 2xx that is not JSON is an invalid_response', async () => {
    const { fetch } = scriptedFetch(new Response('oops', { status: 200 }));
    await expect(client(fetch).health()).rejects.toMatchObject({ type: 'invalid_response', status: 200, message: expect.stringMatching(/^health failed: 200 invalid_response/) });
  });

  test('a network failure is status 0 / network_error', async () => {
    const fetch = async () => {
      throw new TypeError('fetch failed', { cause: new Error('connect ECONNREFUSED 127.0.0.1:1') });
    };
    const err = (await client(fetch).health().catch((e: unknown) => e)) as BridgeClientError;
    expect(err).toMatchObject({ status: 0, type: 'network_error' });
    expect(err.message).toBe('health failed: fetch failed (connect ECONNREFUSED 127.0.0.1:1)');
  });
});

describe('retries', () => {
  test('429 with Retry-After waits at least that long, then succeeds', async () => {
    const delays: number[] = [];
    const { fetch, seen } = scriptedFetch(
      bridgeError(429, 'rate_limited', 'box already runs 5 commands', { 'retry-after': '1' }),
      json(200, EXEC_OK),
    );
    const c = client(fetch, { retries: { max: 3, baseDelayMs: 1, onRetry: (i) => delays.push(i.delayMs) } });
    const started = Date.now();
    expect(await c.exec('box-1', { command: 'true' })).toEqual(EXEC_OK);
    expect(Date.now() - started).toBeGreaterThanOrEqual(990);
    expect(delays).toEqual([1000]);
    expect(seen).toHaveLength(2);
  });

  test('503 is retried with exponential backoff and full jitter, up to the limit', async () => {
    const retries: { attempt: number; delayMs: number; status: number; type: string }[] = [];
    const unavailable = () => bridgeError(503, 'cluster_unavailable', 'API server unreachable');
    const { fetch, seen } = scriptedFetch(unavailable(), unavailable(), unavailable(), unavailable());
    const c = client(fetch, { retries: { max: 3, baseDelayMs: 8, maxDelayMs: 16, onRetry: (i) => retries.push(i) } });
    const err = (await c.status('box-1').catch((e: unknown) => e)) as BridgeClientError;
    expect(seen).toHaveLength(4); // first attempt + 3 retries
    expect(err.message).toBe('status failed: 503 cluster_unavailable: API server unreachable');
    expect(retries.map((r) => r.attempt)).toEqual([1, 2, 3]);
    // Full jitter: each wait is somewhere in [0, min(max, base * 2^n)].
    retries.forEach((r, n) => {
      expect(r.delayMs).toBeGreaterThanOrEqual(0);
      expect(r.delayMs).toBeLessThanOrEqual(Math.min(16, 8 * 2 ** n));
      expect(r).toMatchObject({ status: 503, type: 'cluster_unavailable' });
    });
  });

  test('a request that may have run is never sent twice: exec, env and file writes are not retried on 503', async () => {
    const unavailable = () => bridgeError(503, 'cluster_unavailable', 'replica went away', { 'retry-after': '0' });
    for (const [name, run] of [
      ['exec', (c: ReturnType<typeof client>) => c.exec('box-1', { command: 'echo once >> log' })],
      ['set env', (c: ReturnType<typeof client>) => c.setEnv('box-1', { A: '1' })],
      ['write file', (c: ReturnType<typeof client>) => c.writeFile('box-1', 'a.txt', 'x')],
    ] as const) {
      const { fetch, seen } = scriptedFetch(unavailable(), json(200, EXEC_OK));
      await expect(run(client(fetch))).rejects.toMatchObject({ status: 503, type: 'cluster_unavailable', operation: name });
      expect(seen).toHaveLength(1);
    }
  });

  test('an untyped 429 (a proxy, not the bridge) is not retried for exec; a typed one is', async () => {
    const proxy = scriptedFetch(new Response('slow down', { status: 429 }), json(200, EXEC_OK));
    await expect(client(proxy.fetch).exec('box-1', { command: 'true' })).rejects.toMatchObject({ status: 429, type: 'http_error' });
    expect(proxy.seen).toHaveLength(1);
    const bridge = scriptedFetch(bridgeError(429, 'quota_exceeded', 'pool full'), json(200, EXEC_OK));
    expect(await client(bridge.fetch).exec('box-1', { command: 'true' })).toEqual(EXEC_OK);
    expect(bridge.seen).toHaveLength(2);
    // Reads and deletes may repeat whatever refused them.
    const read = scriptedFetch(new Response('slow down', { status: 429 }), json(200, { box_id: 'box-1' }));
    await client(read.fetch).status('box-1');
    expect(read.seen).toHaveLength(2);
  });

  test('network errors and timeouts are never retried, for any method', async () => {
    let calls = 0;
    const failing = async () => {
      calls++;
      throw new TypeError('fetch failed', { cause: new Error('socket hang up') });
    };
    await expect(client(failing).exec('box-1', { command: 'true' })).rejects.toMatchObject({ type: 'network_error' });
    await expect(client(failing).createBox({ sessionId: 's' })).rejects.toMatchObject({ type: 'network_error' });
    await expect(client(failing).status('box-1')).rejects.toMatchObject({ type: 'network_error' });
    expect(calls).toBe(3);
  });

  test('create sends an Idempotency-Key and retries 503 under the same key; a new call gets a new key', async () => {
    const { fetch, seen } = scriptedFetch(
      bridgeError(503, 'cluster_unavailable', 'API server unreachable'),
      bridgeError(429, 'rate_limited', 'slow down'),
      json(201, CREATED),
      json(201, CREATED),
      json(201, CREATED),
    );
    const c = client(fetch);
    expect(await c.createBox({ sessionId: 's' })).toEqual(CREATED);
    expect(seen).toHaveLength(3);
    const key = seen[0]!.headers['idempotency-key'];
    expect(key).toMatch(/^[0-9a-f-]{36}$/);
    expect(seen.map((r) => r.headers['idempotency-key'])).toEqual([key, key, key]);
    await c.createBox({ sessionId: 's' });
    expect(seen[3]!.headers['idempotency-key']).toMatch(/^[0-9a-f-]{36}$/);
    expect(seen[3]!.headers['idempotency-key']).not.toBe(key);
    await c.createBox({ sessionId: 's' }, { idempotencyKey: 'caller-chosen-key' });
    expect(seen[4]!.headers['idempotency-key']).toBe('caller-chosen-key');
  });

  test('quota_exceeded (429) is retried too', async () => {
    const { fetch, seen } = scriptedFetch(bridgeError(429, 'quota_exceeded', 'session has 3 boxes'), json(201, CREATED));
    expect(await client(fetch).createBox({ sessionId: 's' })).toEqual(CREATED);
    expect(seen).toHaveLength(2);
  });

  test.each([
    [400, 'invalid_request'],
    [401, 'unauthorized'],
    [403, 'forbidden'],
    [404, 'not_found'],
    [409, 'conflict'],
    [413, 'payload_too_large'],
    [500, 'internal_error'],
  ])('%i is never retried', async (status, type) => {
    const { fetch, seen } = scriptedFetch(bridgeError(status, type, 'no'), json(200, {}));
    await expect(client(fetch).status('box-1')).rejects.toMatchObject({ status, type, message: `status failed: ${status} ${type}: no` });
    expect(seen).toHaveLength(1);
  });

  test('retries: 0 disables retrying', async () => {
    const { fetch, seen } = scriptedFetch(bridgeError(503, 'cluster_unavailable', 'down'), json(200, {}));
    await expect(client(fetch, { retries: 0 }).health()).rejects.toMatchObject({ status: 503 });
    expect(seen).toHaveLength(1);
  });

  test('a Retry-After beyond the deadline fails at once with the 429, not a timeout', async () => {
    const { fetch, seen } = scriptedFetch(bridgeError(429, 'quota_exceeded', 'global cap reached', { 'retry-after': '30' }));
    const started = Date.now();
    await expect(client(fetch, { timeoutMs: 2000 }).createBox({ sessionId: 's' })).rejects.toMatchObject({
      status: 429,
      type: 'quota_exceeded',
      retryAfterMs: 30_000,
    });
    expect(Date.now() - started).toBeLessThan(1000);
    expect(seen).toHaveLength(1);
  });

  test('Retry-After: seconds and HTTP dates', () => {
    expect(parseRetryAfter('5')).toBe(5000);
    expect(parseRetryAfter(null)).toBeUndefined();
    expect(parseRetryAfter('soon')).toBeUndefined();
    const now = Date.parse('2025-01-01T00:00:00Z');
    expect(parseRetryAfter('Wed, 01 Jan 2025 00:00:03 GMT', now)).toBe(3000);
  });
});

describe('timeouts and cancellation', () => {
  /** A fetch that never answers until its signal aborts, like a hung connection. */
  const hangingFetch = () =>
    scriptedFetch(
      (_req, init) =>
        new Promise<Response>((_resolve, reject) => {
          init.signal!.addEventListener('abort', () => reject(init.signal!.reason));
        }),
    );

  test('the client timeout aborts a hung call with type timeout', async () => {
    const { fetch } = hangingFetch();
    const started = Date.now();
    const err = (await client(fetch, { timeoutMs: 100 }).health().catch((e: unknown) => e)) as BridgeClientError;
    expect(err).toMatchObject({ status: 0, type: 'timeout', message: 'health failed: timed out after 100 ms' });
    expect(Date.now() - started).toBeLessThan(2000);
  });

  test('a per-call timeout overrides the client default', async () => {
    const { fetch } = hangingFetch();
    await expect(client(fetch, { timeoutMs: 60_000 }).status('b', { timeoutMs: 50 })).rejects.toMatchObject({ type: 'timeout', message: 'status failed: timed out after 50 ms' });
  });

  test("the caller's signal cancels the call, and a retry wait", async () => {
    const { fetch } = hangingFetch();
    const controller = new AbortController();
    const pending = client(fetch).health({ signal: controller.signal });
    controller.abort(new Error('user gave up'));
    await expect(pending).rejects.toMatchObject({ type: 'aborted', status: 0, message: 'health failed: aborted' });

    const waiting = scriptedFetch(bridgeError(429, 'rate_limited', 'slow down', { 'retry-after': '20' }));
    const c2 = new AbortController();
    const call = client(waiting.fetch, { timeoutMs: 60_000 }).health({ signal: c2.signal });
    setTimeout(() => c2.abort(), 50);
    await expect(call).rejects.toMatchObject({ type: 'aborted' });
  });

  test('exec gets a deadline beyond its command timeout', async () => {
    let signal: AbortSignal | undefined;
    const { fetch } = scriptedFetch((_req, init) => {
      signal = init.signal ?? undefined;
      return new Promise((resolve) => setTimeout(() => resolve(json(200, EXEC_OK)), 150));
    });
    // Client default 50 ms, but a command allowed 1 s must not be cut off at 50 ms.
    expect(await client(fetch, { timeoutMs: 50 }).exec('b', { command: 'sleep 0.1', timeoutMs: 1000 })).toEqual(EXEC_OK);
    expect(signal?.aborted).toBe(false);
  });
});

describe('ClusterBridgeSandbox', () => {
  const BOX = CREATED.box_id;

  test('creates its box lazily, on the first operation, and only once', async () => {
    const { fetch, seen } = scriptedFetch(json(201, CREATED), json(200, EXEC_OK), json(200, EXEC_OK));
    const sandbox = new ClusterBridgeSandbox(client(fetch), { sessionId: 'sess-1', image: 'img', cpu: 0.5, memory: 256, workdir: '/tmp' });
    expect(seen).toHaveLength(0);
    expect(sandbox.boxId).toBeUndefined();
    await sandbox.exec('echo hi');
    await sandbox.exec('echo again', { workdir: '/other', timeoutMs: 5000 });
    expect(sandbox.boxId).toBe(BOX);
    expect(seen.map((r) => `${r.method} ${r.url.pathname}`)).toEqual(['POST /api/v1/boxes', `POST /api/v1/boxes/${BOX}/exec`, `POST /api/v1/boxes/${BOX}/exec`]);
    expect(JSON.parse(seen[0]!.body!)).toEqual({ sessionId: 'sess-1', image: 'img', cpu: 0.5, memory: 256 });
    expect(JSON.parse(seen[1]!.body!)).toEqual({ command: 'echo hi', workdir: '/tmp' });
    expect(JSON.parse(seen[2]!.body!)).toEqual({ command: 'echo again', workdir: '/other', timeoutMs: 5000 });
  });

  test('concurrent first operations share one create', async () => {
    let creates = 0;
    const fetch = async (input: string, init: RequestInit) => {
      const url = new URL(input);
      if (init.method === 'POST' && url.pathname === '/api/v1/boxes') {
        creates++;
        await new Promise((resolve) => setTimeout(resolve, 20));
        return json(201, CREATED);
      }
      if (url.pathname.endsWith('/exec')) return json(200, EXEC_OK);
      if (url.pathname.endsWith('/env')) return json(200, { box_id: BOX, env_count: 1, updated_at: 'now' });
      if (url.pathname.endsWith('/files')) return json(200, { path: '/workspace/a', size: 1, encoding: 'text' });
      return json(200, { box_id: BOX });
    };
    const sandbox = new ClusterBridgeSandbox(client(fetch), { sessionId: 's' });
    await Promise.all([sandbox.exec('a'), sandbox.exec('b'), sandbox.setEnvVars({ A: '1' }), sandbox.writeFile('a', 'x'), sandbox.status()]);
    expect(creates).toBe(1);
  });

  test('a failed create is reported as "create failed: <status>" and tried again next time', async () => {
    const { fetch, seen } = scriptedFetch(bridgeError(401, 'unauthorized', 'wrong bearer token'), json(201, CREATED), json(200, EXEC_OK));
    const sandbox = new ClusterBridgeSandbox(client(fetch), { sessionId: 's' });
    await expect(sandbox.exec('true')).rejects.toMatchObject({ message: expect.stringMatching(/^create failed: 401\b/), status: 401, type: 'unauthorized' });
    expect(sandbox.boxId).toBeUndefined();
    await sandbox.exec('true');
    expect(seen).toHaveLength(3);
  });

  test('a create whose outcome is unknown is repeated by the next operation under the same key', async () => {
    const { fetch, seen } = scriptedFetch(
      () => {
        throw new TypeError('fetch failed', { cause: new Error('socket hang up') });
      },
      json(201, CREATED),
      json(200, EXEC_OK),
    );
    const sandbox = new ClusterBridgeSandbox(client(fetch), { sessionId: 's' });
    await expect(sandbox.exec('true')).rejects.toMatchObject({ type: 'network_error', operation: 'create' });
    await sandbox.exec('true');
    const keys = seen.filter((r) => r.url.pathname === '/api/v1/boxes').map((r) => r.headers['idempotency-key']);
    expect(keys).toHaveLength(2);
    expect(keys[0]).toBeDefined();
    expect(keys[1]).toBe(keys[0]);
    // Another session's sandbox has its own key.
    const other = scriptedFetch(json(201, CREATED), json(200, EXEC_OK));
    await new ClusterBridgeSandbox(client(other.fetch), { sessionId: 's2' }).exec('true');
    expect(other.seen[0]!.headers['idempotency-key']).not.toBe(keys[0]);
  });

  test('files: text and bytes, whichever encoding the bridge picks', async () => {
    const bytes = new Uint8Array(randomBytes(300));
    const { fetch, seen } = scriptedFetch(
      json(201, CREATED),
      json(200, { path: '/workspace/t.txt', size: 6, encoding: 'text' }),
      json(200, { path: '/workspace/t.txt', size: 6, content: 'héllo', encoding: 'text' }),
      json(200, { path: '/workspace/b.bin', size: 300, encoding: 'base64' }),
      json(200, { path: '/workspace/b.bin', size: 300, content: Buffer.from(bytes).toString('base64'), encoding: 'base64' }),
      json(200, { path: '/workspace/t.txt', size: 6, content: Buffer.from('héllo').toString('base64'), encoding: 'base64' }),
    );
    const sandbox = new ClusterBridgeSandbox(client(fetch), { sessionId: 's' });
    expect(await sandbox.writeFile('t.txt', 'héllo')).toMatchObject({ encoding: 'text' });
    expect(await sandbox.readFile('t.txt')).toBe('héllo');
    expect(await sandbox.writeFile('b.bin', bytes)).toMatchObject({ encoding: 'base64', size: 300 });
    expect(await sandbox.readFileBytes('b.bin')).toEqual(bytes);
    expect(await sandbox.readFile('t.txt')).toBe('héllo'); // base64 answer decoded as UTF-8
    expect(seen[3]!.body).toBe(Buffer.from(bytes).toString('base64'));
    expect(seen[4]!.url.searchParams.get('base64')).toBe('true');
  });

  test('destroy deletes the box; again is a no-op; a 404 counts as done', async () => {
    const STATUS = { box_id: BOX, status: 'Running' };
    const { fetch, seen } = scriptedFetch(json(201, CREATED), json(200, STATUS), json(200, { box_id: BOX, status: 'Terminated', deleted_at: 'now' }));
    const sandbox = new ClusterBridgeSandbox(client(fetch), { sessionId: 's' });
    expect(await sandbox.status()).toEqual(STATUS);
    await sandbox.destroy();
    await sandbox.destroy();
    expect(seen.map((r) => `${r.method} ${r.url.pathname}`)).toEqual(['POST /api/v1/boxes', `GET /api/v1/boxes/${BOX}/status`, `DELETE /api/v1/boxes/${BOX}`]);

    // Reaped by its TTL (or deleted by someone else) before the session ended.
    const gone = scriptedFetch(json(201, CREATED), json(200, { box_id: BOX, env_count: 1, updated_at: 'now' }), bridgeError(404, 'not_found', `box ${BOX} not found`));
    const reaped = new ClusterBridgeSandbox(client(gone.fetch), { sessionId: 's' });
    await reaped.setEnvVars({ A: '1' });
    await expect(reaped.destroy()).resolves.toBeUndefined();
    await expect(reaped.destroy()).resolves.toBeUndefined();
    expect(gone.seen.map((r) => r.method)).toEqual(['POST', 'POST', 'DELETE']);
  });

  test('destroy: deletes once, later operations are refused, a failed delete can be retried', async () => {
    const { fetch, seen } = scriptedFetch(
      json(201, CREATED),
      json(200, EXEC_OK),
      bridgeError(500, 'internal_error', 'boom'),
      json(200, { box_id: BOX, status: 'Terminated', deleted_at: 'now' }),
    );
    const sandbox = new ClusterBridgeSandbox(client(fetch), { sessionId: 's' });
    await sandbox.exec('true');
    await expect(sandbox.destroy()).rejects.toMatchObject({ message: 'delete failed: 500 internal_error: boom' });
    await Promise.all([sandbox.destroy(), sandbox.destroy()]);
    await sandbox.destroy();
    expect(seen.map((r) => r.method)).toEqual(['POST', 'POST', 'DELETE', 'DELETE']);
    await expect(sandbox.exec('true')).rejects.toMatchObject({ type: 'sandbox_destroyed', message: 'exec failed: the sandbox of session s was destroyed' });
    expect(seen).toHaveLength(4);
  });

  test('destroy before any box exists sends nothing; destroy during a create deletes that box', async () => {
    const idle = scriptedFetch();
    await new ClusterBridgeSandbox(client(idle.fetch), { sessionId: 's' }).destroy();
    expect(idle.seen).toHaveLength(0);

    const slow = scriptedFetch(
      () => new Promise((resolve) => setTimeout(() => resolve(json(201, CREATED)), 30)),
      json(200, EXEC_OK),
      json(200, { box_id: BOX, status: 'Terminated', deleted_at: 'now' }),
    );
    const sandbox = new ClusterBridgeSandbox(client(slow.fetch), { sessionId: 's' });
    const exec = sandbox.exec('true');
    await new Promise((resolve) => setTimeout(resolve, 5));
    await sandbox.destroy();
    await exec.catch(() => undefined);
    expect(slow.seen.map((r) => `${r.method} ${r.url.pathname}`)).toContain(`DELETE /api/v1/boxes/${BOX}`);
  });
});

describe('configuration from the environment', () => {
  const ENV = {
    SANDBOX_PROVIDER: 'cluster-bridge',
    CLUSTER_BRIDGE_URL: 'https://bridge.example.com',
    CLUSTER_BRIDGE_TOKEN: 'secret-token',
    SANDBOX_IMAGE: 'registry.example.com/tools/python:3.13',
    CLUSTER_CPU: '0.5',
    CLUSTER_MEMORY: '1024',
  };

  test('fromEnv reads every variable', async () => {
    const { fetch, seen } = scriptedFetch(json(201, CREATED), json(200, EXEC_OK));
    const sandbox = ClusterBridgeSandbox.fromEnv({ sessionId: 'sess', env: ENV, fetch });
    await sandbox.exec('true');
    expect(seen[0]!.url.href).toBe('https://bridge.example.com/api/v1/boxes');
    expect(seen[0]!.headers.authorization).toBe('Bearer secret-token');
    expect(JSON.parse(seen[0]!.body!)).toEqual({ sessionId: 'sess', image: ENV.SANDBOX_IMAGE, cpu: 0.5, memory: 1024 });
  });

  test('image, cpu and memory are optional (the pool defaults apply)', () => {
    expect(clusterBridgeConfig({ env: { SANDBOX_PROVIDER: 'cluster-bridge', CLUSTER_BRIDGE_URL: 'http://b:8080', CLUSTER_BRIDGE_TOKEN: 't', CLUSTER_CPU: '' } })).toEqual({
      url: 'http://b:8080',
      token: 't',
      box: {},
    });
  });

  test('reads process.env when no env is given', () => {
    const saved = { ...process.env };
    Object.assign(process.env, ENV);
    try {
      expect(clusterBridgeConfig().box).toEqual({ image: ENV.SANDBOX_IMAGE, cpu: 0.5, memory: 1024 });
    } finally {
      for (const name of Object.keys(ENV)) if (!(name in saved)) delete process.env[name];
      Object.assign(process.env, saved);
    }
  });

  test('every problem is named at once, and the token is never echoed', () => {
    const bad = { SANDBOX_PROVIDER: 'subprocess', CLUSTER_BRIDGE_URL: 'bridge:8080', CLUSTER_BRIDGE_TOKEN: '', CLUSTER_CPU: 'two', CLUSTER_MEMORY: '512Mi' };
    let err: SandboxConfigError | undefined;
    try {
      ClusterBridgeSandbox.fromEnv({ sessionId: 's', env: bad });
    } catch (e) {
      err = e as SandboxConfigError;
    }
    expect(err).toBeInstanceOf(SandboxConfigError);
    expect(err!.problems).toEqual([
      'SANDBOX_PROVIDER is "subprocess", not "cluster-bridge"',
      'CLUSTER_BRIDGE_URL must be an http(s) URL, got "bridge:8080"',
      'CLUSTER_BRIDGE_TOKEN is unset (the bridge bearer token)',
      'CLUSTER_CPU must be a positive number of cores (e.g. 0.5 or 2), got "two"',
      'CLUSTER_MEMORY must be a positive whole number of MiB (e.g. 512), got "512Mi"',
    ]);
    expect(err!.message).toMatch(/^cluster-bridge sandbox configuration: SANDBOX_PROVIDER is "subprocess"/);

    expect(() => clusterBridgeConfig({ env: { ...ENV, CLUSTER_BRIDGE_TOKEN: 'leak-me', CLUSTER_CPU: '-1' } })).toThrow(/CLUSTER_CPU must be a positive number/);
    expect(() => clusterBridgeConfig({ env: { ...ENV, CLUSTER_BRIDGE_TOKEN: 'leak-me', CLUSTER_CPU: '-1' } })).not.toThrow(/leak-me/);
    expect(() => clusterBridgeConfig({ env: { ...ENV, CLUSTER_MEMORY: '0' } })).toThrow(/CLUSTER_MEMORY/);
    expect(() => clusterBridgeConfig({ env: { ...ENV, CLUSTER_BRIDGE_URL: undefined } })).toThrow(/CLUSTER_BRIDGE_URL is unset/);
    expect(() => clusterBridgeConfig({ env: { ...ENV, SANDBOX_PROVIDER: undefined } })).toThrow(/SANDBOX_PROVIDER is unset/);
  });

  test('provider selection: config.sandbox_provider, then config.type, then SANDBOX_PROVIDER, then subprocess', () => {
    expect(selectSandboxProvider({ config: { sandbox_provider: 'cluster-bridge', type: 'x' }, env: { SANDBOX_PROVIDER: 'y' } })).toEqual({
      provider: 'cluster-bridge',
      source: 'config.sandbox_provider',
    });
    expect(selectSandboxProvider({ config: { type: 'managed-vm' }, env: { SANDBOX_PROVIDER: 'y' } })).toEqual({ provider: 'managed-vm', source: 'config.type' });
    expect(selectSandboxProvider({ config: {}, env: { SANDBOX_PROVIDER: 'cluster-bridge' } })).toEqual({ provider: 'cluster-bridge', source: 'SANDBOX_PROVIDER' });
    expect(selectSandboxProvider({ env: {} })).toEqual({ provider: 'subprocess', source: 'default' });
  });

  test('config.sandbox_provider = cluster-bridge selects it whatever SANDBOX_PROVIDER says', async () => {
    const env = { ...ENV, SANDBOX_PROVIDER: 'subprocess' };
    expect(clusterBridgeSandboxFactory({ env })).toBeUndefined();
    expect(() => ClusterBridgeSandbox.fromEnv({ sessionId: 's', env })).toThrow(SandboxConfigError);

    const { fetch, seen } = scriptedFetch(json(201, CREATED), json(200, EXEC_OK));
    const factory = clusterBridgeSandboxFactory({ env, config: { sandbox_provider: 'cluster-bridge' }, fetch });
    expect(factory).toBeDefined();
    const sandbox = factory!('sess-9');
    expect(sandbox).toBeInstanceOf(ClusterBridgeSandbox);
    await sandbox.exec('true');
    expect(JSON.parse(seen[0]!.body!).sessionId).toBe('sess-9');
    // Selected but misconfigured: the factory fails when the environment loads, not mid-session.
    expect(() => clusterBridgeSandboxFactory({ env: { SANDBOX_PROVIDER: 'cluster-bridge' } })).toThrow(/CLUSTER_BRIDGE_URL is unset/);
  });
});

test('base64 matches Buffer for every length and byte value', () => {
  for (let n = 0; n < 70; n++) {
    const bytes = new Uint8Array(randomBytes(n));
    const encoded = encodeBase64(bytes);
    expect(encoded).toBe(Buffer.from(bytes).toString('base64'));
    expect(decodeBase64(encoded)).toEqual(bytes);
  }
  const all = new Uint8Array(256 * 300).map((_, i) => i % 256);
  expect(encodeBase64(all)).toBe(Buffer.from(all).toString('base64'));
  expect(decodeBase64(Buffer.from(all).toString('base64'))).toEqual(all);
  expect(() => decodeBase64('ab$d')).toThrow(/invalid base64/);
});

describe('the platform port routes (issue 21)', () => {
  test('keepalive, context, snapshot filters, memory mounts, session outputs: method, path, query, body', async () => {
    const { fetch, seen } = scriptedFetch(...Array.from({ length: 8 }, () => json(200, { ok: true })), new Response(new Uint8Array([1, 2, 255]), { status: 200 }));
    const c = client(fetch);
    await c.keepalive('box-1');
    await c.setContext('box-1', { backup: { tenant_id: 't', environment_id: 'e', session_id: 's' } });
    await c.listSnapshots({ tenant_id: 't', environment_id: 'e', session_id: 's' }, { limit: 5 });
    await c.listSnapshots('s');
    await c.mountMemoryStore('box-1', { store_name: 'notes', store_id: 'st-1', read_only: true });
    await c.syncMemoryStore('box-1', 'my notes');
    await c.mountSessionOutputs('box-1', { tenant_id: 't', session_id: 's' });
    await c.listSessionOutputs('sess/1');
    expect(Array.from(await c.readSessionOutput('sess/1', '/dir/a b#.txt'))).toEqual([1, 2, 255]);
    expect(seen.map((r) => [r.method, r.url.pathname + r.url.search, r.body === undefined ? undefined : JSON.parse(r.body)])).toEqual([
      ['POST', '/api/v1/boxes/box-1/keepalive', undefined],
      ['PUT', '/api/v1/boxes/box-1/context', { backup: { tenant_id: 't', environment_id: 'e', session_id: 's' } }],
      ['GET', '/api/v1/snapshots?session_id=s&tenant_id=t&environment_id=e&limit=5', undefined],
      ['GET', '/api/v1/snapshots?session_id=s', undefined],
      ['POST', '/api/v1/boxes/box-1/mounts/memory', { store_name: 'notes', store_id: 'st-1', read_only: true }],
      ['POST', '/api/v1/boxes/box-1/mounts/memory/my%20notes/sync', undefined],
      ['POST', '/api/v1/boxes/box-1/mounts/outputs', { tenant_id: 't', session_id: 's' }],
      ['GET', '/api/v1/sessions/sess%2F1/outputs', undefined],
      ['GET', '/api/v1/sessions/sess%2F1/outputs/dir/a%20b%23.txt', undefined],
    ]);
  });
});

describe('ports and preview links', () => {
  test('portFetch: the app path as given under the port route, the token added, the answer as the app gave it; previews made and revoked', async () => {
    const { fetch, seen } = scriptedFetch(
      new Response('not here', { status: 404, headers: { 'content-type': 'text/plain' } }),
      json(200, { box_id: 'b', port: 8000, url: 'https://8000-b.preview.example.com/?t=x', expires_at: '2026-01-01T00:00:00.000Z' }),
      json(200, { box_id: 'b', port: 8000, url: 'u', expires_at: 'e' }),
      json(200, { box_id: 'b', port: 8000, revoked_at: 'r' }),
    );
    const c = client(fetch);
    const res = await c.portFetch('b', 8000, '/a%2Fb/c?x=1&y', { method: 'PUT', body: 'hi', headers: { 'x-app': '1', authorization: 'Basic app' } });
    expect(res.status).toBe(404);
    expect(await res.text()).toBe('not here');
    expect(seen[0]!.method).toBe('PUT');
    expect(seen[0]!.url.href).toBe('https://bridge.example.com/api/v1/boxes/b/ports/8000/a%2Fb/c?x=1&y');
    expect(seen[0]!.headers).toMatchObject({ authorization: 'Bearer tok', 'x-app': '1' });
    expect(c.portUrl('b', 3000)).toBe('https://bridge.example.com/api/v1/boxes/b/ports/3000/');
    expect((await c.createPreview('b', 8000, { expiresInSeconds: 60 })).url).toBe('https://8000-b.preview.example.com/?t=x');
    expect({ method: seen[1]!.method, path: seen[1]!.url.pathname, body: seen[1]!.body }).toEqual({ method: 'POST', path: '/api/v1/boxes/b/ports/8000/preview', body: '{"expires_in_seconds":60}' });
    await c.createPreview('b', 8000);
    expect(seen[2]!.body).toBe('{}');
    expect(await c.revokePreviews('b', 8000)).toEqual({ box_id: 'b', port: 8000, revoked_at: 'r' });
    expect({ method: seen[3]!.method, path: seen[3]!.url.pathname }).toEqual({ method: 'DELETE', path: '/api/v1/boxes/b/ports/8000/preview' });
    expect(() => c.portUrl('b', 0)).toThrow(/port/);
  });
});
