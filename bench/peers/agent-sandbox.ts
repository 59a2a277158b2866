// kubernetes-sigs/agent-sandbox on the local cluster, for bench:peers: its controller built from
// its Go module (agent-sandbox.sh; nothing of it is in this repository), its CRDs installed from
// the module's own files, the controller run on this host against the local cluster's
// kubeconfig, and the objects a warm-pool user of it makes (SandboxTemplate, SandboxWarmPool,
// SandboxClaim).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import * as k8s from '@kubernetes/client-node';
import { freePort, kubectl, ON_REAL_NODE, waitUntil } from '../setup.js';

export const SANDBOX_GROUP = 'agents.x-k8s.io';
export const EXTENSIONS_GROUP = 'extensions.agents.x-k8s.io';
export const VERSION = 'v1beta1';
/** The label its claim controller puts on a Sandbox: "warm" (adopted from the pool) or "cold". */
export const LAUNCH_TYPE_LABEL = 'agents.x-k8s.io/launch-type';
export const BOX_CONTAINER = 'box';

/** Builds (first time) or finds the controller; returns its cache directory (bin/, crds/) and version. */
export function buildAgentSandbox(root: string): { dir: string; version: string } {
  const r = spawnSync('bash', [join(root, 'bench/peers/agent-sandbox.sh')], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
  if (r.status !== 0) throw new Error('bench/peers/agent-sandbox.sh failed');
  const dir = r.stdout.trim();
  const version = spawnSync(join(dir, 'bin/agent-sandbox-controller'), ['-version'], { encoding: 'utf8' }).stdout.match(/version (\S+)/)?.[1] ?? 'unknown';
  return { dir, version };
}

/**
 * Installs the module's CRDs (k8s/crds) with one change: conversion strategy None instead of
 * Webhook. Their conversion webhook is served by the controller behind a Service in
 * agent-sandbox-system, which the API server cannot reach for a controller on this host, so the
 * controller runs with --enable-webhook=false, and its own message says the CRDs must then use
 * strategy None. The bench uses v1beta1 only (the storage version), so nothing is converted.
 */
export function installCrds(root: string, kubeconfig: string, dir: string): string[] {
  const tmp = mkdtempSync(join(tmpdir(), 'bench-peers-crds-'));
  const names: string[] = [];
  try {
    for (const file of readdirSync(join(dir, 'crds')).filter((f) => f.endsWith('.yaml'))) {
      // As JSON (their CRDs are up to 400 kB of YAML, past spawnSync's default 1 MiB as JSON).
      const json = spawnSync(join(root, '.cluster/bin/kubectl'), ['--kubeconfig', kubeconfig, 'create', '--dry-run=client', '-o', 'json', '-f', join(dir, 'crds', file)], {
        encoding: 'utf8',
        maxBuffer: 64 << 20,
      });
      if (json.status !== 0) throw new Error(`kubectl create --dry-run -f ${file}: ${json.stderr}`);
      const crd = JSON.parse(json.stdout) as k8s.V1CustomResourceDefinition;
      crd.spec.conversion = { strategy: 'None' };
      const out = join(tmp, `${file}.json`);
      writeFileSync(out, JSON.stringify(crd));
      kubectl(root, kubeconfig, 'apply', '--server-side', '--force-conflicts', '--field-manager=sandbox-bridge-bench', '-f', out);
      names.push(crd.metadata!.name!);
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  kubectl(root, kubeconfig, 'wait', '--for=condition=Established', '--timeout=60s', ...names.map((n) => `crd/${n}`));
  return names;
}

export function uninstallCrds(root: string, kubeconfig: string, names: string[]): void {
  kubectl(root, kubeconfig, 'delete', '--ignore-not-found', '--timeout=120s', ...names.map((n) => `crd/${n}`));
}

/**
 * The controller on this host, its extensions (claims, templates, warm pools) on, leader election
 * and the webhook server off, metrics and probes on loopback ports (its defaults are :8080 and
 * :8081 on every interface), pointed at the local cluster's kubeconfig alone. Everything else is
 * its default (100 sandbox / 50 claim workers, no client-side rate limit, events on). Its log goes
 * to logFile. Resolves once its readiness probe answers.
 */
export async function startController(dir: string, kubeconfig: string, logFile: string): Promise<ChildProcess> {
  const probe = await freePort();
  const log = createWriteStream(logFile);
  const child = spawn(
    join(dir, 'bin/agent-sandbox-controller'),
    [
      `--kubeconfig=${kubeconfig}`,
      '--extensions',
      '--leader-elect=false',
      '--enable-webhook=false',
      `--metrics-bind-address=127.0.0.1:${await freePort()}`,
      `--health-probe-bind-address=127.0.0.1:${probe}`,
    ],
    { env: { PATH: process.env.PATH, KUBECONFIG: kubeconfig, HOME: process.env.HOME }, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  child.stdout!.pipe(log);
  child.stderr!.pipe(log);
  let exited: number | null | undefined;
  child.on('exit', (code) => (exited = code));
  await waitUntil(
    'the agent-sandbox controller to be ready',
    async () => {
      if (exited !== undefined) throw new Error(`agent-sandbox-controller exited (${exited}); see ${logFile}`);
      return (await fetch(`http://127.0.0.1:${probe}/readyz`)).ok;
    },
    60_000,
  );
  return child;
}

/**
 * The same box as ours, for their pool: the box image, 50m and memory as requests and limits
 * (Guaranteed), the real node, uid 65534 with the restricted profile, a read-only root, writable
 * /workspace and /tmp, no service account token. Their core has no in-box agent for an image like
 * this, so the container only stays up (a shell that sleeps and exits on SIGTERM).
 */
export function templateSpec(o: { image: string; cpu: string; memory: string }): Record<string, unknown> {
  const resources = { requests: { cpu: o.cpu, memory: o.memory }, limits: { cpu: o.cpu, memory: o.memory } };
  return {
    podTemplate: {
      metadata: {},
      spec: {
        automountServiceAccountToken: false,
        enableServiceLinks: false,
        terminationGracePeriodSeconds: 5,
        ...ON_REAL_NODE,
        securityContext: { runAsNonRoot: true, runAsUser: 65534, runAsGroup: 65534, fsGroup: 65534, seccompProfile: { type: 'RuntimeDefault' } },
        containers: [
          {
            name: BOX_CONTAINER,
            image: o.image,
            imagePullPolicy: 'IfNotPresent',
            command: ['/bin/sh', '-c', "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"],
            workingDir: '/workspace',
            env: [{ name: 'HOME', value: '/workspace' }],
            resources,
            securityContext: { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, runAsNonRoot: true, capabilities: { drop: ['ALL'] } },
            volumeMounts: [
              { name: 'workspace', mountPath: '/workspace' },
              { name: 'tmp', mountPath: '/tmp' },
            ],
          },
        ],
        volumes: [
          { name: 'workspace', emptyDir: {} },
          { name: 'tmp', emptyDir: {} },
        ],
      },
    },
  };
}

/** Their objects in one namespace, through the API as a user of theirs would make them. */
export class AgentSandboxObjects {
  private readonly custom: k8s.CustomObjectsApi;

  constructor(
    kc: k8s.KubeConfig,
    readonly namespace: string,
  ) {
    this.custom = kc.makeApiClient(k8s.CustomObjectsApi);
  }

  private create(plural: string, kind: string, name: string, spec: unknown): Promise<k8s.KubernetesObject> {
    return this.custom.createNamespacedCustomObject({
      group: EXTENSIONS_GROUP,
      version: VERSION,
      namespace: this.namespace,
      plural,
      body: { apiVersion: `${EXTENSIONS_GROUP}/${VERSION}`, kind, metadata: { name }, spec },
    }) as Promise<k8s.KubernetesObject>;
  }

  template(name: string, spec: Record<string, unknown>) {
    return this.create('sandboxtemplates', 'SandboxTemplate', name, spec);
  }

  warmPool(name: string, template: string, replicas: number) {
    return this.create('sandboxwarmpools', 'SandboxWarmPool', name, { replicas, sandboxTemplateRef: { name: template } });
  }

  /** A claim on the warm pool; its uid, to find the Sandbox it gets (owner reference). */
  async claim(name: string, warmPool: string): Promise<string> {
    const claim = await this.create('sandboxclaims', 'SandboxClaim', name, { warmPoolRef: { name: warmPool } });
    return claim.metadata!.uid!;
  }

  async deleteClaim(name: string): Promise<void> {
    await this.custom.deleteNamespacedCustomObject({ group: EXTENSIONS_GROUP, version: VERSION, namespace: this.namespace, plural: 'sandboxclaims', name });
  }

  async deleteAll(): Promise<void> {
    for (const plural of ['sandboxclaims', 'sandboxwarmpools', 'sandboxtemplates']) {
      await this.custom.deleteCollectionNamespacedCustomObject({ group: EXTENSIONS_GROUP, version: VERSION, namespace: this.namespace, plural }).catch(() => undefined);
    }
  }

  /** A watch cache of the namespace's Sandboxes (what the claims get), for bench:peers. */
  sandboxInformer(kc: k8s.KubeConfig): k8s.Informer<k8s.KubernetesObject> & k8s.ObjectCache<k8s.KubernetesObject> {
    return k8s.makeInformer(
      kc,
      `/apis/${SANDBOX_GROUP}/${VERSION}/namespaces/${this.namespace}/sandboxes`,
      () => this.custom.listNamespacedCustomObject({ group: SANDBOX_GROUP, version: VERSION, namespace: this.namespace, plural: 'sandboxes' }) as Promise<k8s.KubernetesListObject<k8s.KubernetesObject>>,
    );
  }

  /** A watch cache of the namespace's SandboxClaims. */
  claimInformer(kc: k8s.KubeConfig): k8s.Informer<k8s.KubernetesObject> & k8s.ObjectCache<k8s.KubernetesObject> {
    return k8s.makeInformer(
      kc,
      `/apis/${EXTENSIONS_GROUP}/${VERSION}/namespaces/${this.namespace}/sandboxclaims`,
      () => this.custom.listNamespacedCustomObject({ group: EXTENSIONS_GROUP, version: VERSION, namespace: this.namespace, plural: 'sandboxclaims' }) as Promise<k8s.KubernetesListObject<k8s.KubernetesObject>>,
    );
  }
}

/** Whether an object of theirs (Sandbox, SandboxClaim) has condition Ready=True. */
export function isReady(obj: k8s.KubernetesObject): boolean {
  const conditions = (obj as { status?: { conditions?: Array<{ type: string; status: string }> } }).status?.conditions;
  return conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
}

/**
 * One command by kube exec (pods/exec through the API server and the kubelet), as a user of
 * theirs without an in-box agent runs it: `sh -c <command>`; resolves with its V1Status once the
 * stream closes, rejects after timeoutMs.
 */
export function kubeExec(kc: k8s.KubeConfig, namespace: string, pod: string, command: string, timeoutMs = 60_000): Promise<k8s.V1Status> {
  return new Promise((resolve, reject) => {
    let status: k8s.V1Status | undefined;
    let ws: { close: () => void } | undefined;
    const timer = setTimeout(() => {
      ws?.close();
      reject(new Error(`kube exec in ${pod} timed out after ${timeoutMs} ms`));
    }, timeoutMs);
    // The API server wants at least one stream; the output is read and dropped, as the bridge's is.
    const drain = () => new Writable({ write: (_chunk, _enc, done) => done() });
    new k8s.Exec(kc).exec(namespace, pod, BOX_CONTAINER, ['sh', '-c', command], drain(), drain(), null, false, (s) => (status = s)).then(
      (socket) => {
        ws = socket;
        socket.on('close', () => {
          clearTimeout(timer);
          if (status) resolve(status);
          else reject(new Error(`kube exec in ${pod}: no status`));
        });
        socket.on('error', (err) => {
          clearTimeout(timer);
          reject(err);
        });
      },
      (err: unknown) => {
        clearTimeout(timer);
        reject(err instanceof Error ? err : new Error(String(err)));
      },
    );
  });
}
