// Box pods, as bridge (cold creates) and operator (warm boxes) both build them: the pod spec
// (pure; every security default lives here), what a session's box adds to a pod's metadata
// (cold creates put it in at once, a warm claim patches it in), and the warm template's hash.
import { createHash } from 'node:crypto';
import type { V1EnvVar, V1ObjectMeta, V1OwnerReference, V1Pod, V1Secret, V1SecurityContext, V1Volume, V1VolumeMount } from '@kubernetes/client-node';
import { BOXD_BINARY, BOXD_BIN_DIR, BOXD_NONCE_ANNOTATION, BOXD_PORT, BOXD_PROTOCOL_VERSION, BOXD_SECRET_DIR, BOXD_VERSION_ANNOTATION, BOX_SECRET_KEYS } from './boxd.js';
import {
  BOXD_CA_ENV,
  CA_BUNDLE_DIR,
  CA_BUNDLE_FILE,
  CA_BUNDLE_VARIABLES,
  EGRESS_CA_CONFIGMAP_KEY,
  EGRESS_CA_DIR,
  EGRESS_CA_FILE,
  EGRESS_CA_NAME,
  EGRESS_PROXY_KEY,
  NO_PROXY,
  NO_PROXY_VARIABLES,
  PROXY_VARIABLES,
  gatewayAddress,
} from './egress-proxy.js';
import { ANNOTATIONS, LABELS, MANAGED_BY, sessionHash } from './labels.js';
import { memoryPodParts } from './memory-store.js';
import type { BoxPolicy, EgressPolicy, SandboxPoolSpec } from './pool.js';
import { formatCpu, formatMemory, parseQuantity } from './quantity.js';

export const BOX_CONTAINER = 'box';
export const BOXD_INSTALL_CONTAINER = 'boxd-install';
export const WORKSPACE = '/workspace';
/** Files box code leaves for the session (issue 21: the platform's session outputs). */
export const SESSION_OUTPUTS_DIR = '/mnt/session/outputs';
/** Outputs are results, not a second workspace: a fixed cap, counted against the node's ephemeral storage. */
export const SESSION_OUTPUTS_SIZE_LIMIT = '256Mi';

/** What a box runs on: the fields a create request may set, resolved. */
export interface BoxShape {
  image: string;
  cpuCores: number;
  memoryBytes: number;
  runtimeClassName?: string | undefined;
  serviceAccountName?: string | undefined;
}

export interface BoxPodParams {
  name: string;
  namespace: string;
  poolName: string;
  shape: BoxShape;
  box: BoxPolicy;
  /** The image whose /boxd the init container installs (a static binary, see boxd/). */
  boxdImage: string;
  /** Random per pod: the pod's boxd credential is derived from it (common/boxd.ts). */
  nonce: string;
  /** The Secret the box's credential and env come from (the box record, or a warm pod's own). */
  secretName: string;
  /** The pool's egress: in gateway mode the box is pointed at the gateway (egressPodParts). */
  egress: Pick<EgressPolicy, 'mode' | 'gateway'>;
}

/** Every container of a box: the restricted Pod Security profile, read-only root. */
const LOCKED_DOWN: V1SecurityContext = {
  allowPrivilegeEscalation: false,
  readOnlyRootFilesystem: true,
  runAsNonRoot: true,
  capabilities: { drop: ['ALL'] },
};

/**
 * A box pod: boxd (installed by an init container into an emptyDir, or, with the pool's
 * `boxdDelivery: ImageVolume`, the boxd image mounted read-only as an image volume) runs as PID 1
 * of the box container in the user's image, as the box user. The credential and env reach it as
 * two files of a Secret; nothing secret is in the pod spec. Session metadata is added by sessionMetadata().
 */
