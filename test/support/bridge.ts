// Runs real bridge replicas in-process against the local cluster, each with its own caches
// and Kubernetes clients, exactly as separate pods would (they share nothing but the cluster).
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import type * as k8s from '@kubernetes/client-node';
import { pino } from 'pino';
import { NODE_FLAGS } from '../../common/node-flags.js';
import { withDefaults, type SandboxPoolSpec } from '../../common/pool.js';
import { ConfigSchema, type Config } from '../../bridge/config.js';
import { staticPolicy, type PolicySource } from '../../bridge/kube/policy.js';
import { startBridge, type RunningBridge } from '../../bridge/server.js';
import { createBridgeClient, type BridgeClient, type BridgeClientOptions } from '../../client/index.js';
import { LOCAL_BOX_IMAGE, REAL_NODE_LABEL } from './cluster.js';
import { freePort } from './operator.js';
import { checkAnswer, checkedFetch } from './contract.js';

export const TEST_TOKEN = `test-token-${randomBytes(12).toString('hex')}`;
/** Shared by every test bridge (as by every replica of a real install). */
export const TEST_BOXD_KEY = randomBytes(32).toString('hex');
/** The boxd image the local cluster's real node has (test/cluster/real-node/images.sh). */
export const TEST_BOXD_IMAGE = 'sandbox-bridge.local/boxd:dev';

export function testConfig(overrides: Record<string, string> = {}): Config {
  return ConfigSchema.parse({
    PORT: '0',
    METRICS_PORT: '0',
    HOST: '127.0.0.1',
    LOG_LEVEL: 'error',
    BRIDGE_TOKEN: TEST_TOKEN,
    BOXD_KEY: TEST_BOXD_KEY,
    BOXD_IMAGE: TEST_BOXD_IMAGE,
    SHUTDOWN_GRACE_MS: '2000',
    ...overrides,
  });
}

export function testPolicy(namespace: string, spec: Partial<SandboxPoolSpec> = {}): PolicySource {
  return staticPolicy(`pool-${namespace}`, withDefaults({ ...spec, namespace }));
}

/** A bridge replica; without a fixed policy it watches the SandboxPool named by POOL_NAME, as deployed. */
export async function startTestBridge(
  kc: k8s.KubeConfig,
  policy: PolicySource | undefined,
  overrides: Record<string, string> = {},
): Promise<RunningBridge> {
  return startBridge(testConfig(overrides), { kc, ...(policy ? { policy } : {}), log: pino({ level: process.env.BRIDGE_TEST_LOG ?? 'silent' }) });
}

/**
 * A bridge as its own process (node dist/bridge/main.js, built by the integration globalSetup),
 * for what must be measured on the bridge alone (its RSS) or read from its own log (`logs`, all
 * it wrote). It watches the SandboxPool POOL_NAME.
 */
export async function spawnBridge(env: Record<string, string>): Promise<{ url: string; metricsUrl: string; pid: number; stop: () => Promise<void>; logs: () => string }> {
  const [port, metricsPort] = [await freePort(), await freePort()];
  let output = '';
  const child = spawn(join(process.cwd(), 'node_modules/.bin/node'), [...NODE_FLAGS.bridge, join(process.cwd(), 'dist/bridge/main.js')], {
    env: {
      PATH: process.env.PATH,
      KUBECONFIG: process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG,
      BRIDGE_TOKEN: TEST_TOKEN,
      BOXD_KEY: TEST_BOXD_KEY,
      BOXD_IMAGE: TEST_BOXD_IMAGE,
      PORT: String(port),
      METRICS_PORT: String(metricsPort),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      SHUTDOWN_GRACE_MS: '2000',
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout!.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (output += d.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
  };
  for (let i = 0; i < 300; i++) {
    if (child.exitCode !== null) throw new Error(`bridge exited with ${child.exitCode}:\n${output}`);
    const ready = await fetch(`http://127.0.0.1:${metricsPort}/readyz`).then((r) => r.ok, () => false);
    if (ready) return { url: `http://127.0.0.1:${port}`, metricsUrl: `http://127.0.0.1:${metricsPort}`, pid: child.pid!, stop, logs: () => output };
    await new Promise((r) => setTimeout(r, 100));
  }
  await stop();
  throw new Error(`bridge did not become ready:\n${output}`);
}

/**
 * fetch against a bridge with the test token. Every answer is checked against the API's route
 * table (support/contract.ts): a status, Content-Type or body the OpenAPI document does not
 * describe fails the call with a ContractError.
 */
export function api(bridge: Pick<RunningBridge, 'url'>, token = TEST_TOKEN) {
  return async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(`${bridge.url}/api/v1${path}`, {
      method,
      headers: {
        ...(token ? { authorization: `Bearer ${token}` } : {}),
        ...(body !== undefined && typeof body !== 'string' && !Buffer.isBuffer(body) ? { 'content-type': 'application/json' } : {}),
        ...headers,
      },
      ...(body === undefined ? {} : { body: typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body) }),
    });
    const text = await res.text();
    checkAnswer(method, path, res.status, res.headers.get('content-type'), text);
    let json: any; // eslint-disable-line @typescript-eslint/no-explicit-any
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    return { status: res.status, headers: res.headers, json, text };
  };
}

/** The client against a bridge, every answer checked against the API's route table. */
export function testClient(bridge: RunningBridge, options: Partial<BridgeClientOptions> = {}): BridgeClient {
  return createBridgeClient({ url: bridge.url, token: TEST_TOKEN, fetch: checkedFetch(), ...options });
}

/** Box placement on kwok's simulated nodes (which never pull the image). */
export const ON_SIMULATED_NODES: Partial<SandboxPoolSpec> = {
  box: { ...withDefaults({ namespace: '' }).box, defaultImage: LOCAL_BOX_IMAGE, nodeSelector: { type: 'kwok' } },
};

/** Box placement on the local real node, with the image built for it. */
/** Box placement on the local cluster's real node (test/cluster/real-node/), where boxd runs. */
export const ON_REAL_NODE: Partial<SandboxPoolSpec> & { box: SandboxPoolSpec['box'] } = {
  box: {
    ...withDefaults({ namespace: '' }).box,
    defaultImage: LOCAL_BOX_IMAGE,
    nodeSelector: { [REAL_NODE_LABEL]: 'true' },
    tolerations: [{ key: REAL_NODE_LABEL, operator: 'Exists', effect: 'NoSchedule' }],
  },
};
