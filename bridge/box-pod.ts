// Box pods: the pod spec a box gets (pure; every security default lives here) and how a pod
// is reported back through the API.
import type { V1Pod, V1SecurityContext } from '@kubernetes/client-node';
import { BOXD_BINARY, BOXD_BIN_DIR, BOXD_PORT, BOXD_PROTOCOL_VERSION, BOXD_SECRET_DIR, BOXD_VERSION_ANNOTATION, BOX_SECRET_KEYS } from '../common/boxd.js';
import { ANNOTATIONS, LABELS, MANAGED_BY, boxSecretName, sessionHash } from '../common/labels.js';
import type { BoxPolicy } from '../common/pool.js';
import { formatCpu, formatMemory } from '../common/quantity.js';

export const BOX_CONTAINER = 'box';
export const BOXD_INSTALL_CONTAINER = 'boxd-install';
export const WORKSPACE = '/workspace';

/** Every container of a box: the restricted Pod Security profile, read-only root. */
const LOCKED_DOWN: V1SecurityContext = {
  allowPrivilegeEscalation: false,
  readOnlyRootFilesystem: true,
  runAsNonRoot: true,
  capabilities: { drop: ['ALL'] },
};

export interface BoxPodParams {
  name: string;
  namespace: string;
  poolName: string;
  sessionId: string;
  slot: number;
  image: string;
  cpuCores: number;
  memoryBytes: number;
  ttlSeconds: number;
  now: Date;
  box: BoxPolicy;
  /** The image whose /boxd the init container installs (a static binary, see boxd/). */
  boxdImage: string;
  runtimeClassName?: string;
  serviceAccountName?: string;
  /** Digest of the create request's Idempotency-Key (a label, so a retry finds the box). */
  idempotencyKey?: string;
}

/**
 * A box: boxd (installed by an init container into an emptyDir) runs as PID 1 of the box
 * container in the user's image, as the box user. The box's Secret reaches it as two files
 * (credential and env); nothing secret is in the pod spec.
 */
export function buildBoxPod(p: BoxPodParams): V1Pod {
  const cpu = formatCpu(p.cpuCores);
  const memory = formatMemory(p.memoryBytes);
  // The init container gets the box's own resources, so it changes neither scheduling nor quota.
  const resources = { requests: { cpu, memory }, limits: { cpu, memory } };
  const expiresAt = new Date(p.now.getTime() + p.ttlSeconds * 1000);
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name: p.name,
      namespace: p.namespace,
      labels: {
        [LABELS.box]: 'true',
        [LABELS.pool]: p.poolName,
        [LABELS.session]: sessionHash(p.sessionId),
        [LABELS.slot]: String(p.slot),
        [LABELS.managedBy]: MANAGED_BY,
        [LABELS.component]: 'box',
        ...(p.idempotencyKey ? { [LABELS.idempotencyKey]: p.idempotencyKey } : {}),
      },
      annotations: {
        [ANNOTATIONS.sessionId]: p.sessionId,
        [ANNOTATIONS.expiresAt]: expiresAt.toISOString().replace(/\.\d{3}Z$/, 'Z'),
        [ANNOTATIONS.ttlSeconds]: String(p.ttlSeconds),
        [BOXD_VERSION_ANNOTATION]: BOXD_PROTOCOL_VERSION,
      },
    },
    spec: {
      restartPolicy: 'Never',
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      terminationGracePeriodSeconds: 5,
      ...(p.runtimeClassName ? { runtimeClassName: p.runtimeClassName } : {}),
      ...(p.serviceAccountName ? { serviceAccountName: p.serviceAccountName } : {}),
      ...(p.box.nodeSelector ? { nodeSelector: p.box.nodeSelector } : {}),
      ...(p.box.tolerations ? { tolerations: p.box.tolerations } : {}),
      securityContext: {
        runAsNonRoot: true,
        runAsUser: 65534,
        runAsGroup: 65534,
        fsGroup: 65534,
        seccompProfile: { type: 'RuntimeDefault' },
      },
      initContainers: [
        {
          name: BOXD_INSTALL_CONTAINER,
          image: p.boxdImage,
          imagePullPolicy: 'IfNotPresent',
          args: ['install', BOXD_BINARY],
          resources,
          securityContext: LOCKED_DOWN,
          volumeMounts: [{ name: 'boxd', mountPath: BOXD_BIN_DIR }],
        },
      ],
      containers: [
        {
          name: BOX_CONTAINER,
          image: p.image,
          imagePullPolicy: 'IfNotPresent',
          command: [BOXD_BINARY, 'serve'],
          workingDir: WORKSPACE,
          env: [{ name: 'HOME', value: WORKSPACE }],
          ports: [{ name: 'boxd', containerPort: BOXD_PORT, protocol: 'TCP' }],
          resources,
          securityContext: LOCKED_DOWN,
          volumeMounts: [
            { name: 'workspace', mountPath: WORKSPACE },
            { name: 'tmp', mountPath: '/tmp' },
            { name: 'boxd', mountPath: BOXD_BIN_DIR, readOnly: true },
            { name: 'box-secret', mountPath: BOXD_SECRET_DIR, readOnly: true },
          ],
        },
      ],
      volumes: [
        { name: 'workspace', emptyDir: { sizeLimit: p.box.workspaceSizeLimit } },
        { name: 'tmp', emptyDir: { sizeLimit: p.box.tmpSizeLimit } },
        { name: 'boxd', emptyDir: { sizeLimit: '64Mi' } },
        {
          name: 'box-secret',
          secret: {
            secretName: boxSecretName(p.name),
            // Group-readable: the kubelet gives the files the pod's fsGroup (the box user's group).
            defaultMode: 0o440,
            items: [
              { key: BOX_SECRET_KEYS.token, path: BOX_SECRET_KEYS.token },
              { key: BOX_SECRET_KEYS.env, path: BOX_SECRET_KEYS.env },
            ],
          },
        },
      ],
    },
  };
}

