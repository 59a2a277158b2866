// The CA of a gateway-mode pool (docs/operator.md "Egress CA"): a Secret the egress gateway signs
// the leaves of intercepted TLS with (tls.crt, tls.key), and a ConfigMap of every CA boxes must
// trust (ca.crt), both in the pool's namespace. Rotation never breaks a box's trust, and boxes
// are not restarted: a new CA is trusted (ConfigMap) before it signs (Secret), and an old one is
// trusted until every leaf it signed has expired. The state of a rotation lives in the Secret
// (data and annotations), so the machine is level-based: any replica that leads next reads where
// it stands, and timed steps are RequeueAfter, never timers.
//
// No log line, Event, status or error message built here carries a key: they name certificates
// by their SHA-256 fingerprint.
import { X509Certificate, createPrivateKey, randomBytes, webcrypto } from 'node:crypto';
import type * as k8s from '@kubernetes/client-node';
import * as x509 from '@peculiar/x509';
import type { Logger } from 'pino';
import { EGRESS_CA_COMPONENT, EGRESS_CA_CONFIGMAP_KEY, EGRESS_CA_NAME } from '../common/egress-proxy.js';
import { apiMessage, isConflict, isNotFound } from '../common/kube.js';
import { API_GROUP, LABELS, MANAGED_BY } from '../common/labels.js';
import type { SandboxPool } from '../common/pool.js';
import { ownerReference } from './children.js';
import type { EventRecorder, EventSpec } from './events.js';
import type { OperatorMetrics } from './metrics.js';
import type { Lister } from './pool-reconciler.js';

export const EGRESS_CA_ANNOTATIONS = {
  /**
   * On the pool: a value not yet seen asks for a rotation (any new value: a date, a counter).
   * On the Secret: the last value handled.
   */
  rotate: `${API_GROUP}/rotate-egress-ca`,
  /** On the Secret, while a next CA waits (next.crt, next.key): when it becomes the signer. */
  promoteAt: `${API_GROUP}/egress-ca-promote-at`,
  /** On the Secret, while CAs that signed before stay trusted (retired.crt): until when. */
  retireAt: `${API_GROUP}/egress-ca-retire-at`,
} as const;

/** The Secret's data keys besides tls.crt and tls.key. */
export const EGRESS_CA_KEYS = { cert: 'tls.crt', key: 'tls.key', nextCert: 'next.crt', nextKey: 'next.key', retired: 'retired.crt' } as const;

/** Label selector of both objects (the gateway watches the Secrets by their component). */
export const EGRESS_CA_SELECTOR = `${LABELS.managedBy}=${MANAGED_BY},${LABELS.component}=${EGRESS_CA_COMPONENT}`;

export const CA_LIFETIME_MS = 365 * 24 * 3600_000;
/** Clocks of boxes a little behind the operator's still take a new CA as valid. */
export const CA_BACKDATE_MS = 5 * 60_000;
/** Gateway leaves live at most 24 h; a CA stays trusted this long after it stopped signing. */
export const RETIRE_AFTER_MS = 25 * 3600_000;
/** Retired CAs kept at most (only rotations in quick succession make more): the oldest go first. */
export const MAX_RETIRED = 10;
/** How much of the propagation wait a ConfigMap write not yet in the cache may take away. */
export const PROMOTION_SLACK_MS = 2000;
/** The longest RequeueAfter (setTimeout's limit is ~24.8 days; a CA needs a look every few months). */
export const MAX_REQUEUE_MS = 12 * 3600_000;

const ALGORITHM = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
/** Node's WebCrypto, as the library types it. */
const crypto = webcrypto as unknown as NonNullable<Parameters<typeof x509.X509CertificateGenerator.createSelfSigned>[1]>;

export interface CaPair {
  /** PEM certificate. */
  cert: string;
  /** PEM PKCS#8 private key. */
  key: string;
}

/**
 * A new pool CA: ECDSA P-256, self-signed, CA:TRUE with pathlen 0 (it signs leaves only),
 * keyCertSign|cRLSign, CN "sandbox-bridge egress CA <pool>", valid a year.
 */
