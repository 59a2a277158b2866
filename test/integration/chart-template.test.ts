// Template tests for charts/sandbox-bridge: `helm template` (the real helm binary) over the
// chart's important branches, asserting on the rendered objects. No cluster needed.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type * as k8s from '@kubernetes/client-node';
import { load } from 'js-yaml';
import { createMetrics } from '../../bridge/metrics.js';
import { BOXD_PORT } from '../../common/boxd.js';
import { POOL_DEFAULTS } from '../../common/pool.js';
import { CHART, MONITORING_APIS, ROOT, TOKEN, helm, template, type Doc } from '../chart/helm.js';

const BRIDGE = 'rel-sandbox-bridge-bridge';
const OPERATOR = 'rel-sandbox-bridge-operator';

/** The bridge's Kubernetes calls (bridge/kube, bridge/services), as RBAC rules. */
const BRIDGE_NAMESPACED_RULES = [
  { apiGroups: [''], resources: ['pods'], verbs: ['create', 'get', 'list', 'watch', 'delete'] },
  { apiGroups: [''], resources: ['pods/log'], verbs: ['get'] },
  { apiGroups: [''], resources: ['pods/exec'], verbs: ['create', 'get'] },
  { apiGroups: [''], resources: ['secrets'], verbs: ['get', 'create', 'update'] },
  { apiGroups: ['metrics.k8s.io'], resources: ['pods'], verbs: ['list'] },
];
/** The operator's calls in each pool namespace (operator/controller.ts, pool-reconciler.ts, events). */
const OPERATOR_NAMESPACED_RULES = [
  { apiGroups: [''], resources: ['pods', 'secrets'], verbs: ['list', 'watch', 'delete'] },
  { apiGroups: [''], resources: ['resourcequotas', 'limitranges'], verbs: ['get', 'list', 'watch', 'create', 'patch'] },
  { apiGroups: ['networking.k8s.io'], resources: ['networkpolicies'], verbs: ['get', 'list', 'watch', 'create', 'patch'] },
  { apiGroups: [''], resources: ['events'], verbs: ['create', 'patch'] },
];
const OPERATOR_POOL_RULES = [
  { apiGroups: ['sandbox-bridge.io'], resources: ['sandboxpools'], verbs: ['get', 'list', 'watch'] },
  { apiGroups: ['sandbox-bridge.io'], resources: ['sandboxpools/status'], verbs: ['update'] },
  { apiGroups: ['sandbox-bridge.io'], resources: ['sandboxpools/finalizers'], verbs: ['update'] },
];
const NAMESPACE_VERBS = ['get', 'list', 'watch', 'create', 'patch'];
const BRIDGE_CLUSTER_RULES = [
  { apiGroups: [''], resources: ['nodes'], verbs: ['list'] },
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
    expect(v.secret).toEqual({ token: '', existingSecret: '', tokenKey: 'token' });
    expect(v.ingress).toMatchObject({ enabled: false, host: '', className: '', tls: true });
    expect(v.ingress.clusterIssuer).toBeTruthy();
    expect(v.autoscaling).toEqual({ enabled: false, minReplicas: 2, maxReplicas: 10, targetCPUUtilization: 70, targetMemoryUtilization: 80 });
    expect(v.resources).toEqual({ requests: { cpu: '100m', memory: '128Mi' }, limits: { cpu: '500m', memory: '512Mi' } });
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

  test('secret.token: the chart creates the Secret, mounts it as a file, and rolls pods when it changes', () => {
    const out = template();
    const secret = out.one('Secret');
    expect(secret.metadata.name).toBe('rel-sandbox-bridge-token');
    expect(Buffer.from(secret.data.token, 'base64').toString()).toBe(TOKEN);
    const dep = out.one('Deployment', BRIDGE);
    expect(env(dep).BRIDGE_TOKEN_FILE).toBe('/var/run/secrets/sandbox-bridge/token');
    expect(env(dep).BRIDGE_TOKEN).toBeUndefined();
    const volume = dep.spec.template.spec.volumes.find((v: k8s.V1Volume) => v.name === 'token');
    expect(volume.secret).toMatchObject({ secretName: 'rel-sandbox-bridge-token', items: [{ key: 'token', path: 'token' }] });
    // No subPath: only a whole-directory Secret volume is updated in place on rotation.
    const mount = containers(dep)[0]!.volumeMounts!.find((m) => m.name === 'token')!;
    expect(mount.subPath).toBeUndefined();
    expect(mount.mountPath).toBe('/var/run/secrets/sandbox-bridge');
    const checksum = dep.spec.template.metadata.annotations['checksum/token'];
    expect(checksum).toMatch(/^[0-9a-f]{64}$/);
    const rotated = template({ secret: { token: `${TOKEN}-rotated` } }).one('Deployment', BRIDGE);
    expect(rotated.spec.template.metadata.annotations['checksum/token']).not.toBe(checksum);
  });

  test('secret.existingSecret: no Secret rendered; the pods mount the named one under tokenKey', () => {
    const out = template({ secret: { existingSecret: 'my-token', tokenKey: 'bridge-token' } });
    expect(out.status).toBe(0);
    expect(out.all('Secret')).toHaveLength(0);
    const dep = out.one('Deployment', BRIDGE);
    const volume = dep.spec.template.spec.volumes.find((v: k8s.V1Volume) => v.name === 'token');
    expect(volume.secret).toMatchObject({ secretName: 'my-token', items: [{ key: 'bridge-token', path: 'token' }] });
    expect(dep.spec.template.metadata.annotations?.['checksum/token']).toBeUndefined();
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
    expect(off.all('PodDisruptionBudget').map((p) => p.metadata.name)).toEqual([OPERATOR]);
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
    expect(scraped.map((s) => s.metadata.name).sort()).toEqual([`${BRIDGE}-metrics`, `${OPERATOR}-metrics`]);
    // The bridge's API Service does not expose the unauthenticated metrics port.
    expect(out.one('Service', BRIDGE).spec.ports.map((p: k8s.V1ServicePort) => p.name)).toEqual(['http']);

    const rules = out.one('PrometheusRule').spec.groups[0].rules as Array<{ alert: string; expr: string }>;
    expect(rules.map((r) => r.alert)).toEqual(['SandboxBridgeBoxesNearLimit', 'SandboxBridgeRestarted', 'SandboxBridgeUnhealthy']);
    const byName = Object.fromEntries(rules.map((r) => [r.alert, r.expr]));
    expect(byName.SandboxBridgeBoxesNearLimit).toMatch(/sandbox_bridge_boxes_active.*> 0\.8 \* .*sandbox_bridge_boxes_limit/s);
    expect(byName.SandboxBridgeRestarted).toMatch(/time\(\) - sandbox_bridge_process_start_time_seconds.*< 60/s);
    expect(byName.SandboxBridgeUnhealthy).toContain('sandbox_bridge_healthy');
    // Every metric an alert names is one the bridge really exports.
    const exported = new Set((await createMetrics().registry.getMetricsAsJSON()).map((m) => m.name));
    for (const expr of Object.values(byName)) {
      for (const name of expr.match(/sandbox_bridge_[a-z_]+/g) ?? []) expect({ name, exported: exported.has(name) }).toEqual({ name, exported: true });
    }
  });
});

