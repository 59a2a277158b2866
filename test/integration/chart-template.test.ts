// Template tests for charts/sandbox-bridge: `helm template` (the real helm binary) over the
// chart's important branches, asserting on the rendered objects. No cluster needed.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type * as k8s from '@kubernetes/client-node';
import { load } from 'js-yaml';
import { parseTokensFile } from '../../bridge/http/tokens.js';
import { createMetrics } from '../../bridge/metrics.js';
import { createOperatorMetrics } from '../../operator/metrics.js';
import { BOXD_PORT } from '../../common/boxd.js';
import { POOL_DEFAULTS } from '../../common/pool.js';
import { NODE_FLAGS } from '../../common/node-flags.js';
import { CHART, MONITORING_APIS, ROOT, TOKEN, helm, template, type Doc } from '../chart/helm.js';

const BRIDGE = 'rel-sandbox-bridge-bridge';
const OPERATOR = 'rel-sandbox-bridge-operator';
const GATEWAY = 'rel-sandbox-bridge-egress-gateway';
/** The egress gateway's key Secrets, generated when it is enabled (the default). */
const EGRESS_SECRETS = ['rel-sandbox-bridge-egress-key', 'rel-sandbox-bridge-egress-resolver-key'];

/** The bridge's Kubernetes calls (bridge/kube, bridge/services), as RBAC rules. */
const BRIDGE_NAMESPACED_RULES = [
  { apiGroups: [''], resources: ['pods'], verbs: ['create', 'get', 'list', 'watch', 'delete', 'patch'] },
  { apiGroups: [''], resources: ['pods/resize'], verbs: ['patch'] },
  { apiGroups: [''], resources: ['pods/log'], verbs: ['get'] },
  { apiGroups: [''], resources: ['secrets'], verbs: ['get', 'create', 'update', 'delete', 'patch', 'list', 'watch'] },
  { apiGroups: [''], resources: ['events'], verbs: ['create'] },
  { apiGroups: ['metrics.k8s.io'], resources: ['pods'], verbs: ['list'] },
];
/** The operator's calls in each pool namespace (operator/controller.ts, pool-reconciler.ts, events). */
const OPERATOR_NAMESPACED_RULES = [
  { apiGroups: [''], resources: ['pods', 'secrets'], verbs: ['get', 'list', 'watch', 'delete', 'create', 'patch'] },
  { apiGroups: [''], resources: ['resourcequotas', 'limitranges'], verbs: ['get', 'list', 'watch', 'create', 'patch'] },
  { apiGroups: ['networking.k8s.io'], resources: ['networkpolicies'], verbs: ['get', 'list', 'watch', 'create', 'patch'] },
  { apiGroups: [''], resources: ['events'], verbs: ['create', 'patch'] },
  // The CA of gateway-mode pools: Secret and ConfigMap sandbox-bridge-egress-ca (operator/egress-ca.ts).
  // delete: a pool back in direct mode has its CA removed.
  { apiGroups: [''], resources: ['secrets', 'configmaps'], verbs: ['get', 'list', 'watch', 'create', 'update', 'patch', 'delete'] },
];
const OPERATOR_POOL_RULES = [
  { apiGroups: ['sandbox-bridge.io'], resources: ['sandboxpools'], verbs: ['get', 'list', 'watch'] },
  { apiGroups: ['sandbox-bridge.io'], resources: ['sandboxpools/status'], verbs: ['update'] },
  { apiGroups: ['sandbox-bridge.io'], resources: ['sandboxpools/finalizers'], verbs: ['update'] },
];
const NAMESPACE_VERBS = ['get', 'list', 'watch', 'create', 'patch'];
const BRIDGE_CLUSTER_RULES = [
  { apiGroups: [''], resources: ['nodes'], verbs: ['list', 'watch'] },
  { apiGroups: ['sandbox-bridge.io'], resources: ['sandboxpools'], verbs: ['list', 'watch'] },
];

function containers(doc: Doc): k8s.V1Container[] {
  return doc.spec.template.spec.containers as k8s.V1Container[];
}

function env(doc: Doc): Record<string, string | undefined> {
  return Object.fromEntries(containers(doc)[0]!.env!.map((e) => [e.name, e.value]));
}

describe('chart metadata and defaults', () => {
  test('helm lint passes, with and without values', () => {
    for (const args of [[], ['--set', `secret.token=${TOKEN}`], ['--set', 'secret.existingSecret=x', '--set', 'ingress.enabled=true', '--set', 'ingress.host=a.example.com']]) {
      const res = helm(['lint', CHART, ...args]);
      expect({ args, status: res.status, out: res.stdout + res.stderr }).toMatchObject({ status: 0 });
      expect(res.stdout).toContain('0 chart(s) failed');
    }
  });

  test('appVersion follows package.json, and the image tag defaults to it', () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string };
    const chart = load(readFileSync(join(CHART, 'Chart.yaml'), 'utf8')) as { appVersion: string; version: string };
    expect(chart.appVersion).toBe(pkg.version);
    const out = template();
    for (const name of [BRIDGE, OPERATOR]) {
      expect(containers(out.one('Deployment', name))[0]!.image).toBe(`ghcr.io/sandbox-bridge/sandbox-bridge:${pkg.version}`);
    }
    const pinned = template({ secret: { token: TOKEN }, image: { repository: 'registry.example.com/sb', tag: 'v9' } });
    expect(containers(pinned.one('Deployment', BRIDGE))[0]!.image).toBe('registry.example.com/sb:v9');
  });

  test("values.yaml carries the spec's deployment values with their defaults", () => {
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    const v = load(readFileSync(join(CHART, 'values.yaml'), 'utf8')) as any;
    expect(v.replicaCount).toBe(2);
    expect(v.service).toMatchObject({ type: 'ClusterIP', port: 8080 });
    expect(v.secret).toEqual({ token: '', tokens: [], existingSecret: '', tokenKey: 'token', tokensKey: 'tokens.json' });
    expect(v.ingress).toMatchObject({ enabled: false, host: '', className: '', tls: true });
    expect(v.ingress.clusterIssuer).toBeTruthy();
    expect(v.autoscaling).toEqual({ enabled: false, minReplicas: 2, maxReplicas: 10, targetCPUUtilization: 70, targetMemoryUtilization: 80 });
    expect(v.resources).toEqual({ requests: { cpu: '100m', memory: '256Mi' }, limits: { cpu: '500m', memory: '640Mi' } });
    expect(v.rbac).toMatchObject({ create: true, namespaced: true, extraPoolNamespaces: [] });
    expect(v.rbac.targetNamespace).toBeTruthy();
    expect(v.networkPolicy).toMatchObject({ enabled: true, egressCIDRs: ['0.0.0.0/0'] });
    expect(v.podDisruptionBudget).toEqual({ enabled: true, minAvailable: 1 });
    expect(v.logLevel).toBe('info');
    expect(v.box).toMatchObject({
      defaultCpu: '1',
      defaultMemory: '512Mi',
      defaultTtlSeconds: 3600,
      maxCpu: '4',
      maxMemory: '4Gi',
      maxBoxesPerSession: 3,
      maxConcurrentBoxes: 50,
    });
    expect(v.box.defaultImage).toBeTruthy();
    for (const key of ['nodeSelector', 'tolerations', 'affinity', 'podAnnotations', 'podLabels', 'extraEnv', 'livenessProbe', 'readinessProbe']) {
      expect(v).toHaveProperty(key);
    }
    expect(v.serviceAccount).toMatchObject({ create: true, name: '' });
    expect(v.operator).toMatchObject({ replicas: 2 });
  });

  test('the schema rejects a logLevel outside debug/info/warn/error', () => {
    const out = template({ secret: { token: TOKEN }, logLevel: 'verbose' });
    expect(out.status).not.toBe(0);
    expect(out.stderr).toMatch(/logLevel.*debug.*info.*warn.*error/s);
  });
});

