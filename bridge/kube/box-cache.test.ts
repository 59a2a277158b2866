// trimPod keeps everything the bridge reads from a cached box (pure logic on pod objects).
import type * as k8s from '@kubernetes/client-node';
import { boxState, boxStatus, sandboxSummary } from '../box-view.js';
import { BoxStartTimeoutError, trimPod } from './box-cache.js';

function fullPod(overrides: { waiting?: boolean; deleting?: boolean } = {}): k8s.V1Pod {
  const created = new Date('2026-01-01T00:00:00Z');
  return {
    metadata: {
      name: 'box-abc-0',
      namespace: 'sandboxes',
      uid: 'uid-1',
      resourceVersion: '42',
      generation: 1,
      creationTimestamp: created,
      ...(overrides.deleting ? { deletionTimestamp: new Date('2026-01-01T00:10:00Z') } : {}),
      labels: { 'sandbox-bridge.io/box': 'true', 'sandbox-bridge.io/session': 'abc' },
      annotations: { 'sandbox-bridge.io/session-id': 's1', 'sandbox-bridge.io/expires-at': '2026-01-01T01:00:00Z' },
      managedFields: [{ manager: 'bridge', operation: 'Update', fieldsV1: { 'f:spec': {} } }],
    },
    spec: {
      nodeName: 'node-7',
      restartPolicy: 'Never',
      automountServiceAccountToken: false,
      securityContext: { runAsNonRoot: true, runAsUser: 65534 },
      volumes: [{ name: 'workspace', emptyDir: {} }],
      containers: [
        {
          name: 'box',
          image: 'box:1',
          command: ['sleep', 'infinity'],
          resources: { limits: { cpu: '500m', memory: '256Mi' }, requests: { cpu: '500m', memory: '256Mi' } },
          volumeMounts: [{ name: 'workspace', mountPath: '/workspace' }],
        },
      ],
    },
    status: {
      phase: overrides.waiting ? 'Pending' : 'Running',
      hostIP: '10.0.0.1',
      hostIPs: [{ ip: '10.0.0.1' }],
      podIP: '10.1.0.5',
      podIPs: [{ ip: '10.1.0.5' }],
      qosClass: 'Guaranteed',
      startTime: created,
      conditions: [
        { type: 'PodScheduled', status: 'True', lastTransitionTime: created },
        { type: 'Ready', status: overrides.waiting ? 'False' : 'True', reason: overrides.waiting ? 'ContainersNotReady' : undefined, lastTransitionTime: created },
      ],
      containerStatuses: [
        {
          name: 'box',
          image: 'box:1',
          imageID: 'sha256:abc',
          containerID: 'containerd://abc',
          ready: !overrides.waiting,
          restartCount: 2,
          started: !overrides.waiting,
          state: overrides.waiting
            ? { waiting: { reason: 'ImagePullBackOff', message: 'cannot pull box:1' } }
            : { running: { startedAt: created } },
          lastState: { terminated: { exitCode: 137, reason: 'OOMKilled', startedAt: created, finishedAt: created } },
        },
      ],
    },
  };
}

describe('trimPod', () => {
  const now = new Date('2026-01-01T00:05:00Z');

  it.each([
    ['running', {}],
    ['waiting', { waiting: true }],
    ['deleting', { deleting: true }],
  ])('keeps what status, summaries and states are made of (%s)', (_case, overrides) => {
    const pod = fullPod(overrides);
    const before = { status: boxStatus(pod, now), summary: sandboxSummary(pod, now), state: boxState(pod) };
    trimPod(pod);
    expect({ status: boxStatus(pod, now), summary: sandboxSummary(pod, now), state: boxState(pod) }).toEqual(before);
  });

  it('keeps what explains a box that does not start', () => {
    const pod = fullPod({ waiting: true });
    const message = new BoxStartTimeoutError('box-abc-0', pod).message;
    trimPod(pod);
    expect(new BoxStartTimeoutError('box-abc-0', pod).message).toBe(message);
    expect(message).toContain('ImagePullBackOff: cannot pull box:1');
  });

  it('keeps the identity the informer and the env Secret owner need, and drops the bulk', () => {
    const pod = fullPod();
    trimPod(pod);
    expect(pod.metadata).toMatchObject({ name: 'box-abc-0', namespace: 'sandboxes', uid: 'uid-1', resourceVersion: '42' });
    expect(pod.metadata?.managedFields).toBeUndefined();
    expect(pod.spec?.volumes).toBeUndefined();
    expect(pod.status?.podIPs).toBeUndefined();
    expect(JSON.stringify(pod).length).toBeLessThan(JSON.stringify(fullPod()).length / 2);
  });
});
