// The OpenAPI 3.1 document, generated from the same zod schemas that validate requests.
import { z } from 'zod';
import * as S from './schemas.js';

const schema = (s: z.ZodType, io: 'input' | 'output' = 'output') => {
  const json = z.toJSONSchema(s, { io, unrepresentable: 'any' }) as Record<string, unknown>;
  delete json.$schema;
  return json;
};

const jsonBody = (s: z.ZodType) => ({ required: true, content: { 'application/json': { schema: schema(s, 'input') } } });
const ok = (s: z.ZodType, description = 'OK') => ({ description, content: { 'application/json': { schema: schema(s) } } });
const errors = (...codes: number[]) =>
  Object.fromEntries(
    codes.map((code) => [String(code), { description: 'Error', content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } } }]),
  );
const common = errors(401, 429, 500, 503);
const boxId = { name: 'id', in: 'path', required: true, schema: { type: 'string' }, description: 'Box id (the pod name)' };
const query = (name: string, description: string, type = 'string', required = false) => ({ name, in: 'query', required, schema: { type }, description });
const processId = { name: 'pid', in: 'path', required: true, schema: { type: 'string' }, description: 'process_id from POST /boxes/{id}/processes' };
const snapshotId = { name: 'snapshotId', in: 'path', required: true, schema: { type: 'string' }, description: 'snapshot_id from POST /boxes/{id}/snapshots' };
const ndjson = (description: string) => ({ description, content: { 'application/x-ndjson': { schema: schema(S.OutputLine) } } });
const fileParams = [
  boxId,
  { name: 'path', in: 'query', required: true, schema: { type: 'string' }, description: 'File path; relative paths resolve under /workspace' },
  { name: 'base64', in: 'query', required: false, schema: { type: 'boolean' }, description: 'Content as base64' },
];

