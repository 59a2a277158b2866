// `npm run dev` (scripts/dev.mjs) as a supervisor: it survives an API server frozen for 45 s (the
// operator exits on losing its lease and is restarted; the bridge rides it out), restarts a
// program that is killed, fixes a pool left pointing at nodes that are gone, and removes its env
// file when it stops. The freeze is a proxy in front of the real API server (dev is given a
// kubeconfig through it), so other tests do not see it. DEV_FREEZE_SECONDS shortens it.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { POOL_GROUP, POOL_PLURAL, POOL_VERSION, type SandboxPool } from '../../common/pool.js';
import { LOCAL_BOX_IMAGE, testKubeConfig, waitFor } from '../support/cluster.js';
import { deleteLease, freePort, installCrd, uniqueName } from '../support/operator.js';
import { TcpProxy } from '../support/tcp-proxy.js';

const kc = testKubeConfig();
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const core = kc.makeApiClient(k8s.CoreV1Api);
const FREEZE_MS = Number(process.env.DEV_FREEZE_SECONDS ?? 45) * 1000;
const pool = uniqueName('devpool');
const namespace = `${pool}-boxes`;
const dir = mkdtempSync(join(tmpdir(), 'sandbox-bridge-dev-'));
const envFile = join(dir, 'env');
const proxy = TcpProxy.forApiServer(kc);
const poolRef = { group: POOL_GROUP, version: POOL_VERSION, plural: POOL_PLURAL };
let dev: ChildProcess | undefined;
let output = '';

beforeAll(async () => {
  await installCrd(kc);
  await proxy.start();
});

afterAll(async () => {
  proxy.thaw();
  if (dev && dev.exitCode === null) {
    // dev stops its programs itself on SIGTERM; SIGKILL (and its programs by pid) only if it hangs.
    const programs = childPids(dev.pid!);
    dev.kill('SIGTERM');
    const stopped = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), 45_000);
      dev!.once('exit', () => {
        clearTimeout(timer);
        resolve(true);
      });
    });
    if (!stopped) {
      dev.kill('SIGKILL');
      for (const pid of [...programs, ...childPids(dev.pid!)]) killQuietly(pid);
    }
  }
  await proxy.stop();
  await custom.deleteClusterCustomObject({ ...poolRef, name: pool }).catch(() => undefined);
  await core.deleteNamespace({ name: namespace }).catch(() => undefined);
  await deleteLease(kc, `sandbox-bridge-operator-${pool}`);
  rmSync(dir, { recursive: true, force: true });
}, 90_000);

function childPids(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

function childRunning(devPid: number, entry: string): number | undefined {
  return childPids(devPid).find((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(entry);
    } catch {
      return false;
    }
  });
}

