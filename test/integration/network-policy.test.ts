// The box NetworkPolicy, enforced for real: the operator turns a SandboxPool into its policy and
// the real node's enforcer (Calico felix, test/cluster/real-node/up.sh) applies it to real
// traffic between real pods, this machine and test hosts (network namespaces this test creates
// with addresses in the ranges under test). Each "cannot" is paired with a pod under no policy
// that can, so it is the policy, not the harness, that stops the box. Nothing is sent off this
// machine: the harness drops whatever pods send to an address no test registered.
import { spawnSync } from 'node:child_process';
import { createConnection } from 'node:net';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { BOXD_PORT } from '../../common/boxd.js';
import { POOL_DEFAULTS } from '../../common/pool.js';
import { CHART, KUBE_VERSION, helm, parseDocs, TOKEN, withValuesFile } from '../chart/helm.js';
import {
  createTestNamespace,
  deleteTestNamespace,
  execInPod,
  realNodeBox,
  testKubeConfig,
  waitFor,
  waitRunning,
} from '../support/cluster.js';
import { Pools, deleteLease, installCrd, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { TestHosts, networkPolicyTestbed, type RealNodeNetwork } from '../support/test-hosts.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const testbed = await networkPolicyTestbed(kc);
if (!testbed.available) process.stderr.write(`\n[network-policy] SKIPPING test/integration/network-policy.test.ts: ${testbed.reason}\n`);

(testbed.available ? describe : describe.skip)('box NetworkPolicy on the real node', () => {
  const net = (testbed as { net: RealNodeNetwork }).net;
  const o = net?.octet;
  // One address per range under test; the third octet is this checkout's, so checkouts never collide.
  const host = {
    private10: `10.250.${o}.10`,
    private172: `172.16.${o}.10`,
    private172b: `172.16.${o}.11`,
    shared: `100.64.${o}.10`,
    linkLocal: `169.254.${o}.254`, // stands for cloud metadata (169.254.169.254 itself is this VM's own metadata service)
    dns: `169.254.${o}.53`, // stands for NodeLocal DNSCache's 169.254.20.10
    public: `203.0.113.${o}`, // documentation range: "the internet", yet on this machine
  };
  const unregistered = `198.51.100.${o}`; // a route exists (the pods' default), nothing listens: the harness must drop it
  const shard = uniqueName('np');
  const pools = new Pools(kc, shard);
  const leaseName = `np-${shard}`;
  const hosts = new TestHosts(net);
  const ns: Record<'pool' | 'bridge' | 'control' | 'release', string> = { pool: '', bridge: '', control: '', release: '' };
  const dnsPod = `np-dns-${shard}`;
  const ip: Record<string, string> = {};
  let operator: OperatorProcess | undefined;
  let poolName = '';
  let apiProxy: TcpProxy | undefined;

  /** `nc` from a pod: what the peer answered, or '' when the connection failed. */
  async function probe(where: [string, string], address: string, port: number): Promise<string> {
    const r = await execInPod(kc, where[0], where[1], 'box', ['sh', '-c', `printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 ${address} ${port}; true`]);
    return r.stdout;
  }
  const box: [string, string] = ['', 'box-a'];
  const boxB: [string, string] = ['', 'box-b'];
  const bridgePod: [string, string] = ['', 'bridge'];
  const operatorPod: [string, string] = ['', 'operator'];
  const stranger: [string, string] = ['', 'stranger'];
  const control: [string, string] = ['', 'control'];

  beforeAll(async () => {
    await installCrd(kc);
    const restricted = { 'pod-security.kubernetes.io/enforce': 'restricted', 'pod-security.kubernetes.io/enforce-version': 'latest' };
    ns.bridge = await createTestNamespace(kc, 'np-bridge', restricted);
    ns.control = await createTestNamespace(kc, 'np-control', restricted);
    ns.release = await createTestNamespace(kc, 'np-release', restricted);
    bridgePod[0] = operatorPod[0] = stranger[0] = ns.bridge;
    control[0] = ns.control;

    operator = await startOperator({ shard, leaseName });
    const created = await pools.createReady({
      bridge: { namespace: ns.bridge, podLabels: { app: 'np-bridge' } },
      egress: { dns: { cidrs: [`${host.dns}/32`] } },
    });
    poolName = created.name;
    ns.pool = created.ns;
    box[0] = boxB[0] = ns.pool;

    // Test hosts: every one answers TCP 80; the DNS one also serves DNS on 53.
    for (const address of [host.private10, host.private172, host.private172b, host.shared, host.linkLocal, host.public]) {
      await hosts.add(address, { tcpPorts: [80] });
    }
    await hosts.add(host.dns, { tcpPorts: [80], dns: host.public });
    // The API server, reachable at the node's address (as it is at some address in any cluster),
    // and the kubelet: both registered in the harness, so only NetworkPolicy stands in the way.
    const server = new URL(kc.getCurrentCluster()!.server);
    apiProxy = new TcpProxy(server.hostname, Number(server.port), net.nodeIP);
    await apiProxy.start();
    hosts.allow(['-d', net.nodeIP, '-p', 'tcp', '--dport', String(apiProxy.port)]);
    hosts.allow(['-d', net.nodeIP, '-p', 'tcp', '--dport', '10250']);

    // The chart's NetworkPolicy for the bridge and operator, in a namespace of their own, with
    // the control namespace as the configured scraper.
    const rendered = withValuesFile(
      {
        secret: { token: TOKEN },
        rbac: { targetNamespace: ns.pool, createNamespace: false },
        networkPolicy: { metricsIngressFrom: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': ns.control } } }] },
        // The gateway's own policy is exercised with the gateway itself (egress-gateway.test.ts).
        egressGateway: { enabled: false },
      },
      (file) => helm(['template', 'np', CHART, '--namespace', ns.release, '--kube-version', KUBE_VERSION, '-f', file]),
    );
    // kubectl, not client-node: its models rename NetworkPolicy `from` (to `_from`) and would drop it from plain objects.
    const policies = parseDocs(rendered.stdout).filter((d) => d.kind === 'NetworkPolicy');
    expect(policies).toHaveLength(2);
    const applied = spawnSync(join(process.cwd(), '.cluster/bin/kubectl'), ['apply', '-n', ns.release, '-f', '-'], {
      input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: policies }),
      encoding: 'utf8',
      env: { ...process.env, KUBECONFIG: process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG },
    });
    if (applied.status !== 0) throw new Error(`kubectl apply failed: ${applied.stderr}`);
    const bridgeLabels = { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/instance': 'np', 'app.kubernetes.io/component': 'bridge' };

    const listen = (ports: Record<number, string>) =>
      `${Object.entries(ports).map(([port, say]) => `nc -ll -p ${port} -e echo ${say} &`).join(' ')} exec sleep 3600`;
    const pods: Array<[string, k8s.V1Pod]> = [
      [ns.pool, realNodeBox('box-a', 'exec sleep 3600', { labels: { 'sandbox-bridge.io/box': 'true' } })],
      [ns.pool, realNodeBox('box-b', listen({ [BOXD_PORT]: 'boxd', 8080: 'other' }), { labels: { 'sandbox-bridge.io/box': 'true' } })],
      [ns.bridge, realNodeBox('bridge', 'exec sleep 3600', { labels: { app: 'np-bridge' } })],
      // The pool's operatorPodLabels default (common/pool.ts): idle sleep reaches boxd from there.
      [ns.bridge, realNodeBox('operator', 'exec sleep 3600', { labels: { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/component': 'operator' } })],
      [ns.bridge, realNodeBox('stranger', 'exec sleep 3600', { labels: { 'app.kubernetes.io/name': 'sandbox-bridge' } })],
      // Stands for the egress gateway (the pool's egress.gateway.podLabels default): its proxy port and another.
      [
        ns.bridge,
        realNodeBox('gateway', listen({ 3128: 'gateway', 9090: 'gateway-metrics' }), {
          labels: { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/component': 'egress-gateway' },
        }),
      ],
      [ns.control, realNodeBox('control', 'exec sleep 3600')],
      [ns.release, realNodeBox('metrics', listen({ 9090: 'metrics' }), { labels: bridgeLabels })],
      ['kube-system', realNodeBox(dnsPod, listen({ 53: 'dns', 54: 'other' }), { labels: { 'k8s-app': 'kube-dns' } })],
    ];
    // Port 53 without privileges: lower the pod's first unprivileged port (a namespaced, safe sysctl).
    pods.find(([, p]) => p.metadata!.name === dnsPod)![1].spec!.securityContext!.sysctls = [{ name: 'net.ipv4.ip_unprivileged_port_start', value: '53' }];
    await Promise.all(pods.map(([namespace, body]) => core.createNamespacedPod({ namespace, body })));
    for (const [namespace, pod] of pods) {
      const running = await waitRunning(kc, namespace, pod.metadata!.name!, 120_000);
      ip[pod.metadata!.name!] = running.status!.podIP!;
    }
  }, 300_000);

  afterAll(async () => {
    hosts.close();
    await apiProxy?.stop();
    await core.deleteNamespacedPod({ namespace: 'kube-system', name: dnsPod, gracePeriodSeconds: 0 }).catch(() => undefined);
    for (const n of [ns.bridge, ns.control, ns.release]) if (n) await deleteTestNamespace(kc, n);
    await pools.cleanup();
    await operator?.stop();
    await deleteLease(kc, leaseName);
  }, 60_000);

  test('this machine reaches boxd in a box: the path kubelet probes and a bridge running on the node take', async () => {
    const answer = await new Promise<string>((resolve, reject) => {
      const socket = createConnection(BOXD_PORT, ip['box-b']);
      let got = '';
      socket.setTimeout(5000, () => socket.destroy(new Error('timed out')));
      socket.on('data', (d) => (got += d.toString()));
      socket.on('close', () => resolve(got));
      socket.on('error', reject);
    });
    expect(answer).toBe('boxd\n');
  });

  test("ingress: only the pool's bridge pods reach a box, and only boxd's port", async () => {
    expect(await probe(bridgePod, ip['box-b']!, BOXD_PORT)).toBe('boxd\n');
    const [otherPort, fromBox, fromControl] = await Promise.all([
      probe(bridgePod, ip['box-b']!, 8080),
      probe(box, ip['box-b']!, BOXD_PORT),
      probe(control, ip['box-b']!, BOXD_PORT),
    ]);
    expect({ otherPort, fromBox, fromControl }).toEqual({ otherPort: '', fromBox: '', fromControl: '' });
  });

  test("ingress: the pool's operator pods reach boxd too (idle sleep), and only boxd's port; other pods of their namespace do not", async () => {
    const [toBoxd, otherPort, fromStranger] = await Promise.all([
      probe(operatorPod, ip['box-b']!, BOXD_PORT),
      probe(operatorPod, ip['box-b']!, 8080),
      probe(stranger, ip['box-b']!, BOXD_PORT),
    ]);
    expect({ toBoxd, otherPort, fromStranger }).toEqual({ toBoxd: 'boxd\n', otherPort: '', fromStranger: '' });
  });

  test('egress: no private, shared or link-local test host answers a box; each answers a pod under no policy', async () => {
    for (const address of [host.private10, host.private172, host.shared, host.linkLocal]) {
      const [fromBox, fromControl] = await Promise.all([probe(box, address, 80), probe(control, address, 80)]);
      expect({ address, fromBox, fromControl }).toEqual({ address, fromBox: '', fromControl: `hello from ${address}:80\n` });
    }
  });

  test('egress: a public address is allowed by default', async () => {
    expect(await probe(box, host.public, 80)).toBe(`hello from ${host.public}:80\n`);
  });

  test('a box reaches neither the API server nor the kubelet on the node; a pod under no policy does', async () => {
    for (const port of [apiProxy!.port, 10250]) {
      const [fromBox, fromControl] = await Promise.all([probe(box, net.nodeIP, port), probe(control, net.nodeIP, port)]);
      // Both are TLS servers: a plain-text request gets their "400 Bad Request".
      expect({ port, fromBox, fromControl: fromControl.split('\r\n')[0] }).toEqual({ port, fromBox: '', fromControl: 'HTTP/1.0 400 Bad Request' });
    }
  });

  test('egress: other pods, even the bridge and its metrics port, are out of reach', async () => {
    const [toBridge, toMetrics] = await Promise.all([probe(box, ip.bridge!, BOXD_PORT), probe(box, ip.metrics!, 9090)]);
    expect({ toBridge, toMetrics }).toEqual({ toBridge: '', toMetrics: '' });
  });

  test("the chart's policy: bridge and operator metrics admit only the configured scraper", async () => {
    const [fromScraper, fromOtherPod] = await Promise.all([probe(control, ip.metrics!, 9090), probe(bridgePod, ip.metrics!, 9090)]);
    expect({ fromScraper, fromOtherPod }).toEqual({ fromScraper: 'metrics\n', fromOtherPod: '' });
  });

  test('DNS: a box resolves through a node-local DNS address on port 53 only, and reaches the cluster DNS pods on 53 only', async () => {
    const lookup = await execInPod(kc, box[0], box[1], 'box', ['nslookup', 'example.test', host.dns]);
    expect(lookup.stdout).toContain(`Address: ${host.public}`);
    const [dnsHostOther, dnsPodDns, dnsPodOther] = await Promise.all([
      probe(box, host.dns, 80),
      probe(box, ip[dnsPod]!, 53),
      probe(box, ip[dnsPod]!, 54),
    ]);
    expect({ dnsHostOther, dnsPodDns, dnsPodOther }).toEqual({ dnsHostOther: '', dnsPodDns: 'dns\n', dnsPodOther: '' });
  });

  test("changing the pool's egress takes effect: allowing one /32 opens that address only, removing it closes it", async () => {
    await pools.patchSpec(poolName, { egress: { allowedCIDRs: ['0.0.0.0/0', `${host.private172}/32`] } });
    await waitFor('the allowed test host to answer the box', async () => ((await probe(box, host.private172, 80)) ? true : undefined), {
      timeoutMs: 30_000,
      intervalMs: 500,
    });
    expect(await probe(box, host.private172b, 80)).toBe('');
    await pools.patchSpec(poolName, { egress: { allowedCIDRs: ['0.0.0.0/0'] } });
    await waitFor('the test host to be closed again', async () => ((await probe(box, host.private172, 80)) === '' ? true : undefined), {
      timeoutMs: 30_000,
      intervalMs: 500,
    });
  }, 90_000);

  test("a public address added to deniedCIDRs (a managed cluster's public API endpoint) is out of reach; removed, it answers again", async () => {
    expect(await probe(box, host.public, 80)).not.toBe('');
    await pools.patchSpec(poolName, { egress: { deniedCIDRs: [...POOL_DEFAULTS.egress.deniedCIDRs, `${host.public}/32`] } });
    await waitFor('the denied public address to be out of reach', async () => ((await probe(box, host.public, 80)) === '' ? true : undefined), {
      timeoutMs: 30_000,
      intervalMs: 500,
    });
    // An unpoliced pod still reaches it: the policy, not the harness, stops the box.
    expect(await probe(control, host.public, 80)).not.toBe('');
    await pools.patchSpec(poolName, { egress: { deniedCIDRs: POOL_DEFAULTS.egress.deniedCIDRs } });
    await waitFor('the public address to answer again', async () => ((await probe(box, host.public, 80)) ? true : undefined), { timeoutMs: 30_000, intervalMs: 500 });
  });

  test("gateway mode: a box reaches only the gateway's pods on the proxy port (and DNS); the public address no longer, until the pool is direct again", async () => {
    expect(await probe(box, ip.gateway!, 3128)).toBe(''); // direct mode: other pods are out of reach
    await pools.patchSpec(poolName, { egress: { mode: 'gateway', gateway: { namespace: ns.bridge } } });
    await waitFor('the gateway to answer the box', async () => ((await probe(box, ip.gateway!, 3128)) === 'gateway\n' ? true : undefined), {
      timeoutMs: 30_000,
      intervalMs: 500,
    });
    const [publicHost, gatewayOther, toDns, stranger] = await Promise.all([
      probe(box, host.public, 80),
      probe(box, ip.gateway!, 9090),
      probe(box, ip[dnsPod]!, 53),
      probe(box, ip.stranger!, 3128),
    ]);
    expect({ publicHost, gatewayOther, toDns, stranger }).toEqual({ publicHost: '', gatewayOther: '', toDns: 'dns\n', stranger: '' });
    // An unpoliced pod still reaches the public address: the policy, not the harness, stops the box.
    expect(await probe(control, host.public, 80)).not.toBe('');
    await pools.patchSpec(poolName, { egress: { mode: 'direct' } });
    await waitFor('the public address to answer again', async () => ((await probe(box, host.public, 80)) ? true : undefined), { timeoutMs: 30_000, intervalMs: 500 });
    expect(await probe(box, ip.gateway!, 3128)).toBe('');
  }, 90_000);

  test('the harness drops what pods send to an address no test registered, policy or not', async () => {
    const dropped = () => {
      const out = spawnSync('iptables', ['-t', 'mangle', '-L', net.hostsChain, '-v', '-x', '-n'], { encoding: 'utf8' }).stdout;
      const line = out.split('\n').find((l) => /\bDROP\b/.test(l));
      return Number(line?.trim().split(/\s+/)[0] ?? NaN);
    };
    const before = dropped();
    expect(await probe(control, unregistered, 80)).toBe('');
    expect(dropped()).toBeGreaterThan(before);
  });
});

if (!testbed.available) test.skip(`NetworkPolicy not testable here: ${testbed.reason}`, () => {});
