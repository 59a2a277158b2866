// Every route of /api/v1 as one table: method, path, parameters, request body and answers, each
// as the zod schema the route parses with or the service answers with. The OpenAPI document
// (openapi.ts) is generated from it, and the tests check it against the router (every route
// Express serves is here and the other way round) and every real answer against it.
//
// Adding a route is one entry here beside its handler in routes/*.ts (and its scope in
// http/scopes.ts when it is not under /boxes, /snapshots, /cluster or /sandboxes). The errors every
// route can answer are added by openapi.ts and need not be listed: 401, 429, 500, 503; 403 when a
// scope guards it; 404 when the path names something ({id}, ...); 400 when it has path
// parameters, a query, headers or a body to check; 413 when it takes a body.
import type { z } from 'zod';
import * as S from './schemas.js';

export const JSON_TYPE = 'application/json';
export const NDJSON = 'application/x-ndjson';
export const TEXT = 'text/plain';
export const OCTET = 'application/octet-stream';
export const TAR = 'application/x-tar';
export const GZIP = 'application/gzip';

/**
 * What a body carries per media type: a zod schema (JSON: the whole body; NDJSON: each line), or
 * `bytes` / `text` for raw content.
 */
export type Content = Record<string, z.ZodType | 'bytes' | 'text'>;

export interface ApiResponse {
  description: string;
  /** Absent for an answer without a body (the WebSocket 101). */
  content?: Content;
}

export interface ApiRoute {
  /** Unique, camelCase; what generated clients name the call. */
  operationId: string;
  method: 'get' | 'post' | 'put' | 'patch' | 'delete' | 'head' | 'options';
  /** Under /api/v1, with OpenAPI's {name} for path parameters. */
  path: string;
  summary: string;
  description?: string;
  /** One field per {name} of the path. */
  params?: z.ZodObject;
  /** The schema the route parses req.query with. */
  query?: z.ZodObject;
  headers?: z.ZodObject;
  body?: { required: boolean; description?: string; content: Content };
  /** Successful answers by status. */
  responses: Record<number, ApiResponse>;
  /** Error statuses beyond the ones every route of its kind can answer (see the top of this file). */
  errors?: number[];
  /** A WebSocket route: its subprotocol and the JSON text messages each side sends. */
  websocket?: { subprotocol: string; fromClient: z.ZodType; fromServer: z.ZodType };
  /** Served by the ports proxy (http/ports.ts) for every method, not by an Express route of its own. */
  proxied?: true;
}

const json = (schema: z.ZodType, description = 'OK'): ApiResponse => ({ description, content: { [JSON_TYPE]: schema } });
const jsonBody = (schema: z.ZodType) => ({ required: true, content: { [JSON_TYPE]: schema } });

