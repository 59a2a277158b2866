// createBridgeClient: one typed method per bridge endpoint, nothing more. Session semantics
// (lazy creation, idempotent destroy) live in sandbox.ts.
import { decodeBase64, encodeBase64 } from './base64.js';
import { request, type CallOptions, type FetchLike, type HttpConfig, type RetryOptions } from './http.js';
import { ndjsonEvents, openStream, openTerminal, responseBytes, type Terminal } from './streams.js';
import type {
  ArchiveWritten,
  BoxContext,
  BoxEgress,
  EgressCredentials,
  EgressCredentialsSet,
  SetBoxEgressRequest,
  BoxCreated,
  BoxDeleted,
  BoxStatus,
  ClusterCapacity,
  ClusterInfo,
  CreateBoxRequest,
  CreateSnapshotRequest,
  EnvUpdated,
  ExecRequest,
  ExecResult,
  FileDeleted,
  FileList,
  FileRead,
  FileWritten,
  Health,
  KeepAlive,
  MemoryMount,
  MemorySynced,
  MountMemoryRequest,
  MountOutputsRequest,
  NodeList,
  OpenApiDocument,
  OutputEvent,
  WatchEvent,
  BoxMetrics,
  OutputsMount,
  PodMetricsList,
  PreviewLink,
  PreviewsRevoked,
  ProcessInfo,
  ProcessList,
  ProcessSignal,
  Restored,
  SandboxList,
  SandboxesQuery,
  SessionOutputs,
  SetContextRequest,
  Snapshot,
  SnapshotDeleted,
  SnapshotFilter,
  SnapshotList,
  StartProcessRequest,
  StdinWritten,
} from './types.js';

export interface BridgeClientOptions {
  /** The bridge's base URL, e.g. https://bridge.example.com (a trailing /api/v1 is accepted). */
  url: string;
  /** The bridge's bearer token. */
  token: string;
  /** fetch to use (default: globalThis.fetch); inject one for tests or custom transports. */
  fetch?: FetchLike;
  /** Default deadline per call, retry waits included (default 30000 ms). Exec gets its command timeout plus 30 s. */
  timeoutMs?: number;
  /**
   * Retries of a refused or unavailable call (default 3): a count, or full options. Only calls
   * that cannot take effect twice are repeated; see http.ts (mayRetry).
   */
  retries?: number | RetryOptions;
}

export const DEFAULT_TIMEOUT_MS = 30_000;
/** The bridge's default command timeout (spec: 120000 ms). */
const DEFAULT_EXEC_TIMEOUT_MS = 120_000;
/** Room beyond a command's own timeout for the box to start, the bridge to kill it and answer. */
const EXEC_GRACE_MS = 30_000;
/** Default deadline of calls that move a whole workspace (snapshot, fork, delete with a final snapshot). */
export const SNAPSHOT_TIMEOUT_MS = 600_000;

export interface CreateBoxOptions extends CallOptions {
  /**
   * Sent as the Idempotency-Key header: the bridge answers every create with the same key (within
   * 24 h) with the same box, so the create can be retried safely. Default: a fresh random key per
   * createBox call. Pass your own to make retries across calls (or processes) safe too.
   */
  idempotencyKey?: string;
}

export interface FileReadOptions extends CallOptions {
  /** Ask for base64 content even when the file is valid UTF-8. */
  base64?: boolean;
}

/** GET /sandboxes filter and page. */
export interface SandboxesOptions extends CallOptions {
  sessionId?: string;
  status?: SandboxesQuery['status'];
  /** At most this many boxes (1-1000); the answer's `continue` then fetches the next page. */
  limit?: number;
  continue?: string;
}

