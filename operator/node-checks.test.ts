import { jest } from '@jest/globals';
import type * as k8s from '@kubernetes/client-node';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import type { SandboxPool } from '../common/pool.js';
import { createOperatorMetrics } from './metrics.js';
import { NO_PID_LIMIT_REASON, NodeChecks, PIDS_UNKNOWN, podPidsLimitOf, retryDelayMs } from './node-checks.js';

const HOUR = 3_600_000;

test('podPidsLimitOf: the limit the kubelet applies; none for -1, 0 or no field; undefined for what is not a configz answer', () => {
  expect(podPidsLimitOf({ kubeletconfig: { podPidsLimit: 4096 } })).toBe(4096);
  expect(podPidsLimitOf(JSON.stringify({ kubeletconfig: { podPidsLimit: 1024, maxPods: 110 } }))).toBe(1024);
  expect(podPidsLimitOf({ kubeletconfig: { podPidsLimit: -1 } })).toBe(0);
  expect(podPidsLimitOf({ kubeletconfig: { podPidsLimit: 0 } })).toBe(0);
  expect(podPidsLimitOf({ kubeletconfig: { maxPods: 110 } })).toBe(0);
  for (const bad of [undefined, null, 'not json', '{}', { kubeletconfig: [] }, { kubeletconfig: { podPidsLimit: '4096' } }, { kubeletconfig: { podPidsLimit: 1.5 } }, { podPidsLimit: 4096 }]) {
    expect({ bad, limit: podPidsLimitOf(bad) }).toEqual({ bad, limit: undefined });
  }
});

test('retryDelayMs: 30 s doubling, never beyond the interval', () => {
  expect([1, 2, 3, 4, 5, 6, 7, 8].map((n) => retryDelayMs(n, HOUR) / 1000)).toEqual([30, 60, 120, 240, 480, 960, 1920, 3600]);
  expect(retryDelayMs(1000, HOUR)).toBe(HOUR);
  expect(retryDelayMs(3, 45_000)).toBe(45_000);
});

const pool = (name: string): SandboxPool => ({ metadata: { name, uid: `uid-${name}` }, spec: { namespace: `${name}-boxes` } }) as SandboxPool;
const POOLS = { a: pool('a'), b: pool('b') };

function box(uid: string, node: string | undefined, poolName: 'a' | 'b' = 'a', phase = 'Running'): k8s.V1Pod {
  return {
    metadata: { uid, name: `box-${uid}`, namespace: `${poolName}-boxes`, labels: { 'sandbox-bridge.io/pool': poolName } },
    spec: { containers: [], ...(node ? { nodeName: node } : {}) },
    status: { phase },
  };
}

function setup(o: { enabled?: boolean; limits?: Record<string, unknown>; concurrency?: number } = {}) {
  const registry = new Registry();
  const metrics = createOperatorMetrics(registry);
  const reads: string[] = [];
  const events: string[] = [];
  const lines: Array<{ level: number; msg: string }> = [];
  const limits: Record<string, unknown> = o.limits ?? {};
  let inFlight = 0;
  let maxInFlight = 0;
  const gates: Array<() => void> = [];
  let gated = false;
  const log = pino({ level: 'debug' }, { write: (line: string) => lines.push(JSON.parse(line) as { level: number; msg: string }) });
  const checks = new NodeChecks({
    enabled: o.enabled ?? true,
    intervalMs: HOUR,
    concurrency: o.concurrency ?? 4,
    readConfigz: async (node) => {
      reads.push(node);
      inFlight++;
      maxInFlight = Math.max(maxInFlight, inFlight);
      try {
        if (gated) await new Promise<void>((r) => gates.push(r));
        const answer = limits[node];
        if (answer instanceof Error) throw answer;
        return { kubeletconfig: { podPidsLimit: answer } };
      } finally {
        inFlight--;
      }
    },
    poolOf: (pod) => POOLS[pod.metadata?.labels?.['sandbox-bridge.io/pool'] as 'a' | 'b'],
    events: {
      record: async (p, e) => {
        events.push(`${p.metadata.name} ${e.type} ${e.reason}: ${e.message}`);
      },
    },
    metrics,
    log,
    now: () => Date.now(),
  });
  const gauge = async () => {
    const m = (await registry.getMetricsAsJSON()).find((x) => x.name === 'sandbox_operator_node_pod_pids_limit')!;
    return Object.fromEntries(m.values.map((v) => [v.labels.node, v.value]));
  };
  return {
    checks,
    reads,
    events,
    limits,
    gauge,
    warnings: () => lines.filter((l) => l.level >= 40).map((l) => l.msg),
    maxInFlight: () => maxInFlight,
    gate: () => (gated = true),
    open: () => {
      gated = false;
      for (const g of gates.splice(0)) g();
    },
  };
}

