// An HTTPS reverse proxy in front of the local API server for one bridge replica, so a test can
// hold that replica's watches stale (their events are kept back, every other request passes)
// while the cluster moves on — the replica then acts on what it saw last, as a replica with a
// lagging watch does — and count exactly which API requests that replica makes. Not a fake: every request and byte reaches the real API server, with the
// kubeconfig's own credentials; only the delivery of watch events is delayed.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import https from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';

export class ApiProxy {
  private server: https.Server | undefined;
  private held = false;
  /** Watch responses whose bytes are kept back while held: flushed in order on release. */
  private readonly waiting: Array<() => void> = [];
  private readonly upstream: { host: string; port: number; ca: Buffer; cert: Buffer; key: Buffer };
  port = 0;
  /** Every request passed on, in order (what the replica asked the API server). */
  readonly requests: Array<{ method: string; url: string; watch: boolean }> = [];

  constructor(kc: k8s.KubeConfig) {
    const cluster = kc.getCurrentCluster()!;
    const user = kc.getCurrentUser()!;
    const url = new URL(cluster.server);
    const file = (data: string | undefined, path: string | undefined) => (data ? Buffer.from(data, 'base64') : readFileSync(path!));
    this.upstream = {
      host: url.hostname,
      port: Number(url.port || 443),
      ca: file(cluster.caData, cluster.caFile),
      cert: file(user.certData, user.certFile),
      key: file(user.keyData, user.keyFile),
    };
  }

  async start(): Promise<void> {
    // A throwaway certificate for the proxy's own TLS (the replica is told to skip verifying it).
    const dir = mkdtempSync(join(tmpdir(), 'api-proxy-'));
    try {
      execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', join(dir, 'k'), '-out', join(dir, 'c'), '-days', '1', '-subj', '/CN=127.0.0.1'], {
        stdio: 'ignore',
      });
      this.server = https.createServer({ key: readFileSync(join(dir, 'k')), cert: readFileSync(join(dir, 'c')) }, (req, res) => this.forward(req, res));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.port = (this.server!.address() as AddressInfo).port;
  }

  /** A kubeconfig that reaches the API server through this proxy. */
  kubeConfig(): k8s.KubeConfig {
    const kc = new k8s.KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: 'proxied', server: `https://127.0.0.1:${this.port}`, skipTLSVerify: true }],
      users: [{ name: 'proxied' }],
      contexts: [{ name: 'proxied', cluster: 'proxied', user: 'proxied' }],
      currentContext: 'proxied',
    });
    return kc;
  }

  /** From now on, watch events are kept back (the replica's caches stop moving). */
  hold(): void {
    this.held = true;
  }

  /** Delivers what was kept back, and everything after it as it comes. */
  release(): void {
    this.held = false;
    for (const flush of this.waiting.splice(0)) flush();
  }

  async stop(): Promise<void> {
    this.release();
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }

  private forward(req: IncomingMessage, res: ServerResponse): void {
    this.requests.push({ method: req.method ?? '', url: req.url ?? '', watch: /[?&]watch=(true|1)/.test(req.url ?? '') });
    const headers = { ...req.headers };
    delete headers.host;
    delete headers.authorization;
    const up = https.request(
      { host: this.upstream.host, port: this.upstream.port, method: req.method, path: req.url, headers, ca: this.upstream.ca, cert: this.upstream.cert, key: this.upstream.key },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        if (!/[?&]watch=(true|1)/.test(req.url ?? '')) {
          answer.pipe(res);
          return;
        }
        // A watch: its headers go out now (a watch with no event yet would otherwise leave its
        // client waiting for them); its events pass only while not held, or queue up in order.
        res.flushHeaders();
        let queue: Buffer[] | undefined;
        answer.on('data', (chunk: Buffer) => {
          if (queue) return void queue.push(chunk);
          if (!this.held) return void res.write(chunk);
          queue = [chunk];
          this.waiting.push(() => {
            for (const c of queue ?? []) res.write(c);
            queue = undefined;
          });
        });
        answer.on('end', () => {
          const finish = () => res.end();
          if (queue) this.waiting.push(finish);
          else finish();
        });
      },
    );
    up.on('error', () => res.destroy());
    req.pipe(up);
    res.on('close', () => up.destroy());
  }
}
