// Pure builders of the objects a SandboxPool owns. Names are deterministic (one pool per
// namespace), so reconciling is "apply these four objects" with no lookups. Each carries a hash
// of its desired content so a spec change that *removes* a field is noticed (a subset
// comparison with the live object alone would miss it).
import { createHash } from 'node:crypto';
import type * as k8s from '@kubernetes/client-node';
import { BOXD_PORT } from '../common/boxd.js';
import { BOXD_MOUNTS_PORT } from '../common/memory-store.js';
import { LABELS, MANAGED_BY, API_GROUP } from '../common/labels.js';
import { POOL_API_VERSION, POOL_KIND, type SandboxPool } from '../common/pool.js';
import { sameQuantity } from '../common/quantity.js';
import { egressIpBlocks } from './cidr.js';

export const CHILD_NAMES = {
  resourceQuota: 'sandbox-bridge-quota',
  limitRange: 'sandbox-bridge-limits',
  networkPolicy: 'sandbox-bridge-boxes',
} as const;

export const APPLIED_HASH_ANNOTATION = `${API_GROUP}/applied-hash`;

/** Selects the objects the operator manages; children also carry the pool label. */
export const CHILD_SELECTOR = `${LABELS.managedBy}=${MANAGED_BY},${LABELS.pool}`;

export type Child = k8s.KubernetesObject & { apiVersion: string; kind: string; metadata: k8s.V1ObjectMeta; spec?: unknown };

export function ownerReference(pool: SandboxPool): k8s.V1OwnerReference {
  return {
    apiVersion: POOL_API_VERSION,
    kind: POOL_KIND,
    name: pool.metadata.name,
    uid: pool.metadata.uid ?? '',
    controller: true,
    blockOwnerDeletion: true,
  };
}

function meta(pool: SandboxPool, name: string, namespace?: string, owned = true): k8s.V1ObjectMeta {
  return {
    name,
    ...(namespace ? { namespace } : {}),
    labels: { [LABELS.managedBy]: MANAGED_BY, [LABELS.pool]: pool.metadata.name },
    ...(owned ? { ownerReferences: [ownerReference(pool)] } : {}),
  };
}

/**
 * The sandbox namespace with Pod Security labels. `owned` is false for a namespace that existed
 * before the pool (and is not already the pool's): the operator labels it but does not take
 * ownership, or deleting the pool would garbage-collect someone else's namespace.
 */
export function desiredNamespace(pool: SandboxPool, owned: boolean): Child {
  const level = pool.spec.podSecurityLevel;
  const m = meta(pool, pool.spec.namespace, undefined, owned);
  m.labels = {
    ...m.labels,
    'pod-security.kubernetes.io/enforce': level,
    'pod-security.kubernetes.io/enforce-version': 'latest',
    'pod-security.kubernetes.io/audit': level,
    'pod-security.kubernetes.io/audit-version': 'latest',
    'pod-security.kubernetes.io/warn': level,
    'pod-security.kubernetes.io/warn-version': 'latest',
  };
  return withHash({ apiVersion: 'v1', kind: 'Namespace', metadata: m });
}

/** pods = maxBoxes makes the global cap atomic at admission; cpu/memory totals when set. */
export function desiredResourceQuota(pool: SandboxPool): Child {
  const hard: Record<string, string> = { pods: String(pool.spec.maxBoxes) };
  if (pool.spec.quota?.cpu) hard['limits.cpu'] = pool.spec.quota.cpu;
  if (pool.spec.quota?.memory) hard['limits.memory'] = pool.spec.quota.memory;
  return withHash({
    apiVersion: 'v1',
    kind: 'ResourceQuota',
    metadata: meta(pool, CHILD_NAMES.resourceQuota, pool.spec.namespace),
    spec: { hard },
  });
}

/** Per-container maxima, and defaults for containers that name none (needed once a cpu/memory quota exists). */
export function desiredLimitRange(pool: SandboxPool): Child {
  const { defaultCpu, maxCpu, defaultMemory, maxMemory } = pool.spec.box;
  return withHash({
    apiVersion: 'v1',
    kind: 'LimitRange',
    metadata: meta(pool, CHILD_NAMES.limitRange, pool.spec.namespace),
    spec: {
      limits: [
        {
          type: 'Container',
          max: { cpu: maxCpu, memory: maxMemory },
          // client-node's model names this field `_default` (serialized as `default`), both
          // when sending and in the cache, so the typed name keeps the comparison exact.
          _default: { cpu: defaultCpu, memory: defaultMemory },
          defaultRequest: { cpu: defaultCpu, memory: defaultMemory },
        },
      ],
    },
  });
}

/** The label every namespace carries with its own name (Kubernetes sets it; it cannot be forged). */
const NAMESPACE_NAME_LABEL = 'kubernetes.io/metadata.name';

/**
 * Every pod in the (dedicated) sandbox namespace. Ingress: only the bridge and operator pods,
 * only to boxd's port (and the memory-store sidecar's, when the pool has memory stores). Egress: cluster DNS on port 53 (the DNS pods, and node-local caches by address), and the
 * allowed CIDRs as the denied ones narrow them; in gateway mode the egress gateway's pods on its port instead of any CIDR. Traffic from the node itself (kubelet probes, a
 * bridge running on the node) is not subject to NetworkPolicy in the enforcers we know.
 */