describe('token', () => {
  test('no token and no existing secret: the install fails with a clear message', () => {
    const out = template({});
    expect(out.status).not.toBe(0);
    expect(out.stderr).toContain('a bearer token is required');
    expect(out.stderr).toContain('secret.token');
    expect(out.stderr).toContain('secret.existingSecret');
  });

  test('a token shorter than the bridge accepts fails', () => {
    const out = template({ secret: { token: 'short' } });
    expect(out.status).not.toBe(0);
    expect(out.stderr).toContain('at least 16 characters');
  });

  test('secret.token: the chart creates the Secret, mounts it as files, and rolls pods when it changes', () => {
    const out = template();
    const secret = out.one('Secret', 'rel-sandbox-bridge-token');
    expect(Object.keys(secret.data)).toEqual(['token']);
    expect(Buffer.from(secret.data.token, 'base64').toString()).toBe(TOKEN);
    const dep = out.one('Deployment', BRIDGE);
    expect(env(dep).BRIDGE_TOKEN_FILE).toBe('/var/run/secrets/sandbox-bridge/token');
    expect(env(dep).BRIDGE_TOKENS_FILE).toBe('/var/run/secrets/sandbox-bridge/tokens.json');
    expect(env(dep).BRIDGE_TOKEN).toBeUndefined();
    // The whole Secret (no items), so a key added or removed later appears or disappears as a file.
    const volume = dep.spec.template.spec.volumes.find((v: k8s.V1Volume) => v.name === 'token');
    expect(volume.secret.secretName).toBe('rel-sandbox-bridge-token');
    expect(volume.secret.items).toBeUndefined();
    // No subPath: only a whole-directory Secret volume is updated in place on rotation.
    const mount = containers(dep)[0]!.volumeMounts!.find((m) => m.name === 'token')!;
    expect(mount.subPath).toBeUndefined();
    expect(mount.mountPath).toBe('/var/run/secrets/sandbox-bridge');
    const checksum = dep.spec.template.metadata.annotations['checksum/token'];
    expect(checksum).toMatch(/^[0-9a-f]{64}$/);
    const rotated = template({ secret: { token: `${TOKEN}-rotated` } }).one('Deployment', BRIDGE);
    expect(rotated.spec.template.metadata.annotations['checksum/token']).not.toBe(checksum);
  });

  test('secret.existingSecret: no Secret rendered; the pods mount the named one and read tokenKey / tokensKey', () => {
    const out = template({ secret: { existingSecret: 'my-token', tokenKey: 'bridge-token', tokensKey: 'named.json' } });
    expect(out.status).toBe(0);
    expect(out.all('Secret').map((s) => s.metadata.name)).toEqual(['rel-sandbox-bridge-boxd-key', ...EGRESS_SECRETS]);
    const dep = out.one('Deployment', BRIDGE);
    const volume = dep.spec.template.spec.volumes.find((v: k8s.V1Volume) => v.name === 'token');
    expect(volume.secret.secretName).toBe('my-token');
    expect(volume.secret.items).toBeUndefined();
    expect(env(dep)).toMatchObject({
      BRIDGE_TOKEN_FILE: '/var/run/secrets/sandbox-bridge/bridge-token',
      BRIDGE_TOKENS_FILE: '/var/run/secrets/sandbox-bridge/named.json',
    });
    expect(dep.spec.template.metadata.annotations?.['checksum/token']).toBeUndefined();
  });

  test('secret.tokens: named tokens with scopes go into the Secret as the JSON list the bridge reads', () => {
    const tokens = [
      { name: 'agents', token: `${TOKEN}-agents`, scopes: ['boxes:read', 'boxes:write'] },
      { name: 'grafana', sha256: 'a'.repeat(64), scopes: ['cluster:read', 'sandboxes:read'] },
    ];
    const out = template({ secret: { tokens } });
    expect(out.status).toBe(0);
    const secret = out.one('Secret', 'rel-sandbox-bridge-token');
    expect(Object.keys(secret.data)).toEqual(['tokens.json']);
    const json = Buffer.from(secret.data['tokens.json'], 'base64').toString();
    expect(parseTokensFile(json, 'tokens.json')).toEqual(tokens);
    // Both at once: the single token keeps working beside the named ones (a migration step).
    const both = template({ secret: { token: TOKEN, tokens } }).one('Secret', 'rel-sandbox-bridge-token');
    expect(Object.keys(both.data).sort()).toEqual(['token', 'tokens.json']);
  });

  test('secret.tokens: the schema refuses unknown scopes, short tokens and entries with neither token nor sha256', () => {
    for (const bad of [
      { name: 'a', token: `${TOKEN}`, scopes: ['root'] },
      { name: 'a', token: 'short', scopes: ['admin'] },
      { name: 'a', scopes: ['admin'] },
      { name: 'Not_A_Label', token: TOKEN, scopes: ['admin'] },
    ]) {
      const out = template({ secret: { tokens: [bad] } });
      expect({ bad, status: out.status }).toEqual({ bad, status: 1 });
      expect(out.stderr).toMatch(/values don't meet the specifications of the schema/);
    }
  });
});

describe('boxd', () => {
  test('the image defaults to the chart version; the bridge reads the key from a mounted Secret', () => {
    const out = template({ secret: { token: TOKEN }, boxd: { image: { repository: 'registry.example.com/boxd' } } });
    const dep = out.one('Deployment', BRIDGE);
    expect(env(dep).BOXD_IMAGE).toMatch(/^registry\.example\.com\/boxd:\d+\.\d+\.\d+/);
    expect(env(dep).BOXD_KEY_FILE).toBe('/var/run/secrets/sandbox-bridge-boxd/key');
    const volume = dep.spec.template.spec.volumes.find((v: k8s.V1Volume) => v.name === 'boxd-key');
    expect(volume.secret).toMatchObject({ secretName: 'rel-sandbox-bridge-boxd-key', items: [{ key: 'key', path: 'key' }] });
    const generated = Buffer.from(out.one('Secret', 'rel-sandbox-bridge-boxd-key').data.key, 'base64').toString();
    expect(generated).toMatch(/^[A-Za-z0-9]{64}$/);
    expect(env(template({ secret: { token: TOKEN }, boxd: { image: { repository: 'r/boxd', digest: `sha256:${'a'.repeat(64)}` } } }).one('Deployment', BRIDGE)).BOXD_IMAGE).toBe(
      `r/boxd@sha256:${'a'.repeat(64)}`,
    );
  });

  test('a given key is used as is; a short one fails; an existing Secret is mounted under its key', () => {
    const key = 'k'.repeat(40);
    expect(Buffer.from(template({ secret: { token: TOKEN }, boxd: { key } }).one('Secret', 'rel-sandbox-bridge-boxd-key').data.key, 'base64').toString()).toBe(key);
    const short = template({ secret: { token: TOKEN }, boxd: { key: 'too-short' } });
    expect(short.status).not.toBe(0);
    const existing = template({ secret: { token: TOKEN }, boxd: { existingSecret: 'my-boxd', secretKey: 'hmac' } });
    expect(existing.all('Secret').map((s) => s.metadata.name)).toEqual([...EGRESS_SECRETS, 'rel-sandbox-bridge-token']);
    const volume = existing.one('Deployment', BRIDGE).spec.template.spec.volumes.find((v: k8s.V1Volume) => v.name === 'boxd-key');
    expect(volume.secret).toMatchObject({ secretName: 'my-boxd', items: [{ key: 'hmac', path: 'key' }] });
  });
});

describe('object store and warm boxes', () => {
  const envFrom = (doc: Doc) => containers(doc)[0]!.env!;

  test('without a bucket nothing of the store is rendered: snapshots answer 501', () => {
    const out = template();
    for (const name of [BRIDGE, OPERATOR]) expect(Object.keys(env(out.one('Deployment', name))).filter((k) => k.startsWith('OBJECT_STORE') || k.startsWith('SNAPSHOT'))).toEqual([]);
    expect(out.all('Secret').map((s) => s.metadata.name)).not.toContain('rel-sandbox-bridge-snapshot-key');
  });

  test('a bucket configures the bridge and the operator alike; credentials only by reference; the seal key generated and mounted', () => {
    const out = template({
      secret: { token: TOKEN },
      objectStore: { bucket: 'snaps', endpoint: 'https://s3.example.com', prefix: 'team/a', forcePathStyle: true, existingSecret: 's3-creds', accessKeyIdKey: 'id', secretAccessKeyKey: 'secret' },
    });
    expect(out.status).toBe(0);
    for (const name of [BRIDGE, OPERATOR]) {
      const dep = out.one('Deployment', name);
      expect(env(dep)).toMatchObject({ OBJECT_STORE_BUCKET: 'snaps', OBJECT_STORE_ENDPOINT: 'https://s3.example.com', OBJECT_STORE_PREFIX: 'team/a', OBJECT_STORE_FORCE_PATH_STYLE: 'true', OBJECT_STORE_REGION: 'us-east-1' });
      const byName = Object.fromEntries(envFrom(dep).map((e) => [e.name, e]));
      expect(byName.OBJECT_STORE_ACCESS_KEY_ID).toEqual({ name: 'OBJECT_STORE_ACCESS_KEY_ID', valueFrom: { secretKeyRef: { name: 's3-creds', key: 'id' } } });
      expect(byName.OBJECT_STORE_SECRET_ACCESS_KEY).toEqual({ name: 'OBJECT_STORE_SECRET_ACCESS_KEY', valueFrom: { secretKeyRef: { name: 's3-creds', key: 'secret' } } });
    }
    const bridge = out.one('Deployment', BRIDGE);
    expect(env(bridge).SNAPSHOT_ENCRYPTION_KEY_FILE).toBe('/var/run/secrets/sandbox-bridge-snapshots/key');
    // The operator seals a sleeping box's env into its idle-sleep snapshot (docs/lifecycle.md): the same key, mounted.
    expect(env(out.one('Deployment', OPERATOR)).SNAPSHOT_ENCRYPTION_KEY_FILE).toBe('/var/run/secrets/sandbox-bridge-snapshots/key');
    const opVolume = out.one('Deployment', OPERATOR).spec.template.spec.volumes.find((v: k8s.V1Volume) => v.name === 'snapshot-key');
    expect(opVolume.secret).toMatchObject({ secretName: 'rel-sandbox-bridge-snapshot-key', items: [{ key: 'key', path: 'key' }] });
    const volume = bridge.spec.template.spec.volumes.find((v: k8s.V1Volume) => v.name === 'snapshot-key');
    expect(volume.secret).toMatchObject({ secretName: 'rel-sandbox-bridge-snapshot-key', items: [{ key: 'key', path: 'key' }] });
    expect(Buffer.from(out.one('Secret', 'rel-sandbox-bridge-snapshot-key').data.key, 'base64').toString()).toMatch(/^[A-Za-z0-9]{64}$/);
    const existing = template({ secret: { token: TOKEN }, objectStore: { bucket: 'snaps', encryptionKey: { existingSecret: 'seal', secretKey: 'keys' } } });
    expect(existing.all('Secret').map((s) => s.metadata.name)).not.toContain('rel-sandbox-bridge-snapshot-key');
    expect(existing.one('Deployment', BRIDGE).spec.template.spec.volumes.find((v: k8s.V1Volume) => v.name === 'snapshot-key').secret).toMatchObject({ secretName: 'seal', items: [{ key: 'keys', path: 'key' }] });
    expect(template({ secret: { token: TOKEN }, objectStore: { bucket: 'b', endpoint: 'ftp://x' } }).status).not.toBe(0);
  });

  test('the pool gets the warm and snapshot settings; the operator the boxd image and key for warm pods', () => {
    const out = template({ secret: { token: TOKEN }, pool: { warm: { count: 4, max: 10, minAvailable: 2 }, snapshots: { retentionSeconds: 3600, onDelete: true } } });
    const pool = out.one('SandboxPool');
    expect(pool.spec.warm).toEqual({ count: 4, max: 10, minAvailable: 2, windowSeconds: 60 });
    expect(pool.spec.snapshots).toEqual({ retentionSeconds: 3600, onDelete: true });
    const op = out.one('Deployment', OPERATOR);
    expect(env(op).BOXD_IMAGE).toBe(env(out.one('Deployment', BRIDGE)).BOXD_IMAGE);
    expect(env(op).BOXD_KEY_FILE).toBeDefined();
    expect(template({ secret: { token: TOKEN }, pool: { warm: { count: -1 } } }).status).not.toBe(0);
  });
});

describe('RBAC', () => {
  test('namespaced (default): pod, secret and metrics rules only in the target namespace; cluster rules only for nodes and pools', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { targetNamespace: 'boxes' } });
    const role = out.one('Role', BRIDGE);
    expect(role.metadata.namespace).toBe('boxes');
    expect(role.rules).toEqual(BRIDGE_NAMESPACED_RULES);
    const binding = out.one('RoleBinding', BRIDGE);
    expect(binding.metadata.namespace).toBe('boxes');
    expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: BRIDGE, namespace: 'bridge-ns' }]);
    expect(out.one('ClusterRole', BRIDGE).rules).toEqual(BRIDGE_CLUSTER_RULES);
    expect(out.one('ClusterRoleBinding', BRIDGE).subjects).toEqual([{ kind: 'ServiceAccount', name: BRIDGE, namespace: 'bridge-ns' }]);
    // The sandbox namespace is created, restricted.
    const ns = out.one('Namespace', 'boxes');
    expect(ns.metadata.labels).toMatchObject({ 'pod-security.kubernetes.io/enforce': 'restricted' });
  });

  test('rbac.namespaced=false: one ClusterRole with every rule, no Role', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { namespaced: false } });
    expect(out.all('Role').filter((r) => r.metadata.name === BRIDGE)).toHaveLength(0);
    expect(out.one('ClusterRole', BRIDGE).rules).toEqual([...BRIDGE_CLUSTER_RULES, ...BRIDGE_NAMESPACED_RULES]);
  });

  test('capacity.allPods: pods list/watch in every namespace, only then; the bridge is told', () => {
    const off = template();
    expect(env(off.one('Deployment', BRIDGE)).CAPACITY_ALL_PODS).toBe('false');
    const on = template({ secret: { token: TOKEN }, capacity: { allPods: true } });
    expect(env(on.one('Deployment', BRIDGE)).CAPACITY_ALL_PODS).toBe('true');
    expect(on.one('ClusterRole', BRIDGE).rules).toEqual([...BRIDGE_CLUSTER_RULES, { apiGroups: [''], resources: ['pods'], verbs: ['list', 'watch'] }]);
  });

  test('rbac.create=false: no bridge RBAC', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { create: false } });
    const names = out.docs.filter((d) => /Role/.test(d.kind)).map((d) => d.metadata.name);
    expect(names.filter((n) => n.startsWith(BRIDGE))).toEqual([]);
  });

  test('no rule anywhere grants wildcards, escalate, bind or impersonate', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { namespaced: false } });
    for (const role of [...out.all('Role'), ...out.all('ClusterRole')]) {
      for (const rule of role.rules as k8s.V1PolicyRule[]) {
        expect([...(rule.verbs ?? []), ...(rule.resources ?? []), ...(rule.apiGroups ?? [])]).not.toContain('*');
        expect(rule.verbs).not.toEqual(expect.arrayContaining(['escalate']));
        expect(rule.verbs).not.toEqual(expect.arrayContaining(['bind']));
        expect(rule.verbs).not.toEqual(expect.arrayContaining(['impersonate']));
      }
    }
  });

  test('operator, namespaced (default): a Role in each pool namespace, the namespaces by name, pools; WATCH_NAMESPACES', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { targetNamespace: 'boxes', extraPoolNamespaces: ['boxes-b', 'boxes'] } });
    const roles = out.all('Role').filter((r) => r.metadata.name === OPERATOR);
    expect(roles.map((r) => r.metadata.namespace)).toEqual(['boxes', 'boxes-b']);
    for (const role of roles) expect(role.rules).toEqual(OPERATOR_NAMESPACED_RULES);
    const bindings = out.all('RoleBinding').filter((r) => r.metadata.name === OPERATOR);
    expect(bindings.map((b) => [b.metadata.namespace, b.subjects])).toEqual(
      ['boxes', 'boxes-b'].map((ns) => [ns, [{ kind: 'ServiceAccount', name: OPERATOR, namespace: 'bridge-ns' }]]),
    );
    expect(out.one('ClusterRole', OPERATOR).rules).toEqual([
      { apiGroups: [''], resources: ['namespaces'], resourceNames: ['boxes', 'boxes-b'], verbs: NAMESPACE_VERBS },
      ...OPERATOR_POOL_RULES,
    ]);
    expect(env(out.one('Deployment', OPERATOR))).toMatchObject({ WATCH_NAMESPACES: 'boxes,boxes-b' });
    // Both pool namespaces are created, so the Roles can be bound at install.
    expect(out.all('Namespace').map((n) => n.metadata.name)).toEqual(['boxes', 'boxes-b']);

    const lease = out.one('Role', `${OPERATOR}-leader-election`);
    expect(lease.metadata.namespace).toBe('bridge-ns');
    expect(lease.rules).toContainEqual({ apiGroups: ['coordination.k8s.io'], resources: ['leases'], resourceNames: [OPERATOR], verbs: ['get', 'update'] });
    expect(out.one('Role', `${OPERATOR}-events`).metadata.namespace).toBe('default');
    expect(env(out.one('Deployment', OPERATOR))).toMatchObject({ LEASE_NAMESPACE: 'bridge-ns', LEASE_NAME: OPERATOR });
  });

  test('operator, rbac.namespaced=false: one ClusterRole with every rule, every namespace watched', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { namespaced: false } });
    expect(out.all('Role').filter((r) => r.metadata.name === OPERATOR)).toHaveLength(0);
    expect(out.one('ClusterRole', OPERATOR).rules).toEqual([
      { apiGroups: [''], resources: ['namespaces'], verbs: NAMESPACE_VERBS },
      ...OPERATOR_POOL_RULES,
      ...OPERATOR_NAMESPACED_RULES,
    ]);
    expect(env(out.one('Deployment', OPERATOR))).toMatchObject({ WATCH_NAMESPACES: '' });
  });
});