export function buildBoxPod(p: BoxPodParams): V1Pod {
  const cpu = formatCpu(p.shape.cpuCores);
  const memory = formatMemory(p.shape.memoryBytes);
  // The init container gets the box's own resources, so it changes neither scheduling nor quota.
  const resources = { requests: { cpu, memory }, limits: { cpu, memory } };
  // Memory stores (docs/mounts.md): a sidecar and two volumes, when the pool has them on.
  const mem = memoryPodParts(p.box.memoryStores, p.boxdImage, 'box-secret', LOCKED_DOWN);
  const egress = p.egress.mode === 'gateway' ? egressPodParts(p.egress.gateway, p.secretName) : undefined;
  const imageVolume = p.box.boxdDelivery === 'ImageVolume';
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name: p.name,
      namespace: p.namespace,
      labels: {
        [LABELS.box]: 'true',
        [LABELS.pool]: p.poolName,
        [LABELS.managedBy]: MANAGED_BY,
        [LABELS.component]: 'box',
      },
      annotations: {
        [BOXD_VERSION_ANNOTATION]: BOXD_PROTOCOL_VERSION,
        [BOXD_NONCE_ANNOTATION]: p.nonce,
        ...mem?.annotations,
      },
    },
    spec: {
      restartPolicy: 'Never',
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      terminationGracePeriodSeconds: 5,
      ...(p.shape.runtimeClassName ? { runtimeClassName: p.shape.runtimeClassName } : {}),
      ...(p.shape.serviceAccountName ? { serviceAccountName: p.shape.serviceAccountName } : {}),
      ...(p.box.nodeSelector ? { nodeSelector: p.box.nodeSelector } : {}),
      ...(p.box.tolerations ? { tolerations: p.box.tolerations } : {}),
      securityContext: {
        runAsNonRoot: true,
        runAsUser: 65534,
        runAsGroup: 65534,
        fsGroup: 65534,
        seccompProfile: { type: 'RuntimeDefault' },
      },
      // An image volume needs no install: the box container starts right after the sandbox (the
      // kubelet notices an init container's exit only at its next relist, up to a second later).
      ...(imageVolume && !mem
        ? {}
        : {
            initContainers: [
              ...(imageVolume
                ? []
                : [
                    {
                      name: BOXD_INSTALL_CONTAINER,
                      image: p.boxdImage,
                      imagePullPolicy: 'IfNotPresent',
                      args: ['install', BOXD_BINARY],
                      resources,
                      securityContext: LOCKED_DOWN,
                      volumeMounts: [{ name: 'boxd', mountPath: BOXD_BIN_DIR }],
                    },
                  ]),
              ...(mem ? [mem.sidecar] : []),
            ],
          }),
      containers: [
        {
          name: BOX_CONTAINER,
          image: p.shape.image,
          imagePullPolicy: 'IfNotPresent',
          command: [BOXD_BINARY, 'serve'],
          workingDir: WORKSPACE,
          env: [{ name: 'HOME', value: WORKSPACE }, volumeLimitsEnv(p.box), ...(egress?.env ?? [])],
          ports: [{ name: 'boxd', containerPort: BOXD_PORT, protocol: 'TCP' }],
          resources,
          securityContext: LOCKED_DOWN,
          volumeMounts: [
            { name: 'workspace', mountPath: WORKSPACE },
            { name: 'tmp', mountPath: '/tmp' },
            { name: 'outputs', mountPath: SESSION_OUTPUTS_DIR },
            { name: 'boxd', mountPath: BOXD_BIN_DIR, readOnly: true },
            { name: 'box-secret', mountPath: BOXD_SECRET_DIR, readOnly: true },
            ...(mem?.boxMounts ?? []),
            ...(egress?.mounts ?? []),
          ],
        },
      ],
      volumes: [
        { name: 'workspace', emptyDir: { sizeLimit: p.box.workspaceSizeLimit } },
        { name: 'tmp', emptyDir: { sizeLimit: p.box.tmpSizeLimit } },
        { name: 'outputs', emptyDir: { sizeLimit: SESSION_OUTPUTS_SIZE_LIMIT } },
        // The boxd image holds /boxd alone: mounted at BOXD_BIN_DIR it is BOXD_BINARY, read-only
        // whatever the mount says (the runtime mounts image volumes read-only).
        imageVolume ? { name: 'boxd', image: { reference: p.boxdImage, pullPolicy: 'IfNotPresent' } } : { name: 'boxd', emptyDir: { sizeLimit: '64Mi' } },
        {
          name: 'box-secret',
          secret: {
            secretName: p.secretName,
            // Group-readable: the kubelet gives the files the pod's fsGroup (the box user's group).
            defaultMode: 0o440,
            items: [
              { key: BOX_SECRET_KEYS.token, path: BOX_SECRET_KEYS.token },
              { key: BOX_SECRET_KEYS.env, path: BOX_SECRET_KEYS.env },
            ],
          },
        },
        ...(mem?.volumes ?? []),
        ...(egress?.volumes ?? []),
      ],
    },
  };
}