export function desiredNetworkPolicy(pool: SandboxPool): Child {
  const { egress: policy, bridge } = pool.spec;
  const dnsPorts = [
    { protocol: 'UDP', port: 53 },
    { protocol: 'TCP', port: 53 },
  ];
  const egress: k8s.V1NetworkPolicyEgressRule[] = [
    {
      to: [
        {
          namespaceSelector: { matchLabels: { [NAMESPACE_NAME_LABEL]: policy.dns.namespace } },
          podSelector: { matchLabels: policy.dns.podLabels },
        },
        ...egressIpBlocks(policy.dns.cidrs, []).map((ipBlock) => ({ ipBlock })),
      ],
      ports: dnsPorts,
    },
  ];
  if (policy.mode === 'gateway') {
    // Only the gateway's pods, on its proxy port: a tool that ignores the proxy variables fails
    // closed, never around the gateway (docs/egress.md). The CIDR lists do not apply.
    egress.push({
      to: [{ namespaceSelector: { matchLabels: { [NAMESPACE_NAME_LABEL]: policy.gateway.namespace } }, podSelector: { matchLabels: policy.gateway.podLabels } }],
      ports: [{ protocol: 'TCP', port: policy.gateway.port }],
    });
  } else {
    const blocks = egressIpBlocks(policy.allowedCIDRs, policy.deniedCIDRs);
    // A rule with an empty `to` would allow every destination, so none is written when nothing is allowed.
    if (blocks.length) egress.push({ to: blocks.map((ipBlock) => ({ ipBlock })) });
  }
  const ingress: k8s.V1NetworkPolicyIngressRule[] = [
    {
      // client-node's model names this `_from` (serialized as `from`), when sending and in the cache.
      _from: [
        {
          namespaceSelector: { matchLabels: { [NAMESPACE_NAME_LABEL]: bridge.namespace } },
          podSelector: { matchLabels: bridge.podLabels },
        },
        {
          namespaceSelector: { matchLabels: { [NAMESPACE_NAME_LABEL]: bridge.namespace } },
          podSelector: { matchLabels: bridge.operatorPodLabels },
        },
      ],
      // And to the memory-store sidecar's, when the pool has one (docs/mounts.md; the operator syncs before a sleep).
      ports: [{ protocol: 'TCP', port: BOXD_PORT }, ...(pool.spec.box.memoryStores?.enabled ? [{ protocol: 'TCP', port: BOXD_MOUNTS_PORT }] : [])],
    },
  ];
  return withHash({
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: meta(pool, CHILD_NAMES.networkPolicy, pool.spec.namespace),
    spec: { podSelector: {}, policyTypes: ['Ingress', 'Egress'], ingress, egress },
  });
}

export function desiredChildren(pool: SandboxPool, namespaceOwned: boolean): Child[] {
  return [
    desiredNamespace(pool, namespaceOwned),
    desiredResourceQuota(pool),
    desiredLimitRange(pool),
    desiredNetworkPolicy(pool),
  ];
}

function withHash(child: Child): Child {
  const hash = createHash('sha256').update(JSON.stringify(child)).digest('hex').slice(0, 16);
  child.metadata.annotations = { ...child.metadata.annotations, [APPLIED_HASH_ANNOTATION]: hash };
  return child;
}

/**
 * True when the live object already is what we would apply: it carries the hash of the same
 * desired object and every desired field has the same value (quantities compared exactly by value,
 * since the API server rewrites "0.7" as "700m"). Fields others added are left alone, as server-side
 * apply would leave them.
 */
export function isUpToDate(desired: Child, live: k8s.KubernetesObject | undefined): boolean {
  if (!live) return false;
  const hash = desired.metadata.annotations?.[APPLIED_HASH_ANNOTATION];
  if (live.metadata?.annotations?.[APPLIED_HASH_ANNOTATION] !== hash) return false;
  // Not apiVersion and kind: list items carry neither, and the cache a live object comes from
  // already says what it is. An apply that changes nothing makes no watch event to fill them in.
  const { apiVersion: _apiVersion, kind: _kind, ...fields } = desired;
  return covers(live, fields);
}

export function covers(actual: unknown, desired: unknown): boolean {
  if (desired === null || desired === undefined) return true;
  if (Array.isArray(desired)) {
    return Array.isArray(actual) && actual.length === desired.length && desired.every((d, i) => covers(actual[i], d));
  }
  if (typeof desired === 'object') {
    if (typeof actual !== 'object' || actual === null || Array.isArray(actual)) return false;
    const a = actual as Record<string, unknown>;
    // client-node names a field that is a reserved word `_name` (`_default`, `_from`) in its model,
    // which typed lists fill, while watch events carry the wire's `name`: either is the field.
    return Object.entries(desired).every(([k, v]) => covers(k.startsWith('_') && !(k in a) ? a[k.slice(1)] : a[k], v));
  }
  if (actual === desired) return true;
  if (typeof desired === 'string' && typeof actual === 'string') return sameQuantity(actual, desired);
  return false;
}
