// The unauthenticated side port both programs serve: Prometheus /metrics, /livez, /readyz.
// Kept off the API port so scraping and probes never need the bearer token.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';

export interface ProbeServerOptions {
  registry: Registry;
  /** Ready to take traffic (caches synced, not shutting down). */
  ready: () => boolean | Promise<boolean>;
  /** Alive (event loop running, not wedged); defaults to always. */
  live?: () => boolean;
}

export function createProbeServer(options: ProbeServerOptions): Server {
  return createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const reply = (status: number, body: string, type = 'text/plain; charset=utf-8') => {
      res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return reply(405, 'method not allowed\n');
    switch (path) {
      case '/metrics':
        options.registry.metrics().then(
          (text) => reply(200, text, options.registry.contentType),
          (err: unknown) => reply(500, `metrics unavailable: ${String(err)}\n`),
        );
        return;
      case '/livez':
        return (options.live?.() ?? true) ? reply(200, 'ok\n') : reply(503, 'not alive\n');
      case '/readyz':
        Promise.resolve(options.ready()).then(
          (ok) => (ok ? reply(200, 'ok\n') : reply(503, 'not ready\n')),
          () => reply(503, 'not ready\n'),
        );
        return;
      default:
        return reply(404, 'not found\n');
    }
  });
}

export function listen(server: Server, port: number, host = '0.0.0.0'): Promise<AddressInfo> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve(server.address() as AddressInfo);
    });
  });
}
