import type { V1Pod } from '@kubernetes/client-node';
import { BOX_SECRET_KEYS } from './boxd.js';
import { buildBoxPod, buildBoxSecret, warmTemplateHash, type BoxPodParams } from './box-pod.js';
import { EGRESS_PROXY_KEY, egressProxyCredential } from './egress-proxy.js';
import { POOL_DEFAULTS, withDefaults, type EgressPolicy } from './pool.js';

const BUNDLE = '/opt/sandbox-bridge/egress/ca-bundle.pem';

function params(egress: Pick<EgressPolicy, 'mode' | 'gateway'>): BoxPodParams {
  return {
    name: 'box-abc-0',
    namespace: 'sbx',
    poolName: 'p',
    shape: { image: 'img', cpuCores: 1, memoryBytes: 512 * 1024 * 1024 },
    box: POOL_DEFAULTS.box,
    boxdImage: 'boxd:1',
    nonce: '00ff',
    secretName: 'rec-box-abc-0',
    egress,
  };
}

const gateway = (host?: string): Pick<EgressPolicy, 'mode' | 'gateway'> => ({
  mode: 'gateway',
  gateway: { ...POOL_DEFAULTS.egress.gateway, namespace: 'gw-ns', service: 'egw', port: 3128, ...(host ? { host } : {}) },
});

const box = (pod: V1Pod) => pod.spec!.containers[0]!;
// The pool defaults' sizeLimits (1Gi, 256Mi) in bytes, for boxd's metrics.
const VOLUME_LIMITS = { name: 'BOXD_VOLUME_LIMITS', value: '/workspace=1073741824,/tmp=268435456' };

test('gateway mode: the proxy env in order, the credential by reference only, the CA bundle variables and volumes', () => {
  const pod = buildBoxPod(params(gateway()));
  const proxy = 'http://$(SANDBOX_EGRESS_POD):$(SANDBOX_EGRESS_CREDENTIAL)@egw.gw-ns.svc:3128';
  // Order matters: Kubernetes expands $(VAR) only of entries before the one that uses it.
  expect(box(pod).env).toEqual([
    { name: 'HOME', value: '/workspace' },
    VOLUME_LIMITS,
    { name: 'SANDBOX_EGRESS_POD', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } },
    { name: 'SANDBOX_EGRESS_CREDENTIAL', valueFrom: { secretKeyRef: { name: 'rec-box-abc-0', key: 'egress-proxy', optional: true } } },
    { name: 'HTTP_PROXY', value: proxy },
    { name: 'HTTPS_PROXY', value: proxy },
    { name: 'http_proxy', value: proxy },
    { name: 'https_proxy', value: proxy },
    { name: 'NO_PROXY', value: 'localhost,127.0.0.1,::1' },
    { name: 'no_proxy', value: 'localhost,127.0.0.1,::1' },
    { name: 'SSL_CERT_FILE', value: BUNDLE },
    { name: 'NODE_EXTRA_CA_CERTS', value: BUNDLE },
    { name: 'REQUESTS_CA_BUNDLE', value: BUNDLE },
    { name: 'CURL_CA_BUNDLE', value: BUNDLE },
    { name: 'GIT_SSL_CAINFO', value: BUNDLE },
    { name: 'BOXD_EGRESS_CA', value: '/opt/sandbox-bridge/egress-ca/ca.crt' },
    { name: 'BOXD_CA_BUNDLE', value: BUNDLE },
  ]);
  expect(pod.spec!.volumes).toEqual(
    expect.arrayContaining([
      { name: 'egress-ca', configMap: { name: 'sandbox-bridge-egress-ca', optional: true, items: [{ key: 'ca.crt', path: 'ca.crt' }] } },
      { name: 'egress', emptyDir: { sizeLimit: '4Mi' } },
    ]),
  );
  expect(box(pod).volumeMounts).toEqual(
    expect.arrayContaining([
      { name: 'egress-ca', mountPath: '/opt/sandbox-bridge/egress-ca', readOnly: true },
      { name: 'egress', mountPath: '/opt/sandbox-bridge/egress' },
    ]),
  );
  // The Secret's volume still projects only boxd's two files, never the proxy credential.
  const secretVolume = pod.spec!.volumes!.find((v) => v.name === 'box-secret')!;
  expect(secretVolume.secret!.items!.map((i) => i.key)).toEqual([BOX_SECRET_KEYS.token, BOX_SECRET_KEYS.env]);
  // The init container is not pointed anywhere: it only copies boxd.
  expect(pod.spec!.initContainers![0]!.env).toBeUndefined();
});

test('gateway mode with gateway.host: the proxy names that host (an IPv6 address in brackets)', () => {
  const value = (pod: V1Pod) => box(pod).env!.find((e) => e.name === 'https_proxy')!.value;
  expect(value(buildBoxPod(params(gateway('egress.example.internal'))))).toBe(
    'http://$(SANDBOX_EGRESS_POD):$(SANDBOX_EGRESS_CREDENTIAL)@egress.example.internal:3128',
  );
  expect(value(buildBoxPod(params(gateway('fd00::5'))))).toBe('http://$(SANDBOX_EGRESS_POD):$(SANDBOX_EGRESS_CREDENTIAL)@[fd00::5]:3128');
});

test('direct mode: none of it', () => {
  const pod = buildBoxPod(params({ mode: 'direct', gateway: gateway().gateway }));
  expect(box(pod).env).toEqual([{ name: 'HOME', value: '/workspace' }, VOLUME_LIMITS]);
  const text = JSON.stringify(pod);
  for (const absent of ['egress', 'PROXY', 'proxy', 'CA_BUNDLE', 'SSL_CERT_FILE', 'egw']) expect(text).not.toContain(absent);
  expect(pod.spec!.volumes!.map((v) => v.name)).toEqual(['workspace', 'tmp', 'outputs', 'boxd', 'box-secret']);
});

