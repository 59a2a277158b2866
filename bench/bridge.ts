// Bench: what the bridge costs.
//
//   npm run bench            (BENCH_EXEC_ROUNDS=200 BENCH_BOXES=10000 BENCH_NODES=1000)
//
// 1. Exec round trip through the bridge (the fetch-only client -> bridge -> pods/exec) against a
//    direct client-node exec of the same command in the same box, interleaved in one run so
//    both see the same machine load: p50, p99 and the difference. The box runs on the local
//    cluster's real node when it is up, otherwise on a simulated node.
// 2. With BENCH_BOXES box pods on BENCH_NODES simulated nodes: latency of GET /sandboxes and
//    GET /boxes/:id/status, and the bridge process's RSS.
//
// The bridge runs as its own process (node dist/bridge/main.js) so its RSS is its own.
// Results go to bench/results/bridge.md and .json.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import * as k8s from '@kubernetes/client-node';
import { createBridgeClient } from '../client/index.js';
import { NODE_FLAGS } from '../common/node-flags.js';
import { writeResults } from './results-file.js';
import { clusterUp, createBenchPool, ensureCluster } from './setup.js';
import { makeApiClient } from '../common/kube.js';
import { ANNOTATIONS, BOX_SELECTOR, LABELS, MANAGED_BY, envSecretName, sessionHash } from '../common/labels.js';

const ROOT = process.cwd();
const EXEC_ROUNDS = Number(process.env.BENCH_EXEC_ROUNDS ?? 200);
const BOXES = Number(process.env.BENCH_BOXES ?? 10_000);
const NODES = Number(process.env.BENCH_NODES ?? 1000);
const READ_ROUNDS = Number(process.env.BENCH_READ_ROUNDS ?? 100);
const SKIP_READS = process.env.BENCH_SKIP_READS === '1';
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const REAL_NODE_LABEL = 'sandbox-bridge.io/real-node';
const id = randomBytes(3).toString('hex');
const ns = `bench-bridge-${id}`;
const pool = `bench-bridge-${id}`;
const token = randomBytes(24).toString('hex');

ensureCluster(ROOT, KUBECONFIG, []);
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);

const log = (msg: string) => process.stderr.write(`[bench] ${msg}\n`);

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

const ms = (v: number) => `${v.toFixed(2)} ms`;

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** Current RSS, or with `peak` the kernel's high-water mark of it (VmHWM), in MiB. */
function rssMiB(pid: number, peak = false): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(new RegExp(`${peak ? 'VmHWM' : 'VmRSS'}:\\s+(\\d+) kB`).exec(status)![1]) / 1024;
}

/** A direct exec that, like the bridge, keeps stdout and stderr apart. */
async function directExec(pod: string, command: string): Promise<string> {
  const out: Buffer[] = [];
  const sink = (into: Buffer[]) =>
    new Writable({
      write(chunk: Buffer, _e, done) {
        into.push(chunk);
        done();
      },
    });
  return new Promise((resolve, reject) => {
    let status: k8s.V1Status | undefined;
    new k8s.Exec(kc)
      .exec(ns, pod, 'box', ['sh', '-c', command], sink(out), sink([]), null, false, (s) => (status = s))
      .then((ws) => {
        ws.on('close', () => (status ? resolve(Buffer.concat(out).toString()) : reject(new Error('no status'))));
        ws.on('error', reject);
      }, reject);
  });
}

