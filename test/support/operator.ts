// Helpers for operator integration tests: install the CRD, run the operator as a real process
// (`node dist/operator/main.js`, built by the integration globalSetup), and manage pools. Each
// test file runs its operators on its own lease and pool label selector, so files running in
// parallel never reconcile each other's pools.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { buildBoxSecret } from '../../common/box-pod.js';
import { SECRET_COMPONENTS } from '../../common/labels.js';
import { NODE_FLAGS } from '../../common/node-flags.js';
import { POOL_API_VERSION, POOL_GROUP, POOL_KIND, POOL_PLURAL, POOL_VERSION, type PoolSpecInput, type SandboxPool } from '../../common/pool.js';
import { LOCAL_BOX_IMAGE, waitFor } from './cluster.js';

const ROOT = process.cwd();
export const CRD_PATH = join(ROOT, 'charts/sandbox-bridge/crds/sandboxpools.sandbox-bridge.io.yaml');
export const SHARD_LABEL = 'sandbox-bridge.io/test-shard';

/** Creates the SandboxPool CRD (or updates it to this checkout's version) and waits until it is served. */
export async function installCrd(kc: k8s.KubeConfig): Promise<void> {
  const api = kc.makeApiClient(k8s.ApiextensionsV1Api);
  const crd = k8s.loadYaml<k8s.V1CustomResourceDefinition>(readFileSync(CRD_PATH, 'utf8'));
  const name = crd.metadata!.name!;
  try {
    await api.createCustomResourceDefinition({ body: crd });
  } catch (err) {
    if (!(err instanceof k8s.ApiException && err.code === 409)) throw err;
    const live = await api.readCustomResourceDefinition({ name });
    await api.replaceCustomResourceDefinition({ name, body: { ...crd, metadata: { ...crd.metadata, resourceVersion: live.metadata?.resourceVersion } } });
  }
  await waitFor('the SandboxPool CRD to be established', async () => {
    const live = await api.readCustomResourceDefinition({ name });
    return live.status?.conditions?.some((c) => c.type === 'Established' && c.status === 'True') ? true : undefined;
  });
}

export function uniqueName(prefix: string): string {
  return `${prefix}-${randomBytes(3).toString('hex')}`;
}

export class Pools {
  readonly api: k8s.CustomObjectsApi;
  /** Pools (and their namespaces) created through this object, for cleanup(). */
  private readonly created: Array<{ name: string; namespace: string }> = [];

  constructor(
    private readonly kc: k8s.KubeConfig,
    readonly shard: string,
  ) {
    this.api = kc.makeApiClient(k8s.CustomObjectsApi);
  }

  async create(name: string, spec: PoolSpecInput): Promise<SandboxPool> {
    const pool = (await this.api.createClusterCustomObject({
      group: POOL_GROUP,
      version: POOL_VERSION,
      plural: POOL_PLURAL,
      body: { apiVersion: POOL_API_VERSION, kind: POOL_KIND, metadata: { name, labels: { [SHARD_LABEL]: this.shard } }, spec },
    })) as SandboxPool;
    this.created.push({ name, namespace: spec.namespace });
    return pool;
  }

  /** A new pool with a unique name and its own namespace, once its operator reports it Ready. */
  async createReady(spec: Record<string, unknown> = {}): Promise<{ name: string; ns: string }> {
    const name = uniqueName('sbp');
    const ns = `${name}-boxes`;
    await this.create(name, { namespace: ns, ...spec });
    await this.waitReady(name);
    return { name, ns };
  }

