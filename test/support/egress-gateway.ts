// The egress gateway as the chart installs it, on the local cluster's real node: the chart's
// gateway objects (Deployment, Services, NetworkPolicy, PDB, ServiceAccount, RBAC, key Secrets)
// rendered with `helm template` and applied into a namespace of their own, with the image
// test/cluster/real-node/images.sh builds from gateway/ as it is now. The pods reach the API
// server with in-cluster config (the `kubernetes` Service, kube-proxy on the real node) and test
// host names through hostAliases (there is no cluster DNS). Used by the egress tests and bench.
import { spawnSync } from 'node:child_process';
import * as k8s from '@kubernetes/client-node';
import { CHART, KUBE_VERSION, TOKEN, helm, parseDocs, withValuesFile, type Doc } from '../chart/helm.js';
import { REAL_NODE_LABEL, createTestNamespace, deleteTestNamespace, waitFor } from './cluster.js';
import { importRealNodeImage, type RealNodeNetwork } from './test-hosts.js';
import { uniqueName } from './operator.js';

export const GATEWAY_PORT = 3128;
const COMPONENT = 'egress-gateway';

export interface GatewayOnRealNode {
  namespace: string;
  release: string;
  /** The proxy Service and its ClusterIP (boxes get it as their proxy host: no cluster DNS here). */
  service: string;
  serviceIP: string;
  /** What the pool's spec.egress.gateway must say for its boxes to reach these pods. */
  poolGateway: { namespace: string; podLabels: Record<string, string>; service: string; host: string; port: number };
  deployment: string;
  /** The gateway pods that are Ready now. */
  readyPods(): Promise<k8s.V1Pod[]>;
  /** One pod's /metrics text (from this machine, at the pod IP). */
  metrics(pod: k8s.V1Pod): Promise<string>;
  /** Sets the replica count and waits until exactly that many pods are Ready (0: none left at all). */
  scale(replicas: number): Promise<void>;
  logs(pod: k8s.V1Pod): string;
  stop(): Promise<void>;
}

export interface GatewayOptions {
  kc: k8s.KubeConfig;
  net: RealNodeNetwork;
  /** The sandbox namespace of the pool it serves (the chart's rbac.targetNamespace). */
  poolNamespace: string;
  key: string;
  resolverKey: string;
  /** PEM of the CA the test hosts' certificates chain to (the chart's egressGateway.upstreamCA). */
  upstreamCA?: string;
  hostAliases?: Array<{ ip: string; hostnames: string[] }>;
  /** A namespace of its own (made if missing, left in place by stop()); default a new test namespace. */
  namespace?: string;
  release?: string;
  replicas?: number;
  extraArgs?: string[];
  resources?: Record<string, unknown>;
}

function kubectl(args: string[], input?: string): string {
  const res = spawnSync(`${process.cwd()}/.cluster/bin/kubectl`, args, {
    input,
    encoding: 'utf8',
    env: { ...process.env, KUBECONFIG: process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG },
  });
  if (res.status !== 0) throw new Error(`kubectl ${args.join(' ')} failed: ${res.stderr}`);
  return res.stdout;
}

