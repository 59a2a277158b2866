// Bench: what the ports route adds (issue 23; docs/ports.md).
//
//   npm run bench:ports   (BENCH_PORTS_ROUNDS=10 BENCH_PORTS_REQUESTS=200 BENCH_PORTS_SECONDS=5
//                          BENCH_PORTS_CONCURRENCY=8)
//
// One box on the local cluster's real node runs portapp (boxd/internal/testkit/portapp) on its
// loopback, port 8000. Two ways to it from this machine, each over one reused keep-alive connection:
//   direct: boxd's own ports route, http://<pod IP>:7771/v1/ports/8000/<path> with the box's
//           credential (derived from the bench's BOXD_KEY), so boxd -> 127.0.0.1:8000 in the box;
//   bridge: http://127.0.0.1:<bridge>/api/v1/boxes/<id>/ports/8000/<path> with the bearer token,
//           so bridge -> boxd -> 127.0.0.1:8000 (the bridge as its own process).
// Latency: BENCH_PORTS_ROUNDS rounds, each BENCH_PORTS_REQUESTS sequential requests to one way
// then the other (the order alternating per round, so both see the same machine), for a small
// answer (GET /, ~40 bytes) and 64 KiB (GET /bytes?n=65536); p50/p99 of each and the added
// latency (bridge minus direct, p50 and p99). Throughput: BENCH_PORTS_CONCURRENCY connections for
// BENCH_PORTS_SECONDS per way, alternating twice: requests per second (GET /).
// The load average is taken with every figure. Results: bench/results/ports.md and .json.
import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync, mkdtempSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import http from 'node:http';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { createBridgeClient } from '../client/index.js';
import { BOXD_NONCE_ANNOTATION, BOXD_PORT, boxdToken } from '../common/boxd.js';
import { startProgram, type Program } from './programs.js';
import { writeResults } from './results-file.js';
import { benchCluster, BOXD_IMAGE, createBenchPool, deletePool, ON_REAL_NODE, percentile, REAL_NODE_LABEL, waitUntil } from './setup.js';

const ROOT = process.cwd();
const ROUNDS = Number(process.env.BENCH_PORTS_ROUNDS ?? 10);
const REQUESTS = Number(process.env.BENCH_PORTS_REQUESTS ?? 200);
const SECONDS = Number(process.env.BENCH_PORTS_SECONDS ?? 5);
const CONCURRENCY = Number(process.env.BENCH_PORTS_CONCURRENCY ?? 8);
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
const APP_PORT = 8000;
const id = randomBytes(3).toString('hex');
const pool = `bench-ports-${id}`;
const ns = `${pool}-boxes`;
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');

const { kc, core, custom } = benchCluster(ROOT, KUBECONFIG);
const log = (msg: string) => process.stderr.write(`[bench:ports] ${msg}\n`);
const load1 = () => Number(loadavg()[0]!.toFixed(2));

interface Way {
  name: 'direct' | 'bridge';
  host: string;
  port: number;
  prefix: string;
  headers: Record<string, string>;
}