  /**
   * Deletes every pool this object created, the Events about them (they live in `default`,
   * outside what garbage collection removes) and their namespaces (in case the operator never
   * owned them).
   */
  async cleanup(): Promise<void> {
    const core = this.kc.makeApiClient(k8s.CoreV1Api);
    await Promise.all(this.created.map((p) => this.delete(p.name)));
    await Promise.all(
      this.created.map((p) =>
        core.deleteCollectionNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${p.name}` }).catch(() => undefined),
      ),
    );
    await Promise.all(
      this.created.map((p) => core.deleteNamespace({ name: p.namespace, propagationPolicy: 'Background' }).catch(() => undefined)),
    );
  }

  async get(name: string): Promise<SandboxPool> {
    return (await this.api.getClusterCustomObject({ group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name })) as SandboxPool;
  }

  /** JSON merge patch of the spec. */
  async patchSpec(name: string, spec: Record<string, unknown>): Promise<SandboxPool> {
    return (await this.api.patchClusterCustomObject(
      { group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name, body: { spec } },
      k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
    )) as SandboxPool;
  }

  async delete(name: string): Promise<void> {
    await this.api
      .deleteClusterCustomObject({ group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name, propagationPolicy: 'Background' })
      .catch((err: unknown) => {
        if (!(err instanceof k8s.ApiException && err.code === 404)) throw err;
      });
  }

  async waitReady(name: string, timeoutMs = 20_000): Promise<SandboxPool> {
    return waitFor(
      `pool ${name} to be Ready`,
      async () => {
        const p = await this.get(name);
        const ready = p.status?.conditions?.find((c) => c.type === 'Ready');
        return ready?.status === 'True' && p.status?.observedGeneration === p.metadata.generation ? p : undefined;
      },
      { timeoutMs },
    );
  }
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
}

export interface OperatorProcess {
  proc: ChildProcess;
  port: number;
  name: string;
  logs: () => string;
  exited: Promise<number | null>;
  /** One metric value from /metrics (sum over label sets), or undefined if the endpoint is down. */
  metric: (name: string) => Promise<number | undefined>;
  stop: (signal?: NodeJS.Signals) => Promise<number | null>;
}

export interface OperatorOptions {
  shard: string;
  leaseName: string;
  leaseNamespace?: string;
  name?: string;
  env?: Record<string, string>;
}

export async function startOperator(options: OperatorOptions): Promise<OperatorProcess> {
  const port = await freePort();
  const name = options.name ?? 'operator';
  let output = '';
  const proc = spawn(join(ROOT, 'node_modules/.bin/node'), [...NODE_FLAGS.operator, join(ROOT, 'dist/operator/main.js')], {
    env: {
      PATH: process.env.PATH,
      KUBECONFIG: process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG,
      METRICS_PORT: String(port),
      METRICS_HOST: '127.0.0.1',
      LOG_LEVEL: 'info',
      LEASE_NAMESPACE: options.leaseNamespace ?? 'default',
      LEASE_NAME: options.leaseName,
      POD_NAME: name,
      POOL_SELECTOR: `${SHARD_LABEL}=${options.shard}`,
      ...options.env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  proc.stdout!.on('data', (d: Buffer) => (output += d.toString()));
  proc.stderr!.on('data', (d: Buffer) => (output += d.toString()));
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
  const metric = async (metricName: string) => {
    try {
      const res = await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(2000) });
      const text = await res.text();
      let sum: number | undefined;
      for (const line of text.split('\n')) {
        if (line.startsWith(`${metricName} `) || line.startsWith(`${metricName}{`)) sum = (sum ?? 0) + Number(line.split(' ').pop());
      }
      return sum ?? 0;
    } catch {
      return undefined;
    }
  };
  const op: OperatorProcess = {
    proc,
    port,
    name,
    logs: () => output,
    exited,
    metric,
    stop: async (signal = 'SIGTERM') => {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode;
      proc.kill(signal);
      return exited;
    },
  };
  let exitedEarly = false;
  const ready = waitFor(`operator ${name} to serve /readyz`, async () => {
    if (exitedEarly) return false;
    const res = await fetch(`http://127.0.0.1:${port}/readyz`).catch(() => undefined);
    return res?.ok ? true : undefined;
  });
  const outcome = await Promise.race([
    ready.catch((err: unknown) => {
      proc.kill('SIGKILL');
      throw new Error(`${err instanceof Error ? err.message : String(err)}; its log:\n${output.slice(-4000)}`);
    }),
    exited.then((code) => ({ code })),
  ]);
  if (typeof outcome === 'object') {
    exitedEarly = true;
    throw new Error(`operator exited with ${outcome.code}:\n${output}`);
  }
  return op;
}

export async function deleteLease(kc: k8s.KubeConfig, name: string, namespace = 'default'): Promise<void> {
  await kc
    .makeApiClient(k8s.CoordinationV1Api)
    .deleteNamespacedLease({ name, namespace })
    .catch(() => undefined);
}

/** Deletes the pools and waits until their namespaces are gone or terminating. */
/**
 * A box's record as the bridge makes it before the box's pod (what the operator counts boxes
 * by): a Secret named after the box.
 */
export function boxRecord(name: string, pool: string): k8s.V1Secret {
  return buildBoxSecret({ name, namespace: '', poolName: pool, component: SECRET_COMPONENTS.record, token: 'test', env: {} });
}

/** A box pod as the bridge would create it: restricted, small, on a kwok node. */
export function boxPod(
  name: string,
  pool: string,
  annotations: Record<string, string> = {},
  resources: k8s.V1ResourceRequirements = { requests: { cpu: '10m', memory: '16Mi' }, limits: { cpu: '10m', memory: '16Mi' } },
): k8s.V1Pod {
  return {
    metadata: {
      name,
      labels: { 'sandbox-bridge.io/box': 'true', 'sandbox-bridge.io/pool': pool, 'app.kubernetes.io/managed-by': 'sandbox-bridge' },
      annotations,
    },
    spec: {
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      nodeSelector: { type: 'kwok' },
      securityContext: { runAsNonRoot: true, runAsUser: 65534, runAsGroup: 65534, seccompProfile: { type: 'RuntimeDefault' } },
      containers: [
        {
          name: 'box',
          image: LOCAL_BOX_IMAGE,
          command: ['sleep', 'infinity'],
          resources,
          securityContext: { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } },
        },
      ],
    },
  };
}
