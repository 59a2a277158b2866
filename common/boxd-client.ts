// The one place that speaks boxd's protocol (boxd/PROTOCOL.md): routes, the credential header,
// error bodies, frames. Services call these typed methods with a target (pod IP + token) and
// never see a boxd URL. Plain HTTP/1.1 with keep-alive connections per box. Every call has
// deadlines (connect, first byte and idle, total: see BoxdDeadlines), so a frozen boxd or a
// partitioned node ends a call with 503 instead of hanging it until TCP gives up.
import http from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex, Readable } from 'node:stream';
import { BOXD_PORT } from './boxd.js';
import { ERROR_BODY_LIMIT, FENCE_HEADER, TOKEN_HEADER, archiveReadQuery, archiveWriteQuery, boxdRefusal, queryString } from './boxd-archive.js';
import { BridgeError } from './errors.js';

/** Where a box's boxd listens and the credential it accepts. */
export interface BoxdTarget {
  box: string;
  ip: string;
  token: string;
}

/** boxd did not accept a connection (not started yet, or gone): the caller decides what that means. */
export class BoxdUnreachableError extends Error {
  constructor(
    readonly box: string,
    readonly code: string,
  ) {
    super(`boxd of box ${box} is not reachable (${code})`);
  }
}

/**
 * boxd refused a mutating call because a sleep holds the box's fence (PROTOCOL.md "Fence"):
 * nothing of the call ran. The caller aborts the sleep or waits for it (bridge/services/box-connector.ts).
 */
export class BoxdFencedError extends BridgeError {
  constructor(
    readonly box: string,
    readonly epoch: number,
  ) {
    super('conflict', `box ${box} is being put to sleep (fence ${epoch})`, { headers: { 'Retry-After': '1' } });
  }
}

/** The header a fenced refusal carries: the epoch of the fence that refused it. */
/** The ports route (PROTOCOL.md "Ports"); its answers from the app carry PROXIED_HEADER, boxd's own do not. */
const PORT_PREFIX = '/v1/ports/';
const PROXIED_HEADER = 'x-boxd-proxied';

/** A request to a port in the box: path is the app's (escaped, with its query). */
export interface BoxdPortRequest {
  method: string;
  path: string;
  /** Headers for the app, and the X-Boxd-Port-* limits; hop-by-hop headers already removed. */
  headers: http.OutgoingHttpHeaders;
  /** The request body, sent once boxd admitted the request; none: no body. */
  body?: Readable;
}

/** The app's answer (body unread), or for an upgrade it accepted, the connection to it. */
export type BoxdPortAnswer = { res: http.IncomingMessage; upgraded?: undefined } | { res: http.IncomingMessage; upgraded: { socket: Duplex; head: Buffer } };

export interface BoxdExecRequest {
  command: string;
  cwd: string;
  env?: Record<string, string>;
  /** base64 */
  stdin?: string;
  timeout_ms: number;
  max_output_bytes: number;
  max_concurrent: number;
  /** Frames sent together rather than flushed one by one: for an answer read whole (PROTOCOL.md). */
  coalesce?: boolean;
}

export interface BoxdExit {
  exit_code: number;
  signal?: string;
  timed_out: boolean;
  duration_ms: number;
  stdout_bytes: number;
  stderr_bytes: number;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
}

export interface BoxdProcess {
  process_id: string;
  pid: number;
  command: string;
  tag?: string;
  status: 'running' | 'exited';
  started_at: string;
  ended_at?: string;
  exit_code?: number;
  signal?: string;
  output_bytes?: number;
  dropped_bytes?: number;
}

export interface BoxdFileEntry {
  path: string;
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: number;
  modified: string;
}

type Query = Record<string, string | number | boolean | undefined>;

interface SendOptions {
  query?: Query;
  json?: unknown;
  body?: Readable | Buffer;
  contentLength?: number;
  signal?: AbortSignal | undefined;
  /** A health probe: its quiet period fails it at once. */
  probe?: boolean;
}