/** One request on the agent's connection; resolves with its milliseconds once the whole answer is read. */
function once(way: Way, agent: http.Agent, path: string): Promise<number> {
  const began = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.request({ host: way.host, port: way.port, path: `${way.prefix}${path}`, agent, headers: way.headers }, (res) => {
      let bytes = 0;
      res.on('data', (c: Buffer) => (bytes += c.length));
      res.on('end', () => (res.statusCode === 200 && bytes > 0 ? resolve(performance.now() - began) : reject(new Error(`${way.name} ${path}: ${res.statusCode}, ${bytes} bytes`))));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

const stats = (ms: number[]) => ({ n: ms.length, p50Ms: round(percentile(ms, 50)), p99Ms: round(percentile(ms, 99)) });
const round = (n: number) => Math.round(n * 1000) / 1000;

async function latency(ways: Way[], path: string): Promise<{ path: string; byWay: Record<'direct' | 'bridge', ReturnType<typeof stats>>; addedP50Ms: number; addedP99Ms: number; load1: number[] }> {
  const samples: Record<string, number[]> = { direct: [], bridge: [] };
  const loads: number[] = [];
  const agents = Object.fromEntries(ways.map((w) => [w.name, new http.Agent({ keepAlive: true, maxSockets: 1 })]));
  for (const w of ways) for (let i = 0; i < 20; i++) await once(w, agents[w.name]!, path); // warm the connection and the JIT
  for (let r = 0; r < ROUNDS; r++) {
    for (const w of r % 2 ? [...ways].reverse() : ways) {
      for (let i = 0; i < REQUESTS; i++) samples[w.name]!.push(await once(w, agents[w.name]!, path));
    }
    loads.push(load1());
  }
  for (const a of Object.values(agents)) a.destroy();
  const byWay = { direct: stats(samples.direct!), bridge: stats(samples.bridge!) };
  return { path, byWay, addedP50Ms: round(byWay.bridge.p50Ms - byWay.direct.p50Ms), addedP99Ms: round(byWay.bridge.p99Ms - byWay.direct.p99Ms), load1: loads };
}

async function throughput(way: Way): Promise<{ way: string; perSecond: number; p50Ms: number; p99Ms: number; load1: number }> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  const ms: number[] = [];
  const end = performance.now() + SECONDS * 1000;
  const began = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < end) ms.push(await once(way, agent, '/'));
    }),
  );
  const seconds = (performance.now() - began) / 1000;
  agent.destroy();
  return { way: way.name, perSecond: Math.round(ms.length / seconds), p50Ms: round(percentile(ms, 50)), p99Ms: round(percentile(ms, 99)), load1: load1() };
}

