// sandbox-bridge/platform on the real node with the real store: ClusterBridgeExecutor, the
// platform's SandboxExecutor port, method by method (docs/platform.md), then the platform's own
// adapter test idea run against it: one agent session doing create, exec, files, a background
// process, a backup, idle sleep, wake, restore, destroy. The operator runs as its own process
// (it decides sleeps), the bridge replicas in-process, as in sleep-wake.test.ts.
import { randomBytes } from 'node:crypto';
import type { RunningBridge } from '../../bridge/server.js';
import { BridgeClientError, type BridgeClient } from '../../client/index.js';
import { ClusterBridgeExecutor } from '../../client/platform.js';
import { ON_REAL_NODE, TEST_TOKEN, testClient } from '../support/bridge.js';
import { realNodeAvailable } from '../support/cluster.js';
import { checkedFetch } from '../support/contract.js';
import { kc, record, startLifecycle, until, type LifecycleEnv } from '../support/lifecycle.js';
import { localObjectStore } from '../support/object-store.js';

const realNode = await realNodeAvailable(kc);
const store = await localObjectStore();
const skipReason = !realNode.available ? `no real node: ${realNode.reason}` : !store.available ? `no object store: ${store.reason}` : undefined;
if (skipReason) console.warn(`SKIPPED the platform port tests: ${skipReason}`);
const suite = skipReason ? describe.skip : describe;
/** Short, so the session scenario waits seconds for its sleep. */
const SLEEP_AFTER_SECONDS = 5;

/** A listing of /workspace that changes with any name, type, mode, link target or content. */
const TREE_SUM =
  'find . | LC_ALL=C sort | while read f; do if [ -L "$f" ]; then echo "$f -> $(readlink "$f")"; ' +
  'elif [ -f "$f" ]; then echo "$f $(stat -c %a "$f") $(sha256sum < "$f" | cut -c1-64)"; else echo "$f dir $(stat -c %a "$f")"; fi; done | sha256sum';