export type BoxState = 'Pending' | 'Running' | 'Terminated';

/** The API's box status: Terminated once deleting or finished, Running once the container runs. */
export function boxState(pod: V1Pod): BoxState {
  const phase = pod.status?.phase;
  if (pod.metadata?.deletionTimestamp || phase === 'Succeeded' || phase === 'Failed') return 'Terminated';
  const running = pod.status?.containerStatuses?.some((c) => c.name === BOX_CONTAINER && c.state?.running);
  return phase === 'Running' && running !== false ? 'Running' : 'Pending';
}

function iso(date: Date | string | undefined): string {
  if (!date) return '';
  return (date instanceof Date ? date : new Date(date)).toISOString();
}

function ageSeconds(pod: V1Pod, now: Date): number {
  const created = pod.metadata?.creationTimestamp;
  if (!created) return 0;
  return Math.max(0, Math.floor((now.getTime() - new Date(created).getTime()) / 1000));
}

function container(pod: V1Pod) {
  return pod.spec?.containers.find((c) => c.name === BOX_CONTAINER) ?? pod.spec?.containers[0];
}

export function boxStatus(pod: V1Pod, now = new Date()) {
  const c = container(pod);
  return {
    box_id: pod.metadata?.name ?? '',
    pod_name: pod.metadata?.name ?? '',
    namespace: pod.metadata?.namespace ?? '',
    session_id: pod.metadata?.annotations?.[ANNOTATIONS.sessionId] ?? '',
    status: boxState(pod),
    phase: pod.status?.phase ?? 'Pending',
    node: pod.spec?.nodeName ?? '',
    image: c?.image ?? '',
    cpu: String(c?.resources?.limits?.cpu ?? ''),
    memory: String(c?.resources?.limits?.memory ?? ''),
    created_at: iso(pod.metadata?.creationTimestamp),
    expires_at: pod.metadata?.annotations?.[ANNOTATIONS.expiresAt] ?? '',
    age_seconds: ageSeconds(pod, now),
    restarts: (pod.status?.containerStatuses ?? []).reduce((n, s) => n + (s.restartCount ?? 0), 0),
    host_ip: pod.status?.hostIP ?? '',
    pod_ip: pod.status?.podIP ?? '',
    conditions: (pod.status?.conditions ?? []).map((cond) => ({ type: cond.type, status: cond.status })),
  };
}

export function sandboxSummary(pod: V1Pod, now = new Date()) {
  const s = boxStatus(pod, now);
  return {
    name: s.pod_name,
    namespace: s.namespace,
    status: s.status,
    node: s.node,
    image: s.image,
    created_at: s.created_at,
    age_seconds: s.age_seconds,
    session_id: s.session_id,
    cpu: s.cpu,
    memory: s.memory,
  };
}