export async function issueCa(pool: string, now: number): Promise<CaPair> {
  const keys = await crypto.subtle.generateKey(ALGORITHM, true, ['sign', 'verify']);
  // 16 random bytes, positive and with no leading zero byte (RFC 5280 4.1.2.2).
  const serial = randomBytes(16);
  serial[0] = (serial[0]! & 0x7f) | 0x40;
  const cert = await x509.X509CertificateGenerator.createSelfSigned(
    {
      serialNumber: serial.toString('hex'),
      name: [{ CN: [`sandbox-bridge egress CA ${pool}`] }],
      notBefore: new Date(now - CA_BACKDATE_MS),
      notAfter: new Date(now + CA_LIFETIME_MS),
      signingAlgorithm: ALGORITHM,
      keys,
      extensions: [
        new x509.BasicConstraintsExtension(true, 0, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
        await x509.SubjectKeyIdentifierExtension.create(keys.publicKey, false, crypto),
      ],
    },
    crypto,
  );
  const pkcs8 = await crypto.subtle.exportKey('pkcs8', keys.privateKey);
  return { cert: withNewline(cert.toString('pem')), key: withNewline(x509.PemConverter.encode(pkcs8, 'PRIVATE KEY')) };
}

/** A CA pair that can sign now: a CA certificate, its key, not expired. */
interface Signer extends CaPair {
  notBefore: number;
  notAfter: number;
  fingerprint: string;
}

/** What the Secret keeps: the signer, the next CA while it waits, and retired CAs still trusted. */
export interface CaState {
  signer: CaPair;
  next?: CaPair & { promoteAt: number };
  retired: string[];
  retireAt?: number;
  /** The pool's rotate-egress-ca value last handled. */
  seen?: string;
}

export type CaStep =
  | { step: 'created'; fingerprint: string }
  | { step: 'replaced'; fingerprint: string; why: string }
  | { step: 'rotation-started'; fingerprint: string; why: 'requested' | 'expiring'; promoteAt: number }
  | { step: 'promotion-delayed'; promoteAt: number }
  | { step: 'signer-switched'; fingerprint: string; retireAt: number }
  | { step: 'retired'; count: number }
  | { step: 'removed' };

export interface EgressCaInput {
  pool: SandboxPool;
  /** The live objects (from the cache), if any. */
  secret?: k8s.V1Secret;
  configMap?: k8s.V1ConfigMap;
  now: number;
  propagationMs: number;
  issue: (pool: string, now: number) => Promise<CaPair>;
}

export interface EgressCaPlan {
  /** What the pool's objects should be; undefined: none (not a gateway pool). */
  secret?: k8s.V1Secret;
  configMap?: k8s.V1ConfigMap;
  /** Whether each differs from the live one (a write is needed). */
  writeSecret: boolean;
  writeConfigMap: boolean;
  /** Live objects to delete (the pool is not in gateway mode). */
  remove: Array<{ kind: 'Secret' | 'ConfigMap'; uid: string }>;
  steps: CaStep[];
  requeueAfterMs?: number;
}

/** The pure state machine: the pool's objects as they should be now, and when to look again. */
export async function planEgressCa(input: EgressCaInput): Promise<EgressCaPlan> {
  const { pool, secret, configMap, now, propagationMs } = input;
  const name = pool.metadata.name;
  if (pool.spec.egress.mode !== 'gateway') {
    // Nothing signs for a direct pool; its key is not kept around (docs/operator.md).
    const remove: EgressCaPlan['remove'] = [];
    if (secret?.metadata?.uid) remove.push({ kind: 'Secret', uid: secret.metadata.uid });
    if (configMap?.metadata?.uid) remove.push({ kind: 'ConfigMap', uid: configMap.metadata.uid });
    return { writeSecret: false, writeConfigMap: false, remove, steps: remove.length ? [{ step: 'removed' }] : [] };
  }

  const steps: CaStep[] = [];
  const request = poolAnnotations(pool)[EGRESS_CA_ANNOTATIONS.rotate] || undefined;
  const read = readState(secret, now);
  let state: CaState;
  if (read.state) {
    state = read.state;
  } else {
    const fresh = await input.issue(name, now);
    state = { signer: fresh, retired: [], ...(request ? { seen: request } : {}) };
    const fingerprint = parseSigner(fresh, now)?.fingerprint ?? '';
    steps.push(read.problem === 'missing' ? { step: 'created', fingerprint } : { step: 'replaced', fingerprint, why: read.problem });
  }

  // Retired CAs leave once every leaf they signed has expired.
  if (state.retireAt !== undefined && state.retireAt <= now) {
    if (state.retired.length) steps.push({ step: 'retired', count: state.retired.length });
    state = { ...state, retired: [], retireAt: undefined };
  }

  const trusted = new Set(pemBlocks(configMap?.data?.[EGRESS_CA_CONFIGMAP_KEY] ?? '').map(normalizePem));
  const requested = request !== undefined && request !== state.seen;
  const pending = state.next;
  if (pending) {
    // A request while a rotation runs is answered by that rotation: its CA has not signed yet.
    if (requested) state = { ...state, seen: request };
    if (!trusted.has(normalizePem(pending.cert))) {
      // Boxes cannot trust it yet (the ConfigMap is written after this plan): count from now,
      // unless the wait was set moments ago (a cache that has not yet seen the ConfigMap write).
      if (pending.promoteAt - now < propagationMs - Math.min(PROMOTION_SLACK_MS, propagationMs / 2)) {
        state = { ...state, next: { ...pending, promoteAt: now + propagationMs } };
        steps.push({ step: 'promotion-delayed', promoteAt: now + propagationMs });
      }
    } else if (pending.promoteAt <= now) {
      const retireAt = now + RETIRE_AFTER_MS;
      state = {
        signer: { cert: pending.cert, key: pending.key },
        retired: [state.signer.cert, ...state.retired].slice(0, MAX_RETIRED),
        retireAt: Math.max(retireAt, state.retireAt ?? 0),
        ...(state.seen !== undefined ? { seen: state.seen } : {}),
      };
      steps.push({ step: 'signer-switched', fingerprint: fingerprintOf(pending.cert), retireAt });
    }
  } else {
    const signer = parseSigner(state.signer, now)!;
    const expiring = signer.notAfter - now < (signer.notAfter - signer.notBefore) / 3;
    if (requested || expiring) {
      const next = await input.issue(name, now);
      const promoteAt = now + propagationMs;
      state = { ...state, next: { ...next, promoteAt }, ...(requested ? { seen: request } : {}) };
      steps.push({ step: 'rotation-started', fingerprint: fingerprintOf(next.cert), why: requested ? 'requested' : 'expiring', promoteAt });
    }
  }

  const desiredSecret = buildSecret(pool, state);
  const desiredConfigMap = buildConfigMap(pool, state);
  const signer = parseSigner(state.signer, now)!;
  const due = [signer.notAfter - (signer.notAfter - signer.notBefore) / 3, state.next?.promoteAt, state.retireAt].filter((t): t is number => t !== undefined);
  const requeueAfterMs = Math.min(MAX_REQUEUE_MS, Math.max(0, Math.min(...due) - now));
  return {
    secret: desiredSecret,
    configMap: desiredConfigMap,
    writeSecret: !sameSecret(secret, desiredSecret),
    writeConfigMap: !sameConfigMap(configMap, desiredConfigMap),
    remove: [],
    steps,
    requeueAfterMs,
  };
}

/** The state a live Secret holds, or why it holds none usable. */
export function readState(secret: k8s.V1Secret | undefined, now: number): { state: CaState; problem?: undefined } | { state?: undefined; problem: string } {
  if (!secret) return { problem: 'missing' };
  const data = decodeData(secret.data);
  const annotations = secret.metadata?.annotations ?? {};
  const current = { cert: data[EGRESS_CA_KEYS.cert] ?? '', key: data[EGRESS_CA_KEYS.key] ?? '' };
  const signer = parseSigner(current, now);
  if (!signer) return { problem: signerProblem(current, now) };
  const state: CaState = { signer: current, retired: [] };
  const seen = annotations[EGRESS_CA_ANNOTATIONS.rotate];
  if (seen) state.seen = seen;
  const next = { cert: data[EGRESS_CA_KEYS.nextCert] ?? '', key: data[EGRESS_CA_KEYS.nextKey] ?? '' };
  const promoteAt = Date.parse(annotations[EGRESS_CA_ANNOTATIONS.promoteAt] ?? '');
  // A next CA that cannot sign is dropped; a rotation it served starts again when still due
  // (a request's value is already seen: then the current CA simply stays).
  if (parseSigner(next, now) && Number.isFinite(promoteAt)) state.next = { ...next, promoteAt };
  const retireAt = Date.parse(annotations[EGRESS_CA_ANNOTATIONS.retireAt] ?? '');
  const retired = pemBlocks(data[EGRESS_CA_KEYS.retired] ?? '');
  if (retired.length && Number.isFinite(retireAt)) {
    state.retired = retired;
    state.retireAt = retireAt;
  }
  return { state };
}

function signerProblem(pair: CaPair, now: number): string {
  if (!pair.cert || !pair.key) return 'tls.crt or tls.key is missing';
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(pair.cert);
  } catch {
    return 'tls.crt is not a certificate';
  }
  if (!cert.ca) return 'tls.crt is not a CA';
  if (cert.validToDate.getTime() <= now) return 'the CA has expired';
  return 'tls.key is not the key of tls.crt';
}

