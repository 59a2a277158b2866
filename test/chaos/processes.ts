// The processes a chaos run kills and restarts: the operator (its own process, as in the
// lifecycle tests) and bridge replicas as processes of their own (node dist/bridge/main.js), so
// each can be SIGKILLed at any instant. Each bridge reaches the API server through a TCP proxy
// of its own, so one replica's API traffic can be frozen without touching the shared cluster's
// API server; the operator reaches the object store through a proxy of its own, so the store can
// be made unreachable for it alone (the local store is shared too). Logs go to files in the run
// directory, one per process generation.
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type * as k8s from '@kubernetes/client-node';
import { NODE_FLAGS } from '../../common/node-flags.js';
import { TEST_BOXD_IMAGE, TEST_BOXD_KEY, TEST_TOKEN } from '../support/bridge.js';
import { deleteLease, freePort, startOperator, type OperatorProcess } from '../support/operator.js';
import { TcpProxy } from '../support/tcp-proxy.js';

const ROOT = process.cwd();

export interface BridgeProcess {
  /** Which replica (0, 1, ...): its API proxy and its place in the fleet stay across restarts. */
  index: number;
  generation: number;
  url: string;
  metricsUrl: string;
  pid: number;
  proc: ChildProcess;
  exited: Promise<void>;
}

export interface FleetOptions {
  kc: k8s.KubeConfig;
  runDir: string;
  shard: string;
  leaseName: string;
  /** OBJECT_STORE_* and SNAPSHOT_ENCRYPTION_KEY of the run (the real store's endpoint). */
  storeEnv: Record<string, string>;
  leaseSeconds: number;
  bridges: number;
}

export class Fleet {
  readonly apiProxies: TcpProxy[] = [];
  /** Between the operator and the object store. */
  storeProxy!: TcpProxy;
  readonly bridges: Array<BridgeProcess | undefined> = [];
  private op: OperatorProcess | undefined;
  private opGeneration = 0;
  private readonly generations: number[] = [];
  /** Processes that exited without being killed by the run (e.g. an operator that lost its leader lease). */
  readonly unplanned: string[] = [];
  private stopping = false;
  /** The pool the bridges serve: set once the operator made it Ready, before startBridges(). */
  pool: { name: string; ns: string } | undefined;

  constructor(private readonly o: FleetOptions) {}

  /** Starts the proxies and the operator (it must be up before the pool is created: it makes the pool Ready). */
  async startOperatorFirst(): Promise<void> {
    const store = new URL(this.o.storeEnv.OBJECT_STORE_ENDPOINT!);
    this.storeProxy = new TcpProxy(store.hostname, Number(store.port || 80));
    await this.storeProxy.start();
    for (let i = 0; i < this.o.bridges; i++) {
      const proxy = TcpProxy.forApiServer(this.o.kc);
      await proxy.start();
      this.apiProxies.push(proxy);
      this.generations.push(0);
      this.bridges.push(undefined);
    }
    await this.startOperator();
  }

  async startBridges(): Promise<void> {
    await Promise.all(this.apiProxies.map((_, i) => this.startBridge(i)));
  }

  get operator(): OperatorProcess | undefined {
    return this.op;
  }

  /** Bridges up now. */
  up(): BridgeProcess[] {
    return this.bridges.filter((b): b is BridgeProcess => b !== undefined);
  }

  bridgeByPid(pid: number): BridgeProcess | undefined {
    return this.up().find((b) => b.pid === pid);
  }

  async startOperator(): Promise<OperatorProcess> {
    const generation = ++this.opGeneration;
    const store = `http://127.0.0.1:${this.storeProxy.port}`;
    const op = await startOperator({
      leaseName: this.o.leaseName,
      shard: this.o.shard,
      name: `chaos-operator-${generation}`,
      env: {
        ...this.o.storeEnv,
        OBJECT_STORE_ENDPOINT: store,
        // A store that stops answering mid-upload is noticed within seconds, not the default 20.
        OBJECT_STORE_IDLE_TIMEOUT_MS: '5000',
        BOXD_IMAGE: TEST_BOXD_IMAGE,
        BOXD_KEY: TEST_BOXD_KEY,
        BOX_LEASE_SECONDS: String(this.o.leaseSeconds),
        LOG_LEVEL: 'debug',
      },
    });
    this.op = op;
    void op.exited.then((code) => {
      writeFileSync(join(this.o.runDir, `operator.${generation}.log`), op.logs());
      if (this.op === op && !this.stopping) {
        this.unplanned.push(`operator generation ${generation} exited by itself (code ${code})`);
        this.op = undefined;
      }
    });
    return op;
  }

