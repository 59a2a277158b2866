// The pool CA's state machine (planEgressCa, pure but for the key generation it is handed), the
// certificates issueCa makes (read back by node:crypto and by @peculiar/x509), and the order and
// shape of EgressCaKeeper's writes.
import { X509Certificate, createPrivateKey } from 'node:crypto';
import type * as k8s from '@kubernetes/client-node';
import * as x509 from '@peculiar/x509';
import pino from 'pino';
import { EGRESS_CA_CONFIGMAP_KEY, EGRESS_CA_NAME } from '../common/egress-proxy.js';
import { withDefaults, type PoolSpecInput, type SandboxPool } from '../common/pool.js';
import {
  CA_BACKDATE_MS,
  CA_LIFETIME_MS,
  EGRESS_CA_ANNOTATIONS,
  EgressCaKeeper,
  MAX_REQUEUE_MS,
  MAX_RETIRED,
  RETIRE_AFTER_MS,
  issueCa,
  pemBlocks,
  planEgressCa,
  type CaPair,
  type EgressCaPlan,
} from './egress-ca.js';
import type { EventRecorder, EventSpec } from './events.js';
import { createOperatorMetrics } from './metrics.js';

const NOW = Date.parse('2030-01-01T12:00:00Z');
const P = 180_000;
const HOUR = 3600_000;

function pool(annotations: Record<string, string> = {}, egress: PoolSpecInput['egress'] = { mode: 'gateway' }): SandboxPool {
  return {
    apiVersion: 'sandbox-bridge.io/v1alpha1',
    kind: 'SandboxPool',
    metadata: { name: 'p1', uid: 'pool-uid', annotations } as SandboxPool['metadata'],
    spec: withDefaults({ namespace: 'ns1', egress }),
  };
}

let issued = 0;
const issue = (name: string, now: number) => {
  issued++;
  return issueCa(name, now);
};

/** What the cache shows after a write of `o`: no apiVersion/kind (a list), a uid and a resourceVersion. */
let rv = 0;
function stored<T extends k8s.V1Secret | k8s.V1ConfigMap>(o: T | undefined): T | undefined {
  if (!o) return undefined;
  const { apiVersion: _a, kind: _k, ...rest } = JSON.parse(JSON.stringify(o)) as T;
  return { ...rest, metadata: { ...rest.metadata, uid: `${rest.metadata!.name}-uid`, resourceVersion: String(++rv) } } as T;
}

const plan = (o: { p?: SandboxPool; secret?: k8s.V1Secret; configMap?: k8s.V1ConfigMap; now?: number }) =>
  planEgressCa({ pool: o.p ?? pool(), secret: o.secret, configMap: o.configMap, now: o.now ?? NOW, propagationMs: P, issue });

/** The plan's objects as the cluster holds them once written. */
const apply = (pl: EgressCaPlan, secret?: k8s.V1Secret, configMap?: k8s.V1ConfigMap) => ({
  secret: pl.writeSecret ? stored(pl.secret) : secret,
  configMap: pl.writeConfigMap ? stored(pl.configMap) : configMap,
});

const data = (s: k8s.V1Secret | undefined, key: string) => (s?.data?.[key] === undefined ? undefined : Buffer.from(s.data[key], 'base64').toString());
const trusted = (cm: k8s.V1ConfigMap | undefined) => pemBlocks(cm?.data?.[EGRESS_CA_CONFIGMAP_KEY] ?? '').map((c) => new X509Certificate(c).fingerprint256);
const fp = (pem: string | undefined) => new X509Certificate(pem!).fingerprint256;

/** A converged gateway pool: its Secret and ConfigMap as stored. */
async function converged(p = pool()) {
  const first = await plan({ p });
  return apply(first);
}