/** One reading of a box's use (boxd/metrics). */
export interface BoxdMetricsSample {
  time: string;
  cpu: { used_cores: number; usage_seconds: number; limit_cores: number | null; throttled_seconds: number; throttled_periods: number };
  memory: { used_bytes: number; limit_bytes: number | null; oom_kills: number };
  disk: Array<{ path: string; used_bytes: number; limit_bytes: number | null; partial?: boolean }>;
  processes: { count: number; limit: number | null };
  network: { rx_bytes: number; tx_bytes: number };
}

export interface BoxdMetrics extends BoxdMetricsSample {
  cgroup: string;
  interval_seconds: number;
  history?: BoxdMetricsSample[];
}

export interface BoxdClientOptions {
  port?: number;
  /** How long a new connection may take before boxd counts as unreachable (deadlines.connectMs). */
  connectTimeoutMs?: number;
  deadlines?: Partial<BoxdDeadlines>;
  /** The largest JSON answer read from boxd (a file listing of 100,000 entries is ~20 MB). */
  answerLimitBytes?: number;
  /** Memory JSON answers are held against while they are read and parsed. */
  memory?: AnswerMemory;
  /** A call ended by one of its deadlines (metrics). */
  onDeadline?: (deadline: 'connect' | 'idle' | 'total') => void;
}

/**
 * Deadlines of every call to boxd (docs/api.md, "Deadlines of calls into a box"). Quiet periods
 * are not failures by themselves: boxd may be busy (extracting an archive, writing stdin to a
 * process that reads slowly) or the call's own reader slow. So when a call has moved no byte
 * either way for idleMs (before the answer's first byte, or in a body), the client asks boxd's
 * health on another connection: the call goes on if boxd answers within idleMs, and ends with
 * 503 if it does not (a frozen boxd, a partitioned node). Totals bound what a call may hold.
 */
export interface BoxdDeadlines {
  /** A new TCP connection (then boxd counts as unreachable, and a call that never reached it may be retried). */
  connectMs: number;
  /** No byte either way for this long (first byte of the answer, or idle in a body): probe boxd's health. */
  idleMs: number;
  /** Total of a call answered whole (env, processes, stdin, signals, health, fence). */
  callMs: number;
  /** Total of a file or archive transfer, a listing or a delete (sizes up to 50 MiB, trees up to 100,000 entries). */
  transferMs: number;
}

export const DEFAULT_BOXD_DEADLINES: BoxdDeadlines = { connectMs: 2000, idleMs: 5000, callMs: 60_000, transferMs: 600_000 };

/** An exec's total deadline is its command's timeout plus this: time for boxd to kill the tree and answer. */
export const EXEC_GRACE_MS = 15_000;

/** Memory for boxd's JSON answers (the bridge's byte budget): take throws when there is none, e.g. a 503. */
export interface AnswerMemory {
  /** Holds n bytes; the returned function gives them back. */
  take(n: number): () => void;
}

/** A call to boxd ended by a deadline: the box (its agent, or its node) is not answering. */
export class BoxdDeadlineError extends BridgeError {
  constructor(box: string, what: string) {
    super('cluster_unavailable', `box ${box} ${what}`, { headers: { 'Retry-After': '5' } });
  }
}

/** A JSON answer takes about this many times its size while read, parsed and answered from. */
const ANSWER_HOLD_FACTOR = 3;
/**
 * The first bytes of an answer are not held against the memory: most answers are this small,
 * and a spent budget must not fail health probes, env writes or process lists.
 */
const ANSWER_FREE_BYTES = 64 * 1024;
/** A health probe's result is shared with every call to the box that falls quiet this soon after. */
const PROBE_SHARE_MS = 1000;

/**
 * Which deadlines a call has, by route: a total for calls answered whole, a longer one for
 * transfers, the command's timeout for an exec; none for what is meant to stay open (a
 * terminal, followed output), which the idle probe alone watches. Probes have no probe.
 */
type DeadlineClass = { kind: 'call' | 'transfer' | 'exec' | 'open'; totalMs?: number } | { kind: 'probe'; totalMs?: undefined };