export interface BridgeClient {
  readonly url: string;
  health(opts?: CallOptions): Promise<Health>;
  clusterInfo(opts?: CallOptions): Promise<ClusterInfo>;
  nodes(opts?: CallOptions): Promise<NodeList>;
  /** Requested and allocatable resources of the nodes boxes can run on, and the pool's box headroom. */
  getCapacity(opts?: CallOptions): Promise<ClusterCapacity>;
  /** Boxes, oldest first; with a limit, one page (pass the answer's `continue` for the next). */
  sandboxes(opts?: SandboxesOptions): Promise<SandboxList>;
  /** Plain-text logs of a box pod; tailLines keeps the last N lines. */
  logs(podName: string, opts?: CallOptions & { tailLines?: number }): Promise<string>;
  metrics(opts?: CallOptions): Promise<PodMetricsList>;
  /** Creates a box; retried on 429/503 under one Idempotency-Key, so a retry never makes a second box. */
  createBox(req: CreateBoxRequest, opts?: CreateBoxOptions): Promise<BoxCreated>;
  /**
   * Rejects with status 404 / type not_found when the box is already gone. With `snapshot: true`
   * (or the pool's snapshots.onDelete) a final snapshot is taken first and the box deleted only
   * once it is stored; `snapshot: false` skips the pool's.
   */
  deleteBox(boxId: string, opts?: CallOptions & { snapshot?: boolean }): Promise<BoxDeleted>;
  /** Snapshots the box's /workspace and env into the bridge's object store (501 without one). */
  snapshot(boxId: string, req?: CreateSnapshotRequest, opts?: CallOptions): Promise<Snapshot>;
  /**
   * Snapshots newest first: a session's (a string), or those whose context matches every field
   * given (session_id, tenant_id, environment_id; at least one).
   */
  listSnapshots(filter: string | SnapshotFilter, opts?: CallOptions & { limit?: number }): Promise<SnapshotList>;
  getSnapshot(snapshotId: string, opts?: CallOptions): Promise<Snapshot>;
  deleteSnapshot(snapshotId: string, opts?: CallOptions): Promise<SnapshotDeleted>;
  /**
   * A new box restored from a snapshot (a fork): its workspace and env; image, cpu and memory
   * default to the snapshot's. Retried like createBox, under one Idempotency-Key.
   */
  fromSnapshot(snapshotId: string, req: Omit<CreateBoxRequest, 'snapshot_id'>, opts?: CreateBoxOptions): Promise<BoxCreated>;
  /** Makes the box's /workspace exactly the snapshot's; the box keeps its id, env and processes. */
  restoreSnapshot(boxId: string, snapshotId: string, opts?: CallOptions): Promise<Restored>;
  /** Runs a command. Never repeated after it may have started: only a 429 (refused) is retried. */
  exec(boxId: string, req: ExecRequest, opts?: CallOptions): Promise<ExecResult>;
  readFile(boxId: string, path: string, opts?: FileReadOptions): Promise<FileRead>;
  /** Strings are sent as UTF-8 text; bytes as base64 (base64=true), so any content survives. */
  writeFile(boxId: string, path: string, content: string | Uint8Array, opts?: CallOptions): Promise<FileWritten>;
  setEnv(boxId: string, envVars: Record<string, string>, opts?: CallOptions): Promise<EnvUpdated>;
  status(boxId: string, opts?: CallOptions): Promise<BoxStatus>;
  openapi(opts?: CallOptions): Promise<OpenApiDocument>;

