import type * as k8s from '@kubernetes/client-node';
import { expiryOf, planReaps } from './reaper.js';

const NOW = Date.parse('2030-01-01T12:00:00Z');

function pod(name: string, opts: { created?: string; expiresAt?: string; phase?: string; deleting?: boolean } = {}): k8s.V1Pod {
  return {
    metadata: {
      name,
      namespace: 'ns',
      uid: `uid-${name}`,
      creationTimestamp: new Date(opts.created ?? '2030-01-01T11:59:00Z'),
      annotations: opts.expiresAt ? { 'sandbox-bridge.io/expires-at': opts.expiresAt } : {},
      ...(opts.deleting ? { deletionTimestamp: new Date(NOW) } : {}),
    },
    status: { phase: opts.phase ?? 'Running' },
  };
}

function secret(name: string, ownerUid: string | undefined, created = '2030-01-01T11:00:00Z'): k8s.V1Secret {
  return {
    metadata: {
      name,
      namespace: 'ns',
      uid: `uid-${name}`,
      creationTimestamp: new Date(created),
      ...(ownerUid ? { ownerReferences: [{ apiVersion: 'v1', kind: 'Pod', name: 'x', uid: ownerUid }] } : {}),
    },
  };
}

const base = { defaultTtlSeconds: 3600, now: NOW, orphanGraceMs: 30_000, secrets: [] };

test('expiry comes from the annotation, else creation + default TTL', () => {
  expect(expiryOf(pod('a', { expiresAt: '2030-01-01T12:00:05Z' }), 3600)).toBe(NOW + 5000);
  expect(expiryOf(pod('b', { created: '2030-01-01T11:00:00Z' }), 60)).toBe(Date.parse('2030-01-01T11:01:00Z'));
  // A malformed annotation falls back to the pool default rather than keeping the box forever.
  expect(expiryOf(pod('c', { created: '2030-01-01T11:00:00Z', expiresAt: 'soon' }), 60)).toBe(Date.parse('2030-01-01T11:01:00Z'));
});

test('reaps expired, succeeded and failed boxes; the next expiry is the requeue time', () => {
  const plan = planReaps({
    ...base,
    pods: [
      pod('expired', { expiresAt: '2030-01-01T11:59:59Z' }),
      pod('exactly', { expiresAt: '2030-01-01T12:00:00Z' }),
      pod('later', { expiresAt: '2030-01-01T12:00:10Z' }),
      pod('soon', { expiresAt: '2030-01-01T12:00:03Z' }),
      pod('done', { phase: 'Succeeded', expiresAt: '2031-01-01T00:00:00Z' }),
      pod('crashed', { phase: 'Failed' }),
      pod('default-ttl-over', { created: '2030-01-01T10:00:00Z' }),
      pod('going', { deleting: true, expiresAt: '2030-01-01T11:00:00Z' }),
    ],
  });
  expect(plan.reaps.map((r) => [r.name, r.reason])).toEqual([
    ['expired', 'expired'],
    ['exactly', 'expired'],
    ['done', 'succeeded'],
    ['crashed', 'failed'],
    ['default-ttl-over', 'expired'],
  ]);
  expect(plan.active).toBe(2);
  expect(plan.nextDueAt).toBe(NOW + 3000);
});

test('deletes already sent are not sent again', () => {
  const plan = planReaps({ ...base, pods: [pod('x', { expiresAt: '2030-01-01T11:00:00Z' })], pending: new Set(['uid-x']) });
  expect(plan.reaps).toEqual([]);
  expect(plan.active).toBe(0);
});

test('box Secrets whose owner pod (by UID) is gone are orphans once past the grace period', () => {
  const plan = planReaps({
    ...base,
    pods: [pod('alive')],
    secrets: [
      secret('alive-secret', 'uid-alive'),
      secret('gone-secret', 'uid-gone'),
      // same name as a live box, but owned by its predecessor: an orphan, not the live box's
      secret('alive-secret-old', 'uid-alive-before'),
      secret('fresh-secret', 'uid-gone', '2030-01-01T11:59:50Z'),
      secret('no-owner', undefined),
    ],
  });
  expect(plan.reaps.map((r) => [r.kind, r.name, r.reason])).toEqual([
    ['Secret', 'gone-secret', 'orphaned_secret'],
    ['Secret', 'alive-secret-old', 'orphaned_secret'],
    ['Secret', 'no-owner', 'orphaned_secret'],
  ]);
  // The fresh one is due when its grace period ends.
  expect(plan.nextDueAt).toBe(Date.parse('2030-01-01T12:00:20Z'));
});

