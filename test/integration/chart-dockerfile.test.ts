// No Docker engine runs here, so the image's properties are checked on the Dockerfile itself:
// multi-stage, Node 24, production dependencies only, both entry points, uid 65534, nothing that
// needs a writable root filesystem, and programs that exit cleanly on SIGTERM as PID 1. The
// separate boxd and egress-gateway targets: a static Go binary in a scratch image.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { load } from 'js-yaml';
import { NODE_FLAGS } from '../../common/node-flags.js';
import { CHART, ROOT, template } from '../chart/helm.js';

interface Instruction {
  op: string;
  args: string;
}
interface Stage {
  from: string;
  name: string | undefined;
  instructions: Instruction[];
}

/** Dockerfile -> stages of instructions (comments dropped, continuation lines joined). */
function parseDockerfile(text: string): Stage[] {
  const lines = text.replace(/\\\n/g, ' ').split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#'));
  const stages: Stage[] = [];
  for (const line of lines) {
    const [, op, args] = /^(\S+)\s+(.*)$/.exec(line) ?? [];
    if (!op) continue;
    const upper = op.toUpperCase();
    if (upper === 'FROM') {
      const m = /^(\S+)(?:\s+AS\s+(\S+))?/i.exec(args!)!;
      stages.push({ from: m[1]!, name: m[2], instructions: [] });
    } else if (upper !== 'ARG' || stages.length > 0) {
      stages.at(-1)?.instructions.push({ op: upper, args: args! });
    }
  }
  return stages;
}

const dockerfile = readFileSync(join(ROOT, 'Dockerfile'), 'utf8');
const stages = parseDockerfile(dockerfile);
const runtime = stages.at(-1)!;
const stage = (name: string) => stages.find((s) => s.name === name)!;
const runs = (s: Stage) => s.instructions.filter((i) => i.op === 'RUN').map((i) => i.args).join('\n');
const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  version: string;
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};

test('multi-stage on Node 24: npm ci and the build in the builder, production deps in their own stage', () => {
  // The default (last) stage is the bridge/operator runtime, never the boxd target.
  expect(runtime.name).toBe('runtime');
  for (const s of [stage('build'), stage('deps'), runtime]) expect(s.from).toMatch(/node(js)?:?24|nodejs24/);
  const build = stage('build');
  expect(runs(build)).toMatch(/\bnpm ci\b/);
  expect(runs(build)).toMatch(/\bnpm run build\b/);
  const deps = stage('deps');
  expect(runs(deps)).toMatch(/\bnpm ci\b[^\n]*--omit=dev/);
  // The devDependency `node` (a whole Node binary) must not be in the image.
  expect(pkg.devDependencies.node).toBeDefined();
  expect(runs(deps)).toContain('test ! -e node_modules/node');
});

test('the runtime stage copies node_modules only from the production-deps stage, and compiled code', () => {
  const copies = runtime.instructions.filter((i) => i.op === 'COPY').map((i) => i.args);
  const nodeModules = copies.filter((c) => c.includes('node_modules'));
  expect(nodeModules).toEqual([expect.stringMatching(/^--from=deps\s/)]);
  expect(copies.some((c) => /^--from=build\s+\S*dist\s/.test(c))).toBe(true);
  // No sources, no build context wholesale.
  expect(copies.some((c) => /^\.\s|\s\.\s*$/.test(c) && !c.startsWith('--from'))).toBe(false);
  expect(runtime.instructions.filter((i) => i.op === 'RUN')).toEqual([]); // distroless: no shell
});

