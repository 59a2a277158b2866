import type * as k8s from '@kubernetes/client-node';
import { BOXD_PORT } from '../common/boxd.js';
import { BOXD_MOUNTS_PORT } from '../common/memory-store.js';
import { POOL_DEFAULTS, type SandboxPool } from '../common/pool.js';
import {
  APPLIED_HASH_ANNOTATION,
  CHILD_NAMES,
  covers,
  desiredChildren,
  desiredLimitRange,
  desiredNamespace,
  desiredNetworkPolicy,
  desiredResourceQuota,
  isUpToDate,
} from './children.js';

function pool(spec: Partial<SandboxPool['spec']> = {}): SandboxPool {
  return {
    apiVersion: 'sandbox-bridge.io/v1alpha1',
    kind: 'SandboxPool',
    metadata: { name: 'p1', uid: 'uid-1', generation: 1 },
    spec: { ...structuredClone(POOL_DEFAULTS), namespace: 'boxes', ...spec },
  };
}

const owner = { apiVersion: 'sandbox-bridge.io/v1alpha1', kind: 'SandboxPool', name: 'p1', uid: 'uid-1', controller: true, blockOwnerDeletion: true };

test('namespace carries the pod-security labels at the pool level and is owned only when allowed', () => {
  const ns = desiredNamespace(pool({ podSecurityLevel: 'baseline' }), true);
  expect(ns.metadata.name).toBe('boxes');
  expect(ns.metadata.labels).toMatchObject({
    'pod-security.kubernetes.io/enforce': 'baseline',
    'pod-security.kubernetes.io/audit': 'baseline',
    'pod-security.kubernetes.io/warn': 'baseline',
    'app.kubernetes.io/managed-by': 'sandbox-bridge',
    'sandbox-bridge.io/pool': 'p1',
  });
  expect(ns.metadata.ownerReferences).toEqual([owner]);
  expect(desiredNamespace(pool(), false).metadata.ownerReferences).toBeUndefined();
});

test('resource quota caps pods at maxBoxes and adds cpu/memory totals only when set', () => {
  expect(desiredResourceQuota(pool({ maxBoxes: 7 })).spec).toEqual({ hard: { pods: '7' } });
  const rq = desiredResourceQuota(pool({ quota: { cpu: '8', memory: '16Gi' } }));
  expect(rq.metadata).toMatchObject({ name: CHILD_NAMES.resourceQuota, namespace: 'boxes', ownerReferences: [owner] });
  expect(rq.spec).toEqual({ hard: { pods: '50', 'limits.cpu': '8', 'limits.memory': '16Gi' } });
});

test('limit range matches the box maxima and defaults', () => {
  const lr = desiredLimitRange(pool());
  expect(lr.spec).toEqual({
    limits: [
      {
        type: 'Container',
        max: { cpu: '4', memory: '4Gi' },
        _default: { cpu: '1', memory: '512Mi' },
        defaultRequest: { cpu: '1', memory: '512Mi' },
      },
    ],
  });
});

test('network policy: a pool with memory stores admits the same peers to the sidecar port too, and only then', () => {
  const on = desiredNetworkPolicy(pool({ box: { ...POOL_DEFAULTS.box, memoryStores: { enabled: true, sizeLimit: '64Mi' } } }));
  expect((on.spec as k8s.V1NetworkPolicySpec).ingress?.[0]?.ports).toEqual([
    { protocol: 'TCP', port: BOXD_PORT },
    { protocol: 'TCP', port: BOXD_MOUNTS_PORT },
  ]);
  expect((desiredNetworkPolicy(pool()).spec as k8s.V1NetworkPolicySpec).ingress?.[0]?.ports).toEqual([{ protocol: 'TCP', port: BOXD_PORT }]);
});