async function startBridgeProcess(onSpawn?: (child: ChildProcess) => void): Promise<{ child: ChildProcess; url: string }> {
  const port = await freePort();
  const child = spawn(process.execPath, [...NODE_FLAGS, join(ROOT, 'dist/bridge/main.js')], {
    env: {
      PATH: process.env.PATH,
      KUBECONFIG,
      BRIDGE_TOKEN: token,
      POOL_NAME: pool,
      SANDBOX_NAMESPACE: ns,
      PORT: String(port),
      METRICS_PORT: String(await freePort()),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      RATE_LIMIT_RPS: '100000',
      RATE_LIMIT_BURST: '100000',
    },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  onSpawn?.(child);
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 600; i++) {
    const ok = await fetch(`${url}/api/v1/health`, { headers: { authorization: `Bearer ${token}` } }).then((r) => r.ok, () => false);
    if (ok) return { child, url };
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('bridge did not start');
}

async function createPods(count: number, nodeNames: string[]): Promise<void> {
  let next = 0;
  const started = Date.now();
  const worker = async () => {
    while (next < count) {
      const i = next++;
      const session = `bench-session-${i}`;
      await core.createNamespacedPod({
        namespace: ns,
        body: {
          metadata: {
            name: `box-bench-${i}`,
            labels: { [LABELS.box]: 'true', [LABELS.pool]: pool, [LABELS.session]: sessionHash(session), [LABELS.managedBy]: MANAGED_BY },
            annotations: { [ANNOTATIONS.sessionId]: session, [ANNOTATIONS.expiresAt]: new Date(Date.now() + 86_400_000).toISOString() },
          },
          spec: {
            nodeName: nodeNames[i % nodeNames.length],
            automountServiceAccountToken: false,
            securityContext: { runAsNonRoot: true, runAsUser: 65534, seccompProfile: { type: 'RuntimeDefault' } },
            containers: [
              {
                name: 'box',
                image: 'sandbox-bridge.local/box:dev',
                resources: { limits: { cpu: '1m', memory: '1Mi' } },
                securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } },
              },
            ],
          },
        },
      });
      if (i > 0 && i % 1000 === 0) log(`created ${i} pods (${Math.round(i / ((Date.now() - started) / 1000))}/s)`);
    }
  };
  await Promise.all(Array.from({ length: 32 }, worker));
}

