// The OpenAPI 3.1 document, generated from the route table (api-routes.ts) and the zod schemas
// it names: parameters from the schemas the routes parse with, request bodies in their input
// form, answers in their output form. Schemas exported from schemas.ts become named components.
import { z } from 'zod';
import { ERROR_STATUS, type ErrorType } from '../common/errors.js';
import { API_ROUTES, JSON_TYPE, NDJSON, type ApiRoute, type Content } from './api-routes.js';
import { requiredScope } from './http/scopes.js';
import * as S from './schemas.js';

type JsonSchema = Record<string, unknown>;

export interface OpenApiOperation {
  operationId: string;
  summary: string;
  description?: string;
  security: Array<Record<string, string[]>>;
  parameters?: Array<{ name: string; in: 'path' | 'query' | 'header'; required: boolean; description?: string; schema: JsonSchema }>;
  requestBody?: { required: boolean; description?: string; content: Record<string, { schema: JsonSchema }> };
  responses: Record<string, { description: string; content?: Record<string, { schema: JsonSchema }> } | { $ref: string }>;
  'x-websocket'?: { subprotocol: string; clientTextFrames: JsonSchema; serverTextFrames: JsonSchema };
}

export interface OpenApiDocument {
  openapi: '3.1.0';
  info: { title: string; version: string; description: string };
  servers: Array<{ url: string }>;
  security: Array<Record<string, string[]>>;
  components: {
    securitySchemes: Record<string, JsonSchema>;
    schemas: Record<string, JsonSchema>;
    responses: Record<string, { description: string; headers?: Record<string, JsonSchema>; content: Record<string, { schema: JsonSchema }> }>;
  };
  paths: Record<string, Partial<Record<ApiRoute['method'], OpenApiOperation>>>;
}

const SCHEMA_REF = '#/components/schemas/';
const RESPONSE_REF = '#/components/responses/';

/** The statuses every route of its kind can answer (api-routes.ts says which). */
export function errorStatuses(route: ApiRoute): number[] {
  const statuses = new Set([401, 429, 500, 503, ...(route.errors ?? [])]);
  if (requiredScope(route.method, route.path) !== undefined) statuses.add(403);
  if (pathParameterNames(route.path).length) statuses.add(404);
  if (route.params || route.query || route.headers || route.body) statuses.add(400);
  if (route.body) statuses.add(413);
  return [...statuses].sort((a, b) => a - b);
}

export const pathParameterNames = (path: string) => [...path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1]!);

/** Names of the schemas exported by schemas.ts, so components carry the contract's own names. */
const NAMES = new Map<unknown, string>(Object.entries(S).flatMap(([name, value]) => (value instanceof z.ZodType ? [[value, name] as const] : [])));

/** Collects the schemas an io direction uses and renders them as components, nested ones by $ref. */
class Components {
  private readonly registries = { input: z.registry<{ id: string }>(), output: z.registry<{ id: string }>() };

  ref(schema: z.ZodType, io: 'input' | 'output'): JsonSchema {
    const name = NAMES.get(schema);
    if (!name) throw new Error(`a schema in api-routes.ts is not exported from schemas.ts, so the document cannot name it: ${JSON.stringify(z.toJSONSchema(schema, { unrepresentable: 'any' })).slice(0, 120)}`);
    if (!this.registries[io].has(schema)) this.registries[io].add(schema, { id: name });
    return { $ref: SCHEMA_REF + name };
  }

  render(): Record<string, JsonSchema> {
    const out: Record<string, JsonSchema> = {};
    for (const io of ['input', 'output'] as const) {
      const { schemas } = z.toJSONSchema(this.registries[io], { io, unrepresentable: 'any', uri: (id) => SCHEMA_REF + id });
      for (const [name, rendered] of Object.entries(schemas)) {
        const { $schema: _schema, $id: _id, ...schema } = rendered as JsonSchema;
        // A schema used both as a request and an answer must read the same both ways.
        if (out[name] && JSON.stringify(out[name]) !== JSON.stringify(schema)) throw new Error(`${name} differs as a request and as an answer; use two schemas`);
        out[name] = schema;
      }
    }
    return out;
  }
}

function content(c: Content, io: 'input' | 'output', components: Components): Record<string, { schema: JsonSchema }> {
  return Object.fromEntries(
    Object.entries(c).map(([type, body]) => {
      const schema = body === 'bytes' ? { type: 'string', format: 'binary' } : body === 'text' ? { type: 'string' } : components.ref(body, io);
      // NDJSON: the schema is that of each line.
      return [type, { schema: type === NDJSON ? { ...schema, description: 'Each line of the stream' } : schema }];
    }),
  );
}