/** The pair's certificate facts, if it is a CA whose key matches and which has not expired. */
function parseSigner(pair: CaPair, now: number): Signer | undefined {
  if (!pair.cert || !pair.key) return undefined;
  try {
    const cert = new X509Certificate(pair.cert);
    if (!cert.ca || cert.validToDate.getTime() <= now) return undefined;
    if (!cert.checkPrivateKey(createPrivateKey(pair.key))) return undefined;
    return { ...pair, notBefore: cert.validFromDate.getTime(), notAfter: cert.validToDate.getTime(), fingerprint: cert.fingerprint256 };
  } catch {
    return undefined;
  }
}

export function fingerprintOf(pem: string): string {
  try {
    return new X509Certificate(pem).fingerprint256;
  } catch {
    return 'unreadable';
  }
}

function labels(pool: SandboxPool): Record<string, string> {
  return { [LABELS.managedBy]: MANAGED_BY, [LABELS.component]: EGRESS_CA_COMPONENT, [LABELS.pool]: pool.metadata.name };
}

export function buildSecret(pool: SandboxPool, state: CaState): k8s.V1Secret {
  const strings: Record<string, string> = { [EGRESS_CA_KEYS.cert]: state.signer.cert, [EGRESS_CA_KEYS.key]: state.signer.key };
  const annotations: Record<string, string> = {};
  if (state.seen !== undefined) annotations[EGRESS_CA_ANNOTATIONS.rotate] = state.seen;
  if (state.next) {
    strings[EGRESS_CA_KEYS.nextCert] = state.next.cert;
    strings[EGRESS_CA_KEYS.nextKey] = state.next.key;
    annotations[EGRESS_CA_ANNOTATIONS.promoteAt] = new Date(state.next.promoteAt).toISOString();
  }
  if (state.retired.length && state.retireAt !== undefined) {
    strings[EGRESS_CA_KEYS.retired] = state.retired.map(withNewline).join('');
    annotations[EGRESS_CA_ANNOTATIONS.retireAt] = new Date(state.retireAt).toISOString();
  }
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    type: 'kubernetes.io/tls',
    metadata: {
      name: EGRESS_CA_NAME,
      namespace: pool.spec.namespace,
      labels: labels(pool),
      annotations,
      ownerReferences: [ownerReference(pool)],
    },
    data: Object.fromEntries(Object.entries(strings).map(([k, v]) => [k, Buffer.from(v).toString('base64')])),
  };
}

