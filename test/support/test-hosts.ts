// Test hosts for tests on the real node: network namespaces this test creates on this machine,
// each holding one address in a range under test (10.x, 172.16.x, 100.64.x, link-local, a
// documentation or benchmarking "public" address) and running net-responder.mjs (raw TCP, HTTP,
// HTTPS with a certificate the test makes, DNS). They are routed from the host only, so the real
// node's pods reach them through the host and nothing goes off the machine; the harness
// (test/cluster/real-node/up.sh) drops everything pods send except to the addresses a test
// registers in its hosts chain, which add() does and close() undoes. Needs root.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type * as k8s from '@kubernetes/client-node';
import { realNodeAvailable } from './cluster.js';

/** What test/cluster/real-node/up.sh writes to .cluster/real-node/network.json. */
export interface RealNodeNetwork {
  id: string;
  podSubnet: string;
  nodeIP: string;
  /** iptables (mangle) chain the harness consults before dropping what pods send. */
  hostsChain: string;
  /** Third octet this checkout uses in test-host addresses, so checkouts never collide. */
  octet: number;
  /** The harness's post-DNAT check of Service IPs (absent in a network.json of an older up.sh). */
  svcChain?: string;
  /** The cluster's Service IP ranges (IPv4). */
  serviceCIDRs?: string[];
  /** Where the `kubernetes` Service leads pods: the API server's forwarder on the node IP. */
  apiForwarder?: { address: string; port: number };
}

export function realNodeNetwork(): RealNodeNetwork | undefined {
  const kubeconfig = process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG;
  const file = kubeconfig ? join(dirname(kubeconfig), 'real-node', 'network.json') : undefined;
  return file && existsSync(file) ? (JSON.parse(readFileSync(file, 'utf8')) as RealNodeNetwork) : undefined;
}

function run(argv: string[]): string {
  const res = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8' });
  if (res.status !== 0) throw new Error(`${argv.join(' ')} failed (${res.status}): ${res.stderr.trim()}`);
  return res.stdout;
}

export interface TestHost {
  name: string;
  address: string;
}

export interface TestHostOptions {
  /** Raw TCP: each connection gets `hello from <address>:<port>\n` and is closed. */
  tcpPorts?: number[];
  /** HTTP: `/` (the same hello), `/headers` (request headers as JSON), `/bytes?n=N` (N bytes). */
  httpPorts?: number[];
  /** HTTPS with `tls`, same paths as HTTP. */
  httpsPorts?: number[];
  /** PEM files (e.g. from testCertificates()): the server's certificate (chain) and key. */
  tls?: { cert: string; key: string };
  /** Serve DNS on 53, answering A queries under `.test.` with this address. */
  dns?: string;
  /** false: leave it out of the harness (pods' packets to it are dropped until allow()). */
  register?: boolean;
  /**
   * Instead of net-responder.mjs: another script of test/support/ run by node in the namespace
   * with these arguments (it must print `ready` once listening), e.g. egress-resolver.mjs.
   */
  script?: { file: string; args: string[] };
}

export class TestHosts {
  private readonly hosts: Array<{ ns: string; veth: string; address: string; server: ChildProcess }> = [];
  private readonly rules: string[][] = [];

  constructor(private readonly net: RealNodeNetwork) {}