test('the warm template hash changes with the egress mode and the gateway address, and only then', () => {
  const spec = (egress: object) => withDefaults({ namespace: 'sbx', egress });
  const direct = warmTemplateHash(spec({ mode: 'direct' }), 'boxd:1');
  const viaGateway = warmTemplateHash(spec({ mode: 'gateway' }), 'boxd:1');
  expect(viaGateway).not.toBe(direct);
  expect(warmTemplateHash(spec({ mode: 'gateway', gateway: { service: 'other' } }), 'boxd:1')).not.toBe(viaGateway);
  expect(warmTemplateHash(spec({ mode: 'gateway', gateway: { port: 3129 } }), 'boxd:1')).not.toBe(viaGateway);
  expect(warmTemplateHash(spec({ mode: 'gateway', gateway: { host: '10.0.0.9' } }), 'boxd:1')).not.toBe(viaGateway);
  // What boxes are not given (the NetworkPolicy's peers, the domain lists) does not replace warm pods.
  expect(warmTemplateHash(spec({ mode: 'gateway', domains: { allow: ['example.com'] } }), 'boxd:1')).toBe(viaGateway);
  expect(warmTemplateHash(spec({ mode: 'direct', gateway: { service: 'other' } }), 'boxd:1')).toBe(direct);
});

test('the proxy credential: a Secret key of its own, only when given', () => {
  const base = { name: 'r', namespace: 'sbx', poolName: 'p', component: 'record', token: 't', env: {} };
  const withKey = buildBoxSecret({ ...base, egressProxy: 'cred' });
  expect(Buffer.from(withKey.data![EGRESS_PROXY_KEY]!, 'base64').toString()).toBe('cred');
  expect(Object.keys(buildBoxSecret(base).data!).sort()).toEqual([BOX_SECRET_KEYS.env, BOX_SECRET_KEYS.token].sort());
});

test('the proxy credential: the vector gateway/identity tests too', () => {
  // base64url-unpadded(HMAC-SHA256(key, "sandbox-bridge egress v2\nsbx/box-abc-0/00ff")); also
  // `printf 'sandbox-bridge egress v2\nsbx/box-abc-0/00ff' | openssl dgst -sha256 -hmac <key> -binary | base64 | tr '+/' '-_' | tr -d =`.
  expect(egressProxyCredential('0123456789abcdef0123456789abcdef', 'sbx', 'box-abc-0', '00ff')).toBe('p6eFeIqBXJEbLtPCt1SCB6xwj4Ra_mIAk24AU5sXV8M');
  expect(egressProxyCredential(Buffer.from('0123456789abcdef0123456789abcdef'), 'sbx', 'box-abc-0', '00ff')).toBe('p6eFeIqBXJEbLtPCt1SCB6xwj4Ra_mIAk24AU5sXV8M');
});

test('boxd from an image volume: no install container, the boxd image mounted read-only where boxd runs from, nothing else changed', () => {
  const copied = buildBoxPod(params({ mode: 'direct', gateway: gateway().gateway }));
  const mounted = buildBoxPod({ ...params({ mode: 'direct', gateway: gateway().gateway }), box: { ...POOL_DEFAULTS.box, boxdDelivery: 'ImageVolume' } });
  expect(copied.spec!.initContainers!.map((c) => c.name)).toEqual(['boxd-install']);
  expect(mounted.spec!.initContainers).toBeUndefined();
  expect(mounted.spec!.volumes!.find((v) => v.name === 'boxd')).toEqual({ name: 'boxd', image: { reference: 'boxd:1', pullPolicy: 'IfNotPresent' } });
  expect(box(mounted).command).toEqual(['/opt/sandbox-bridge/bin/boxd', 'serve']);
  expect(box(mounted).volumeMounts!.find((m) => m.name === 'boxd')).toEqual({ name: 'boxd', mountPath: '/opt/sandbox-bridge/bin', readOnly: true });
  // The rest of the pod (security contexts, other volumes, the box container) is the same.
  const { initContainers: _i, volumes: copiedVolumes, ...copiedRest } = copied.spec!;
  const { volumes: mountedVolumes, ...mountedRest } = mounted.spec!;
  expect(mountedRest).toEqual(copiedRest);
  expect(mountedVolumes!.filter((v) => v.name !== 'boxd')).toEqual(copiedVolumes!.filter((v) => v.name !== 'boxd'));
  // Memory stores keep their sidecar (an init container with restartPolicy Always).
  const withStores = buildBoxPod({
    ...params({ mode: 'direct', gateway: gateway().gateway }),
    box: { ...POOL_DEFAULTS.box, boxdDelivery: 'ImageVolume', memoryStores: { enabled: true, sizeLimit: '64Mi' } },
  });
  expect(withStores.spec!.initContainers!.map((c) => c.name)).not.toContain('boxd-install');
  expect(withStores.spec!.initContainers).toHaveLength(1);
});

test('the warm template hash changes with boxd from an image volume, and stays for the default delivery', () => {
  const base = warmTemplateHash(withDefaults({ namespace: 'sbx' }), 'boxd:1');
  expect(warmTemplateHash(withDefaults({ namespace: 'sbx', box: { boxdDelivery: 'InitContainer' } }), 'boxd:1')).toBe(base);
  expect(warmTemplateHash(withDefaults({ namespace: 'sbx', box: { boxdDelivery: 'ImageVolume' } }), 'boxd:1')).not.toBe(base);
});
