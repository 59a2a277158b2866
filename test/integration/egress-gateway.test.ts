// The egress gateway for real (issue 22): the chart's gateway (2 replicas) on the real node behind
// its Service, the operator keeping the pool CA, the bridge making boxes of a gateway-mode pool
// with the box-tools image (busybox + curl), and test hosts in network namespaces this test
// creates: an HTTP(S) server with a certificate from a test CA for every name below, and the
// platform's credential resolver. The box NetworkPolicy is enforced (Calico felix) and kube-proxy
// routes the Service. Nothing leaves this machine: the harness drops what pods send anywhere else.
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import * as k8s from '@kubernetes/client-node';
import { ON_REAL_NODE, api } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, execInPod, realNodeBox, waitRunning } from '../support/cluster.js';
import { deployGatewayOnRealNode, metricValue, type GatewayOnRealNode } from '../support/egress-gateway.js';
import { boxPods, core, eventsAbout, kc, startLifecycle, until, type LifecycleEnv } from '../support/lifecycle.js';
import { localObjectStore, storeFilesOf } from '../support/object-store.js';
import {
  BOX_TOOLS_IMAGE,
  TestHosts,
  importRealNodeImage,
  inClusterApiUnavailable,
  networkPolicyTestbed,
  servicesTestbed,
  testCertificates,
  type RealNodeNetwork,
} from '../support/test-hosts.js';

const services = await servicesTestbed(kc);
const netpol = await networkPolicyTestbed(kc);
const store = await localObjectStore();
const skipReason = !services.available
  ? services.reason
  : !netpol.available
    ? netpol.reason
    : inClusterApiUnavailable() ?? (!store.available ? `no object store: ${store.reason}` : undefined);
if (skipReason) process.stderr.write(`\n[egress-gateway] SKIPPING test/integration/egress-gateway.test.ts: ${skipReason}\n`);
const suite = skipReason ? describe.skip : describe;

const NAMES = ['allowed.test', 'www.wild.test', 'deny.wild.test', 'wild.test', 'other.test', 'creds.test', 'resolved.test', 'plain.test', 'bytes.test'];
const ALLOW = ['allowed.test', '*.wild.test', 'creds.test', 'resolved.test', 'plain.test', 'bytes.test'];
const KEY = randomBytes(24).toString('hex');
const RESOLVER_KEY = randomBytes(24).toString('hex');
/** What the platform keeps out of the box: a registered credential and one its resolver hands out. */
const SECRET = `reg-${randomBytes(16).toString('hex')}`;
const RESOLVED = `res-${randomBytes(16).toString('hex')}`;
const TEST_CA = '/workspace/test-ca.pem';

interface Run {
  exit_code: number;
  stdout: string;
  stderr: string;
}