function deadlineOf(d: BoxdDeadlines, method: string, path: string, query: Query | undefined, json: unknown): DeadlineClass {
  if (path === '/v1/exec') return { kind: 'exec', totalMs: Number((json as { timeout_ms?: number } | undefined)?.timeout_ms ?? 0) + EXEC_GRACE_MS };
  if (path === '/v1/pty') return { kind: 'open' };
  // Port traffic may legitimately stay open (a WebSocket, server-sent events, a long poll): the
  // idle probe watches boxd, the port service bounds the app's first byte and quiet periods.
  if (path.startsWith(PORT_PREFIX)) return { kind: 'open' };
  if (/^\/v1\/processes\/[^/]+\/output$/.test(path)) return query?.follow ? { kind: 'open' } : { kind: 'transfer', totalMs: d.transferMs };
  if (path === '/v1/files/watch') return { kind: 'open' }; // a watch stays open; boxd ends it
  if (path.startsWith('/v1/files') || path === '/v1/archive') return { kind: 'transfer', totalMs: d.transferMs };
  return { kind: 'call', totalMs: d.callMs };
}

export class BoxdClient {
  private readonly port: number;
  private readonly deadlines: BoxdDeadlines;
  private readonly answerLimit: number;
  // Idle connections are dropped after 30 s; boxd keeps them longer, so we always close first
  // and never reuse a socket boxd is closing.
  private readonly agent = new http.Agent({ keepAlive: true, timeout: 30_000, maxFreeSockets: 1024, scheduling: 'lifo' });
  /** Health probes in flight or just answered, by box and address (shared by its quiet calls). */
  private readonly probes = new Map<string, Promise<boolean>>();

  constructor(private readonly options: BoxdClientOptions = {}) {
    this.port = options.port ?? BOXD_PORT;
    this.deadlines = { ...DEFAULT_BOXD_DEADLINES, ...(options.connectTimeoutMs ? { connectMs: options.connectTimeoutMs } : {}), ...options.deadlines };
    this.answerLimit = options.answerLimitBytes ?? 32 * 1024 * 1024;
  }

  close(): void {
    this.agent.destroy();
  }

  health(t: BoxdTarget, signal?: AbortSignal): Promise<{ status: string; version: string }> {
    return this.json(t, 'GET', '/v1/health', { signal });
  }

  /** The exec's frames: start, stdout/stderr, exit. */
  exec(t: BoxdTarget, req: BoxdExecRequest, signal?: AbortSignal): Promise<http.IncomingMessage> {
    return this.send(t, 'POST', '/v1/exec', { json: req, signal });
  }

  setEnv(t: BoxdTarget, vars: Record<string, string>, signal?: AbortSignal): Promise<{ count: number }> {
    return this.json(t, 'POST', '/v1/env', { json: { set: vars }, signal });
  }

  startProcess(
    t: BoxdTarget,
    req: { command: string; cwd: string; env?: Record<string, string>; tag?: string; max_processes: number },
    signal?: AbortSignal,
  ): Promise<BoxdProcess> {
    return this.json(t, 'POST', '/v1/processes', { json: req, signal });
  }

  /** How many calls boxd is serving now (idle sleep leaves a box with any at work awake). */
  activity(t: BoxdTarget, signal?: AbortSignal): Promise<{ calls: number; fence: number }> {
    return this.json(t, 'GET', '/v1/activity', { signal });
  }

  /**
   * Fences the box for a sleep: from now on boxd refuses mutating calls (BoxdFencedError) and
   * holds its background processes stopped, until unfence with an epoch at least this one.
   * Answers how many calls were at work when the fence went up (a sleep gives up when any were).
   */
  fence(t: BoxdTarget, epoch: number, signal?: AbortSignal): Promise<{ epoch: number; calls: number }> {
    return this.json(t, 'POST', '/v1/fence', { json: { epoch }, signal });
  }

  /** Lifts the fence of this epoch (or an older one); lifted is false when no fence was up. */
  unfence(t: BoxdTarget, epoch: number, signal?: AbortSignal): Promise<{ lifted: boolean }> {
    return this.json(t, 'DELETE', '/v1/fence', { query: { epoch }, signal });
  }

  listProcesses(t: BoxdTarget, signal?: AbortSignal): Promise<{ processes: BoxdProcess[] }> {
    return this.json(t, 'GET', '/v1/processes', { signal });
  }

