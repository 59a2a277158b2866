// Counting the Kubernetes API requests of one process: an HTTPS proxy in front of the local API
// server for that process alone (every request and byte reaches the real API server, with the
// kubeconfig's own credentials, as test/support/api-proxy.ts does), a kubeconfig file that points
// the process at it, and a tally of what passed by verb and resource, as the API server's
// apiserver_request_total labels them. Unlike the test proxy it sends a watch's response headers
// at once (a quiet watch would otherwise hold its client's start-up until its first event) and
// records each request's answer status and time.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type * as k8s from '@kubernetes/client-node';

export interface ApiRequest {
  method: string;
  url: string;
  watch: boolean;
  /** The API server's answer (0 until it answered, or when the upstream request failed). */
  status: number;
  /** When the request arrived (ms since the epoch). */
  at: number;
}

/** An API proxy with a kubeconfig file for a spawned process, and marks to cut its log into windows. */
export class CountingProxy {
  private server: https.Server | undefined;
  private readonly dir = mkdtempSync(join(tmpdir(), 'bench-api-proxy-'));
  private readonly upstream: { host: string; port: number; agent: https.Agent };
  private port = 0;
  /** Every request passed on, in order. */
  readonly requests: ApiRequest[] = [];

  constructor(kc: k8s.KubeConfig) {
    const cluster = kc.getCurrentCluster()!;
    const user = kc.getCurrentUser()!;
    const url = new URL(cluster.server);
    const file = (data: string | undefined, path: string | undefined) => (data ? Buffer.from(data, 'base64') : readFileSync(path!));
    this.upstream = {
      host: url.hostname,
      port: Number(url.port || 443),
      agent: new https.Agent({ keepAlive: true, ca: file(cluster.caData, cluster.caFile), cert: file(user.certData, user.certFile), key: file(user.keyData, user.keyFile) }),
    };
  }

  async start(): Promise<void> {
    // A throwaway certificate for the proxy's own TLS (its client is told to skip verifying it).
    execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', join(this.dir, 'k'), '-out', join(this.dir, 'c'), '-days', '1', '-subj', '/CN=127.0.0.1'], {
      stdio: 'ignore',
    });
    this.server = https.createServer({ key: readFileSync(join(this.dir, 'k')), cert: readFileSync(join(this.dir, 'c')) }, (req, res) => this.forward(req, res));
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.port = (this.server!.address() as AddressInfo).port;
  }

  /** A kubeconfig file (removed by stop) that reaches the API server through this proxy. */
  kubeconfigFile(): string {
    const path = join(this.dir, 'kubeconfig');
    writeFileSync(
      path,
      [
        'apiVersion: v1',
        'kind: Config',
        'clusters:',
        `- name: proxied\n  cluster:\n    server: https://127.0.0.1:${this.port}\n    insecure-skip-tls-verify: true`,
        'users:',
        '- name: proxied\n  user: {}',
        'contexts:',
        '- name: proxied\n  context:\n    cluster: proxied\n    user: proxied',
        'current-context: proxied',
        '',
      ].join('\n'),
    );
    return path;
  }

  /** Where the log is now: pass it to since(). */
  mark(): number {
    return this.requests.length;
  }

  /** The requests passed on since mark (up to `until`, another mark). */
  since(mark: number, until?: number): ApiRequest[] {
    return this.requests.slice(mark, until);
  }

  async stop(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
    this.upstream.agent.destroy();
    rmSync(this.dir, { recursive: true, force: true });
  }

  private forward(req: IncomingMessage, res: ServerResponse): void {
    const watch = /[?&]watch=(true|1)/.test(req.url ?? '');
    const entry: ApiRequest = { method: req.method ?? '', url: req.url ?? '', watch, status: 0, at: Date.now() };
    this.requests.push(entry);
    const headers = { ...req.headers };
    delete headers.host;
    delete headers.authorization;
    const up = https.request({ host: this.upstream.host, port: this.upstream.port, method: req.method, path: req.url, headers, agent: this.upstream.agent }, (answer) => {
      entry.status = answer.statusCode ?? 0;
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      if (watch) res.flushHeaders();
      answer.pipe(res);
    });
    up.on('error', () => res.destroy());
    req.pipe(up);
    res.on('close', () => up.destroy());
  }
}

/**
 * A request as `VERB resource[/subresource]`, verbs as apiserver_request_total has them: GET (one
 * object), LIST, WATCH, POST, PUT, PATCH, DELETE, DELETECOLLECTION. Names and namespaces are left
 * out; `named` (below) keeps the object's name for requests that target one.
 */
export function verbResource(r: ApiRequest): string {
  const { resource, name, subresource } = parsePath(r.url);
  if (!resource) return `${r.method} ${r.url.split('?')[0]} (discovery)`;
  const what = subresource ? `${resource}/${subresource}` : resource;
  let verb = r.method;
  if (r.method === 'GET') verb = r.watch ? 'WATCH' : name ? 'GET' : 'LIST';
  if (r.method === 'DELETE' && !name) verb = 'DELETECOLLECTION';
  if (verb !== 'LIST' && verb !== 'WATCH') return `${verb} ${what}`;
  const query = new URLSearchParams(r.url.split('?')[1] ?? '');
  const selectors = ['labelSelector', 'fieldSelector'].filter((k) => query.get(k)).map((k) => `${k}=${query.get(k)}`);
  return `${verb} ${what}${selectors.length ? ` (${selectors.join(', ')})` : ''}`;
}

/** The name of the object a request targets (undefined for lists, watches and creates). */
export function named(r: ApiRequest): string | undefined {
  return parsePath(r.url).name;
}

/** The resource, name and subresource of an API path (/api/v1/..., /apis/<group>/<version>/...); resource '' for discovery. */
export function parsePath(url: string): { resource: string; name?: string; subresource?: string } {
  const parts = url.split('?')[0]!.split('/').filter(Boolean);
  let rest = parts[0] === 'api' ? parts.slice(2) : parts.slice(3);
  if (rest[0] === 'namespaces' && rest.length >= 3) rest = rest.slice(2);
  const [resource = '', name, subresource] = rest;
  return { resource, ...(name ? { name } : {}), ...(subresource ? { subresource } : {}) };
}

/** Counts by verbResource. */
export function tally(requests: readonly ApiRequest[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const r of requests) counts.set(verbResource(r), (counts.get(verbResource(r)) ?? 0) + 1);
  return counts;
}

/** Non-watch requests: what a process asked of the API server (a watch is one long request). */
export function calls(requests: readonly ApiRequest[]): ApiRequest[] {
  return requests.filter((r) => !r.watch);
}

export function toObject(counts: Map<string, number>): Record<string, number> {
  return Object.fromEntries([...counts].sort(([a], [b]) => a.localeCompare(b)));
}
