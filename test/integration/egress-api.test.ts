// A box's egress policy and credentials through the real bridge (its own process, logging at
// debug) against the local cluster (docs/api.md "Egress"): a SandboxPool in gateway mode (so the
// CRD takes the new fields), a create whose allow list leaves the pool's refused naming the
// entries, PATCH on the record where the gateway reads it, credentials written to the record's
// data key and nowhere else: not in any answer, the bridge's log, the pod spec; a read-only token
// may read the policy but not change it. On the real node with the object store and idle sleep:
// the box's env and its snapshots, API and sleep (every byte in the store, the sealed env opened),
// hold no credential; the egress routes leave a sleeping box asleep; the policy outlives the sleep.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { EGRESS_CREDENTIALS_KEY } from '../../common/box-egress.js';
import { EnvSealer } from '../../common/env-seal.js';
import { ANNOTATIONS, LABELS } from '../../common/labels.js';
import { ON_REAL_NODE, ON_SIMULATED_NODES, api, spawnBridge } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, realNodeAvailable, testKubeConfig, waitFor } from '../support/cluster.js';
import { Pools, installCrd } from '../support/operator.js';
import { boxPods, record, startLifecycle, until, type LifecycleEnv } from '../support/lifecycle.js';
import { localObjectStore, storeFilesOf } from '../support/object-store.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const pools = new Pools(kc, `egress-${randomBytes(3).toString('hex')}`);
const realNode = await realNodeAvailable(kc);
const store = await localObjectStore();
const skipReal = !realNode.available ? `no real node: ${realNode.reason}` : !store.available ? `no object store: ${store.reason}` : undefined;
if (skipReal) console.warn(`SKIPPED the egress test on the real node (snapshots, sleep): ${skipReal}`);
const onReal = skipReal ? test.skip : test;

const POOL_DOMAINS = { allow: ['*.github.com', 'pypi.org', '*.pythonhosted.org'], deny: ['gist.github.com'] };
const READER = `egress-reader-${randomBytes(12).toString('hex')}`;
const secret = () => `Bearer egress-secret-${randomBytes(12).toString('hex')}`;