const flush = async () => {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
};

beforeEach(() => jest.useFakeTimers({ doNotFake: ['setImmediate', 'nextTick'] }));
afterEach(() => jest.useRealTimers());

test('each node running boxes is read once: its limit in the gauge; a node without one is a warning and one Event per pool', async () => {
  const t = setup({ limits: { 'node-1': 4096, 'node-2': -1 } });
  t.checks.startLeading();
  t.checks.observePod(box('u1', 'node-1'));
  t.checks.observePod(box('u2', 'node-1'));
  t.checks.observePod(box('u3', 'node-2'));
  t.checks.observePod(box('u4', 'node-2'));
  t.checks.observePod(box('u5', undefined)); // not scheduled yet: no node to read
  await flush();
  expect(t.reads).toEqual(['node-1', 'node-2']);
  expect(await t.gauge()).toEqual({ 'node-1': 4096, 'node-2': 0 });
  expect(t.warnings()).toEqual([expect.stringMatching(/^node node-2 runs boxes and its kubelet sets no pod PID limit \(podPidsLimit\)/)]);
  expect(t.events).toEqual([expect.stringMatching(new RegExp(`^a Warning ${NO_PID_LIMIT_REASON}: Node node-2 runs 2 boxes of this pool and its kubelet sets no pod PID limit`))]);

  // More boxes there: no new read or Event; a box of another pool there: that pool is told too.
  t.checks.observePod(box('u6', 'node-2'));
  t.checks.observePod(box('u5', 'node-2'));
  t.checks.observePod(box('u7', 'node-2', 'b'));
  await flush();
  expect(t.reads).toEqual(['node-1', 'node-2']);
  expect(t.events).toHaveLength(2);
  expect(t.events[1]).toMatch(/^b Warning NodeWithoutPidLimit: Node node-2 runs 1 box of this pool/);
});

test('after the interval each node running boxes is read again, and the gauge follows; a node that lost its boxes is not', async () => {
  const t = setup({ limits: { 'node-1': -1, 'node-2': 2048 } });
  t.checks.startLeading();
  t.checks.observePod(box('u1', 'node-1'));
  t.checks.observePod(box('u2', 'node-2'));
  await flush();
  expect(await t.gauge()).toEqual({ 'node-1': 0, 'node-2': 2048 });
  expect(t.events).toHaveLength(1);

  // node-2's boxes go: its series goes, and it is not read again.
  t.checks.observePod(box('u2', 'node-2', 'a', 'Succeeded'));
  t.limits['node-1'] = 8192;
  jest.advanceTimersByTime(HOUR - 1000);
  await flush();
  expect(t.reads).toEqual(['node-1', 'node-2']);
  jest.advanceTimersByTime(2000);
  await flush();
  expect(t.reads).toEqual(['node-1', 'node-2', 'node-1']);
  expect(await t.gauge()).toEqual({ 'node-1': 8192 });
  expect(t.events).toHaveLength(1);

  // A box on node-2 again, more than an interval after its last read: read again at once.
  t.checks.observePod(box('u3', 'node-2'));
  await flush();
  expect(t.reads).toEqual(['node-1', 'node-2', 'node-1', 'node-2']);
});

test('a node without a limit warns again at each read; a box arriving within the interval is not a new read', async () => {
  const t = setup({ limits: { 'node-1': -1 } });
  t.checks.startLeading();
  t.checks.observePod(box('u1', 'node-1'));
  await flush();
  t.checks.forgetPod(box('u1', 'node-1'));
  jest.advanceTimersByTime(60_000);
  t.checks.observePod(box('u2', 'node-1'));
  await flush();
  expect(t.reads).toEqual(['node-1']);
  // Its pool is told again: the box that was there is gone, this one is new.
  expect(t.events).toHaveLength(2);
  jest.advanceTimersByTime(HOUR);
  await flush();
  expect(t.reads).toEqual(['node-1', 'node-1']);
  expect(t.events).toHaveLength(3);
  expect(t.warnings()).toHaveLength(2);
});