test('network policy: ingress only from the bridge and operator pods to boxd; egress DNS on 53 plus allowed-minus-denied', () => {
  const np = desiredNetworkPolicy(pool());
  expect(np.spec).toEqual({
    podSelector: {},
    policyTypes: ['Ingress', 'Egress'],
    ingress: [
      {
        _from: [
          {
            namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'sandbox-bridge' } },
            podSelector: { matchLabels: { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/component': 'bridge' } },
          },
          {
            namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'sandbox-bridge' } },
            podSelector: { matchLabels: { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/component': 'operator' } },
          },
        ],
        ports: [{ protocol: 'TCP', port: BOXD_PORT }],
      },
    ],
    egress: [
      {
        to: [
          {
            namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'kube-system' } },
            podSelector: { matchLabels: { 'k8s-app': 'kube-dns' } },
          },
          { ipBlock: { cidr: '169.254.20.10/32' } },
        ],
        ports: [
          { protocol: 'UDP', port: 53 },
          { protocol: 'TCP', port: 53 },
        ],
      },
      {
        to: [
          {
            ipBlock: {
              cidr: '0.0.0.0/0',
              except: ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', '169.254.0.0/16', '127.0.0.0/8', '0.0.0.0/8'],
            },
          },
        ],
      },
    ],
  });
});

test('the pool names the bridge, operator and DNS peers; allowing ::/0 brings the IPv6 denials in', () => {
  const np = desiredNetworkPolicy(
    pool({
      bridge: { namespace: 'sb', podLabels: { app: 'b' }, operatorPodLabels: { app: 'o' } },
      egress: { ...POOL_DEFAULTS.egress, allowedCIDRs: ['0.0.0.0/0', '::/0'], dns: { namespace: 'dns', podLabels: { app: 'coredns' }, cidrs: [] } },
    }),
  );
  const spec = np.spec as k8s.V1NetworkPolicySpec;
  expect(spec.ingress?.[0]?._from).toEqual([
    { namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'sb' } }, podSelector: { matchLabels: { app: 'b' } } },
    { namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'sb' } }, podSelector: { matchLabels: { app: 'o' } } },
  ]);
  expect(spec.egress?.[0]?.to).toEqual([
    { namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'dns' } }, podSelector: { matchLabels: { app: 'coredns' } } },
  ]);
  expect(spec.egress?.[1]?.to?.[1]).toEqual({ ipBlock: { cidr: '::/0', except: ['fc00::/7', 'fe80::/10', '::1/128', '::/128'] } });
});

test('with nothing allowed, only DNS egress remains (never an empty `to`, which would allow all)', () => {
  const np = desiredNetworkPolicy(pool({ egress: { ...POOL_DEFAULTS.egress, allowedCIDRs: [], deniedCIDRs: [] } }));
  expect((np.spec as { egress: unknown[] }).egress).toHaveLength(1);
});

test('gateway mode: egress only to DNS and the gateway pods on the proxy port; no CIDR rule whatever the lists say', () => {
  const np = desiredNetworkPolicy(
    pool({
      egress: { ...POOL_DEFAULTS.egress, mode: 'gateway', allowedCIDRs: ['0.0.0.0/0', '::/0'], gateway: { namespace: 'gw', podLabels: { app: 'gateway' }, port: 3129, service: 'gw' } },
    }),
  );
  const egress = (np.spec as k8s.V1NetworkPolicySpec).egress!;
  expect(egress).toHaveLength(2);
  expect(egress[0]!.ports).toEqual([
    { protocol: 'UDP', port: 53 },
    { protocol: 'TCP', port: 53 },
  ]);
  expect(egress[1]).toEqual({
    to: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'gw' } }, podSelector: { matchLabels: { app: 'gateway' } } }],
    ports: [{ protocol: 'TCP', port: 3129 }],
  });
  expect(JSON.stringify(egress)).not.toContain('ipBlock":{"cidr":"0.0.0.0/0');
  // Direct mode (the default) keeps the CIDR rule and has no gateway rule.
  expect(JSON.stringify((desiredNetworkPolicy(pool()).spec as k8s.V1NetworkPolicySpec).egress)).not.toContain('3128');
});

