// A plain TCP pipe in front of the API server, so a test can make the real cluster unreachable
// (or silent, or frozen) for one bridge or operator without touching the cluster itself, and so
// without disturbing test files running beside it. Not a fake: bytes pass through.
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { writeFileSync } from 'node:fs';
import * as k8s from '@kubernetes/client-node';

export type ProxyMode = 'forward' | 'refuse' | 'blackhole';

export class TcpProxy {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  private frozen = false;
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
      this.track(client);
      if (this.mode === 'refuse') return client.destroy();
      if (this.mode === 'blackhole') return; // accept and never answer
      const upstream = createConnection({ port: this.targetPort, host: this.targetHost, allowHalfOpen: true });
      this.track(upstream);
      upstream.on('error', () => client.destroy());
      this.relay(client, upstream);
      this.relay(upstream, client);
      if (this.frozen) {
        client.pause();
        upstream.pause();
      }
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

  /**
   * Like SIGSTOP of the API server: connections stay open and new ones are accepted (the kernel
   * does that for a stopped process), but no byte moves either way until thaw(). Unlike a real
   * stop, bytes a client sent and then abandoned by closing its connection are dropped.
   */
  freeze(): void {
    this.frozen = true;
    for (const s of this.sockets) s.pause();
  }

  thaw(): void {
    this.frozen = false;
    for (const s of this.sockets) s.resume();
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

  /** kubeConfig(kc) written to a file, for a program started as a process (KUBECONFIG=path). */
  writeKubeConfig(kc: k8s.KubeConfig, path: string): string {
    writeFileSync(path, this.kubeConfig(kc).exportConfig(), { mode: 0o600 });
    return path;
  }

  static forApiServer(kc: k8s.KubeConfig): TcpProxy {
    const url = new URL(kc.getCurrentCluster()!.server);
    return new TcpProxy(url.hostname, Number(url.port || 443));
  }

  private track(socket: Socket): void {
    this.sockets.add(socket);
    socket.on('close', () => this.sockets.delete(socket));
    socket.on('error', () => undefined);
  }

  /** from -> to with backpressure, by hand rather than pipe() so freeze() keeps both paused. */
  private relay(from: Socket, to: Socket): void {
    from.on('data', (chunk: Buffer) => {
      if (to.write(chunk)) return;
      from.pause();
      to.once('drain', () => {
        if (!this.frozen) from.resume();
      });
    });
    from.on('end', () => to.end());
    from.on('close', () => to.destroy());
  }
}