test('issueCa: a self-signed P-256 CA with pathlen 0 and keyCertSign|cRLSign, valid a year, its key PKCS#8', async () => {
  const { cert, key }: CaPair = await issueCa('p1', NOW);
  const c = new X509Certificate(cert);
  expect(c.ca).toBe(true);
  expect(c.subject).toBe('CN=sandbox-bridge egress CA p1');
  expect(c.issuer).toBe(c.subject);
  expect(c.verify(c.publicKey)).toBe(true);
  expect(c.validFromDate.getTime()).toBe(Math.floor((NOW - CA_BACKDATE_MS) / 1000) * 1000);
  expect(c.validToDate.getTime()).toBe(NOW + CA_LIFETIME_MS);
  expect(c.publicKey.asymmetricKeyDetails).toEqual({ namedCurve: 'prime256v1' });
  expect(key).toMatch(/^-----BEGIN PRIVATE KEY-----\n[\s\S]+\n-----END PRIVATE KEY-----\n?$/);
  expect(c.checkPrivateKey(createPrivateKey(key))).toBe(true);

  const parsed = new x509.X509Certificate(cert);
  const basic = parsed.getExtension(x509.BasicConstraintsExtension)!;
  expect({ ca: basic.ca, pathLength: basic.pathLength, critical: basic.critical }).toEqual({ ca: true, pathLength: 0, critical: true });
  const usage = parsed.getExtension(x509.KeyUsagesExtension)!;
  expect({ usages: usage.usages, critical: usage.critical }).toEqual({ usages: x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, critical: true });
  expect(parsed.getExtension(x509.SubjectKeyIdentifierExtension)).not.toBeNull();
  expect(parsed.getExtension('2.5.29.30')).toBeNull(); // no NameConstraints
  expect(parsed.signatureAlgorithm).toMatchObject({ name: 'ECDSA', hash: { name: 'SHA-256' } });
  // Two CAs never share a serial or a key.
  const other = await issueCa('p1', NOW);
  expect(new X509Certificate(other.cert).serialNumber).not.toBe(c.serialNumber);
  expect(c.checkPrivateKey(createPrivateKey(other.key))).toBe(false);
});

test('a gateway pool gets a tls Secret (the signer) and a ConfigMap trusting it, owned by the pool', async () => {
  const pl = await plan({ p: pool({ [EGRESS_CA_ANNOTATIONS.rotate]: 'r0' }) });
  expect(pl).toMatchObject({ writeSecret: true, writeConfigMap: true, remove: [], requeueAfterMs: MAX_REQUEUE_MS });
  expect(pl.steps).toEqual([{ step: 'created', fingerprint: fp(data(pl.secret, 'tls.crt')) }]);
  const labels = { 'app.kubernetes.io/managed-by': 'sandbox-bridge', 'app.kubernetes.io/component': 'egress-ca', 'sandbox-bridge.io/pool': 'p1' };
  const owner = [expect.objectContaining({ kind: 'SandboxPool', name: 'p1', uid: 'pool-uid', controller: true })];
  expect(pl.secret).toMatchObject({ type: 'kubernetes.io/tls', metadata: { name: EGRESS_CA_NAME, namespace: 'ns1', labels, ownerReferences: owner } });
  expect(Object.keys(pl.secret!.data!).sort()).toEqual(['tls.crt', 'tls.key']);
  // A rotation request already there when the CA is made is answered by it.
  expect(pl.secret!.metadata!.annotations).toEqual({ [EGRESS_CA_ANNOTATIONS.rotate]: 'r0' });
  expect(pl.configMap).toMatchObject({ metadata: { name: EGRESS_CA_NAME, namespace: 'ns1', labels, ownerReferences: owner } });
  expect(pl.configMap!.data).toEqual({ [EGRESS_CA_CONFIGMAP_KEY]: data(pl.secret, 'tls.crt') });
});

test('at rest nothing is written: the plan of what it made (read back as a list item) is itself', async () => {
  const { secret, configMap } = await converged();
  issued = 0;
  const again = await plan({ secret, configMap, now: NOW + HOUR });
  expect(again).toMatchObject({ writeSecret: false, writeConfigMap: false, remove: [], steps: [] });
  expect(issued).toBe(0);
  // Labels and annotations others add, and a reordered bundle, are no reason to write either.
  const decorated = { ...secret!, metadata: { ...secret!.metadata, labels: { ...secret!.metadata!.labels, team: 'x' }, annotations: { note: 'y' } } };
  expect(await plan({ secret: decorated, configMap, now: NOW + HOUR })).toMatchObject({ writeSecret: false, writeConfigMap: false });
});