  /** Runs a command and yields its output as it comes: stdout/stderr events, then exit. Breaking out of the loop (or the signal) kills the command. */
  execStream(boxId: string, req: ExecRequest, opts?: CallOptions): AsyncGenerator<OutputEvent>;
  /** Starts a background process; it outlives the call and is visible through every bridge replica. */
  startProcess(boxId: string, req: StartProcessRequest, opts?: CallOptions): Promise<ProcessInfo>;
  listProcesses(boxId: string, opts?: CallOptions): Promise<ProcessList>;
  getProcess(boxId: string, processId: string, opts?: CallOptions): Promise<ProcessInfo>;
  /** Output from byte offset `since` (default 0); with follow, until the process exits. Events carry offsets to resume from. */
  processOutput(boxId: string, processId: string, opts?: CallOptions & { since?: number; follow?: boolean }): AsyncGenerator<OutputEvent>;
  writeProcessStdin(boxId: string, processId: string, data: string | Uint8Array, opts?: CallOptions & { eof?: boolean }): Promise<StdinWritten>;
  signalProcess(boxId: string, processId: string, signal: ProcessSignal, opts?: CallOptions): Promise<ProcessInfo>;
  listFiles(boxId: string, path?: string, opts?: CallOptions & { recursive?: boolean; limit?: number }): Promise<FileList>;
  deleteFile(boxId: string, path: string, opts?: CallOptions & { recursive?: boolean }): Promise<FileDeleted>;
  /**
   * File-system events under path as they happen: ready first, then create/write/remove/rename/chmod,
   * overflow where events were dropped (list again to catch up), end (reason sleep, deleted, removed)
   * last. Breaking out of the loop (or the signal) closes the watch. Never wakes a sleeping box
   * (409) nor keeps it awake. No timeout unless opts.timeoutMs is given.
   */
  watchFiles(boxId: string, path?: string, opts?: CallOptions & { recursive?: boolean }): AsyncGenerator<WatchEvent>;
  /** The box's CPU, memory, disk, processes and network use; since: also the samples after it (10 min at 5 s kept). */
  boxMetrics(boxId: string, opts?: CallOptions & { since?: Date | string }): Promise<BoxMetrics>;
  /** The file's raw bytes (streamed by the bridge, never base64). */
  downloadFile(boxId: string, path: string, opts?: CallOptions): Promise<Uint8Array>;
  /** A tar (gzip: tar.gz) of a directory or file, as a stream. */
  downloadArchive(boxId: string, path?: string, opts?: CallOptions & { gzip?: boolean }): Promise<ReadableStream<Uint8Array>>;
  /** Extracts a tar or tar.gz into a directory (created if missing); all or nothing. */
  uploadArchive(boxId: string, path: string, archive: Uint8Array | ReadableStream<Uint8Array>, opts?: CallOptions): Promise<ArchiveWritten>;
  /** An interactive terminal over WebSocket. */
  openTerminal(boxId: string, size?: { cols: number; rows: number }): Terminal;

  // ---- the platform port's routes (issue 21, docs/platform.md) ----
  /** Counts as activity for idle sleep; runs nothing in the box. */
  keepalive(boxId: string, opts?: CallOptions): Promise<KeepAlive>;
  /** The box's egress policy and the hosts it has credentials for (never their values). */
  getEgress(boxId: string, opts?: CallOptions): Promise<BoxEgress>;
  /** Changes the box's allow list (each entry within the pool's); null: the pool's list again. */
  setEgress(boxId: string, req: SetBoxEgressRequest, opts?: CallOptions): Promise<BoxEgress>;
  /** Replaces the headers the egress gateway sets per host for the box ({} removes them); write-only. */
  setEgressCredentials(boxId: string, credentials: EgressCredentials, opts?: CallOptions): Promise<EgressCredentialsSet>;
  /** Records the box's backup context (labels its later snapshots) and/or outbound context. */
  setContext(boxId: string, req: SetContextRequest, opts?: CallOptions): Promise<BoxContext>;
  /** Fills /mnt/memory/<store_name> from the store's objects (read-only: a read-only mount). */
  mountMemoryStore(boxId: string, req: MountMemoryRequest, opts?: CallOptions): Promise<MemoryMount>;
  /** Writes a read-write memory mount's files back to the store now (409 for a read-only one). */
  syncMemoryStore(boxId: string, storeName: string, opts?: CallOptions): Promise<MemorySynced>;
  /** Makes /mnt/session/outputs the session's outputs, readable through listSessionOutputs. */
  mountSessionOutputs(boxId: string, req: MountOutputsRequest, opts?: CallOptions): Promise<OutputsMount>;
  listSessionOutputs(sessionId: string, opts?: CallOptions): Promise<SessionOutputs>;
  /** One output file's raw bytes (path relative to /mnt/session/outputs). */
  readSessionOutput(sessionId: string, path: string, opts?: CallOptions): Promise<Uint8Array>;