test('a record goes with its box; a record without a box pod goes after the grace period; warm pods are left to the warm pool', () => {
  const record = (name: string, created = '2030-01-01T11:00:00Z'): k8s.V1Secret => ({
    metadata: {
      name,
      namespace: 'ns',
      uid: `uid-${name}`,
      creationTimestamp: new Date(created),
      labels: { 'app.kubernetes.io/component': 'box-record' },
    },
  });
  const claimed = pod('box-warm-abc', { expiresAt: '2030-01-01T11:59:00Z' });
  claimed.metadata!.labels = { 'sandbox-bridge.io/box-id': 'box-s-0' };
  const warm = pod('box-warm-def', { created: '2020-01-01T00:00:00Z' });
  warm.metadata!.labels = { 'sandbox-bridge.io/warm': 'p' };
  const plan = planReaps({
    ...base,
    pods: [claimed, warm, pod('box-t-0')],
    secrets: [record('box-s-0'), record('box-t-0'), record('box-u-0'), record('box-v-0', '2030-01-01T11:59:50Z')],
  });
  expect(plan.reaps.map((r) => [r.kind, r.name, r.reason])).toEqual([
    ['Pod', 'box-warm-abc', 'expired'],
    ['Secret', 'box-s-0', 'box_record'],
    ['Secret', 'box-u-0', 'orphaned_record'],
  ]);
  expect(plan.active).toBe(1);
});

test("a record without a pod is a create in flight for as long as a create may take: a short grace for Secrets does not reap it", () => {
  const record = (name: string, created: string): k8s.V1Secret => ({
    metadata: { name, namespace: 'ns', uid: `uid-${name}`, creationTimestamp: new Date(created), labels: { 'app.kubernetes.io/component': 'box-record' } },
  });
  // NOW is 12:00:00; the grace for Secrets 1 s, as in the tests; a create may make its pod for 60 s.
  const plan = planReaps({ ...base, pods: [], orphanGraceMs: 1000, secrets: [record('box-slow-0', '2030-01-01T11:59:00Z'), record('box-old-0', '2030-01-01T11:57:59Z')] });
  expect(plan.reaps.map((r) => [r.name, r.reason])).toEqual([['box-old-0', 'orphaned_record']]);
  expect(plan.nextDueAt).toBe(Date.parse('2030-01-01T12:01:00Z'));
});

test('a sleeping box has no pod: its record is not an orphan, and goes when its TTL (counting on in the record) runs out', () => {
  const sleeping = (name: string, expiresAt: string): k8s.V1Secret => ({
    metadata: {
      name,
      namespace: 'ns',
      uid: `uid-${name}`,
      creationTimestamp: new Date('2030-01-01T10:00:00Z'),
      labels: { 'app.kubernetes.io/component': 'box-record', 'sandbox-bridge.io/sleep': 'asleep' },
      annotations: { 'sandbox-bridge.io/expires-at': expiresAt },
    },
  });
  const plan = planReaps({ ...base, pods: [], secrets: [sleeping('box-s-0', '2030-01-01T12:30:00Z'), sleeping('box-s-1', '2030-01-01T11:59:00Z')] });
  expect(plan.reaps.map((r) => [r.name, r.reason])).toEqual([['box-s-1', 'expired']]);
  expect(plan.nextDueAt).toBe(Date.parse('2030-01-01T12:30:00Z'));
  expect(plan.active).toBe(0);
});

