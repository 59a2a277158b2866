// The pool histograms' observations of box metrics: once per box and boxd sample, never per read.
import type { BoxdMetrics } from '../../common/boxd-client.js';
import { LABELS } from '../../common/labels.js';
import { ByteBudget } from './byte-budget.js';
import { ObserveService } from './observe.js';

const sample = (time: string, cores: number) => ({
  time,
  cpu: { used_cores: cores, usage_seconds: 1, limit_cores: 1, throttled_seconds: 0, throttled_periods: 0 },
  memory: { used_bytes: 1, limit_bytes: 2, oom_kills: 0 },
  disk: [],
  processes: { count: 1, limit: null },
  network: { rx_bytes: 0, tx_bytes: 0 },
});

function service(answers: BoxdMetrics[], uid = 'u1') {
  const seen: Array<[string, number]> = [];
  const svc = new ObserveService({
    connector: { call: (_id, fn) => fn({ pod: { metadata: { uid, labels: { [LABELS.pool]: 'p' } } }, target: { box: 'b', ip: '', token: '' }, signal: new AbortController().signal }) },
    boxd: { metrics: async () => answers.shift()!, watchFiles: async () => { throw new Error('unused'); } },
    budget: new ByteBudget(1 << 20),
    maxWatchesPerBox: 16,
    onSample: (pool, s) => seen.push([pool, s.cpu.used_cores]),
  });
  return { svc, seen };
}

test('reads within one sample interval observe once; a new sample observes again; cgroup is not answered', async () => {
  const at = (s: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, s)).toISOString();
  const now = (s: number, cores: number): BoxdMetrics => ({ ...sample(at(s), cores), cgroup: 'v2', interval_seconds: 5 });
  const { svc, seen } = service([now(1, 0.1), now(2, 0.2), now(3, 0.3), now(6, 0.6)]);
  const first = await svc.metrics('b', undefined);
  expect(first).not.toHaveProperty('cgroup');
  expect(first.box_id).toBe('b');
  await svc.metrics('b', undefined);
  await svc.metrics('b', undefined);
  await svc.metrics('b', undefined);
  expect(seen).toEqual([
    ['p', 0.1],
    ['p', 0.6],
  ]);
});

test('with history, the newest kept sample is observed, once', async () => {
  const withHistory = (cores: number): BoxdMetrics => ({ ...sample('2026-01-01T00:00:09Z', 9), cgroup: 'v1', interval_seconds: 5, history: [sample('2026-01-01T00:00:00Z', 0), sample('2026-01-01T00:00:05Z', cores)] });
  const { svc, seen } = service([withHistory(0.5), withHistory(0.5)]);
  await svc.metrics('b', '2026-01-01T00:00:00Z');
  await svc.metrics('b', '2026-01-01T00:00:00Z');
  expect(seen).toEqual([['p', 0.5]]);
});