  // ---- ports and preview links (docs/ports.md) ----
  /**
   * A request to a port an app in the box listens on (its loopback included), through the bridge
   * with this client's token: the app's answer as it is, any status, its body a stream. `path`
   * is the app's path and query ("/", "/api/items?x=1"), sent as given. The bridge's own errors
   * (502 nothing listening, 504 no answer in time, 429 the box's connection limit) are JSON
   * `{"error"}` answers. Wakes a sleeping box; counts as activity. Never retried.
   */
  portFetch(boxId: string, port: number, path?: string, init?: RequestInit): Promise<Response>;
  /** The URL of a port's route (for a WebSocket client that sends the bearer token itself). */
  portUrl(boxId: string, port: number, path?: string): string;
  /** A link that opens the port in a browser without the bridge token, until it expires (default PREVIEW_TTL_SECONDS). */
  createPreview(boxId: string, port: number, opts?: CallOptions & { expiresInSeconds?: number }): Promise<PreviewLink>;
  /** Every preview link to the port made until now stops working (other replicas within 5 s). */
  revokePreviews(boxId: string, port: number, opts?: CallOptions): Promise<PreviewsRevoked>;
}

export function createBridgeClient(options: BridgeClientOptions): BridgeClient {
  const config = httpConfig(options);
  const box = (id: string) => `/boxes/${encodeURIComponent(id)}`;
  const call = <T>(spec: Parameters<typeof request>[1], opts: CallOptions = {}) =>
    request<T>(config, { ...spec, timeoutMs: opts.timeoutMs ?? spec.timeoutMs, signal: opts.signal });
  const get = <T>(operation: string, path: string, opts?: CallOptions) => call<T>({ operation, method: 'GET', path, expect: 'json' }, opts);

  return {
    url: config.apiUrl,
    health: (opts) => get('health', '/health', opts),
    clusterInfo: (opts) => get('cluster info', '/cluster/info', opts),
    nodes: (opts) => get('nodes', '/cluster/nodes', opts),
    getCapacity: (opts) => get('capacity', '/cluster/capacity', opts),
    sandboxes: (opts = {}) =>
      call(
        {
          operation: 'sandboxes',
          method: 'GET',
          path: '/sandboxes',
          query: { session_id: opts.sessionId, status: opts.status, limit: opts.limit, continue: opts.continue },
          expect: 'json',
        },
        opts,
      ),
    logs: (podName, opts = {}) =>
      call(
        { operation: 'logs', method: 'GET', path: `/sandboxes/${encodeURIComponent(podName)}/logs`, query: { tailLines: opts.tailLines }, expect: 'text' },
        opts,
      ),
    metrics: (opts) => get('metrics', '/sandboxes/metrics', opts),
    createBox: (req, opts = {}) =>
      call({ operation: 'create', method: 'POST', path: '/boxes', json: req, expect: 'json', idempotencyKey: opts.idempotencyKey ?? newIdempotencyKey() }, opts),
    deleteBox: (id, opts = {}) =>
      call(
        {
          operation: 'delete',
          method: 'DELETE',
          path: box(id),
          query: { snapshot: opts.snapshot === undefined ? undefined : String(opts.snapshot) },
          expect: 'json',
          ...(opts.snapshot ? { timeoutMs: SNAPSHOT_TIMEOUT_MS } : {}),
        },
        opts,
      ),
    snapshot: (id, req = {}, opts) =>
      call({ operation: 'snapshot', method: 'POST', path: `${box(id)}/snapshots`, json: req, expect: 'json', timeoutMs: SNAPSHOT_TIMEOUT_MS }, opts),
    listSnapshots: (filter, opts = {}) => {
      const f = typeof filter === 'string' ? { session_id: filter } : filter;
      const query = { session_id: f.session_id, tenant_id: f.tenant_id, environment_id: f.environment_id, limit: opts.limit };
      return call({ operation: 'list snapshots', method: 'GET', path: '/snapshots', query, expect: 'json' }, opts);
    },
    getSnapshot: (snapshotId, opts) => get('get snapshot', `/snapshots/${encodeURIComponent(snapshotId)}`, opts),
    deleteSnapshot: (snapshotId, opts) =>
      call({ operation: 'delete snapshot', method: 'DELETE', path: `/snapshots/${encodeURIComponent(snapshotId)}`, expect: 'json' }, opts),
    restoreSnapshot: (id, snapshotId, opts) =>
      call(
        { operation: 'restore', method: 'POST', path: `${box(id)}/restore`, json: { snapshot_id: snapshotId }, expect: 'json', timeoutMs: SNAPSHOT_TIMEOUT_MS },
        opts,
      ),
    fromSnapshot: (snapshotId, req, opts = {}) =>
      call(
        {
          operation: 'fork',
          method: 'POST',
          path: '/boxes',
          json: { ...req, snapshot_id: snapshotId },
          expect: 'json',
          idempotencyKey: opts.idempotencyKey ?? newIdempotencyKey(),
          timeoutMs: SNAPSHOT_TIMEOUT_MS,
        },
        opts,
      ),
    exec: (id, req, opts) =>
      call(
        {
          operation: 'exec',
          method: 'POST',
          path: `${box(id)}/exec`,
          json: req,
          expect: 'json',
          // A command may legitimately run for its whole timeout: the call's deadline must outlast it.
          timeoutMs: Math.max(config.timeoutMs, (req.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS) + EXEC_GRACE_MS),
        },
        opts,
      ),
    readFile: (id, path, opts = {}) =>
      call(
        { operation: 'read file', method: 'GET', path: `${box(id)}/files`, query: { path, base64: opts.base64 ? 'true' : undefined }, expect: 'json' },
        opts,
      ),
    writeFile: (id, path, content, opts) => {
      const bytes = typeof content !== 'string';
      return call(
        {
          operation: 'write file',
          method: 'PUT',
          path: `${box(id)}/files`,
          query: { path, base64: bytes ? 'true' : undefined },
          text: bytes ? encodeBase64(content) : content,
          expect: 'json',
        },
        opts,
      );
    },
    setEnv: (id, envVars, opts) => call({ operation: 'set env', method: 'POST', path: `${box(id)}/env`, json: { envVars }, expect: 'json' }, opts),
    status: (id, opts) => get('status', `${box(id)}/status`, opts),
    openapi: (opts) => get('openapi', '/openapi.json', opts),

    async *execStream(id, req, opts = {}) {
      const response = await openStream(config, {
        operation: 'exec',
        method: 'POST',
        path: `${box(id)}/exec`,
        json: req,
        accept: 'application/x-ndjson',
        timeoutMs: opts.timeoutMs ?? (req.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS) + EXEC_GRACE_MS,
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
      yield* ndjsonEvents('exec', response);
    },
    startProcess: (id, req, opts) => call({ operation: 'start process', method: 'POST', path: `${box(id)}/processes`, json: req, expect: 'json' }, opts),
    listProcesses: (id, opts) => get('list processes', `${box(id)}/processes`, opts),
    getProcess: (id, pid, opts) => get('get process', `${box(id)}/processes/${encodeURIComponent(pid)}`, opts),
    async *processOutput(id, pid, opts = {}) {
      const response = await openStream(config, {
        operation: 'process output',
        method: 'GET',
        path: `${box(id)}/processes/${encodeURIComponent(pid)}/output`,
        query: { since: opts.since, follow: opts.follow ? 'true' : undefined },
        accept: 'application/x-ndjson',
        ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}),
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
      yield* ndjsonEvents('process output', response);
    },
    writeProcessStdin: (id, pid, data, opts = {}) =>
      call(
        {
          operation: 'process stdin',
          method: 'POST',
          path: `${box(id)}/processes/${encodeURIComponent(pid)}/stdin`,
          query: { eof: opts.eof ? 'true' : undefined },
          ...(typeof data === 'string' ? { text: data } : { bytes: data }),
          expect: 'json',
        },
        opts,
      ),
    signalProcess: (id, pid, signal, opts) =>
      call({ operation: 'signal process', method: 'POST', path: `${box(id)}/processes/${encodeURIComponent(pid)}/signal`, json: { signal }, expect: 'json' }, opts),
    listFiles: (id, path = '.', opts = {}) =>
      call(
        { operation: 'list files', method: 'GET', path: `${box(id)}/files/list`, query: { path, recursive: opts.recursive ? 'true' : undefined, limit: opts.limit }, expect: 'json' },
        opts,
      ),
    async *watchFiles(id, path = '.', opts = {}) {
      const response = await openStream(config, {
        operation: 'watch files',
        method: 'GET',
        path: `${box(id)}/files/watch`,
        query: { path, recursive: opts.recursive ? 'true' : undefined },
        accept: 'application/x-ndjson',
        ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}),
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
      for await (const line of ndjsonEvents('watch files', response)) yield line as unknown as WatchEvent;
    },
    boxMetrics: (id, opts = {}) =>
      call(
        {
          operation: 'box metrics',
          method: 'GET',
          path: `${box(id)}/metrics`,
          query: { since: opts.since instanceof Date ? opts.since.toISOString() : opts.since },
          expect: 'json',
        },
        opts,
      ),
    deleteFile: (id, path, opts = {}) =>
      call({ operation: 'delete file', method: 'DELETE', path: `${box(id)}/files`, query: { path, recursive: opts.recursive ? 'true' : undefined }, expect: 'json' }, opts),
    async downloadFile(id, path, opts = {}) {
      const response = await openStream(config, {
        operation: 'download file',
        method: 'GET',
        path: `${box(id)}/files`,
        query: { path },
        accept: 'application/octet-stream',
        timeoutMs: opts.timeoutMs ?? config.timeoutMs,
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
      return responseBytes(response);
    },
    async downloadArchive(id, path = '.', opts = {}) {
      const response = await openStream(config, {
        operation: 'download archive',
        method: 'GET',
        path: `${box(id)}/archive`,
        query: { path, gzip: opts.gzip ? 'true' : undefined },
        accept: opts.gzip ? 'application/gzip' : 'application/x-tar',
        ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}),
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
      return response.body ?? new ReadableStream({ start: (c) => c.close() });
    },
    async uploadArchive(id, path, archive, opts = {}) {
      const response = await openStream(config, {
        operation: 'upload archive',
        method: 'PUT',
        path: `${box(id)}/archive`,
        query: { path },
        body: archive,
        accept: 'application/json',
        timeoutMs: opts.timeoutMs ?? config.timeoutMs,
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
      return (await response.json()) as ArchiveWritten;
    },
    openTerminal: (id, size = { cols: 80, rows: 24 }) => openTerminal(config, `${box(id)}/pty`, size),

    keepalive: (id, opts) => call({ operation: 'keepalive', method: 'POST', path: `${box(id)}/keepalive`, expect: 'json' }, opts),
    getEgress: (id, opts) => get('get egress', `${box(id)}/egress`, opts),
    setEgress: (id, req, opts) => call({ operation: 'set egress', method: 'PATCH', path: `${box(id)}/egress`, json: req, expect: 'json' }, opts),
    setEgressCredentials: (id, credentials, opts) =>
      call({ operation: 'set egress credentials', method: 'PUT', path: `${box(id)}/egress/credentials`, json: credentials, expect: 'json' }, opts),
    setContext: (id, req, opts) => call({ operation: 'set context', method: 'PUT', path: `${box(id)}/context`, json: req, expect: 'json' }, opts),
    mountMemoryStore: (id, req, opts) =>
      call({ operation: 'mount memory store', method: 'POST', path: `${box(id)}/mounts/memory`, json: req, expect: 'json', timeoutMs: SNAPSHOT_TIMEOUT_MS }, opts),
    syncMemoryStore: (id, storeName, opts) =>
      call(
        { operation: 'sync memory store', method: 'POST', path: `${box(id)}/mounts/memory/${encodeURIComponent(storeName)}/sync`, expect: 'json', timeoutMs: SNAPSHOT_TIMEOUT_MS },
        opts,
      ),
    mountSessionOutputs: (id, req, opts) => call({ operation: 'mount session outputs', method: 'POST', path: `${box(id)}/mounts/outputs`, json: req, expect: 'json' }, opts),
    listSessionOutputs: (sessionId, opts) => get('list session outputs', `/sessions/${encodeURIComponent(sessionId)}/outputs`, opts),
    async readSessionOutput(sessionId, path, opts = {}) {
      // Each segment encoded on its own: the slashes are the route's, the rest is data.
      const rest = path.replace(/^\/+/, '').split('/').map(encodeURIComponent).join('/');
      const response = await openStream(config, {
        operation: 'read session output',
        method: 'GET',
        path: `/sessions/${encodeURIComponent(sessionId)}/outputs/${rest}`,
        accept: 'application/octet-stream',
        timeoutMs: opts.timeoutMs ?? config.timeoutMs,
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
      return responseBytes(response);
    },

    portFetch: (id, port, path = '/', init = {}) => {
      const headers = new Headers(init.headers);
      headers.set('authorization', `Bearer ${config.token}`);
      return config.fetch(portUrlOf(config.apiUrl, box(id), port, path), { ...init, headers });
    },
    portUrl: (id, port, path = '/') => portUrlOf(config.apiUrl, box(id), port, path),
    createPreview: (id, port, opts = {}) =>
      call(
        {
          operation: 'create preview',
          method: 'POST',
          path: `${box(id)}/ports/${portNumber(port)}/preview`,
          json: opts.expiresInSeconds === undefined ? {} : { expires_in_seconds: opts.expiresInSeconds },
          expect: 'json',
        },
        opts,
      ),
    revokePreviews: (id, port, opts) => call({ operation: 'revoke previews', method: 'DELETE', path: `${box(id)}/ports/${portNumber(port)}/preview`, expect: 'json' }, opts),
  };
}

function portNumber(port: number): number {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new TypeError(`port must be an integer from 1 to 65535, got ${port}`);
  return port;
}

/** /api/v1/boxes/<id>/ports/<port>/<path>: the app's path and query as given, one leading slash. */
function portUrlOf(apiUrl: string, boxPath: string, port: number, path: string): string {
  return `${apiUrl}${boxPath}/ports/${portNumber(port)}/${path.replace(/^\/+/, '')}`;
}

/** A random key (Web Crypto, present in Node, browsers and edge isolates alike). */
export function newIdempotencyKey(): string {
  return globalThis.crypto.randomUUID();
}

/** The bytes of a file read, whichever encoding the bridge chose. */
export function fileBytes(file: FileRead): Uint8Array {
  return file.encoding === 'base64' ? decodeBase64(file.content) : new TextEncoder().encode(file.content);
}

function httpConfig(options: BridgeClientOptions): HttpConfig {
  let parsed: URL;
  try {
    parsed = new URL(options.url);
  } catch {
    throw new TypeError(`bridge url ${JSON.stringify(options.url)} is not a valid URL`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw new TypeError(`bridge url must be http(s), got ${JSON.stringify(options.url)}`);
  }
  if (!options.token) throw new TypeError('bridge token is empty');
  const base = `${parsed.origin}${parsed.pathname}`.replace(/\/+$/, '');
  const apiUrl = base.endsWith('/api/v1') ? base : `${base}/api/v1`;

  const fetchImpl = options.fetch ?? (globalThis.fetch ? globalThis.fetch.bind(globalThis) : undefined);
  if (!fetchImpl) throw new TypeError('no fetch available: pass one as options.fetch');
  const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  if (!(timeoutMs > 0)) throw new TypeError(`timeoutMs must be positive, got ${timeoutMs}`);
  const retry = typeof options.retries === 'number' ? { max: options.retries } : (options.retries ?? {});
  return {
    apiUrl,
    token: options.token,
    fetch: fetchImpl,
    timeoutMs,
    retry: { max: retry.max ?? 3, baseDelayMs: retry.baseDelayMs ?? 200, maxDelayMs: retry.maxDelayMs ?? 5000, onRetry: retry.onRetry },
  };
}
