// The chart's Grafana dashboard queries only what the programs really export: a real bridge and a
// real operator run against the local cluster, their /metrics are scraped, and every metric name
// in every query of dashboards/sandbox-bridge.json (panels and variables) must be among them;
// every label a query groups by must be one the metric has (or one Prometheus adds).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Registry } from 'prom-client';
import { createMetrics } from '../../bridge/metrics.js';
import type { RunningBridge } from '../../bridge/server.js';
import { createOperatorMetrics } from '../../operator/metrics.js';
import { CHART } from '../chart/helm.js';
import { ON_SIMULATED_NODES, api, startTestBridge, testPolicy } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, testKubeConfig } from '../support/cluster.js';
import { deleteLease, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';

const kc = testKubeConfig();
const shard = uniqueName('dash');
const leaseName = `op-test-${shard}`;
let namespace: string;
let bridge: RunningBridge;
let operator: OperatorProcess;

/** PromQL's own words: functions, aggregations, keywords. Anything else is a metric name. */
const PROMQL = new Set([
  ...['sum', 'min', 'max', 'avg', 'count', 'stddev', 'stdvar', 'topk', 'bottomk', 'quantile', 'count_values', 'group'],
  ...['rate', 'irate', 'increase', 'delta', 'idelta', 'deriv', 'histogram_quantile', 'label_replace', 'label_join', 'abs', 'ceil', 'floor', 'round'],
  ...['clamp', 'clamp_min', 'clamp_max', 'time', 'timestamp', 'vector', 'scalar', 'sort', 'sort_desc', 'changes', 'resets', 'absent', 'present_over_time'],
  ...['avg_over_time', 'max_over_time', 'min_over_time', 'sum_over_time', 'count_over_time', 'last_over_time', 'label_values'],
  ...['by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'and', 'or', 'unless', 'offset', 'bool'],
]);
/** Labels the scrape adds to every series, and the bucket label of histograms. */
const SCRAPE_LABELS = new Set(['namespace', 'pod', 'job', 'instance', 'service', 'container', 'endpoint', 'le']);

interface Query {
  where: string;
  expr: string;
}

function dashboardQueries(): Query[] {
  const dashboard = JSON.parse(readFileSync(join(CHART, 'dashboards/sandbox-bridge.json'), 'utf8')) as {
    panels: Array<{ title: string; targets?: Array<{ expr: string }> }>;
    templating: { list: Array<{ name: string; query: string | { query: string } }> };
  };
  const queries: Query[] = [];
  for (const panel of dashboard.panels) for (const t of panel.targets ?? []) queries.push({ where: `panel "${panel.title}"`, expr: t.expr });
  for (const v of dashboard.templating.list) {
    if (typeof v.query === 'object') queries.push({ where: `variable $${v.name}`, expr: v.query.query });
  }
  return queries;
}

/** Metric names and grouping labels of a PromQL expression (Grafana's $variables removed). */
function parseQuery(expr: string): { metrics: string[]; groupLabels: string[]; unknown: string[] } {
  let rest = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""').replace(/\$\{?\w+\}?/g, '');
  const groupLabels: string[] = [];
  // Grafana's label_values(metric, label): a metric and one of its labels.
  rest = rest.replace(/\blabel_values\(([^,]+),\s*(\w+)\s*\)/g, (_m, metric: string, label: string) => {
    groupLabels.push(label);
    return metric;
  });
  rest = rest.replace(/\b(?:by|without)\s*\(([^)]*)\)/g, (_m, labels: string) => {
    groupLabels.push(...labels.split(',').map((l) => l.trim()).filter(Boolean));
    return ' ';
  });
  rest = rest.replace(/\{[^}]*\}/g, ' ').replace(/\[[^\]]*\]/g, ' ');
  const metrics: string[] = [];
  const unknown: string[] = [];
  for (const word of rest.match(/[A-Za-z_:][A-Za-z0-9_:]*/g) ?? []) {
    if (PROMQL.has(word)) continue;
    if (/^(sandbox_bridge|sandbox_operator)_/.test(word)) metrics.push(word);
    else unknown.push(word);
  }
  return { metrics, groupLabels, unknown };
}