/**
 * BOXD_VOLUME_LIMITS: the volumes boxd's metrics report and their sizeLimits in bytes (a
 * disk-backed emptyDir's statfs answers for the node's disk, so boxd cannot see them).
 */
function volumeLimitsEnv(box: BoxPolicy): V1EnvVar {
  const bytes = (q: string) => Math.floor(parseQuantity(q));
  return { name: 'BOXD_VOLUME_LIMITS', value: `${WORKSPACE}=${bytes(box.workspaceSizeLimit)},/tmp=${bytes(box.tmpSizeLimit)}` };
}

/**
 * What a box of a gateway-mode pool adds (docs/egress.md): proxy variables naming the gateway
 * with the pod's own credential, a CA bundle for the tools that read one (boxd writes it from
 * the image's system bundle and the pool CA's ConfigMap, boxd/cabundle), and the two volumes.
 * The credential comes only by reference to the pod's Secret (optional: a pod whose Secret has
 * none starts, and the gateway refuses it); Kubernetes expands $(VAR) of earlier entries.
 */
function egressPodParts(gateway: EgressPolicy['gateway'], secretName: string): { env: V1EnvVar[]; volumes: V1Volume[]; mounts: V1VolumeMount[] } {
  const proxy = `http://$(SANDBOX_EGRESS_POD):$(SANDBOX_EGRESS_CREDENTIAL)@${gatewayAddress(gateway)}`;
  return {
    env: [
      { name: 'SANDBOX_EGRESS_POD', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } },
      { name: 'SANDBOX_EGRESS_CREDENTIAL', valueFrom: { secretKeyRef: { name: secretName, key: EGRESS_PROXY_KEY, optional: true } } },
      ...PROXY_VARIABLES.map((name) => ({ name, value: proxy })),
      ...NO_PROXY_VARIABLES.map((name) => ({ name, value: NO_PROXY })),
      ...CA_BUNDLE_VARIABLES.map((name) => ({ name, value: CA_BUNDLE_FILE })),
      { name: BOXD_CA_ENV.source, value: EGRESS_CA_FILE },
      { name: BOXD_CA_ENV.bundle, value: CA_BUNDLE_FILE },
    ],
    volumes: [
      {
        name: 'egress-ca',
        // Optional: a box starts before the operator made the pool's CA; boxd picks it up when it comes.
        configMap: { name: EGRESS_CA_NAME, optional: true, items: [{ key: EGRESS_CA_CONFIGMAP_KEY, path: EGRESS_CA_CONFIGMAP_KEY }] },
      },
      { name: 'egress', emptyDir: { sizeLimit: '4Mi' } },
    ],
    mounts: [
      { name: 'egress-ca', mountPath: EGRESS_CA_DIR, readOnly: true },
      { name: 'egress', mountPath: CA_BUNDLE_DIR },
    ],
  };
}

export interface SessionBox {
  boxId: string;
  sessionId: string;
  slot: number;
  /** The pool seat the box holds (bridge/kube/box-seats.ts). */
  seat: number;
  /** The box's record (a Secret named boxId); the pod is its dependent. */
  record: { name: string; uid: string };
  ttlSeconds: number;
  now: Date;
  /** Digest of the create request's Idempotency-Key (a label, so a retry finds the box). */
  idempotencyKey?: string | undefined;
  /** A woken box keeps when it was made and when it expires (its TTL counted on while it slept). */
  createdAt?: Date;
  expiresAt?: Date;
  /** A pod made for a wake: not to be served until the waker commits it (ANNOTATIONS.restoring). */
  restoring?: boolean;
  /** The warm shape (its key, common/warm-shapes.ts) that serves, or would have served, a create of this box's shape: its demand. */
  warmDemand?: string | undefined;
}

/**
 * What makes a pod a session's box: labels to find it by, when it expires (its TTL starts now:
 * at a cold create, or when a warm pod is claimed), and its record as owner, so deleting the
 * record takes the pod with it.
 */