  getProcess(t: BoxdTarget, id: string, signal?: AbortSignal): Promise<BoxdProcess> {
    return this.json(t, 'GET', `/v1/processes/${encodeURIComponent(id)}`, { signal });
  }

  /** Frames: start {offset, dropped}, stdout/stderr from `since`, exit once the process ended. */
  processOutput(t: BoxdTarget, id: string, query: { since?: number; follow?: boolean }, signal?: AbortSignal): Promise<http.IncomingMessage> {
    return this.send(t, 'GET', `/v1/processes/${encodeURIComponent(id)}/output`, { query, signal });
  }

  processStdin(t: BoxdTarget, id: string, data: Buffer, eof: boolean, signal?: AbortSignal): Promise<{ written: number }> {
    return this.json(t, 'POST', `/v1/processes/${encodeURIComponent(id)}/stdin`, { query: { eof }, body: data, signal });
  }

  signalProcess(t: BoxdTarget, id: string, sig: string, signal?: AbortSignal): Promise<BoxdProcess> {
    return this.json(t, 'POST', `/v1/processes/${encodeURIComponent(id)}/signal`, { json: { signal: sig }, signal });
  }

  /** The file's bytes as a stream; Content-Length tells its size. */
  readFile(t: BoxdTarget, path: string, maxBytes: number, signal?: AbortSignal): Promise<http.IncomingMessage> {
    return this.send(t, 'GET', '/v1/files', { query: { path, max_bytes: maxBytes }, signal });
  }

  writeFile(
    t: BoxdTarget,
    path: string,
    body: Readable | Buffer,
    opts: { maxBytes: number; contentLength?: number; signal?: AbortSignal | undefined },
  ): Promise<{ path: string; size: number }> {
    return this.json(t, 'PUT', '/v1/files', {
      query: { path, max_bytes: opts.maxBytes },
      body,
      ...(opts.contentLength !== undefined ? { contentLength: opts.contentLength } : {}),
      signal: opts.signal,
    });
  }

  listFiles(
    t: BoxdTarget,
    query: { path: string; recursive: boolean; limit: number },
    signal?: AbortSignal,
  ): Promise<{ path: string; entries: BoxdFileEntry[]; truncated: boolean }> {
    return this.json(t, 'GET', '/v1/files/list', { query, signal });
  }

  deleteFile(t: BoxdTarget, path: string, recursive: boolean, signal?: AbortSignal): Promise<{ path: string; deleted: boolean }> {
    return this.json(t, 'DELETE', '/v1/files', { query: { path, recursive }, signal });
  }

  /** A file watch's NDJSON lines (PROTOCOL.md "File watch"): ready, events, overflow, end. */
  watchFiles(t: BoxdTarget, query: { path: string; recursive: boolean; max_watches: number }, signal?: AbortSignal): Promise<http.IncomingMessage> {
    return this.send(t, 'GET', '/v1/files/watch', { query, signal });
  }

  /** The box's use now and, with since (RFC 3339), the samples boxd kept after it (PROTOCOL.md "Metrics"). */
  metrics(t: BoxdTarget, since: string | undefined, signal?: AbortSignal): Promise<BoxdMetrics> {
    return this.json(t, 'GET', '/v1/metrics', { query: { since }, signal });
  }

  /** A tar stream of path (a directory's contents, or one file). */
  readArchive(
    t: BoxdTarget,
    path: string,
    gzip: boolean,
    signal?: AbortSignal,
    limits?: { maxBytes: number; maxEntries: number },
  ): Promise<http.IncomingMessage> {
    // With limits, boxd refuses (413) a tree over them before it sends a byte.
    const query = archiveReadQuery(path, gzip, limits);
    return this.send(t, 'GET', '/v1/archive', { query, signal });
  }

  writeArchive(
    t: BoxdTarget,
    path: string,
    body: Readable,
    opts: { maxBytes: number; maxEntries: number; contentLength?: number; signal?: AbortSignal | undefined; replace?: boolean },
  ): Promise<{ path: string; entries: number; bytes: number }> {
    return this.json(t, 'PUT', '/v1/archive', {
      // replace: path ends up holding exactly the archive (PROTOCOL.md).
      query: archiveWriteQuery(path, opts),
      body,
      ...(opts.contentLength !== undefined ? { contentLength: opts.contentLength } : {}),
      signal: opts.signal,
    });
  }