/** Series names a /metrics page offers: each metric's name, and for histograms _bucket, _sum, _count. */
function seriesNames(exposition: string): Set<string> {
  const names = new Set<string>();
  for (const [, name, type] of exposition.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    if (type === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) names.add(`${name}${suffix}`);
    else if (type === 'summary') for (const suffix of ['', '_sum', '_count']) names.add(`${name}${suffix}`);
    else names.add(name!);
  }
  return names;
}

/** Label names of each metric, by series name, from the programs' own registries. */
function labelNames(...registries: Registry[]): Map<string, string[]> {
  const byName = new Map<string, string[]>();
  for (const registry of registries) {
    for (const metric of registry.getMetricsAsArray()) {
      const labels = [...((metric as unknown as { labelNames?: readonly string[] }).labelNames ?? [])];
      const name = (metric as unknown as { name: string }).name;
      for (const suffix of ['', '_bucket', '_sum', '_count']) byName.set(`${name}${suffix}`, labels);
    }
  }
  return byName;
}

beforeAll(async () => {
  namespace = await createTestNamespace(kc, 'dash', { 'pod-security.kubernetes.io/enforce': 'restricted' });
  bridge = await startTestBridge(kc, testPolicy(namespace, ON_SIMULATED_NODES));
  operator = await startOperator({ shard, leaseName });
  // Some traffic, so labelled series have samples too (names come from # TYPE lines either way).
  await api(bridge)('GET', '/health');
  await api(bridge)('GET', '/sandboxes');
  await api(bridge, 'wrong-token')('GET', '/health');
});

afterAll(async () => {
  await bridge?.close();
  await operator?.stop();
  await deleteLease(kc, leaseName);
  await deleteTestNamespace(kc, namespace);
});

test('every query of the dashboard uses metrics the bridge and the operator export, grouped by labels they have', async () => {
  const scraped = new Set([
    ...seriesNames(await (await fetch(`${bridge.metricsUrl}/metrics`)).text()),
    ...seriesNames(await (await fetch(`http://127.0.0.1:${operator.port}/metrics`)).text()),
  ]);
  expect(scraped.has('sandbox_bridge_boxes_active')).toBe(true);
  expect(scraped.has('sandbox_operator_reconcile_duration_seconds_bucket')).toBe(true);
  const labels = labelNames(createMetrics().registry, createOperatorMetrics().registry);

  const queries = dashboardQueries();
  expect(queries.length).toBeGreaterThanOrEqual(25);
  const used = new Set<string>();
  for (const { where, expr } of queries) {
    const parsed = parseQuery(expr);
    expect({ where, expr, usesAMetric: parsed.metrics.length > 0, unknownWords: parsed.unknown }).toEqual({ where, expr, usesAMetric: true, unknownWords: [] });
    for (const name of parsed.metrics) {
      used.add(name);
      expect({ where, name, exported: scraped.has(name) }).toEqual({ where, name, exported: true });
    }
    const known = new Set([...SCRAPE_LABELS, ...parsed.metrics.flatMap((m) => labels.get(m) ?? [])]);
    for (const label of parsed.groupLabels) expect({ where, label, known: known.has(label) }).toEqual({ where, label, known: true });
  }
  // The dashboard covers both programs' own metrics, box failures and tokens included.
  for (const name of ['sandbox_operator_box_failures_total', 'sandbox_bridge_token_requests_total', 'sandbox_operator_leader']) expect(used).toContain(name);
});

test('the query check itself: it finds metric names, grouping labels and anything it does not know', () => {
  expect(parseQuery('sum by (reason, pool) (increase(sandbox_operator_box_failures_total{namespace=~"$namespace", reason!="x"}[$__rate_interval]))')).toEqual({
    metrics: ['sandbox_operator_box_failures_total'],
    groupLabels: ['reason', 'pool'],
    unknown: [],
  });
  expect(parseQuery('up{job="x"} == 0 or kube_pod_info').unknown).toEqual(['up', 'kube_pod_info']);
  expect(parseQuery('label_values(sandbox_bridge_boxes_active, namespace)')).toEqual({ metrics: ['sandbox_bridge_boxes_active'], groupLabels: ['namespace'], unknown: [] });
});
