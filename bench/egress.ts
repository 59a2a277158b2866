// Bench: the egress gateway on the local cluster's real node (issue 22).
//
//   npm run bench:egress   (BENCH_EGRESS_ROUNDS=5 BENCH_EGRESS_MIB=100 BENCH_EGRESS_REQUESTS=200
//                           BENCH_EGRESS_CONNS=1000)
//
// The chart's gateway (2 replicas, test/support/egress-gateway.ts) in front of an HTTPS test
// host in a network namespace of this machine (never a real internet address). Side by side in
// one run, rounds alternating:
// 1. Throughput: a BENCH_EGRESS_MIB download by curl in a box, direct (a box of a direct-mode pool
//    to the host's address), passed through (a gateway-mode box, no credentials for the host) and
//    intercepted (credentials registered for the host: TLS ends at the gateway).
// 2. Latency per HTTPS request on a reused connection: BENCH_EGRESS_REQUESTS small requests in one
//    curl (one connection, the first request dropped), the same three ways; added = p50 - direct p50.
// 3. Gateway CPU per GB relayed (both gateway pods' cgroup CPU time over the downloads of 1.).
// 4. Gateway memory with BENCH_EGRESS_CONNS concurrent tunnels through one replica (boxes of 250
//    slow transfers each): the pod's memory cgroup rss before and with them open.
// Results go to bench/results/egress.md and .json.
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import type { BridgeClient } from '../client/index.js';
import { deployGatewayOnRealNode, metricValue, type GatewayOnRealNode } from '../test/support/egress-gateway.js';
import { BOX_TOOLS_IMAGE, TestHosts, importRealNodeImage, realNodeNetwork, testCertificates } from '../test/support/test-hosts.js';
import { writeResults } from './results-file.js';
import { createBenchPool, deletePool, ensureCluster, kubectl, ON_REAL_NODE, percentile, startBenchBridge, startBenchOperator, stats, waitUntil } from './setup.js';

const ROOT = process.cwd();
const ROUNDS = Number(process.env.BENCH_EGRESS_ROUNDS ?? 5);
const MIB = Number(process.env.BENCH_EGRESS_MIB ?? 100);
const REQUESTS = Number(process.env.BENCH_EGRESS_REQUESTS ?? 200);
const CONNS = Number(process.env.BENCH_EGRESS_CONNS ?? 1000);
const PER_BOX = 250; // under the gateway's default -max-conns-per-box (256)
const KUBECONFIG = process.env.KUBECONFIG ?? join(ROOT, '.cluster/kubeconfig');
process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG = KUBECONFIG; // what test/support reads
const id = randomBytes(3).toString('hex');
const token = randomBytes(24).toString('hex');
const boxdKey = randomBytes(32).toString('hex');
const egressKey = randomBytes(24).toString('hex');
const log = (msg: string) => process.stderr.write(`[bench:egress] ${msg}\n`);
const NAMES = ['bytes.test', 'creds.test'];
const CA = '/workspace/test-ca.pem';

type Mode = 'direct' | 'pass-through' | 'intercepted';