  /**
   * A request to a port an app in the box listens on (PROTOCOL.md "Ports"). Resolves with the
   * app's answer, whatever its status, or the upgraded connection; boxd's own refusals (a fence,
   * the box's connection bound, nothing listening) reject like every call's errors. A body is
   * sent only once boxd admitted the request (100-continue), so a refused request leaves it unread
   * and may be sent again.
   */
  toPort(t: BoxdTarget, port: number, r: BoxdPortRequest, signal?: AbortSignal): Promise<BoxdPortAnswer> {
    return new Promise((resolve, reject) => {
      const headers = { ...r.headers, ...(r.body ? { expect: '100-continue' } : {}) };
      const req = this.request(t, r.method, `${PORT_PREFIX}${port}${r.path}`, undefined, signal, headers, reject);
      let continued = false;
      const own = (res: http.IncomingMessage) => {
        // boxd's own answer: an error. Its request was refused before its body went: the socket goes.
        const done = r.body && !continued ? () => req.destroy() : () => undefined;
        if (res.statusCode === 404) {
          res.resume();
          done();
          return reject(new BridgeError('conflict', `box ${t.box} has an agent older than the ports route; create a new box`));
        }
        void errorOf(res, t.box).then(reject, reject).finally(done);
      };
      req.on('response', (res) => (res.headers[PROXIED_HEADER] === '1' ? resolve({ res }) : own(res)));
      req.on('upgrade', (res, socket, head) => {
        if (res.headers[PROXIED_HEADER] === '1') return resolve({ res, upgraded: { socket, head } });
        socket.destroy();
        reject(new BridgeError('internal_error', `box ${t.box} switched protocols without its app`));
      });
      if (!r.body) return void req.end();
      const body = r.body;
      body.on('error', (err) => req.destroy(err));
      req.once('continue', () => {
        continued = true;
        body.pipe(req);
      });
    });
  }

  /** Opens a terminal: the returned socket carries frames both ways (PROTOCOL.md "PTY"). */
  pty(t: BoxdTarget, query: { cols: number; rows: number; cwd?: string; command?: string }, signal?: AbortSignal): Promise<{ socket: Duplex; head: Buffer }> {
    return new Promise((resolve, reject) => {
      const req = this.request(t, 'GET', '/v1/pty', query, signal, { connection: 'Upgrade', upgrade: 'boxd-frames' }, reject);
      req.on('upgrade', (_res, socket, head) => resolve({ socket, head }));
      req.on('response', (res) => {
        void errorOf(res, t.box).then(reject, reject);
      });
      req.end();
    });
  }

  private async json<T>(t: BoxdTarget, method: string, path: string, opts: SendOptions): Promise<T> {
    const res = await this.send(t, method, path, opts);
    const held: Array<() => void> = [];
    try {
      let free = ANSWER_FREE_BYTES;
      const take = (n: number) => {
        const counted = Math.max(0, n - free);
        free = Math.max(0, free - n);
        if (counted && this.options.memory) held.push(this.options.memory.take(counted * ANSWER_HOLD_FACTOR));
      };
      return JSON.parse((await readAll(res, this.answerLimit, take)).toString('utf8')) as T;
    } finally {
      for (const release of held) release();
    }
  }

  /**
   * Whether boxd answers its health check within the idle deadline, on a connection of its own.
   * One probe per box at a time, its answer shared for a moment, so many quiet calls (terminals,
   * followed output) to one box cost one probe.
   */
  /** What a call made elsewhere (the snapshot worker's archive calls) needs to behave as this client's. */
  workerSettings(): { port: number; deadlines: BoxdDeadlines; alive(t: BoxdTarget): Promise<boolean>; onDeadline?: BoxdClientOptions['onDeadline'] } {
    return { port: this.port, deadlines: this.deadlines, alive: (t) => this.alive(t), onDeadline: this.options.onDeadline };
  }

