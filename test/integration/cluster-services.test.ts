// Services and in-cluster API access on the real node, for real (test/cluster/real-node/up.sh):
// kube-proxy (iptables mode, the pod subnet as cluster CIDR) DNATs a ClusterIP to a pod without
// SNAT, so the backend sees the client pod's own IP (the egress gateway identifies boxes by it);
// the harness drops a Service IP that kube-proxy turns into an address no test registered; a pod
// with a service account reaches the API server through KUBERNETES_SERVICE_HOST/PORT and
// verifies its certificate; the box-tools image's curl speaks HTTPS to a test host with the
// test's CA. Nothing leaves this machine: every address used is a pod, the node or a test host.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { createTestNamespace, deleteTestNamespace, execInPod, exitCodeOf, realNodeBox, testKubeConfig, waitFor, waitRunning } from '../support/cluster.js';
import { BOX_TOOLS_IMAGE, TestHosts, inClusterApiUnavailable, servicesTestbed, testCertificates, type RealNodeNetwork } from '../support/test-hosts.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const discovery = kc.makeApiClient(k8s.DiscoveryV1Api);
const testbed = await servicesTestbed(kc);
if (!testbed.available) process.stderr.write(`\n[cluster-services] SKIPPING test/integration/cluster-services.test.ts: ${testbed.reason}\n`);
const apiUnavailable = testbed.available ? inClusterApiUnavailable() : undefined;
if (apiUnavailable) process.stderr.write(`\n[cluster-services] SKIPPING the in-cluster API test: ${apiUnavailable}\n`);

