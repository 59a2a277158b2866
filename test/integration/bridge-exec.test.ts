// Everything that happens inside a box, through two real bridge replicas and the box's boxd on
// the local cluster's real node: exec (whole and streamed), env, files, archives, background
// processes, terminals, and the limits and failure modes of each.
import { createHash, randomBytes } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import * as k8s from '@kubernetes/client-node';
import { BOXD_PORT } from '../../common/boxd.js';
import type { RunningBridge } from '../../bridge/server.js';
import { PtyExit } from '../../bridge/schemas.js';
import type { BridgeClient, OutputEvent } from '../../client/index.js';
import { ON_REAL_NODE, api, startTestBridge, testClient, testPolicy } from '../support/bridge.js';
import {
  createTestNamespace,
  deleteTestNamespace,
  execInPod,
  onRealNode,
  realNodeAvailable,
  restrictedPod,
  testKubeConfig,
  waitFor,
} from '../support/cluster.js';
import { checkAnswer, expectSchema } from '../support/contract.js';
import { tarOf } from '../support/tar.js';
import { TcpProxy } from '../support/tcp-proxy.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const realNode = await realNodeAvailable(kc);
if (!realNode.available) console.warn(`SKIPPED bridge exec/files/env tests on a real node: ${realNode.reason}`);
const suite = realNode.available ? describe : describe.skip;

const sha256 = (b: Buffer | Uint8Array) => createHash('sha256').update(b).digest('hex');

async function collect(events: AsyncIterable<OutputEvent>): Promise<OutputEvent[]> {
  const out: OutputEvent[] = [];
  for await (const e of events) out.push(e);
  return out;
}
const textOf = (events: OutputEvent[], stream: 'stdout' | 'stderr') =>
  events
    .filter((e): e is Extract<OutputEvent, { data: string }> => e.type === stream)
    .map((e) => e.data)
    .join('');

