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
          summary: 'Create a box',
          requestBody: jsonBody(S.CreateBoxRequest),
          responses: { '201': ok(S.BoxCreated, 'Created'), ...errors(400, 403, 413), ...common },
        },
      },
      '/boxes/{id}': {
        delete: { summary: 'Destroy a box', parameters: [boxId], responses: { '200': ok(S.BoxDeleted), ...errors(404), ...common } },
      },
      '/boxes/{id}/status': {
        get: { summary: 'Box status', parameters: [boxId], responses: { '200': ok(S.BoxStatus), ...errors(404), ...common } },
      },
      '/boxes/{id}/exec': {
        post: {
          summary: 'Run a command (sh -c) in the box',
          parameters: [boxId],
          requestBody: jsonBody(S.ExecRequest),
          responses: { '200': ok(S.ExecResult), ...errors(400, 404, 409), ...common },
        },
      },
      '/boxes/{id}/files': {
        get: { summary: 'Read a file', parameters: fileParams, responses: { '200': ok(S.FileRead), ...errors(400, 403, 404, 413), ...common } },
        put: {
          summary: 'Write a file (body is the raw content, or base64 text with base64=true)',
          parameters: fileParams,
          requestBody: { required: true, content: { 'text/plain': { schema: { type: 'string' } }, 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } },
          responses: { '200': ok(S.FileWritten), ...errors(400, 404, 413), ...common },
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
