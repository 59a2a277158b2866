// Boxes of a gateway-mode pool on the real node (contract of issue 22, sections 1-3): the kubelet
// expands the proxy variables with the pod's own name and credential (from its Secret by
// reference: a cold box's record, a claimed warm pod's own Secret (its seat), a woken box's
// record or the seat of the warm pod it was woken onto, with its new nonce), the credential is never in the pod spec, and boxd writes the CA bundle the tools are
// pointed at from the pool CA's ConfigMap, following a rotation of it into a running box.
import { randomBytes } from 'node:crypto';
import * as k8s from '@kubernetes/client-node';
import { BOXD_NONCE_ANNOTATION } from '../../common/boxd.js';
import { CA_BUNDLE_FILE, EGRESS_CA_CONFIGMAP_KEY, EGRESS_CA_NAME, EGRESS_PROXY_KEY, egressProxyCredential, gatewayAddress } from '../../common/egress-proxy.js';
import { apiStatusCode } from '../../common/kube.js';
import { LABELS, seatName } from '../../common/labels.js';
import { POOL_GROUP, POOL_PLURAL, POOL_VERSION, withDefaults } from '../../common/pool.js';
import { EGRESS_CA_ANNOTATIONS } from '../../operator/egress-ca.js';
import { ON_REAL_NODE, api } from '../support/bridge.js';
import { realNodeAvailable } from '../support/cluster.js';
import { boxPods, core, kc, record, startLifecycle, until, type LifecycleEnv } from '../support/lifecycle.js';
import { localObjectStore } from '../support/object-store.js';

const realNode = await realNodeAvailable(kc);
const store = await localObjectStore();
const skipReason = !realNode.available ? `no real node: ${realNode.reason}` : !store.available ? `no object store: ${store.reason}` : undefined;
if (skipReason) console.warn(`SKIPPED gateway-mode box tests on the real node: ${skipReason}`);
const suite = skipReason ? describe.skip : describe;

const KEY = randomBytes(24).toString('hex');
const GATEWAY = gatewayAddress(withDefaults({ namespace: '' }).egress.gateway);
const SMALL = { cpu: 0.25, memory: 128 };

type Call = ReturnType<typeof api>;