describe('operator node checks (box PID limits)', () => {
  const NODE_PROXY_RULE = { apiGroups: [''], resources: ['nodes/proxy'], verbs: ['get'] };
  const grantsNodeProxy = (out: ReturnType<typeof template>) =>
    [...out.all('Role'), ...out.all('ClusterRole')].filter((r) => (r.rules as k8s.V1PolicyRule[]).some((rule) => rule.resources?.includes('nodes/proxy')));

  test('off by default: no role anywhere grants nodes/proxy; the operator is told NODE_CHECKS=false', () => {
    for (const namespaced of [true, false]) {
      const out = template({ secret: { token: TOKEN }, rbac: { namespaced } });
      expect(grantsNodeProxy(out).map((r) => r.metadata.name)).toEqual([]);
      expect(env(out.one('Deployment', OPERATOR))).toMatchObject({ NODE_CHECKS: 'false', NODE_CHECK_INTERVAL_SECONDS: '3600' });
    }
  });

  test('enabled, namespaced RBAC: get nodes/proxy in the operator ClusterRole only (nodes are cluster-scoped); the interval passed on', () => {
    const out = template({ secret: { token: TOKEN }, operator: { nodeChecks: { enabled: true, intervalSeconds: 600 } } });
    expect(out.one('ClusterRole', OPERATOR).rules).toEqual([
      { apiGroups: [''], resources: ['namespaces'], resourceNames: ['sandbox'], verbs: NAMESPACE_VERBS },
      ...OPERATOR_POOL_RULES,
      NODE_PROXY_RULE,
    ]);
    expect(grantsNodeProxy(out).map((r) => `${r.kind}/${r.metadata.name}`)).toEqual([`ClusterRole/${OPERATOR}`]);
    for (const role of out.all('Role').filter((r) => r.metadata.name === OPERATOR)) expect(role.rules).toEqual(OPERATOR_NAMESPACED_RULES);
    expect(env(out.one('Deployment', OPERATOR))).toMatchObject({ NODE_CHECKS: 'true', NODE_CHECK_INTERVAL_SECONDS: '600' });
  });

  test('enabled, rbac.namespaced=false: the same rule in the one operator ClusterRole', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { namespaced: false }, operator: { nodeChecks: { enabled: true } } });
    expect(out.one('ClusterRole', OPERATOR).rules).toEqual([
      { apiGroups: [''], resources: ['namespaces'], verbs: NAMESPACE_VERBS },
      ...OPERATOR_POOL_RULES,
      NODE_PROXY_RULE,
      ...OPERATOR_NAMESPACED_RULES,
    ]);
    expect(grantsNodeProxy(out).map((r) => `${r.kind}/${r.metadata.name}`)).toEqual([`ClusterRole/${OPERATOR}`]);
    expect(env(out.one('Deployment', OPERATOR))).toMatchObject({ NODE_CHECKS: 'true', NODE_CHECK_INTERVAL_SECONDS: '3600' });
  });

  test('the schema refuses a non-boolean switch, an interval under 5 s and unknown keys', () => {
    for (const nodeChecks of [{ enabled: 'yes' }, { intervalSeconds: 1 }, { enabled: true, pidsLimit: 4096 }]) {
      const out = template({ secret: { token: TOKEN }, operator: { nodeChecks } });
      expect({ nodeChecks, status: out.status }).toEqual({ nodeChecks, status: 1 });
    }
  });
});