(testbed.available ? describe : describe.skip)('Services and in-cluster API access on the real node', () => {
  const net = (testbed as { net: RealNodeNetwork }).net;
  const o = net?.octet;
  const unregisteredHost = `10.250.${o}.20`; // a test host left out of the harness
  const tlsHost = `198.18.${o}.10`; // benchmarking range (RFC 2544): "public" to the gateway, yet on this machine
  const hosts = new TestHosts(net);
  let namespace = '';
  let tmp = '';
  let echoIP = '';
  let clientIP = '';
  let echoService = '';
  let nowhereService = '';

  /** Runs `script` with sh in a pod; stdout, and the exit code. */
  async function sh(pod: string, script: string): Promise<{ out: string; code: number; err: string }> {
    const r = await execInPod(kc, namespace, pod, 'box', ['sh', '-c', script]);
    return { out: r.stdout, code: exitCodeOf(r.status), err: r.stderr };
  }
  /** An HTTP GET from the client pod with busybox wget: the body, or '' when nothing answered. */
  // (busybox 1.35's static wget crashes with its own -T timeout option: `timeout` instead.)
  const get = async (url: string) => (await sh('client', `timeout 4 wget -q -O - ${url}; true`)).out;

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'svc', {
      'pod-security.kubernetes.io/enforce': 'restricted',
      'pod-security.kubernetes.io/enforce-version': 'latest',
    });
    tmp = mkdtempSync(join(tmpdir(), 'cluster-services-'));
    const certs = testCertificates(tmp, { dnsNames: ['tls.test'], ips: [tlsHost] });
    await hosts.add(unregisteredHost, { httpPorts: [80], register: false });
    await hosts.add(tlsHost, { httpsPorts: [443], tls: certs });
    await core.createNamespacedConfigMap({ namespace, body: { metadata: { name: 'test-ca' }, data: { 'ca.crt': readFileSync(certs.caCert, 'utf8') } } });

    // busybox httpd answers /cgi-bin/ip with the peer address it accepted the connection from.
    const cgi = `#!/bin/sh\\necho Content-Type: text/plain\\necho\\necho "$REMOTE_ADDR"\\n`;
    const echo = realNodeBox('echo', `mkdir -p /tmp/www/cgi-bin && printf '${cgi}' > /tmp/www/cgi-bin/ip && chmod 755 /tmp/www/cgi-bin/ip && exec httpd -f -p 0.0.0.0:8080 -h /tmp/www`, {
      labels: { app: 'svc-echo' },
    });
    const client = realNodeBox('client', 'exec sleep 3600');
    // box-tools: curl, with the service account token mounted and the test CA as curl's bundle.
    const tools = realNodeBox('tools', 'exec sleep 3600');
    tools.spec!.automountServiceAccountToken = true;
    tools.spec!.volumes!.push({ name: 'test-ca', configMap: { name: 'test-ca' } });
    const c = tools.spec!.containers[0]!;
    c.image = BOX_TOOLS_IMAGE;
    c.volumeMounts!.push({ name: 'test-ca', mountPath: '/etc/test-ca', readOnly: true });
    c.env = [{ name: 'CURL_CA_BUNDLE', value: '/etc/test-ca/ca.crt' }];
    await Promise.all([echo, client, tools].map((body) => core.createNamespacedPod({ namespace, body })));
    echoIP = (await waitRunning(kc, namespace, 'echo')).status!.podIP!;
    clientIP = (await waitRunning(kc, namespace, 'client')).status!.podIP!;
    await waitRunning(kc, namespace, 'tools');

    const echoSvc = await core.createNamespacedService({
      namespace,
      body: { metadata: { name: 'echo' }, spec: { selector: { app: 'svc-echo' }, ports: [{ port: 80, targetPort: 8080, protocol: 'TCP' }] } },
    });
    echoService = echoSvc.spec!.clusterIP!;
    // A Service without a selector whose endpoint is the unregistered test host.
    const nowhere = await core.createNamespacedService({ namespace, body: { metadata: { name: 'nowhere' }, spec: { ports: [{ port: 80, protocol: 'TCP' }] } } });
    nowhereService = nowhere.spec!.clusterIP!;
    await discovery.createNamespacedEndpointSlice({
      namespace,
      body: {
        metadata: { name: 'nowhere-1', labels: { 'kubernetes.io/service-name': 'nowhere' } },
        addressType: 'IPv4',
        endpoints: [{ addresses: [unregisteredHost], conditions: { ready: true } }],
        ports: [{ name: '', port: 80, protocol: 'TCP' }],
      },
    });
  }, 180_000);

  afterAll(async () => {
    hosts.close();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    if (namespace) await deleteTestNamespace(kc, namespace);
  });

  test("a ClusterIP Service leads a pod on the real node to a pod there, and the backend sees the client pod's own IP (no SNAT)", async () => {
    expect(net.serviceCIDRs?.length).toBeGreaterThan(0);
    const seen = await waitFor('the echo Service to answer', async () => (await get(`http://${echoService}/cgi-bin/ip`)) || undefined, {
      timeoutMs: 30_000,
      intervalMs: 500,
    });
    // Directly at the pod, for comparison: the same address.
    const direct = await get(`http://${echoIP}:8080/cgi-bin/ip`);
    expect({ seen, direct }).toEqual({ seen: `${clientIP}\n`, direct: `${clientIP}\n` });
  }, 60_000);

  test('the harness drops a Service IP that kube-proxy turns into an address no test registered; registered, the same Service answers', async () => {
    const svcDropped = () => {
      const out = readIptables(['-t', 'mangle', '-L', net.svcChain!, '-v', '-x', '-n']);
      const line = out.split('\n').find((l) => l.includes(net.hostsChain));
      return Number(line?.trim().split(/\s+/)[0] ?? NaN);
    };
    // Registered first, until it answers through the Service: kube-proxy has its DNAT in place.
    const registered = ['-d', unregisteredHost];
    hosts.allow(registered);
    await waitFor('the selector-less Service to answer', async () => ((await get(`http://${nowhereService}/`)) === `hello from ${unregisteredHost}:80\n` ? true : undefined), {
      timeoutMs: 30_000,
      intervalMs: 500,
    });
    hosts.disallow(registered);
    const before = svcDropped();
    const [viaService, direct] = await Promise.all([get(`http://${nowhereService}/`), get(`http://${unregisteredHost}/`)]);
    expect({ viaService, direct }).toEqual({ viaService: '', direct: '' });
    // The Service's packets were dropped after the DNAT, by the harness's post-DNAT check.
    expect(svcDropped()).toBeGreaterThan(before);
  }, 60_000);

  (apiUnavailable ? test.skip : test)(
    'a pod with a service account reaches the API server with in-cluster config, verifying its certificate for the Service IP',
    async () => {
      const kubernetes = await core.readNamespacedService({ namespace: 'default', name: 'kubernetes' });
      const sa = '/var/run/secrets/kubernetes.io/serviceaccount';
      const curl = `curl -sS --fail-with-body --max-time 10 --cacert ${sa}/ca.crt -H "Authorization: Bearer $(cat ${sa}/token)"`;
      const base = 'https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT';
      const env = await sh('tools', 'echo "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"');
      expect(env.out).toBe(`${kubernetes.spec!.clusterIP}:443\n`);
      const version = await sh('tools', `${curl} ${base}/version`);
      expect({ code: version.code, err: version.err }).toEqual({ code: 0, err: '' });
      expect(JSON.parse(version.out).gitVersion).toMatch(/^v1\.\d+\.\d+/);
      // Who the API server took the token for: this pod's service account.
      const review = await sh(
        'tools',
        `${curl} -X POST -H 'Content-Type: application/json' -d '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}' ${base}/apis/authentication.k8s.io/v1/selfsubjectreviews`,
      );
      expect(review.code).toBe(0);
      expect(JSON.parse(review.out).status.userInfo.username).toBe(`system:serviceaccount:${namespace}:default`);
    },
    60_000,
  );

  test("box-tools' curl does HTTPS to a test host with the test's CA (CURL_CA_BUNDLE); the image's system bundle alone refuses it", async () => {
    const resolve = `--resolve tls.test:443:${tlsHost}`;
    const headers = await sh('tools', `curl -sS --fail-with-body --max-time 10 ${resolve} -H 'X-Sandbox-Test: yes' https://tls.test/headers`);
    expect(headers.code).toBe(0);
    expect(JSON.parse(headers.out)).toMatchObject({ host: 'tls.test', 'x-sandbox-test': 'yes' });

    // 100 MiB streamed, checked byte for byte (byte i is i mod 256).
    const n = 100 * 1024 * 1024;
    const chunk = Buffer.from(Array.from({ length: 65536 }, (_, i) => i % 256));
    const want = createHash('sha256');
    for (let left = n; left > 0; left -= chunk.length) want.update(left >= chunk.length ? chunk : chunk.subarray(0, left));
    const bytes = await sh('tools', `curl -sS --fail-with-body --max-time 60 ${resolve} https://tls.test/bytes?n=${n} | sha256sum`);
    expect(bytes.out.split(' ')[0]).toBe(want.digest('hex'));

    const refused = await sh('tools', `unset CURL_CA_BUNDLE; curl -sS --max-time 10 ${resolve} https://tls.test/ >/dev/null 2>&1; echo "exit $?"`);
    expect(refused.out).toBe('exit 60\n'); // curl: peer certificate cannot be authenticated with known CA certificates
    const system = await sh('tools', 'head -c 27 /etc/ssl/certs/ca-certificates.crt');
    expect(system.out).toBe('-----BEGIN CERTIFICATE-----');
  }, 120_000);
});

function readIptables(args: string[]): string {
  const r = spawnSync('iptables', args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`iptables ${args.join(' ')} failed: ${r.stderr}`);
  return r.stdout;
}

if (!testbed.available) test.skip(`Services not testable here: ${testbed.reason}`, () => {});