suite('inside a real box, through boxd', () => {
  let namespace: string;
  let bridgeA: RunningBridge;
  let bridgeB: RunningBridge;
  let call: ReturnType<typeof api>;
  let callB: ReturnType<typeof api>;
  let client: BridgeClient;
  let clientB: BridgeClient;
  let box: string;

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'exec', { 'pod-security.kubernetes.io/enforce': 'restricted' });
    const policy = testPolicy(namespace, ON_REAL_NODE);
    // Small limits so the cap paths are cheap to reach.
    const limits = { EXEC_OUTPUT_LIMIT_BYTES: '65536', FILE_SIZE_LIMIT_BYTES: String(4 * 1024 * 1024), ARCHIVE_SIZE_LIMIT_BYTES: String(8 * 1024 * 1024) };
    [bridgeA, bridgeB] = await Promise.all([startTestBridge(kc, policy, limits), startTestBridge(kc, policy, limits)]);
    call = api(bridgeA);
    callB = api(bridgeB);
    client = testClient(bridgeA, { retries: 0 });
    clientB = testClient(bridgeB, { retries: 0 });
    const created = await call('POST', '/boxes', { sessionId: 'exec-tests', cpu: 0.5, memory: 256, env: { GREETING: 'hello from create' } });
    expect(created.status).toBe(201);
    box = created.json.box_id;
  }, 120_000);

  afterAll(async () => {
    await Promise.all([bridgeA?.close(), bridgeB?.close()]);
    await deleteTestNamespace(kc, namespace);
  });

  const exec = (command: string, extra: Record<string, unknown> = {}) => call('POST', `/boxes/${box}/exec`, { command, ...extra });
  /** How many processes of the box carry marker in their arguments, from a `ps` that must itself succeed. */
  const sleepersOf = async (marker: string): Promise<number> => {
    const ps = await exec('ps -o pid,args');
    if (ps.json.exit_code !== 0 || !/^\s*PID\s+COMMAND/m.test(ps.json.stdout)) throw new Error(`ps failed: ${ps.text}`);
    return ps.json.stdout.split('\n').filter((line: string) => line.includes(marker)).length;
  };

  describe('exec', () => {
    test('runs as uid 65534 in /workspace in the user image, waiting for the box to start', async () => {
      const res = await exec('id -u; pwd; cat /proc/1/comm');
      expect(res.status).toBe(200);
      expect(res.json).toEqual({
        exit_code: 0,
        stdout: '65534\n/workspace\nboxd\n',
        stderr: '',
        duration_ms: expect.any(Number),
        timed_out: false,
        stdout_truncated: false,
        stderr_truncated: false,
      });
      const status = await call('GET', `/boxes/${box}/status`);
      expect(status.json.node).toBe(realNode.available && realNode.name);
    });

    test('stdout, stderr and the exit code are kept apart; stdin and per-call env are passed', async () => {
      expect((await exec('echo out; echo err >&2; exit 7')).json).toMatchObject({ exit_code: 7, stdout: 'out\n', stderr: 'err\n' });
      const piped = await exec('tr a-z A-Z; echo "[$ONLY_HERE]"', { stdin: 'shout\n', env: { ONLY_HERE: 'per call' } });
      expect(piped.json.stdout).toBe('SHOUT\n[per call]\n');
      expect((await exec('echo "[${ONLY_HERE-unset}]"')).json.stdout).toBe('[unset]\n');
    });

    test('workdir and env values are passed as data, never as shell code', async () => {
      const tricky = `$(touch /workspace/pwned); \`id\`; 'quote" \\ \n next line ;rm -rf /`;
      const set = await call('POST', `/boxes/${box}/env`, { envVars: { TRICKY: tricky, EMPTY: '' } });
      expect(set.json).toEqual({ box_id: box, env_count: 3, updated_at: expect.any(String) });
      const res = await exec('printf "%s|%s|%s" "$TRICKY" "$EMPTY" "$GREETING"; ls /workspace');
      expect(res.json.stdout).toBe(`${tricky}||hello from create`);
      expect((await exec(`mkdir -p 'a dir/$(x)' && echo made`)).json.exit_code).toBe(0);
      expect((await exec('pwd', { workdir: 'a dir/$(x)' })).json.stdout).toBe('/workspace/a dir/$(x)\n');
      const missing = await exec('pwd', { workdir: '/nonexistent' });
      expect(missing.json.exit_code).not.toBe(0);
      expect(missing.json.stderr).toMatch(/nonexistent/);
    });

    test('env set through one replica is seen by an exec through another, and never returned', async () => {
      const value = randomBytes(8).toString('hex');
      expect((await call('POST', `/boxes/${box}/env`, { envVars: { SHARED: value } })).status).toBe(200);
      expect((await callB('POST', `/boxes/${box}/exec`, { command: 'echo "$SHARED"' })).json.stdout).toBe(`${value}\n`);
      expect(JSON.stringify((await call('GET', `/boxes/${box}/status`)).json)).not.toContain(value);
    });

    test('bad env names and oversized timeouts are 400s, and nothing of them is stored', async () => {
      const bad = await call('POST', `/boxes/${box}/env`, { envVars: { '1BAD': 'x', OK: 'fine' } });
      expect(bad.status).toBe(400);
      expect(bad.json.error.message).toMatch(/environment variable names must match/);
      const nul = await call('POST', `/boxes/${box}/env`, { envVars: { OK: 'a\u0000b' } });
      expect(nul.status).toBe(400);
      expect(nul.json.error.message).toMatch(/NUL/);
      expect((await exec('echo "[${OK-unset}]"')).json.stdout).toBe('[unset]\n');
      const long = await exec('true', { timeoutMs: 600_001 });
      expect(long.status).toBe(400);
      expect(long.json.error.message).toMatch(/at most 600000/);
    });

    test('a timed-out command tree that ignores SIGTERM, even one that left its session, is gone: 124', async () => {
      const res = await exec(`trap "" TERM; (trap "" TERM; sleep 301) & setsid sh -c 'trap "" TERM; sleep 302' & sleep 303; echo never`, { timeoutMs: 1500 });
      expect(res.json).toMatchObject({ exit_code: 124, timed_out: true, stdout: '' });
      expect(res.json.duration_ms).toBeGreaterThanOrEqual(1500);
      const ps = await exec('ps -o args | grep "sleep 30[123]" || echo none');
      expect(ps.json.stdout).toBe('none\n');
    });

    test('output beyond the cap is cut and flagged, per stream', async () => {
      const res = await exec('yes a | head -c 100000; echo small >&2');
      expect(res.json.stdout.length).toBe(65536);
      expect(res.json.stdout_truncated).toBe(true);
      expect(res.json).toMatchObject({ stderr: 'small\n', stderr_truncated: false, exit_code: 0 });
    });

    test('more than 5 concurrent commands on one box, across two replicas, are refused with 429', async () => {
      const results = await Promise.all(
        Array.from({ length: 6 }, (_, i) => (i % 2 ? callB : call)('POST', `/boxes/${box}/exec`, { command: 'sleep 1.5; echo done' })),
      );
      const statuses = results.map((r) => r.status).sort();
      expect(statuses).toEqual([200, 200, 200, 200, 200, 429]);
      const refused = results.find((r) => r.status === 429)!;
      expect(refused.json.error.type).toBe('rate_limited');
      expect(refused.headers.get('retry-after')).toBe('1');
    });

    test('streamed exec: output arrives as it is produced, then the exit', async () => {
      const started = performance.now();
      const seen: Array<[string, number]> = [];
      for await (const e of client.execStream(box, { command: 'echo first; sleep 1; echo second >&2; exit 3' })) {
        seen.push([e.type === 'stdout' || e.type === 'stderr' ? `${e.type}:${e.data}` : e.type, performance.now() - started]);
        if (e.type === 'exit') expect(e).toMatchObject({ exit_code: 3, timed_out: false });
      }
      expect(seen.map(([what]) => what)).toEqual(['stdout:first\n', 'stderr:second\n', 'exit']);
      // the first line came before the command slept
      expect(seen[1]![1] - seen[0]![1]).toBeGreaterThan(700);
    });

    test('the Accept header picks the answer: NDJSON named in any case streams, JSON or anything else answers whole', async () => {
      const kinds = await Promise.all(
        ['application/X-NDJSON', 'application/json;q=0.5, application/x-ndjson', 'application/json', '*/*', 'text/html'].map(async (accept) => {
          const res = await call('POST', `/boxes/${box}/exec`, { command: 'echo hi' }, { accept });
          expect(res.status).toBe(200);
          return res.headers.get('content-type')?.split(';')[0];
        }),
      );
      expect(kinds).toEqual(['application/x-ndjson', 'application/x-ndjson', 'application/json', 'application/json', 'application/json']);
    });

    test('streamed exec: a caller that disconnects kills the command', async () => {
      const marker = `gone-${randomBytes(3).toString('hex')}`;
      const aborter = new AbortController();
      // The marker is the shell's $0, so `ps` shows it (busybox sleep takes no extra argument).
      const stream = client.execStream(box, { command: `echo ready; exec sh -c 'sleep 300; echo never' ${marker}` }, { signal: aborter.signal });
      let running = 0;
      for await (const e of stream) {
        if (e.type === 'stdout' && e.data.includes('ready')) {
          // Running while the caller is still there (looked at before leaving the loop, which
          // cancels the response; its shell may show twice for a moment: the fork before `sleep`).
          running = await sleepersOf(marker);
          break;
        }
      }
      expect(running).toBeGreaterThanOrEqual(1);
      aborter.abort();
      await waitFor('the command to be killed', async () => ((await sleepersOf(marker)) === 0 ? true : undefined), { timeoutMs: 10_000 });
    });
  });

  describe('files', () => {
    test('text round trip, parents created, relative paths under /workspace', async () => {
      const put = await call('PUT', `/boxes/${box}/files?path=notes/deep/hello.txt`, 'héllo wörld\n', { 'content-type': 'text/plain' });
      expect(put.json).toEqual({ path: '/workspace/notes/deep/hello.txt', size: Buffer.byteLength('héllo wörld\n'), encoding: 'text' });
      const get = await callB('GET', `/boxes/${box}/files?path=/workspace/notes/deep/hello.txt`);
      expect(get.json).toEqual({ path: '/workspace/notes/deep/hello.txt', size: 14, content: 'héllo wörld\n', encoding: 'text' });
      expect((await exec('cat notes/deep/hello.txt')).json.stdout).toBe('héllo wörld\n');
    });

    test('binary content round-trips exactly (base64 and raw)', async () => {
      const bytes = randomBytes(3 * 1024 * 1024);
      const put = await call('PUT', `/boxes/${box}/files?path=blob.bin&base64=true`, bytes.toString('base64'), { 'content-type': 'text/plain' });
      expect(put.json).toEqual({ path: '/workspace/blob.bin', size: bytes.length, encoding: 'base64' });
      const get = await call('GET', `/boxes/${box}/files?path=blob.bin`);
      expect(get.json.encoding).toBe('base64'); // not valid UTF-8
      expect(Buffer.from(get.json.content, 'base64').equals(bytes)).toBe(true);
      expect((await exec('sha256sum blob.bin | cut -d" " -f1')).json.stdout.trim()).toBe(sha256(bytes));
      const raw = await call('PUT', `/boxes/${box}/files?path=raw.bin`, bytes, { 'content-type': 'application/octet-stream' });
      expect(raw.json.size).toBe(bytes.length);
      expect(sha256(await client.downloadFile(box, 'raw.bin'))).toBe(sha256(bytes));
      const asText = await call('GET', `/boxes/${box}/files?path=notes/deep/hello.txt&base64=true`);
      expect(asText.json.encoding).toBe('base64');
    });

    test('list and delete', async () => {
      await exec('mkdir -p tree/sub && echo a > tree/a.txt && echo bb > tree/sub/b.txt && ln -s a.txt tree/link');
      const flat = await client.listFiles(box, 'tree');
      expect(flat.entries.map((e) => [e.name, e.type]).sort()).toEqual([
        ['a.txt', 'file'],
        ['link', 'symlink'],
        ['sub', 'dir'],
      ]);
      const deep = await client.listFiles(box, 'tree', { recursive: true });
      expect(deep.entries.find((e) => e.path === '/workspace/tree/sub/b.txt')).toMatchObject({ type: 'file', size: 3 });
      const limited = await client.listFiles(box, 'tree', { recursive: true, limit: 2 });
      expect(limited).toMatchObject({ truncated: true });
      expect(limited.entries).toHaveLength(2);
      const notEmpty = await call('DELETE', `/boxes/${box}/files?path=tree`);
      expect(notEmpty.status).toBe(409);
      expect(await client.deleteFile(box, 'tree/a.txt')).toEqual({ path: '/workspace/tree/a.txt', deleted: true });
      expect(await client.deleteFile(box, 'tree', { recursive: true })).toEqual({ path: '/workspace/tree', deleted: true });
      expect((await call('DELETE', `/boxes/${box}/files?path=tree`)).status).toBe(404);
    });

    test('errors: missing, directory, NUL, FIFO (refused at once), limits, read-only root', async () => {
      expect((await call('GET', `/boxes/${box}/files?path=nope.txt`)).status).toBe(404);
      expect((await call('GET', `/boxes/${box}/files?path=notes`)).status).toBe(400);
      const nul = await call('GET', `/boxes/${box}/files?path=a%00b`);
      expect(nul.status).toBe(400);
      expect(nul.json.error.message).toMatch(/NUL/);
      expect((await call('GET', `/boxes/${box}/files`)).status).toBe(400);

      await exec('mkfifo pipe');
      const started = Date.now();
      const fifoRead = await call('GET', `/boxes/${box}/files?path=pipe`);
      const fifoWrite = await call('PUT', `/boxes/${box}/files?path=pipe`, 'x', { 'content-type': 'text/plain' });
      expect([fifoRead.status, fifoWrite.status]).toEqual([400, 400]);
      expect(Date.now() - started).toBeLessThan(5000);

      const tooBig = await call('PUT', `/boxes/${box}/files?path=big.bin`, Buffer.alloc(4 * 1024 * 1024 + 1), { 'content-type': 'application/octet-stream' });
      expect(tooBig.status).toBe(413);
      expect((await call('GET', `/boxes/${box}/files?path=big.bin`)).status).toBe(404); // nothing written
      expect((await exec('head -c 5000000 /dev/zero > big.bin && echo ok')).json.stdout).toBe('ok\n');
      expect((await call('GET', `/boxes/${box}/files?path=big.bin`)).status).toBe(413);
      const badB64 = await call('PUT', `/boxes/${box}/files?path=x.txt&base64=true`, 'not base64!!', { 'content-type': 'text/plain' });
      expect(badB64.status).toBe(400);
      expect((await call('GET', `/boxes/${box}/files?path=x.txt`)).status).toBe(404);
      const readOnlyRoot = await call('PUT', `/boxes/${box}/files?path=/etc/evil`, 'x', { 'content-type': 'text/plain' });
      expect([400, 403]).toContain(readOnlyRoot.status);
    });
  });

  describe('archives', () => {
    test('a 1,000-file tree round-trips byte-identical through tar', async () => {
      await exec(
        'mkdir -p src && cd src && i=0; while [ $i -lt 1000 ]; do d=d$((i % 10)); mkdir -p $d; head -c $((i * 37 % 5000)) /dev/urandom > $d/f$i; i=$((i+1)); done; chmod 0750 d3/f3; ln -s ../d1/f1 d2/link',
      );
      const sums = 'find . | sort | while read f; do if [ -L "$f" ]; then echo "$f -> $(readlink "$f")"; elif [ -f "$f" ]; then echo "$f $(stat -c %a "$f") $(sha256sum < "$f" | cut -c1-64)"; else echo "$f dir"; fi; done | sha256sum';
      const before = (await exec(sums, { workdir: 'src' })).json.stdout;
      const tar = Buffer.from(await new Response(await client.downloadArchive(box, 'src')).arrayBuffer());
      expect(tar.length).toBeGreaterThan(1000 * 512);
      const written = await clientB.uploadArchive(box, 'copy', tar);
      expect(written).toMatchObject({ path: '/workspace/copy', entries: expect.any(Number) });
      expect(written.entries).toBeGreaterThanOrEqual(1000);
      expect((await exec(sums, { workdir: 'copy' })).json.stdout).toBe(before);
      const gz = Buffer.from(await new Response(await client.downloadArchive(box, 'src', { gzip: true })).arrayBuffer());
      expect(gz.subarray(0, 2).toString('hex')).toBe('1f8b');
      await clientB.uploadArchive(box, 'copy-gz', gz);
      expect((await exec(sums, { workdir: 'copy-gz' })).json.stdout).toBe(before);
    }, 120_000);

    test.each([
      ['an entry that climbs out', [{ name: '../escaped.txt', body: 'x' }]],
      ['an absolute entry', [{ name: '/workspace/abs.txt', body: 'x' }]],
      ['a symlink out of the target', [{ name: 'out', link: '../../etc' }]],
      ['a symlink to an absolute path', [{ name: 'abs', link: '/etc' }]],
      ['a device', [{ name: 'dev', device: true }]],
    ])('refuses %s, changing nothing', async (_name, entries) => {
      const dir = `refused-${randomBytes(3).toString('hex')}`;
      const res = await call('PUT', `/boxes/${box}/archive?path=${dir}`, tarOf([{ name: 'fine.txt', body: 'fine' }, ...entries]), {
        'content-type': 'application/x-tar',
      });
      expect(res.status).toBe(400);
      // Nothing of the archive anywhere: not the target, not where its entries point. Each path
      // is tested on its own (a symlink too), and the shell must get to the end to say so.
      const check = await exec(
        `for p in ${dir} /workspace/escaped.txt /workspace/abs.txt /workspace/${dir}/fine.txt; do if [ -e "$p" ] || [ -L "$p" ]; then echo "exists: $p"; fi; done; echo checked`,
      );
      expect(check.json).toMatchObject({ exit_code: 0, stdout: 'checked\n' });
    });

    test('an archive over the size limit is a 413', async () => {
      const res = await call('PUT', `/boxes/${box}/archive?path=huge`, tarOf([{ name: 'big', body: Buffer.alloc(9 * 1024 * 1024) }]), {
        'content-type': 'application/x-tar',
      });
      expect(res.status).toBe(413);
    });
  });

  describe('background processes', () => {
    test('started through replica A, listed, followed, fed and killed through replica B', async () => {
      const started = await client.startProcess(box, { command: 'echo started; read line; echo "got $line"; exec sleep 600', tag: 'worker' });
      expect(started).toMatchObject({ process_id: expect.any(String), pid: expect.any(Number), status: 'running', tag: 'worker' });
      const id = started.process_id;
      expect((await clientB.listProcesses(box)).processes.map((p) => p.process_id)).toContain(id);

      await clientB.writeProcessStdin(box, id, 'hello\n', { eof: true });
      await waitFor('the process to answer', async () => (textOf(await collect(clientB.processOutput(box, id)), 'stdout').includes('got hello') ? true : undefined));

      const follow = collect(clientB.processOutput(box, id, { follow: true }));
      await new Promise((r) => setTimeout(r, 300));
      const killed = await clientB.signalProcess(box, id, 'KILL');
      expect(killed.process_id).toBe(id);
      const events = await follow;
      expect(textOf(events, 'stdout')).toBe('started\ngot hello\n');
      expect(events.at(-1)).toMatchObject({ type: 'exit', exit_code: 137 });
      expect(await client.getProcess(box, id)).toMatchObject({ status: 'exited', exit_code: 137 });
    });

    test('output replays from an offset; unknown processes are 404', async () => {
      const p = await client.startProcess(box, { command: 'printf abcdef; printf XY >&2' });
      await waitFor('the process to end', async () => ((await client.getProcess(box, p.process_id)).status === 'exited' ? true : undefined));
      const all = await collect(client.processOutput(box, p.process_id));
      expect(all[0]).toMatchObject({ type: 'start', offset: 0, dropped: 0 });
      expect(textOf(all, 'stdout') + textOf(all, 'stderr')).toHaveLength(8);
      const tail = await collect(client.processOutput(box, p.process_id, { since: 4 }));
      expect(tail[0]).toMatchObject({ type: 'start', offset: 4 });
      expect((textOf(tail, 'stdout') + textOf(tail, 'stderr')).length).toBe(4);
      expect((await call('GET', `/boxes/${box}/processes/p-999999`)).status).toBe(404);
    });
  });

  describe('terminal', () => {
    test('an interactive read, and a resize that stty sees', async () => {
      const term = clientB.openTerminal(box, { cols: 80, rows: 24 });
      // The bridge's text frames are the document's PtyExit.
      const texts: unknown[] = [];
      term.socket.addEventListener('message', (e: MessageEvent) => {
        if (typeof e.data === 'string') texts.push(JSON.parse(e.data));
      });
      let screen = '';
      term.onData((bytes) => (screen += Buffer.from(bytes).toString('utf8')));
      await term.opened;
      term.write('read name; echo "hi:$name"\n');
      await new Promise((r) => setTimeout(r, 300));
      term.write('robot\n');
      await waitFor('the shell to answer', async () => (screen.includes('hi:robot') ? true : undefined), { timeoutMs: 10_000 });
      term.resize(132, 43);
      term.write('stty size\n');
      await waitFor('stty to report the new size', async () => (screen.includes('43 132') ? true : undefined), { timeoutMs: 10_000 });
      term.write('exit 5\n');
      expect(await term.exited).toBe(5);
      expect(texts).toEqual([{ type: 'exit', exit_code: 5 }]);
      for (const text of texts) expectSchema(PtyExit, text);
    });

    test('without a token, or with a wrong one, the upgrade is refused with the JSON error', async () => {
      for (const auth of [{}, { authorization: 'Bearer wrong-token-0123456789' }]) {
        const refused = await new Promise<{ status: number; body: string }>((resolve, reject) => {
          const req = httpRequest(`${bridgeA.url}/api/v1/boxes/${box}/pty`, {
            headers: { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': randomBytes(16).toString('base64'), ...auth },
          });
          req.on('upgrade', () => reject(new Error('upgraded without a valid token')));
          req.on('response', (res) => {
            let body = '';
            res.on('data', (d: Buffer) => (body += d.toString()));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
          });
          req.on('error', reject);
          req.end();
        });
        expect(refused.status).toBe(401);
        expect(JSON.parse(refused.body).error.type).toBe('unauthorized');
        checkAnswer('GET', `/boxes/${box}/pty`, refused.status, 'application/json', refused.body);
      }
    });
  });

  test('another pod without the credential cannot run anything in a box', async () => {
    const status = await call('GET', `/boxes/${box}/status`);
    const ip = status.json.pod_ip;
    await core.createNamespacedPod({ namespace, body: onRealNodePod(restrictedPod('intruder')) });
    await waitFor('the intruder to run', async () => ((await core.readNamespacedPod({ name: 'intruder', namespace })).status?.phase === 'Running' ? true : undefined), {
      timeoutMs: 60_000,
    });
    const body = JSON.stringify({ command: 'touch /workspace/pwned', cwd: '/workspace', timeout_ms: 5000, max_output_bytes: 100, max_concurrent: 5 });
    const attempt = (token: string) => {
      const request = `POST /v1/exec HTTP/1.0\r\nX-Boxd-Token: ${token}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
      return execInPod(kc, namespace, 'intruder', 'box', ['sh', '-c', `printf '%s' "$1" | nc -w 3 ${ip} ${BOXD_PORT}; echo "exit=$?"`, 'sh', request]);
    };
    for (const token of ['', 'f'.repeat(64)]) {
      const out = await attempt(token);
      // Either the NetworkPolicy keeps it from connecting, or boxd refuses it with 401.
      const answer = out.stdout + out.stderr;
      if (/HTTP\/1\.\d/.test(answer)) expect(answer).toMatch(/^HTTP\/1\.\d 401/m);
      else expect(answer).toMatch(/exit=[1-9]/);
    }
    expect((await exec('ls /workspace/pwned 2>&1 || true')).json.stdout).toMatch(/No such file/);
  }, 120_000);

  test('commands keep running while the Kubernetes API is unreachable: the data path does not use it', async () => {
    const proxy = TcpProxy.forApiServer(kc);
    await proxy.start();
    try {
      const cut = await startTestBridge(proxy.kubeConfig(kc), testPolicy(namespace, ON_REAL_NODE), { KUBE_TIMEOUT_MS: '1500' });
      try {
        const viaCut = api(cut);
        await waitFor('the box in the new replica\'s cache', async () => ((await viaCut('GET', `/boxes/${box}/status`)).status === 200 ? true : undefined));
        proxy.set('blackhole');
        const started = Date.now();
        const res = await viaCut('POST', `/boxes/${box}/exec`, { command: 'echo still here' });
        expect(res.status).toBe(200);
        expect(res.json.stdout).toBe('still here\n');
        expect(Date.now() - started).toBeLessThan(1000);
        const created = await viaCut('POST', '/boxes', { sessionId: 'while-cut' });
        expect(created.status).toBe(503); // the control plane, by contrast, needs the API server
      } finally {
        await cut.close();
      }
    } finally {
      await proxy.stop();
    }
  }, 60_000);

  test('a box deleted mid-command ends the request at once instead of hanging', async () => {
    const other = await call('POST', '/boxes', { sessionId: 'exec-delete', cpu: 0.2, memory: 64 });
    const id = other.json.box_id;
    expect((await call('POST', `/boxes/${id}/exec`, { command: 'true' })).json.exit_code).toBe(0);
    const started = Date.now();
    const pending = call('POST', `/boxes/${id}/exec`, { command: 'sleep 120' });
    await new Promise((r) => setTimeout(r, 1000));
    await core.deleteNamespacedPod({ name: id, namespace });
    const res = await pending;
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(res.status).toBe(404);
    expect(res.json.error.message).toMatch(/deleted while the request was running/);
  }, 120_000);
});

function onRealNodePod(pod: k8s.V1Pod): k8s.V1Pod {
  return { ...pod, spec: onRealNode(pod.spec!) };
}