/** ca.crt: the signer, then the next CA, then the retired ones: every CA a box may meet. */
export function buildConfigMap(pool: SandboxPool, state: CaState): k8s.V1ConfigMap {
  const certs = [state.signer.cert, ...(state.next ? [state.next.cert] : []), ...state.retired];
  const unique = [...new Map(certs.map((c) => [normalizePem(c), withNewline(c)])).values()];
  return {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: EGRESS_CA_NAME, namespace: pool.spec.namespace, labels: labels(pool), ownerReferences: [ownerReference(pool)] },
    data: { [EGRESS_CA_CONFIGMAP_KEY]: unique.join('') },
  };
}

/** Our labels, owner and annotations are there, and the data is exactly ours (decoded). */
export function sameSecret(live: k8s.V1Secret | undefined, desired: k8s.V1Secret): boolean {
  if (!live || live.type !== desired.type || !sameMetadata(live.metadata, desired.metadata!)) return false;
  const annotations = live.metadata?.annotations ?? {};
  for (const key of Object.values(EGRESS_CA_ANNOTATIONS)) {
    if (annotations[key] !== desired.metadata!.annotations?.[key]) return false;
  }
  return sameStrings(decodeData(live.data), decodeData(desired.data));
}

/** Our labels and owner are there, and ca.crt holds the same certificates (order aside). */
export function sameConfigMap(live: k8s.V1ConfigMap | undefined, desired: k8s.V1ConfigMap): boolean {
  if (!live || !sameMetadata(live.metadata, desired.metadata!)) return false;
  if (Object.keys(live.data ?? {}).join() !== EGRESS_CA_CONFIGMAP_KEY || live.binaryData) return false;
  const set = (d?: Record<string, string>) => pemBlocks(d?.[EGRESS_CA_CONFIGMAP_KEY] ?? '').map(normalizePem).sort().join('|');
  return set(live.data) === set(desired.data);
}