test('drift is repaired: a ConfigMap edited or deleted follows the Secret, the CA unchanged', async () => {
  const { secret, configMap } = await converged();
  const other = await issueCa('x', NOW);
  const edited = { ...configMap!, data: { [EGRESS_CA_CONFIGMAP_KEY]: other.cert } };
  for (const cm of [edited, undefined]) {
    const pl = await plan({ secret, configMap: cm, now: NOW + HOUR });
    expect(pl).toMatchObject({ writeSecret: false, writeConfigMap: true, steps: [] });
    expect(trusted(pl.configMap)).toEqual([fp(data(secret, 'tls.crt'))]);
  }
  // A label taken off the Secret is put back, the CA kept.
  const unlabelled = { ...secret!, metadata: { ...secret!.metadata, labels: {} } };
  const pl = await plan({ secret: unlabelled, configMap, now: NOW + HOUR });
  expect(pl).toMatchObject({ writeSecret: true, writeConfigMap: false, steps: [] });
  expect(data(pl.secret, 'tls.key')).toBe(data(secret, 'tls.key'));
});

test('a rotation: the new CA is trusted first, signs after the propagation delay, the old one trusted 25 h more', async () => {
  const { secret: s0, configMap: c0 } = await converged();
  const old = data(s0, 'tls.crt')!;
  const asked = pool({ [EGRESS_CA_ANNOTATIONS.rotate]: '2030-01-01' });

  // 1. Asked: a next CA, both trusted, the signer unchanged.
  const t1 = NOW + HOUR;
  const p1 = await plan({ p: asked, secret: s0, configMap: c0, now: t1 });
  const next = data(p1.secret, 'next.crt')!;
  expect(p1.steps).toEqual([{ step: 'rotation-started', fingerprint: fp(next), why: 'requested', promoteAt: t1 + P }]);
  expect(p1).toMatchObject({ writeSecret: true, writeConfigMap: true, requeueAfterMs: P });
  expect(data(p1.secret, 'tls.crt')).toBe(old);
  expect(data(p1.secret, 'tls.key')).toBe(data(s0, 'tls.key'));
  expect(p1.secret!.metadata!.annotations).toEqual({
    [EGRESS_CA_ANNOTATIONS.rotate]: '2030-01-01',
    [EGRESS_CA_ANNOTATIONS.promoteAt]: new Date(t1 + P).toISOString(),
  });
  expect(trusted(p1.configMap)).toEqual([fp(old), fp(next)]);
  let { secret, configMap } = apply(p1, s0, c0);

  // 2. Within the delay: nothing to write, look again when it is over.
  const p2 = await plan({ p: asked, secret, configMap, now: t1 + P - 1000 });
  expect(p2).toMatchObject({ writeSecret: false, writeConfigMap: false, steps: [], requeueAfterMs: 1000 });

  // 3. Delay over: the next CA signs, the old one stays trusted until 25 h later.
  const t3 = t1 + P;
  const p3 = await plan({ p: asked, secret, configMap, now: t3 });
  expect(p3.steps).toEqual([{ step: 'signer-switched', fingerprint: fp(next), retireAt: t3 + RETIRE_AFTER_MS }]);
  expect(data(p3.secret, 'tls.crt')).toBe(next);
  expect(data(p3.secret, 'tls.key')).toBe(data(secret, 'next.key'));
  expect(data(p3.secret, 'next.crt')).toBeUndefined();
  expect(data(p3.secret, 'next.key')).toBeUndefined();
  expect(data(p3.secret, 'retired.crt')).toBe(old);
  expect(p3.secret!.metadata!.annotations).toEqual({
    [EGRESS_CA_ANNOTATIONS.rotate]: '2030-01-01',
    [EGRESS_CA_ANNOTATIONS.retireAt]: new Date(t3 + RETIRE_AFTER_MS).toISOString(),
  });
  // The same two CAs are trusted: the ConfigMap needs no write.
  expect(p3).toMatchObject({ writeSecret: true, writeConfigMap: false, requeueAfterMs: MAX_REQUEUE_MS });
  ({ secret, configMap } = apply(p3, secret, configMap));

  // 4. 25 h later the old CA is no longer trusted.
  const p4 = await plan({ p: asked, secret, configMap, now: t3 + RETIRE_AFTER_MS });
  expect(p4.steps).toEqual([{ step: 'retired', count: 1 }]);
  expect(trusted(p4.configMap)).toEqual([fp(next)]);
  expect(Object.keys(p4.secret!.data!).sort()).toEqual(['tls.crt', 'tls.key']);
  expect(p4.secret!.metadata!.annotations).toEqual({ [EGRESS_CA_ANNOTATIONS.rotate]: '2030-01-01' });
  ({ secret, configMap } = apply(p4, secret, configMap));

  // 5. Done: the request is seen, nothing more happens.
  expect(await plan({ p: asked, secret, configMap, now: t3 + RETIRE_AFTER_MS + HOUR })).toMatchObject({ writeSecret: false, writeConfigMap: false, steps: [] });
});

