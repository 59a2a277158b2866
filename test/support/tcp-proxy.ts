// A plain TCP pipe in front of the API server, so a test can make the real cluster unreachable
// (or silent) for one bridge without touching the cluster itself. Not a fake: bytes pass through.
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import * as k8s from '@kubernetes/client-node';

export type ProxyMode = 'forward' | 'refuse' | 'blackhole';

export class TcpProxy {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  mode: ProxyMode = 'forward';
  port = 0;

  constructor(
    private readonly targetHost: string,
    private readonly targetPort: number,
    /** Where it listens: loopback, or e.g. the real node's IP so that pods can try to reach it. */
    private readonly listenHost = '127.0.0.1',
  ) {}

  async start(): Promise<void> {
    // Half-open allowed both ways, as TCP does: a client that finishes sending still gets its answer.
    this.server = createServer({ allowHalfOpen: true }, (client) => {
      this.sockets.add(client);
      client.on('close', () => this.sockets.delete(client));
      client.on('error', () => undefined);
      if (this.mode === 'refuse') return client.destroy();
      if (this.mode === 'blackhole') return; // accept and never answer
      const upstream = createConnection({ port: this.targetPort, host: this.targetHost, allowHalfOpen: true });
      this.sockets.add(upstream);
      upstream.on('close', () => this.sockets.delete(upstream));
      upstream.on('error', () => client.destroy());
      client.pipe(upstream).pipe(client);
    });
    await new Promise<void>((resolve) => this.server!.listen(this.port, this.listenHost, resolve));
    this.port = (this.server.address() as AddressInfo).port;
  }

  /** Switches mode and drops every open connection, as a network failure would. */
  set(mode: ProxyMode): void {
    this.mode = mode;
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
  }

  async stop(): Promise<void> {
    this.set('refuse');
    await new Promise<void>((resolve) => this.server?.close(() => resolve()) ?? resolve());
  }

  /** A copy of kc that reaches the API server through this proxy (the local one serves 127.0.0.1). */
  kubeConfig(kc: k8s.KubeConfig): k8s.KubeConfig {
    const cluster = kc.getCurrentCluster()!;
    const url = new URL(cluster.server);
    const copy = new k8s.KubeConfig();
    copy.loadFromOptions({
      clusters: [{ ...cluster, server: `${url.protocol}//127.0.0.1:${this.port}` }],
      users: kc.users,
      contexts: kc.contexts,
      currentContext: kc.currentContext,
    });
    return copy;
  }

  static forApiServer(kc: k8s.KubeConfig): TcpProxy {
    const url = new URL(kc.getCurrentCluster()!.server);
    return new TcpProxy(url.hostname, Number(url.port || 443));
  }
}
