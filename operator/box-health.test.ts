import type * as k8s from '@kubernetes/client-node';
import { failuresOf, pendingReason, pendingSince } from './box-health.js';

function pod(status: k8s.V1PodStatus, meta: Partial<k8s.V1ObjectMeta> = {}): k8s.V1Pod {
  return { metadata: { name: 'box-1', namespace: 'ns', uid: 'u1', creationTimestamp: new Date('2026-01-01T00:00:00Z'), ...meta }, spec: { containers: [] }, status };
}
const terminated = (t: Partial<k8s.V1ContainerStateTerminated>): k8s.V1ContainerState => ({ terminated: { exitCode: 1, ...t } as k8s.V1ContainerStateTerminated });
const container = (c: Partial<k8s.V1ContainerStatus>): k8s.V1ContainerStatus =>
  ({ name: 'box', image: 'img:1', imageID: '', ready: false, restartCount: 0, ...c }) as k8s.V1ContainerStatus;

test('OOMKilled, per container instance', () => {
  const f = failuresOf(pod({ phase: 'Failed', containerStatuses: [container({ state: terminated({ reason: 'OOMKilled', exitCode: 137, containerID: 'c://1' }) })] }));
  expect(f).toEqual([{ reason: 'oom_killed', key: 'oom_killed/box/c://1', container: 'box', message: expect.stringContaining('OOMKilled') }]);
});

test('a crash, and each restart of a crash-looping container, once per instance', () => {
  const first = failuresOf(pod({ containerStatuses: [container({ state: terminated({ exitCode: 3, reason: 'Error', containerID: 'c://1' }) })] }));
  expect(first).toEqual([{ reason: 'crashed', key: 'crashed/box/c://1', container: 'box', message: 'container box exited with code 3 (Error)' }]);
  const looping = failuresOf(
    pod({
      containerStatuses: [container({ restartCount: 2, state: { waiting: { reason: 'CrashLoopBackOff' } }, lastState: terminated({ exitCode: 1, containerID: 'c://2' }) })],
    }),
  );
  expect(looping.map((f) => f.key)).toEqual(['crashed/box/c://2']);
  expect(looping[0]!.message).toContain('restarts: 2');
});

test('containers stopped by deletion or eviction have not crashed; exit 0 is no failure', () => {
  const stopped = container({ state: terminated({ exitCode: 143, containerID: 'c://1' }) });
  expect(failuresOf(pod({ containerStatuses: [stopped] }, { deletionTimestamp: new Date() }))).toEqual([]);
  expect(failuresOf(pod({ containerStatuses: [container({ state: terminated({ exitCode: 0 }) })] }))).toEqual([]);
  const evicted = failuresOf(pod({ phase: 'Failed', reason: 'Evicted', message: 'Usage of EmptyDir volume "tmp" exceeds the limit "64Mi".', containerStatuses: [stopped] }));
  expect(evicted).toEqual([{ reason: 'evicted', key: 'evicted', message: 'evicted by its node: Usage of EmptyDir volume "tmp" exceeds the limit "64Mi".' }]);
});

test('a container the kubelet lost track of (ContainerStatusUnknown) has not crashed', () => {
  const lost = terminated({ exitCode: 137, reason: 'ContainerStatusUnknown', message: 'The container could not be located when the pod was deleted.' });
  expect(failuresOf(pod({ containerStatuses: [container({ restartCount: 1, lastState: lost })] }))).toEqual([]);
  expect(failuresOf(pod({ containerStatuses: [container({ state: lost })] }))).toEqual([]);
});

test('evictions through the API, preemption and taints, from the DisruptionTarget condition', () => {
  const byApi = failuresOf(pod({ conditions: [{ type: 'DisruptionTarget', status: 'True', reason: 'EvictionByEvictionAPI', message: 'Eviction API: evicting' }] }, { deletionTimestamp: new Date() }));
  expect(byApi).toEqual([{ reason: 'evicted', key: 'evicted', message: 'evicted (EvictionByEvictionAPI): Eviction API: evicting' }]);
  expect(failuresOf(pod({ conditions: [{ type: 'DisruptionTarget', status: 'True', reason: 'SomethingElse' }] }))).toEqual([]);
});

test('image pull failures, once per container and image', () => {
  for (const reason of ['ErrImagePull', 'ImagePullBackOff', 'ErrImageNeverPull']) {
    const f = failuresOf(pod({ phase: 'Pending', containerStatuses: [container({ image: 'nope:1', state: { waiting: { reason, message: 'no such image' } } })] }));
    expect(f).toEqual([{ reason: 'image_pull_failed', key: 'image_pull_failed/box/nope:1', container: 'box', message: `image nope:1 of container box cannot be pulled (${reason}): no such image` }]);
  }
});

test('Pending: since creation, with the scheduler\'s reason; not when deleting or running', () => {
  const pending = pod({ phase: 'Pending', conditions: [{ type: 'PodScheduled', status: 'False', reason: 'Unschedulable', message: '0/3 nodes are available' }] });
  expect(pendingSince(pending)).toBe(Date.parse('2026-01-01T00:00:00Z'));
  expect(pendingReason(pending)).toBe('not scheduled: 0/3 nodes are available');
  expect(pendingSince(pod({ phase: 'Running' }))).toBeUndefined();
  expect(pendingSince(pod({ phase: 'Pending' }, { deletionTimestamp: new Date() }))).toBeUndefined();
});
