// How a box is reported back through the API: its status and list line, from its pod or, without one, its record (the pod spec itself: common/box-pod.ts).
import type { V1Pod, V1Secret } from '@kubernetes/client-node';
import { stateOf } from '../common/box-lease.js';
import { BOX_CONTAINER, sleptBoxOf } from '../common/box-pod.js';
import { ANNOTATIONS, LABELS } from '../common/labels.js';

export { BOX_CONTAINER, BOXD_INSTALL_CONTAINER, WORKSPACE, sleptBoxOf, type SleptBox } from '../common/box-pod.js';

export type BoxState = 'Pending' | 'Running' | 'Sleeping' | 'Failed' | 'Terminated';

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

/** When the box was made: its pod's creation, or the claim that made a warm pod a session's box. */
export function boxCreated(pod: V1Pod): Date | string | undefined {
  return pod.metadata?.annotations?.[ANNOTATIONS.createdAt] ?? pod.metadata?.creationTimestamp;
}

/** The box id of a session's box pod (its label), or undefined for a warm pod. */
export function boxIdOf(pod: V1Pod): string | undefined {
  return pod.metadata?.labels?.[LABELS.boxId];
}

function ageSeconds(pod: V1Pod, now: Date): number {
  const created = boxCreated(pod);
  if (!created) return 0;
  return Math.max(0, Math.floor((now.getTime() - new Date(created).getTime()) / 1000));
}

function container(pod: V1Pod) {
  return pod.spec?.containers.find((c) => c.name === BOX_CONTAINER) ?? pod.spec?.containers[0];
}

export function boxStatus(pod: V1Pod, now = new Date()) {
  const c = container(pod);
  return {
    box_id: boxIdOf(pod) ?? pod.metadata?.name ?? '',
    pod_name: pod.metadata?.name ?? '',
    namespace: pod.metadata?.namespace ?? '',
    session_id: pod.metadata?.annotations?.[ANNOTATIONS.sessionId] ?? '',
    status: boxState(pod),
    phase: pod.status?.phase ?? 'Pending',
    node: pod.spec?.nodeName ?? '',
    image: c?.image ?? '',
    cpu: String(c?.resources?.limits?.cpu ?? ''),
    memory: String(c?.resources?.limits?.memory ?? ''),
    created_at: iso(boxCreated(pod)),
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
  return summaryOf(s, s.pod_name);
}

/** A box's line in GET /sandboxes: part of its status, named by its pod (a sleeping box: its id). */
function summaryOf(s: ReturnType<typeof boxStatus> | ReturnType<typeof sleepingStatus>, name: string) {
  return {
    name,
    box_id: s.box_id,
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

/** The status of a box that has no pod now (docs/lifecycle.md): asleep, being woken, or failed. */
export function podlessStatus(record: V1Secret): 'Sleeping' | 'Pending' | 'Failed' {
  const state = stateOf(record);
  return state === 'failed' ? 'Failed' : state === 'waking' ? 'Pending' : 'Sleeping';
}

/** GET /boxes/{id}/status of a box without a pod: no pod fields. */
export function sleepingStatus(record: V1Secret, now = new Date()) {
  const slept = sleptBoxOf(record);
  const created = slept?.createdAt ?? iso(record.metadata?.creationTimestamp);
  return {
    box_id: record.metadata?.name ?? '',
    pod_name: '',
    namespace: record.metadata?.namespace ?? '',
    session_id: record.metadata?.annotations?.[ANNOTATIONS.sessionId] ?? '',
    status: podlessStatus(record),
    phase: '',
    node: '',
    image: slept?.image ?? '',
    cpu: slept?.cpu ?? '',
    memory: slept?.memory ?? '',
    created_at: created,
    expires_at: slept?.expiresAt ?? '',
    age_seconds: created ? Math.max(0, Math.floor((now.getTime() - Date.parse(created)) / 1000)) : 0,
    restarts: 0,
    host_ip: '',
    pod_ip: '',
    conditions: [],
    snapshot_id: record.metadata?.annotations?.[ANNOTATIONS.sleepSnapshot] ?? '',
    ...(stateOf(record) === 'failed' ? { failure: record.metadata?.annotations?.[ANNOTATIONS.failure] ?? 'unknown' } : {}),
  };
}

export function sleepingSummary(record: V1Secret, now = new Date()) {
  const s = sleepingStatus(record, now);
  return summaryOf(s, s.box_id);
}