  private alive(t: BoxdTarget): Promise<boolean> {
    const key = `${t.box}@${t.ip}`;
    let probe = this.probes.get(key);
    if (!probe) {
      probe = this.json(t, 'GET', '/v1/health', { probe: true }).then(
        () => true,
        () => false,
      );
      this.probes.set(key, probe);
      void probe.then(() => setTimeout(() => this.probes.delete(key), Math.min(PROBE_SHARE_MS, this.deadlines.idleMs / 2)).unref());
    }
    return probe;
  }

  /** Sends a request; resolves with a 2xx response (body unread), rejects with the mapped error otherwise. */
  private send(t: BoxdTarget, method: string, path: string, opts: SendOptions): Promise<http.IncomingMessage> {
    return new Promise((resolve, reject) => {
      const headers: http.OutgoingHttpHeaders = {};
      let payload: Buffer | Readable | undefined = opts.body;
      if (opts.json !== undefined) {
        payload = Buffer.from(JSON.stringify(opts.json), 'utf8');
        headers['content-type'] = 'application/json';
      }
      if (Buffer.isBuffer(payload)) headers['content-length'] = payload.length;
      else if (opts.contentLength !== undefined) headers['content-length'] = opts.contentLength;
      const stream = payload !== undefined && !Buffer.isBuffer(payload) ? payload : undefined;
      // A streamed body (an upload) is sent only once boxd accepted the call (100-continue): a
      // call refused before it starts (a sleep's fence, a wrong credential) leaves the stream
      // unread, so the caller may send it again.
      if (stream) headers.expect = '100-continue';
      const req = this.request(t, method, path, opts.query, opts.signal, headers, reject, opts.probe ? { kind: 'probe' } : undefined, opts.json);
      let continued = false;
      req.on('response', (res) => {
        if ((res.statusCode ?? 500) < 300) return resolve(res);
        // Refused before the body was sent: that request can never complete, so its socket goes.
        const done = stream && !continued ? () => req.destroy() : () => undefined;
        void errorOf(res, t.box).then(reject, reject).finally(done);
      });
      if (!stream) req.end(payload);
      else {
        stream.on('error', (err) => req.destroy(err));
        req.once('continue', () => {
          continued = true;
          stream.pipe(req);
        });
      }
    });
  }

  private request(
    t: BoxdTarget,
    method: string,
    path: string,
    query: Query | undefined,
    signal: AbortSignal | undefined,
    headers: http.OutgoingHttpHeaders,
    reject: (err: unknown) => void,
    deadline?: DeadlineClass,
    json?: unknown,
  ): http.ClientRequest {
    const d = this.deadlines;
    const cls = deadline ?? deadlineOf(d, method, path, query, json);
    const req = http.request({
      host: t.ip,
      port: this.port,
      method,
      path: path + queryString(query),
      agent: this.agent,
      headers: { ...headers, [TOKEN_HEADER]: t.token },
      timeout: 0,
    });
    // The caller's signal ends the call as http.request's `signal` option would (the request
    // destroyed, the error the signal's reason), with one listener instead of that option's
    // stream watcher (eos: a listener per stream event), a per-exec cost under load.
    const onAbort = signal ? () => req.destroy(signal.reason instanceof Error ? signal.reason : new Error('aborted')) : undefined;
    if (signal && onAbort) {
      if (signal.aborted) process.nextTick(onAbort);
      else signal.addEventListener('abort', onAbort, { once: true });
    }
    const unlisten = () => {
      if (onAbort) signal?.removeEventListener('abort', onAbort);
    };
    let connected = false;
    let res: http.IncomingMessage | undefined;
    let upgraded: Duplex | undefined;
    let done = false;
    const expired = (which: 'connect' | 'idle' | 'total', err: Error) => {
      if (done) return;
      if (cls.kind !== 'probe') this.options.onDeadline?.(which);
      // Whoever holds the call now sees the error: the answer's reader, the terminal's relay, or send().
      if (upgraded) upgraded.destroy(err);
      else if (res) res.destroy(err);
      else req.destroy(err);
    };
    const total =
      cls.totalMs !== undefined
        ? setTimeout(() => expired('total', new BoxdDeadlineError(t.box, `did not finish the call within ${cls.totalMs} ms`)), cls.totalMs)
        : undefined;
    let unwatch = () => {};
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(total);
      unwatch();
    };