function parameters(route: ApiRoute): NonNullable<OpenApiOperation['parameters']> {
  const declared = route.params ? Object.keys(route.params.shape) : [];
  const named = pathParameterNames(route.path);
  if (declared.join() !== named.join()) throw new Error(`${route.operationId}: path ${route.path} names {${named.join('}, {')}}, its params schema ${declared.join(', ') || 'nothing'}`);
  const from = (object: z.ZodObject | undefined, where: 'path' | 'query' | 'header') => {
    if (!object) return [];
    const json = z.toJSONSchema(object, { io: 'input', unrepresentable: 'any' }) as { properties?: Record<string, JsonSchema>; required?: string[] };
    return Object.entries(json.properties ?? {}).map(([name, property]) => {
      const { description, ...schema } = property;
      return {
        name,
        in: where,
        required: where === 'path' || (json.required ?? []).includes(name),
        ...(typeof description === 'string' ? { description } : {}),
        schema,
      };
    });
  };
  return [...from(route.params, 'path'), ...from(route.query, 'query'), ...from(route.headers, 'header')];
}

function operation(route: ApiRoute, components: Components): OpenApiOperation {
  const scope = requiredScope(route.method, route.path);
  const params = parameters(route);
  const op: OpenApiOperation = {
    operationId: route.operationId,
    summary: route.summary,
    ...(route.description ? { description: route.description } : {}),
    // Role names on an http scheme are allowed by OpenAPI 3.1: the token scope the route needs.
    security: [{ bearer: scope ? [scope] : [] }],
    ...(params.length ? { parameters: params } : {}),
    ...(route.body
      ? { requestBody: { required: route.body.required, ...(route.body.description ? { description: route.body.description } : {}), content: content(route.body.content, 'input', components) } }
      : {}),
    responses: {
      ...Object.fromEntries(
        Object.entries(route.responses).map(([status, r]) => [status, { description: r.description, ...(r.content ? { content: content(r.content, 'output', components) } : {}) }]),
      ),
      ...Object.fromEntries(errorStatuses(route).map((status) => [String(status), { $ref: `${RESPONSE_REF}Error${status}` }])),
    },
  };
  if (route.websocket) {
    op['x-websocket'] = {
      subprotocol: route.websocket.subprotocol,
      clientTextFrames: components.ref(route.websocket.fromClient, 'output'),
      serverTextFrames: components.ref(route.websocket.fromServer, 'output'),
    };
  }
  return op;
}

function errorResponses(): OpenApiDocument['components']['responses'] {
  const byStatus = new Map<number, ErrorType[]>();
  for (const [type, status] of Object.entries(ERROR_STATUS) as Array<[ErrorType, number]>) byStatus.set(status, [...(byStatus.get(status) ?? []), type]);
  const retryAfter = { 'Retry-After': { description: 'Seconds to wait before trying again', schema: { type: 'integer', minimum: 0 } } };
  return Object.fromEntries(
    [...byStatus].map(([status, types]) => [
      `Error${status}`,
      {
        description: `Error: ${types.join(' or ')}`,
        ...(status === 429 || status === 503 ? { headers: retryAfter } : {}),
        content: { [JSON_TYPE]: { schema: { $ref: `${SCHEMA_REF}ErrorBody` } } },
      },
    ]),
  );
}

export function openApiDocument(version: string, routes: ApiRoute[] = API_ROUTES): OpenApiDocument {
  const components = new Components();
  components.ref(S.ErrorBody, 'output');
  const paths: OpenApiDocument['paths'] = {};
  for (const route of routes) {
    const item = (paths[route.path] ??= {});
    if (item[route.method]) throw new Error(`${route.method.toUpperCase()} ${route.path} is in the route table twice`);
    item[route.method] = operation(route, components);
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'sandbox-bridge',
      version,
      description:
        'Disposable, locked-down sandbox pods ("boxes") for AI-agent runtimes. Every route needs Authorization: Bearer <token>; ' +
        "each operation's security lists the token scope it needs (none: any valid token).",
    },
    servers: [{ url: '/api/v1' }],
    security: [{ bearer: [] }],
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } },
      schemas: components.render(),
      responses: errorResponses(),
    },
    paths,
  };
}