test("a warm pod's credential (owned by the pool, made before its pod) goes by name: kept while a pod of its name exists, an orphan after the grace without one", () => {
  const credential = (pod: string, created = '2030-01-01T11:00:00Z'): k8s.V1Secret => ({
    metadata: {
      name: `${pod}-boxd`,
      namespace: 'ns',
      uid: `uid-${pod}-boxd`,
      creationTimestamp: new Date(created),
      labels: { 'app.kubernetes.io/component': 'box-credential' },
      ownerReferences: [{ apiVersion: 'sandbox-bridge.io/v1alpha1', kind: 'SandboxPool', name: 'p', uid: 'uid-pool' }],
    },
  });
  const warm = pod('box-warm-a');
  warm.metadata!.labels = { 'sandbox-bridge.io/warm': 'p' };
  const claimed = pod('box-warm-b'); // claimed: no warm label, its record as owner
  claimed.metadata!.labels = { 'sandbox-bridge.io/box-id': 'box-s-0' };
  claimed.metadata!.ownerReferences = [{ apiVersion: 'v1', kind: 'Secret', name: 'box-s-0', uid: 'uid-box-s-0' }];
  const going = pod('box-warm-c', { deleting: true });
  const plan = planReaps({
    ...base,
    pods: [warm, claimed, going],
    secrets: [
      credential('box-warm-a'),
      credential('box-warm-b'),
      credential('box-warm-c'),
      credential('box-warm-d'), // the operator stopped between the Secret and the pod
      credential('box-warm-e', '2030-01-01T11:59:45Z'), // its pod may be moments away
      // Made before this change: owned by its pod, whose UID no longer matters, only its name.
      { ...credential('box-warm-f'), metadata: { ...credential('box-warm-f').metadata, ownerReferences: [{ apiVersion: 'v1', kind: 'Pod', name: 'box-warm-f', uid: 'uid-gone' }] } },
    ],
  });
  expect(plan.reaps.map((r) => [r.kind, r.name, r.reason])).toEqual([
    ['Secret', 'box-warm-d-boxd', 'orphaned_secret'],
    ['Secret', 'box-warm-f-boxd', 'orphaned_secret'],
  ]);
  expect(plan.nextDueAt).toBe(Date.parse('2030-01-01T12:00:15Z'));
  // A pod of its name keeps it, whatever owns the Secret or the pod.
  const legacy = pod('box-warm-f');
  expect(planReaps({ ...base, pods: [legacy], secrets: [credential('box-warm-f')] }).reaps).toEqual([]);
});

test('a warm seat (a credential named box-seat-<n>) is kept while a pod with its seat label exists, and reaped only as the version judged', () => {
  const seat = (n: number, rv = '7'): k8s.V1Secret => ({
    metadata: {
      name: `box-seat-${n}`,
      namespace: 'ns',
      uid: `uid-seat-${n}`,
      resourceVersion: rv,
      creationTimestamp: new Date('2030-01-01T11:00:00Z'),
      labels: { 'app.kubernetes.io/component': 'box-credential' },
    },
  });
  const warm = pod('box-warm-a');
  warm.metadata!.labels = { 'sandbox-bridge.io/warm': 'p', 'sandbox-bridge.io/seat': '3' };
  const claimed = pod('box-warm-b');
  claimed.metadata!.labels = { 'sandbox-bridge.io/box-id': 'box-s-0', 'sandbox-bridge.io/seat': '4' };
  const plan = planReaps({ ...base, pods: [warm, claimed], secrets: [seat(3), seat(4), seat(5, '9')] });
  expect(plan.reaps).toEqual([{ kind: 'Secret', name: 'box-seat-5', namespace: 'ns', uid: 'uid-seat-5', resourceVersion: '9', reason: 'orphaned_secret' }]);
});

test('a warm seat names its pod: kept while that pod exists, whatever seat label pods carry', () => {
  const seat: k8s.V1Secret = {
    metadata: {
      name: 'box-seat-8',
      namespace: 'ns',
      uid: 'uid-seat-8',
      resourceVersion: '3',
      creationTimestamp: new Date('2030-01-01T11:00:00Z'),
      labels: { 'app.kubernetes.io/component': 'box-credential' },
      annotations: { 'sandbox-bridge.io/warm-pod': 'box-warm-z' },
    },
  };
  expect(planReaps({ ...base, pods: [pod('box-warm-z')], secrets: [seat] }).reaps).toEqual([]);
  expect(planReaps({ ...base, pods: [pod('box-warm-y')], secrets: [seat] }).reaps.map((r) => r.name)).toEqual(['box-seat-8']);
});
