// POOL_DEFAULTS is the one definition of the SandboxPool's defaults: the CRD's `default:`s and
// the chart values that seed the default pool must say exactly the same.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { load } from 'js-yaml';
import { DEFAULT_BOX_IMAGE, POOL_DEFAULTS, RESOLVER_DEFAULTS, withDefaults } from './pool.js';

const ROOT = process.cwd();
const CHART = join(ROOT, 'charts/sandbox-bridge');

type Schema = { default?: unknown; properties?: Record<string, Schema> };

/** Every `default:` under a schema, by dotted path; an object's `{}` default only makes its children's apply. */
function schemaDefaults(schema: Schema, path = ''): Map<string, unknown> {
  const found = new Map<string, unknown>();
  for (const [name, child] of Object.entries(schema.properties ?? {})) {
    const at = path ? `${path}.${name}` : name;
    if (child.default !== undefined && !child.properties) found.set(at, child.default);
    for (const [p, v] of schemaDefaults(child, at)) found.set(p, v);
  }
  return found;
}

/** Leaf values by dotted path (arrays and label maps are leaves). */
function leaves(value: unknown, path = ''): Map<string, unknown> {
  const found = new Map<string, unknown>();
  if (value && typeof value === 'object' && !Array.isArray(value) && !/podLabels$/i.test(path)) {
    for (const [name, child] of Object.entries(value)) for (const [p, v] of leaves(child, path ? `${path}.${name}` : name)) found.set(p, v);
  } else found.set(path, value);
  return found;
}

function crdSpecSchema(file: string): Schema {
  const crd = load(readFileSync(file, 'utf8')) as { spec: { versions: Array<{ schema: { openAPIV3Schema: Schema } }> } };
  return crd.spec.versions[0]!.schema.openAPIV3Schema.properties!.spec!;
}

const defaults = leaves(POOL_DEFAULTS);
// Optional objects (no default of their own): their fields' defaults apply when they are given.
const optionalDefaults = leaves({ egress: { credentialResolver: RESOLVER_DEFAULTS } });

test('the CRD defaults every field POOL_DEFAULTS has, to the same value, and nothing else', () => {
  for (const file of [join(CHART, 'crds/sandboxpools.sandbox-bridge.io.yaml'), join(ROOT, 'manifests/crds/sandboxpools.sandbox-bridge.io.yaml')]) {
    expect(Object.fromEntries(schemaDefaults(crdSpecSchema(file)))).toEqual({ ...Object.fromEntries(defaults), ...Object.fromEntries(optionalDefaults) });
  }
});

test("the chart's values seed the default pool with POOL_DEFAULTS", () => {
  const values = load(readFileSync(join(CHART, 'values.yaml'), 'utf8')) as Record<string, Record<string, unknown>>;
  const box = values.box!;
  const pool = values.pool! as Record<string, unknown> & { egress: Record<string, unknown>; warm: Record<string, unknown> };
  // Where templates/sandboxpool.yaml takes each spec field from.
  const seeded: Record<string, unknown> = {
    podSecurityLevel: pool.podSecurityLevel,
    maxBoxes: box.maxConcurrentBoxes,
    maxBoxesPerSession: box.maxBoxesPerSession,
    maxExecsPerBox: pool.maxExecsPerBox,
    defaultTtlSeconds: box.defaultTtlSeconds,
    'box.defaultImage': box.defaultImage,
    'box.defaultCpu': box.defaultCpu,
    'box.maxCpu': box.maxCpu,
    'box.defaultMemory': box.defaultMemory,
    'box.maxMemory': box.maxMemory,
    'box.memoryStores.enabled': (box.memoryStores as Record<string, unknown>).enabled,
    'box.boxdDelivery': (values.boxd as Record<string, unknown>).delivery,
    allowedImages: pool.allowedImages,
    allowedRuntimeClassNames: pool.allowedRuntimeClassNames,
    allowedServiceAccountNames: pool.allowedServiceAccountNames,
    'egress.allowedCIDRs': pool.egress.allowedCIDRs,
    'egress.deniedCIDRs': pool.egress.deniedCIDRs,
    'egress.dns.namespace': (pool.egress.dns as Record<string, unknown>).namespace,
    'egress.dns.podLabels': (pool.egress.dns as Record<string, unknown>).podLabels,
    'egress.dns.cidrs': (pool.egress.dns as Record<string, unknown>).cidrs,
    'egress.mode': pool.egress.mode,
    'egress.domains.allow': (pool.egress.domains as Record<string, unknown>).allow,
    'egress.domains.deny': (pool.egress.domains as Record<string, unknown>).deny,
    'egress.domains.plainHttp': (pool.egress.domains as Record<string, unknown>).plainHttp,
    'snapshots.retentionSeconds': (pool.snapshots as Record<string, unknown>).retentionSeconds,
    'snapshots.onDelete': (pool.snapshots as Record<string, unknown>).onDelete,
    'snapshots.maxEntries': (pool.snapshots as Record<string, unknown>).maxEntries,
    'warm.count': (pool.warm as Record<string, unknown>).count,
    'warm.windowSeconds': (pool.warm as Record<string, unknown>).windowSeconds,
    'idle.sleepAfterSeconds': (pool.idle as Record<string, unknown>).sleepAfterSeconds,
  };
  // The chart leaves these to the CRD's defaults, or (the bridge) sets them from the release.
  const notSeeded = ['egress.gateway.namespace', 'egress.gateway.podLabels', 'egress.gateway.port', 'egress.gateway.service', 'box.workspaceSizeLimit', 'box.tmpSizeLimit', 'box.memoryStores.sizeLimit', 'bridge.namespace', 'bridge.podLabels', 'bridge.operatorPodLabels'];
  expect([...Object.keys(seeded), ...notSeeded].sort()).toEqual([...defaults.keys()].sort());
  for (const [path, value] of Object.entries(seeded)) expect({ path, value }).toEqual({ path, value: defaults.get(path) });
  const template = readFileSync(join(CHART, 'templates/sandboxpool.yaml'), 'utf8');
  for (const field of notSeeded.filter((f) => f.startsWith('box.'))) expect(template).not.toContain(field.split('.').at(-1));
});

test('the default image is fully qualified and is not the locally built test image', () => {
  // registry host (with a dot), repository, tag
  expect(DEFAULT_BOX_IMAGE).toMatch(/^[a-z0-9-]+(\.[a-z0-9-]+)+\/[a-z0-9._/-]+:[\w.-]+$/);
  expect(DEFAULT_BOX_IMAGE).not.toMatch(/sandbox-bridge/);
  expect(withDefaults({ namespace: 'x' }).box.defaultImage).toBe(DEFAULT_BOX_IMAGE);
});