export const API_ROUTES: ApiRoute[] = [
  // ---- service ----
  {
    operationId: 'getHealth',
    method: 'get',
    path: '/health',
    summary: 'Health, versions and box counts',
    responses: { 200: json(S.Health) },
  },
  {
    operationId: 'getOpenApi',
    method: 'get',
    path: '/openapi.json',
    summary: 'This document',
    responses: { 200: json(S.OpenApiDocumentBody, 'OpenAPI 3.1 document') },
  },

  // ---- cluster views ----
  {
    operationId: 'getClusterInfo',
    method: 'get',
    path: '/cluster/info',
    summary: 'Kubernetes version, platform and node resources summed',
    responses: { 200: json(S.ClusterInfo) },
  },
  {
    operationId: 'listNodes',
    method: 'get',
    path: '/cluster/nodes',
    summary: 'Nodes with their resources and the pool boxes running on each',
    responses: { 200: json(S.NodeList) },
  },
  {
    operationId: 'getCapacity',
    method: 'get',
    path: '/cluster/capacity',
    summary: 'Requested and allocatable resources of the nodes boxes can run on, and the pool headroom',
    responses: { 200: json(S.ClusterCapacity) },
  },
  {
    operationId: 'listSandboxes',
    method: 'get',
    path: '/sandboxes',
    summary: 'Boxes in the sandbox namespace, oldest first; optionally filtered and paged',
    query: S.SandboxesQuery,
    responses: { 200: json(S.SandboxList) },
  },
  {
    operationId: 'getSandboxMetrics',
    method: 'get',
    path: '/sandboxes/metrics',
    summary: 'CPU and memory use of the boxes (from metrics.k8s.io)',
    responses: { 200: json(S.PodMetricsList) },
  },
  {
    operationId: 'getSandboxLogs',
    method: 'get',
    path: '/sandboxes/{podName}/logs',
    summary: 'Log of a box pod',
    params: S.PodParams,
    query: S.LogsQuery,
    responses: { 200: { description: 'Log text', content: { [TEXT]: 'text' } } },
  },

  // ---- boxes ----
  {
    operationId: 'createBox',
    method: 'post',
    path: '/boxes',
    summary: 'Create a box',
    description: 'With snapshot_id, a fork: a new box with that snapshot\'s workspace and env (501 without an object store).',
    headers: S.CreateBoxHeaders,
    body: jsonBody(S.CreateBoxRequest),
    responses: { 201: json(S.BoxCreated, 'Created (or, for a repeated Idempotency-Key, the box the first request made)') },
    errors: [403, 404, 501],
  },
  {
    operationId: 'getBoxStatus',
    method: 'get',
    path: '/boxes/{id}/status',
    summary: 'Box status',
    params: S.BoxParams,
    responses: { 200: json(S.BoxStatus) },
  },
  {
    operationId: 'deleteBox',
    method: 'delete',
    path: '/boxes/{id}',
    summary: 'Destroy a box',
    description: "With a final snapshot (snapshot=true, or the pool's snapshots.onDelete), the box goes only once the snapshot is stored.",
    params: S.BoxParams,
    query: S.DeleteBoxQuery,
    responses: { 200: json(S.BoxDeleted) },
    errors: [409, 501],
  },

  // ---- snapshots ----
  {
    operationId: 'createSnapshot',
    method: 'post',
    path: '/boxes/{id}/snapshots',
    summary: 'Snapshot the box: its /workspace (compressed tar) and env, into the object store',
    params: S.BoxParams,
    body: { required: false, content: { [JSON_TYPE]: S.CreateSnapshotRequest } },
    responses: { 201: json(S.Snapshot, 'Created') },
    errors: [409, 501],
  },
  {
    operationId: 'restoreSnapshot',
    method: 'post',
    path: '/boxes/{id}/restore',
    summary: "Restore a snapshot's workspace into this box: /workspace becomes exactly the snapshot's",
    description:
      'The box keeps its id, env, processes and everything outside /workspace (a fork, POST /boxes with snapshot_id, also takes the snapshot\'s env). The snapshot is extracted whole before anything in /workspace changes (a snapshot refused by the limits, or a store that fails, leaves the box as it was); then the old entries are moved aside and the snapshot\'s moved in. docs/snapshots.md, "Restore into a box".',
    params: S.BoxParams,
    body: jsonBody(S.RestoreRequest),
    responses: { 200: json(S.Restored) },
    errors: [409, 501],
  },
  {
    operationId: 'listSnapshots',
    method: 'get',
    path: '/snapshots',
    summary: "A session's snapshots, newest first",
    query: S.SnapshotsQuery,
    responses: { 200: json(S.SnapshotList) },
    errors: [501],
  },
  {
    operationId: 'getSnapshot',
    method: 'get',
    path: '/snapshots/{id}',
    summary: 'One snapshot (never its env)',
    params: S.SnapshotParams,
    responses: { 200: json(S.Snapshot) },
    errors: [501],
  },
  {
    operationId: 'deleteSnapshot',
    method: 'delete',
    path: '/snapshots/{id}',
    summary: 'Delete a snapshot',
    params: S.SnapshotParams,
    responses: { 200: json(S.SnapshotDeleted) },
    errors: [501],
  },
  {
    operationId: 'setEnv',
    method: 'post',
    path: '/boxes/{id}/env',
    summary: 'Set environment variables for later commands, processes and terminals',
    params: S.BoxParams,
    body: jsonBody(S.SetEnvRequest),
    responses: { 200: json(S.EnvUpdated) },
    errors: [409],
  },

  // ---- commands ----
  {
    operationId: 'exec',
    method: 'post',
    path: '/boxes/{id}/exec',
    summary: 'Run a command (sh -c) in the box',
    description: 'With Accept: application/x-ndjson the output streams as lines as it comes, then an exit line; an error after the stream began is a last error line.',
    params: S.BoxParams,
    body: jsonBody(S.ExecRequest),
    responses: { 200: { description: 'The result, or a stream of output lines', content: { [JSON_TYPE]: S.ExecResult, [NDJSON]: S.OutputLine } } },
    errors: [409],
  },
  {
    operationId: 'startProcess',
    method: 'post',
    path: '/boxes/{id}/processes',
    summary: 'Start a background process',
    params: S.BoxParams,
    body: jsonBody(S.StartProcessRequest),
    responses: { 201: json(S.ProcessInfo, 'Started') },
    errors: [409],
  },
  {
    operationId: 'listProcesses',
    method: 'get',
    path: '/boxes/{id}/processes',
    summary: 'Background processes, running first',
    params: S.BoxParams,
    responses: { 200: json(S.ProcessList) },
    errors: [409],
  },
  {
    operationId: 'getProcess',
    method: 'get',
    path: '/boxes/{id}/processes/{pid}',
    summary: 'One background process',
    params: S.ProcessParams,
    responses: { 200: json(S.ProcessInfo) },
    errors: [409],
  },
  {
    operationId: 'getProcessOutput',
    method: 'get',
    path: '/boxes/{id}/processes/{pid}/output',
    summary: 'Output from an offset (replay), then with follow=true as it comes until the process exits',
    params: S.ProcessParams,
    query: S.ProcessOutputQuery,
    responses: { 200: { description: 'A start line, output lines with offsets, then an exit line once the process ended', content: { [NDJSON]: S.OutputLine } } },
    errors: [409],
  },
  {
    operationId: 'writeProcessStdin',
    method: 'post',
    path: '/boxes/{id}/processes/{pid}/stdin',
    summary: "Write the raw body to the process's standard input; eof=true closes it afterwards",
    params: S.ProcessParams,
    query: S.StdinQuery,
    body: { required: false, content: { [OCTET]: 'bytes' } },
    responses: { 200: json(S.StdinWritten) },
    errors: [409],
  },
  {
    operationId: 'signalProcess',
    method: 'post',
    path: '/boxes/{id}/processes/{pid}/signal',
    summary: "Signal the process's group",
    params: S.ProcessParams,
    body: jsonBody(S.SignalRequest),
    responses: { 200: json(S.ProcessInfo) },
    errors: [409],
  },
  {
    operationId: 'openTerminal',
    method: 'get',
    path: '/boxes/{id}/pty',
    summary: 'Interactive terminal (WebSocket)',
    description:
      `A WebSocket upgrade with subprotocol ${S.PTY_PROTOCOL}; the token may also come as a second subprotocol ` +
      `${S.BEARER_PROTOCOL_PREFIX}<base64url token>. Binary frames carry terminal bytes both ways; text frames from the caller are ` +
      'PtyControl, from the bridge PtyExit (then it closes with 1000). A refused upgrade is an ordinary JSON error answer.',
    params: S.BoxParams,
    query: S.PtyQuery,
    responses: { 101: { description: 'Switching to the WebSocket protocol' } },
    errors: [409],
    websocket: { subprotocol: S.PTY_PROTOCOL, fromClient: S.PtyControl, fromServer: S.PtyExit },
  },

  // ---- files ----
  {
    operationId: 'readFile',
    method: 'get',
    path: '/boxes/{id}/files',
    summary: 'Read a file: JSON, or the raw bytes with Accept: application/octet-stream',
    params: S.BoxParams,
    query: S.FileQuery,
    responses: { 200: { description: 'The file', content: { [JSON_TYPE]: S.FileRead, [OCTET]: 'bytes' } } },
    errors: [403, 409, 413],
  },
  {
    operationId: 'writeFile',
    method: 'put',
    path: '/boxes/{id}/files',
    summary: 'Write a file (parents created); the body is the raw content, or base64 text with base64=true',
    params: S.BoxParams,
    query: S.FileQuery,
    body: { required: true, content: { [OCTET]: 'bytes', [TEXT]: 'text' } },
    responses: { 200: json(S.FileWritten) },
    errors: [403, 409],
  },
  {
    operationId: 'deleteFile',
    method: 'delete',
    path: '/boxes/{id}/files',
    summary: 'Delete a file or (recursive=true) a directory tree',
    params: S.BoxParams,
    query: S.FileDeleteQuery,
    responses: { 200: json(S.FileDeleted) },
    errors: [403, 409],
  },
  {
    operationId: 'listFiles',
    method: 'get',
    path: '/boxes/{id}/files/list',
    summary: 'Directory listing (symlinks listed, not followed)',
    params: S.BoxParams,
    query: S.FileListQuery,
    responses: { 200: json(S.FileList) },
    errors: [403, 409],
  },
  {
    operationId: 'watchFiles',
    method: 'get',
    path: '/boxes/{id}/files/watch',
    summary: 'File-system events as they happen, coalesced and bounded, with overflow lines where events were dropped; never wakes a sleeping box (409) nor keeps it awake',
    description:
      'A ready line once the watch is in place, then create, write, remove, rename, chmod lines (writes of one path within 100 ms are one line), an overflow line where events were left out (a slow reader, the kernel\'s queue), and an end line when the box sleeps (reason sleep), is deleted (deleted) or the watched path goes (removed). A broken connection to the box ends with an error line.',
    params: S.BoxParams,
    query: S.WatchQuery,
    responses: { 200: { description: 'NDJSON watch lines', content: { [NDJSON]: S.WatchEvent } } },
    errors: [403, 409, 413],
  },
  {
    operationId: 'getBoxMetrics',
    method: 'get',
    path: '/boxes/{id}/metrics',
    summary: 'The box\'s CPU, memory, disk, processes and network use now (from its cgroup), and with since the last 10 minutes at 5 s; never wakes a sleeping box (409)',
    params: S.BoxParams,
    query: S.MetricsQuery,
    responses: { 200: json(S.BoxMetrics) },
    errors: [409],
  },
  {
    operationId: 'downloadArchive',
    method: 'get',
    path: '/boxes/{id}/archive',
    summary: 'A tar (gzip=true: tar.gz) of a directory or file, streamed',
    params: S.BoxParams,
    query: S.ArchiveQuery,
    responses: { 200: { description: 'tar stream', content: { [TAR]: 'bytes', [GZIP]: 'bytes' } } },
    errors: [403, 409],
  },
  {
    operationId: 'uploadArchive',
    method: 'put',
    path: '/boxes/{id}/archive',
    summary: 'Extract a tar or tar.gz into a directory (created if missing), all or nothing; escaping entries, links out and devices refused',
    params: S.BoxParams,
    query: S.ArchiveQuery,
    body: { required: true, content: { [TAR]: 'bytes', [GZIP]: 'bytes' } },
    responses: { 200: json(S.ArchiveWritten) },
    errors: [403, 409],
  },

  // ---- the platform port (issue 21): keepalive, contexts, session outputs (routes/platform.ts) ----
  {
    operationId: 'keepalive',
    method: 'post',
    path: '/boxes/{id}/keepalive',
    summary: 'Count as activity for idle sleep, running nothing in the box',
    description: 'A sleeping box is woken (the token has boxes:write, like any call that may wake one); a sleep under way is given up. docs/api.md, "Keepalive".',
    params: S.BoxParams,
    responses: { 200: json(S.KeepaliveResult) },
    errors: [409],
  },
  {
    operationId: 'setContext',
    method: 'put',
    path: '/boxes/{id}/context',
    summary: "Set the box's backup context (labels its later snapshots) and/or outbound context (for the egress gateway)",
    description: 'Kept on the box\'s record; never wakes a sleeping box. A context given replaces the one before; one not given is left as it was.',
    params: S.BoxParams,
    body: jsonBody(S.SetContextRequest),
    responses: { 200: json(S.ContextSet) },
  },
  // ---- egress (docs/api.md "Egress") ----
  {
    operationId: 'getBoxEgress',
    method: 'get',
    path: '/boxes/{id}/egress',
    summary: "The box's egress policy: what it may reach and the hosts it has credentials for (never their values)",
    params: S.BoxParams,
    responses: { 200: json(S.BoxEgress) },
  },
  {
    operationId: 'setBoxEgress',
    method: 'patch',
    path: '/boxes/{id}/egress',
    summary: "Change the box's allow list at run time (each entry within the pool's)",
    description: "Kept on the box's record, where the egress gateway reads it; never wakes a sleeping box. 400 names the entries outside the pool's list; 409 when the pool's egress mode is not gateway.",
    params: S.BoxParams,
    body: jsonBody(S.SetBoxEgressRequest),
    responses: { 200: json(S.BoxEgress) },
    errors: [409],
  },
  {
    operationId: 'setBoxEgressCredentials',
    method: 'put',
    path: '/boxes/{id}/egress/credentials',
    summary: 'Register the headers the egress gateway sets on the box\'s requests to each host (write-only)',
    description: "Replaces the box's credentials ({} removes them). Stored in the box's record Secret, never returned, logged, put in the pod or a snapshot; never wakes a sleeping box. 409 when the pool's egress mode is not gateway.",
    params: S.BoxParams,
    body: jsonBody(S.SetEgressCredentialsRequest),
    responses: { 200: json(S.EgressCredentialsSet) },
    errors: [409],
  },
  {
    operationId: 'mountSessionOutputs',
    method: 'post',
    path: '/boxes/{id}/mounts/outputs',
    summary: "Make the box's /mnt/session/outputs/ the session's outputs",
    description: 'Readable through GET /sessions/{sessionId}/outputs: live while the box runs, from the object store after it sleeps or is destroyed (501 without a store).',
    params: S.BoxParams,
    body: jsonBody(S.MountOutputsRequest),
    responses: { 200: json(S.OutputsMounted) },
    errors: [409, 501],
  },
  {
    operationId: 'listSessionOutputs',
    method: 'get',
    path: '/sessions/{sessionId}/outputs',
    summary: "The session's output files (regular files under /mnt/session/outputs/), by path",
    params: S.SessionParams,
    responses: { 200: json(S.SessionOutputList) },
    errors: [413, 501],
  },
  {
    operationId: 'readSessionOutput',
    method: 'get',
    path: '/sessions/{sessionId}/outputs/{path}',
    summary: 'One output file, raw',
    description: '{path} spans segments (a/b/c.txt); ".", ".." and empty segments are refused with 400.',
    params: S.SessionOutputParams,
    responses: { 200: { description: 'The file', content: { [OCTET]: 'bytes' } } },
    errors: [413, 501],
  },

  // ---- ports and preview links (routes/ports.ts, http/ports.ts; docs/ports.md) ----
  ...(['get', 'head', 'post', 'put', 'patch', 'delete', 'options'] as const).map(
    (method): ApiRoute => ({
      operationId: `port${method[0]!.toUpperCase()}${method.slice(1)}`,
      method,
      path: '/boxes/{id}/ports/{port}/{path}',
      summary: `${method.toUpperCase()} to a port an app in the box listens on`,
      description:
        'Passed to http://127.0.0.1:{port}/{path} in the box by its agent and the answer passed back as the app gave it (any status, ' +
        'any content type; streamed both ways; server-sent events unbuffered). Other methods and WebSocket (any Upgrade) requests pass the same way. ' +
        "The bridge's Authorization is not passed on; the app sees Host localhost:{port} and X-Forwarded-For/-Host/-Proto/-Prefix; Set-Cookie " +
        "is kept to this route's path. Errors of the bridge or the box are JSON: 502 bad_gateway (nothing listens on the port), 504 " +
        "gateway_timeout (no answer in time), 429 (the box's connection limit). Wakes a sleeping box; counts as activity. docs/ports.md.",
      params: S.PortParams,
      responses: { 200: { description: "The app's answer, whatever its status and content type", content: { '*/*': 'bytes' } } },
      errors: [409, 502, 504],
      proxied: true,
    }),
  ),
  {
    operationId: 'createPreview',
    method: 'post',
    path: '/boxes/{id}/ports/{port}/preview',
    summary: 'A link that opens a port of the box in a browser without the bridge token, until it expires',
    description:
      'Signed with PREVIEW_KEY, scoped to the box and the port; served on PREVIEW_URL (a host per box and port, or a path prefix). ' +
      'The body may be empty. Never wakes the box (opening the link does). 501 without PREVIEW_URL and PREVIEW_KEY. ' +
      "This exact path is the bridge's for POST and DELETE (an app's own /preview: another method, or a preview link). docs/ports.md.",
    params: S.PortPreviewParams,
    body: { ...jsonBody(S.CreatePreviewRequest), required: false },
    responses: { 200: json(S.PreviewCreated) },
    errors: [409, 501],
  },
  {
    operationId: 'revokePreviews',
    method: 'delete',
    path: '/boxes/{id}/ports/{port}/preview',
    summary: 'Revoke every preview link to the port made until now',
    description: 'At once on the replica that answers, within 5 s on the others. Links made afterwards work. docs/ports.md.',
    params: S.PortPreviewParams,
    responses: { 200: json(S.PreviewsRevoked) },
    errors: [409, 501],
  },

  // ---- memory stores (routes/mounts.ts; docs/mounts.md) ----
  {
    operationId: 'mountMemoryStore',
    method: 'post',
    path: '/boxes/{id}/mounts/memory',
    summary: "Mount a memory store at /mnt/memory/<store_name>/ (read-only by a read-only mount, or read-write)",
    description:
      "The store's files are the objects under memory/<store_id>/ in the object store. 409 when the box's pool has memory stores off, or the name is mounted as another store or mode; 501 without an object store. Wakes a sleeping box.",
    params: S.BoxParams,
    body: jsonBody(S.MountMemoryRequest),
    responses: { 200: json(S.MemoryMounted) },
    errors: [409, 413, 501],
  },
  {
    operationId: 'syncMemoryStore',
    method: 'post',
    path: '/boxes/{id}/mounts/memory/{storeName}/sync',
    summary: 'Write a read-write memory store back to the object store now',
    description: 'Files changed since the last sync are put, files the box deleted are deleted. Also done before a sleep and before a delete. 409 for a read-only mount; 404 when no store is mounted under that name.',
    params: S.MemoryStoreParams,
    responses: { 200: json(S.MemorySynced) },
    errors: [409, 413, 501],
  },
];
