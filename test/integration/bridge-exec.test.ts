// Commands, files and env inside real containers (the local cluster's real node), through the
// real bridge: what runs where, as whom, with which limits, and what happens on timeouts.
import { randomBytes } from 'node:crypto';
import * as k8s from '@kubernetes/client-node';
import type { RunningBridge } from '../../bridge/server.js';
import { ON_REAL_NODE, api, startTestBridge, testPolicy } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, realNodeAvailable, testKubeConfig } from '../support/cluster.js';

const kc = testKubeConfig();
const realNode = await realNodeAvailable(kc);
if (!realNode.available) console.warn(`SKIPPED bridge exec/files/env tests on a real node: ${realNode.reason}`);
const suite = realNode.available ? describe : describe.skip;

suite('exec, files and env in a real container', () => {
  let namespace: string;
  let bridge: RunningBridge;
  let replicaB: RunningBridge;
  let call: ReturnType<typeof api>;
  let callB: ReturnType<typeof api>;
  let box: string;

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'exec', { 'pod-security.kubernetes.io/enforce': 'restricted' });
    const policy = testPolicy(namespace, ON_REAL_NODE);
    // Small limits so the cap paths are cheap to reach.
    const limits = { EXEC_OUTPUT_LIMIT_BYTES: '65536', FILE_SIZE_LIMIT_BYTES: String(4 * 1024 * 1024) };
    [bridge, replicaB] = await Promise.all([startTestBridge(kc, policy, limits), startTestBridge(kc, policy, limits)]);
    call = api(bridge);
    callB = api(replicaB);
    const created = await call('POST', '/boxes', { sessionId: 'exec-tests', cpu: 0.5, memory: 128, env: { GREETING: 'hello from create' } });
    expect(created.status).toBe(201);
    box = created.json.box_id;
  });

  afterAll(async () => {
    await Promise.all([bridge?.close(), replicaB?.close()]);
    await deleteTestNamespace(kc, namespace);
  });

  const exec = (command: string, extra: Record<string, unknown> = {}) => call('POST', `/boxes/${box}/exec`, { command, ...extra });

  test('runs as uid 65534 in /workspace, waiting for the box to start', async () => {
    const res = await exec('id -u; pwd');
    expect(res.status).toBe(200);
    expect(res.json).toEqual({
      exit_code: 0,
      stdout: '65534\n/workspace\n',
      stderr: '',
      duration_ms: expect.any(Number),
      timed_out: false,
      stdout_truncated: false,
      stderr_truncated: false,
    });
    const status = await call('GET', `/boxes/${box}/status`);
    expect(status.json.node).toBe(realNode.available && realNode.name);
  });

  test('stdout, stderr and the exit code are kept apart', async () => {
    const res = await exec('echo out; echo err >&2; exit 7');
    expect(res.json).toMatchObject({ exit_code: 7, stdout: 'out\n', stderr: 'err\n' });
  });

  test('workdir and env values are passed as data, never as shell code', async () => {
    const tricky = `$(touch /workspace/pwned); \`id\`; 'quote" \\ \n next line ;rm -rf /`;
    const set = await call('POST', `/boxes/${box}/env`, { envVars: { TRICKY: tricky, EMPTY: '' } });
    expect(set.json).toEqual({ box_id: box, env_count: 3, updated_at: expect.any(String) });
    const res = await exec('printf "%s|%s|%s" "$TRICKY" "$EMPTY" "$GREETING"; ls /workspace');
    expect(res.json.stdout).toBe(`${tricky}||hello from create`);

    const dir = await exec(`mkdir -p 'a dir/$(x)' && echo made`);
    expect(dir.json.exit_code).toBe(0);
    const inDir = await exec('pwd', { workdir: 'a dir/$(x)' });
    expect(inDir.json.stdout).toBe('/workspace/a dir/$(x)\n');
    const missing = await exec('pwd', { workdir: '/nonexistent' });
    expect(missing.json.exit_code).not.toBe(0);
  });

  test('env set through one replica is seen by an exec through another', async () => {
    const value = randomBytes(8).toString('hex');
    expect((await call('POST', `/boxes/${box}/env`, { envVars: { SHARED: value } })).status).toBe(200);
    const res = await callB('POST', `/boxes/${box}/exec`, { command: 'echo "$SHARED"' });
    expect(res.json.stdout).toBe(`${value}\n`);
    // values never come back from any endpoint
    expect(JSON.stringify((await call('GET', `/boxes/${box}/status`)).json)).not.toContain(value);
  });

  test('bad env names and oversized timeouts are 400s', async () => {
    const bad = await call('POST', `/boxes/${box}/env`, { envVars: { '1BAD': 'x' } });
    expect(bad.status).toBe(400);
    expect(bad.json.error.message).toMatch(/environment variable names must match/);
    const reserved = await call('POST', `/boxes/${box}/env`, { envVars: { __sb_v: 'x', OK: 'fine' } });
    expect(reserved.status).toBe(400);
    expect(reserved.json.error.message).toMatch(/__sb_ are reserved/);
    const nul = await call('POST', `/boxes/${box}/env`, { envVars: { OK: 'a\u0000b' } });
    expect(nul.status).toBe(400);
    expect(nul.json.error.message).toMatch(/NUL/);
    // nothing of a refused request was stored
    expect((await exec('echo "[${OK-unset}]"')).json.stdout).toBe('[unset]\n');
    const long = await exec('true', { timeoutMs: 600_001 });
    expect(long.status).toBe(400);
    expect(long.json.error.message).toMatch(/at most 600000/);
  });

  test('a timed-out command is killed in the box and answered with 124', async () => {
    const res = await exec('sleep 301 & sleep 302; echo never', { timeoutMs: 1500 });
    expect(res.json).toMatchObject({ exit_code: 124, timed_out: true, stdout: '' });
    expect(res.json.duration_ms).toBeGreaterThanOrEqual(1500);
    const ps = await exec('ps -o args | grep "sleep 30[12]" || echo none');
    expect(ps.json.stdout).toBe('none\n');
  });

  test('output beyond the cap is cut and flagged, per stream', async () => {
    const res = await exec('yes a | head -c 100000; echo small >&2');
    expect(res.json.stdout.length).toBe(65536);
    expect(res.json.stdout_truncated).toBe(true);
    expect(res.json).toMatchObject({ stderr: 'small\n', stderr_truncated: false, exit_code: 0 });
  });

  test('more than 5 concurrent commands on one box are refused with 429', async () => {
    const results = await Promise.all(Array.from({ length: 7 }, () => exec('sleep 1; echo done')));
    const statuses = results.map((r) => r.status).sort();
    expect(statuses.filter((s) => s === 200).length).toBe(5);
    expect(statuses.filter((s) => s === 429).length).toBe(2);
    const refused = results.find((r) => r.status === 429)!;
    expect(refused.json.error.type).toBe('rate_limited');
    expect(refused.headers.get('retry-after')).toBe('1');
  });

  test('files: text round trip, parents created, relative paths under /workspace', async () => {
    const put = await call('PUT', `/boxes/${box}/files?path=notes/deep/hello.txt`, 'héllo wörld\n', { 'content-type': 'text/plain' });
    expect(put.json).toEqual({ path: '/workspace/notes/deep/hello.txt', size: Buffer.byteLength('héllo wörld\n'), encoding: 'text' });
    const get = await call('GET', `/boxes/${box}/files?path=/workspace/notes/deep/hello.txt`);
    expect(get.json).toEqual({ path: '/workspace/notes/deep/hello.txt', size: 14, content: 'héllo wörld\n', encoding: 'text' });
    const cat = await exec('cat notes/deep/hello.txt');
    expect(cat.json.stdout).toBe('héllo wörld\n');
  });

  test('files: binary content, larger than argv could ever carry, round-trips exactly', async () => {
    const bytes = randomBytes(3 * 1024 * 1024);
    const put = await call('PUT', `/boxes/${box}/files?path=blob.bin&base64=true`, bytes.toString('base64'), { 'content-type': 'text/plain' });
    expect(put.json).toEqual({ path: '/workspace/blob.bin', size: bytes.length, encoding: 'base64' });
    const get = await call('GET', `/boxes/${box}/files?path=blob.bin`);
    expect(get.json.encoding).toBe('base64'); // not valid UTF-8
    expect(Buffer.from(get.json.content, 'base64').equals(bytes)).toBe(true);
    const sum = await exec('sha256sum blob.bin | cut -d" " -f1');
    expect(sum.json.stdout.trim()).toBe((await import('node:crypto')).createHash('sha256').update(bytes).digest('hex'));
    const asText = await call('GET', `/boxes/${box}/files?path=notes/deep/hello.txt&base64=true`);
    expect(asText.json.encoding).toBe('base64');
  });

  test('files: errors', async () => {
    const missing = await call('GET', `/boxes/${box}/files?path=nope.txt`);
    expect(missing.status).toBe(404);
    const dir = await call('GET', `/boxes/${box}/files?path=notes`);
    expect(dir.status).toBe(400);
    const nul = await call('GET', `/boxes/${box}/files?path=a%00b`);
    expect(nul.status).toBe(400);
    expect(nul.json.error.message).toMatch(/NUL/);
    const noPath = await call('GET', `/boxes/${box}/files`);
    expect(noPath.status).toBe(400);
    const tooBig = await call('PUT', `/boxes/${box}/files?path=big.bin`, Buffer.alloc(4 * 1024 * 1024 + 1), { 'content-type': 'application/octet-stream' });
    expect(tooBig.status).toBe(413);
    const bigFile = await exec('head -c 5000000 /dev/zero > big.bin && echo ok');
    expect(bigFile.json.stdout).toBe('ok\n');
    const readBig = await call('GET', `/boxes/${box}/files?path=big.bin`);
    expect(readBig.status).toBe(413);
    const badB64 = await call('PUT', `/boxes/${box}/files?path=x&base64=true`, 'not base64!!', { 'content-type': 'text/plain' });
    expect(badB64.status).toBe(400);
    const readOnlyRoot = await call('PUT', `/boxes/${box}/files?path=/etc/evil`, 'x', { 'content-type': 'text/plain' });
    expect(readOnlyRoot.status).toBe(400);
    expect(readOnlyRoot.json.error.message).toMatch(/cannot write \/etc\/evil/);
  });

  test('a box deleted mid-command ends the request instead of hanging', async () => {
    const other = await call('POST', '/boxes', { sessionId: 'exec-delete' });
    const id = other.json.box_id;
    expect((await call('POST', `/boxes/${id}/exec`, { command: 'true' })).json.exit_code).toBe(0);
    const started = Date.now();
    const pending = call('POST', `/boxes/${id}/exec`, { command: 'sleep 120' });
    await new Promise((r) => setTimeout(r, 1000));
    const core = kc.makeApiClient(k8s.CoreV1Api);
    await core.deleteNamespacedPod({ name: id, namespace });
    const res = await pending;
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(res.status).toBe(404);
    expect(res.json.error.message).toMatch(/deleted while the command was running/);
  });
});
