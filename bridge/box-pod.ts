// Box pods: the pod spec a box gets (pure; every security default lives here) and how a pod
// is reported back through the API.
import type { V1Pod } from '@kubernetes/client-node';
import { ANNOTATIONS, LABELS, MANAGED_BY, sessionHash } from '../common/labels.js';
import type { BoxPolicy } from '../common/pool.js';
import { formatCpu, formatMemory } from '../common/quantity.js';

export const BOX_CONTAINER = 'box';
export const WORKSPACE = '/workspace';

/**
 * PID 1 of a box: sleeps forever, and exits at once on SIGTERM so deleting a box does not
 * wait out the grace period. Needs only a POSIX shell and sleep in the image.
 */
export const BOX_MAIN = ['sh', '-c', 'trap "exit 0" TERM INT; while :; do sleep 3600 & wait $!; done'];

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
  runtimeClassName?: string;
  serviceAccountName?: string;
}

export function buildBoxPod(p: BoxPodParams): V1Pod {
  const cpu = formatCpu(p.cpuCores);
  const memory = formatMemory(p.memoryBytes);
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
      },
      annotations: {
        [ANNOTATIONS.sessionId]: p.sessionId,
        [ANNOTATIONS.expiresAt]: expiresAt.toISOString().replace(/\.\d{3}Z$/, 'Z'),
        [ANNOTATIONS.ttlSeconds]: String(p.ttlSeconds),
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
      containers: [
        {
          name: BOX_CONTAINER,
          image: p.image,
          imagePullPolicy: 'IfNotPresent',
          command: BOX_MAIN,
          workingDir: WORKSPACE,
          env: [{ name: 'HOME', value: WORKSPACE }],
          resources: { requests: { cpu, memory }, limits: { cpu, memory } },
          securityContext: {
            allowPrivilegeEscalation: false,
            readOnlyRootFilesystem: true,
            runAsNonRoot: true,
            capabilities: { drop: ['ALL'] },
          },
          volumeMounts: [
            { name: 'workspace', mountPath: WORKSPACE },
            { name: 'tmp', mountPath: '/tmp' },
          ],
        },
      ],
      volumes: [
        { name: 'workspace', emptyDir: { sizeLimit: p.box.workspaceSizeLimit } },
        { name: 'tmp', emptyDir: { sizeLimit: p.box.tmpSizeLimit } },
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