function sameMetadata(live: k8s.V1ObjectMeta | undefined, desired: k8s.V1ObjectMeta): boolean {
  for (const [k, v] of Object.entries(desired.labels ?? {})) if (live?.labels?.[k] !== v) return false;
  const owner = desired.ownerReferences![0]!;
  return (live?.ownerReferences ?? []).some((r) => r.uid === owner.uid && r.controller === true);
}

function sameStrings(a: Record<string, string>, b: Record<string, string>): boolean {
  const keys = Object.keys(a);
  return keys.length === Object.keys(b).length && keys.every((k) => a[k] === b[k]);
}

function decodeData(data: Record<string, string> | undefined): Record<string, string> {
  return Object.fromEntries(Object.entries(data ?? {}).map(([k, v]) => [k, Buffer.from(v, 'base64').toString('utf8')]));
}

/** The PEM certificate blocks of a bundle. */
export function pemBlocks(bundle: string): string[] {
  return bundle.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----\s*/g)?.map(withNewline) ?? [];
}

function normalizePem(pem: string): string {
  return pem.replace(/\s+/g, '');
}

function withNewline(pem: string): string {
  return `${pem.trim()}\n`;
}

function poolAnnotations(pool: SandboxPool): Record<string, string> {
  return (pool.metadata as { annotations?: Record<string, string> }).annotations ?? {};
}

export interface EgressCaKeeperOptions {
  core: k8s.CoreV1Api;
  secrets: Lister<k8s.V1Secret>;
  configMaps: Lister<k8s.V1ConfigMap>;
  propagationMs: number;
  events: EventRecorder;
  metrics: OperatorMetrics;
  fieldManager: string;
  now?: () => number;
  issue?: (pool: string, now: number) => Promise<CaPair>;
}

/**
 * Makes the cluster match planEgressCa: the Secret first, then the ConfigMap (so a ConfigMap
 * write that fails leaves the next CA unpromoted: the next pass sees it untrusted and waits
 * again). A create is refused if the object exists and a replace if it changed since the cache
 * saw it (409), so a stale cache never overwrites a CA: the pass is retried.
 */
export class EgressCaKeeper {
  private readonly now: () => number;
  private readonly issue: (pool: string, now: number) => Promise<CaPair>;

  constructor(private readonly o: EgressCaKeeperOptions) {
    this.now = o.now ?? Date.now;
    this.issue = o.issue ?? issueCa;
  }