describe('on simulated nodes', () => {
  let namespace = '';
  let poolName = '';
  let dir = '';
  let bridge: Awaited<ReturnType<typeof spawnBridge>>;
  let call: ReturnType<typeof api>;
  let reader: ReturnType<typeof api>;

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'egress', { 'pod-security.kubernetes.io/enforce': 'restricted' });
    await installCrd(kc);
    poolName = `pool-${namespace}`;
    await pools.create(poolName, { namespace, box: ON_SIMULATED_NODES.box!, egress: { mode: 'gateway', domains: { ...POOL_DOMAINS, plainHttp: ['pypi.org'] } } });
    dir = mkdtempSync(join(tmpdir(), 'egress-api-'));
    writeFileSync(
      join(dir, 'tokens.json'),
      JSON.stringify([{ name: 'reader', token: READER, scopes: ['boxes:read'] }]),
    );
    bridge = await spawnBridge({ POOL_NAME: poolName, SANDBOX_NAMESPACE: namespace, LOG_LEVEL: 'debug', BRIDGE_TOKENS_FILE: join(dir, 'tokens.json') });
    call = api(bridge);
    reader = api(bridge, READER);
  }, 60_000);

  afterAll(async () => {
    await bridge?.stop();
    await pools.delete(poolName).catch(() => undefined);
    await deleteTestNamespace(kc, namespace);
    rmSync(dir, { recursive: true, force: true });
  });

  const record = (box: string) => core.readNamespacedSecret({ name: box, namespace });

  test('the pool takes the egress fields; a create whose allow list leaves the pool\'s is a 400 naming the entries, and makes nothing', async () => {
    const pool = await pools.api.getClusterCustomObject({ group: 'sandbox-bridge.io', version: 'v1alpha1', plural: 'sandboxpools', name: poolName });
    expect((pool as { spec: { egress: unknown } }).spec.egress).toMatchObject({ mode: 'gateway', domains: { ...POOL_DOMAINS, plainHttp: ['pypi.org'] } });

    const refused = await call('POST', '/boxes', { sessionId: 'egress-refused', egress: { allow: ['api.github.com', 'evil.test', 'github.com'] } });
    expect(refused.status).toBe(400);
    expect(refused.json.error.message).toContain('"evil.test", "github.com"');
    expect(refused.json.error.message).not.toContain('api.github.com');
    const bad = await call('POST', '/boxes', { sessionId: 'egress-refused', egress: { allow: ['not a host'] } });
    expect(bad.status).toBe(400);
    const secrets = await core.listNamespacedSecret({ namespace });
    expect(secrets.items.filter((s) => s.metadata?.annotations?.[ANNOTATIONS.sessionId] === 'egress-refused')).toEqual([]);
  }, 60_000);

  test('create and PATCH set the allow list on the record, where the gateway reads it; never outside the pool\'s', async () => {
    const created = await call('POST', '/boxes', { sessionId: 'egress-allow', egress: { allow: ['api.github.com', '*.pythonhosted.org'] } });
    expect(created.status).toBe(201);
    const box: string = created.json.box_id;
    expect((await record(box)).metadata?.annotations?.[ANNOTATIONS.egress]).toBe('{"allow":["api.github.com","*.pythonhosted.org"]}');
    expect((await call('GET', `/boxes/${box}/egress`)).json).toEqual({
      box_id: box,
      mode: 'gateway',
      box_allow: ['api.github.com', '*.pythonhosted.org'],
      allow: ['api.github.com', '*.pythonhosted.org'],
      deny: POOL_DOMAINS.deny,
      plain_http: ['pypi.org'],
      credential_hosts: [],
    });

    const patched = await call('PATCH', `/boxes/${box}/egress`, { allow: ['pypi.org'] });
    expect(patched.status).toBe(200);
    expect(patched.json).toMatchObject({ box_allow: ['pypi.org'], allow: ['pypi.org'] });
    expect((await record(box)).metadata?.annotations?.[ANNOTATIONS.egress]).toBe('{"allow":["pypi.org"]}');

    const outside = await call('PATCH', `/boxes/${box}/egress`, { allow: ['pypi.org', '*'] });
    expect(outside.status).toBe(400);
    expect(outside.json.error.message).toContain('"*"');
    expect((await record(box)).metadata?.annotations?.[ANNOTATIONS.egress]).toBe('{"allow":["pypi.org"]}');

    const reset = await call('PATCH', `/boxes/${box}/egress`, { allow: null });
    expect(reset.json).toMatchObject({ box_allow: null, allow: POOL_DOMAINS.allow });
    expect((await record(box)).metadata?.annotations?.[ANNOTATIONS.egress]).toBeUndefined();

    // A box without a list: the pool's applies.
    const plain = await call('POST', '/boxes', { sessionId: 'egress-allow' });
    expect(plain.status).toBe(201);
    expect((await call('GET', `/boxes/${plain.json.box_id}/egress`)).json).toMatchObject({ box_allow: null, allow: POOL_DOMAINS.allow });
    expect((await call('PATCH', '/boxes/box-nosuch-0/egress', { allow: [] })).status).toBe(404);
  }, 60_000);

  test('credentials: on the record\'s data key only; never in an answer, the log or the pod; a read-only token cannot set them', async () => {
    const created = await call('POST', '/boxes', { sessionId: 'egress-creds' });
    expect(created.status).toBe(201);
    const box: string = created.json.box_id;
    const values = { github: secret(), pypi: secret(), refused: secret(), reader: secret() };
    const answers: string[] = [];
    const send = async (who: ReturnType<typeof api>, method: string, path: string, body?: unknown) => {
      const res = await who(method, path, body);
      answers.push(res.text);
      return res;
    };

    const set = await send(call, 'PUT', `/boxes/${box}/egress/credentials`, {
      'API.GitHub.com': { Authorization: values.github },
      'files.pythonhosted.org': { 'X-Api-Key': values.pypi },
    });
    expect(set.status).toBe(200);
    expect(set.json).toEqual({ box_id: box, credential_hosts: ['api.github.com', 'files.pythonhosted.org'], updated_at: expect.any(String) });
    // In the record, where the gateway reads them (hosts normalized).
    const stored = JSON.parse(Buffer.from((await record(box)).data![EGRESS_CREDENTIALS_KEY]!, 'base64').toString('utf8'));
    expect(stored).toEqual({ 'api.github.com': { Authorization: values.github }, 'files.pythonhosted.org': { 'X-Api-Key': values.pypi } });

    const refused = await send(call, 'PUT', `/boxes/${box}/egress/credentials`, { 'a.test': { 'Proxy-Authorization': values.refused } });
    expect(refused.status).toBe(400);
    expect(refused.json.error.message).toContain('Proxy-Authorization');
    const injected = await send(call, 'PUT', `/boxes/${box}/egress/credentials`, { 'a.test': { Authorization: `${values.refused}\r\nX-Evil: 1` } });
    expect(injected.status).toBe(400);

    // boxes:read reads the policy (hosts only) and cannot change anything.
    const read = await send(reader, 'GET', `/boxes/${box}/egress`);
    expect(read.status).toBe(200);
    expect(read.json.credential_hosts).toEqual(['api.github.com', 'files.pythonhosted.org']);
    const denied = await send(reader, 'PUT', `/boxes/${box}/egress/credentials`, { 'a.test': { Authorization: values.reader } });
    expect(denied.status).toBe(403);
    expect(denied.json.error.message).toContain('boxes:write');
    expect((await send(reader, 'PATCH', `/boxes/${box}/egress`, { allow: [] })).status).toBe(403);
    expect(JSON.parse(Buffer.from((await record(box)).data![EGRESS_CREDENTIALS_KEY]!, 'base64').toString('utf8'))).toEqual(stored);

    // Other answers about the box.
    await send(call, 'GET', `/boxes/${box}/status`);
    await send(call, 'GET', `/sandboxes?limit=100`);

    // The pod: not in its spec, and its record volume does not project the key.
    const pod = await waitFor('the box pod', async () => (await core.listNamespacedPod({ namespace, labelSelector: `sandbox-bridge.io/box-id=${box}` })).items[0]);
    const podJson = JSON.stringify(pod);
    const volumes = pod.spec!.volumes!.filter((v) => v.secret?.secretName === box);
    expect(volumes.length).toBe(1);
    expect(volumes[0]!.secret!.items!.map((i) => i.key)).not.toContain(EGRESS_CREDENTIALS_KEY);

    // {} removes them all.
    expect((await send(call, 'PUT', `/boxes/${box}/egress/credentials`, {})).json.credential_hosts).toEqual([]);
    expect((await send(call, 'GET', `/boxes/${box}/egress`)).json.credential_hosts).toEqual([]);

    const log = bridge.logs();
    expect(log).toContain(`/boxes/${box}/egress/credentials`); // the log records these requests...
    const leaks = Object.entries(values).flatMap(([name, v]) =>
      [['log', log], ['pod', podJson], ...answers.map((a, i) => [`answer ${i}`, a])].filter(([, text]) => text!.includes(v.slice(7))).map(([where]) => `${name} in ${where}`),
    );
    expect(leaks).toEqual([]); // ...and holds no value
  }, 90_000);
});