  /**
   * A namespace with `address`, answering on the given ports (see TestHostOptions). Pods reach
   * it; registered in the harness while the test runs. Test files running at the same time may
   * each have hosts (names carry a random tag), but never two with the same address.
   */
  async add(address: string, options: TestHostOptions): Promise<TestHost> {
    const n = this.hosts.length;
    let ns = '';
    let veth = '';
    for (let attempt = 0; ; attempt++) {
      const tag = randomBytes(2).toString('hex');
      ns = `sbxth-${this.net.id}-${tag}`; // down.sh removes every sbxth-<id>-* left behind
      veth = `th${this.net.id}${tag}`; // 12 characters (at most 15)
      const made = spawnSync('ip', ['netns', 'add', ns], { encoding: 'utf8' });
      if (made.status === 0) break;
      if (attempt >= 4 || !/exists/i.test(made.stderr)) throw new Error(`ip netns add ${ns} failed (${made.status}): ${made.stderr.trim()}`);
    }
    this.hosts.push({ ns, veth, address, server: undefined as unknown as ChildProcess });
    run(['ip', 'link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
    run(['ip', '-n', ns, 'addr', 'add', `${address}/32`, 'dev', 'eth0']);
    run(['ip', '-n', ns, 'link', 'set', 'lo', 'up']);
    run(['ip', '-n', ns, 'link', 'set', 'eth0', 'up']);
    // Replies go to a link-local next hop the host answers ARP for (as Calico does for pods).
    run(['ip', '-n', ns, 'route', 'add', '169.254.1.1', 'dev', 'eth0', 'scope', 'link']);
    run(['ip', '-n', ns, 'route', 'add', this.net.podSubnet, 'via', '169.254.1.1', 'dev', 'eth0', 'onlink']);
    for (const [key, value] of [['proxy_arp', '1'], ['forwarding', '1']]) run(['sysctl', '-qw', `net.ipv4.conf.${veth}.${key}=${value}`]);
    run(['ip', 'link', 'set', veth, 'up']);
    run(['ip', 'route', 'add', `${address}/32`, 'dev', veth]);
    if (options.register !== false) this.allow(['-d', address]);

    const args = options.script
      ? [join(process.cwd(), 'test/support', options.script.file), '--address', address, ...options.script.args]
      : [join(process.cwd(), 'test/support/net-responder.mjs'), '--address', address, ...responderArgs(options)];
    const server = spawn('ip', ['netns', 'exec', ns, join(process.cwd(), 'node_modules/.bin/node'), ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.hosts[n]!.server = server;
    let output = '';
    await new Promise<void>((resolve, reject) => {
      const onData = (d: Buffer) => {
        output += d.toString();
        if (output.includes('ready')) resolve();
      };
      server.stdout!.on('data', onData);
      server.stderr!.on('data', (d: Buffer) => (output += d.toString()));
      server.once('exit', (code) => reject(new Error(`test host ${address} exited (${code}): ${output}`)));
    });
    return { name: ns, address };
  }

  /** Lets pods' packets matching `match` (iptables syntax) past the harness, until close(). */
  allow(match: string[]): void {
    // Above the chain's final DROP.
    run(['iptables', '-t', 'mangle', '-I', this.net.hostsChain, '1', ...match, '-j', 'RETURN']);
    this.rules.push(match);
  }

  /** Undoes one allow(match). */
  disallow(match: string[]): void {
    const i = this.rules.findIndex((m) => m.join(' ') === match.join(' '));
    if (i < 0) throw new Error(`disallow: no rule ${match.join(' ')}`);
    run(['iptables', '-t', 'mangle', '-D', this.net.hostsChain, ...match, '-j', 'RETURN']);
    this.rules.splice(i, 1);
  }

  /** Removes every namespace, veth, route, server and harness rule this object made. */
  close(): void {
    for (const h of this.hosts) {
      h.server?.kill('SIGKILL');
      // Deleting the namespace deletes the veth pair and with it the host route.
      spawnSync('ip', ['netns', 'delete', h.ns]);
      spawnSync('ip', ['link', 'delete', h.veth]);
    }
    for (const match of this.rules) spawnSync('iptables', ['-t', 'mangle', '-D', this.net.hostsChain, ...match, '-j', 'RETURN']);
    this.hosts.length = 0;
    this.rules.length = 0;
  }
}

/** net-responder.mjs's arguments for the servers `options` asks for. */
function responderArgs(options: TestHostOptions): string[] {
  const args: string[] = [];
  if (options.tcpPorts?.length) args.push('--tcp', options.tcpPorts.join(','));
  if (options.httpPorts?.length) args.push('--http', options.httpPorts.join(','));
  if (options.httpsPorts?.length) {
    if (!options.tls) throw new Error('httpsPorts need tls {cert, key}');
    args.push('--https', options.httpsPorts.join(','), '--cert', options.tls.cert, '--key', options.tls.key);
  }
  if (options.dns) args.push('--dns', options.dns);
  return args;
}

/**
 * Whether NetworkPolicy tests can run here: the real node is up, its NetworkPolicy enforcer
 * (felix) runs, and this process is root (test hosts need `ip netns`). When not, why.
 */
export async function networkPolicyTestbed(
  kc: k8s.KubeConfig,
): Promise<{ available: true; net: RealNodeNetwork } | { available: false; reason: string }> {
  const node = await realNodeAvailable(kc);
  if (!node.available) return { available: false, reason: `the real node is not available: ${node.reason}` };
  if (process.getuid?.() !== 0) return { available: false, reason: 'test hosts (network namespaces) need root' };
  const net = realNodeNetwork();
  const kubeconfig = process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG!;
  if (!net) return { available: false, reason: 'no .cluster/real-node/network.json (real node started by an older up.sh? run test/cluster/down.sh && test/cluster/up.sh)' };
  const unavailable = join(dirname(kubeconfig), 'netpol.unavailable');
  if (existsSync(unavailable)) return { available: false, reason: readFileSync(unavailable, 'utf8').trim() };
  const pidFile = join(dirname(kubeconfig), 'real-node', 'run', 'felix.pid');
  const pid = existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8')) : undefined;
  if (!pid || !existsSync(`/proc/${pid}`)) return { available: false, reason: 'the NetworkPolicy enforcer (felix) is not running; see .cluster/real-node/logs/felix.log' };
  return { available: true, net };
}

/** Images test/cluster/real-node/images.sh builds for the real node (imagePullPolicy Never). */
export const BOX_TOOLS_IMAGE = 'sandbox-bridge.local/box-tools:dev';
export const EGRESS_GATEWAY_IMAGE = 'sandbox-bridge.local/egress-gateway:dev';

/**
 * Builds (when its inputs changed) and imports one real-node image, e.g. the egress gateway from
 * the gateway/ sources as they are now: `images.sh --only <name>`. Throws with its output.
 */
export function importRealNodeImage(name: 'egress-gateway' | 'box-tools'): void {
  const res = spawnSync('bash', [join(process.cwd(), 'test/cluster/real-node/images.sh'), '--only', name], { encoding: 'utf8' });
  if (res.status !== 0) throw new Error(`images.sh --only ${name} failed (${res.status}):\n${res.stderr.split('\n').slice(-15).join('\n')}`);
}

/**
 * A CA and a server certificate it signed for `dnsNames` and `ips` (EC P-256, valid one day),
 * written as PEM files into `dir`: ca.crt, ca.key, server.crt, server.key.
 */
export function testCertificates(dir: string, names: { dnsNames?: string[]; ips?: string[] }): { caCert: string; caKey: string; cert: string; key: string } {
  const f = (name: string) => join(dir, name);
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  run(['openssl', 'req', '-x509', ...ec, '-keyout', f('ca.key'), '-out', f('ca.crt'), '-days', '1', '-subj', '/CN=sandbox-bridge test CA',
    '-addext', 'basicConstraints=critical,CA:TRUE,pathlen:0', '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
  const sans = [...(names.dnsNames ?? []).map((n) => `DNS:${n}`), ...(names.ips ?? []).map((ip) => `IP:${ip}`)];
  if (sans.length === 0) throw new Error('testCertificates: give at least one DNS name or IP');
  run(['openssl', 'req', '-new', ...ec, '-keyout', f('server.key'), '-out', f('server.csr'), '-subj', `/CN=${names.dnsNames?.[0] ?? names.ips![0]}`]);
  writeFileSync(f('server.ext'), `subjectAltName=${sans.join(',')}\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=critical,CA:FALSE\n`);
  run(['openssl', 'x509', '-req', '-in', f('server.csr'), '-CA', f('ca.crt'), '-CAkey', f('ca.key'), '-CAcreateserial', '-CAserial', f('ca.srl'),
    '-days', '1', '-extfile', f('server.ext'), '-out', f('server.crt')]);
  return { caCert: f('ca.crt'), caKey: f('ca.key'), cert: f('server.crt'), key: f('server.key') };
}

function recorded(file: string): string | undefined {
  const kubeconfig = process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG;
  const path = kubeconfig ? join(dirname(kubeconfig), file) : undefined;
  return path && existsSync(path) ? readFileSync(path, 'utf8').trim() : undefined;
}

/**
 * Whether ClusterIP Services work for the real node's pods (kube-proxy runs there, the harness
 * lets Service IPs through) and test hosts can be made (root). When not, why.
 */
export async function servicesTestbed(
  kc: k8s.KubeConfig,
): Promise<{ available: true; net: RealNodeNetwork } | { available: false; reason: string }> {
  const node = await realNodeAvailable(kc);
  if (!node.available) return { available: false, reason: `the real node is not available: ${node.reason}` };
  if (process.getuid?.() !== 0) return { available: false, reason: 'test hosts (network namespaces) need root' };
  const net = realNodeNetwork();
  if (!net?.svcChain) return { available: false, reason: 'the real node was started by an older up.sh (no Services): run test/cluster/real-node/up.sh again' };
  const why = recorded('services.unavailable');
  if (why) return { available: false, reason: why };
  const pidFile = join(dirname(process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG!), 'real-node', 'run', 'kube-proxy.pid');
  const pid = existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8')) : undefined;
  if (!pid || !existsSync(`/proc/${pid}`)) return { available: false, reason: 'kube-proxy is not running; see .cluster/real-node/logs/kube-proxy.log' };
  return { available: true, net };
}

/** Why pods on the real node cannot use in-cluster config (what up.sh recorded), if they cannot. */
export function inClusterApiUnavailable(): string | undefined {
  return recorded('in-cluster-api.unavailable');
}