test('the signer never switches to a CA the ConfigMap does not hold: the wait starts again once it does', async () => {
  const { secret: s0, configMap: c0 } = await converged();
  const asked = pool({ [EGRESS_CA_ANNOTATIONS.rotate]: 'a' });
  const p1 = await plan({ p: asked, secret: s0, configMap: c0, now: NOW });
  // The Secret was written, the ConfigMap write failed (or it was deleted since).
  const secret = stored(p1.secret);
  const tLate = NOW + 2 * P;
  const p2 = await plan({ p: asked, secret, configMap: c0, now: tLate });
  expect(p2.steps).toEqual([{ step: 'promotion-delayed', promoteAt: tLate + P }]);
  expect(data(p2.secret, 'tls.crt')).toBe(data(s0, 'tls.crt'));
  expect(p2.secret!.metadata!.annotations![EGRESS_CA_ANNOTATIONS.promoteAt]).toBe(new Date(tLate + P).toISOString());
  expect(trusted(p2.configMap)).toEqual([fp(data(s0, 'tls.crt')), fp(data(secret, 'next.crt'))]);
  expect(p2).toMatchObject({ writeSecret: true, writeConfigMap: true, requeueAfterMs: P });
  // A cache that has not yet seen the ConfigMap written moments ago does not push the wait again.
  const p3 = await plan({ p: asked, secret, configMap: c0, now: NOW + 500 });
  expect(p3.steps).toEqual([]);
  expect(p3).toMatchObject({ writeSecret: false, writeConfigMap: true });
});

test('a CA with less than a third of its life left is rotated; before that, the pool is looked at again when it will be', async () => {
  const { secret, configMap } = await converged();
  const c = new X509Certificate(data(secret, 'tls.crt')!);
  const due = c.validToDate.getTime() - (c.validToDate.getTime() - c.validFromDate.getTime()) / 3;
  const early = await plan({ secret, configMap, now: due - HOUR });
  expect(early).toMatchObject({ writeSecret: false, writeConfigMap: false, steps: [], requeueAfterMs: HOUR });
  const late = await plan({ secret, configMap, now: due + 1 });
  expect(late.steps).toEqual([expect.objectContaining({ step: 'rotation-started', why: 'expiring', promoteAt: due + 1 + P })]);
  expect(trusted(late.configMap)).toHaveLength(2);
});

test('a request is handled once: the same value again, or none, starts nothing; one during a rotation joins it', async () => {
  const { secret: s0, configMap: c0 } = await converged(pool({ [EGRESS_CA_ANNOTATIONS.rotate]: 'v1' }));
  for (const p of [pool({ [EGRESS_CA_ANNOTATIONS.rotate]: 'v1' }), pool(), pool({ [EGRESS_CA_ANNOTATIONS.rotate]: '' })]) {
    expect(await plan({ p, secret: s0, configMap: c0, now: NOW + HOUR })).toMatchObject({ writeSecret: false, writeConfigMap: false, steps: [] });
  }
  const p1 = await plan({ p: pool({ [EGRESS_CA_ANNOTATIONS.rotate]: 'v2' }), secret: s0, configMap: c0, now: NOW + HOUR });
  const { secret, configMap } = apply(p1, s0, c0);
  issued = 0;
  const p2 = await plan({ p: pool({ [EGRESS_CA_ANNOTATIONS.rotate]: 'v3' }), secret, configMap, now: NOW + HOUR + 1000 });
  expect(issued).toBe(0);
  expect(p2.steps).toEqual([]);
  expect(p2.secret!.metadata!.annotations).toEqual({ ...secret!.metadata!.annotations, [EGRESS_CA_ANNOTATIONS.rotate]: 'v3' });
  expect(data(p2.secret, 'next.crt')).toBe(data(secret, 'next.crt'));
  expect(p2).toMatchObject({ writeSecret: true, writeConfigMap: false, requeueAfterMs: P - 1000 });
});

