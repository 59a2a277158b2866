// Helpers for integration tests against the local cluster that jest's globalSetup starts.
// Every test creates its own namespace and deletes it afterwards.
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Writable } from 'node:stream';
import * as k8s from '@kubernetes/client-node';

export function testKubeConfig(): k8s.KubeConfig {
  const path = process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG;
  if (!path) throw new Error('SANDBOX_BRIDGE_TEST_KUBECONFIG is unset: run integration tests through `npm test`');
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(path);
  return kc;
}

/** A namespace of this test's own, named `<prefix>-<random>`. */
export async function createTestNamespace(
  kc: k8s.KubeConfig,
  prefix: string,
  labels: Record<string, string> = {},
): Promise<string> {
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const name = `${prefix}-${randomBytes(3).toString('hex')}`;
  await core.createNamespace({ body: { metadata: { name, labels: { 'sandbox-bridge.io/test': 'true', ...labels } } } });
  return name;
}

export async function deleteTestNamespace(kc: k8s.KubeConfig, name: string): Promise<void> {
  const core = kc.makeApiClient(k8s.CoreV1Api);
  await core.deleteNamespace({ name, propagationPolicy: 'Background' }).catch((err: unknown) => {
    if (!(err instanceof k8s.ApiException && err.code === 404)) throw err;
  });
}

/** Polls `probe` until it returns a value other than undefined, or fails after `timeoutMs`. */
export async function waitFor<T>(
  what: string,
  probe: () => Promise<T | undefined>,
  { timeoutMs = 30_000, intervalMs = 100 } = {},
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  while (Date.now() < deadline) {
    try {
      const value = await probe();
      if (value !== undefined) return value;
    } catch (err) {
      lastError = err;
    }
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${lastError ? `: ${String(lastError)}` : ''}`);
}

/** A pod spec that passes the `restricted` Pod Security level. */
export function restrictedPod(name: string, overrides: Partial<k8s.V1PodSpec> = {}): k8s.V1Pod {
  return {
    metadata: { name },
    spec: {
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      securityContext: {
        runAsNonRoot: true,
        runAsUser: 65534,
        runAsGroup: 65534,
        seccompProfile: { type: 'RuntimeDefault' },
      },
      containers: [
        {
          name: 'box',
          image: LOCAL_BOX_IMAGE,
          command: ['sleep', 'infinity'],
          securityContext: {
            allowPrivilegeEscalation: false,
            readOnlyRootFilesystem: true,
            capabilities: { drop: ['ALL'] },
          },
        },
      ],
      ...overrides,
    },
  };
}

export interface ExecResult {
  stdout: string;
  stderr: string;
  status: k8s.V1Status;
}

/** Runs argv in a pod through the API server's exec subresource and collects its output. */
export async function execInPod(
  kc: k8s.KubeConfig,
  namespace: string,
  pod: string,
  container: string,
  argv: string[],
): Promise<ExecResult> {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  const sink = (chunks: Buffer[]) =>
    new Writable({
      write(chunk: Buffer, _enc, done) {
        chunks.push(chunk);
        done();
      },
    });
  return new Promise<ExecResult>((resolve, reject) => {
    let status: k8s.V1Status | undefined;
    new k8s.Exec(kc)
      .exec(namespace, pod, container, argv, sink(out), sink(err), null, false, (s) => {
        status = s;
      })
      .then((ws) => {
        ws.on('error', reject);
        ws.on('close', () => {
          if (!status) return reject(new Error('exec stream closed without a status frame'));
          resolve({ stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString(), status });
        });
      }, reject);
  });
}

/** The exit code a V1Status from the exec status channel reports. */
export function exitCodeOf(status: k8s.V1Status): number {
  if (status.status === 'Success') return 0;
  const cause = status.details?.causes?.find((c) => c.reason === 'ExitCode');
  if (cause?.message === undefined) throw new Error(`exec failed: ${status.message ?? JSON.stringify(status)}`);
  return Number(cause.message);
}

/**
 * The box image test/cluster/real-node/images.sh builds and imports into the real node (busybox
 * with sh and coreutils, user 65534). Not the pool default (a published image no registry here
 * serves): tests that put boxes on the real node name it.
 */
export const LOCAL_BOX_IMAGE = 'sandbox-bridge.local/box:dev';

/** Label (and taint key) of the local cluster's real node (test/cluster/real-node/). */
export const REAL_NODE_LABEL = 'sandbox-bridge.io/real-node';

export type RealNode = { available: true; name: string } | { available: false; reason: string };

/**
 * Whether the local cluster has its real node (kubelet + containerd + runc) up and Ready.
 * When it has not, `reason` says why: the cause test/cluster/up.sh recorded in
 * .cluster/real-node.unavailable (not root, packages missing, kubelet failed, --no-real-node),
 * or what the API shows.
 */
export async function realNodeAvailable(kc: k8s.KubeConfig = testKubeConfig()): Promise<RealNode> {
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const recorded = () => {
    const kubeconfig = process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG;
    const file = kubeconfig ? join(dirname(kubeconfig), 'real-node.unavailable') : undefined;
    return file && existsSync(file) ? readFileSync(file, 'utf8').trim() : undefined;
  };
  let nodes: k8s.V1NodeList;
  try {
    nodes = await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` });
  } catch (err) {
    return { available: false, reason: `cannot list nodes: ${String(err)}` };
  }
  const node = nodes.items[0];
  if (!node) {
    return {
      available: false,
      reason:
        recorded() ??
        `no node labelled ${REAL_NODE_LABEL}=true in the cluster (started before the real node existed? ` +
          'run test/cluster/up.sh again, as root)',
    };
  }
  const ready = node.status?.conditions?.find((c) => c.type === 'Ready');
  if (ready?.status !== 'True') {
    return {
      available: false,
      reason: `node ${node.metadata?.name} is not Ready (${ready?.reason ?? 'no Ready condition'}: ${ready?.message ?? ''})`,
    };
  }
  return { available: true, name: node.metadata!.name! };
}

