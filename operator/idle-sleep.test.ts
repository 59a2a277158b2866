import type * as k8s from '@kubernetes/client-node';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS } from '../common/labels.js';
import { withDefaults, type SandboxPool } from '../common/pool.js';
import { planIdle, resumeOutcome } from './idle-sleep.js';

const NOW = Date.parse('2026-11-24T12:00:00Z');
const AFTER_S = 300;
const pool: SandboxPool = {
  apiVersion: 'sandbox-bridge.io/v1alpha1',
  kind: 'SandboxPool',
  metadata: { name: 'p' },
  spec: withDefaults({ namespace: 'ns', idle: { sleepAfterSeconds: AFTER_S } }),
};

function record(state?: string, lease?: { renewedMsAgo: number; seconds: number }): k8s.V1Secret {
  return {
    metadata: {
      name: 'box-a-0',
      namespace: 'ns',
      labels: { [LABELS.component]: SECRET_COMPONENTS.record, ...(state ? { [LABELS.sleep]: state } : {}) },
      annotations: lease
        ? { [ANNOTATIONS.lease]: JSON.stringify({ holder: 'h', epoch: 3, renewed: new Date(NOW - lease.renewedMsAgo).toISOString(), seconds: lease.seconds }) }
        : {},
    },
  };
}

function pod(idleMs: number, extra: { expiresInMs?: number; phase?: string; ip?: string | null; deleting?: boolean } = {}): k8s.V1Pod {
  return {
    metadata: {
      name: 'box-a-0',
      namespace: 'ns',
      annotations: {
        [ANNOTATIONS.lastActive]: new Date(NOW - idleMs).toISOString(),
        ...(extra.expiresInMs !== undefined ? { [ANNOTATIONS.expiresAt]: new Date(NOW + extra.expiresInMs).toISOString() } : {}),
      },
      ...(extra.deleting ? { deletionTimestamp: new Date(NOW) } : {}),
    },
    status: { phase: extra.phase ?? 'Running', ...(extra.ip === null ? {} : { podIP: extra.ip ?? '10.0.0.9' }) },
  };
}

const plan = (r: k8s.V1Secret | undefined, p: k8s.V1Pod | undefined, more: { retryAt?: number; pool?: SandboxPool } = {}) =>
  planIdle({ pool: more.pool ?? pool, record: r, pod: p, now: NOW, retryAt: more.retryAt });

describe('planIdle: when the operator puts a box to sleep (transition 2) or resumes a lease (11)', () => {
  test('Running -> SleepPending: a running box idle for sleepAfterSeconds', () => {
    expect(plan(record(), pod(AFTER_S * 1000))).toEqual({ action: 'sleep' });
  });

  test('not yet idle: look again exactly when it falls due', () => {
    expect(plan(record(), pod(AFTER_S * 1000 - 5000))).toEqual({ action: 'wait', ms: 5100 });
  });

  test('a box expiring within the idle time is left to the reaper', () => {
    expect(plan(record(), pod(AFTER_S * 1000, { expiresInMs: AFTER_S * 1000 - 1 }))).toEqual({ action: 'wait' });
    expect(plan(record(), pod(AFTER_S * 1000, { expiresInMs: AFTER_S * 1000 + 1 }))).toEqual({ action: 'sleep' });
  });

  test('only a pod that runs and has an IP, not one starting or going', () => {
    expect(plan(record(), pod(AFTER_S * 1000, { phase: 'Pending' }))).toEqual({ action: 'wait' });
    expect(plan(record(), pod(AFTER_S * 1000, { ip: null }))).toEqual({ action: 'wait' });
    expect(plan(record(), pod(AFTER_S * 1000, { deleting: true }))).toEqual({ action: 'wait' });
    expect(plan(record(), undefined)).toEqual({ action: 'wait' });
  });

  test('idle sleep off (0): never', () => {
    const off = { ...pool, spec: withDefaults({ namespace: 'ns', idle: { sleepAfterSeconds: 0 } }) };
    expect(plan(record(), pod(10 * AFTER_S * 1000), { pool: off })).toEqual({ action: 'wait' });
  });

  test('after a failed sleep: backed off until its retry time', () => {
    expect(plan(record(), pod(AFTER_S * 1000), { retryAt: NOW + 60_000 })).toEqual({ action: 'wait', ms: 60_000 });
    expect(plan(record(), pod(AFTER_S * 1000), { retryAt: NOW - 1 })).toEqual({ action: 'sleep' });
  });

  test('asleep and failed boxes are not the operator\'s to move (waking is the bridge\'s)', () => {
    expect(plan(record('asleep'), undefined)).toEqual({ action: 'wait' });
    expect(plan(record('failed'), undefined)).toEqual({ action: 'wait' });
  });

  test('a sleep or a wake under way: wait for its lease; once expired, resume it', () => {
    expect(plan(record('pending', { renewedMsAgo: 10_000, seconds: 30 }), pod(AFTER_S * 1000))).toEqual({ action: 'wait', ms: 20_250 });
    expect(plan(record('waking', { renewedMsAgo: 10_000, seconds: 30 }), undefined)).toEqual({ action: 'wait', ms: 20_250 });
    expect(plan(record('pending', { renewedMsAgo: 30_000, seconds: 30 }), pod(AFTER_S * 1000))).toEqual({ action: 'resume', state: 'pending' });
    expect(plan(record('waking', { renewedMsAgo: 31_000, seconds: 30 }), undefined)).toEqual({ action: 'resume', state: 'waking' });
    // A mark without a readable lease (a crash between writes, an older version) is taken over too.
    expect(plan(record('pending'), undefined)).toEqual({ action: 'resume', state: 'pending' });
  });

  test('no record, a record being deleted, or no pool: forgotten', () => {
    expect(plan(undefined, pod(AFTER_S * 1000))).toEqual({ action: 'forget' });
    const deleting = record();
    deleting.metadata!.deletionTimestamp = new Date(NOW);
    expect(plan(deleting, pod(AFTER_S * 1000))).toEqual({ action: 'forget' });
    expect(planIdle({ pool: undefined, record: record(), pod: pod(AFTER_S * 1000), now: NOW })).toEqual({ action: 'forget' });
  });
});

describe('resumeOutcome: where a box whose lease holder stopped ends up (transition 11)', () => {
  test('a sleep whose pod still runs is undone: Running, with its data', () => {
    expect(resumeOutcome('pending', 'serving', false)).toBe('running');
    expect(resumeOutcome('pending', 'serving', true)).toBe('running');
  });
  test('a sleep whose pod is gone: Sleeping if its snapshot was named and stored, else Failed', () => {
    expect(resumeOutcome('pending', 'none', true)).toBe('asleep');
    expect(resumeOutcome('pending', 'none', false)).toBe('failed');
  });
  test('a wake whose waker stopped before committing its pod: Sleeping again (the half-restored pod goes)', () => {
    expect(resumeOutcome('waking', 'restoring', false)).toBe('asleep');
    expect(resumeOutcome('waking', 'none', true)).toBe('asleep');
  });
  test('a wake whose waker committed its pod, then stopped before releasing the record: Running, pod kept', () => {
    expect(resumeOutcome('waking', 'serving', false)).toBe('running');
  });
});
