// Helpers for the chart tests: run the helm binary the local cluster build provides
// (.cluster/bin/helm, or $HELM) and parse what it renders.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
// js-yaml is what @kubernetes/client-node parses YAML with (installed with it). Its loader is
// used directly because client-node's loadYaml turns objects into its model classes, which
// rename fields (NetworkPolicy `from` becomes `_from`).
import { load } from 'js-yaml';

export const ROOT = process.cwd();
export const CHART = join(ROOT, 'charts/sandbox-bridge');
export const HELM = process.env.HELM ?? join(ROOT, '.cluster/bin/helm');
/** Satisfies Chart.yaml's kubeVersion: a helm built without version ldflags assumes v1.20. */
export const KUBE_VERSION = '1.35.0';
export const MONITORING_APIS = ['monitoring.coreos.com/v1/ServiceMonitor', 'monitoring.coreos.com/v1/PrometheusRule'];
/** A token long enough for the bridge (>= 16 characters). */
export const TOKEN = 'chart-test-token-0123456789abcdef';

export interface HelmResult {
  status: number | null;
  stdout: string;
  stderr: string;
}

export function helm(args: string[], options: { timeoutMs?: number; env?: Record<string, string> } = {}): HelmResult {
  const res = spawnSync(HELM, args, {
    encoding: 'utf8',
    timeout: options.timeoutMs ?? 60_000,
    env: { ...process.env, ...options.env },
  });
  if (res.error) throw res.error;
  return { status: res.status, stdout: res.stdout, stderr: res.stderr };
}

/** Values are written to a file (JSON is YAML) so nested objects and lists need no --set escaping. */
export function withValuesFile<T>(values: Record<string, unknown>, fn: (path: string) => T): T {
  const dir = mkdtempSync(join(tmpdir(), 'chart-values-'));
  const path = join(dir, 'values.json');
  writeFileSync(path, JSON.stringify(values));
  try {
    return fn(path);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Doc = Record<string, any> & { kind: string; metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> } };

export interface Rendered extends HelmResult {
  docs: Doc[];
  /** The only object of this kind (and name, if given); throws if there is not exactly one. */
  one(kind: string, name?: string): Doc;
  all(kind: string): Doc[];
}

export function parseDocs(text: string): Doc[] {
  return text
    .split(/^---\s*$/m)
    .map((chunk) => chunk.trim())
    .filter((chunk) => chunk.replace(/^#.*$/gm, '').trim().length > 0)
    .map((chunk) => load(chunk) as Doc);
}

export function template(
  values: Record<string, unknown> = { secret: { token: TOKEN } },
  options: { release?: string; namespace?: string; apiVersions?: string[]; extraArgs?: string[] } = {},
): Rendered {
  const res = withValuesFile(values, (file) =>
    helm([
      'template',
      options.release ?? 'rel',
      CHART,
      '--namespace',
      options.namespace ?? 'bridge-ns',
      '--kube-version',
      KUBE_VERSION,
      '-f',
      file,
      ...(options.apiVersions ?? []).flatMap((v) => ['--api-versions', v]),
      ...(options.extraArgs ?? []),
    ]),
  );
  const docs = res.status === 0 ? parseDocs(res.stdout) : [];
  const all = (kind: string) => docs.filter((d) => d.kind === kind);
  return {
    ...res,
    docs,
    all,
    one(kind, name) {
      const found = all(kind).filter((d) => name === undefined || d.metadata.name === name);
      if (found.length !== 1) throw new Error(`expected one ${kind}${name ? ` ${name}` : ''}, found ${found.length}`);
      return found[0]!;
    },
  };
}