describe('on the real node, with the object store and idle sleep', () => {
  let env: LifecycleEnv | undefined;

  beforeAll(async () => {
    if (skipReal) return;
    env = await startLifecycle({
      name: 'egress',
      pool: { box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: 4 }, egress: { mode: 'gateway', domains: { allow: ['*.example.test'] } } },
    });
  }, 120_000);

  afterAll(async () => {
    await env?.stop();
  }, 60_000);

  const storeFiles = () => storeFilesOf(env!.storeEnv);
  const sealedEnv = (snapshotId: string) => {
    const metadata = storeFiles().find((f) => f.includes(snapshotId) && f.endsWith('snapshot.json'))!;
    return new EnvSealer([env!.storeEnv.SNAPSHOT_ENCRYPTION_KEY!]).open(JSON.parse(readFileSync(metadata, 'utf8')).env, snapshotId);
  };

  onReal("no credential in the box's env or any snapshot (API or sleep); egress writes never wake a sleeping box, and the policy outlives the sleep", async () => {
    const call = api(env!.bridges[0]!);
    const value = secret();
    const created = await call('POST', '/boxes', { sessionId: 'egress-snap', cpu: 0.25, memory: 128, env: { PLAIN: 'visible' }, egress: { allow: ['api.example.test'] } });
    expect(created.status).toBe(201);
    const box: string = created.json.box_id;
    await until('the box to run', async () => ((await call('GET', `/boxes/${box}/status`)).json.status === 'Running' ? true : undefined));
    expect((await call('PUT', `/boxes/${box}/egress/credentials`, { 'api.example.test': { Authorization: value } })).status).toBe(200);
    // Set after the credentials: the record's env and its credentials are written side by side.
    expect((await call('POST', `/boxes/${box}/env`, { envVars: { LATER: 'also-visible' } })).status).toBe(200);
    const inBox = await call('POST', `/boxes/${box}/exec`, { command: 'env; tr "\\0" "\\n" < /proc/1/environ' });
    expect(inBox.json.stdout).toContain('LATER=also-visible');
    expect(inBox.text).not.toContain(value.slice(7));
    const taken = await call('POST', `/boxes/${box}/snapshots`, {});
    expect(taken.status).toBe(201);
    expect(sealedEnv(taken.json.snapshot_id)).toEqual({ PLAIN: 'visible', LATER: 'also-visible' });

    // Idle: it sleeps, with a snapshot of its own.
    const asleep = await until('the box to sleep', async () => {
      const s = await call('GET', `/boxes/${box}/status`);
      return s.json?.status === 'Sleeping' ? s.json : undefined;
    });
    expect(sealedEnv(asleep.snapshot_id)).toEqual({ PLAIN: 'visible', LATER: 'also-visible' });
    const files = storeFiles();
    expect(files.length).toBeGreaterThanOrEqual(4);
    for (const file of files) expect({ file, clear: readFileSync(file).includes(value.slice(7)) }).toEqual({ file, clear: false });

    // Asleep: the egress routes work on the record alone and leave it asleep.
    expect((await call('PATCH', `/boxes/${box}/egress`, { allow: ['*.example.test'] })).status).toBe(200);
    expect((await call('PUT', `/boxes/${box}/egress/credentials`, { 'api.example.test': { Authorization: value }, 'b.example.test': { 'X-Key': value } })).status).toBe(200);
    expect((await call('GET', `/boxes/${box}/egress`)).json).toMatchObject({ box_allow: ['*.example.test'], credential_hosts: ['api.example.test', 'b.example.test'] });
    expect((await call('GET', `/boxes/${box}/status`)).json.status).toBe('Sleeping');
    // No pod made for it (the slept one may still be terminating).
    expect((await boxPods(env!.pool.ns, box)).filter((p) => !p.metadata?.deletionTimestamp)).toEqual([]);
    expect((await record(env!.pool.ns, box))?.metadata?.labels?.[LABELS.sleep]).toBe('asleep');

    // Woken by a command: the policy is still there, and the credentials are still not in the box.
    const woken = await call('POST', `/boxes/${box}/exec`, { command: 'env; tr "\\0" "\\n" < /proc/1/environ' });
    expect(woken.json.stdout).toContain('LATER=also-visible');
    expect(woken.text).not.toContain(value.slice(7));
    expect((await call('GET', `/boxes/${box}/egress`)).json).toMatchObject({ box_allow: ['*.example.test'], credential_hosts: ['api.example.test', 'b.example.test'] });
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);
  }, 240_000);
});