export async function deployGatewayOnRealNode(o: GatewayOptions): Promise<GatewayOnRealNode> {
  importRealNodeImage('egress-gateway');
  const core = o.kc.makeApiClient(k8s.CoreV1Api);
  const apps = o.kc.makeApiClient(k8s.AppsV1Api);
  const restricted = { 'pod-security.kubernetes.io/enforce': 'restricted' };
  const namespace = o.namespace ?? (await createTestNamespace(o.kc, 'egw', restricted));
  if (o.namespace) {
    await core.createNamespace({ body: { metadata: { name: o.namespace, labels: restricted } } }).catch((err: unknown) => {
      if (!(err instanceof k8s.ApiException && err.code === 409)) throw err;
    });
  }
  const release = o.release ?? uniqueName('egw');
  if (o.upstreamCA) await core.createNamespacedConfigMap({ namespace, body: { metadata: { name: 'upstream-ca' }, data: { 'ca.crt': o.upstreamCA } } });
  const values = {
    secret: { token: TOKEN },
    rbac: { targetNamespace: o.poolNamespace, createNamespace: false },
    // The API server is reached at the forwarder behind the `kubernetes` Service (real-node/up.sh).
    networkPolicy: { apiServerPorts: [443, 6443, ...(o.net.apiForwarder ? [o.net.apiForwarder.port] : [])] },
    egressGateway: {
      replicas: o.replicas ?? 2,
      key: o.key,
      resolverKey: { key: o.resolverKey },
      image: { repository: 'sandbox-bridge.local/egress-gateway', tag: 'dev', pullPolicy: 'Never' },
      nodeSelector: { [REAL_NODE_LABEL]: 'true' },
      tolerations: [{ key: REAL_NODE_LABEL, operator: 'Exists', effect: 'NoSchedule' }],
      topologySpreadConstraints: [],
      hostAliases: o.hostAliases ?? [],
      ...(o.upstreamCA ? { upstreamCA: { configMapName: 'upstream-ca', key: 'ca.crt' } } : {}),
      extraArgs: o.extraArgs ?? [],
      ...(o.resources ? { resources: o.resources } : {}),
    },
  };
  const rendered = withValuesFile(values, (file) => helm(['template', release, CHART, '--namespace', namespace, '--kube-version', KUBE_VERSION, '-f', file]));
  if (rendered.status !== 0) throw new Error(`helm template failed: ${rendered.stderr}`);
  const docs: Doc[] = parseDocs(rendered.stdout).filter((d) => d.metadata.labels?.['app.kubernetes.io/component'] === COMPONENT);
  const clusterScoped = docs.filter((d) => d.kind === 'ClusterRole' || d.kind === 'ClusterRoleBinding');
  // kubectl, not client-node: its models rename NetworkPolicy `from` and would drop it.
  // The Role and its binding live in the pool's namespace; the rest in the gateway's.
  for (const d of docs) if (!clusterScoped.includes(d)) d.metadata.namespace ??= namespace;
  try {
    kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: docs }));
  } catch (err) {
    if (!o.namespace) await deleteTestNamespace(o.kc, namespace);
    kubectl(['delete', '-f', '-', '--ignore-not-found', '--wait=false'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: docs }));
    throw err;
  }
  const deployment = docs.find((d) => d.kind === 'Deployment')!;
  const service = docs.find((d) => d.kind === 'Service' && (d.spec.ports as Array<{ port: number }>).some((p) => p.port === GATEWAY_PORT))!;
  const podLabels = deployment.spec.selector.matchLabels as Record<string, string>;
  const selector = Object.entries(podLabels)
    .map(([k, v]) => `${k}=${v}`)
    .join(',');
  const serviceIP = (await core.readNamespacedService({ namespace, name: service.metadata.name })).spec!.clusterIP!;

  const readyPods = async () =>
    (await core.listNamespacedPod({ namespace, labelSelector: selector })).items.filter(
      (p) => !p.metadata?.deletionTimestamp && p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'),
    );
  const waitReplicas = async (n: number) => {
    await waitFor(
      `${n} ready egress gateway pods`,
      async () => {
        const all = (await core.listNamespacedPod({ namespace, labelSelector: selector })).items;
        const ready = await readyPods();
        return ready.length === n && (n > 0 || all.length === 0) ? true : undefined;
      },
      { timeoutMs: 120_000, intervalMs: 250 },
    ).catch((err: unknown) => {
      const events = kubectl(['get', 'events', '-n', namespace, '-o', 'custom-columns=OBJ:.involvedObject.name,REASON:.reason,MSG:.message']);
      const logs = spawnSync(`${process.cwd()}/.cluster/bin/kubectl`, ['logs', '-n', namespace, '-l', selector, '--tail=20'], {
        encoding: 'utf8',
        env: { ...process.env, KUBECONFIG: process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG },
      }).stdout;
      throw new Error(`${String(err)}\nevents:\n${events}\nlogs:\n${logs}`);
    });
  };
  const remove = async () => {
    if (o.namespace) kubectl(['delete', '-f', '-', '--ignore-not-found', '--wait=false'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: docs }));
    else {
      await deleteTestNamespace(o.kc, namespace);
      for (const d of clusterScoped) kubectl(['delete', d.kind, d.metadata.name, '--ignore-not-found']);
    }
  };
  try {
    await waitReplicas(o.replicas ?? 2);
  } catch (err) {
    await remove(); // nothing left behind by a gateway that never became ready
    throw err;
  }

  return {
    namespace,
    release,
    service: service.metadata.name,
    serviceIP,
    poolGateway: { namespace, podLabels, service: service.metadata.name, host: serviceIP, port: GATEWAY_PORT },
    deployment: deployment.metadata.name,
    readyPods,
    async metrics(pod) {
      const res = await fetch(`http://${pod.status!.podIP}:9090/metrics`, { signal: AbortSignal.timeout(5000) });
      return res.text();
    },
    async scale(replicas) {
      await apps.patchNamespacedDeploymentScale(
        { namespace, name: deployment.metadata.name, body: { spec: { replicas } } },
        k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
      );
      await waitReplicas(replicas);
    },
    logs(pod) {
      return kubectl(['logs', '-n', namespace, pod.metadata!.name!]);
    },
    stop: remove,
  };
}

/** A gateway's metric, summed over the label sets that carry `labels` (Prometheus text). */
export function metricValue(text: string, name: string, labels: Record<string, string> = {}): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) sum += Number(line.split(' ').at(-1));
  }
  return sum;
}