test('the boxd target: a static Go build, then scratch holding only /boxd, run as 65534', () => {
  const boxd = stage('boxd');
  expect(boxd.from).toBe('scratch');
  const copies = boxd.instructions.filter((i) => i.op === 'COPY').map((i) => i.args);
  expect(copies).toHaveLength(1);
  const [, builder] = /^--from=(\S+)\s+\S+\s+\/boxd$/.exec(copies[0]!) ?? [];
  expect(builder).toBeDefined();
  expect(boxd.instructions.filter((i) => i.op === 'RUN')).toEqual([]);
  expect(boxd.instructions.filter((i) => i.op === 'USER').at(-1)?.args).toBe('65534:65534');
  expect(JSON.parse(boxd.instructions.find((i) => i.op === 'ENTRYPOINT')!.args)).toEqual(['/boxd']);

  // Built by boxd/build.sh (the same script the local cluster's image uses): static and stripped,
  // on a Go at least as new as go.mod asks for.
  const build = stage(builder!);
  expect(runs(build)).toMatch(/\.\/build\.sh \/out\b/);
  const script = readFileSync(join(ROOT, 'boxd/build.sh'), 'utf8');
  for (const flag of [/CGO_ENABLED=0/, /-trimpath/, /-ldflags "-s -w /]) expect(script).toMatch(flag);
  const [, goMin] = /^go (\d+\.\d+)/m.exec(readFileSync(join(ROOT, 'boxd/go.mod'), 'utf8')) ?? [];
  const [, goImage] = /^golang:(\d+\.\d+)/.exec(build.from) ?? [];
  const minor = (v: string) => Number(v.split('.')[1]);
  expect(minor(goImage!)).toBeGreaterThanOrEqual(minor(goMin!));
});

test('the egress-gateway target: gateway/build.sh, then scratch holding /egress-gateway and the CA roots, run as 65534; the chart runs it', () => {
  const gateway = stage('egress-gateway');
  expect(gateway.from).toBe('scratch');
  const copies = gateway.instructions.filter((i) => i.op === 'COPY').map((i) => i.args.split(/\s+/));
  // The binary, and the bundle Go reads as its system roots (scratch has none) to verify intercepted hosts.
  expect(copies.map((c) => c.slice(1))).toEqual([
    [expect.any(String), '/egress-gateway'],
    ['/etc/ssl/certs/ca-certificates.crt', '/etc/ssl/certs/ca-certificates.crt'],
  ]);
  const builders = new Set(copies.map((c) => /^--from=(\S+)$/.exec(c[0]!)?.[1]));
  expect(builders.size).toBe(1);
  const [builder] = [...builders];
  expect(copies[0]![1]).toBe('/out/egress-gateway');
  expect(gateway.instructions.filter((i) => i.op === 'RUN')).toEqual([]);
  expect(gateway.instructions.filter((i) => i.op === 'USER').at(-1)?.args).toBe('65534:65534');
  expect(JSON.parse(gateway.instructions.find((i) => i.op === 'ENTRYPOINT')!.args)).toEqual(['/egress-gateway']);

  // Built by gateway/build.sh (as the local cluster's image is): static and stripped, on a Go at
  // least as new as gateway/go.mod asks for, from the gateway sources only.
  const build = stage(builder!);
  expect(runs(build)).toMatch(/\.\/build\.sh \/out\b/);
  expect(build.instructions.filter((i) => i.op === 'COPY').map((i) => i.args)).toEqual(['gateway ./']);
  const script = readFileSync(join(ROOT, 'gateway/build.sh'), 'utf8');
  for (const flag of [/CGO_ENABLED=0/, /-trimpath/, /-ldflags "-s -w /, /-o "\$out\/egress-gateway"/]) expect(script).toMatch(flag);
  const [, goMin] = /^go (\d+\.\d+)/m.exec(readFileSync(join(ROOT, 'gateway/go.mod'), 'utf8')) ?? [];
  const [, goImage] = /^golang:(\d+\.\d+)/.exec(build.from) ?? [];
  expect(Number(goImage!.split('.')[1])).toBeGreaterThanOrEqual(Number(goMin!.split('.')[1]));

  // The chart runs this image's entrypoint with the `serve` subcommand, as 65534 on a read-only
  // root; the image's only files are read, the keys come as mounted files.
  const values = load(readFileSync(join(CHART, 'values.yaml'), 'utf8')) as { egressGateway: { image: { repository: string; tag: string } } };
  expect(values.egressGateway.image.tag).toBe('');
  const spec = template().one('Deployment', 'rel-sandbox-bridge-egress-gateway').spec.template.spec;
  expect(spec.containers[0].image).toBe(`${values.egressGateway.image.repository}:${pkg.version}`);
  expect(spec.containers[0].command).toBeUndefined();
  expect(spec.containers[0].args[0]).toBe('serve');
  expect(readFileSync(join(ROOT, 'gateway/main.go'), 'utf8')).toMatch(/case "serve":/);
  expect(spec.containers[0].securityContext).toMatchObject({ readOnlyRootFilesystem: true, runAsUser: 65534 });
  expect(spec.containers[0].volumeMounts.every((m: { readOnly?: boolean }) => m.readOnly === true)).toBe(true);
});

test('runs as 65534; default command is the bridge, the operator is an argument away', () => {
  const user = runtime.instructions.filter((i) => i.op === 'USER').at(-1)?.args;
  expect(user).toMatch(/^65534(:65534)?$/);
  const entrypoint = JSON.parse(runtime.instructions.find((i) => i.op === 'ENTRYPOINT')!.args) as string[];
  const cmd = JSON.parse(runtime.instructions.find((i) => i.op === 'CMD')!.args) as string[];
  // node alone; each program's V8 flags come with its script, the same per program as every
  // other launcher uses (common/node-flags.ts): the image's default command is the bridge's.
  expect(entrypoint).toHaveLength(1);
  expect(entrypoint[0]).toMatch(/\/node$/);
  expect(cmd).toEqual([...NODE_FLAGS.bridge, 'dist/bridge/main.js']);
  // The chart passes both programs' flags and scripts as args (the bridge's too, so the chart
  // does not depend on the image's CMD; chart-manifests checks manifests/ renders the same);
  // both entry points exist in the build output (the integration globalSetup compiled dist/).
  const args = (name: string) => template().one('Deployment', name).spec.template.spec.containers[0].args as string[];
  const bridgeArgs = args('rel-sandbox-bridge-bridge');
  const operatorArgs = args('rel-sandbox-bridge-operator');
  expect(bridgeArgs).toEqual([...NODE_FLAGS.bridge, 'dist/bridge/main.js']);
  expect(operatorArgs).toEqual([...NODE_FLAGS.operator, 'dist/operator/main.js']);
  for (const entry of [cmd.at(-1)!, bridgeArgs.at(-1)!, operatorArgs.at(-1)!]) expect(existsSync(join(ROOT, entry))).toBe(true);
  // Exec form only: node itself is PID 1 and receives SIGTERM (a shell form would swallow it).
  for (const i of runtime.instructions.filter((x) => x.op === 'CMD' || x.op === 'ENTRYPOINT')) expect(i.args.trim().startsWith('[')).toBe(true);
});

test('both programs handle SIGTERM themselves (node as PID 1 has no default handler)', () => {
  for (const main of ['bridge/main.ts', 'operator/main.ts']) {
    expect(readFileSync(join(ROOT, main), 'utf8')).toMatch(/process\.on\(\s*'SIGTERM'/);
  }
});

test('everything the compiled programs import is a production dependency', () => {
  // The deps stage installs `dependencies` only; a bare import of anything else would crash at start.
  const res = spawnSync('grep', ['-rhoE', "from '[^.][^']*'", join(ROOT, 'dist/bridge'), join(ROOT, 'dist/operator'), join(ROOT, 'dist/common')], { encoding: 'utf8' });
  const specifiers = new Set(
    res.stdout
      .split('\n')
      .map((l) => /from '([^']+)'/.exec(l)?.[1])
      .filter((s): s is string => !!s && !s.startsWith('node:'))
      .map((s) => (s.startsWith('@') ? s.split('/').slice(0, 2).join('/') : s.split('/')[0]!)),
  );
  expect(specifiers.size).toBeGreaterThan(0);
  for (const s of specifiers) expect({ s, prod: s in pkg.dependencies }).toEqual({ s, prod: true });
});

test('nothing writes to the root filesystem: the chart mounts a read-only root with only /tmp writable', () => {
  const spec = template().one('Deployment', 'rel-sandbox-bridge-bridge').spec.template.spec;
  expect(spec.containers[0].securityContext.readOnlyRootFilesystem).toBe(true);
  expect(spec.containers[0].volumeMounts.map((m: { mountPath: string }) => m.mountPath).sort()).toEqual([
    '/tmp',
    '/var/run/secrets/sandbox-bridge',
    '/var/run/secrets/sandbox-bridge-boxd',
    '/var/run/secrets/sandbox-bridge-egress',
  ]);
});

test('.dockerignore keeps node_modules, dist, the cluster and tests out of the build context', () => {
  const ignore = readFileSync(join(ROOT, '.dockerignore'), 'utf8').split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#'));
  expect(ignore[0]).toBe('*'); // allowlist
  const allowed = ignore.filter((l) => l.startsWith('!')).map((l) => l.slice(1).replace(/\/$/, ''));
  for (const p of ['node_modules', 'dist', '.cluster', '.git', 'test', 'bench']) expect(allowed).not.toContain(p);
  // Everything the Dockerfile copies from the context is allowed.
  const fromContext = stages
    .flatMap((s) => s.instructions)
    .filter((i) => i.op === 'COPY' && !i.args.startsWith('--from'))
    .flatMap((i) => i.args.split(/\s+/).slice(0, -1))
    .map((p) => p.replace(/^\.\//, '').replace(/\/$/, ''));
  for (const p of fromContext) expect({ p, allowed: allowed.includes(p) }).toEqual({ p, allowed: true });
  expect(ignore).toContain('**/*.test.ts');
});

test("the chart's image points at this image, tagged with the package version", () => {
  const values = load(readFileSync(join(CHART, 'values.yaml'), 'utf8')) as { image: { repository: string; tag: string } };
  expect(values.image.tag).toBe('');
  const image = template().one('Deployment', 'rel-sandbox-bridge-bridge').spec.template.spec.containers[0].image as string;
  expect(image).toBe(`${values.image.repository}:${pkg.version}`);
});