test('rotations in quick succession keep every CA that signed trusted, up to a limit', async () => {
  let { secret, configMap } = await converged();
  const signers = [fp(data(secret, 'tls.crt'))];
  let now = NOW;
  for (let i = 0; i < MAX_RETIRED + 2; i++) {
    const p = pool({ [EGRESS_CA_ANNOTATIONS.rotate]: `r${i}` });
    ({ secret, configMap } = apply(await plan({ p, secret, configMap, now }), secret, configMap));
    now += P;
    ({ secret, configMap } = apply(await plan({ p, secret, configMap, now }), secret, configMap));
    signers.unshift(fp(data(secret, 'tls.crt')));
    now += 1000;
  }
  expect(trusted(configMap)).toEqual(signers.slice(0, MAX_RETIRED + 1));
  // The first retired CA stays until 25 h after the last switch.
  expect(Date.parse(secret!.metadata!.annotations![EGRESS_CA_ANNOTATIONS.retireAt]!)).toBe(now - 1000 + RETIRE_AFTER_MS);
});

test('a Secret whose CA cannot sign is replaced at once, and says why', async () => {
  const { secret, configMap } = await converged();
  const foreign = await issueCa('x', NOW);
  const b64 = (s: string) => Buffer.from(s).toString('base64');
  const cases: Array<[Record<string, string>, string]> = [
    [{ 'tls.crt': secret!.data!['tls.crt']!, 'tls.key': b64(foreign.key) }, 'tls.key is not the key of tls.crt'],
    [{ 'tls.crt': b64('garbage'), 'tls.key': secret!.data!['tls.key']! }, 'tls.crt is not a certificate'],
    [{ 'tls.crt': secret!.data!['tls.crt']! }, 'tls.crt or tls.key is missing'],
  ];
  for (const [d, why] of cases) {
    const pl = await plan({ secret: { ...secret!, data: d }, configMap, now: NOW + HOUR });
    expect(pl.steps).toEqual([{ step: 'replaced', fingerprint: fp(data(pl.secret, 'tls.crt')), why }]);
    expect(data(pl.secret, 'tls.crt')).not.toBe(data(secret, 'tls.crt'));
    expect(trusted(pl.configMap)).toEqual([fp(data(pl.secret, 'tls.crt'))]);
  }
  const expired = await plan({ secret, configMap, now: NOW + CA_LIFETIME_MS });
  expect(expired.steps).toEqual([expect.objectContaining({ step: 'replaced', why: 'the CA has expired' })]);
});

test('a direct pool gets none, and what a gateway pool had is removed', async () => {
  const direct = pool({}, { mode: 'direct' });
  expect(await plan({ p: direct })).toEqual({ writeSecret: false, writeConfigMap: false, remove: [], steps: [] });
  const { secret, configMap } = await converged();
  const pl = await plan({ p: direct, secret, configMap });
  expect(pl.secret).toBeUndefined();
  expect(pl.configMap).toBeUndefined();
  expect(pl.remove).toEqual([
    { kind: 'Secret', uid: secret!.metadata!.uid },
    { kind: 'ConfigMap', uid: configMap!.metadata!.uid },
  ]);
});