suite('sandbox-bridge/platform: ClusterBridgeExecutor on the real node', () => {
  let env: LifecycleEnv;
  let bridge: RunningBridge;
  let client: BridgeClient;
  const executors: ClusterBridgeExecutor[] = [];

  const executor = (sessionId: string, extra: { boxId?: string } = {}) => {
    const e = ClusterBridgeExecutor.fromEnv({
      sessionId,
      env: { SANDBOX_PROVIDER: 'cluster-bridge', CLUSTER_BRIDGE_URL: bridge.url, CLUSTER_BRIDGE_TOKEN: TEST_TOKEN, CLUSTER_CPU: '0.25', CLUSTER_MEMORY: '256' },
      fetch: checkedFetch(),
      ...extra,
    });
    executors.push(e);
    return e;
  };
  const session = (name: string) => `platform-${name}-${randomBytes(4).toString('hex')}`;
  const boxStatus = (id: string) => client.status(id).then((s) => s.status);

  beforeAll(async () => {
    env = await startLifecycle({ name: 'platform', pool: { maxBoxes: 12, box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: SLEEP_AFTER_SECONDS } } });
    bridge = env.bridges[0]!;
    client = testClient(bridge);
  }, 120_000);

  afterAll(async () => {
    await Promise.all(executors.map((e) => e.destroy().catch(() => undefined)));
    await env?.stop();
  }, 60_000);

  test('exec returns the platform string: stdout, stderr on its own line, trimmed, [exit N]; a timeout says so', async () => {
    const e = executor(session('exec'));
    expect(await e.exec('echo hello')).toBe('hello');
    expect(await e.exec('echo out; echo err >&2; exit 3')).toBe('out\nerr\n[exit 3]');
    expect(await e.exec('printf "no newline"; printf "  \\n\\n"')).toBe('no newline');
    expect(await e.exec('echo only-err >&2; false')).toBe('only-err\n[exit 1]');
    expect(await e.exec('pwd')).toBe('/workspace');
    const started = Date.now();
    expect(await e.exec('echo started; sleep 30', 1500)).toBe('started\n[timed out after 1500 ms]\n[exit 124]');
    expect(Date.now() - started).toBeLessThan(15_000);
  }, 120_000);

  test('files as text and bytes, env for later commands', async () => {
    const e = executor(session('files'));
    const text = 'héllo wörld\nline 2\n';
    expect(await e.writeFile('notes/a.txt', text)).toBe('/workspace/notes/a.txt');
    expect(await e.readFile('notes/a.txt')).toBe(text);
    expect(await e.readFile('/workspace/notes/a.txt')).toBe(text);
    const bytes = new Uint8Array(1024).map((_, i) => (i * 7 + 3) % 256); // every byte value, not UTF-8
    expect(await e.writeFileBytes('bin/blob.bin', bytes)).toBe('/workspace/bin/blob.bin');
    expect(await e.readFileBytes('bin/blob.bin')).toEqual(bytes);
    expect(await e.exec('wc -c < bin/blob.bin')).toBe('1024');
    await expect(e.readFile('missing.txt')).rejects.toMatchObject({ status: 404, type: 'not_found' });

    const tricky = `it's "quoted" $(not run) ${randomBytes(3).toString('hex')}`;
    await e.setEnvVars({ GREETING: 'hi', TRICKY: tricky });
    expect(await e.exec('printf "%s|%s" "$GREETING" "$TRICKY"')).toBe(`hi|${tricky}`);
  }, 120_000);

  test('startProcess: a handle whose logs, status and kill work from a second executor instance of the session', async () => {
    const sessionId = session('procs');
    const first = executor(sessionId);
    const handle = await first.startProcess('echo to-out; echo to-err >&2; exec sleep 300');
    expect(handle).toMatchObject({ id: expect.any(String), pid: expect.any(Number) });

    // Another replica of the platform: a new executor of the same session finds the box.
    const second = executor(sessionId);
    const there = await second.getProcess(handle.id);
    expect(second.boxId).toBe(first.boxId);
    expect(there.pid).toBe(handle.pid);
    expect(await there.getStatus()).toBe('running');
    await until('the process output', async () => {
      const logs = await there.getLogs();
      return logs.stdout === 'to-out\n' && logs.stderr === 'to-err\n' ? logs : undefined;
    });
    await there.kill('SIGTERM');
    expect(await until('the kill to land', async () => ((await handle.getStatus()) === 'killed' ? 'killed' : undefined))).toBe('killed');
    expect(handle.exitCode).toBe(143); // 128 + SIGTERM, for the platform's bash tool
    await handle.kill('KILL'); // already gone: nothing to do

    const ok = await first.startProcess('echo done');
    const bad = await first.startProcess('exit 7');
    expect(await until('completed', async () => ((await ok.getStatus()) === 'completed' ? true : undefined))).toBe(true);
    expect(await until('failed', async () => ((await bad.getStatus()) === 'failed' ? true : undefined))).toBe(true);
    expect(await ok.getLogs()).toEqual({ stdout: 'done\n', stderr: '' });
    expect([ok.exitCode, bad.exitCode]).toEqual([0, 7]);
  }, 120_000);

  test('command secrets: only in the env of a command starting with the prefix as a word; not in later commands\' /proc/*/environ, the box env or a snapshot', async () => {
    const e = executor(session('secrets'));
    const secret = `s3cr3t${randomBytes(8).toString('hex')}`;
    e.registerCommandSecrets('printf', { SBX_CMD_SECRET: secret });
    expect(await e.exec('printf %s "$SBX_CMD_SECRET"')).toBe(secret);
    expect(await e.exec('  printf\t%s "$SBX_CMD_SECRET"')).toBe(secret);
    // Not the prefix as a word, or not the first word: nothing.
    expect(await e.exec('echo "[$SBX_CMD_SECRET]"')).toBe('[]');
    expect(await e.exec('env | grep -c SBX_CMD_SECRET')).toBe('0\n[exit 1]');
    expect(await e.exec('X=1 printf %s "[$SBX_CMD_SECRET]"')).toBe('[]');
    expect(await e.exec('printfx 2>/dev/null; echo "[$SBX_CMD_SECRET]"')).toBe('[]');
    // A later command sees no process whose environment holds it (the grep pattern is split
    // so its own command line, which is not an environ, could not match either).
    const half = secret.length / 2;
    const scan = `cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c "${secret.slice(0, half)}""${secret.slice(half)}"`;
    expect(await e.exec(scan)).toBe('0\n[exit 1]');
    await e.writeFile('keep.txt', 'kept');
    // Nor in the box's record (its Secret: the box env's durable copy, annotations, labels).
    const rec = await record(env.pool.ns, e.boxId!);
    expect(rec).toBeDefined();
    const recText = JSON.stringify(rec) + Object.values(rec!.data ?? {}).map((v) => Buffer.from(v, 'base64').toString('latin1')).join('');
    expect(recText).not.toContain(secret);

    // A snapshot of the box carries neither the secret in its env nor anywhere a fork can see.
    const backup = await e.createWorkspaceBackup({ name: 'secrets', ttlSec: 600 });
    expect(backup).toMatchObject({ id: expect.stringMatching(/^snap-/), dir: '/workspace' });
    const fork = await client.fromSnapshot(backup!.id, { sessionId: session('secrets-fork') });
    try {
      const r = await client.exec(fork.box_id, { command: `cat keep.txt; env | grep -c SBX_CMD_SECRET; grep -rc "${secret.slice(0, half)}""${secret.slice(half)}" /workspace | grep -vc ':0$'` });
      expect(r.stdout).toBe('kept0\n0\n');
    } finally {
      await client.deleteBox(fork.box_id, { snapshot: false });
    }
  }, 180_000);

  test('a backup restored into the same box: same box id, env and processes; the workspace exactly the backup\'s', async () => {
    const e = executor(session('restore'));
    await e.exec(
      'mkdir -p sub/ro deep/er && echo one > a.txt && head -c 4096 /dev/urandom > r.bin && ln -s a.txt link && ln r.bin hard.bin && : > empty && ' +
        'echo x > sub/ro/f && chmod 0555 sub/ro && chmod 2770 deep && chmod 0600 a.txt && echo .hidden > .dot',
    );
    await e.setEnvVars({ KEPT: 'yes' });
    const before = await e.exec(TREE_SUM);
    const boxId = e.boxId!;
    const backup = (await e.createWorkspaceBackup({ name: 'before', ttlSec: 3600 }))!;
    expect(backup).toMatchObject({ id: expect.stringMatching(/^snap-/), dir: '/workspace', boxId, name: 'before' });

    // Change everything: edit, add, delete, a read-only directory in the way.
    await e.exec('echo two > a.txt && rm -f link .dot && mkdir -p new/locked && echo n > new/locked/f && chmod 0500 new/locked && echo b > b.txt && chmod 0755 sub/ro && rm -rf sub/ro');
    const keeper = await e.startProcess('exec sleep 600');
    expect(await e.exec(TREE_SUM)).not.toBe(before);

    expect(await e.restoreWorkspaceBackup(backup)).toEqual({ ok: true });
    expect(e.boxId).toBe(boxId);
    expect(await e.exec(TREE_SUM)).toBe(before);
    expect(await e.exec('ls -A | LC_ALL=C sort | tr "\\n" " "')).toBe('.dot a.txt deep empty hard.bin link r.bin sub');
    expect(await e.exec('stat -c %h hard.bin; echo "$KEPT"')).toBe('2\nyes');
    expect(await keeper.getStatus()).toBe('running');
    await keeper.kill('KILL');

    // A session with no box yet gets its box made from the backup (one fork, nothing to replace).
    const fresh = executor(session('restore-fresh'));
    expect(await fresh.restoreWorkspaceBackup(backup)).toEqual({ ok: true });
    expect(await fresh.exec(TREE_SUM)).toBe(before);
    expect((await client.status(fresh.boxId!)).session_id).toBe(fresh.sessionId);

    // Missing and expired handles: {ok: false, error}, never a throw.
    expect(await e.restoreWorkspaceBackup({ id: 'snap-does-not-exist', dir: '/workspace' })).toEqual({ ok: false, error: expect.stringMatching(/not found|not a snapshot id/) });
    await client.deleteSnapshot(backup.id);
    expect(await e.restoreWorkspaceBackup(backup)).toEqual({ ok: false, error: `backup ${backup.id} not found: it expired or was deleted` });
    expect(await e.exec('cat a.txt')).toBe('one');
  }, 240_000);

  test('ping and getCapacity never throw; gitCheckout names git when the image has none; destroy ends the session', async () => {
    const e = executor(session('misc'));
    expect(await e.ping()).toEqual({ status: 'ok', latencyMs: expect.any(Number) }); // no box yet: the bridge's health
    expect(await e.getCapacity()).toEqual({
      cpu: { used: expect.any(Number), total: expect.any(Number), unit: 'cores' },
      memory: { used: expect.any(Number), total: expect.any(Number), unit: 'MiB' },
      pods: { used: expect.any(Number), total: expect.any(Number) },
    });
    expect((await e.getCapacity())!.cpu!.total).toBeGreaterThan(0);

    await expect(e.gitCheckout('https://example.invalid/repo.git', { branch: 'main', targetDir: 'repo' })).rejects.toThrow(
      "gitCheckout: git is not installed in the box's image; use an image with git",
    );
    expect(await e.ping()).toEqual({ status: 'ok', latencyMs: expect.any(Number) }); // the box's status

    const unreachable = ClusterBridgeExecutor.fromEnv({
      sessionId: session('unreachable'),
      env: { SANDBOX_PROVIDER: 'cluster-bridge', CLUSTER_BRIDGE_URL: 'http://127.0.0.1:9', CLUSTER_BRIDGE_TOKEN: TEST_TOKEN },
      retries: 0,
    });
    expect(await unreachable.ping()).toMatchObject({ status: 'error', details: expect.stringMatching(/^health failed: /) });
    expect(await unreachable.getCapacity()).toBeNull();

    const boxId = e.boxId!;
    await e.destroy();
    await e.destroy(); // again: fine
    await expect(e.exec('true')).rejects.toMatchObject({ type: 'sandbox_destroyed' });
    await expect(client.status(boxId)).rejects.toMatchObject({ status: 404 });
  }, 120_000);

  test('the session scenario: create, exec, files, background process, backup, idle sleep, wake, restore, destroy', async () => {
    const sessionId = session('scenario');
    const e = executor(sessionId);
    const context = { tenant_id: `tenant-${randomBytes(3).toString('hex')}`, environment_id: 'env-1', session_id: sessionId };
    // The platform's warm-up: contexts before anything exists (kept, sent once the box is made).
    await e.setBackupContext({ tenantId: context.tenant_id, environmentId: context.environment_id, sessionId });
    await e.setOutboundContext({ tenantId: context.tenant_id, sessionId });
    expect(e.boxId).toBeUndefined();
    // create (lazily, by the first operation) and exec
    expect(await e.exec('echo ready')).toBe('ready');
    const boxId = e.boxId!;
    await e.mountSessionOutputs({ tenantId: context.tenant_id, sessionId });
    await e.exec('echo report > /mnt/session/outputs/report.txt');
    expect((await client.listSessionOutputs(sessionId)).files).toEqual([expect.objectContaining({ path: 'report.txt', size: 7 })]);
    // files
    await e.writeFile('src/main.sh', 'echo "hello from main"\n');
    await e.writeFileBytes('data/blob.bin', new Uint8Array([0, 1, 2, 254, 255]));
    expect(await e.exec('sh src/main.sh')).toBe('hello from main');
    // a background process, read from the handle
    const proc = await e.startProcess('for i in 1 2 3; do echo tick $i; done; exec sleep 600');
    await until('the ticks', async () => ((await proc.getLogs()).stdout === 'tick 1\ntick 2\ntick 3\n' ? true : undefined));
    // a backup
    const backup = (await e.createWorkspaceBackup({ name: 'scenario', ttlSec: 3600 }))!;
    expect(backup.id).toMatch(/^snap-/);
    // the running process keeps the box awake; so do keepalives, which run nothing
    await proc.kill('TERM');
    for (let i = 0; i < 4; i++) {
      await e.renewActivityTimeout();
      await new Promise((r) => setTimeout(r, ((SLEEP_AFTER_SECONDS * 1000) / 2) | 0));
    }
    expect(await boxStatus(boxId)).toBe('Running');
    await until('the box to sleep', async () => ((await boxStatus(boxId)) === 'Sleeping' ? true : undefined), 120_000, 500);
    expect(await e.ping()).toEqual({ status: 'ok', latencyMs: expect.any(Number) }); // a sleeping box is fine, and not woken
    expect(await boxStatus(boxId)).toBe('Sleeping');
    // both snapshots carry the backup context: the backup and idle sleep's, newest first
    const listed = (await client.listSnapshots(context)).snapshots;
    expect(listed.map((s) => [s.name, s.box_id, s.context])).toEqual([
      ['idle-sleep', boxId, context],
      ['scenario', boxId, context],
    ]);
    expect(await client.readSessionOutput(sessionId, 'report.txt')).toEqual(new TextEncoder().encode('report\n'));
    // wake: the next call, with the files intact, in the same box
    expect(await e.exec('sh src/main.sh')).toBe('hello from main');
    expect(await e.readFileBytes('data/blob.bin')).toEqual(new Uint8Array([0, 1, 2, 254, 255]));
    expect(e.boxId).toBe(boxId);
    await until('the kubelet to report the woken box Running', async () => ((await boxStatus(boxId)) === 'Running' ? true : undefined));
    // restore: later changes undone
    await e.writeFile('src/main.sh', 'echo changed\n');
    await e.writeFile('later.txt', 'later');
    expect(await e.restoreWorkspaceBackup(backup)).toEqual({ ok: true });
    expect(await e.exec('sh src/main.sh; ls')).toBe('hello from main\ndata\nsrc');
    // destroy
    await e.destroy();
    await expect(client.status(boxId)).rejects.toBeInstanceOf(BridgeClientError);
    await until('the session to have no box', async () => ((await client.sandboxes({ sessionId })).sandboxes.length === 0 ? true : undefined));
  }, 300_000);
});