export function sessionMetadata(s: SessionBox): Required<Pick<V1ObjectMeta, 'labels' | 'annotations' | 'ownerReferences'>> {
  const expiresAt = s.expiresAt ?? new Date(s.now.getTime() + s.ttlSeconds * 1000);
  const owner: V1OwnerReference = { apiVersion: 'v1', kind: 'Secret', name: s.record.name, uid: s.record.uid, blockOwnerDeletion: false };
  return {
    labels: {
      [LABELS.boxId]: s.boxId,
      [LABELS.session]: sessionHash(s.sessionId),
      [LABELS.slot]: String(s.slot),
      ...(s.seat >= 0 ? { [LABELS.seat]: String(s.seat) } : {}),
      ...(s.idempotencyKey ? { [LABELS.idempotencyKey]: s.idempotencyKey } : {}),
    },
    annotations: {
      [ANNOTATIONS.sessionId]: s.sessionId,
      [ANNOTATIONS.createdAt]: (s.createdAt ?? s.now).toISOString(),
      [ANNOTATIONS.expiresAt]: expiresAt.toISOString().replace(/\.\d{3}Z$/, 'Z'),
      [ANNOTATIONS.ttlSeconds]: String(s.ttlSeconds),
      // Idle sleep counts from here until a call through the bridge moves it on.
      [ANNOTATIONS.lastActive]: s.now.toISOString(),
      ...(s.restoring ? { [ANNOTATIONS.restoring]: 'true' } : {}),
      ...(s.warmDemand ? { [ANNOTATIONS.warmDemand]: s.warmDemand } : {}),
    },
    ownerReferences: [owner],
  };
}

/** A cold box: a pod named after the box, its session metadata in from the start. */
export function buildSessionBoxPod(p: Omit<BoxPodParams, 'name' | 'secretName'>, s: SessionBox): V1Pod {
  const pod = buildBoxPod({ ...p, name: s.boxId, secretName: s.record.name });
  const meta = sessionMetadata(s);
  pod.metadata = {
    ...pod.metadata,
    labels: { ...pod.metadata!.labels, ...meta.labels },
    annotations: { ...pod.metadata!.annotations, ...meta.annotations },
    ownerReferences: meta.ownerReferences,
  };
  return pod;
}

/** The shape of a pool's warm boxes: its defaults, and the warm runtime class. */
export function warmShape(spec: SandboxPoolSpec): BoxShape {
  return {
    image: spec.box.defaultImage,
    cpuCores: parseQuantity(spec.box.defaultCpu),
    memoryBytes: parseQuantity(spec.box.defaultMemory),
    ...(spec.warm?.runtimeClassName ? { runtimeClassName: spec.warm.runtimeClassName } : {}),
  };
}

/**
 * A digest of everything a warm pod of a shape (default: the pool's default shape) is made from:
 * a pool edit or a new boxd image changes it, and the operator then replaces warm pods of the old
 * template, and claims skip them.
 */
export function warmTemplateHash(spec: SandboxPoolSpec, boxdImage: string, shape: BoxShape = warmShape(spec)): string {
  const { box } = spec;
  const template = {
    shape,
    workspace: box.workspaceSizeLimit,
    tmp: box.tmpSizeLimit,
    // The volumes a box has beyond its policy's, and that a warm pod holds a seat of its own
    // (common/seats.ts): warm pods of an older layout are replaced.
    layout: [SESSION_OUTPUTS_DIR, SESSION_OUTPUTS_SIZE_LIMIT, 'warm-seat'],
    memoryStores: box.memoryStores?.enabled ? box.memoryStores.sizeLimit : null,
    nodeSelector: box.nodeSelector ?? null,
    tolerations: box.tolerations ?? null,
    boxdImage,
    // boxd from an image volume: warm pods with an init container are replaced (InitContainer
    // templates hash as before, so their warm pods stay).
    ...(box.boxdDelivery === 'ImageVolume' ? { boxdDelivery: box.boxdDelivery } : {}),
    // Gateway-mode pods carry the proxy variables and the CA volumes: a switch, or a gateway moved,
    // replaces them (direct-mode templates hash as before, so their warm pods stay).
    ...(spec.egress.mode === 'gateway' ? { egressGateway: gatewayAddress(spec.egress.gateway) } : {}),
  };
  return createHash('sha256').update(JSON.stringify(template)).digest('hex').slice(0, 16);
}

