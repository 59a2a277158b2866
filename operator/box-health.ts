// What went wrong with a box, read from its pod as the watch delivers it (pure). Each failure has
// a key that names its occurrence (the container instance that died, the image that cannot be
// pulled), so seeing the same pod again, after a relist or on another replica, yields the same
// keys and nothing is reported twice.
import type * as k8s from '@kubernetes/client-node';

export const FAILURE_REASONS = ['oom_killed', 'crashed', 'image_pull_failed', 'stuck_pending', 'evicted'] as const;
export type FailureReason = (typeof FAILURE_REASONS)[number];

/** The Kubernetes Event reason of each failure. */
export const EVENT_REASONS: Record<FailureReason, string> = {
  oom_killed: 'BoxOOMKilled',
  crashed: 'BoxCrashed',
  image_pull_failed: 'BoxImagePullFailed',
  stuck_pending: 'BoxStuckPending',
  evicted: 'BoxEvicted',
};

export interface BoxFailure {
  reason: FailureReason;
  /** Unique per occurrence within the pod. */
  key: string;
  container?: string;
  message: string;
}

const IMAGE_PULL_REASONS = new Set(['ErrImagePull', 'ImagePullBackOff', 'ErrImageNeverPull', 'InvalidImageName']);
/** DisruptionTarget reasons that mean the pod was pushed off its node, not deleted by its owner. */
const EVICTION_REASONS = new Set(['EvictionByEvictionAPI', 'PreemptionByScheduler', 'DeletionByTaintManager', 'TerminationByKubelet']);

/** Failures visible in the pod now (not stuck Pending: that needs time, see pendingSince). */
export function failuresOf(pod: k8s.V1Pod): BoxFailure[] {
  const failures: BoxFailure[] = [];
  const status = pod.status;
  const deleting = Boolean(pod.metadata?.deletionTimestamp);
  const evicted = evictionOf(pod);
  if (evicted) failures.push(evicted);

  for (const c of [...(status?.initContainerStatuses ?? []), ...(status?.containerStatuses ?? [])]) {
    const terminations: Array<[k8s.V1ContainerStateTerminated, boolean]> = [];
    if (c.lastState?.terminated) terminations.push([c.lastState.terminated, false]);
    if (c.state?.terminated) terminations.push([c.state.terminated, true]);
    for (const [t, current] of terminations) {
      const instance = t.containerID || `${c.restartCount ?? 0}-${String(t.finishedAt ?? '')}`;
      if (t.reason === 'OOMKilled') {
        failures.push({
          reason: 'oom_killed',
          key: `oom_killed/${c.name}/${instance}`,
          container: c.name,
          message: `container ${c.name} was OOMKilled: it used more than its memory limit (exit code ${t.exitCode})`,
        });
      } else if (t.exitCode !== 0 && !(current && (deleting || evicted)) && t.reason !== 'ContainerStatusUnknown') {
        // A container stopped because its pod is being deleted or evicted has not crashed; nor
        // has one the kubelet lost track of (it reports exit 137, ContainerStatusUnknown, e.g.
        // for a container gone when its evicted pod was deleted).
        failures.push({
          reason: 'crashed',
          key: `crashed/${c.name}/${instance}`,
          container: c.name,
          message: `container ${c.name} exited with code ${t.exitCode}${t.reason ? ` (${t.reason})` : ''}${t.message ? `: ${t.message}` : ''}${c.restartCount ? `; restarts: ${c.restartCount}` : ''}`,
        });
      }
    }
    const waiting = c.state?.waiting;
    if (waiting?.reason && IMAGE_PULL_REASONS.has(waiting.reason)) {
      failures.push({
        reason: 'image_pull_failed',
        key: `image_pull_failed/${c.name}/${c.image}`,
        container: c.name,
        message: `image ${c.image} of container ${c.name} cannot be pulled (${waiting.reason})${waiting.message ? `: ${waiting.message}` : ''}`,
      });
    }
  }
  return failures;
}

function evictionOf(pod: k8s.V1Pod): BoxFailure | undefined {
  const status = pod.status;
  if (status?.reason === 'Evicted') {
    return { reason: 'evicted', key: 'evicted', message: `evicted by its node${status.message ? `: ${status.message}` : ''}` };
  }
  const disruption = status?.conditions?.find((c) => c.type === 'DisruptionTarget' && c.status === 'True');
  if (disruption?.reason && EVICTION_REASONS.has(disruption.reason)) {
    return { reason: 'evicted', key: 'evicted', message: `evicted (${disruption.reason})${disruption.message ? `: ${disruption.message}` : ''}` };
  }
  return undefined;
}

/**
 * When a pod started waiting to run (its creation), if it is Pending and not being deleted; the
 * caller reports it once it has waited longer than the threshold.
 */
export function pendingSince(pod: k8s.V1Pod): number | undefined {
  if (pod.status?.phase !== 'Pending' || pod.metadata?.deletionTimestamp) return undefined;
  const created = pod.metadata?.creationTimestamp;
  return created ? new Date(created).getTime() : undefined;
}

/** Why a pod is still Pending, in a line: not scheduled (the scheduler's message) or a container waiting. */
export function pendingReason(pod: k8s.V1Pod): string {
  const unscheduled = pod.status?.conditions?.find((c) => c.type === 'PodScheduled' && c.status === 'False');
  if (unscheduled) return `not scheduled: ${unscheduled.message ?? unscheduled.reason ?? 'no reason given'}`;
  const waiting = [...(pod.status?.initContainerStatuses ?? []), ...(pod.status?.containerStatuses ?? [])].find((c) => c.state?.waiting);
  if (waiting?.state?.waiting) return `container ${waiting.name} waiting: ${waiting.state.waiting.reason ?? ''}${waiting.state.waiting.message ? ` (${waiting.state.waiting.message})` : ''}`;
  return pod.spec?.nodeName ? `scheduled on ${pod.spec.nodeName}, not started` : 'not scheduled yet';
}
