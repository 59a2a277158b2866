// Proof that sandbox-bridge/client and sandbox-bridge/platform run where only web-platform APIs
// exist (edge isolates):
// 1. their import graphs, from client/index.ts and client/platform.ts, hold only its own relative modules at runtime,
//    with no Node built-in, package, Buffer, process or require;
// 2. compiled the way `npm run build` compiles it, it loads and drives a whole session inside a
//    fresh V8 context whose only globals are fetch-like web APIs.
import { readFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import vm from 'node:vm';
import ts from 'typescript';
import type * as ClientApi from './index.js';
import type * as PlatformApi from './platform.js';

const CLIENT = dirname(fileURLToPath(import.meta.url));
const ROOT = dirname(CLIENT);

const FORBIDDEN_GLOBALS = ['Buffer', 'require', 'module', '__dirname', '__filename', 'setImmediate', 'global'];

/**
 * Uses of Node-only globals, from the AST (so comments and strings do not count). `process` is
 * allowed only as a property name (`globalThis.process?.env`, read at call time), never bare.
 */
function nodeGlobalsUsed(file: string): string[] {
  const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true);
  const used: string[] = [];
  const visit = (node: ts.Node) => {
    if (ts.isIdentifier(node)) {
      const parent = node.parent;
      const asPropertyName =
        (ts.isPropertyAccessExpression(parent) && parent.name === node) ||
        ((ts.isPropertySignature(parent) || ts.isPropertyAssignment(parent)) && parent.name === node);
      if (!asPropertyName && (FORBIDDEN_GLOBALS.includes(node.text) || node.text === 'process')) {
        used.push(`${node.text} at line ${source.getLineAndCharacterOfPosition(node.getStart()).line + 1}`);
      }
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return used;
}

interface Import {
  specifier: string;
  typeOnly: boolean;
}

/** Every import/export-from/dynamic import/require of a module, marking the ones the compiler erases. */
function importsOf(file: string): Import[] {
  const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true);
  const found: Import[] = [];
  const visit = (node: ts.Node) => {
    if (ts.isImportDeclaration(node) && ts.isStringLiteral(node.moduleSpecifier)) {
      const clause = node.importClause;
      const typeOnly = !!clause && (clause.isTypeOnly || (!clause.name && !!clause.namedBindings && ts.isNamedImports(clause.namedBindings) && clause.namedBindings.elements.every((e) => e.isTypeOnly)));
      found.push({ specifier: node.moduleSpecifier.text, typeOnly });
    } else if (ts.isExportDeclaration(node) && node.moduleSpecifier && ts.isStringLiteral(node.moduleSpecifier)) {
      const typeOnly = node.isTypeOnly || (!!node.exportClause && ts.isNamedExports(node.exportClause) && node.exportClause.elements.every((e) => e.isTypeOnly));
      found.push({ specifier: node.moduleSpecifier.text, typeOnly });
    } else if (ts.isCallExpression(node) && node.arguments[0] && ts.isStringLiteralLike(node.arguments[0])) {
      const callee = node.expression;
      if (callee.kind === ts.SyntaxKind.ImportKeyword || (ts.isIdentifier(callee) && callee.text === 'require')) {
        found.push({ specifier: node.arguments[0].text, typeOnly: false });
      }
    } else if (ts.isImportTypeNode(node)) {
      return; // import('x').T is a type
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return found;
}

/** The package's entry points (package.json "exports"): ./client and ./platform. */
const ENTRIES = [join(CLIENT, 'index.ts'), join(CLIENT, 'platform.ts')];

/** The runtime module graph from the entry points: file paths, and what each imports at runtime. */
function runtimeGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  const pending = [...ENTRIES];
  while (pending.length) {
    const file = pending.pop()!;
    if (graph.has(file)) continue;
    const runtime = importsOf(file).filter((i) => !i.typeOnly).map((i) => i.specifier);
    graph.set(file, runtime);
    for (const spec of runtime) if (spec.startsWith('.')) pending.push(resolve(dirname(file), spec.replace(/\.js$/, '.ts')));
  }
  return graph;
}

describe('no Node built-ins in the client module graph', () => {
  const graph = runtimeGraph();

  test('the graph is the client modules, and nothing outside client/', () => {
    const files = [...graph.keys()].map((f) => relative(ROOT, f)).sort();
    expect(files).toEqual([
      'client/base64.ts',
      'client/client.ts',
      'client/http.ts',
      'client/index.ts',
      'client/platform-exec.ts',
      'client/platform.ts',
      'client/provider.ts',
      'client/sandbox.ts',
      'client/streams.ts',
    ]);
  });

  test('package.json exports exactly these entry points, built from them', () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { exports: Record<string, { import: string; types: string }> };
    expect(pkg.exports).toEqual({
      './client': { types: './dist/client/index.d.ts', import: './dist/client/index.js' },
      './platform': { types: './dist/client/platform.d.ts', import: './dist/client/platform.js' },
    });
  });

  test('runtime imports are relative client modules only: no node:, built-in or package', () => {
    const builtins = new Set(builtinModules.flatMap((m) => [m, `node:${m}`]));
    for (const [file, specifiers] of graph) {
      for (const spec of specifiers) {
        const where = `${relative(ROOT, file)} imports ${spec}`;
        expect({ where, builtin: spec.startsWith('node:') || builtins.has(spec) }).toEqual({ where, builtin: false });
        expect({ where, relative: spec.startsWith('./') }).toEqual({ where, relative: true });
      }
    }
  });

  test('type-only imports (the zod-derived types) are the only way out of client/', () => {
    const typeOnly = importsOf(join(CLIENT, 'types.ts'));
    expect(typeOnly.length).toBeGreaterThan(0);
    expect(typeOnly.every((i) => i.typeOnly)).toBe(true);
    expect(graph.has(join(CLIENT, 'types.ts'))).toBe(false);
  });

  test('no Buffer, require, __dirname, bare process: process.env only through globalThis, at call time', () => {
    for (const file of graph.keys()) {
      expect({ file: relative(ROOT, file), used: nodeGlobalsUsed(file) }).toEqual({ file: relative(ROOT, file), used: [] });
    }
    // The check itself catches what it must.
    expect(nodeGlobalsUsed(join(CLIENT, 'client.test.ts'))).toEqual(expect.arrayContaining([expect.stringMatching(/^Buffer /), expect.stringMatching(/^process /)]));
  });
});

describe('in a fresh context with only web-platform globals', () => {
  // What edge isolates (and browsers, Deno, Bun, Node) all provide. Deliberately absent:
  // process, Buffer, require, module, setImmediate, global.
  const WEB_GLOBALS = {
    fetch,
    Request,
    Response,
    Headers,
    URL,
    URLSearchParams,
    AbortController,
    AbortSignal,
    TextEncoder,
    TextDecoder,
    DOMException,
    // Streams: downloads (readFileBytes), uploads and NDJSON output are read as web streams.
    ReadableStream,
    // Web Crypto: the random Idempotency-Key of a create (crypto.randomUUID).
    crypto,
    setTimeout,
    clearTimeout,
    console,
  };

  /**
   * Compiles each module as the build does (isolatedModules; ESM, as NodeNext emits for this
   * "type": "module" package) and links them inside the context.
   */
  async function loadModule(globals: Record<string, unknown>, entryFile: string) {
    const compilerOptions = ts.convertCompilerOptionsFromJson(ts.readConfigFile(join(ROOT, 'tsconfig.json'), ts.sys.readFile).config.compilerOptions, ROOT).options;
    const compiled = new Map<string, string>();
    const outside: string[] = [];
    const pending = [entryFile];
    while (pending.length) {
      const file = pending.pop()!;
      if (compiled.has(file)) continue;
      const js = ts.transpileModule(readFileSync(file, 'utf8'), {
        compilerOptions: { ...compilerOptions, module: ts.ModuleKind.ESNext, sourceMap: false, declaration: false },
        fileName: file,
      }).outputText;
      compiled.set(file, js);
      // The compiled output's imports are what a bundler or isolate must resolve: all must be ours.
      const specifiers = [...js.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s*['"]([^'"]+)['"]|\bimport\(\s*['"]([^'"]+)['"]/gm)].map((m) => (m[1] ?? m[2])!);
      for (const spec of specifiers) {
        if (spec.startsWith('./')) pending.push(resolve(dirname(file), spec.replace(/\.js$/, '.ts')));
        else outside.push(`${relative(ROOT, file)} imports ${spec}`);
      }
    }
    // Asserted before linking: an error thrown inside the linker would take the worker down.
    expect(outside).toEqual([]);

    const context = vm.createContext({ ...globals });
    const modules = new Map([...compiled].map(([file, js]) => [file, new vm.SourceTextModule(js, { context, identifier: file })]));
    const entry = modules.get(entryFile)!;
    await entry.link((specifier, referencing) => modules.get(resolve(dirname(referencing.identifier), specifier.replace(/\.js$/, '.ts')))!);
    await entry.evaluate();
    return { namespace: entry.namespace, context };
  }

  async function loadClient(globals: Record<string, unknown>) {
    const { namespace, context } = await loadModule(globals, join(CLIENT, 'index.ts'));
    return { api: namespace as typeof ClientApi, context };
  }

  async function loadPlatform(globals: Record<string, unknown>) {
    const { namespace, context } = await loadModule(globals, join(CLIENT, 'platform.ts'));
    return { api: namespace as typeof PlatformApi, context };
  }

  test('the sandbox-free globals really are absent there', async () => {
    const { context } = await loadClient(WEB_GLOBALS);
    expect(vm.runInContext('[typeof process, typeof Buffer, typeof require, typeof setImmediate]', context)).toEqual(['undefined', 'undefined', 'undefined', 'undefined']);
  });

  test('loads and drives a whole session: create, exec, files as text and bytes, env, status, destroy', async () => {
    const seen: string[] = [];
    const box = 'box-0123456789ab-0';
    const files = new Map<string, string>();
    const reply = (body: unknown, status = 200) => new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json' } });
    const edgeFetch = async (input: string, init: RequestInit) => {
      const url = new URL(input);
      seen.push(`${init.method} ${url.pathname}`);
      const key = new Headers(init.headers).get('idempotency-key');
      if (key) seen.push(`idempotency-key ${key.length} chars`);
      const path = url.searchParams.get('path') ?? '';
      if (url.pathname === '/api/v1/boxes') return reply({ box_id: box, status: 'Pending' }, 201);
      if (url.pathname.endsWith('/exec')) return reply({ exit_code: 0, stdout: 'ok\n', stderr: '', duration_ms: 1, timed_out: false, stdout_truncated: false, stderr_truncated: false });
      if (url.pathname.endsWith('/files') && init.method === 'PUT') {
        files.set(path, String(init.body));
        return reply({ path, size: 0, encoding: url.searchParams.get('base64') ? 'base64' : 'text' });
      }
      if (url.pathname.endsWith('/files')) {
        const stored = files.get(path)!;
        const asBase64 = url.searchParams.get('base64') === 'true';
        return reply({ path, size: 0, content: stored, encoding: asBase64 ? 'base64' : 'text' });
      }
      if (url.pathname.endsWith('/env')) return reply({ box_id: box, env_count: 1, updated_at: 'now' });
      if (url.pathname.endsWith('/status')) return reply({ box_id: box, status: 'Running' });
      if (init.method === 'DELETE') return reply({ error: { type: 'not_found', message: 'gone' } }, 404);
      return reply({ error: { type: 'not_found', message: 'no route' } }, 404);
    };
    const { api } = await loadClient({ ...WEB_GLOBALS, fetch: edgeFetch });

    // No process.env there: fromEnv without env explains what is missing.
    expect(() => api.ClusterBridgeSandbox.fromEnv({ sessionId: 's' })).toThrow(/SANDBOX_PROVIDER is unset.*CLUSTER_BRIDGE_URL is unset/);

    const sandbox = api.ClusterBridgeSandbox.fromEnv({
      sessionId: 'edge-session',
      env: { SANDBOX_PROVIDER: 'cluster-bridge', CLUSTER_BRIDGE_URL: 'https://bridge.example', CLUSTER_BRIDGE_TOKEN: 't', CLUSTER_CPU: '1', CLUSTER_MEMORY: '256' },
    });
    expect((await sandbox.exec('echo ok')).stdout).toBe('ok\n');
    await sandbox.writeFile('a.txt', 'héllo');
    expect(await sandbox.readFile('a.txt')).toBe('héllo');
    const bytes = new Uint8Array([0, 255, 128, 7]);
    await sandbox.writeFile('b.bin', bytes);
    expect(Array.from(await sandbox.readFileBytes('b.bin'))).toEqual([0, 255, 128, 7]);
    await sandbox.setEnvVars({ A: '1' });
    expect((await sandbox.status()).status).toBe('Running');
    await sandbox.destroy(); // the scripted bridge answers 404: done
    expect(seen).toEqual([
      'POST /api/v1/boxes',
      'idempotency-key 36 chars',
      `POST /api/v1/boxes/${box}/exec`,
      `PUT /api/v1/boxes/${box}/files`,
      `GET /api/v1/boxes/${box}/files`,
      `PUT /api/v1/boxes/${box}/files`,
      `GET /api/v1/boxes/${box}/files`,
      `POST /api/v1/boxes/${box}/env`,
      `GET /api/v1/boxes/${box}/status`,
      `DELETE /api/v1/boxes/${box}`,
    ]);
  });

  test('sandbox-bridge/platform loads there and drives the executor: exec string, files, process, env, destroy', async () => {
    const seen: string[] = [];
    const box = 'box-0123456789ab-1';
    const reply = (body: unknown, status = 200) => new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json' } });
    const edgeFetch = async (input: string, init: RequestInit) => {
      const url = new URL(input);
      seen.push(`${init.method} ${url.pathname}`);
      if (url.pathname === '/api/v1/sandboxes') return reply({ sandboxes: [], total: 0, namespace: 'sbx' });
      if (url.pathname === '/api/v1/boxes') return reply({ box_id: box, status: 'Pending' }, 201);
      if (url.pathname.endsWith('/exec')) return reply({ exit_code: 2, stdout: 'out\n', stderr: 'err\n', duration_ms: 1, timed_out: false, stdout_truncated: false, stderr_truncated: false });
      if (url.pathname.endsWith('/files') && init.method === 'PUT') return reply({ path: `/workspace/${url.searchParams.get('path')}`, size: 4, encoding: 'base64' });
      if (url.pathname.endsWith('/files')) return new Response(new Uint8Array([0, 255, 128, 7]), { status: 200, headers: { 'content-type': 'application/octet-stream' } });
      if (url.pathname.endsWith('/processes')) return reply({ process_id: 'p-1', pid: 42, status: 'running', started_at: 'now', command: 'sleep 9' }, 201);
      if (url.pathname.endsWith('/processes/p-1')) return reply({ process_id: 'p-1', pid: 42, status: 'exited', exit_code: 0, started_at: 'now', command: 'sleep 9' });
      if (url.pathname.endsWith('/env')) return reply({ box_id: box, env_count: 1, updated_at: 'now' });
      if (init.method === 'DELETE') return reply({ box_id: box, status: 'Terminated', deleted_at: 'now' });
      return reply({ error: { type: 'not_found', message: 'no route' } }, 404);
    };
    const { api, context } = await loadPlatform({ ...WEB_GLOBALS, fetch: edgeFetch });
    expect(vm.runInContext('[typeof process, typeof Buffer]', context)).toEqual(['undefined', 'undefined']);
    expect(() => api.ClusterBridgeExecutor.fromEnv({ sessionId: 's' })).toThrow(/SANDBOX_PROVIDER is unset.*CLUSTER_BRIDGE_URL is unset/);

    const executor = api.ClusterBridgeExecutor.fromEnv({
      sessionId: 'edge-session',
      env: { SANDBOX_PROVIDER: 'cluster-bridge', CLUSTER_BRIDGE_URL: 'https://bridge.example', CLUSTER_BRIDGE_TOKEN: 't' },
    });
    expect(await executor.exec('make')).toBe('out\nerr\n[exit 2]');
    expect(await executor.writeFileBytes('b.bin', new Uint8Array([0, 255, 128, 7]))).toBe('/workspace/b.bin');
    expect(Array.from(await executor.readFileBytes('b.bin'))).toEqual([0, 255, 128, 7]);
    const handle = await executor.startProcess('sleep 9');
    expect([handle.id, handle.pid, await handle.getStatus()]).toEqual(['p-1', 42, 'completed']);
    await executor.setEnvVars({ A: '1' });
    await executor.destroy();
    expect(seen).toEqual([
      'GET /api/v1/sandboxes',
      'POST /api/v1/boxes',
      `POST /api/v1/boxes/${box}/exec`,
      `PUT /api/v1/boxes/${box}/files`,
      `GET /api/v1/boxes/${box}/files`,
      `POST /api/v1/boxes/${box}/processes`,
      `GET /api/v1/boxes/${box}/processes/p-1`,
      `POST /api/v1/boxes/${box}/env`,
      `DELETE /api/v1/boxes/${box}`,
    ]);
  });
});
