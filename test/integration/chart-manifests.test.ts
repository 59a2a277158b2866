// manifests/ is generated from the chart (scripts/generate-manifests.sh); this fails when the
// committed files drift from what the chart renders now, and checks that kustomize builds them.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { POOL_DEFAULTS } from '../../common/pool.js';
import { HELM, ROOT, parseDocs } from '../chart/helm.js';

const MANIFESTS = join(ROOT, 'manifests');
const KUBECTL = join(ROOT, '.cluster/bin/kubectl');

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? files(path) : [path];
  });
}

test('the committed manifests are what the chart renders now', () => {
  const out = mkdtempSync(join(tmpdir(), 'manifests-'));
  try {
    const res = spawnSync('bash', [join(ROOT, 'scripts/generate-manifests.sh'), out], { encoding: 'utf8', env: { ...process.env, HELM } });
    expect({ status: res.status, stderr: res.stderr }).toMatchObject({ status: 0 });
    const fresh = files(out).map((f) => relative(out, f)).sort();
    const committed = files(MANIFESTS).map((f) => relative(MANIFESTS, f)).sort();
    expect(committed).toEqual(fresh);
    const stale = fresh.filter((f) => readFileSync(join(out, f), 'utf8') !== readFileSync(join(MANIFESTS, f), 'utf8'));
    // Regenerate with: scripts/generate-manifests.sh
    expect({ stale }).toEqual({ stale: [] });
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});

test('kubectl kustomize builds them; no token is committed; the CRD and monitoring are separate', () => {
  const build = (dir: string) => {
    const res = spawnSync(KUBECTL, ['kustomize', join(MANIFESTS, dir)], { encoding: 'utf8' });
    expect({ status: res.status, stderr: res.stderr }).toMatchObject({ status: 0 });
    return parseDocs(res.stdout);
  };
  const main = build('.');
  const kinds = main.map((d) => d.kind);
  expect(kinds).toContain('CustomResourceDefinition');
  expect(kinds).toContain('SandboxPool');
  expect(kinds).not.toContain('Secret');
  expect(main.filter((d) => d.kind === 'Namespace').map((d) => d.metadata.name).sort()).toEqual(['sandbox', 'sandbox-bridge']);
  const dep = main.find((d) => d.kind === 'Deployment' && d.metadata.name === 'sandbox-bridge-bridge')!;
  const token = dep.spec.template.spec.volumes.find((v: { name: string }) => v.name === 'token');
  expect(token.secret.secretName).toBe('sandbox-bridge-token');
  // The egress gateway, its keys from Secrets you create (never committed), and the pool pointed
  // at its Service, whose name is the CRD's default for this release name.
  const gateway = main.find((d) => d.kind === 'Deployment' && d.metadata.name === 'sandbox-bridge-egress-gateway')!;
  const secretOf = (d: typeof gateway, volume: string) => d.spec.template.spec.volumes.find((v: { name: string }) => v.name === volume)?.secret?.secretName;
  expect([secretOf(gateway, 'egress-key'), secretOf(gateway, 'resolver-key'), secretOf(dep, 'egress-key')]).toEqual([
    'sandbox-bridge-egress-key',
    'sandbox-bridge-egress-resolver-key',
    'sandbox-bridge-egress-key',
  ]);
  const pool = main.find((d) => d.kind === 'SandboxPool')!;
  expect(pool.spec.egress.gateway.service).toBe(POOL_DEFAULTS.egress.gateway.service);
  expect(main.some((d) => d.kind === 'Service' && d.metadata.name === pool.spec.egress.gateway.service)).toBe(true);
  expect(build('crds').map((d) => d.kind)).toEqual(['CustomResourceDefinition']);
  expect(build('monitoring').map((d) => d.kind).sort()).toEqual(['PrometheusRule', 'ServiceMonitor']);
});