describe('EgressCaKeeper', () => {
  function setup(live: { secret?: k8s.V1Secret; configMap?: k8s.V1ConfigMap } = {}, fail?: { code: number }) {
    const calls: Array<{ op: string; body?: unknown }> = [];
    const call = (op: string) => async (req: { body?: unknown }) => {
      calls.push({ op, body: req.body });
      if (fail) throw Object.assign(new Error('refused'), { code: fail.code });
      return req.body;
    };
    const core = {
      createNamespacedSecret: call('create Secret'),
      replaceNamespacedSecret: call('replace Secret'),
      deleteNamespacedSecret: call('delete Secret'),
      createNamespacedConfigMap: call('create ConfigMap'),
      replaceNamespacedConfigMap: call('replace ConfigMap'),
      deleteNamespacedConfigMap: call('delete ConfigMap'),
    } as unknown as k8s.CoreV1Api;
    const lister = <T>(o: T | undefined) => ({ get: () => o, list: () => (o ? [o] : []) });
    const events: EventSpec[] = [];
    const recorder = { record: async (_p: SandboxPool, e: EventSpec) => void events.push(e) } as unknown as EventRecorder;
    const lines: string[] = [];
    const log = pino({ level: 'debug' }, { write: (l: string) => void lines.push(l) });
    const keeper = new EgressCaKeeper({
      core,
      secrets: lister(live.secret),
      configMaps: lister(live.configMap),
      propagationMs: P,
      events: recorder,
      metrics: createOperatorMetrics(),
      fieldManager: 'test',
      now: () => NOW + HOUR,
    });
    return { keeper, calls, events, lines, log };
  }

  test('creates the Secret, then the ConfigMap; no key in its log lines or Events', async () => {
    const { keeper, calls, events, lines, log } = setup();
    expect(await keeper.reconcile(pool(), log)).toEqual({ requeueAfterMs: MAX_REQUEUE_MS });
    expect(calls.map((c) => c.op)).toEqual(['create Secret', 'create ConfigMap']);
    const key = data(calls[0]!.body as k8s.V1Secret, 'tls.key')!;
    const keyBody = key.split('\n').slice(1, -2).join('');
    expect(keyBody.length).toBeGreaterThan(100);
    expect(events).toEqual([expect.objectContaining({ reason: 'EgressCaCreated' })]);
    expect(lines.join('\n')).toMatch(/egress CA/);
    for (const text of [lines.join(''), JSON.stringify(events)]) {
      expect(text).not.toContain(keyBody.slice(0, 40));
      expect(text).not.toContain(Buffer.from(key).toString('base64').slice(0, 40));
    }
  });

  test('changes are replaces guarded by the resourceVersion read; a conflict is retried soon, not an error', async () => {
    const { secret, configMap } = await converged();
    const asked = pool({ [EGRESS_CA_ANNOTATIONS.rotate]: 'go' });
    const { keeper, calls, log } = setup({ secret, configMap });
    expect(await keeper.reconcile(asked, log)).toEqual({ requeueAfterMs: P });
    expect(calls.map((c) => c.op)).toEqual(['replace Secret', 'replace ConfigMap']);
    expect((calls[0]!.body as k8s.V1Secret).metadata!.resourceVersion).toBe(secret!.metadata!.resourceVersion);
    expect((calls[1]!.body as k8s.V1ConfigMap).metadata!.resourceVersion).toBe(configMap!.metadata!.resourceVersion);

    const conflicted = setup({ secret, configMap }, { code: 409 });
    expect(await conflicted.keeper.reconcile(asked, conflicted.log)).toEqual({ requeueAfterMs: 100 });
    expect(conflicted.calls.map((c) => c.op)).toEqual(['replace Secret']);
    expect(conflicted.events).toEqual([]);

    const refused = setup({ secret, configMap }, { code: 403 });
    const r = await refused.keeper.reconcile(asked, refused.log);
    expect(r).toEqual({ requeueAfterMs: 2000, error: expect.stringMatching(/^egress CA ns1\/sandbox-bridge-egress-ca: refused$/) });
  });

  test('a direct pool: deletes what is there, guarded by uid', async () => {
    const { secret, configMap } = await converged();
    const { keeper, calls, log } = setup({ secret, configMap });
    expect(await keeper.reconcile(pool({}, { mode: 'direct' }), log)).toEqual({});
    expect(calls).toEqual([
      { op: 'delete Secret', body: { preconditions: { uid: secret!.metadata!.uid } } },
      { op: 'delete ConfigMap', body: { preconditions: { uid: configMap!.metadata!.uid } } },
    ]);
  });
});