test('a node whose configuration cannot be read is unknown (-1), said once per streak, and read again with backoff', async () => {
  const refused = Object.assign(new Error('HTTP-Code: 400 Message: address not allowed'), { code: 400 });
  const t = setup({ limits: { 'kwok-1': refused } });
  t.checks.startLeading();
  t.checks.observePod(box('u1', 'kwok-1'));
  await flush();
  expect(await t.gauge()).toEqual({ 'kwok-1': PIDS_UNKNOWN });
  expect(t.warnings()).toEqual(['cannot read the kubelet configuration of node kwok-1: its pod PID limit is unknown (-1)']);
  for (const wait of [30_000, 60_000, 120_000]) {
    const before = t.reads.length;
    jest.advanceTimersByTime(wait - 100);
    await flush();
    expect(t.reads.length).toBe(before);
    jest.advanceTimersByTime(200);
    await flush();
    expect(t.reads.length).toBe(before + 1);
  }
  expect(t.warnings()).toHaveLength(1);
  expect(t.events).toEqual([]);

  // Readable at last: the limit shows, and a later failure keeps it (stale by at most a read).
  t.limits['kwok-1'] = 512;
  jest.advanceTimersByTime(240_100);
  await flush();
  expect(await t.gauge()).toEqual({ 'kwok-1': 512 });
  t.limits['kwok-1'] = refused;
  jest.advanceTimersByTime(HOUR + 100);
  await flush();
  expect(await t.gauge()).toEqual({ 'kwok-1': 512 });
  expect(t.warnings()[1]).toMatch(/keeping the last one read \(512\)/);
});

test('without get nodes/proxy: one error naming the chart value, every node unknown', async () => {
  const forbidden = Object.assign(new Error('forbidden'), { code: 403 });
  const t = setup({ limits: { 'node-1': forbidden, 'node-2': forbidden } });
  t.checks.startLeading();
  t.checks.observePod(box('u1', 'node-1'));
  t.checks.observePod(box('u2', 'node-2'));
  await flush();
  expect(await t.gauge()).toEqual({ 'node-1': -1, 'node-2': -1 });
  expect(t.warnings()).toEqual([expect.stringContaining('may not get nodes/proxy (the chart grants it with operator.nodeChecks.enabled)')]);
});

test('off: nothing is read; the start says box PID limits are unverified; the leader reports every box node as unknown', async () => {
  const t = setup({ enabled: false, limits: { 'node-1': 4096 } });
  expect(t.warnings()).toEqual([expect.stringMatching(/^box PID limits are unverified: .*operator\.nodeChecks\.enabled.*-1 \(unknown\)$/)]);
  t.checks.observePod(box('u1', 'node-1'));
  expect(await t.gauge()).toEqual({});
  t.checks.startLeading();
  t.checks.observePod(box('u2', 'node-2'));
  jest.advanceTimersByTime(2 * HOUR);
  await flush();
  expect(t.reads).toEqual([]);
  expect(await t.gauge()).toEqual({ 'node-1': -1, 'node-2': -1 });
  expect(t.warnings()).toHaveLength(1);
});

test('a standby reads nothing and exports nothing; on becoming leader it reads the nodes its cache shows; stepping down clears the gauge', async () => {
  const t = setup({ limits: { 'node-1': 4096 } });
  t.checks.observePod(box('u1', 'node-1'));
  await flush();
  expect(t.reads).toEqual([]);
  expect(await t.gauge()).toEqual({});
  t.checks.startLeading();
  await flush();
  expect(t.reads).toEqual(['node-1']);
  expect(await t.gauge()).toEqual({ 'node-1': 4096 });
  t.checks.stopLeading();
  expect(await t.gauge()).toEqual({});
});

test('a trimmed pod (seen at list time) changes nothing; a deleted or finished one leaves its node', async () => {
  const t = setup({ limits: { 'node-1': 4096 } });
  t.checks.startLeading();
  t.checks.observePod(box('u1', 'node-1'));
  await flush();
  t.checks.observePod({ metadata: { uid: 'u1' }, status: { phase: 'Running' } });
  expect(await t.gauge()).toEqual({ 'node-1': 4096 });
  t.checks.observePod({ ...box('u1', 'node-1'), metadata: { ...box('u1', 'node-1').metadata, deletionTimestamp: new Date() } });
  expect(await t.gauge()).toEqual({});
});

test('at most `concurrency` nodes are read at once', async () => {
  const limits = Object.fromEntries(Array.from({ length: 10 }, (_, i) => [`node-${i}`, 1024]));
  const t = setup({ limits, concurrency: 3 });
  t.gate();
  t.checks.startLeading();
  for (let i = 0; i < 10; i++) t.checks.observePod(box(`u${i}`, `node-${i}`));
  await flush();
  expect(t.reads).toHaveLength(3);
  t.open();
  for (let i = 0; i < 10; i++) {
    await flush();
    t.open();
  }
  expect(t.reads).toHaveLength(10);
  expect(t.maxInFlight()).toBe(3);
  expect(Object.keys(await t.gauge())).toHaveLength(10);
});