suite('gateway-mode boxes on the real node', () => {
  let env: LifecycleEnv;
  let call: Call;
  let cold = '';

  beforeAll(async () => {
    env = await startLifecycle({
      name: 'egress-box',
      pool: { box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: 4 }, warm: { count: 1 }, egress: { mode: 'gateway', domains: { allow: ['*.example.test'] } } },
      operatorEnv: { EGRESS_KEY: KEY, EGRESS_CA_PROPAGATION_SECONDS: '2' },
      bridgeEnv: { EGRESS_KEY: KEY },
    });
    call = api(env.bridges[0]!);
  }, 120_000);

  afterAll(async () => {
    await env?.stop();
  }, 60_000);

  const exec = async (box: string, command: string) => {
    const r = await call('POST', `/boxes/${box}/exec`, { command });
    expect({ status: r.status, body: r.json }).toMatchObject({ status: 200, body: { exit_code: 0 } });
    return r.json.stdout as string;
  };
  const running = (box: string) => until(`box ${box} to run`, async () => ((await call('GET', `/boxes/${box}/status`)).json.status === 'Running' ? true : undefined));
  const livePod = async (box: string) => (await boxPods(env.pool.ns, box)).find((p) => !p.metadata?.deletionTimestamp)!;
  const credentialOf = (pod: k8s.V1Pod) => egressProxyCredential(KEY, env.pool.ns, pod.metadata!.name!, pod.metadata!.annotations![BOXD_NONCE_ANNOTATION]!);
  const secretValue = (s: k8s.V1Secret | undefined, key: string) => (s?.data?.[key] === undefined ? undefined : Buffer.from(s.data[key], 'base64').toString());

  /** What the box's commands see, and that it is the pod's own credential. */
  async function expectProxied(box: string, pod: k8s.V1Pod): Promise<void> {
    const out = await exec(box, 'for v in HTTPS_PROXY HTTP_PROXY https_proxy http_proxy NO_PROXY no_proxy SSL_CERT_FILE NODE_EXTRA_CA_CERTS REQUESTS_CA_BUNDLE CURL_CA_BUNDLE GIT_SSL_CAINFO; do eval "echo \\"$v=\\$$v\\""; done');
    const proxy = `http://${pod.metadata!.name}:${credentialOf(pod)}@${GATEWAY}`;
    expect(out.trim().split('\n')).toEqual([
      `HTTPS_PROXY=${proxy}`,
      `HTTP_PROXY=${proxy}`,
      `https_proxy=${proxy}`,
      `http_proxy=${proxy}`,
      'NO_PROXY=localhost,127.0.0.1,::1',
      'no_proxy=localhost,127.0.0.1,::1',
      ...['SSL_CERT_FILE', 'NODE_EXTRA_CA_CERTS', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'GIT_SSL_CAINFO'].map((v) => `${v}=${CA_BUNDLE_FILE}`),
    ]);
    // The spec names the Secret, never the value.
    expect(JSON.stringify(pod)).not.toContain(credentialOf(pod));
  }

  test("a cold box and a claimed warm box: proxy variables with their own pod's credential, from their Secret", async () => {
    const created = await call('POST', '/boxes', { sessionId: 'egress-box-cold', ...SMALL });
    expect(created.status).toBe(201);
    cold = created.json.box_id;
    await running(cold);
    const coldPod = await livePod(cold);
    expect(coldPod.metadata!.name).toBe(cold);
    await expectProxied(cold, coldPod);
    expect(secretValue(await record(env.pool.ns, cold), EGRESS_PROXY_KEY)).toBe(credentialOf(coldPod));

    // A warm pod's credential is in its own Secret from its start; it serves the box that claims it.
    await until('a ready warm box', async () => {
      const warm = await core.listNamespacedPod({ namespace: env.pool.ns, labelSelector: `${LABELS.warm}=${env.pool.name}` });
      return warm.items.some((p) => p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')) ? true : undefined;
    });
    const claimed = await call('POST', '/boxes', { sessionId: 'egress-box-warm' });
    expect(claimed.status).toBe(201);
    const warm: string = claimed.json.box_id;
    const warmPod = await livePod(warm);
    expect(warmPod.metadata!.name).toMatch(/^box-warm-/);
    // Its own Secret is the seat it holds (common/seats.ts), the one its box-secret volume mounts.
    const ownName = warmPod.spec!.volumes!.find((v) => v.name === 'box-secret')!.secret!.secretName!;
    expect(ownName).toBe(seatName(Number(warmPod.metadata!.labels![LABELS.seat])));
    const own = await core.readNamespacedSecret({ name: ownName, namespace: env.pool.ns });
    expect(secretValue(own, EGRESS_PROXY_KEY)).toBe(credentialOf(warmPod));
    await expectProxied(warm, warmPod);
    expect((await call('DELETE', `/boxes/${warm}`)).status).toBe(200);
  }, 180_000);

  test("the CA bundle holds the pool CA's ConfigMap, and a rotation reaches the running box", async () => {
    // The operator makes the pool CA of gateway pools (operator/egress-ca.ts).
    const readConfigMap = () =>
      core.readNamespacedConfigMap({ name: EGRESS_CA_NAME, namespace: env.pool.ns }).catch((err: unknown) => {
        if (apiStatusCode(err) === 404) return undefined;
        throw err;
      });
    const first = await until('the pool CA ConfigMap', async () => (await readConfigMap())?.data?.[EGRESS_CA_CONFIGMAP_KEY], 30_000);
    const bundle = () => exec(cold, `cat "$SSL_CERT_FILE"`);
    const holds = (ca: string) => async () => ((await bundle()).endsWith(ca) ? true : undefined);
    await until('the bundle to hold the pool CA', holds(first), 90_000, 1000);

    // A rotation adds the new CA to the ConfigMap first: the kubelet swaps the file, boxd rewrites the bundle.
    await kc.makeApiClient(k8s.CustomObjectsApi).patchClusterCustomObject(
      { group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name: env.pool.name, body: { metadata: { annotations: { [EGRESS_CA_ANNOTATIONS.rotate]: 'egress-box-1' } } } },
      k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
    );
    const second = await until('the ConfigMap to change', async () => {
      const now = (await readConfigMap())?.data?.[EGRESS_CA_CONFIGMAP_KEY];
      return now && now !== first ? now : undefined;
    });
    await until('the bundle to follow the ConfigMap', holds(second), 90_000, 1000);
  }, 240_000);

  test('a woken box gets the credential of its new pod, in the Secret it mounts', async () => {
    const before = await livePod(cold);
    await until(`box ${cold} to sleep`, async () => ((await call('GET', `/boxes/${cold}/status`)).json.status === 'Sleeping' ? true : undefined), 90_000);
    await exec(cold, 'true'); // wakes it
    const after = await livePod(cold);
    expect(after.metadata!.uid).not.toBe(before.metadata!.uid);
    expect(after.metadata!.annotations![BOXD_NONCE_ANNOTATION]).not.toBe(before.metadata!.annotations![BOXD_NONCE_ANNOTATION]);
    expect(credentialOf(after)).not.toBe(credentialOf(before));
    await expectProxied(cold, after);
    // In the Secret its box-secret volume mounts: its record when woken cold, the seat of the warm
    // pod it was woken onto otherwise (a woken box keeps that pod's seat, issue 24).
    const mounted = after.spec!.volumes!.find((v) => v.name === 'box-secret')!.secret!.secretName!;
    const expected = /^box-warm-/.test(after.metadata!.name!) ? seatName(Number(after.metadata!.labels![LABELS.seat])) : cold;
    expect(mounted).toBe(expected);
    const own = await core.readNamespacedSecret({ name: mounted, namespace: env.pool.ns });
    expect(secretValue(own, EGRESS_PROXY_KEY)).toBe(credentialOf(after));
  }, 180_000);
});