/**
 * A Secret boxd reads its credential and env from: a box's record (named after the box, holding
 * its session slot; no owner, the operator reaps it) or a warm pod's own (owned by the pod).
 */
export function buildBoxSecret(p: {
  name: string;
  namespace: string;
  poolName: string;
  component: string;
  token: string;
  /** The pod's egress proxy credential (common/egress-proxy.ts), when there is an egress key. */
  egressProxy?: string | undefined;
  env: Record<string, string>;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  owner?: V1OwnerReference;
}): V1Secret {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    type: 'Opaque',
    metadata: {
      name: p.name,
      namespace: p.namespace,
      labels: { [LABELS.box]: 'true', [LABELS.managedBy]: MANAGED_BY, [LABELS.component]: p.component, [LABELS.pool]: p.poolName, ...p.labels },
      ...(p.annotations ? { annotations: p.annotations } : {}),
      ...(p.owner ? { ownerReferences: [p.owner] } : {}),
    },
    data: {
      [BOX_SECRET_KEYS.token]: base64(p.token),
      [BOX_SECRET_KEYS.env]: base64(JSON.stringify(p.env)),
      // Not projected into the pod's secret volume: it reaches the box only as SANDBOX_EGRESS_CREDENTIAL.
      ...(p.egressProxy ? { [EGRESS_PROXY_KEY]: base64(p.egressProxy) } : {}),
    },
  };
}

function base64(text: string): string {
  return Buffer.from(text, 'utf8').toString('base64');
}

/**
 * What a sleeping box's record keeps of it (annotation sandbox-bridge.io/sleep-box): the shape
 * its pod is made again with, and its times (the TTL counts on while it sleeps).
 */
export interface SleptBox {
  image: string;
  cpu: string;
  memory: string;
  runtimeClassName?: string;
  serviceAccountName?: string;
  createdAt: string;
  expiresAt: string;
  ttlSeconds: number;
  sleptAt: string;
  /** The pool seat the box holds while it sleeps (its seat Secret stays, owned by the record). */
  seat?: number;
}

export function sleptBoxOf(record: V1Secret | undefined): SleptBox | undefined {
  const raw = record?.metadata?.annotations?.[ANNOTATIONS.sleepBox];
  if (!raw) return undefined;
  try {
    return JSON.parse(raw) as SleptBox;
  } catch {
    return undefined;
  }
}

/** What of a box pod its record keeps while the box sleeps. */
export function sleptBoxFromPod(pod: V1Pod, now: Date, defaultTtlSeconds: number): SleptBox {
  const c = pod.spec?.containers.find((x) => x.name === BOX_CONTAINER) ?? pod.spec?.containers[0];
  const a = pod.metadata?.annotations ?? {};
  const created = a[ANNOTATIONS.createdAt] ?? pod.metadata?.creationTimestamp;
  const seat = Number(pod.metadata?.labels?.[LABELS.seat]);
  const ttl = Number(a[ANNOTATIONS.ttlSeconds]);
  return {
    image: c?.image ?? '',
    cpu: String(c?.resources?.limits?.cpu ?? ''),
    memory: String(c?.resources?.limits?.memory ?? ''),
    ...(pod.spec?.runtimeClassName ? { runtimeClassName: pod.spec.runtimeClassName } : {}),
    // The API server names `default` for a pod that names none: that is no request of the box's.
    ...(pod.spec?.serviceAccountName && pod.spec.serviceAccountName !== 'default' ? { serviceAccountName: pod.spec.serviceAccountName } : {}),
    createdAt: created ? new Date(created).toISOString() : now.toISOString(),
    expiresAt: a[ANNOTATIONS.expiresAt] ?? '',
    ttlSeconds: Number.isFinite(ttl) && ttl > 0 ? ttl : defaultTtlSeconds,
    sleptAt: now.toISOString(),
    ...(Number.isInteger(seat) && pod.metadata?.labels?.[LABELS.seat] !== undefined ? { seat } : {}),
  };
}

/** The shape a slept box's pod is made again with. */
export function shapeOfSlept(slept: SleptBox): BoxShape {
  return {
    image: slept.image,
    cpuCores: parseQuantity(slept.cpu),
    memoryBytes: parseQuantity(slept.memory),
    runtimeClassName: slept.runtimeClassName,
    serviceAccountName: slept.serviceAccountName,
  };
}