    req.on('socket', (socket) => {
      const watch = () => {
        connected = true;
        if (!done) unwatch = this.watchQuiet(t, socket, cls, (err) => expired('idle', err));
      };
      if (!(socket as { connecting?: boolean }).connecting) return watch();
      const timer = setTimeout(() => {
        if (cls.kind !== 'probe') this.options.onDeadline?.('connect');
        req.destroy(Object.assign(new Error('connect timeout'), { code: 'ETIMEDOUT' }));
      }, d.connectMs);
      socket.once('connect', () => {
        clearTimeout(timer);
        watch();
      });
      socket.once('close', () => clearTimeout(timer));
    });
    req.on('response', (r) => (res = r));
    req.on('upgrade', (_r, socket) => {
      // The connection is the caller's from now on (a terminal): watched until it closes.
      upgraded = socket;
      unlisten();
      socket.once('close', finish);
    });
    req.on('close', () => {
      unlisten();
      if (!upgraded) finish();
    });
    req.on('error', (err: NodeJS.ErrnoException) => {
      if (signal?.aborted) reject(signal.reason ?? err);
      else if (err instanceof BridgeError) reject(err); // a deadline, or the request body failed (e.g. bad base64)
      else if (!connected) reject(new BoxdUnreachableError(t.box, err.code ?? err.message));
      else reject(new BridgeError('cluster_unavailable', `lost the connection to box ${t.box} (${err.code ?? err.message})`, { headers: { 'Retry-After': '1' }, cause: err }));
    });
    return req;
  }

  /**
   * Watches a call's connection for quiet periods (no byte either way for idleMs): each one asks
   * boxd's health; no answer fails the call. Returns the function that stops watching (the
   * connection then goes back to the pool for other calls).
   */
  private watchQuiet(t: BoxdTarget, socket: Socket, cls: DeadlineClass, fail: (err: Error) => void): () => void {
    const idleMs = this.deadlines.idleMs;
    let stopped = false;
    let probing = false;
    const quiet = () => {
      if (stopped || probing) return;
      if (cls.kind === 'probe') return fail(new BoxdDeadlineError(t.box, `did not answer a health check within ${idleMs} ms`));
      probing = true;
      void this.alive(t).then((ok) => {
        probing = false;
        if (stopped) return;
        if (!ok) fail(new BoxdDeadlineError(t.box, `stopped answering (nothing for ${idleMs} ms, and no answer to a health check)`));
        else socket.setTimeout(idleMs); // Node reports a quiet socket once: arm it again
      });
    };
    socket.setTimeout(idleMs);
    socket.on('timeout', quiet);
    return () => {
      stopped = true;
      socket.off('timeout', quiet);
      socket.setTimeout(0);
    };
  }
}

/** boxd's JSON error body as the API's error (its types are the API's; common/boxd-archive.ts says how). */
async function errorOf(res: http.IncomingMessage, box: string): Promise<BridgeError> {
  const status = res.statusCode ?? 500;
  const fenced = boxdRefusal(box, status, res.headers[FENCE_HEADER], undefined);
  if (fenced.fence !== undefined) {
    res.resume();
    return new BoxdFencedError(box, fenced.fence);
  }
  const body = await readAll(res, ERROR_BODY_LIMIT).then(
    (b) => b.toString('utf8'),
    () => undefined,
  );
  const r = boxdRefusal(box, status, undefined, body);
  return r.fence !== undefined ? new BoxdFencedError(box, r.fence) : new BridgeError(r.type, r.message, { headers: r.headers });
}

/**
 * A stream's bytes, at most limit of them (more: the stream is destroyed and the call fails);
 * take (which may throw, e.g. when the replica is short of memory) is told of each chunk first.
 */
export async function readAll(stream: Readable, limit: number, take?: (n: number) => void): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of stream as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > limit) throw new BridgeError('internal_error', `the box's answer is larger than ${limit} bytes`);
      take?.(chunk.length);
      chunks.push(chunk);
    }
  } catch (err) {
    stream.destroy();
    throw err;
  }
  return Buffer.concat(chunks, size);
}