function killQuietly(pid: number, signal: NodeJS.Signals = 'SIGKILL'): void {
  try {
    process.kill(pid, signal);
  } catch {
    // already gone
  }
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

test('dev survives a frozen API server, restarts what dies, fixes stale placement, and removes its env file on stop', async () => {
  // A dev pool left from an earlier run, pointing at nodes that no longer exist: every box would
  // stay Pending. dev must bring it up to date, not reuse it as it is.
  await custom.createClusterCustomObject({
    ...poolRef,
    body: {
      apiVersion: `${POOL_GROUP}/${POOL_VERSION}`,
      kind: 'SandboxPool',
      metadata: { name: pool, labels: { 'sandbox-bridge.io/dev': 'true' } },
      spec: { namespace, box: { nodeSelector: { 'node-that-is': 'gone' } } },
    },
  });

  const [port, metricsPort, operatorPort] = await Promise.all([freePort(), freePort(), freePort()]);
  const kubeconfig = proxy.writeKubeConfig(kc, join(dir, 'kubeconfig'));
  dev = spawn(process.execPath, ['scripts/dev.mjs'], {
    env: {
      ...process.env,
      KUBECONFIG: kubeconfig,
      DEV_POOL: pool,
      DEV_NAMESPACE: namespace,
      DEV_DIR: dir,
      PORT: String(port),
      METRICS_PORT: String(metricsPort),
      OPERATOR_METRICS_PORT: String(operatorPort),
      LOG_LEVEL: 'warn',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  dev.stdout!.on('data', (d: Buffer) => (output += d.toString()));
  dev.stderr!.on('data', (d: Buffer) => (output += d.toString()));
  const devPid = dev.pid!;
  const exited = new Promise<number | null>((resolve) => dev!.once('exit', (code) => resolve(code)));

  await waitFor('dev to write its env file', async () => (existsSync(envFile) ? true : undefined), { timeoutMs: 120_000, intervalMs: 250 });
  const env = Object.fromEntries(readFileSync(envFile, 'utf8').trim().split('\n').map((l) => l.split(/=(.*)/s).slice(0, 2) as [string, string]));
  expect(env.DEV_PID).toBe(String(devPid));
  const call = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${env.BRIDGE_URL}/api/v1${path}`, {
      method,
      headers: { authorization: `Bearer ${env.BRIDGE_TOKEN}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body ? JSON.stringify(body) : undefined,
      signal: AbortSignal.timeout(20_000),
    }).catch(() => undefined);
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    return res ? { status: res.status, json: (await res.json().catch(() => undefined)) as any } : { status: 0, json: undefined };
  };
  const leading = async () => {
    const text = await fetch(`http://127.0.0.1:${operatorPort}/metrics`, { signal: AbortSignal.timeout(2000) }).then((r) => r.text(), () => '');
    return /^sandbox_operator_leader 1$/m.test(text);
  };

  // Placement brought up to date: the stale selector is gone, the dev label names this pool.
  const fixed = (await custom.getClusterCustomObject({ ...poolRef, name: pool })) as SandboxPool;
  expect(fixed.spec.box.nodeSelector?.['node-that-is']).toBeUndefined();
  expect((fixed.metadata as { labels?: Record<string, string> }).labels?.['sandbox-bridge.io/dev']).toBe(pool);
  expect(fixed.spec.box.defaultImage).toBe(LOCAL_BOX_IMAGE);

  // A program that dies is restarted; dev carries on.
  const bridgePid = childRunning(devPid, 'dist/bridge/main.js')!;
  expect(bridgePid).toBeDefined();
  killQuietly(bridgePid);
  await waitFor('the bridge to be restarted', async () => {
    const pid = childRunning(devPid, 'dist/bridge/main.js');
    return pid && pid !== bridgePid && (await call('GET', '/sandboxes')).status === 200 ? true : undefined;
  }, { timeoutMs: 60_000, intervalMs: 250 });
  expect(output).toMatch(/\[dev\] bridge exited \(SIGKILL\); restarting in 1 s/);
  await waitFor('the operator to lead', async () => ((await leading()) ? true : undefined), { timeoutMs: 60_000, intervalMs: 500 });

  // Freeze: the operator loses its lease and exits (restarted), the bridge answers from its cache.
  const operatorBefore = childRunning(devPid, 'dist/operator/main.js');
  proxy.freeze();
  const frozenAt = Date.now();
  try {
    await waitFor('the operator to step down', async () => (output.includes('[dev] operator exited (1)') ? true : undefined), {
      timeoutMs: 30_000,
      intervalMs: 250,
    });
    const steppedDownMs = Date.now() - frozenAt;
    process.stderr.write(`[dev] operator exited ${steppedDownMs} ms into the freeze (renew deadline 7 s)\n`);
    expect(steppedDownMs).toBeLessThan(12_000);
    expect((await call('GET', '/sandboxes')).status).toBe(200);
    expect((await call('POST', '/boxes', { sessionId: 'frozen' })).status).toBe(503);
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, FREEZE_MS - (Date.now() - frozenAt))));
    expect(dev.exitCode).toBeNull();
    expect(existsSync(envFile)).toBe(true);
  } finally {
    proxy.thaw();
  }

  const thawedAt = Date.now();
  await waitFor('writes to work again', async () => {
    const r = await call('POST', '/boxes', { sessionId: 'thawed' });
    if (r.status !== 201) return undefined;
    expect((await call('DELETE', `/boxes/${r.json.box_id}`)).status).toBe(200);
    return true;
  }, { timeoutMs: 60_000, intervalMs: 500 });
  const writesMs = Date.now() - thawedAt;
  await waitFor('an operator to lead again', async () => ((await leading()) ? true : undefined), { timeoutMs: 60_000, intervalMs: 500 });
  const leaderMs = Date.now() - thawedAt;
  process.stderr.write(`[dev] after a ${FREEZE_MS / 1000} s freeze: writes again after ${writesMs} ms, an operator leads after ${leaderMs} ms\n`);
  expect(childRunning(devPid, 'dist/operator/main.js')).not.toBe(operatorBefore);
  expect(dev.exitCode).toBeNull();

  // Stop: children gone, env file gone, exit 0.
  const programs = childPids(devPid);
  dev.kill('SIGINT');
  expect(await exited).toBe(0);
  expect(existsSync(envFile)).toBe(false);
  for (const pid of programs) expect(alive(pid)).toBe(false);
}, 300_000);
