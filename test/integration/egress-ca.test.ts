// The pool CA of gateway-mode pools (operator/egress-ca.ts) against the real API server: the
// operator makes a CA Secret the gateway signs with and a ConfigMap boxes trust, rotates it on
// request without a gap in trust (both CAs trusted before the signer switches, after the
// propagation delay), repairs what is deleted, keeps none for direct pools, writes nothing at
// rest, and never shows the key in its log, the pool's status or its Events.
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import * as x509 from '@peculiar/x509';
import { EGRESS_CA_CONFIGMAP_KEY, EGRESS_CA_NAME } from '../../common/egress-proxy.js';
import { apiStatusCode } from '../../common/kube.js';
import { POOL_GROUP, POOL_PLURAL, POOL_VERSION } from '../../common/pool.js';
import { EGRESS_CA_ANNOTATIONS, pemBlocks } from '../../operator/egress-ca.js';
import { ApiProxy } from '../support/api-proxy.js';
import { testKubeConfig, waitFor } from '../support/cluster.js';
import { Pools, deleteLease, installCrd, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const shard = uniqueName('egress-ca');
const pools = new Pools(kc, shard);
const leaseName = `op-test-${shard}`;
const dir = mkdtempSync(join(tmpdir(), 'egress-ca-'));
// Every request the operator makes passes through it (the at-rest test counts them).
const proxy = new ApiProxy(kc);
const PROPAGATION_SECONDS = 4;
const YEAR_MS = 365 * 24 * 3600_000;
let operator: OperatorProcess;

beforeAll(async () => {
  await installCrd(kc);
  await proxy.start();
  const kubeconfig = join(dir, 'kubeconfig');
  writeFileSync(kubeconfig, proxy.kubeConfig().exportConfig());
  operator = await startOperator({ shard, leaseName, env: { KUBECONFIG: kubeconfig, EGRESS_CA_PROPAGATION_SECONDS: String(PROPAGATION_SECONDS) } });
});

afterAll(async () => {
  await pools.cleanup();
  await operator?.stop();
  await deleteLease(kc, leaseName);
  await proxy.stop();
  rmSync(dir, { recursive: true, force: true });
});

const readSecret = (ns: string) => core.readNamespacedSecret({ name: EGRESS_CA_NAME, namespace: ns }).catch(absent);
const readConfigMap = (ns: string) => core.readNamespacedConfigMap({ name: EGRESS_CA_NAME, namespace: ns }).catch(absent);
function absent(err: unknown): undefined {
  if (apiStatusCode(err) === 404) return undefined;
  throw err;
}
const text = (s: k8s.V1Secret | undefined, key: string) => (s?.data?.[key] === undefined ? undefined : Buffer.from(s.data[key], 'base64').toString());
const trusted = (cm: k8s.V1ConfigMap | undefined) => pemBlocks(cm?.data?.[EGRESS_CA_CONFIGMAP_KEY] ?? '').map((c) => new X509Certificate(c).fingerprint256);
const fp = (pem: string | undefined) => new X509Certificate(pem!).fingerprint256;

/** The pool's CA once both objects exist and the ConfigMap trusts the Secret's signer. */
async function converged(ns: string, not?: string): Promise<{ secret: k8s.V1Secret; configMap: k8s.V1ConfigMap }> {
  return waitFor(
    `the egress CA of ${ns}`,
    async () => {
      const [secret, configMap] = await Promise.all([readSecret(ns), readConfigMap(ns)]);
      const cert = text(secret, 'tls.crt');
      if (!secret || !configMap || !cert || fp(cert) === not || !trusted(configMap).includes(fp(cert))) return undefined;
      return { secret, configMap };
    },
    { timeoutMs: 20_000 },
  );
}

async function annotatePool(name: string, annotations: Record<string, string>): Promise<void> {
  await pools.api.patchClusterCustomObject(
    { group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL, name, body: { metadata: { annotations } } },
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
  );
}

async function poolEvents(name: string): Promise<k8s.CoreV1Event[]> {
  return (await core.listNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${name}` })).items;
}

let gateway: { name: string; ns: string };

test('a gateway pool gets a CA Secret the gateway signs with and a ConfigMap trusting it; a direct pool gets none', async () => {
  gateway = await pools.createReady({ egress: { mode: 'gateway' } });
  const direct = await pools.createReady();
  const { secret, configMap } = await converged(gateway.ns);
  const pool = await pools.get(gateway.name);

  const labels = { 'app.kubernetes.io/managed-by': 'sandbox-bridge', 'app.kubernetes.io/component': 'egress-ca', 'sandbox-bridge.io/pool': gateway.name };
  const owner = [expect.objectContaining({ kind: 'SandboxPool', name: gateway.name, uid: pool.metadata.uid, controller: true })];
  expect(secret.type).toBe('kubernetes.io/tls');
  expect(secret.metadata).toMatchObject({ labels, ownerReferences: owner });
  expect(configMap.metadata).toMatchObject({ labels, ownerReferences: owner });
  expect(Object.keys(secret.data!).sort()).toEqual(['tls.crt', 'tls.key']);
  expect(Object.keys(configMap.data!)).toEqual([EGRESS_CA_CONFIGMAP_KEY]);

  const certPem = text(secret, 'tls.crt')!;
  const keyPem = text(secret, 'tls.key')!;
  const cert = new X509Certificate(certPem);
  expect(cert.ca).toBe(true);
  expect(cert.subject).toBe(`CN=sandbox-bridge egress CA ${gateway.name}`);
  expect(cert.issuer).toBe(cert.subject);
  expect(cert.verify(cert.publicKey)).toBe(true);
  expect(cert.publicKey.asymmetricKeyDetails).toEqual({ namedCurve: 'prime256v1' });
  expect(Math.abs(cert.validToDate.getTime() - Date.now() - YEAR_MS)).toBeLessThan(120_000);
  expect(cert.validFromDate.getTime()).toBeLessThanOrEqual(Date.now());
  expect(keyPem.startsWith('-----BEGIN PRIVATE KEY-----\n')).toBe(true); // PKCS#8
  expect(cert.checkPrivateKey(createPrivateKey(keyPem))).toBe(true);
  const parsed = new x509.X509Certificate(certPem);
  expect(parsed.getExtension(x509.BasicConstraintsExtension)).toMatchObject({ ca: true, pathLength: 0, critical: true });
  expect(parsed.getExtension(x509.KeyUsagesExtension)?.usages).toBe(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign);
  expect(trusted(configMap)).toEqual([cert.fingerprint256]);

  const status = (await pools.get(gateway.name)).status;
  expect(status?.conditions?.find((c) => c.type === 'Degraded')).toMatchObject({ status: 'False' });
  expect((await poolEvents(gateway.name)).map((e) => e.reason)).toContain('EgressCaCreated');

  // The direct pool is Ready (its reconcile ran) and has neither object.
  await pools.waitReady(direct.name);
  expect(await readSecret(direct.ns)).toBeUndefined();
  expect(await readConfigMap(direct.ns)).toBeUndefined();

  // The key is nowhere but in the Secret.
  const keyBody = keyPem.split('\n').slice(1, -2).join('');
  const seen = [operator.logs(), JSON.stringify(await pools.get(gateway.name)), JSON.stringify(await poolEvents(gateway.name))].join('\n');
  expect(seen).not.toContain(keyBody.slice(0, 32));
  expect(seen).not.toContain(secret.data!['tls.key']!.slice(0, 32));
});

test('a rotation asked by annotation: both CAs trusted first, the signer switches after the propagation delay, the old CA still trusted', async () => {
  const { secret: before } = await converged(gateway.ns);
  const old = text(before, 'tls.crt')!;
  await annotatePool(gateway.name, { [EGRESS_CA_ANNOTATIONS.rotate]: 'test-1' });

  const both = await waitFor('the ConfigMap to trust the next CA too', async () => {
    const configMap = await readConfigMap(gateway.ns);
    return trusted(configMap).length === 2 ? { configMap, at: Date.now() } : undefined;
  });
  const pending = (await readSecret(gateway.ns))!;
  const next = text(pending, 'next.crt')!;
  expect(text(pending, 'tls.crt')).toBe(old); // not signing with it yet
  expect(trusted(both.configMap)).toEqual([fp(old), fp(next)]);
  expect(pending.metadata!.annotations![EGRESS_CA_ANNOTATIONS.rotate]).toBe('test-1');
  expect(Date.parse(pending.metadata!.annotations![EGRESS_CA_ANNOTATIONS.promoteAt]!)).toBeGreaterThan(Date.now());

  const switched = await waitFor('the Secret to sign with the next CA', async () => {
    const s = await readSecret(gateway.ns);
    return text(s, 'tls.crt') === next ? { secret: s!, at: Date.now() } : undefined;
  }, { timeoutMs: 20_000 });
  // No sooner than the delay after boxes could first see both (less this test's polling).
  expect(switched.at - both.at).toBeGreaterThanOrEqual(PROPAGATION_SECONDS * 1000 - 1000);
  expect(text(switched.secret, 'tls.key')).toBe(text(pending, 'next.key'));
  expect(text(switched.secret, 'next.crt')).toBeUndefined();
  expect(text(switched.secret, 'retired.crt')).toBe(old);
  const retireAt = Date.parse(switched.secret.metadata!.annotations![EGRESS_CA_ANNOTATIONS.retireAt]!);
  expect(Math.abs(retireAt - Date.now() - 25 * 3600_000)).toBeLessThan(60_000);
  // The old CA stays trusted: leaves it signed live up to 24 h.
  expect(trusted(await readConfigMap(gateway.ns)).sort()).toEqual([fp(next), fp(old)].sort());
  const reasons = (await poolEvents(gateway.name)).map((e) => e.reason);
  expect(reasons).toEqual(expect.arrayContaining(['EgressCaRotating', 'EgressCaRotated']));

  // The same value again starts nothing.
  await annotatePool(gateway.name, { [EGRESS_CA_ANNOTATIONS.rotate]: 'test-1', 'test.sandbox-bridge.io/poke': '1' });
  await new Promise((r) => setTimeout(r, 2000));
  expect(text(await readSecret(gateway.ns), 'next.crt')).toBeUndefined();
}, 60_000);

test('a deleted ConfigMap comes back with the same CAs; a deleted Secret comes back with a new CA the ConfigMap follows', async () => {
  const { secret, configMap } = await converged(gateway.ns);
  const before = trusted(configMap);
  await core.deleteNamespacedConfigMap({ name: EGRESS_CA_NAME, namespace: gateway.ns });
  const back = await waitFor('the ConfigMap to be made again', async () => {
    const cm = await readConfigMap(gateway.ns);
    return cm && cm.metadata!.uid !== configMap.metadata!.uid ? cm : undefined;
  });
  expect(trusted(back).sort()).toEqual(before.sort());
  expect(text(await readSecret(gateway.ns), 'tls.crt')).toBe(text(secret, 'tls.crt'));

  await core.deleteNamespacedSecret({ name: EGRESS_CA_NAME, namespace: gateway.ns });
  const fresh = await converged(gateway.ns, fp(text(secret, 'tls.crt')));
  expect(fresh.secret.metadata!.uid).not.toBe(secret.metadata!.uid);
  expect(trusted(fresh.configMap)).toEqual([fp(text(fresh.secret, 'tls.crt'))]);
  // The request already handled is remembered on the new Secret: no rotation follows.
  expect(fresh.secret.metadata!.annotations![EGRESS_CA_ANNOTATIONS.rotate]).toBe('test-1');
});

test('a pool switched to direct loses its CA; back to gateway, it gets a new one', async () => {
  const pool = await pools.createReady({ egress: { mode: 'gateway' } });
  const { secret } = await converged(pool.ns);
  await pools.patchSpec(pool.name, { egress: { mode: 'direct' } });
  await waitFor('the CA to be removed', async () => {
    const [s, cm] = await Promise.all([readSecret(pool.ns), readConfigMap(pool.ns)]);
    return !s && !cm ? true : undefined;
  });
  await pools.patchSpec(pool.name, { egress: { mode: 'gateway' } });
  await converged(pool.ns, fp(text(secret, 'tls.crt')));
});

test('at rest, reconciles of converged gateway and direct pools write nothing', async () => {
  // Every pool of this file is converged: no rotation is due for months, none pending.
  for (const { ns } of [gateway]) await converged(ns);
  await new Promise((r) => setTimeout(r, 2000));
  const from = proxy.requests.length;
  const reconcilesBefore = (await operator.metric('sandbox_operator_reconcile_total')) ?? 0;
  const ticks = 8;
  for (let i = 0; i < ticks; i++) {
    // A pool update queues its reconcile; the annotation is not the operator's.
    await annotatePool(gateway.name, { 'test.sandbox-bridge.io/tick': String(i) });
    await new Promise((r) => setTimeout(r, 1000));
  }
  const reconciles = ((await operator.metric('sandbox_operator_reconcile_total')) ?? 0) - reconcilesBefore;
  const writes = proxy.requests.slice(from).filter((r) => !r.watch && r.method !== 'GET' && !/\/leases\//.test(r.url));
  expect(reconciles).toBeGreaterThanOrEqual(ticks / 2);
  expect(writes).toEqual([]);
}, 60_000);
