// The boxd client's deadlines and answer limits, against stand-in boxd servers on loopback:
// a frozen one (accepts, never answers), a slow but alive one, one that trickles forever.
import { EventEmitter } from 'node:events';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { BridgeError } from './errors.js';
import { BoxdClient, BoxdUnreachableError, type BoxdTarget } from './boxd-client.js';

type Handler = (req: http.IncomingMessage, res: http.ServerResponse) => void;

async function boxd(handler: Handler): Promise<{ port: number; close: () => Promise<void> }> {
  const server = http.createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const target: BoxdTarget = { box: 'box-test-0', ip: '127.0.0.1', token: 't' };
const deadlines = { connectMs: 1000, idleMs: 200, callMs: 5000, transferMs: 5000 };
const servers: Array<{ port: number; close: () => Promise<void> }> = [];
const clients: BoxdClient[] = [];
afterEach(async () => {
  for (const c of clients.splice(0)) c.close();
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

async function setup(handler: Handler, options: ConstructorParameters<typeof BoxdClient>[0] = {}) {
  const server = await boxd(handler);
  servers.push(server);
  const seen: string[] = [];
  const client = new BoxdClient({ port: server.port, deadlines, onDeadline: (d) => seen.push(d), ...options });
  clients.push(client);
  return { client, seen };
}

test('a boxd that never answers (frozen) ends a call with 503 within the idle deadline and a failed health probe', async () => {
  const { client, seen } = await setup(() => undefined);
  const started = performance.now();
  await expect(client.listProcesses(target)).rejects.toMatchObject({ type: 'cluster_unavailable', headers: { 'Retry-After': '5' } });
  const ms = performance.now() - started;
  expect(ms).toBeGreaterThanOrEqual(2 * deadlines.idleMs - 20); // quiet, then the probe's own quiet period
  expect(ms).toBeLessThan(2 * deadlines.idleMs + 500);
  expect(seen).toEqual(['idle']);
});

test('a call boxd is busy with goes on while boxd answers its health checks', async () => {
  let probes = 0;
  const { client, seen } = await setup((req, res) => {
    if (req.url === '/v1/health') {
      probes++;
      res.end('{"status":"ok","version":"test"}');
    } else setTimeout(() => res.end('{"processes":[]}'), 5 * deadlines.idleMs);
  });
  expect(await client.listProcesses(target)).toEqual({ processes: [] });
  expect(probes).toBeGreaterThanOrEqual(2);
  expect(seen).toEqual([]);
});

test('a body that stalls halfway ends with 503; bytes that keep coming run until the total deadline', async () => {
  const { client, seen } = await setup((req, res) => {
    if (req.url === '/v1/health') return void res.destroy(); // the probe fails
    res.write('{"processes":[');
    if (req.url === '/v1/processes') return; // then nothing more
    const trickle = setInterval(() => res.write(' '), deadlines.idleMs / 4);
    res.on('close', () => clearInterval(trickle));
  });
  await expect(client.listProcesses(target)).rejects.toMatchObject({ type: 'cluster_unavailable', message: expect.stringMatching(/stopped answering/) });
  const quick = new BoxdClient({ port: servers[0]!.port, deadlines: { ...deadlines, callMs: 1000 }, onDeadline: (d) => seen.push(d) });
  clients.push(quick);
  const started = performance.now();
  await expect(quick.getProcess(target, 'p-1')).rejects.toMatchObject({ type: 'cluster_unavailable', message: expect.stringMatching(/within 1000 ms/) });
  expect(performance.now() - started).toBeLessThan(1500);
  expect(seen).toEqual(['idle', 'total']);
});

test('nothing listening: unreachable at once (a call that never reached boxd may be retried)', async () => {
  const { client } = await setup(() => undefined);
  await servers.pop()!.close();
  await expect(client.health(target)).rejects.toBeInstanceOf(BoxdUnreachableError);
});

test('a JSON answer is held against the memory it takes while read, and one over the limit fails', async () => {
  const big = JSON.stringify({ processes: Array.from({ length: 2000 }, (_, i) => ({ process_id: `p-${i}`, command: 'x'.repeat(100) })) });
  let held = 0;
  let peak = 0;
  const memory = {
    take: (n: number) => {
      held += n;
      peak = Math.max(peak, held);
      return () => (held -= n);
    },
  };
  const { client } = await setup((_req, res) => res.end(big), { memory, answerLimitBytes: big.length });
  expect((await client.listProcesses(target)).processes).toHaveLength(2000);
  expect(peak).toBe(3 * (big.length - 64 * 1024)); // the first 64 KiB of an answer are free
  expect(held).toBe(0);

  const small = new BoxdClient({ port: servers[0]!.port, deadlines, memory, answerLimitBytes: big.length - 1 });
  clients.push(small);
  await expect(small.listProcesses(target)).rejects.toMatchObject({ type: 'internal_error', message: expect.stringMatching(/larger than/) });
  expect(held).toBe(0);

  const refusing = new BoxdClient({
    port: servers[0]!.port,
    deadlines,
    memory: {
      take: () => {
        throw new BridgeError('cluster_unavailable', 'short of memory');
      },
    },
  });
  clients.push(refusing);
  await expect(refusing.listProcesses(target)).rejects.toMatchObject({ type: 'cluster_unavailable' });
});

test('small answers (health checks, env, one process) are read even when the memory is spent', async () => {
  const memory = {
    take: (): (() => void) => {
      throw new BridgeError('cluster_unavailable', 'short of memory');
    },
  };
  const { client } = await setup((_req, res) => res.end('{"status":"ok","version":"test"}'), { memory });
  expect(await client.health(target)).toEqual({ status: 'ok', version: 'test' });
});

test("the caller's signal ends a call, before it is sent or while boxd answers, with the signal's reason, and leaves no listener on the signal", async () => {
  const { client } = await setup((req, res) => {
    if (req.url === '/v1/processes') return void setTimeout(() => res.end('{"processes":[]}'), 50);
    res.writeHead(200, { 'content-type': 'application/octet-stream' });
    res.write('part'); // then nothing: the command runs on
  });
  const reason = new BridgeError('invalid_request', 'the caller disconnected');

  const before = new AbortController();
  before.abort(reason);
  await expect(client.listProcesses(target, before.signal)).rejects.toBe(reason);

  const waiting = new AbortController();
  const call = client.listProcesses(target, waiting.signal);
  setTimeout(() => waiting.abort(reason), 10);
  await expect(call).rejects.toBe(reason);

  const during = new AbortController();
  const res = await client.exec(target, { command: 'x', cwd: '/', timeout_ms: 1000, max_output_bytes: 10, max_concurrent: 1 }, during.signal);
  const ended = new Promise((resolve) => res.once('close', () => resolve('closed')));
  during.abort(reason);
  expect(await ended).toBe('closed');

  const done = new AbortController();
  expect(await client.listProcesses(target, done.signal)).toEqual({ processes: [] });
  await new Promise((r) => setImmediate(r));
  expect([EventEmitter.getEventListeners(done.signal, 'abort').length, EventEmitter.getEventListeners(during.signal, 'abort').length]).toEqual([0, 0]);
});