  /** SIGKILL: no shutdown of any kind, as a node lost or an OOM kill. */
  async killOperator(): Promise<void> {
    const op = this.op;
    if (!op) return;
    this.op = undefined;
    await op.stop('SIGKILL');
  }

  /**
   * A new operator process. The dead one's leader lease is deleted first (only this run uses
   * it, and its holder is verified dead): a standby would otherwise wait out its 10 s, which
   * would make a 20-kill run twice as long without testing anything more about boxes.
   */
  async restartOperator(): Promise<OperatorProcess> {
    await deleteLease(this.o.kc, this.o.leaseName);
    return this.startOperator();
  }

  async startBridge(index: number): Promise<BridgeProcess> {
    if (!this.pool) throw new Error('the fleet has no pool yet');
    const generation = ++this.generations[index]!;
    const [port, metricsPort] = [await freePort(), await freePort()];
    const kubeconfig = this.apiProxies[index]!.writeKubeConfig(this.o.kc, join(this.o.runDir, `bridge-${index}.kubeconfig`));
    const log = createWriteStream(join(this.o.runDir, `bridge-${index}.${generation}.log`));
    const proc = spawn(join(ROOT, 'node_modules/.bin/node'), [...NODE_FLAGS.bridge, join(ROOT, 'dist/bridge/main.js')], {
      env: {
        PATH: process.env.PATH,
        KUBECONFIG: kubeconfig,
        BRIDGE_TOKEN: TEST_TOKEN,
        BOXD_KEY: TEST_BOXD_KEY,
        BOXD_IMAGE: TEST_BOXD_IMAGE,
        PORT: String(port),
        METRICS_PORT: String(metricsPort),
        HOST: '127.0.0.1',
        LOG_LEVEL: 'info',
        SHUTDOWN_GRACE_MS: '2000',
        POOL_NAME: this.pool.name,
        SANDBOX_NAMESPACE: this.pool.ns,
        BOX_LEASE_SECONDS: String(this.o.leaseSeconds),
        ...this.o.storeEnv,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    proc.stdout!.pipe(log, { end: false });
    proc.stderr!.pipe(log, { end: false });
    const exited = new Promise<void>((resolve) =>
      proc.once('exit', (code, signal) => {
        log.end(`\n[chaos] exited: code ${code} signal ${signal}\n`);
        resolve();
      }),
    );
    const bridge: BridgeProcess = { index, generation, url: `http://127.0.0.1:${port}`, metricsUrl: `http://127.0.0.1:${metricsPort}`, pid: proc.pid!, proc, exited };
    void exited.then(() => {
      if (this.bridges[index] === bridge && !this.stopping) {
        this.unplanned.push(`bridge ${index} generation ${generation} exited by itself (code ${proc.exitCode})`);
        this.bridges[index] = undefined;
      }
    });
    for (let i = 0; i < 600; i++) {
      if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`bridge ${index} exited during start-up (see ${this.o.runDir}/bridge-${index}.${generation}.log)`);
      const ready = await fetch(`${bridge.metricsUrl}/readyz`, { signal: AbortSignal.timeout(1000) }).then((r) => r.ok, () => false);
      if (ready) {
        this.bridges[index] = bridge;
        return bridge;
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    proc.kill('SIGKILL');
    throw new Error(`bridge ${index} did not become ready in 60 s`);
  }

  async killBridge(index: number): Promise<void> {
    const b = this.bridges[index];
    if (!b) return;
    this.bridges[index] = undefined;
    b.proc.kill('SIGKILL');
    await b.exited;
  }

  /** Every process up, every proxy passing traffic (the end of a run, before its checks). */
  async heal(): Promise<void> {
    this.storeProxy.thaw();
    this.storeProxy.set('forward');
    for (const p of this.apiProxies) p.thaw();
    if (!this.op) await this.restartOperator();
    for (let i = 0; i < this.bridges.length; i++) if (!this.bridges[i]) await this.startBridge(i);
  }

  async stop(): Promise<void> {
    this.stopping = true;
    await Promise.all(
      this.up().map(async (b) => {
        b.proc.kill('SIGTERM');
        await Promise.race([b.exited, new Promise((r) => setTimeout(r, 5000))]);
        b.proc.kill('SIGKILL');
        await b.exited;
      }),
    );
    await this.op?.stop('SIGTERM');
    for (const p of this.apiProxies) await p.stop();
    await this.storeProxy?.stop();
    await deleteLease(this.o.kc, this.o.leaseName);
  }
}
