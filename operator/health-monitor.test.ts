import { jest } from '@jest/globals';
import type * as k8s from '@kubernetes/client-node';
import { pino } from 'pino';
import type { SandboxPool } from '../common/pool.js';
import { BoxHealthMonitor } from './health-monitor.js';
import type { FailureNotice } from './webhooks.js';

const POOL = { metadata: { name: 'p1' }, spec: { namespace: 'boxes' } } as SandboxPool;

function setup(existing: Set<string> = new Set()) {
  let now = Date.parse('2026-01-01T00:10:00Z');
  const podEvents: string[] = [];
  const poolEvents: string[] = [];
  const notices: FailureNotice[] = [];
  const counted: string[] = [];
  const monitor = new BoxHealthMonitor({
    events: {
      recordOnce: async (target, key, event) => {
        const name = `${target.uid}/${key}`;
        if (existing.has(name)) return 'exists';
        existing.add(name);
        podEvents.push(`${target.name} ${event.reason}`);
        return 'created';
      },
      record: async (_pool, event) => {
        poolEvents.push(event.reason);
      },
    },
    poolOf: (pod) => (pod.metadata?.namespace === 'boxes' ? POOL : undefined),
    metrics: { boxFailures: { inc: (labels: { reason: string; pool: string }) => counted.push(`${labels.reason}/${labels.pool}`) } as never },
    webhooks: { notify: (n) => notices.push(n) },
    stuckPendingMs: 60_000,
    log: pino({ level: 'silent' }),
    now: () => now,
  });
  return { monitor, podEvents, poolEvents, notices, counted, existing, advance: (ms: number) => (now += ms) };
}

function oomPod(uid = 'u1', namespace = 'boxes'): k8s.V1Pod {
  return {
    metadata: { name: `box-${uid}`, namespace, uid, creationTimestamp: new Date('2026-01-01T00:00:00Z'), labels: { 'sandbox-bridge.io/pool': 'p1' } },
    spec: { containers: [] },
    status: { phase: 'Failed', containerStatuses: [{ name: 'box', image: 'i', imageID: '', ready: false, restartCount: 0, state: { terminated: { exitCode: 137, reason: 'OOMKilled', containerID: 'c://1' } } }] },
  };
}

const flush = () => new Promise((r) => setImmediate(r));

test('the leader reports each occurrence once, whatever number of times the watch shows it', async () => {
  const t = setup();
  t.monitor.startLeading();
  for (let i = 0; i < 3; i++) t.monitor.observe(oomPod());
  await flush();
  expect(t.podEvents).toEqual(['box-u1 BoxOOMKilled']);
  expect(t.poolEvents).toEqual(['BoxOOMKilled']);
  expect(t.counted).toEqual(['oom_killed/p1']);
  expect(t.notices).toEqual([expect.objectContaining({ reason: 'oom_killed', pool: 'p1', namespace: 'boxes', box: 'box-u1', podUid: 'u1', container: 'box' })]);
});

test('a standby only follows; on becoming leader it reports what is outstanding, except what an earlier leader recorded', async () => {
  const shared = new Set<string>(['u2/oom_killed/box/c://1']); // the old leader's event for u2 exists
  const t = setup(shared);
  t.monitor.observe(oomPod('u1'));
  t.monitor.observe(oomPod('u2'));
  t.monitor.observe({ ...oomPod('u3', 'elsewhere') }); // not a pool of this operator
  await flush();
  expect(t.podEvents).toEqual([]);
  t.monitor.startLeading();
  await flush();
  expect(t.podEvents).toEqual(['box-u1 BoxOOMKilled']);
  expect(t.counted).toEqual(['oom_killed/p1']);
  expect(t.monitor.size).toBe(2); // u3 dropped once its pool was looked up
});

test('a pod already trimmed by the cache (no spec) is ignored: it was seen whole at list time', async () => {
  const t = setup();
  t.monitor.startLeading();
  const pod = oomPod();
  pod.spec = undefined;
  t.monitor.observe(pod);
  await flush();
  expect(t.podEvents).toEqual([]);
});

test('stuck Pending: reported once when the threshold passes, from a timer, not before', async () => {
  jest.useFakeTimers({ now: Date.parse('2026-01-01T00:00:30Z') });
  try {
    const t = setup();
    const created = new Date(Date.now());
    const pending: k8s.V1Pod = {
      metadata: { name: 'box-p', namespace: 'boxes', uid: 'up', creationTimestamp: created },
      spec: { containers: [] },
      status: { phase: 'Pending', conditions: [{ type: 'PodScheduled', status: 'False', reason: 'Unschedulable', message: '0/3 nodes are available' }] },
    };
    const monitor = new BoxHealthMonitor({ ...(t.monitor as unknown as { o: ConstructorParameters<typeof BoxHealthMonitor>[0] }).o, now: Date.now });
    monitor.startLeading();
    monitor.observe(pending);
    await jest.advanceTimersByTimeAsync(59_000);
    expect(t.podEvents).toEqual([]);
    await jest.advanceTimersByTimeAsync(2_000);
    expect(t.podEvents).toEqual(['box-p BoxStuckPending']);
    expect(t.notices[0]!.message).toMatch(/^Pending for 6\d s: not scheduled: 0\/3 nodes are available$/);
    monitor.observe(pending);
    await jest.advanceTimersByTimeAsync(120_000);
    expect(t.podEvents).toHaveLength(1);
    // A pod that starts in time is never reported.
    const fresh = { ...pending.metadata, uid: 'uq', name: 'box-q', creationTimestamp: new Date(Date.now()) };
    monitor.observe({ ...pending, metadata: fresh });
    await jest.advanceTimersByTimeAsync(30_000);
    monitor.observe({ ...pending, metadata: fresh, status: { phase: 'Running' } });
    await jest.advanceTimersByTimeAsync(120_000);
    expect(t.podEvents).toHaveLength(1);
    expect(monitor.size).toBe(1);
  } finally {
    jest.useRealTimers();
  }
});