describe('pods and security', () => {
  test('both programs: non-root 65534, read-only root, no capabilities, RuntimeDefault seccomp, no privilege escalation', () => {
    const out = template();
    for (const name of [BRIDGE, OPERATOR]) {
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
    expect(c.resources).toEqual({ requests: { cpu: '100m', memory: '128Mi' }, limits: { cpu: '500m', memory: '512Mi' } });
    // The operator runs from the same image with the operator entry point.
    expect(containers(out.one('Deployment', OPERATOR))[0]!.args).toEqual(['dist/operator/main.js']);
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

  test('the default SandboxPool admits only this release\'s bridge pods and carries the egress defaults of common/pool.ts', () => {
    const out = template({ secret: { token: TOKEN } });
    const pool = out.one('SandboxPool', 'default');
    expect(pool.spec.bridge).toEqual({
      namespace: 'bridge-ns',
      podLabels: { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/instance': 'rel', 'app.kubernetes.io/component': 'bridge' },
    });
    // The bridge Deployment's pods carry those labels.
    const podLabels = out.one('Deployment', BRIDGE).spec.template.metadata.labels;
    expect(podLabels).toMatchObject(pool.spec.bridge.podLabels);
    expect(pool.spec.egress).toEqual(POOL_DEFAULTS.egress);
  });

  test('the sandbox namespace may not be the release namespace', () => {
    const out = template({ secret: { token: TOKEN }, rbac: { targetNamespace: 'bridge-ns' } });
    expect(out.status).not.toBe(0);
    expect(out.stderr).toContain('rbac.targetNamespace and rbac.extraPoolNamespaces must differ from the release namespace');
    const extra = template({ secret: { token: TOKEN }, rbac: { extraPoolNamespaces: ['bridge-ns'] } });
    expect(extra.status).not.toBe(0);
  });
});