describe('operator box health and webhooks', () => {
  test('defaults: the Pending threshold, no webhooks, no webhook Secret or volume; events may be created', () => {
    const out = template();
    const dep = out.one('Deployment', OPERATOR);
    expect(env(dep)).toMatchObject({ STUCK_PENDING_SECONDS: '300' });
    expect(env(dep).WEBHOOKS_FILE).toBeUndefined();
    expect(out.all('Secret').map((s) => s.metadata.name)).toEqual(['rel-sandbox-bridge-boxd-key', ...EGRESS_SECRETS, 'rel-sandbox-bridge-token']);
    expect(dep.spec.template.spec.volumes.map((v: k8s.V1Volume) => v.name)).toEqual(['tmp', 'boxd-key', 'egress-key']);
    // Box events go on the box pods, in the pool namespace: the operator's Role there allows them.
    const role = out.all('Role').find((r) => r.metadata.name === OPERATOR && r.metadata.namespace === 'sandbox')!;
    expect(role.rules).toContainEqual(expect.objectContaining({ resources: ['events'], verbs: expect.arrayContaining(['create']) }));
  });

  test('endpoints and a signing key: a Secret mounted as files, tunables as env, a rollout when they change', () => {
    const endpoints = [
      { url: 'https://alerts.example.com/hooks/sandbox', events: ['oom_killed', 'evicted'] },
      { url: 'https://hooks.slack.com/services/T/B/X', format: 'slack' },
    ];
    const values = { secret: { token: TOKEN }, operator: { health: { stuckPendingSeconds: 120 }, webhooks: { endpoints, signingKey: 'sign-me', debounceSeconds: 30, maxAttempts: 4, timeoutSeconds: 5 } } };
    const out = template(values);
    const secret = out.one('Secret', `${OPERATOR}-webhooks`);
    expect(JSON.parse(Buffer.from(secret.data['webhooks.json'], 'base64').toString())).toEqual({ endpoints });
    expect(Buffer.from(secret.data['signing-key'], 'base64').toString()).toBe('sign-me');
    const dep = out.one('Deployment', OPERATOR);
    expect(env(dep)).toMatchObject({
      STUCK_PENDING_SECONDS: '120',
      WEBHOOKS_FILE: '/var/run/secrets/sandbox-bridge-webhooks/webhooks.json',
      WEBHOOK_SIGNING_KEY_FILE: '/var/run/secrets/sandbox-bridge-webhooks/signing-key',
      WEBHOOK_DEBOUNCE_SECONDS: '30',
      WEBHOOK_MAX_ATTEMPTS: '4',
      WEBHOOK_TIMEOUT_SECONDS: '5',
    });
    // No URL or key in the pod spec itself.
    expect(JSON.stringify(dep)).not.toContain('hooks.slack.com');
    expect(JSON.stringify(dep)).not.toContain('sign-me');
    expect(dep.spec.template.spec.volumes).toContainEqual(expect.objectContaining({ name: 'webhooks', secret: expect.objectContaining({ secretName: `${OPERATOR}-webhooks` }) }));
    const checksum = dep.spec.template.metadata.annotations['checksum/webhooks'];
    expect(checksum).toMatch(/^[0-9a-f]{64}$/);
    const changed = template({ ...values, operator: { ...values.operator, webhooks: { ...values.operator.webhooks, signingKey: 'other' } } });
    expect(changed.one('Deployment', OPERATOR).spec.template.metadata.annotations['checksum/webhooks']).not.toBe(checksum);
  });

  test('existingSecret: mounted, nothing rendered; egress rules join the operator NetworkPolicy', () => {
    const egress = [{ to: [{ ipBlock: { cidr: '203.0.113.0/24' } }], ports: [{ port: 443, protocol: 'TCP' }] }];
    const out = template({ secret: { token: TOKEN }, operator: { webhooks: { existingSecret: 'my-hooks', egress } } });
    expect(out.all('Secret').map((s) => s.metadata.name)).toEqual(['rel-sandbox-bridge-boxd-key', ...EGRESS_SECRETS, 'rel-sandbox-bridge-token']);
    const dep = out.one('Deployment', OPERATOR);
    expect(env(dep)).toMatchObject({ WEBHOOKS_FILE: '/var/run/secrets/sandbox-bridge-webhooks/webhooks.json', WEBHOOK_SIGNING_KEY_FILE: '/var/run/secrets/sandbox-bridge-webhooks/signing-key' });
    expect(dep.spec.template.spec.volumes).toContainEqual(expect.objectContaining({ name: 'webhooks', secret: expect.objectContaining({ secretName: 'my-hooks' }) }));
    expect(out.one('NetworkPolicy', OPERATOR).spec.egress).toEqual(expect.arrayContaining(egress));
    expect(out.one('NetworkPolicy', BRIDGE).spec.egress).not.toEqual(expect.arrayContaining(egress));
  });

  test('the schema refuses bad endpoints', () => {
    for (const endpoint of [{ url: 'ftp://x' }, { url: 'https://x', events: ['sneezed'] }, { url: 'https://x', format: 'xml' }]) {
      const out = template({ secret: { token: TOKEN }, operator: { webhooks: { endpoints: [endpoint] } } });
      expect({ endpoint, status: out.status }).toEqual({ endpoint, status: 1 });
    }
  });
});

describe('ingress', () => {
  test('off by default', () => {
    expect(template().all('Ingress')).toHaveLength(0);
  });

  test('enabled without a host fails with a clear message', () => {
    const out = template({ secret: { token: TOKEN }, ingress: { enabled: true } });
    expect(out.status).not.toBe(0);
    expect(out.stderr).toContain('ingress.host is required when ingress.enabled=true');
  });

  test('TLS through the cert-manager cluster issuer; class and host; trust proxy on', () => {
    const out = template({
      secret: { token: TOKEN },
      ingress: { enabled: true, host: 'bridge.example.com', className: 'nginx', clusterIssuer: 'letsencrypt-prod' },
    });
    const ing = out.one('Ingress', BRIDGE);
    expect(ing.metadata.annotations).toMatchObject({ 'cert-manager.io/cluster-issuer': 'letsencrypt-prod' });
    expect(ing.spec.ingressClassName).toBe('nginx');
    expect(ing.spec.tls).toEqual([{ hosts: ['bridge.example.com'], secretName: 'rel-sandbox-bridge-tls' }]);
    expect(ing.spec.rules[0].host).toBe('bridge.example.com');
    expect(ing.spec.rules[0].http.paths[0].backend).toEqual({ service: { name: BRIDGE, port: { name: 'http' } } });
    expect(env(out.one('Deployment', BRIDGE)).TRUST_PROXY).toBe('1');
  });

  test('tls=false: no TLS section and no issuer annotation', () => {
    const out = template({ secret: { token: TOKEN }, ingress: { enabled: true, host: 'b.example.com', tls: false } });
    const ing = out.one('Ingress', BRIDGE);
    expect(ing.spec.tls).toBeUndefined();
    expect(ing.metadata.annotations?.['cert-manager.io/cluster-issuer']).toBeUndefined();
  });
});

describe('scaling and disruption', () => {
  test('HPA off: fixed replicas', () => {
    const out = template();
    expect(out.all('HorizontalPodAutoscaler')).toHaveLength(0);
    expect(out.one('Deployment', BRIDGE).spec.replicas).toBe(2);
    expect(out.one('Deployment', OPERATOR).spec.replicas).toBe(2);
  });

  test('HPA on: autoscaling/v2, 2-10 at 70% CPU / 80% memory; the Deployment leaves replicas to it', () => {
    const out = template({ secret: { token: TOKEN }, autoscaling: { enabled: true } });
    const hpa = out.one('HorizontalPodAutoscaler', BRIDGE);
    expect(hpa.apiVersion).toBe('autoscaling/v2');
    expect(hpa.spec).toMatchObject({ minReplicas: 2, maxReplicas: 10, scaleTargetRef: { kind: 'Deployment', name: BRIDGE } });
    expect(hpa.spec.metrics).toEqual([
      { type: 'Resource', resource: { name: 'cpu', target: { type: 'Utilization', averageUtilization: 70 } } },
      { type: 'Resource', resource: { name: 'memory', target: { type: 'Utilization', averageUtilization: 80 } } },
    ]);
    expect(out.one('Deployment', BRIDGE).spec.replicas).toBeUndefined();
  });

  test('PDB minAvailable 1 (bridge and operator); can be turned off', () => {
    const out = template();
    expect(out.one('PodDisruptionBudget', BRIDGE).spec.minAvailable).toBe(1);
    expect(out.one('PodDisruptionBudget', OPERATOR).spec.minAvailable).toBe(1);
    const off = template({ secret: { token: TOKEN }, podDisruptionBudget: { enabled: false } });
    expect(off.all('PodDisruptionBudget').map((p) => p.metadata.name)).toEqual([OPERATOR, GATEWAY]);
  });
});

describe('network policy', () => {
  test('deny by default; API port from the release namespace; metrics port from Prometheus; egress DNS, API server, boxd', () => {
    const out = template({ secret: { token: TOKEN }, networkPolicy: { egressCIDRs: ['10.0.0.1/32'] }, rbac: { targetNamespace: 'boxes' } });
    const np = out.one('NetworkPolicy', BRIDGE);
    expect(np.spec.policyTypes).toEqual(['Ingress', 'Egress']);
    expect(np.spec.podSelector.matchLabels).toMatchObject({ 'app.kubernetes.io/component': 'bridge' });
    const prometheus = {
      namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'monitoring' } },
      podSelector: { matchLabels: { 'app.kubernetes.io/name': 'prometheus' } },
    };
    expect(np.spec.ingress).toEqual([
      { ports: [{ protocol: 'TCP', port: 8080 }], from: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'bridge-ns' } } }] },
      { ports: [{ protocol: 'TCP', port: 9090 }], from: [prometheus] },
    ]);
    const dns = {
      to: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'kube-system' } } }],
      ports: [
        { protocol: 'UDP', port: 53 },
        { protocol: 'TCP', port: 53 },
      ],
    };
    const apiServer = { to: [{ ipBlock: { cidr: '10.0.0.1/32' } }], ports: [{ protocol: 'TCP', port: 443 }, { protocol: 'TCP', port: 6443 }] };
    expect(np.spec.egress).toEqual([
      dns,
      apiServer,
      {
        to: [
          {
            namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'boxes' } },
            podSelector: { matchLabels: { 'sandbox-bridge.io/box': 'true' } },
          },
        ],
        ports: [{ protocol: 'TCP', port: BOXD_PORT }],
      },
    ]);
    const op = out.one('NetworkPolicy', OPERATOR);
    expect(op.spec.policyTypes).toEqual(['Ingress', 'Egress']);
    expect(op.spec.ingress).toEqual([{ ports: [{ protocol: 'TCP', port: 9090 }], from: [prometheus] }]);
    expect(op.spec.egress).toEqual([dns, apiServer]);
  });

  test("the operator's egress reaches boxd only with an object store (idle sleep fences boxes and streams their workspaces)", () => {
    const toBoxd = (values: Record<string, unknown>) =>
      (template({ secret: { token: TOKEN }, rbac: { targetNamespace: 'boxes' }, ...values }).one('NetworkPolicy', OPERATOR).spec.egress as k8s.V1NetworkPolicyEgressRule[]).filter((r) =>
        r.ports?.some((p) => p.port === BOXD_PORT),
      );
    expect(toBoxd({})).toEqual([]);
    expect(toBoxd({ objectStore: { bucket: 'snaps' } })).toEqual([
      {
        to: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'boxes' } }, podSelector: { matchLabels: { 'sandbox-bridge.io/box': 'true' } } }],
        ports: [{ protocol: 'TCP', port: BOXD_PORT }],
      },
    ]);
  });

  test('metricsIngressFrom: [] admits nobody to the metrics port (no rule without `from`, which would admit all)', () => {
    const out = template({ secret: { token: TOKEN }, networkPolicy: { metricsIngressFrom: [] } });
    expect(out.one('NetworkPolicy', BRIDGE).spec.ingress.map((r: k8s.V1NetworkPolicyIngressRule) => r.ports?.[0]?.port)).toEqual([8080]);
    expect(out.one('NetworkPolicy', OPERATOR).spec.ingress).toEqual([]);
  });

  test('extra sources for the API port (an ingress controller)', () => {
    const peer = { namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'ingress-nginx' } } };
    const out = template({ secret: { token: TOKEN }, networkPolicy: { extraIngressFrom: [peer] } });
    expect(out.one('NetworkPolicy', BRIDGE).spec.ingress[0].from).toContainEqual(peer);
  });

  test('disabled: none', () => {
    expect(template({ secret: { token: TOKEN }, networkPolicy: { enabled: false } }).all('NetworkPolicy')).toHaveLength(0);
  });
});