suite('the egress gateway on the real node', () => {
  const net = (services as { net: RealNodeNetwork }).net;
  const web = `198.18.${net?.octet}.30`; // benchmarking range: "public" to the gateway, yet on this machine
  const resolver = `198.18.${net?.octet}.31`;
  const hosts = net ? new TestHosts(net) : undefined;
  let dir = '';
  let env: LifecycleEnv;
  let gw: GatewayOnRealNode;
  let call: ReturnType<typeof api>;
  let box = '';
  let boxPod: k8s.V1Pod;
  let controlNs = '';

  beforeAll(async () => {
    importRealNodeImage('box-tools');
    dir = mkdtempSync(join(tmpdir(), 'egress-gw-'));
    const certs = testCertificates(dir, { dnsNames: NAMES });
    await hosts!.add(web, { httpPorts: [80], httpsPorts: [443], tls: { cert: certs.cert, key: certs.key } });
    writeFileSync(join(dir, 'resolver-key'), `${RESOLVER_KEY}\n`);
    writeFileSync(join(dir, 'answers.json'), JSON.stringify({ 'resolved.test': { headers: { 'X-Resolved': RESOLVED }, ttl_seconds: 60 } }));
    await hosts!.add(resolver, {
      script: {
        file: 'egress-resolver.mjs',
        args: ['--port', '8080', '--key-file', join(dir, 'resolver-key'), '--answers', join(dir, 'answers.json'), '--log', join(dir, 'resolver.log')],
      },
    });

    env = await startLifecycle({
      name: 'egress-gw',
      pool: {
        box: { ...ON_REAL_NODE.box, defaultImage: BOX_TOOLS_IMAGE },
        egress: {
          mode: 'gateway',
          domains: { allow: ALLOW, deny: ['deny.wild.test'], plainHttp: ['plain.test'] },
          credentialResolver: { url: `http://${resolver}:8080/resolve`, hosts: ['resolved.test'], ttlSeconds: 3 },
        },
      },
      operatorEnv: { EGRESS_KEY: KEY },
      bridgeEnv: { EGRESS_KEY: KEY },
    });
    call = api(env.bridges[0]!);
    gw = await deployGatewayOnRealNode({
      kc,
      net,
      poolNamespace: env.pool.ns,
      key: KEY,
      resolverKey: RESOLVER_KEY,
      upstreamCA: readFileSync(certs.caCert, 'utf8'),
      hostAliases: [{ ip: web, hostnames: NAMES }],
    });
    await env.pools.patchSpec(env.pool.name, { egress: { gateway: gw.poolGateway } });
    // The operator moves the box NetworkPolicy to the gateway's namespace; the bridge's pool watch
    // sees the new address at the same time, so a box made after this points at the gateway.
    await until('the box NetworkPolicy to name the gateway', async () => {
      const policies = await kc.makeApiClient(k8s.NetworkingV1Api).listNamespacedNetworkPolicy({ namespace: env.pool.ns });
      return JSON.stringify(policies.items).includes(gw.namespace) ? true : undefined;
    });
    await new Promise((r) => setTimeout(r, 1000));
    const created = await call('POST', '/boxes', { sessionId: `egress-gw-${randomBytes(3).toString('hex')}`, cpu: 0.25, memory: 128 });
    expect(created.status).toBe(201);
    box = created.json.box_id;
    await until('the box to run', async () => ((await call('GET', `/boxes/${box}/status`)).json.status === 'Running' ? true : undefined));
    boxPod = (await boxPods(env.pool.ns, box)).find((p) => !p.metadata?.deletionTimestamp)!;
    expect((await call('PUT', `/boxes/${box}/files?path=${TEST_CA}`, readFileSync(certs.caCert, 'utf8'))).status).toBe(200);
    expect((await sh('echo "$HTTPS_PROXY"')).stdout).toContain(`@${gw.serviceIP}:3128`);
  }, 400_000);

  afterAll(async () => {
    if (controlNs) await deleteTestNamespace(kc, controlNs);
    await env?.stop();
    await gw?.stop();
    hosts?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  }, 120_000);

  async function sh(command: string): Promise<Run> {
    const r = await call('POST', `/boxes/${box}/exec`, { command, timeoutMs: 60_000 });
    expect({ status: r.status, body: r.status === 200 ? 'ok' : r.json }).toEqual({ status: 200, body: 'ok' });
    return r.json as Run;
  }
  /** curl from the box (through the proxy its env names, unless args say otherwise). */
  const curl = (args: string) => sh(`curl -sS --max-time 20 ${args}`);
  /** Through one gateway replica: its pod IP instead of the Service (boxes may reach the pods directly). */
  const via = (pod: k8s.V1Pod) => `-x "http://$SANDBOX_EGRESS_POD:$SANDBOX_EGRESS_CREDENTIAL@${pod.status!.podIP}:3128"`;
  const connectStatus = async (url: string, extra = '') => (await curl(`-o /dev/null -w '%{http_connect}' ${extra} ${url}`)).stdout;
  /** curl's output with `-w "\n%{http_code}"`: the body, and the status on the last line. */
  const bodyAndCode = (out: string) => ({ body: out.slice(0, out.lastIndexOf('\n')).trim(), code: out.slice(out.lastIndexOf('\n') + 1) });
  const decisions = async (decision: string) => {
    let sum = 0;
    for (const pod of await gw.readyPods()) sum += metricValue(await gw.metrics(pod), 'egress_gateway_decisions_total', { decision });
    return sum;
  };

  test("an allowed host is reached through the gateway and passed through: the box sees the host's own certificate", async () => {
    const allowedBefore = await decisions('allow');
    const r = await curl(`--cacert ${TEST_CA} https://allowed.test/headers`);
    expect({ exit: r.exit_code, stderr: r.stderr }).toEqual({ exit: 0, stderr: '' });
    expect(JSON.parse(r.stdout)).toMatchObject({ host: 'allowed.test' });
    // Not intercepted: the bundle the box trusts (system + pool CA) does not verify the host's own certificate.
    const bundleOnly = await curl('-o /dev/null https://allowed.test/');
    expect(bundleOnly.exit_code).toBe(60);
    expect(await decisions('allow')).toBeGreaterThanOrEqual(allowedBefore + 2);
  });

  test('a denied host is refused with a clear proxy error, and nothing is dialled', async () => {
    const r = await curl('-o /dev/null -w "%{http_connect}" https://other.test/');
    expect({ exit: r.exit_code, connect: r.stdout }).toEqual({ exit: 56, connect: '403' });
    // Over plain HTTP the gateway's answer reaches the tool whole: what, which host, which rule.
    const plain = await curl('-w "\\n%{http_code}" http://other.test/');
    const { body, code } = bodyAndCode(plain.stdout);
    expect(code).toBe('403');
    expect(JSON.parse(body)).toMatchObject({ error: { type: 'forbidden', host: 'other.test', rule: 'pool.allow:none' } });
  });

  test('wildcards and deny-wins: *.wild.test lets www in, not deny.wild.test (denied) nor wild.test itself', async () => {
    expect(await connectStatus('https://www.wild.test/', `--cacert ${TEST_CA}`)).toBe('200');
    expect(await connectStatus('https://deny.wild.test/')).toBe('403');
    expect(await connectStatus('https://wild.test/')).toBe('403');
  });

  test('plain HTTP only to hosts the pool lists for it', async () => {
    const plain = await curl('http://plain.test/');
    expect(plain.stdout).toBe(`hello from ${web}:80\n`);
    const refused = bodyAndCode((await curl('-w "\\n%{http_code}" http://allowed.test/')).stdout);
    expect(refused).toEqual({ body: expect.stringContaining('plainHttp:none'), code: '403' });
  });

  test('a TLS server name other than the CONNECT host is refused', async () => {
    // curl CONNECTs to allowed.test (allowed) and asks the TLS session for other.test.
    const r = await curl(`-v --cacert ${TEST_CA} --connect-to other.test:443:allowed.test:443 https://other.test/headers`);
    expect(r.stderr).toContain('CONNECT allowed.test:443');
    expect(r.exit_code).toBe(35); // TLS handshake refused (an access_denied alert)
    expect(r.stdout).toBe('');
  });

  test('a registered credential reaches its host through interception; the box never holds it (env, /proc, files, snapshot)', async () => {
    expect((await call('PUT', `/boxes/${box}/egress/credentials`, { 'creds.test': { Authorization: `Bearer ${SECRET}` } })).status).toBe(200);
    const seen = await until(
      'the credential to arrive at the host',
      async () => {
        const r = await curl('-v https://creds.test/headers'); // the box's own CA bundle: system + the pool CA
        if (r.exit_code !== 0) return undefined;
        const headers = JSON.parse(r.stdout) as Record<string, string>;
        return headers.authorization ? { headers, stderr: r.stderr } : undefined;
      },
      10_000,
      250,
    );
    expect(seen.headers.authorization).toBe(`Bearer ${SECRET}`);
    expect(seen.stderr).toContain(`issuer: CN=sandbox-bridge egress CA ${env.pool.name}`);
    // A header of the same name from the box is replaced, never added to.
    const forged = JSON.parse((await curl('-H "Authorization: Bearer from-the-box" https://creds.test/headers')).stdout);
    expect(forged.authorization).toBe(`Bearer ${SECRET}`);

    const inside = await sh(
      'env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr "\\0" "\\n" < $f; done 2>/dev/null; ' +
        'find /workspace /tmp /mnt /opt -type f -exec cat {} + 2>/dev/null',
    );
    expect(inside.stdout.length).toBeGreaterThan(100_000); // it read the CA bundle too: the files were really read
    expect(inside.stdout).not.toContain(SECRET);
    const snap = await call('POST', `/boxes/${box}/snapshots`, {});
    expect(snap.status).toBe(201);
    for (const file of storeFilesOf(env.storeEnv)) {
      const raw = readFileSync(file);
      const plain = raw[0] === 0x1f && raw[1] === 0x8b ? gunzipSync(raw) : raw;
      expect({ file, holds: plain.includes(SECRET) || raw.includes(SECRET) }).toEqual({ file, holds: false });
    }
    expect(JSON.stringify(boxPod)).not.toContain(SECRET);
  });

  test("the pool's resolver: asked once per TTL with a signed request naming the box's outbound context; its headers reach the host", async () => {
    expect((await call('PUT', `/boxes/${box}/context`, { outbound: { tenant_id: 'tenant-1', session_id: 'session-1' } })).status).toBe(200);
    const [pod] = await gw.readyPods();
    const asked = async () =>
      (existsSync(join(dir, 'resolver.log')) ? readFileSync(join(dir, 'resolver.log'), 'utf8') : '')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as { verified: boolean; body: Record<string, unknown> });
    const before = (await asked()).length;
    // The record's context reaches the gateway's watch within milliseconds; allow a moment.
    const first = await until(
      'the resolved header with the context',
      async () => {
        const r = await curl(`${via(pod!)} https://resolved.test/headers`);
        if (r.exit_code !== 0) throw new Error(`curl: ${r.stderr}`);
        const got = await asked();
        return got.at(-1)?.body.tenant_id === 'tenant-1' ? { headers: JSON.parse(r.stdout), got } : undefined;
      },
      10_000,
      500,
    );
    expect(first.headers['x-resolved']).toBe(RESOLVED);
    expect(first.got.at(-1)).toEqual({
      at: expect.any(Number),
      verified: true,
      body: { box_id: box, pool: env.pool.name, host: 'resolved.test', port: 443, tenant_id: 'tenant-1', session_id: 'session-1' },
    });
    const afterFirst = first.got.length;
    expect(afterFirst).toBeGreaterThan(before);
    // Within the pool's ttlSeconds (3): from the cache, no new request.
    const cached = await curl(`${via(pod!)} https://resolved.test/headers`);
    expect(JSON.parse(cached.stdout)['x-resolved']).toBe(RESOLVED);
    expect((await asked()).length).toBe(afterFirst);
    // After it: asked again.
    await new Promise((r) => setTimeout(r, 3500));
    const again = await curl(`${via(pod!)} https://resolved.test/headers`);
    expect(JSON.parse(again.stdout)['x-resolved']).toBe(RESOLVED);
    expect((await asked()).length).toBe(afterFirst + 1);
    // What the resolver answered stays outside the box like a registered credential.
    expect((await sh('env; cat /proc/[0-9]*/environ 2>/dev/null')).stdout).not.toContain(RESOLVED);
  });

  test('a runtime PATCH of the box narrowing is in force on every gateway replica within 1 s', async () => {
    const pods = await gw.readyPods();
    expect(pods).toHaveLength(2);
    for (const pod of pods) expect({ pod: pod.metadata!.name, status: await connectStatus('https://www.wild.test/', `--cacert ${TEST_CA} ${via(pod)}`) }).toEqual({ pod: pod.metadata!.name, status: '200' });
    const narrowed = await call('PATCH', `/boxes/${box}/egress`, { allow: ALLOW.filter((p) => p !== '*.wild.test') });
    expect(narrowed.status).toBe(200);
    await new Promise((r) => setTimeout(r, 1000));
    for (const pod of pods) expect({ pod: pod.metadata!.name, status: await connectStatus('https://www.wild.test/', via(pod)) }).toEqual({ pod: pod.metadata!.name, status: '403' });
    expect((await call('PATCH', `/boxes/${box}/egress`, { allow: null })).status).toBe(200);
  });

  test("refusals become an aggregated EgressDenied Event on the box's pod", async () => {
    const events = await until(
      'an EgressDenied Event',
      async () => {
        const found = (await eventsAbout(env.pool.ns, boxPod.metadata!.uid!)).filter((e) => e.reason === 'EgressDenied');
        return found.length ? found : undefined;
      },
      90_000,
      1000,
    );
    expect(events[0]).toMatchObject({ type: 'Warning', source: { component: 'sandbox-bridge-egress-gateway' } });
    // One Event a minute per box: the first names whichever refusals of this suite came first.
    expect(events[0]!.message).toMatch(/refused box .* (other|allowed|www\.wild)\.test x\d+/);
    expect(events[0]!.message).not.toContain(SECRET);
  }, 120_000);

  test('a box going around the proxy (straight to the host) is dropped by its NetworkPolicy; a pod under no policy gets through', async () => {
    const direct = await curl(`--noproxy '*' --connect-timeout 3 --cacert ${TEST_CA} --resolve allowed.test:443:${web} https://allowed.test/`);
    expect([7, 28]).toContain(direct.exit_code);
    controlNs = await createTestNamespace(kc, 'egw-control', { 'pod-security.kubernetes.io/enforce': 'restricted' });
    const control = realNodeBox('control', 'exec sleep 600');
    control.spec!.containers[0]!.image = BOX_TOOLS_IMAGE;
    await core.createNamespacedPod({ namespace: controlNs, body: control });
    await waitRunning(kc, controlNs, 'control');
    const r = await execInPod(kc, controlNs, 'control', 'box', ['curl', '-sS', '--max-time', '10', '-k', `https://${web}/`]);
    expect(r.stdout).toBe(`hello from ${web}:443\n`);
  }, 120_000);

  test('a gateway replica killed mid-download: that download ends, new connections go to the other replica', async () => {
    // The download goes through one replica (its pod IP), so the test knows which one to kill.
    const [carrying] = await gw.readyPods();
    const started = await call('POST', `/boxes/${box}/processes`, {
      // --speed-time: a connection that goes silent ends the transfer (as any client's read timeout would).
      command: `curl -sS -o /dev/null --limit-rate 2M --speed-limit 1 --speed-time 10 ${via(carrying!)} --cacert ${TEST_CA} -w 'got=%{size_download}' https://bytes.test/bytes?n=100000000; echo " exit=$?"`,
    });
    expect(started.status).toBe(201);
    const pid = started.json.process_id as string;
    await until('the download to be under way', async () => ((await call('GET', `/boxes/${box}/processes/${pid}`)).json.status === 'running' ? true : undefined));
    await new Promise((r) => setTimeout(r, 2000));
    expect((await call('GET', `/boxes/${box}/processes/${pid}`)).json.status).toBe('running');
    const carryingName = carrying!.metadata!.name!;
    await core.deleteNamespacedPod({ namespace: gw.namespace, name: carryingName, gracePeriodSeconds: 0 });
    const ended = await until('the download to end', async () => {
      const p = await call('GET', `/boxes/${box}/processes/${pid}`);
      return p.json.status === 'exited' ? p.json : undefined;
    }, 60_000, 500);
    expect(ended.status).toBe('exited');
    const out = await call('GET', `/boxes/${box}/processes/${pid}/output`);
    const text = out.text
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as { type: string; data?: string })
      .filter((e) => e.type === 'stdout')
      .map((e) => e.data)
      .join('');
    const got = Number(/got=(\d+)/.exec(text)?.[1]);
    expect({ cut: got < 100_000_000, failed: !/exit=0$/.test(text.trim()) }).toEqual({ cut: true, failed: true });
    // New connections: once kube-proxy has dropped the dead endpoint, every one gets through.
    await until('a new connection through the Service', async () => ((await connectStatus('https://allowed.test/', `--cacert ${TEST_CA}`)) === '200' ? true : undefined), 20_000, 250);
    for (let i = 0; i < 5; i++) expect(await connectStatus('https://allowed.test/', `--cacert ${TEST_CA}`)).toBe('200');
    await gw.scale(2);
  }, 180_000);

  test('gateway down: box egress fails closed (never around it) and the bridge keeps serving', async () => {
    await gw.scale(0);
    try {
      const r = await curl(`--connect-timeout 5 --cacert ${TEST_CA} https://allowed.test/`);
      expect([7, 28, 56]).toContain(r.exit_code);
      const around = await curl(`--noproxy '*' --connect-timeout 3 --cacert ${TEST_CA} --resolve allowed.test:443:${web} https://allowed.test/`);
      expect([7, 28]).toContain(around.exit_code);
      expect((await sh('echo still-here')).stdout).toBe('still-here\n');
      expect((await call('GET', '/health')).status).toBe(200);
    } finally {
      await gw.scale(2);
    }
    expect(await connectStatus('https://allowed.test/', `--cacert ${TEST_CA}`)).toBe('200');
  }, 240_000);
});