ensureCluster(ROOT, KUBECONFIG, []);
const net = realNodeNetwork();
if (!net?.svcChain) throw new Error('the real node has no Services (kube-proxy): run test/cluster/up.sh');
const kc = new k8s.KubeConfig();
kc.loadFromFile(KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const web = `198.18.${net.octet}.40`;

/** A pod's cgroup directory under a controller (cgroup v1, the real node's cgroup root). */
function podCgroup(controller: string, uid: string): string {
  const base = `/sys/fs/cgroup/${controller}/sandbox-bridge-${net!.id}/kubepods`;
  for (const qos of ['', 'burstable', 'besteffort']) {
    const dir = join(base, qos);
    if (!existsSync(dir)) continue;
    const hit = readdirSync(dir).find((d) => d === `pod${uid}` || d === `pod${uid.replaceAll('-', '_')}`);
    if (hit) return join(dir, hit);
  }
  throw new Error(`no ${controller} cgroup for pod ${uid}`);
}
const cpuNs = (pod: k8s.V1Pod) => Number(readFileSync(join(podCgroup('cpuacct', pod.metadata!.uid!), 'cpuacct.usage'), 'utf8'));
const rssBytes = (pod: k8s.V1Pod) => {
  const stat = readFileSync(join(podCgroup('memory', pod.metadata!.uid!), 'memory.stat'), 'utf8');
  return Number(/^total_rss (\d+)$/m.exec(stat)?.[1] ?? NaN);
};

async function main() {
  importRealNodeImage('box-tools');
  const dir = mkdtempSync(join(tmpdir(), 'bench-egress-'));
  const certs = testCertificates(dir, { dnsNames: NAMES });
  const hosts = new TestHosts(net!);
  const cleanups: Array<() => Promise<unknown> | unknown> = [() => hosts.close(), () => rmSync(dir, { recursive: true, force: true })];
  try {
    await hosts.add(web, { httpsPorts: [443], tls: { cert: certs.cert, key: certs.key } });
    const operator = await startBenchOperator(ROOT, KUBECONFIG, { pool: `bench-egress-${id}`, id, boxdKey, env: { EGRESS_KEY: egressKey } });
    cleanups.push(() => operator.kill('SIGTERM'));
    const labels = { 'sandbox-bridge.io/bench': id };
    const box = { ...ON_REAL_NODE, defaultImage: BOX_TOOLS_IMAGE, defaultCpu: '500m', defaultMemory: '256Mi' };
    const pools = {
      gateway: { name: `bench-egw-${id}`, ns: `bench-egw-${id}-boxes` },
      direct: { name: `bench-egd-${id}`, ns: `bench-egd-${id}-boxes` },
    };
    for (const p of Object.values(pools)) {
      cleanups.push(async () => {
        await deletePool(custom, p.name);
        await core.deleteNamespace({ name: p.ns }).catch(() => undefined);
      });
    }
    const opts = { root: ROOT, kubeconfig: KUBECONFIG, core, custom };
    await createBenchPool(opts, {
      name: pools.gateway.name,
      labels,
      spec: { namespace: pools.gateway.ns, maxBoxes: 10, box, egress: { mode: 'gateway', domains: { allow: NAMES } } },
    });
    await createBenchPool(opts, { name: pools.direct.name, labels, spec: { namespace: pools.direct.ns, maxBoxes: 10, box } });
    await waitUntil('the pools to be ready', async () => {
      const ready = await Promise.all(Object.values(pools).map(async (p) => {
        const obj = (await custom.getClusterCustomObject({ group: 'sandbox-bridge.io', version: 'v1alpha1', plural: 'sandboxpools', name: p.name })) as {
          status?: { conditions?: Array<{ type: string; status: string }> };
        };
        return obj.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
      }));
      return ready.every(Boolean);
    }, 60_000);
    const gw: GatewayOnRealNode = await deployGatewayOnRealNode({
      kc,
      net: net!,
      poolNamespace: pools.gateway.ns,
      key: egressKey,
      resolverKey: randomBytes(24).toString('hex'),
      upstreamCA: readFileSync(certs.caCert, 'utf8'),
      hostAliases: [{ ip: web, hostnames: NAMES }],
      resources: { requests: { cpu: '100m', memory: '64Mi' }, limits: { cpu: '1', memory: '512Mi' } },
    });
    cleanups.push(() => gw.stop());
    await custom.patchClusterCustomObject(
      { group: 'sandbox-bridge.io', version: 'v1alpha1', plural: 'sandboxpools', name: pools.gateway.name, body: { spec: { egress: { gateway: gw.poolGateway } } } },
      k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
    );
    await waitUntil('the box policy to name the gateway', async () => kubectl(ROOT, KUBECONFIG, 'get', 'networkpolicy', '-n', pools.gateway.ns, '-o', 'json').includes(gw.namespace), 60_000);

    const bridges: Record<'gateway' | 'direct', BridgeClient> = {} as never;
    for (const [k, p] of Object.entries(pools) as Array<['gateway' | 'direct', { name: string; ns: string }]>) {
      const b = await startBenchBridge(ROOT, KUBECONFIG, { token, boxdKey, pool: p.name, namespace: p.ns, env: { EGRESS_KEY: egressKey } });
      cleanups.push(() => b.child.kill('SIGTERM'));
      bridges[k] = b.client;
    }
    const caPem = readFileSync(certs.caCert, 'utf8');
    const makeBox = async (which: 'gateway' | 'direct', shape: { cpu?: number; memory?: number } = {}) => {
      const created = await bridges[which].createBox({ sessionId: `bench-egress-${which}-${randomBytes(3).toString('hex')}`, ...shape });
      await bridges[which].writeFile(created.box_id, CA, caPem);
      return created.box_id;
    };
    const gwBox = await makeBox('gateway');
    const directBox = await makeBox('direct');
    await bridges.gateway.setEgressCredentials(gwBox, { 'creds.test': { 'X-Bench-Token': randomBytes(16).toString('hex') } });
    const sh = async (which: 'gateway' | 'direct', boxId: string, command: string) => {
      const r = await bridges[which].exec(boxId, { command, timeoutMs: 600_000 });
      if (r.exit_code !== 0) throw new Error(`${command}: exit ${r.exit_code}: ${r.stderr}`);
      return r.stdout;
    };
    const url = (mode: Mode, path: string) => `https://${mode === 'intercepted' ? 'creds.test' : 'bytes.test'}${path}`;
    const curlArgs = (mode: Mode) => (mode === 'direct' ? `--cacert ${CA} --resolve bytes.test:443:${web}` : mode === 'pass-through' ? `--cacert ${CA}` : '');
    const target = (mode: Mode): ['gateway' | 'direct', string] => (mode === 'direct' ? ['direct', directBox] : ['gateway', gwBox]);
    const modes: Mode[] = ['direct', 'pass-through', 'intercepted'];
    const bytes = MIB * 1024 * 1024;

    // Warm up each path once (page cache of the test host's generator, TLS session tickets, the gateway's leaf).
    for (const mode of modes) await sh(...target(mode), `curl -sS -o /dev/null ${curlArgs(mode)} ${url(mode, '/bytes?n=1048576')}`);

    // 1 + 3. Throughput, and the gateway's CPU over the proxied downloads.
    const speeds: Record<Mode, number[]> = { direct: [], 'pass-through': [], intercepted: [] };
    const gwCpu: Record<Mode, number> = { direct: 0, 'pass-through': 0, intercepted: 0 };
    const gwBytes: Record<Mode, number> = { direct: 0, 'pass-through': 0, intercepted: 0 };
    for (let round = 0; round < ROUNDS; round++) {
      for (const mode of modes) {
        const pods = await gw.readyPods();
        const before = pods.map(cpuNs);
        const out = await sh(...target(mode), `curl -sS -o /dev/null -w '%{speed_download} %{size_download}' ${curlArgs(mode)} '${url(mode, `/bytes?n=${bytes}`)}'`);
        const after = pods.map(cpuNs);
        const [speed, size] = out.trim().split(' ').map(Number) as [number, number];
        if (size !== bytes) throw new Error(`${mode}: downloaded ${size} of ${bytes} bytes`);
        speeds[mode].push(speed / 1e6);
        gwCpu[mode] += after.reduce((s, v, i) => s + (v - before[i]!), 0) / 1e9;
        gwBytes[mode] += size;
        log(`round ${round + 1}/${ROUNDS} ${mode}: ${(speed / 1e6).toFixed(1)} MB/s`);
      }
    }

    // 2. Latency per request on one reused connection.
    const latency: Record<Mode, number[]> = { direct: [], 'pass-through': [], intercepted: [] };
    for (let round = 0; round < 3; round++) {
      for (const mode of modes) {
        const cfg = `/tmp/urls-${mode}.cfg`;
        const out = await sh(
          ...target(mode),
          `for i in $(seq ${REQUESTS + 1}); do echo 'url = "${url(mode, '/bytes?n=64')}"'; echo 'output = "/dev/null"'; done > ${cfg}; ` +
            `curl -sS ${curlArgs(mode)} -w '%{time_total} %{num_connects}\\n' -K ${cfg}`,
        );
        const lines = out.trim().split('\n').map((l) => l.split(' ').map(Number) as [number, number]);
        const reused = lines.slice(1);
        if (reused.some(([, connects]) => connects !== 0)) throw new Error(`${mode}: curl opened new connections instead of reusing one`);
        latency[mode].push(...reused.map(([t]) => t * 1000));
      }
    }

    // 4. Memory with CONNS concurrent tunnels through one replica.
    const [replica] = await gw.readyPods();
    const rssIdle = rssBytes(replica!);
    const holders = Math.ceil(CONNS / PER_BOX);
    const holderBoxes: string[] = [];
    for (let i = 0; i < holders; i++) holderBoxes.push(await makeBox('gateway', { cpu: 0.1, memory: 128 }));
    const started: Array<{ box: string; process: string }> = [];
    for (const [i, b] of holderBoxes.entries()) {
      const n = Math.min(PER_BOX, CONNS - i * PER_BOX);
      const cfg = '/tmp/hold.cfg';
      const cmd =
        `for i in $(seq ${n}); do echo 'url = "https://bytes.test/bytes?n=100000000"'; echo 'output = "/dev/null"'; done > ${cfg}; ` +
        `exec curl -sS --parallel --parallel-immediate --parallel-max ${n} --limit-rate 1K ` +
        `-x "http://$SANDBOX_EGRESS_POD:$SANDBOX_EGRESS_CREDENTIAL@${replica!.status!.podIP}:3128" --cacert ${CA} -K ${cfg}`;
      const p = await bridges.gateway.startProcess(b, { command: cmd });
      started.push({ box: b, process: p.process_id });
    }
    let open = 0;
    await waitUntil(
      `${CONNS} tunnels open through ${replica!.metadata!.name}`,
      async () => {
        open = metricValue(await gw.metrics(replica!), 'egress_gateway_active_connections');
        return open >= CONNS;
      },
      120_000,
      1000,
    );
    const cpuBefore = cpuNs(replica!);
    await new Promise((r) => setTimeout(r, 10_000));
    const heldCpu = (cpuNs(replica!) - cpuBefore) / 1e9 / 10;
    const rssHeld = rssBytes(replica!);
    for (const s of started) await bridges.gateway.signalProcess(s.box, s.process, 'KILL').catch(() => undefined);

    // Results.
    const st = (v: number[]) => ({ ...stats(v), p50: percentile(v, 50) });
    const tput = Object.fromEntries(modes.map((m) => [m, st(speeds[m])])) as Record<Mode, ReturnType<typeof st>>;
    const lat = Object.fromEntries(modes.map((m) => [m, st(latency[m])])) as Record<Mode, ReturnType<typeof st>>;
    const cpuPerGB = (m: Mode) => (gwCpu[m] / (gwBytes[m] / 1e9));
    const loadavg = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
    const json = {
      when: new Date().toISOString(),
      loadavg,
      rounds: ROUNDS,
      mib: MIB,
      throughputMBps: tput,
      ratioToDirect: { 'pass-through': tput['pass-through'].p50 / tput.direct.p50, intercepted: tput.intercepted.p50 / tput.direct.p50 },
      latencyMs: lat,
      addedLatencyMs: { 'pass-through': lat['pass-through'].p50 - lat.direct.p50, intercepted: lat.intercepted.p50 - lat.direct.p50 },
      gatewayCpuSecondsPerGB: { 'pass-through': cpuPerGB('pass-through'), intercepted: cpuPerGB('intercepted'), direct: cpuPerGB('direct') },
      connections: { target: CONNS, open, rssIdleMiB: rssIdle / 2 ** 20, rssHeldMiB: rssHeld / 2 ** 20, perConnectionKiB: (rssHeld - rssIdle) / open / 1024, cpuCoresWhileHeld: heldCpu },
    };
    const f1 = (v: number) => v.toFixed(1);
    const f2 = (v: number) => v.toFixed(2);
    const md = `# Egress gateway

\`npm run bench:egress\` (bench/egress.ts), ${json.when}, load average at the end ${loadavg}. The chart's gateway (2 replicas, 100m/64Mi requested, 1 CPU/512Mi limit) on the real node, an HTTPS test host (node, in a network namespace) on this machine, boxes of 0.5 CPU / 256 MiB with curl 7.88 (box-tools image). Everything shares 2 cores: the test host, the gateway, the box, the bridge and the load.

## Throughput: a ${MIB} MiB HTTPS download, ${ROUNDS} rounds alternating

| path | p50 MB/s | p99 MB/s | min–max | vs direct (p50) | target |
|---|---|---|---|---|---|
| direct (a direct-mode box to the host's address) | ${f1(tput.direct.p50)} | ${f1(tput.direct.p99)} | ${f1(Math.min(...speeds.direct))}–${f1(tput.direct.max)} | 1.00x | |
| through the gateway, passed through | ${f1(tput['pass-through'].p50)} | ${f1(tput['pass-through'].p99)} | ${f1(Math.min(...speeds['pass-through']))}–${f1(tput['pass-through'].max)} | ${f2(json.ratioToDirect['pass-through'])}x | >= 0.8x |
| through the gateway, intercepted (credentials injected) | ${f1(tput.intercepted.p50)} | ${f1(tput.intercepted.p99)} | ${f1(Math.min(...speeds.intercepted))}–${f1(tput.intercepted.max)} | ${f2(json.ratioToDirect.intercepted)}x | >= 0.5x |

## Latency per HTTPS request on a reused connection (${REQUESTS} requests x 3 rounds, 64-byte answers)

| path | p50 ms | p99 ms | added p50 ms | target |
|---|---|---|---|---|
| direct | ${f2(lat.direct.p50)} | ${f2(lat.direct.p99)} | | |
| passed through | ${f2(lat['pass-through'].p50)} | ${f2(lat['pass-through'].p99)} | ${f2(json.addedLatencyMs['pass-through'])} | <= 1 ms |
| intercepted | ${f2(lat.intercepted.p50)} | ${f2(lat.intercepted.p99)} | ${f2(json.addedLatencyMs.intercepted)} | |

## Gateway cost

| measure | figure |
|---|---|
| CPU per GB relayed, passed through (both pods' cgroup CPU time / bytes) | ${f2(json.gatewayCpuSecondsPerGB['pass-through'])} CPU-s/GB |
| CPU per GB relayed, intercepted | ${f2(json.gatewayCpuSecondsPerGB.intercepted)} CPU-s/GB |
| CPU of the gateway while the direct downloads ran (its idle baseline) | ${f2(json.gatewayCpuSecondsPerGB.direct)} CPU-s per GB moved elsewhere |
| memory (pod memory cgroup rss), idle | ${f1(json.connections.rssIdleMiB)} MiB |
| memory with ${open} concurrent tunnels open through one replica | ${f1(json.connections.rssHeldMiB)} MiB (${f1(json.connections.perConnectionKiB)} KiB per connection) |
| CPU of that replica while holding them (1 KB/s each) | ${f2(heldCpu)} cores |
`;
    writeResults(ROOT, 'egress', md, json);
    log('results in bench/results/egress.md');
  } finally {
    for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => undefined);
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`[bench:egress] failed: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exit(1);
  },
);