async function waitForAllBoxes(client: ReturnType<typeof createBridgeClient>): Promise<void> {
  for (let i = 0; i < 1200; i++) {
    const health = await client.health().catch(() => undefined);
    if (health && health.active_boxes >= BOXES) return;
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error('the bridge cache never saw every box');
}

/** List and status latency against one bridge, alternating. */
async function measureReads(url: string) {
  const client = createBridgeClient({ url, token, retries: 0 });
  const listTimes: number[] = [];
  const statusTimes: number[] = [];
  let listBytes = 0;
  for (let i = 0; i < READ_ROUNDS; i++) {
    let t = performance.now();
    const res = await fetch(`${url}/api/v1/sandboxes`, { headers: { authorization: `Bearer ${token}` } });
    listBytes = (await res.arrayBuffer()).byteLength;
    listTimes.push(performance.now() - t);
    t = performance.now();
    await client.status(`box-bench-${Math.floor(Math.random() * BOXES)}`);
    statusTimes.push(performance.now() - t);
  }
  return {
    listBytes,
    list: { p50: percentile(listTimes, 50), p99: percentile(listTimes, 99) },
    status: { p50: percentile(statusTimes, 50), p99: percentile(statusTimes, 99) },
  };
}

async function main() {
  const results: Record<string, unknown> = { date: new Date().toISOString(), node: process.version, cores: (await import('node:os')).cpus().length };
  const rows: Array<[string, string, string]> = [];

  const realNodes = await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` });
  const onRealNode = realNodes.items.length > 0;
  await createBenchPool(
    { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
    {
      name: pool,
      labels: { 'sandbox-bridge.io/bench': 'true' },
      spec: {
        namespace: ns,
        maxBoxes: BOXES + 100,
        box: onRealNode
          ? { nodeSelector: { [REAL_NODE_LABEL]: 'true' }, tolerations: [{ key: REAL_NODE_LABEL, operator: 'Exists', effect: 'NoSchedule' }] }
          : { nodeSelector: { type: 'kwok' } },
      },
    },
  );

  const { child, url } = await startBridgeProcess();
  let second: ChildProcess | undefined;
  try {
    const client = createBridgeClient({ url, token, retries: 0 });

    // 1. exec round trip, bridge vs direct, interleaved
    const box = await client.createBox({ sessionId: `bench-${id}`, cpu: 1, memory: 256 });
    const workdir = onRealNode ? '/workspace' : '/tmp';
    const command = 'echo hi';
    await client.exec(box.box_id, { command, workdir });
    for (let i = 0; i < 10; i++) {
      await client.exec(box.box_id, { command, workdir });
      await directExec(box.box_id, `cd ${workdir} && ${command}`);
    }
    const viaBridge: number[] = [];
    const direct: number[] = [];
    const hop: number[] = [];
    const envRead: number[] = [];
    const pooledCore = makeApiClient(kc, k8s.CoreV1Api, 10_000);
    for (let i = 0; i < EXEC_ROUNDS; i++) {
      let t = performance.now();
      // the env Secret read the bridge makes before each exec (a quorum GET; this box has none)
      await pooledCore.readNamespacedSecret({ name: envSecretName(box.box_id), namespace: ns }).catch(() => undefined);
      envRead.push(performance.now() - t);
      t = performance.now();
      await client.status(box.box_id); // an HTTP round trip to the bridge answered from its cache
      hop.push(performance.now() - t);
      t = performance.now();
      const r = await client.exec(box.box_id, { command, workdir });
      viaBridge.push(performance.now() - t);
      if (r.stdout !== 'hi\n') throw new Error(`unexpected output ${JSON.stringify(r)}`);
      t = performance.now();
      const out = await directExec(box.box_id, `cd ${workdir} && ${command}`);
      direct.push(performance.now() - t);
      if (out !== 'hi\n') throw new Error(`unexpected direct output ${out}`);
    }
    const exec = {
      node: onRealNode ? 'real node (containerd)' : 'simulated node (kwok, host exec)',
      rounds: EXEC_ROUNDS,
      bridge: { p50: percentile(viaBridge, 50), p99: percentile(viaBridge, 99) },
      direct: { p50: percentile(direct, 50), p99: percentile(direct, 99) },
      httpHop: { p50: percentile(hop, 50), p99: percentile(hop, 99) },
      envRead: { p50: percentile(envRead, 50), p99: percentile(envRead, 99) },
    };
    results.exec = exec;
    rows.push(['exec round trip, direct client-node p50 / p99', `${ms(exec.direct.p50)} / ${ms(exec.direct.p99)}`, '']);
    rows.push(['exec round trip, through the bridge p50 / p99', `${ms(exec.bridge.p50)} / ${ms(exec.bridge.p99)}`, '']);
    rows.push(['HTTP round trip to the bridge alone (GET status, from cache) p50 / p99', `${ms(exec.httpHop.p50)} / ${ms(exec.httpHop.p99)}`, '']);
    rows.push(['env Secret read (quorum GET) the bridge makes per exec, p50 / p99', `${ms(exec.envRead.p50)} / ${ms(exec.envRead.p99)}`, '']);
    rows.push(['added by the bridge, p50 / p99', `${ms(exec.bridge.p50 - exec.direct.p50)} / ${ms(exec.bridge.p99 - exec.direct.p99)}`, '<= 1 ms p50']);
    rows.push(['added beyond the HTTP round trip and the env read, p50', ms(exec.bridge.p50 - exec.direct.p50 - exec.httpHop.p50 - exec.envRead.p50), '']);
    log(`exec: bridge p50 ${ms(exec.bridge.p50)}, direct p50 ${ms(exec.direct.p50)}, HTTP hop p50 ${ms(exec.httpHop.p50)} (${exec.node})`);
    await client.deleteBox(box.box_id);

    // 2. list and status with many boxes on many nodes
    if (SKIP_READS) return;
    log(`scaling to ${NODES} simulated nodes`);
    clusterUp(ROOT, ['--nodes', String(NODES)]);
    const nodes = (await core.listNode({ labelSelector: 'type=kwok' })).items.map((n) => n.metadata!.name!);
    log(`creating ${BOXES} box pods on ${nodes.length} nodes`);
    const createStart = Date.now();
    await createPods(BOXES, nodes);
    const createSeconds = (Date.now() - createStart) / 1000;
    await waitForAllBoxes(client);
    // a) the bridge that watched every box arrive; b) a fresh replica started with all the boxes
    //    already there (a restart or rollout): its initial list is the memory peak.
    const watched = { ...(await measureReads(url)), rssMiB: rssMiB(child.pid!), peakRssMiB: rssMiB(child.pid!, true) };
    child.kill('SIGTERM');
    const restartedAt = performance.now();
    const restart = await startBridgeProcess((c) => (second = c));
    await waitForAllBoxes(createBridgeClient({ url: restart.url, token, retries: 0 }));
    const fillSeconds = (performance.now() - restartedAt) / 1000;
    const restarted = { ...(await measureReads(restart.url)), rssMiB: rssMiB(restart.child.pid!) };
    const peak = rssMiB(restart.child.pid!, true); // its initial list is the peak
    const reads = { boxes: BOXES, nodes: nodes.length, createSeconds, watched, restarted: { ...restarted, fillSeconds, peakRssMiB: peak } };
    results.reads = reads;
    const where = `${BOXES} boxes on ${nodes.length} nodes`;
    for (const [label, r] of [
      ['watched them arrive', watched],
      ['restarted with them', restarted],
    ] as const) {
      rows.push([`GET /sandboxes, ${where}, bridge that ${label}: p50 / p99`, `${ms(r.list.p50)} / ${ms(r.list.p99)} (${(r.listBytes / 1e6).toFixed(1)} MB)`, '<= 50 ms p50']);
      rows.push([`GET /boxes/:id/status, bridge that ${label}: p50 / p99`, `${ms(r.status.p50)} / ${ms(r.status.p99)}`, '']);
      rows.push([`bridge RSS, bridge that ${label}`, `${r.rssMiB.toFixed(0)} MiB`, '<= 256 MiB']);
    }
    rows.push(['restarted bridge: peak RSS from start / time from start until it serves every box', `${peak.toFixed(0)} MiB / ${fillSeconds.toFixed(1)} s`, '']);
    rows.push(['(setup) creating the box pods', `${createSeconds.toFixed(1)} s`, '']);
  } finally {
    child.kill('SIGTERM');
    second?.kill('SIGTERM');
    log('cleaning up');
    await custom.deleteClusterCustomObject({ group: 'sandbox-bridge.io', version: 'v1alpha1', plural: 'sandboxpools', name: pool }).catch(() => undefined);
    // Force-delete: the pods are on simulated nodes and nobody waits for them to shut down.
    await core.deleteCollectionNamespacedPod({ namespace: ns, labelSelector: BOX_SELECTOR, gracePeriodSeconds: 0 }).catch(() => undefined);
    await core.deleteNamespace({ name: ns }).catch(() => undefined);
    spawnSync(join(ROOT, '.cluster/bin/kwokctl'), ['scale', 'node', '--name', 'sandbox-bridge', '--config', join(ROOT, '.cluster/kwok.yaml'), '--replicas', '3'], {
      env: { ...process.env, KWOK_WORKDIR: join(ROOT, '.cluster/kwok') },
      stdio: 'ignore',
    });
  }

  const table = ['| measure | value | target |', '|---|---|---|', ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
  const md = `# Bridge bench\n\n${results.date} — ${results.cores} cores, Node ${results.node}; \`npm run bench\`\n\n${table}\n`;
  writeResults(ROOT, 'bridge', md, results);
  process.stdout.write(`${md}\n`);
}

main().catch((err: unknown) => {
  log(`failed: ${err instanceof Error ? err.stack : String(err)}`);
  process.exit(1);
});