async function main() {
  if ((await core.listNode({ labelSelector: `${REAL_NODE_LABEL}=true` })).items.length === 0) {
    log('no real node: skipped');
    return;
  }
  const buildDir = mkdtempSync(join(tmpdir(), 'bench-portapp-'));
  const built = spawnSync('go', ['build', '-trimpath', '-ldflags=-s -w', '-o', join(buildDir, 'portapp'), './internal/testkit/portapp'], {
    cwd: join(ROOT, 'boxd'),
    env: { ...process.env, CGO_ENABLED: '0' },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  if (built.status !== 0) throw new Error('go build of portapp failed');
  const shared = { BOXD_IMAGE, BOXD_KEY: boxdKey };
  let operator: Program | undefined;
  let bridge: Program | undefined;
  try {
    await createBenchPool(
      { root: ROOT, kubeconfig: KUBECONFIG, core, custom },
      {
        name: pool,
        labels: { 'sandbox-bridge.io/bench': id },
        spec: { namespace: ns, maxBoxes: 2, maxBoxesPerSession: 1, box: { defaultImage: 'sandbox-bridge.local/box:dev', defaultCpu: '500m', defaultMemory: '256Mi', ...ON_REAL_NODE }, warm: { count: 0 } },
      },
    );
    operator = await startProgram(ROOT, 'dist/operator/main.js', KUBECONFIG, {
      ...shared,
      LEASE_NAMESPACE: 'default',
      LEASE_NAME: `${pool}-lease`,
      POD_NAME: `${pool}-operator`,
      POOL_SELECTOR: `sandbox-bridge.io/bench=${id}`,
    });
    bridge = await startProgram(ROOT, 'dist/bridge/main.js', KUBECONFIG, {
      ...shared,
      BRIDGE_TOKEN: token,
      POOL_NAME: pool,
      SANDBOX_NAMESPACE: ns,
      RATE_LIMIT_RPS: '100000',
      RATE_LIMIT_BURST: '200000',
    });
    const client = createBridgeClient({ url: `http://127.0.0.1:${bridge.port}`, token, retries: 2, timeoutMs: 300_000 });
    const box = (await client.createBox({ sessionId: `bench-ports-${id}` })).box_id;
    await client.writeFile(box, 'portapp', new Uint8Array(readFileSync(join(buildDir, 'portapp'))));
    await client.exec(box, { command: 'chmod +x portapp' });
    await client.startProcess(box, { command: `./portapp -listen 127.0.0.1:${APP_PORT}`, tag: 'portapp' });
    await waitUntil('portapp to answer', async () => (await client.portFetch(box, APP_PORT, '/')).status === 200, 30_000, 200);

    const pod = (await core.readNamespacedPod({ namespace: ns, name: box })).metadata!;
    const podIp = (await core.readNamespacedPod({ namespace: ns, name: box })).status!.podIP!;
    const credential = boxdToken(boxdKey, ns, box, pod.annotations![BOXD_NONCE_ANNOTATION]!);
    const ways: Way[] = [
      { name: 'direct', host: podIp, port: BOXD_PORT, prefix: `/v1/ports/${APP_PORT}`, headers: { 'x-boxd-token': credential } },
      { name: 'bridge', host: '127.0.0.1', port: bridge.port, prefix: `/api/v1/boxes/${box}/ports/${APP_PORT}`, headers: { authorization: `Bearer ${token}` } },
    ];
    log(`box ${box} at ${podIp}; latency, ${ROUNDS} x ${REQUESTS} per way and path`);
    const small = await latency(ways, '/');
    const large = await latency(ways, '/bytes?n=65536');
    log('throughput');
    const rates: Array<Awaited<ReturnType<typeof throughput>>> = [];
    for (const w of [...ways, ...[...ways].reverse()]) rates.push(await throughput(w));
    await client.deleteBox(box).catch(() => undefined);

    const perSecond = (name: string) => rates.filter((r) => r.way === name).map((r) => r.perSecond);
    const md = [
      '# Ports: the bridge route against boxd directly',
      '',
      `Generated by \`npm run bench:ports\` (bench/ports.ts) on ${new Date().toISOString()}. One box (500m) on the`,
      "local cluster's real node runs portapp on its loopback; both ways reach it from this machine over one",
      'reused keep-alive connection each: **direct** = boxd\'s `/v1/ports/8000/…` on the pod IP with the box credential;',
      '**bridge** = `/api/v1/boxes/:id/ports/8000/…` on a bridge process (bridge -> boxd -> app).',
      `Latency: ${ROUNDS} rounds x ${REQUESTS} sequential requests per way, the order alternating per round.`,
      '',
      '| answer | direct p50 / p99 ms | bridge p50 / p99 ms | added p50 / p99 ms | load1 during |',
      '|---|---|---|---|---|',
      ...[small, large].map(
        (l) =>
          `| GET ${l.path} | ${l.byWay.direct.p50Ms} / ${l.byWay.direct.p99Ms} | ${l.byWay.bridge.p50Ms} / ${l.byWay.bridge.p99Ms} | **${l.addedP50Ms}** / ${l.addedP99Ms} | ${Math.min(...l.load1)}-${Math.max(...l.load1)} |`,
      ),
      '',
      `Throughput, GET / with ${CONCURRENCY} connections for ${SECONDS} s per way (direct, bridge, bridge, direct):`,
      '',
      '| way | requests/s | p50 / p99 ms | load1 after |',
      '|---|---|---|---|',
      ...rates.map((r) => `| ${r.way} | ${r.perSecond} | ${r.p50Ms} / ${r.p99Ms} | ${r.load1} |`),
      '',
      `Target (issue 23): p50 added <= 1 ms on a reused connection: small answer ${small.addedP50Ms <= 1 ? 'met' : 'not met'} (${small.addedP50Ms} ms).`,
      `Mean requests/s: direct ${Math.round(perSecond('direct').reduce((a, b) => a + b, 0) / 2)}, bridge ${Math.round(perSecond('bridge').reduce((a, b) => a + b, 0) / 2)}.`,
      '',
    ].join('\n');
    writeResults(ROOT, 'ports', md, { at: new Date().toISOString(), rounds: ROUNDS, requests: REQUESTS, concurrency: CONCURRENCY, seconds: SECONDS, latency: [small, large], throughput: rates });
    process.stdout.write(`${md}\n`);
  } catch (err) {
    if (bridge) log(`last output of the bridge:\n${bridge.lines.slice(-15).join('\n')}`);
    if (operator) log(`last output of the operator:\n${operator.lines.slice(-15).join('\n')}`);
    throw err;
  } finally {
    await Promise.all([bridge?.stop(), operator?.stop()]);
    log('cleaning up');
    await deletePool(custom, pool);
    await core.deleteNamespace({ name: ns }).catch(() => undefined);
    await kc.makeApiClient(k8s.CoordinationV1Api).deleteNamespacedLease({ name: `${pool}-lease`, namespace: 'default' }).catch(() => undefined);
    rmSync(buildDir, { recursive: true, force: true });
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    log(String((err as Error).stack ?? err));
    process.exit(1);
  },
);