// The memory-store routes are tested in memory-stores.test.ts; here, only that the executor's
// mountMemoryStore reaches them, in a pool with memory stores on.
suite('sandbox-bridge/platform: mountMemoryStore through the executor', () => {
  let env: LifecycleEnv;
  let bridge: RunningBridge;
  let client: BridgeClient;
  const executors: ClusterBridgeExecutor[] = [];
  const executor = (name: string) => {
    const e = ClusterBridgeExecutor.fromEnv({
      sessionId: `platform-${name}-${randomBytes(4).toString('hex')}`,
      env: { SANDBOX_PROVIDER: 'cluster-bridge', CLUSTER_BRIDGE_URL: bridge.url, CLUSTER_BRIDGE_TOKEN: TEST_TOKEN, CLUSTER_CPU: '0.25', CLUSTER_MEMORY: '256' },
      fetch: checkedFetch(),
    });
    executors.push(e);
    return e;
  };

  beforeAll(async () => {
    env = await startLifecycle({ name: 'platform-mem', pool: { maxBoxes: 6, box: { ...ON_REAL_NODE.box, memoryStores: { enabled: true } } } });
    bridge = env.bridges[0]!;
    client = testClient(bridge);
  }, 120_000);

  afterAll(async () => {
    await Promise.all(executors.map((e) => e.destroy().catch(() => undefined)));
    await env?.stop();
  }, 60_000);

  test("a read-write store's file, synced, is in another session's read-only mount, where box code cannot write", async () => {
    const storeId = `st-${randomBytes(4).toString('hex')}`;
    const writer = executor('mem-writer');
    await writer.mountMemoryStore({ storeName: 'notes', storeId, readOnly: false });
    expect(await writer.exec('echo remembered > /mnt/memory/notes/fact.txt && cat /mnt/memory/notes/fact.txt')).toBe('remembered');
    expect(await client.syncMemoryStore(writer.boxId!, 'notes')).toMatchObject({ store_name: 'notes', store_id: storeId, files: 1 });

    const reader = executor('mem-reader');
    await reader.mountMemoryStore({ storeName: 'notes', storeId, readOnly: true });
    expect(await reader.exec('cat /mnt/memory/notes/fact.txt')).toBe('remembered');
    expect(await reader.exec('echo x > /mnt/memory/notes/new.txt')).toMatch(/Read-only file system\n\[exit [12]\]$/);
  }, 180_000);
});
