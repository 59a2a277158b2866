import type { V1Pod } from '@kubernetes/client-node';
import { ANNOTATIONS } from '../../common/labels.js';
import { deletedStep, goneStep, leftoverStep, podAddress, podlessStep, probeTimeoutMs } from './box-connector.js';

describe('a call to a box without a pod (docs/lifecycle.md)', () => {
  test('Sleeping -> Waking only for a call that may wake it (boxes:write)', () => {
    expect(podlessStep('asleep', true)).toBe('wake');
    expect(podlessStep('asleep', false)).toBe('refuse');
  });
  test('Waking: a wake under way is joined (or taken over once its lease runs out) by waking', () => {
    expect(podlessStep('waking', true)).toBe('wake');
    expect(podlessStep('waking', false)).toBe('refuse');
  });
  test('a sleep about to finish (its pod gone, its record not yet asleep) is waited for', () => {
    expect(podlessStep('pending', true)).toBe('wait');
    expect(podlessStep('pending', false)).toBe('refuse');
  });
  test('Failed is final, whoever asks', () => {
    expect(podlessStep('failed', true)).toBe('failed');
    expect(podlessStep('failed', false)).toBe('failed');
  });
});

describe('a call whose boxd stopped accepting connections', () => {
  test('a sleep took the pod while this replica\'s watch lagged: wake the box (or wait for the sleep)', () => {
    expect(goneStep('asleep', false)).toBe('wake');
    expect(goneStep('waking', true)).toBe('wake');
    expect(goneStep('failed', false)).toBe('wake'); // answered as Failed by the wake step
    expect(goneStep('pending', false)).toBe('wait');
  });
  test('a plain running box: its boxd gets one while to come back, then the call fails', () => {
    expect(goneStep(undefined, false)).toBe('retry');
    expect(goneStep(undefined, true)).toBe('fail');
  });
});

describe('a call whose pod was deleted while it ran (test/chaos/)', () => {
  test('a sleep took it (the call\'s activity write lost the race with the guarded delete, or a lagging watch): wake the box, or wait for the sleep', () => {
    expect(deletedStep('pending', true, false)).toBe('wait');
    expect(deletedStep('asleep', true, false)).toBe('wake');
    expect(deletedStep('waking', true, true)).toBe('wake');
    expect(deletedStep('failed', true, false)).toBe('wake'); // answered as Failed by the wake step
  });
  test('the box was deleted, or the pod of a plain running box: the 404 it is', () => {
    expect(deletedStep(undefined, false, false)).toBe('fail');
    expect(deletedStep('asleep', false, false)).toBe('fail');
    expect(deletedStep(undefined, true, false)).toBe('fail');
  });
});

describe('where a box is reached (podAddress)', () => {
  const CALICO = 'cni.projectcalico.org/podIP';
  const pod = (podIP: string | undefined, annotation?: string, phase = 'Pending'): V1Pod => ({
    metadata: { name: 'box-a', annotations: annotation === undefined ? {} : { [CALICO]: annotation } },
    status: { phase, ...(podIP ? { podIP } : {}) },
  });
  test('status.podIP when the kubelet reported it, whatever the annotation says', () => {
    expect(podAddress(pod('10.244.0.7', '10.244.0.9/32'), CALICO)).toBe('10.244.0.7');
  });
  test('before that, the address the CNI plugin annotated (its prefix length dropped; IPv6 too)', () => {
    expect(podAddress(pod(undefined, '10.244.0.9/32'), CALICO)).toBe('10.244.0.9');
    expect(podAddress(pod(undefined, 'fd00::9/128'), CALICO)).toBe('fd00::9');
    expect(podAddress(pod(undefined, '10.244.0.9'), CALICO)).toBe('10.244.0.9');
  });
  test('nothing without the setting, without the annotation, from a bad value, or from a pod that ended', () => {
    expect(podAddress(pod(undefined, '10.244.0.9/32'))).toBeUndefined();
    expect(podAddress(pod(undefined), CALICO)).toBeUndefined();
    expect(podAddress(pod(undefined, 'box-b.example/32'), CALICO)).toBeUndefined();
    expect(podAddress(pod(undefined, ''), CALICO)).toBeUndefined();
    expect(podAddress(pod(undefined, '10.244.0.9/32', 'Failed'), CALICO)).toBeUndefined();
  });
});

describe('probes of a new pod (probeTimeoutMs)', () => {
  test('the first give up soon, so a SYN dropped while the pod\'s network is set up is not waited on for the kernel\'s 1 s resend', () => {
    expect(probeTimeoutMs(0)).toBeLessThanOrEqual(200);
    expect(probeTimeoutMs(0) + probeTimeoutMs(1)).toBeLessThan(1000); // two fresh SYNs within the first second
  });
  test('later ones wait longer, up to 2 s, for a boxd slow to answer', () => {
    for (let n = 1; n < 10; n++) expect(probeTimeoutMs(n)).toBeGreaterThanOrEqual(probeTimeoutMs(n - 1));
    expect(probeTimeoutMs(4)).toBeGreaterThanOrEqual(2000);
    expect(probeTimeoutMs(30)).toBe(2000);
  });
});

describe("a wake's leftover pods (leftoverStep): what a waker that stopped left", () => {
  const pod = (o: { restoring?: boolean; deleting?: boolean } = {}): V1Pod => ({
    metadata: {
      annotations: o.restoring ? { [ANNOTATIONS.restoring]: 'true' } : {},
      ...(o.deleting ? { deletionTimestamp: new Date('2026-11-27T10:00:05Z') } : {}),
    },
  });
  test('committed: the box is awake, its pod (and the writes it acknowledged) kept', () => {
    expect(leftoverStep(pod())).toBe('awake');
  });
  test('still restoring: a half-restored workspace, deleted', () => {
    expect(leftoverStep(pod({ restoring: true }))).toBe('delete');
  });
  test('being deleted (the pod the box slept from, or a restoring one already going): left alone', () => {
    expect(leftoverStep(pod({ deleting: true }))).toBe('none');
    expect(leftoverStep(pod({ deleting: true, restoring: true }))).toBe('none');
  });
});