export function openApiDocument(version: string) {
  return {
    openapi: '3.1.0',
    info: {
      title: 'sandbox-bridge',
      version,
      description: 'Disposable, locked-down sandbox pods ("boxes") for AI-agent runtimes. Every route needs Authorization: Bearer <token>.',
    },
    servers: [{ url: '/api/v1' }],
    security: [{ bearer: [] }],
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } },
      schemas: { Error: schema(S.ErrorBody) },
    },
    paths: {
      '/health': { get: { summary: 'Health and version info', responses: { '200': ok(S.Health), ...common } } },
      '/cluster/info': { get: { summary: 'Cluster metadata', responses: { '200': ok(S.ClusterInfo), ...common } } },
      '/cluster/nodes': { get: { summary: 'Node list', responses: { '200': ok(S.NodeList), ...common } } },
      '/cluster/capacity': {
        get: { summary: 'Requested and allocatable resources of the nodes boxes can run on, and the pool headroom', responses: { '200': ok(S.ClusterCapacity), ...common } },
      },
      '/sandboxes': {
        get: {
          summary: 'Boxes in the sandbox namespace, oldest first; optionally filtered and paged',
          parameters: Object.entries(S.SandboxesQuery.shape).map(([name, field]) => ({
            name,
            in: 'query',
            required: false,
            schema: schema(field.unwrap(), 'input'),
            description: field.description,
          })),
          responses: { '200': ok(S.SandboxList), ...errors(400), ...common },
        },
      },
      '/sandboxes/metrics': {
        get: { summary: 'Box resource usage (needs metrics-server)', responses: { '200': ok(S.PodMetricsList), ...common } },
      },
      '/sandboxes/{podName}/logs': {
        get: {
          summary: 'Box logs (text/plain)',
          parameters: [
            { name: 'podName', in: 'path', required: true, schema: { type: 'string' } },
            { name: 'tailLines', in: 'query', required: false, schema: { type: 'integer', minimum: 0 } },
          ],
          responses: { '200': { description: 'Log text', content: { 'text/plain': { schema: { type: 'string' } } } }, ...errors(400, 404), ...common },
        },
      },
      '/boxes': {
        post: {
          summary: 'Create a box (Idempotency-Key header: the same key within 24 h returns the same box); with snapshot_id, a fork of that snapshot (501 without an object store)',
          parameters: [{ name: 'Idempotency-Key', in: 'header', required: false, schema: { type: 'string', maxLength: 255 } }],
          requestBody: jsonBody(S.CreateBoxRequest),
          responses: { '201': ok(S.BoxCreated, 'Created'), ...errors(400, 403, 404, 413, 501), ...common },
        },
      },
      '/boxes/{id}': {
        delete: {
          summary: "Destroy a box; with a final snapshot (snapshot=true, or the pool's snapshots.onDelete) only once the snapshot is stored",
          parameters: [boxId, query('snapshot', "Take a final snapshot first (default: the pool's snapshots.onDelete)", 'boolean')],
          responses: { '200': ok(S.BoxDeleted), ...errors(400, 404, 501), ...common },
        },
      },
      '/boxes/{id}/snapshots': {
        post: {
          summary: "Snapshot the box: its /workspace (compressed tar) and env, into the object store (501 without one)",
          parameters: [boxId],
          requestBody: { ...jsonBody(S.CreateSnapshotRequest), required: false },
          responses: { '201': ok(S.Snapshot, 'Created'), ...errors(400, 404, 409, 501), ...common },
        },
      },
      '/snapshots': {
        get: {
          summary: "A session's snapshots, newest first",
          parameters: [query('session_id', 'The session', 'string', true), query('limit', 'At most this many (1-100, default 100)', 'integer')],
          responses: { '200': ok(S.SnapshotList), ...errors(400, 501), ...common },
        },
      },
      '/snapshots/{snapshotId}': {
        get: { summary: 'One snapshot (never its env)', parameters: [snapshotId], responses: { '200': ok(S.Snapshot), ...errors(400, 404, 501), ...common } },
        delete: { summary: 'Delete a snapshot', parameters: [snapshotId], responses: { '200': ok(S.SnapshotDeleted), ...errors(400, 404, 501), ...common } },
      },
      '/boxes/{id}/status': {
        get: { summary: 'Box status', parameters: [boxId], responses: { '200': ok(S.BoxStatus), ...errors(404), ...common } },
      },
      '/boxes/{id}/exec': {
        post: {
          summary: 'Run a command (sh -c) in the box; with Accept: application/x-ndjson the output streams as it comes',
          parameters: [boxId],
          requestBody: jsonBody(S.ExecRequest),
          responses: {
            '200': { description: 'The result, or with Accept: application/x-ndjson a stream of lines', content: { 'application/json': { schema: schema(S.ExecResult) }, 'application/x-ndjson': { schema: schema(S.OutputLine) } } },
            ...errors(400, 404, 409),
            ...common,
          },
        },
      },
      '/boxes/{id}/processes': {
        post: {
          summary: 'Start a background process',
          parameters: [boxId],
          requestBody: jsonBody(S.StartProcessRequest),
          responses: { '201': ok(S.ProcessInfo, 'Started'), ...errors(400, 404, 409), ...common },
        },
        get: { summary: 'Background processes, running first', parameters: [boxId], responses: { '200': ok(S.ProcessList), ...errors(404), ...common } },
      },
      '/boxes/{id}/processes/{pid}': {
        get: { summary: 'One background process', parameters: [boxId, processId], responses: { '200': ok(S.ProcessInfo), ...errors(404), ...common } },
      },
      '/boxes/{id}/processes/{pid}/output': {
        get: {
          summary: 'Output from an offset (replay), then with follow=true as it comes until the process exits',
          parameters: [boxId, processId, query('since', 'Byte offset to start from', 'integer'), query('follow', 'Keep streaming', 'boolean')],
          responses: { '200': ndjson('Output lines with offsets, then exit once the process ended'), ...errors(400, 404), ...common },
        },
      },
      '/boxes/{id}/processes/{pid}/stdin': {
        post: {
          summary: "Write to the process's standard input (raw body); eof=true closes it afterwards",
          parameters: [boxId, processId, query('eof', 'Close stdin after this write', 'boolean')],
          requestBody: { required: false, content: { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } },
          responses: { '200': ok(S.StdinWritten), ...errors(404, 409, 413), ...common },
        },
      },
      '/boxes/{id}/processes/{pid}/signal': {
        post: {
          summary: "Signal the process's group",
          parameters: [boxId, processId],
          requestBody: jsonBody(S.SignalRequest),
          responses: { '200': ok(S.ProcessInfo), ...errors(400, 404, 409), ...common },
        },
      },
      '/boxes/{id}/pty': {
        get: {
          summary: 'Interactive terminal (WebSocket upgrade; subprotocol sandbox-bridge.pty.v1). Binary frames: terminal bytes; text frames: {"type":"resize","cols","rows"} or {"type":"eof"}; the bridge sends {"type":"exit","exit_code"} when the shell ends',
          parameters: [boxId, query('cols', 'Columns (default 80)', 'integer'), query('rows', 'Rows (default 24)', 'integer')],
          responses: { '101': { description: 'Switching to WebSocket' }, ...errors(400, 404, 409), ...common },
        },
      },
      '/boxes/{id}/files/list': {
        get: {
          summary: 'Directory listing (symlinks listed, not followed)',
          parameters: [boxId, query('path', 'Directory (default /workspace)'), query('recursive', 'Walk subdirectories', 'boolean'), query('limit', 'At most this many entries', 'integer')],
          responses: { '200': ok(S.FileList), ...errors(400, 403, 404), ...common },
        },
      },
      '/boxes/{id}/archive': {
        get: {
          summary: 'A tar (gzip=true: tar.gz) of a directory or file, streamed',
          parameters: [boxId, query('path', 'Directory or file (default /workspace)'), query('gzip', 'Compress', 'boolean')],
          responses: {
            '200': { description: 'tar stream', content: { 'application/x-tar': { schema: { type: 'string', format: 'binary' } }, 'application/gzip': { schema: { type: 'string', format: 'binary' } } } },
            ...errors(400, 403, 404),
            ...common,
          },
        },
        put: {
          summary: 'Extract a tar or tar.gz into a directory (created if missing); all or nothing; escaping entries, links out, devices refused',
          parameters: [boxId, query('path', 'Target directory (default /workspace)')],
          requestBody: { required: true, content: { 'application/x-tar': { schema: { type: 'string', format: 'binary' } }, 'application/gzip': { schema: { type: 'string', format: 'binary' } } } },
          responses: { '200': ok(S.ArchiveWritten), ...errors(400, 403, 404, 413), ...common },
        },
      },
      '/boxes/{id}/files': {
        get: {
          summary: 'Read a file: JSON, or the raw bytes with Accept: application/octet-stream',
          parameters: fileParams,
          responses: {
            '200': { description: 'OK', content: { 'application/json': { schema: schema(S.FileRead) }, 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } },
            ...errors(400, 403, 404, 413),
            ...common,
          },
        },
        delete: {
          summary: 'Delete a file or (recursive=true) a directory tree',
          parameters: [boxId, query('path', 'File or directory', 'string', true), query('recursive', 'Delete a non-empty directory', 'boolean')],
          responses: { '200': ok(S.FileDeleted), ...errors(400, 403, 404, 409), ...common },
        },
        put: {
          summary: 'Write a file (body is the raw content, or base64 text with base64=true)',
          parameters: fileParams,
          requestBody: { required: true, content: { 'text/plain': { schema: { type: 'string' } }, 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } },
          responses: { '200': ok(S.FileWritten), ...errors(400, 403, 404, 413), ...common },
        },
      },
      '/boxes/{id}/env': {
        post: {
          summary: 'Set environment variables for later execs',
          parameters: [boxId],
          requestBody: jsonBody(S.SetEnvRequest),
          responses: { '200': ok(S.EnvUpdated), ...errors(400, 404, 413), ...common },
        },
      },
      '/openapi.json': { get: { summary: 'This document', responses: { '200': { description: 'OpenAPI 3.1 document' } } } },
    },
  };
}