describe('monitoring', () => {
  test('no ServiceMonitor or PrometheusRule unless the cluster serves monitoring.coreos.com/v1', () => {
    const out = template();
    expect(out.all('ServiceMonitor')).toHaveLength(0);
    expect(out.all('PrometheusRule')).toHaveLength(0);
  });

  test('with the capability: a ServiceMonitor on both metrics Services, and the spec alerts on metrics the bridge exports', async () => {
    const out = template(undefined, { apiVersions: MONITORING_APIS });
    const sm = out.one('ServiceMonitor');
    expect(sm.spec.endpoints).toEqual([expect.objectContaining({ port: 'metrics', path: '/metrics' })]);
    const scraped = out.all('Service').filter((s) => Object.entries(sm.spec.selector.matchLabels).every(([k, v]) => s.metadata.labels?.[k] === v));
    expect(scraped.map((s) => s.metadata.name).sort()).toEqual([`${BRIDGE}-metrics`, `${GATEWAY}-metrics`, `${OPERATOR}-metrics`]);
    // The bridge's API Service does not expose the unauthenticated metrics port.
    expect(out.one('Service', BRIDGE).spec.ports.map((p: k8s.V1ServicePort) => p.name)).toEqual(['http']);

    const rules = out.one('PrometheusRule').spec.groups[0].rules as Array<{ alert: string; expr: string }>;
    expect(rules.map((r) => r.alert)).toEqual([
      'SandboxBridgeBoxesNearLimit',
      'SandboxBridgeRestarted',
      'SandboxBridgeUnhealthy',
      'SandboxEgressGatewayDown',
      'SandboxBoxesOOMKilled',
      'SandboxBoxesCrashing',
      'SandboxBoxImagePullFailing',
      'SandboxBoxesStuckPending',
      'SandboxBoxesEvicted',
    ]);
    const byName = Object.fromEntries(rules.map((r) => [r.alert, r.expr]));
    expect(byName.SandboxBridgeBoxesNearLimit).toMatch(/sandbox_bridge_boxes_active.*> 0\.8 \* .*sandbox_bridge_boxes_limit/s);
    expect(byName.SandboxBridgeRestarted).toMatch(/time\(\) - sandbox_bridge_process_start_time_seconds.*< 60/s);
    expect(byName.SandboxBridgeUnhealthy).toContain('sandbox_bridge_healthy');
    expect(byName.SandboxBoxesOOMKilled).toBe(
      'sum by (pool) (increase(sandbox_operator_box_failures_total{namespace="bridge-ns", job="rel-sandbox-bridge-operator-metrics", reason="oom_killed"}[15m])) > 5',
    );
    expect(byName.SandboxBoxesEvicted).toMatch(/reason="evicted"\}\[15m\]\)\) > 0$/);
    // Every metric an alert names is one the bridge or the operator really exports.
    const exported = new Set([
      ...(await createMetrics().registry.getMetricsAsJSON()).map((m) => m.name),
      ...(await createOperatorMetrics().registry.getMetricsAsJSON()).map((m) => m.name),
    ]);
    for (const expr of Object.values(byName)) {
      for (const name of expr.match(/sandbox_(bridge|operator)_[a-z_]+/g) ?? []) expect({ name, exported: exported.has(name) }).toEqual({ name, exported: true });
    }
  });

  test('the Grafana dashboard: off by default; a ConfigMap with the sidecar label holding dashboards/sandbox-bridge.json', () => {
    expect(template().all('ConfigMap')).toHaveLength(0);
    const out = template({ secret: { token: TOKEN }, metrics: { grafanaDashboard: { enabled: true, folder: 'Platform', namespace: 'monitoring' } } });
    const cm = out.one('ConfigMap', 'rel-sandbox-bridge-dashboard');
    expect(cm.metadata.namespace).toBe('monitoring');
    expect(cm.metadata.labels).toMatchObject({ grafana_dashboard: '1' });
    expect(cm.metadata.annotations).toEqual({ grafana_folder: 'Platform' });
    expect(JSON.parse(cm.data['sandbox-bridge.json'])).toEqual(JSON.parse(readFileSync(join(CHART, 'dashboards/sandbox-bridge.json'), 'utf8')));
    const relabelled = template({ secret: { token: TOKEN }, metrics: { grafanaDashboard: { enabled: true, label: 'dashboards', labelValue: 'sandbox' } } });
    expect(relabelled.one('ConfigMap').metadata.labels).toMatchObject({ dashboards: 'sandbox' });
  });

  test('box failure alert thresholds and window come from values', () => {
    const out = template(
      { secret: { token: TOKEN }, metrics: { prometheusRule: { boxFailures: { window: '1h', oomKilled: 20, crashed: 5, imagePullFailed: 0, stuckPending: 2, evicted: 0 } } } },
      { apiVersions: MONITORING_APIS },
    );
    const rules = out.one('PrometheusRule').spec.groups[0].rules as Array<{ alert: string; expr: string }>;
    const expr = (alert: string) => rules.find((r) => r.alert === alert)!.expr;
    expect(expr('SandboxBoxesOOMKilled')).toMatch(/\[1h\]\)\) > 20$/);
    expect(expr('SandboxBoxesStuckPending')).toMatch(/reason="stuck_pending"\}\[1h\]\)\) > 2$/);
  });
});

describe('pods and security', () => {
  test('every program (bridge, operator, egress gateway): non-root 65534, read-only root, no capabilities, RuntimeDefault seccomp, no privilege escalation', () => {
    const out = template();
    for (const name of [BRIDGE, OPERATOR, GATEWAY]) {
      const spec = out.one('Deployment', name).spec.template.spec as k8s.V1PodSpec;
      expect(spec.securityContext).toMatchObject({ runAsNonRoot: true, runAsUser: 65534, seccompProfile: { type: 'RuntimeDefault' } });
      for (const c of spec.containers) {
        expect(c.securityContext).toMatchObject({
          runAsNonRoot: true,
          runAsUser: 65534,
          readOnlyRootFilesystem: true,
          allowPrivilegeEscalation: false,
          capabilities: { drop: ['ALL'] },
          seccompProfile: { type: 'RuntimeDefault' },
        });
        expect(c.securityContext?.capabilities?.add).toBeUndefined();
        expect(c.securityContext?.privileged).toBeFalsy();
      }
      // The programs need the API token; the ServiceAccounts themselves do not hand it out.
      expect(spec.automountServiceAccountToken).toBe(true);
    }
    for (const sa of out.all('ServiceAccount')) expect(sa.automountServiceAccountToken).toBe(false);
  });

  test('bridge pod: probes on the metrics port, env from values, placement values passed through', () => {
    const out = template({
      secret: { token: TOKEN },
      logLevel: 'debug',
      rbac: { targetNamespace: 'boxes' },
      box: { defaultImage: 'img:1' },
      pool: { name: 'p1' },
      extraEnv: [{ name: 'EXEC_OUTPUT_LIMIT_BYTES', value: '1024' }],
      nodeSelector: { pool: 'system' },
      tolerations: [{ key: 'k', operator: 'Exists' }],
      podAnnotations: { a: 'b' },
      podLabels: { team: 'x' },
    });
    const dep = out.one('Deployment', BRIDGE);
    const c = containers(dep)[0]!;
    expect(c.livenessProbe?.httpGet).toMatchObject({ path: '/livez', port: 'metrics' });
    expect(c.readinessProbe?.httpGet).toMatchObject({ path: '/readyz', port: 'metrics' });
    expect(env(dep)).toMatchObject({
      LOG_LEVEL: 'debug',
      POOL_NAME: 'p1',
      SANDBOX_NAMESPACE: 'boxes',
      BOX_DEFAULT_IMAGE: 'img:1',
      EXEC_OUTPUT_LIMIT_BYTES: '1024',
      PORT: '8080',
      METRICS_PORT: '9090',
    });
    const pod = dep.spec.template;
    expect(pod.spec.nodeSelector).toEqual({ pool: 'system' });
    expect(pod.spec.tolerations).toEqual([{ key: 'k', operator: 'Exists' }]);
    expect(pod.metadata.annotations).toMatchObject({ a: 'b' });
    expect(pod.metadata.labels).toMatchObject({ team: 'x' });
    expect(c.resources).toEqual({ requests: { cpu: '100m', memory: '256Mi' }, limits: { cpu: '500m', memory: '640Mi' } });
    // The operator runs from the same image with its own V8 flags and entry point.
    expect(containers(out.one('Deployment', OPERATOR))[0]!.args).toEqual([...NODE_FLAGS.operator, 'dist/operator/main.js']);
  });

  test('the default SandboxPool is built from box.* in the target namespace', () => {
    const out = template({
      secret: { token: TOKEN },
      rbac: { targetNamespace: 'boxes' },
      box: { maxConcurrentBoxes: 7, maxBoxesPerSession: 2, defaultTtlSeconds: 60, maxCpu: '2', nodeSelector: { type: 'kwok' } },
    });
    const pool = out.one('SandboxPool', 'default');
    expect(pool.spec).toMatchObject({
      namespace: 'boxes',
      podSecurityLevel: 'restricted',
      maxBoxes: 7,
      maxBoxesPerSession: 2,
      defaultTtlSeconds: 60,
      box: { defaultCpu: '1', maxCpu: '2', defaultMemory: '512Mi', maxMemory: '4Gi', nodeSelector: { type: 'kwok' } },
    });
    expect(template({ secret: { token: TOKEN }, pool: { create: false } }).all('SandboxPool')).toHaveLength(0);
  });

  test('the default SandboxPool admits only this release\'s bridge and operator pods and carries the egress defaults of common/pool.ts', () => {
    const out = template({ secret: { token: TOKEN } });
    const pool = out.one('SandboxPool', 'default');
    expect(pool.spec.bridge).toEqual({
      namespace: 'bridge-ns',
      podLabels: { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/instance': 'rel', 'app.kubernetes.io/component': 'bridge' },
      operatorPodLabels: { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/instance': 'rel', 'app.kubernetes.io/component': 'operator' },
    });
    // The bridge Deployment's pods carry those labels.
    const podLabels = out.one('Deployment', BRIDGE).spec.template.metadata.labels;
    expect(podLabels).toMatchObject(pool.spec.bridge.podLabels);
    // In gateway mode boxes reach only this release's egress gateway pods.
    expect(pool.spec.egress).toEqual({
      ...POOL_DEFAULTS.egress,
      gateway: {
        namespace: 'bridge-ns',
        podLabels: { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/instance': 'rel', 'app.kubernetes.io/component': 'egress-gateway' },
        service: GATEWAY,
      },
    });
  });

  test('the sandbox namespace may not be the release namespace', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { targetNamespace: 'bridge-ns' } });
    expect(out.status).not.toBe(0);
    expect(out.stderr).toContain('rbac.targetNamespace and rbac.extraPoolNamespaces must differ from the release namespace');
    const extra = template({ secret: { token: TOKEN }, rbac: { extraPoolNamespaces: ['bridge-ns'] } });
    expect(extra.status).not.toBe(0);
  });
});

