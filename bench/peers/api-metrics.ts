// What the API server itself counts: apiserver_request_total from its /metrics, summed by verb
// and resource (every client together: bridges, operators, controllers, scheduler, kubelet,
// garbage collector, the bench). Two scrapes around a window give the requests in it; a quiet
// window's rate gives what the cluster does at rest, to take out of the others.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';

/** `VERB resource[/subresource]` -> count, as the API server labels its requests. */
export type Counts = Map<string, number>;

/** Verbs that write (change stored state); CONNECT (exec, port-forward) is counted apart. */
const WRITE_VERBS = new Set(['POST', 'PUT', 'PATCH', 'APPLY', 'DELETE', 'DELETECOLLECTION']);

export const isWrite = (key: string) => WRITE_VERBS.has(key.split(' ')[0]!);

/** One scrape of apiserver_request_total (resource requests only: /metrics, /readyz and the like are left out). */
export function scrape(root: string, kubeconfig: string): Counts {
  const r = spawnSync(join(root, '.cluster/bin/kubectl'), ['--kubeconfig', kubeconfig, 'get', '--raw', '/metrics'], { encoding: 'utf8', maxBuffer: 256 << 20 });
  if (r.status !== 0) throw new Error(`kubectl get --raw /metrics: ${r.stderr}`);
  return parse(r.stdout);
}

export function parse(text: string): Counts {
  const counts: Counts = new Map();
  for (const line of text.split('\n')) {
    if (!line.startsWith('apiserver_request_total{')) continue;
    const close = line.lastIndexOf('}');
    const labels = Object.fromEntries([...line.slice(24, close).matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]));
    if (!labels.resource || labels.dry_run) continue;
    const key = `${labels.verb} ${labels.resource}${labels.subresource ? `/${labels.subresource}` : ''}`;
    counts.set(key, (counts.get(key) ?? 0) + Number(line.slice(close + 1)));
  }
  return counts;
}

/** after - before, per key (keys that did not move are left out). */
export function delta(before: Counts, after: Counts): Counts {
  const d: Counts = new Map();
  for (const [k, v] of after) if (v - (before.get(k) ?? 0) !== 0) d.set(k, v - (before.get(k) ?? 0));
  return d;
}

/** a + b * factor, per key. */
export function add(a: Counts, b: Counts, factor = 1): Counts {
  const sum: Counts = new Map(a);
  for (const [k, v] of b) sum.set(k, (sum.get(k) ?? 0) + v * factor);
  return sum;
}

export const total = (c: Counts, which: (key: string) => boolean = () => true) => [...c].filter(([k]) => which(k)).reduce((s, [, v]) => s + v, 0);

/** The counts as an object, largest first, rounded to 0.01. */
export function toObject(c: Counts): Record<string, number> {
  return Object.fromEntries(
    [...c]
      .filter(([, v]) => Math.abs(v) >= 0.005)
      .sort(([, a], [, b]) => b - a)
      .map(([k, v]) => [k, Math.round(v * 100) / 100]),
  );
}

/**
 * Windows of API requests: each is the delta between two scrapes, added to a named tally. Quiet
 * windows (both systems idle) taken now and then through the run give the cluster's own rate,
 * which net() takes out of a tally for as long as its windows lasted.
 */
export class ApiWindows {
  private restCounts: Counts = new Map();
  private restSeconds = 0;
  /** Writes per second of each quiet window, to show how steady the rest rate was. */
  readonly restWrites: number[] = [];
  readonly raw = new Map<string, Counts>();
  readonly seconds = new Map<string, number>();

  constructor(
    private readonly root: string,
    private readonly kubeconfig: string,
  ) {}

  /** A quiet window of `ms`: nothing of the bench's runs meanwhile. */
  async rest(ms: number): Promise<void> {
    const t0 = performance.now();
    const before = scrape(this.root, this.kubeconfig);
    await new Promise((r) => setTimeout(r, ms));
    const d = delta(before, scrape(this.root, this.kubeconfig));
    const seconds = (performance.now() - t0) / 1000;
    this.restCounts = add(this.restCounts, d);
    this.restSeconds += seconds;
    this.restWrites.push(total(d, isWrite) / seconds);
  }

  /** Requests per second at rest, over all quiet windows. */
  restRate(): { writes: number; all: number; seconds: number; counts: Counts } {
    const per = add(new Map(), this.restCounts, 1 / Math.max(this.restSeconds, 1e-9));
    return { writes: total(per, isWrite), all: total(per), seconds: this.restSeconds, counts: per };
  }

  /** Runs fn and adds its requests to tally `name`. */
  async measure<T>(name: string, fn: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    const before = scrape(this.root, this.kubeconfig);
    const out = await fn();
    const after = scrape(this.root, this.kubeconfig);
    this.raw.set(name, add(this.raw.get(name) ?? new Map(), delta(before, after)));
    this.seconds.set(name, (this.seconds.get(name) ?? 0) + (performance.now() - t0) / 1000);
    return out;
  }

  /** Tally `name` less the rest rate over its windows' time. */
  net(name: string): Counts {
    return add(this.raw.get(name) ?? new Map(), this.restRate().counts, -(this.seconds.get(name) ?? 0));
  }
}