  async reconcile(pool: SandboxPool, log: Logger): Promise<{ requeueAfterMs?: number; error?: string }> {
    const namespace = pool.spec.namespace;
    const secret = this.o.secrets.get(EGRESS_CA_NAME, namespace);
    const configMap = this.o.configMaps.get(EGRESS_CA_NAME, namespace);
    const plan = await planEgressCa({ pool, secret, configMap, now: this.now(), propagationMs: this.o.propagationMs, issue: this.issue });
    try {
      for (const r of plan.remove) {
        const body = { preconditions: { uid: r.uid } };
        const gone = (err: unknown) => {
          if (!isNotFound(err) && !isConflict(err)) throw err;
        };
        if (r.kind === 'Secret') await this.o.core.deleteNamespacedSecret({ name: EGRESS_CA_NAME, namespace, body }).catch(gone);
        else await this.o.core.deleteNamespacedConfigMap({ name: EGRESS_CA_NAME, namespace, body }).catch(gone);
      }
      if (plan.writeSecret) {
        await this.write('Secret', secret, plan.secret!);
      }
      if (plan.writeConfigMap) {
        await this.write('ConfigMap', configMap, plan.configMap!);
      }
    } catch (err) {
      if (isConflict(err)) return { requeueAfterMs: 100 };
      const message = `egress CA ${namespace}/${EGRESS_CA_NAME}: ${apiMessage(err)}`;
      log.warn({ err: message }, 'egress CA write failed');
      return { requeueAfterMs: 2000, error: message };
    }
    for (const step of plan.steps) {
      log.info({ ...step, ...('promoteAt' in step ? { promoteAt: new Date(step.promoteAt).toISOString() } : {}), ...('retireAt' in step ? { retireAt: new Date(step.retireAt).toISOString() } : {}) }, 'egress CA');
      const event = stepEvent(step);
      if (event) await this.o.events.record(pool, event);
    }
    return plan.requeueAfterMs === undefined ? {} : { requeueAfterMs: plan.requeueAfterMs };
  }

  private async write(kind: 'Secret' | 'ConfigMap', live: k8s.V1Secret | k8s.V1ConfigMap | undefined, desired: k8s.V1Secret | k8s.V1ConfigMap): Promise<void> {
    const namespace = desired.metadata!.namespace!;
    const fieldManager = this.o.fieldManager;
    this.o.metrics.childApplies.inc({ kind });
    if (!live) {
      if (kind === 'Secret') await this.o.core.createNamespacedSecret({ namespace, body: desired as k8s.V1Secret, fieldManager });
      else await this.o.core.createNamespacedConfigMap({ namespace, body: desired as k8s.V1ConfigMap, fieldManager });
      return;
    }
    // What others added to the metadata stays; our annotations are exactly ours.
    const ours = new Set<string>(Object.values(EGRESS_CA_ANNOTATIONS));
    const annotations = Object.fromEntries(Object.entries(live.metadata?.annotations ?? {}).filter(([k]) => !ours.has(k)));
    const owner = desired.metadata!.ownerReferences![0]!;
    const m = live.metadata ?? {};
    const body = {
      ...desired,
      metadata: {
        name: EGRESS_CA_NAME,
        namespace,
        // The precondition: a replace of anything newer than what the plan read is refused (409).
        resourceVersion: m.resourceVersion,
        labels: { ...m.labels, ...desired.metadata!.labels },
        annotations: { ...annotations, ...desired.metadata!.annotations },
        ownerReferences: [...(m.ownerReferences ?? []).filter((r) => r.uid !== owner.uid), owner],
        ...(m.finalizers ? { finalizers: m.finalizers } : {}),
      },
    };
    if (kind === 'Secret') await this.o.core.replaceNamespacedSecret({ name: EGRESS_CA_NAME, namespace, body: body as k8s.V1Secret, fieldManager });
    else await this.o.core.replaceNamespacedConfigMap({ name: EGRESS_CA_NAME, namespace, body: body as k8s.V1ConfigMap, fieldManager });
  }
}

function stepEvent(step: CaStep): EventSpec | undefined {
  switch (step.step) {
    case 'created':
      return { type: 'Normal', reason: 'EgressCaCreated', message: `Created the egress CA (SHA-256 ${step.fingerprint}) in Secret and ConfigMap ${EGRESS_CA_NAME}` };
    case 'replaced':
      return { type: 'Warning', reason: 'EgressCaReplaced', message: `Replaced the egress CA: ${step.why}; the new one (SHA-256 ${step.fingerprint}) signs at once` };
    case 'rotation-started':
      return {
        type: 'Normal',
        reason: 'EgressCaRotating',
        message: `New egress CA (SHA-256 ${step.fingerprint}, ${step.why}) trusted by boxes now, signing from ${new Date(step.promoteAt).toISOString()}`,
      };
    case 'signer-switched':
      return { type: 'Normal', reason: 'EgressCaRotated', message: `The egress gateway now signs with CA SHA-256 ${step.fingerprint}; the previous CA is trusted until ${new Date(step.retireAt).toISOString()}` };
    case 'retired':
      return { type: 'Normal', reason: 'EgressCaRetired', message: `${step.count} retired egress CA(s) no longer trusted` };
    default:
      return undefined;
  }
}
