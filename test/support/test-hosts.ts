// Test hosts for network-policy tests: network namespaces this test creates on this machine,
// each holding one address in a range under test (10.x, 172.16.x, 100.64.x, link-local, a
// documentation "public" address) and running net-responder.mjs. They are routed from the host
// only, so the real node's pods reach them through the host and nothing goes off the machine;
// the harness (test/cluster/real-node/up.sh) drops everything pods send except to the addresses
// a test registers in its hosts chain, which add() does and close() undoes. Needs root.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
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

export class TestHosts {
  private readonly hosts: Array<{ ns: string; veth: string; address: string; server: ChildProcess }> = [];
  private readonly rules: string[][] = [];

  constructor(private readonly net: RealNodeNetwork) {}

  /**
   * A namespace with `address`, answering on `tcpPorts` (and DNS on 53 when `dns` names the
   * address to answer with). Pods reach it; registered in the harness while the test runs.
   */
  async add(address: string, options: { tcpPorts: number[]; dns?: string }): Promise<TestHost> {
    const n = this.hosts.length;
    const ns = `sbxth-${this.net.id}-${n}`;
    const veth = `th${this.net.id}${n}`; // at most 15 characters
    run(['ip', 'netns', 'add', ns]);
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
    this.allow(['-d', address]);

    const args = [join(process.cwd(), 'test/support/net-responder.mjs'), '--address', address, '--tcp', options.tcpPorts.join(',')];
    if (options.dns) args.push('--dns', options.dns);
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
