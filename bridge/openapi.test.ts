// The OpenAPI document is sound OpenAPI 3.1 in structure, and it lists exactly the routes the
// bridge serves: Express's router walked as it is built, plus the WebSocket upgrade route.
import { pino } from 'pino';
import { createApp, type AppDeps } from './app.js';
import { API_ROUTES } from './api-routes.js';
import { PORT_UPGRADE_PATH } from './http/ports.js';
import { PTY_PATH } from './http/terminals.js';
import { createMetrics } from './metrics.js';
import { openApiDocument, pathParameterNames } from './openapi.js';

const doc = openApiDocument('test');
const METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'];
const operations = Object.entries(doc.paths).flatMap(([path, item]) =>
  Object.entries(item).map(([method, op]) => ({ path, method, op: op as (typeof item)['get'] & object })),
);

test('the document has the shape of OpenAPI 3.1', () => {
  expect(doc.openapi).toBe('3.1.0');
  expect(doc.info).toEqual({ title: 'sandbox-bridge', version: 'test', description: expect.any(String) });
  expect(doc.servers).toEqual([{ url: '/api/v1' }]);
  for (const { path, method, op } of operations) {
    const where = `${method.toUpperCase()} ${path}`;
    expect(path).toMatch(/^\//);
    expect(METHODS).toContain(method);
    expect(typeof op.summary).toBe('string');
    expect(Object.keys(op.responses).length).toBeGreaterThan(0);
    for (const status of Object.keys(op.responses)) expect(`${where} ${status}`).toMatch(/ [1-5]\d\d$/);
    // One success at least, and every body a media type with a schema.
    expect(Object.keys(op.responses).some((s) => s < '400')).toBe(true);
    for (const response of Object.values(op.responses)) {
      if ('$ref' in response) continue;
      expect(typeof response.description).toBe('string');
      for (const [type, media] of Object.entries(response.content ?? {})) {
        expect(type).toMatch(/^([a-z]+\/[a-z0-9.+-]+|\*\/\*)$/);
        expect(media.schema).toEqual(expect.any(Object));
      }
    }
    // Security requirements name a declared scheme; its list is the token scope.
    for (const requirement of op.security) for (const scheme of Object.keys(requirement)) expect(doc.components.securitySchemes).toHaveProperty(scheme);
    // Parameters: unique per place, path ones required.
    const params = op.parameters ?? [];
    expect(new Set(params.map((p) => `${p.in}:${p.name}`)).size).toBe(params.length);
    for (const p of params) {
      expect(['path', 'query', 'header']).toContain(p.in);
      expect(p.schema).toEqual(expect.any(Object));
      if (p.in === 'path') expect(p.required).toBe(true);
    }
  }
});

test('every path parameter is declared, and every declared one is in the path', () => {
  for (const { path, method, op } of operations) {
    const declared = (op.parameters ?? []).filter((p) => p.in === 'path').map((p) => p.name);
    expect(`${method} ${path}: ${declared.sort().join(',')}`).toBe(`${method} ${path}: ${pathParameterNames(path).sort().join(',')}`);
  }
});

test('operationIds are unique', () => {
  const ids = operations.map((o) => o.op.operationId);
  expect(ids.every((id) => /^[a-z][A-Za-z0-9]*$/.test(id))).toBe(true);
  expect(new Set(ids).size).toBe(ids.length);
});

test('every $ref resolves inside the document', () => {
  const refs: string[] = [];
  const walk = (value: unknown): void => {
    if (Array.isArray(value)) value.forEach(walk);
    else if (value && typeof value === 'object') {
      for (const [key, v] of Object.entries(value)) {
        if (key === '$ref' && typeof v === 'string') refs.push(v);
        else walk(v);
      }
    }
  };
  walk(doc);
  expect(refs.length).toBeGreaterThan(50);
  for (const ref of new Set(refs)) {
    expect(ref).toMatch(/^#\//);
    const target = ref
      .slice(2)
      .split('/')
      .reduce<unknown>((node, part) => (node as Record<string, unknown> | undefined)?.[part.replace(/~1/g, '/').replace(/~0/g, '~')], doc);
    expect([ref, target]).toEqual([ref, expect.any(Object)]);
  }
});

test('schemas come from zod: answers forbid undocumented fields, queries are the ones the routes parse', () => {
  expect(doc.components.schemas.BoxStatus).toMatchObject({ type: 'object', additionalProperties: false, required: expect.arrayContaining(['box_id', 'status']) });
  expect(doc.components.schemas.ProcessList).toMatchObject({ properties: { processes: { items: { $ref: '#/components/schemas/ProcessInfo' } } } });
  // Request bodies in their input form: fields with defaults are optional.
  expect(doc.components.schemas.ExecRequest).toMatchObject({ required: ['command'], properties: { timeoutMs: { default: 120000, maximum: 600000 } } });
  const list = doc.paths['/sandboxes']!.get!.parameters!;
  expect(list.map((p) => p.name)).toEqual(['session_id', 'status', 'limit', 'continue']);
  expect(list.find((p) => p.name === 'status')).toMatchObject({ in: 'query', required: false, schema: { enum: ['Pending', 'Running', 'Sleeping', 'Failed', 'Terminated'] } });
  expect(doc.paths['/boxes/{id}/files']!.get!.parameters!.find((p) => p.name === 'path')).toMatchObject({ required: true });
  expect(doc.paths['/boxes']!.post!.parameters).toEqual([expect.objectContaining({ name: 'Idempotency-Key', in: 'header', required: false })]);
  expect(doc.paths['/boxes/{id}']!.delete!.security).toEqual([{ bearer: ['boxes:write'] }]);
  expect(doc.paths['/health']!.get!.security).toEqual([{ bearer: [] }]);
  expect(doc.paths['/boxes/{id}/pty']!.get!.responses['101']).toEqual({ description: expect.any(String) });
  expect(doc.components.responses.Error429!.headers).toHaveProperty('Retry-After');
});

test('a route table entry whose path and parameters disagree is refused', () => {
  const route = API_ROUTES.find((r) => r.operationId === 'getProcess')!;
  expect(() => openApiDocument('x', [{ ...route, path: '/boxes/{id}/processes/{processId}' }])).toThrow(/names \{id\}, \{processId\}/);
  expect(() => openApiDocument('x', [route, route])).toThrow(/twice/);
});

/** "GET /boxes/{id}/status" for every route of an Express app, walked through nested routers. */
function expressRoutes(app: ReturnType<typeof createApp>): string[] {
  type Layer = { route?: { path: string; methods: Record<string, boolean> }; handle: { stack?: Layer[] }; rawPath?: unknown; slash?: boolean };
  const found: string[] = [];
  const walk = (stack: Layer[], prefix: string) => {
    for (const layer of stack) {
      if (layer.route) {
        // :name is one segment, *name (a trailing wildcard) spans segments: both {name} in the document.
        const path = `${prefix}${layer.route.path}`.replace(/(.)\/$/, '$1').replace(/[:*](\w+)/g, '{$1}');
        for (const method of Object.keys(layer.route.methods)) if (method !== '_all') found.push(`${method.toUpperCase()} ${path}`);
      } else if (layer.handle.stack) {
        walk(layer.handle.stack, layer.slash || typeof layer.rawPath !== 'string' ? prefix : `${prefix}${layer.rawPath}`);
      }
    }
  };
  walk((app as unknown as { router: { stack: Layer[] } }).router.stack, '');
  return found.sort();
}

test('the document lists exactly the routes the bridge serves', () => {
  // The services are never called while routes are registered.
  const deps = { log: pino({ level: 'silent' }), metrics: createMetrics(), limits: {}, tokens: {}, version: 'test', trustProxy: false } as unknown as AppDeps;
  const served = expressRoutes(createApp(deps));
  expect(served.length).toBeGreaterThan(20);
  expect(served.every((r) => r.includes(' /api/v1/'))).toBe(true);

  const upgrades = API_ROUTES.filter((r) => r.responses[101]);
  const documented = API_ROUTES.filter((r) => !r.responses[101] && !r.proxied).map((r) => `${r.method.toUpperCase()} /api/v1${r.path}`);
  expect(served).toEqual(documented.sort());

  // The WebSocket route is served by the upgrade handler, not Express.
  expect(upgrades.map((r) => `${r.method} ${r.path}`)).toEqual(['get /boxes/{id}/pty']);
  expect(PTY_PATH.test(`/api/v1${upgrades[0]!.path.replace('{id}', 'box-0123456789ab-0')}`)).toBe(true);
});

test('the platform port routes (issue 21): scopes, filters and the multi-segment output path', () => {
  expect(doc.paths['/boxes/{id}/keepalive']!.post!.security).toEqual([{ bearer: ['boxes:write'] }]);
  expect(doc.paths['/boxes/{id}/context']!.put!.security).toEqual([{ bearer: ['boxes:write'] }]);
  expect(doc.paths['/boxes/{id}/mounts/outputs']!.post!.security).toEqual([{ bearer: ['boxes:write'] }]);
  // Outputs are what box code wrote: contents, like files.
  expect(doc.paths['/sessions/{sessionId}/outputs']!.get!.security).toEqual([{ bearer: ['boxes:contents'] }]);
  expect(doc.paths['/sessions/{sessionId}/outputs/{path}']!.get!.security).toEqual([{ bearer: ['boxes:contents'] }]);
  expect(doc.paths['/sessions/{sessionId}/outputs/{path}']!.get!.responses['200']).toMatchObject({ content: { 'application/octet-stream': expect.any(Object) } });
  const list = doc.paths['/snapshots']!.get!.parameters!;
  expect(list.map((p) => [p.name, p.required])).toEqual([
    ['session_id', false],
    ['tenant_id', false],
    ['environment_id', false],
    ['limit', false],
  ]);
  expect(doc.components.schemas.Snapshot).toMatchObject({ required: expect.arrayContaining(['context']) });
  expect(doc.components.schemas.SetContextRequest).toMatchObject({ properties: { backup: { required: ['tenant_id', 'environment_id', 'session_id'] }, outbound: { required: ['tenant_id', 'session_id'] } } });
});

test('the memory store routes (issue 21): write scope, the contract body, 409 for a pool without them', () => {
  const mount = doc.paths['/boxes/{id}/mounts/memory']!.post!;
  const sync = doc.paths['/boxes/{id}/mounts/memory/{storeName}/sync']!.post!;
  expect(mount.security).toEqual([{ bearer: ['boxes:write'] }]);
  expect(sync.security).toEqual([{ bearer: ['boxes:write'] }]);
  expect(Object.keys(mount.responses)).toEqual(expect.arrayContaining(['200', '409', '501']));
  expect(Object.keys(sync.responses)).toEqual(expect.arrayContaining(['200', '404', '409']));
  expect(doc.components.schemas.MountMemoryRequest).toMatchObject({ required: ['store_name', 'store_id', 'read_only'], additionalProperties: false });
  expect(doc.components.schemas.MemoryMounted).toMatchObject({ required: ['path', 'store_name', 'store_id', 'read_only', 'files', 'bytes'] });
  expect(sync.parameters!.map((p) => p.name)).toEqual(['id', 'storeName']);
});

test('the ports route (issue 23): every method, boxes:write, served by the ports proxy', () => {
  const proxied = API_ROUTES.filter((r) => r.proxied);
  expect(proxied.map((r) => r.method).sort()).toEqual(['delete', 'get', 'head', 'options', 'patch', 'post', 'put']);
  for (const r of proxied) {
    expect(r.path).toBe('/boxes/{id}/ports/{port}/{path}');
    expect(doc.paths[r.path]![r.method]!.security).toEqual([{ bearer: ['boxes:write'] }]);
  }
  for (const path of ['/api/v1/boxes/box-0123456789ab-0/ports/8000/', '/api/v1/boxes/box-0123456789ab-0/ports/8000/a/b?c=d', '/api/v1/boxes/b/ports/3000']) {
    expect(PORT_UPGRADE_PATH.test(path)).toBe(true);
  }
  const preview = doc.paths['/boxes/{id}/ports/{port}/preview']!;
  expect(preview.post!.security).toEqual([{ bearer: ['boxes:write'] }]);
  expect(preview.delete!.security).toEqual([{ bearer: ['boxes:write'] }]);
  expect(preview.post!.parameters!.map((p) => p.name)).toEqual(['id', 'port']);
  expect(doc.components.schemas.PreviewCreated).toMatchObject({ required: ['box_id', 'port', 'url', 'expires_at'] });
});