describe('egress gateway', () => {
  const GATEWAY_SA = GATEWAY;
  const KEY_FILE = '/var/run/secrets/sandbox-bridge-egress/key';
  const RESOLVER_KEY_FILE = '/var/run/secrets/sandbox-bridge-egress-resolver/key';
  const SELECTOR = { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/instance': 'rel', 'app.kubernetes.io/component': 'egress-gateway' };
  const GATEWAY_NAMESPACED_RULES = [
    { apiGroups: [''], resources: ['pods', 'secrets'], verbs: ['list', 'watch'] },
    { apiGroups: [''], resources: ['events'], verbs: ['create'] },
  ];
  const GATEWAY_CLUSTER_RULES = [{ apiGroups: ['sandbox-bridge.io'], resources: ['sandboxpools'], verbs: ['list', 'watch'] }];
  const args = (out: ReturnType<typeof template>) => containers(out.one('Deployment', GATEWAY))[0]!.args!;
  const volume = (doc: Doc, name: string) => (doc.spec.template.spec.volumes as k8s.V1Volume[]).find((v) => v.name === name);
  const gatewayDocs = (out: ReturnType<typeof template>) =>
    out.docs.filter((d) => d.metadata.labels?.['app.kubernetes.io/component'] === 'egress-gateway').map((d) => `${d.kind}/${d.metadata.name}`);

  test('on by default: values, and every object of the gateway', () => {
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    const v = (load(readFileSync(join(CHART, 'values.yaml'), 'utf8')) as any).egressGateway;
    expect(v).toMatchObject({
      enabled: true,
      replicas: 2,
      image: { repository: 'ghcr.io/sandbox-bridge/egress-gateway', tag: '', pullPolicy: 'IfNotPresent' },
      podDisruptionBudget: { enabled: true, minAvailable: 1 },
      autoscaling: { enabled: false, targetCPUUtilization: 70 },
      key: '',
      existingSecret: '',
      networkPolicy: { extraEgress: [] },
    });
    expect(gatewayDocs(template()).sort()).toEqual(
      [
        `ClusterRole/${GATEWAY}`,
        `ClusterRoleBinding/${GATEWAY}`,
        `Deployment/${GATEWAY}`,
        `NetworkPolicy/${GATEWAY}`,
        `PodDisruptionBudget/${GATEWAY}`,
        `Role/${GATEWAY}`,
        `RoleBinding/${GATEWAY}`,
        ...EGRESS_SECRETS.map((n) => `Secret/${n}`),
        `Service/${GATEWAY}`,
        `Service/${GATEWAY}-metrics`,
        `ServiceAccount/${GATEWAY_SA}`,
      ].sort(),
    );
  });

  test('the Deployment: the Kubernetes source in the sandbox namespace, its keys as files, probes on the metrics port, spread over nodes', () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string };
    const out = template({ secret: { token: TOKEN }, rbac: { targetNamespace: 'boxes' } });
    const dep = out.one('Deployment', GATEWAY);
    expect(dep.spec.replicas).toBe(2);
    expect(dep.spec.selector.matchLabels).toEqual(SELECTOR);
    const pod = dep.spec.template.spec as k8s.V1PodSpec;
    expect(pod.serviceAccountName).toBe(GATEWAY_SA);
    expect(pod.automountServiceAccountToken).toBe(true); // it watches the API server
    expect(out.one('ServiceAccount', GATEWAY_SA).automountServiceAccountToken).toBe(false);
    const c = pod.containers[0]!;
    expect(c.image).toBe(`ghcr.io/sandbox-bridge/egress-gateway:${pkg.version}`);
    expect(c.args).toEqual([
      'serve',
      '-source=kubernetes',
      '-kube-namespace=boxes',
      '-listen=:3128',
      '-metrics-listen=:9090',
      `-key-file=${KEY_FILE}`,
      `-resolver-key-file=${RESOLVER_KEY_FILE}`,
    ]);
    expect(c.env).toBeUndefined(); // nothing secret, nothing at all by default
    expect(c.ports).toEqual([
      { name: 'proxy', containerPort: 3128, protocol: 'TCP' },
      { name: 'metrics', containerPort: 9090, protocol: 'TCP' },
    ]);
    expect(c.livenessProbe?.httpGet).toEqual({ path: '/healthz', port: 'metrics' });
    expect(c.readinessProbe?.httpGet).toEqual({ path: '/readyz', port: 'metrics' });
    expect(c.resources).toEqual({ requests: { cpu: '50m', memory: '64Mi' }, limits: { cpu: '1', memory: '256Mi' } });
    expect(c.volumeMounts).toEqual([
      { name: 'egress-key', mountPath: '/var/run/secrets/sandbox-bridge-egress', readOnly: true },
      { name: 'resolver-key', mountPath: '/var/run/secrets/sandbox-bridge-egress-resolver', readOnly: true },
    ]);
    expect(volume(dep, 'egress-key')!.secret).toMatchObject({ secretName: 'rel-sandbox-bridge-egress-key', items: [{ key: 'key', path: 'key' }] });
    expect(volume(dep, 'resolver-key')!.secret).toMatchObject({ secretName: 'rel-sandbox-bridge-egress-resolver-key', items: [{ key: 'key', path: 'key' }] });
    expect(pod.topologySpreadConstraints).toEqual([
      { maxSkew: 1, topologyKey: 'kubernetes.io/hostname', whenUnsatisfiable: 'ScheduleAnyway', labelSelector: { matchLabels: SELECTOR } },
    ]);
    // A generated key never changes, so nothing rolls the pods for it.
    expect(dep.spec.template.metadata.annotations?.['checksum/egress-key']).toBeUndefined();
    for (const name of EGRESS_SECRETS) {
      expect(Buffer.from(out.one('Secret', name).data.key, 'base64').toString()).toMatch(/^[A-Za-z0-9]{64}$/);
    }
  });

  test('Services: the proxy on 3128 under the name the pool is given; metrics on 9090 in a scraped Service of its own', () => {
    const out = template();
    const proxy = out.one('Service', GATEWAY);
    expect(proxy.spec).toEqual({ type: 'ClusterIP', selector: SELECTOR, ports: [{ name: 'proxy', port: 3128, targetPort: 'proxy', protocol: 'TCP' }] });
    const metrics = out.one('Service', `${GATEWAY}-metrics`);
    expect(metrics.metadata.labels).toMatchObject({ 'sandbox-bridge.io/scrape': 'true' });
    expect(metrics.spec).toEqual({ type: 'ClusterIP', selector: SELECTOR, ports: [{ name: 'metrics', port: 9090, targetPort: 'metrics', protocol: 'TCP' }] });
    expect(out.one('SandboxPool').spec.egress.gateway.service).toBe(proxy.metadata.name);
  });

  test('the bridge and the operator mount the same egress key and read it from EGRESS_KEY_FILE; only the gateway has the resolver key', () => {
    const out = template();
    const gateway = out.one('Deployment', GATEWAY);
    for (const name of [BRIDGE, OPERATOR]) {
      const dep = out.one('Deployment', name);
      expect(env(dep).EGRESS_KEY_FILE).toBe(KEY_FILE);
      expect(volume(dep, 'egress-key')).toEqual(volume(gateway, 'egress-key'));
      expect(containers(dep)[0]!.volumeMounts).toContainEqual({ name: 'egress-key', mountPath: '/var/run/secrets/sandbox-bridge-egress', readOnly: true });
      expect(volume(dep, 'resolver-key')).toBeUndefined();
    }
  });

  test('disabled: nothing of the gateway, no key for the bridge and operator; a gateway-mode pool then fails the install', () => {
    const out = template({ secret: { token: TOKEN }, egressGateway: { enabled: false } }, { apiVersions: MONITORING_APIS });
    expect(out.status).toBe(0);
    expect(gatewayDocs(out)).toEqual([]);
    for (const name of [BRIDGE, OPERATOR]) {
      expect(env(out.one('Deployment', name)).EGRESS_KEY_FILE).toBeUndefined();
      expect(volume(out.one('Deployment', name), 'egress-key')).toBeUndefined();
    }
    expect((out.one('PrometheusRule').spec.groups[0].rules as Array<{ alert: string }>).map((r) => r.alert)).not.toContain('SandboxEgressGatewayDown');
    const gatewayPool = template({ secret: { token: TOKEN }, egressGateway: { enabled: false }, pool: { egress: { mode: 'gateway' } } });
    expect(gatewayPool.status).not.toBe(0);
    expect(gatewayPool.stderr).toContain('pool.egress.mode=gateway needs the egress gateway: set egressGateway.enabled=true');
    expect(template({ secret: { token: TOKEN }, pool: { egress: { mode: 'gateway' } } }).one('SandboxPool').spec.egress.mode).toBe('gateway');
  });

  test('RBAC, namespaced (default): pools cluster-wide, pods and secrets list/watch and events only in the sandbox namespace', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { targetNamespace: 'boxes', extraPoolNamespaces: ['boxes-b'] } });
    expect(out.one('ClusterRole', GATEWAY).rules).toEqual(GATEWAY_CLUSTER_RULES);
    expect(out.one('ClusterRoleBinding', GATEWAY).subjects).toEqual([{ kind: 'ServiceAccount', name: GATEWAY_SA, namespace: 'bridge-ns' }]);
    const role = out.one('Role', GATEWAY);
    expect(role.metadata.namespace).toBe('boxes');
    expect(role.rules).toEqual(GATEWAY_NAMESPACED_RULES);
    const binding = out.one('RoleBinding', GATEWAY);
    expect(binding.metadata.namespace).toBe('boxes');
    expect(binding.roleRef).toEqual({ apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: GATEWAY });
    expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: GATEWAY_SA, namespace: 'bridge-ns' }]);
    // It watches the one namespace it has a Role in, and admits box pods of that namespace only.
    expect(args(out)).toContain('-kube-namespace=boxes');
    expect(out.one('NetworkPolicy', GATEWAY).spec.ingress[0].from.map((p: k8s.V1NetworkPolicyPeer) => p.namespaceSelector?.matchLabels)).toEqual([
      { 'kubernetes.io/metadata.name': 'boxes' },
    ]);
  });

  test('RBAC, rbac.namespaced=false: one ClusterRole, every namespace watched, box pods of every pool namespace admitted', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { namespaced: false, targetNamespace: 'boxes', extraPoolNamespaces: ['boxes-b'] } });
    expect(out.all('Role').filter((r) => r.metadata.name === GATEWAY)).toHaveLength(0);
    expect(out.all('RoleBinding').filter((r) => r.metadata.name === GATEWAY)).toHaveLength(0);
    expect(out.one('ClusterRole', GATEWAY).rules).toEqual([...GATEWAY_CLUSTER_RULES, ...GATEWAY_NAMESPACED_RULES]);
    expect(args(out).filter((a) => a.startsWith('-kube-namespace'))).toEqual([]);
    expect(out.one('NetworkPolicy', GATEWAY).spec.ingress[0].from).toEqual(
      ['boxes', 'boxes-b'].map((ns) => ({ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': ns } }, podSelector: { matchLabels: { 'sandbox-bridge.io/box': 'true' } } })),
    );
    expect(template({ secret: { token: TOKEN }, egressGateway: { rbac: { create: false } } }).all('ClusterRole').map((r) => r.metadata.name)).not.toContain(GATEWAY);
  });

  test('HPA on: CPU only, and the Deployment leaves replicas to it; PDB minAvailable 1 (can be turned off)', () => {
    const out = template({ secret: { token: TOKEN }, egressGateway: { autoscaling: { enabled: true, minReplicas: 3, maxReplicas: 12 } } });
    const hpa = out.one('HorizontalPodAutoscaler', GATEWAY);
    expect(hpa.apiVersion).toBe('autoscaling/v2');
    expect(hpa.spec).toEqual({
      scaleTargetRef: { apiVersion: 'apps/v1', kind: 'Deployment', name: GATEWAY },
      minReplicas: 3,
      maxReplicas: 12,
      metrics: [{ type: 'Resource', resource: { name: 'cpu', target: { type: 'Utilization', averageUtilization: 70 } } }],
    });
    expect(out.one('Deployment', GATEWAY).spec.replicas).toBeUndefined();
    expect(template().all('HorizontalPodAutoscaler')).toHaveLength(0);
    expect(template().one('PodDisruptionBudget', GATEWAY).spec).toEqual({ minAvailable: 1, selector: { matchLabels: SELECTOR } });
    expect(template({ secret: { token: TOKEN }, egressGateway: { podDisruptionBudget: { enabled: false } } }).all('PodDisruptionBudget').map((p) => p.metadata.name)).toEqual([BRIDGE, OPERATOR]);
  });

  test('existing key Secrets: nothing generated; the gateway, bridge and operator mount them under their keys', () => {
    const out = template({
      secret: { token: TOKEN },
      egressGateway: { existingSecret: 'my-egress', secretKey: 'keys', resolverKey: { existingSecret: 'my-resolver', secretKey: 'hmac' } },
    });
    expect(out.all('Secret').map((s) => s.metadata.name)).toEqual(['rel-sandbox-bridge-boxd-key', 'rel-sandbox-bridge-token']);
    for (const name of [GATEWAY, BRIDGE, OPERATOR]) {
      expect(volume(out.one('Deployment', name), 'egress-key')!.secret).toMatchObject({ secretName: 'my-egress', items: [{ key: 'keys', path: 'key' }] });
      expect(out.one('Deployment', name).spec.template.metadata.annotations?.['checksum/egress-key']).toBeUndefined();
    }
    expect(volume(out.one('Deployment', GATEWAY), 'resolver-key')!.secret).toMatchObject({ secretName: 'my-resolver', items: [{ key: 'hmac', path: 'key' }] });
  });

  test('a given key file is used as is and rolls all three when it changes; short keys fail', () => {
    const key = `${'n'.repeat(40)}\n${'o'.repeat(40)}`;
    const values = (k: string) => ({ secret: { token: TOKEN }, egressGateway: { key: k, resolverKey: { key: 'r'.repeat(32) } } });
    const out = template(values(key));
    expect(Buffer.from(out.one('Secret', EGRESS_SECRETS[0]).data.key, 'base64').toString()).toBe(key);
    expect(Buffer.from(out.one('Secret', EGRESS_SECRETS[1]).data.key, 'base64').toString()).toBe('r'.repeat(32));
    const checksums = [GATEWAY, BRIDGE, OPERATOR].map((name) => out.one('Deployment', name).spec.template.metadata.annotations['checksum/egress-key'] as string);
    expect(checksums[0]).toMatch(/^[0-9a-f]{64}$/);
    expect(new Set(checksums).size).toBe(1);
    const rotated = template(values(`${'p'.repeat(40)}\n${key}`));
    expect(rotated.one('Deployment', BRIDGE).spec.template.metadata.annotations['checksum/egress-key']).not.toBe(checksums[0]);
    // No key in any pod spec.
    for (const name of [GATEWAY, BRIDGE, OPERATOR]) expect(JSON.stringify(out.one('Deployment', name))).not.toContain('n'.repeat(40));
    for (const bad of [{ key: 'short' }, { key: `${'n'.repeat(40)}\nshort` }, { resolverKey: { key: 'short' } }]) {
      const res = template({ secret: { token: TOKEN }, egressGateway: bad });
      expect({ bad, status: res.status }).toEqual({ bad, status: 1 });
    }
  });

  test('NetworkPolicy: boxes in on 3128, Prometheus on 9090; out DNS, the API server, and the internet on any TCP port but not private ranges', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { targetNamespace: 'boxes' }, networkPolicy: { egressCIDRs: ['10.0.0.1/32'] } });
    const np = out.one('NetworkPolicy', GATEWAY);
    expect(np.spec.podSelector).toEqual({ matchLabels: SELECTOR });
    expect(np.spec.policyTypes).toEqual(['Ingress', 'Egress']);
    expect(np.spec.ingress).toEqual([
      {
        ports: [{ protocol: 'TCP', port: 3128 }],
        from: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'boxes' } }, podSelector: { matchLabels: { 'sandbox-bridge.io/box': 'true' } } }],
      },
      {
        ports: [{ protocol: 'TCP', port: 9090 }],
        from: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'monitoring' } }, podSelector: { matchLabels: { 'app.kubernetes.io/name': 'prometheus' } } }],
      },
    ]);
    expect(np.spec.egress).toEqual([
      {
        to: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'kube-system' } }, podSelector: { matchLabels: { 'k8s-app': 'kube-dns' } } }, { ipBlock: { cidr: '169.254.20.10/32' } }],
        ports: [
          { protocol: 'UDP', port: 53 },
          { protocol: 'TCP', port: 53 },
        ],
      },
      { to: [{ ipBlock: { cidr: '10.0.0.1/32' } }], ports: [{ protocol: 'TCP', port: 443 }, { protocol: 'TCP', port: 6443 }] },
      {
        to: [
          { ipBlock: { cidr: '0.0.0.0/0', except: ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', '169.254.0.0/16', '127.0.0.0/8', '0.0.0.0/8'] } },
          { ipBlock: { cidr: '::/0', except: ['fc00::/7', 'fe80::/10', '::1/128', '::/128'] } },
        ],
        ports: [{ protocol: 'TCP' }],
      },
    ]);
    // Nothing reaches boxd (7771) or any pod of the cluster by selector.
    expect(JSON.stringify(np.spec.egress)).not.toContain(String(BOXD_PORT));
  });

  test('NetworkPolicy: extraEgress (an in-cluster credential resolver) is added; [] metrics sources admit nobody there; off with networkPolicy.enabled', () => {
    const resolver = { to: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'vault' } } }], ports: [{ port: 8443, protocol: 'TCP' }] };
    const out = template({ secret: { token: TOKEN }, egressGateway: { networkPolicy: { extraEgress: [resolver] } }, networkPolicy: { metricsIngressFrom: [] } });
    const np = out.one('NetworkPolicy', GATEWAY);
    expect(np.spec.egress.at(-1)).toEqual(resolver);
    expect(np.spec.egress).toHaveLength(4);
    expect(np.spec.ingress.map((r: k8s.V1NetworkPolicyIngressRule) => r.ports?.[0]?.port)).toEqual([3128]);
    expect(out.one('NetworkPolicy', BRIDGE).spec.egress).not.toContainEqual(resolver);
    expect(template({ secret: { token: TOKEN }, networkPolicy: { enabled: false } }).all('NetworkPolicy')).toHaveLength(0);
  });

  test('upstream CA from a Secret or a ConfigMap: mounted and passed as -upstream-ca; both at once fail', () => {
    const fromSecret = template({ secret: { token: TOKEN }, egressGateway: { upstreamCA: { secretName: 'corp-ca', key: 'bundle.pem' } } });
    expect(args(fromSecret)).toContain('-upstream-ca=/etc/sandbox-bridge/upstream-ca/ca.crt');
    const dep = fromSecret.one('Deployment', GATEWAY);
    expect(volume(dep, 'upstream-ca')!.secret).toMatchObject({ secretName: 'corp-ca', items: [{ key: 'bundle.pem', path: 'ca.crt' }] });
    expect(containers(dep)[0]!.volumeMounts).toContainEqual({ name: 'upstream-ca', mountPath: '/etc/sandbox-bridge/upstream-ca', readOnly: true });
    const fromConfigMap = template({ secret: { token: TOKEN }, egressGateway: { upstreamCA: { configMapName: 'corp-ca' } } });
    expect(volume(fromConfigMap.one('Deployment', GATEWAY), 'upstream-ca')!.configMap).toMatchObject({ name: 'corp-ca', items: [{ key: 'ca.crt', path: 'ca.crt' }] });
    expect(args(template()).filter((a) => a.startsWith('-upstream-ca'))).toEqual([]);
    const both = template({ secret: { token: TOKEN }, egressGateway: { upstreamCA: { secretName: 'a', configMapName: 'b' } } });
    expect(both.status).not.toBe(0);
    expect(both.stderr).toContain('egressGateway.upstreamCA: set secretName or configMapName, not both');
  });

  test('placement, hostAliases, extraArgs and extraEnv pass through; spreading can be replaced or turned off', () => {
    const spread = { maxSkew: 2, topologyKey: 'topology.kubernetes.io/zone', whenUnsatisfiable: 'DoNotSchedule', labelSelector: { matchLabels: { custom: 'x' } } };
    const out = template({
      secret: { token: TOKEN },
      egressGateway: {
        replicas: 3,
        image: { repository: 'registry.example.com/egw', tag: 'v2', pullPolicy: 'Always' },
        hostAliases: [{ ip: '203.0.113.7', hostnames: ['resolver.example.internal'] }],
        extraArgs: ['-idle-timeout=10m', '-max-conns-per-box=512'],
        extraEnv: [{ name: 'GOMEMLIMIT', value: '230MiB' }],
        nodeSelector: { pool: 'egress' },
        tolerations: [{ key: 'egress', operator: 'Exists' }],
        affinity: { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchExpressions: [{ key: 'k', operator: 'Exists' }] }] } } },
        topologySpreadConstraints: [spread],
        podAnnotations: { a: 'b' },
        podLabels: { team: 'net' },
      },
    });
    const dep = out.one('Deployment', GATEWAY);
    const pod = dep.spec.template.spec as k8s.V1PodSpec;
    expect(dep.spec.replicas).toBe(3);
    expect(pod.containers[0]!.image).toBe('registry.example.com/egw:v2');
    expect(pod.containers[0]!.imagePullPolicy).toBe('Always');
    expect(pod.hostAliases).toEqual([{ ip: '203.0.113.7', hostnames: ['resolver.example.internal'] }]);
    expect(pod.containers[0]!.args!.slice(-2)).toEqual(['-idle-timeout=10m', '-max-conns-per-box=512']);
    expect(pod.containers[0]!.env).toEqual([{ name: 'GOMEMLIMIT', value: '230MiB' }]);
    expect(pod.nodeSelector).toEqual({ pool: 'egress' });
    expect(pod.tolerations).toEqual([{ key: 'egress', operator: 'Exists' }]);
    expect(pod.affinity?.nodeAffinity).toBeDefined();
    expect(pod.topologySpreadConstraints).toEqual([spread]);
    expect(dep.spec.template.metadata.annotations).toEqual({ a: 'b' });
    expect(dep.spec.template.metadata.labels).toMatchObject({ ...SELECTOR, team: 'net' });
    expect(template({ secret: { token: TOKEN }, egressGateway: { topologySpreadConstraints: [] } }).one('Deployment', GATEWAY).spec.template.spec.topologySpreadConstraints).toBeUndefined();
    expect(template({ secret: { token: TOKEN }, egressGateway: { extraArgs: ['not-a-flag'] } }).status).not.toBe(0);
    const digest = `sha256:${'b'.repeat(64)}`;
    expect(containers(template({ secret: { token: TOKEN }, egressGateway: { image: { digest } } }).one('Deployment', GATEWAY))[0]!.image).toBe(`ghcr.io/sandbox-bridge/egress-gateway@${digest}`);
  });

  test('the pool: the gateway Service, an optional host, and the credential resolver passed through as the CRD takes it', () => {
    const resolver = { url: 'https://resolver.platform.svc:8443/egress', hosts: ['api.github.com', '*.example.com'], ttlSeconds: 60 };
    const pool = template({
      secret: { token: TOKEN },
      pool: { egress: { mode: 'gateway', domains: { allow: ['api.github.com'] }, gateway: { host: 'egress.example.internal' }, credentialResolver: resolver } },
    }).one('SandboxPool');
    expect(pool.spec.egress.gateway).toEqual({ namespace: 'bridge-ns', podLabels: SELECTOR, service: GATEWAY, host: 'egress.example.internal' });
    expect(pool.spec.egress.credentialResolver).toEqual(resolver);
    expect(pool.spec.egress.mode).toBe('gateway');
    const plain = template().one('SandboxPool').spec.egress;
    expect(plain.gateway.host).toBeUndefined();
    expect(plain.credentialResolver).toBeUndefined();
    for (const bad of [{ url: 'ftp://x', hosts: ['a.com'] }, { url: 'https://x', hosts: [] }, { url: 'https://x', hosts: ['*'] }, { url: 'https://x' }]) {
      const res = template({ secret: { token: TOKEN }, pool: { egress: { credentialResolver: bad } } });
      expect({ bad, status: res.status }).toEqual({ bad, status: 1 });
    }
  });

  test('monitoring: the ServiceMonitor scrapes its metrics Service; an alert when no replica is up', () => {
    const out = template(undefined, { apiVersions: MONITORING_APIS });
    const rules = out.one('PrometheusRule').spec.groups[0].rules as Array<{ alert: string; expr: string; labels: Record<string, string> }>;
    const down = rules.find((r) => r.alert === 'SandboxEgressGatewayDown')!;
    expect(down.expr).toBe(`absent(up{namespace="bridge-ns", job="${GATEWAY}-metrics"} == 1)`);
    expect(down.labels).toEqual({ severity: 'critical' });
  });
});