/** The RuntimeClass test/cluster/real-node/up.sh creates when runsc can run on this machine. */
export const GVISOR_RUNTIME_CLASS = 'gvisor';

/**
 * Whether the real node offers the gVisor RuntimeClass; when not, why: what up.sh recorded in
 * .cluster/gvisor.unavailable (runsc's own error), or that the real node itself is missing.
 */
export async function gvisorAvailable(kc: k8s.KubeConfig = testKubeConfig()): Promise<{ available: true } | { available: false; reason: string }> {
  const node = await realNodeAvailable(kc);
  if (!node.available) return { available: false, reason: `the real node is not available: ${node.reason}` };
  const exists = await kc
    .makeApiClient(k8s.NodeV1Api)
    .readRuntimeClass({ name: GVISOR_RUNTIME_CLASS })
    .then(
      () => true,
      () => false,
    );
  if (exists) return { available: true };
  const kubeconfig = process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG;
  const file = kubeconfig ? join(dirname(kubeconfig), 'gvisor.unavailable') : undefined;
  const recorded = file && existsSync(file) ? readFileSync(file, 'utf8').trim() : undefined;
  return { available: false, reason: recorded ?? `no RuntimeClass ${GVISOR_RUNTIME_CLASS} (real node started before gVisor support? run test/cluster/up.sh again)` };
}

/**
 * A box as the bridge makes it (restricted, the local box image, user 65534, /workspace and /tmp
 * emptyDirs), pinned to the real node, running `command`.
 */
export function realNodeBox(
  name: string,
  command: string,
  options: { memory?: string; labels?: Record<string, string>; runtimeClassName?: string } = {},
): k8s.V1Pod {
  const memory = options.memory ?? '64Mi';
  const pod = restrictedPod(
    name,
    onRealNode({
      containers: [],
      restartPolicy: 'Never',
      terminationGracePeriodSeconds: 1,
      ...(options.runtimeClassName ? { runtimeClassName: options.runtimeClassName } : {}),
      volumes: [
        { name: 'workspace', emptyDir: { sizeLimit: '256Mi' } },
        { name: 'tmp', emptyDir: { sizeLimit: '64Mi' } },
      ],
    }),
  );
  if (options.labels) pod.metadata!.labels = options.labels;
  // restrictedPod's container, made into a box: the spread above replaced the list.
  const base = restrictedPod(name).spec!.containers[0]!;
  pod.spec!.containers = [
    {
      ...base,
      image: LOCAL_BOX_IMAGE,
      // Locally built and imported (test/cluster/real-node/images.sh); no registry to pull from.
      imagePullPolicy: 'Never',
      command: ['sh', '-c', command],
      workingDir: '/workspace',
      resources: { requests: { cpu: '50m', memory }, limits: { cpu: '500m', memory } },
      volumeMounts: [
        { name: 'workspace', mountPath: '/workspace' },
        { name: 'tmp', mountPath: '/tmp' },
      ],
    },
  ];
  return pod;
}

/** Waits until the pod runs; fails with its status (and events) when it does not within `timeoutMs`. */
export async function waitRunning(kc: k8s.KubeConfig, namespace: string, name: string, timeoutMs = 90_000): Promise<k8s.V1Pod> {
  const core = kc.makeApiClient(k8s.CoreV1Api);
  try {
    return await waitFor(
      `pod ${name} to be Running`,
      async () => {
        const p = await core.readNamespacedPod({ namespace, name });
        return p.status?.phase === 'Running' ? p : undefined;
      },
      { timeoutMs, intervalMs: 250 },
    );
  } catch (err) {
    const pod = await core.readNamespacedPod({ namespace, name }).catch(() => undefined);
    const events = await core.listNamespacedEvent({ namespace, fieldSelector: `involvedObject.name=${name}` }).catch(() => undefined);
    const said = (events?.items ?? []).map((e) => `${e.reason}: ${e.message}`).join('\n');
    throw new Error(`${String(err)}\nstatus: ${JSON.stringify(pod?.status?.containerStatuses ?? pod?.status)}\nevents:\n${said}`);
  }
}

/** The node selector and toleration that put a pod on the real node (and only there). */
export function onRealNode(spec: k8s.V1PodSpec): k8s.V1PodSpec {
  return {
    ...spec,
    nodeSelector: { ...spec.nodeSelector, [REAL_NODE_LABEL]: 'true' },
    tolerations: [...(spec.tolerations ?? []), { key: REAL_NODE_LABEL, operator: 'Exists', effect: 'NoSchedule' }],
  };
}