test('the applied hash changes with the desired content', () => {
  const a = desiredResourceQuota(pool({ quota: { cpu: '8' } })).metadata.annotations?.[APPLIED_HASH_ANNOTATION];
  const b = desiredResourceQuota(pool()).metadata.annotations?.[APPLIED_HASH_ANNOTATION];
  expect(a).toMatch(/^[0-9a-f]{16}$/);
  expect(a).not.toBe(b);
});

test('covers compares desired fields only, quantities by value', () => {
  expect(covers({ a: { cpu: '500m', extra: 1 }, b: [1, 2] }, { a: { cpu: '0.5' }, b: [1, 2] })).toBe(true);
  expect(covers({ a: { cpu: '1' } }, { a: { cpu: '2' } })).toBe(false);
  expect(covers({ b: [1, 2, 3] }, { b: [1, 2] })).toBe(false);
  expect(covers({ l: 'restricted' }, { l: 'baseline' })).toBe(false);
  expect(covers(undefined, { a: 1 })).toBe(false);
});

test('children are up to date in the watch\'s wire form too (default, from), not only in client-node\'s model (_default, _from)', () => {
  // A typed list fills the cache with the model's names; a watch event with the wire's. The drift
  // check must converge on both, or every reconcile re-applies the LimitRange and NetworkPolicy.
  const p = pool();
  const wire = (child: ReturnType<typeof desiredLimitRange>) => JSON.parse(JSON.stringify(child).replace(/"_default"/g, '"default"').replace(/"_from"/g, '"from"'));
  for (const child of [desiredLimitRange(p), desiredNetworkPolicy(p)]) {
    expect(JSON.stringify(wire(child))).not.toContain('"_');
    expect([child.kind, isUpToDate(child, wire(child))]).toEqual([child.kind, true]);
    expect([child.kind, isUpToDate(child, child)]).toEqual([child.kind, true]);
  }
  // Still a real difference is one.
  const changed = wire(desiredLimitRange(p));
  changed.spec.limits[0].default.cpu = '3';
  expect(isUpToDate(desiredLimitRange(p), changed)).toBe(false);
});

test('a LimitRange written with 0.7 cores is up to date once the API server stores it as 700m', () => {
  const desired = desiredLimitRange(pool({ box: { ...POOL_DEFAULTS.box, defaultCpu: '0.7', maxCpu: '1.1', defaultMemory: '0.5Gi' } }));
  // What the API server hands back: quantities in canonical form.
  const live = structuredClone(desired) as typeof desired & { spec: { limits: Array<Record<string, Record<string, string>>> } };
  const limit = live.spec.limits[0]!;
  limit.max = { cpu: '1100m', memory: limit.max!.memory! };
  limit._default = { cpu: '700m', memory: '512Mi' };
  limit.defaultRequest = { cpu: '700m', memory: '512Mi' };
  expect(isUpToDate(desired, live)).toBe(true);
  limit.defaultRequest = { cpu: '701m', memory: '512Mi' };
  expect(isUpToDate(desired, live)).toBe(false);
});

test('isUpToDate needs the same hash and the desired fields', () => {
  const desired = desiredResourceQuota(pool());
  const live = structuredClone(desired) as typeof desired & { status?: unknown };
  live.status = { used: { pods: '3' } };
  expect(isUpToDate(desired, live)).toBe(true);
  expect(isUpToDate(desired, { ...live, spec: { hard: { pods: '100' } } } as typeof live)).toBe(false);
  const stale = structuredClone(live);
  stale.metadata.annotations = {};
  expect(isUpToDate(desired, stale)).toBe(false);
  expect(isUpToDate(desired, undefined)).toBe(false);
});

test('children are up to date as list items, which carry no apiVersion or kind', () => {
  // The operator's caches start from a list, whose items have neither; an apply that changes
  // nothing produces no watch event to replace them, so the check must not need them.
  const p = pool();
  for (const child of desiredChildren(p, true)) {
    const item = structuredClone(child) as Partial<typeof child>;
    delete item.apiVersion;
    delete item.kind;
    expect([child.kind, isUpToDate(child, item as typeof child)]).toEqual([child.kind, true]);
  }
});