describe('ports and preview links (docs/ports.md)', () => {
  const PREVIEW_SECRET = 'rel-sandbox-bridge-preview-key';
  const volumeOf = (dep: Doc, name: string) => dep.spec.template.spec.volumes.find((v: k8s.V1Volume) => v.name === name);

  test('defaults: the port limits as env; no preview URL, key, Secret or Ingress (links answer 501)', () => {
    const out = template();
    const dep = out.one('Deployment', BRIDGE);
    expect(env(dep)).toMatchObject({ PORT_MAX_CONNECTIONS_PER_BOX: '256', PORT_BYTES_PER_SECOND_PER_BOX: '67108864', PORT_FIRST_BYTE_TIMEOUT_MS: '120000', PORT_IDLE_TIMEOUT_MS: '600000' });
    expect(env(dep).PREVIEW_URL).toBeUndefined();
    expect(env(dep).PREVIEW_KEY_FILE).toBeUndefined();
    expect(volumeOf(dep, 'preview-key')).toBeUndefined();
    expect(out.all('Secret').map((s) => s.metadata.name)).not.toContain(PREVIEW_SECRET);
    expect(out.all('Ingress')).toHaveLength(0);
  });

  test('a host pattern: the key generated into a Secret and mounted; the wildcard Ingress with TLS through a DNS-01 issuer', () => {
    const out = template({
      secret: { token: TOKEN },
      ports: { maxConnectionsPerBox: 10, preview: { url: 'https://{port}-{box}.preview.example.com', ttlSeconds: 600, ingress: { enabled: true, className: 'nginx', clusterIssuer: 'dns01' } } },
    });
    const dep = out.one('Deployment', BRIDGE);
    expect(env(dep)).toMatchObject({ PORT_MAX_CONNECTIONS_PER_BOX: '10', PREVIEW_URL: 'https://{port}-{box}.preview.example.com', PREVIEW_KEY_FILE: '/var/run/secrets/sandbox-bridge-preview/key', PREVIEW_TTL_SECONDS: '600', PREVIEW_MAX_TTL_SECONDS: '604800' });
    expect(volumeOf(dep, 'preview-key').secret).toMatchObject({ secretName: PREVIEW_SECRET, items: [{ key: 'key', path: 'key' }] });
    const key = Buffer.from(out.one('Secret', PREVIEW_SECRET).data.key, 'base64').toString();
    expect(key).toMatch(/^[A-Za-z0-9]{64}$/);
    const ing = out.one('Ingress', `${BRIDGE}-preview`);
    expect(ing.spec.rules).toEqual([{ host: '*.preview.example.com', http: { paths: [{ path: '/', pathType: 'Prefix', backend: { service: { name: BRIDGE, port: { name: 'http' } } } }] } }]);
    expect(ing.spec.tls).toEqual([{ hosts: ['*.preview.example.com'], secretName: 'rel-sandbox-bridge-preview-tls' }]);
    expect(ing.spec.ingressClassName).toBe('nginx');
    expect(ing.metadata.annotations).toMatchObject({ 'cert-manager.io/cluster-issuer': 'dns01', 'nginx.ingress.kubernetes.io/proxy-buffering': 'off' });
  });

  test('a given key is used as is, a short one fails; an existing Secret is mounted under its key and none rendered', () => {
    const given = template({ secret: { token: TOKEN }, ports: { preview: { url: 'https://b.example.com/preview', key: 'p'.repeat(40) } } });
    expect(Buffer.from(given.one('Secret', PREVIEW_SECRET).data.key, 'base64').toString()).toBe('p'.repeat(40));
    const short = template({ secret: { token: TOKEN }, ports: { preview: { url: 'https://b.example.com/preview', key: 'short' } } });
    expect(short.status).not.toBe(0);
    expect(short.stderr).toContain('ports.preview.key must be at least 32 characters');
    const existing = template({ secret: { token: TOKEN }, ports: { preview: { url: 'https://b.example.com/preview', existingSecret: 'mine', secretKey: 'k' } } });
    expect(existing.all('Secret').map((s) => s.metadata.name)).not.toContain(PREVIEW_SECRET);
    expect(volumeOf(existing.one('Deployment', BRIDGE), 'preview-key').secret).toMatchObject({ secretName: 'mine', items: [{ key: 'k', path: 'key' }] });
  });

  test('the preview Ingress needs a host pattern (or a host); the schema refuses a URL that is not http(s)', () => {
    const path = template({ secret: { token: TOKEN }, ports: { preview: { url: 'https://b.example.com/preview', ingress: { enabled: true } } } });
    expect(path.status).not.toBe(0);
    expect(path.stderr).toContain('first label holds {port} and {box}');
    const host = template({ secret: { token: TOKEN }, ports: { preview: { url: 'https://b.example.com/preview', ingress: { enabled: true, host: 'p.example.com', tls: false } } } });
    expect(host.one('Ingress', `${BRIDGE}-preview`).spec.rules[0].host).toBe('p.example.com');
    const bad = template({ secret: { token: TOKEN }, ports: { preview: { url: 'preview.example.com' } } });
    expect(bad.status).toBe(1);
    expect(bad.stderr).toMatch(/values don't meet the specifications of the schema/);
  });
});
