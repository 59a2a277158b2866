// What must never be logged (docs/security.md: "its environment stays private"): a bridge process
// of its own, logging at debug, serves a box's whole use of env values — set at create and through
// the env route, passed per exec, printed by commands, refused when a name is bad — plus a file
// holding a secret and the bearer token on every request; then nothing its log holds contains any
// of them, while the log does show those very requests.
import { randomBytes } from 'node:crypto';
import { ON_REAL_NODE, TEST_TOKEN, api, spawnBridge } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, realNodeAvailable, testKubeConfig, waitFor } from '../support/cluster.js';
import { Pools, installCrd } from '../support/operator.js';

const kc = testKubeConfig();
const realNode = await realNodeAvailable(kc);
if (!realNode.available) console.warn(`SKIPPED the bridge log privacy test: ${realNode.reason}`);
const onReal = realNode.available ? test : test.skip;
const pools = new Pools(kc, `logs-${randomBytes(3).toString('hex')}`);

let namespace = '';
let poolName = '';

beforeAll(async () => {
  namespace = await createTestNamespace(kc, 'logs', { 'pod-security.kubernetes.io/enforce': 'restricted' });
  await installCrd(kc);
  poolName = `pool-${namespace}`;
  await pools.create(poolName, { namespace, box: ON_REAL_NODE.box });
}, 60_000);

afterAll(async () => {
  await pools.delete(poolName).catch(() => undefined);
  await deleteTestNamespace(kc, namespace);
});

onReal("env values, file contents and the token never reach the bridge's log, even at debug", async () => {
  const bridge = await spawnBridge({ POOL_NAME: poolName, SANDBOX_NAMESPACE: namespace, LOG_LEVEL: 'debug' });
  const secret = (what: string) => `${what}-${randomBytes(12).toString('hex')}`;
  const values = { created: secret('created'), set: secret('set'), perExec: secret('per-exec'), refused: secret('refused'), file: secret('file') };
  try {
    const call = api(bridge);
    const created = await call('POST', '/boxes', { sessionId: 'log-privacy', cpu: 0.25, memory: 128, env: { CREATED_SECRET: values.created } });
    expect(created.status).toBe(201);
    const box: string = created.json.box_id;
    await waitFor('the box to run', async () => ((await call('GET', `/boxes/${box}/status`)).json.status === 'Running' ? true : undefined), { timeoutMs: 90_000 });
    expect((await call('POST', `/boxes/${box}/env`, { envVars: { SET_SECRET: values.set } })).status).toBe(200);
    // The values are really in the box: the commands print them (to stdout and stderr, and fail).
    const printed = await call('POST', `/boxes/${box}/exec`, {
      command: 'echo "$CREATED_SECRET $SET_SECRET $PER_EXEC"; echo "$SET_SECRET" >&2; exit 3',
      env: { PER_EXEC: values.perExec },
    });
    expect(printed.json).toMatchObject({ exit_code: 3, stdout: `${values.created} ${values.set} ${values.perExec}\n`, stderr: `${values.set}\n` });
    // A refused write: a bad name beside a value.
    expect((await call('POST', `/boxes/${box}/env`, { envVars: { '1-bad name': values.refused } })).status).toBe(400);
    expect((await call('PUT', `/boxes/${box}/files?path=secret.txt`, values.file, { 'content-type': 'text/plain' })).status).toBe(200);
    expect((await call('GET', `/boxes/${box}/files?path=secret.txt`)).json.content).toBe(values.file);
    expect((await call('DELETE', `/boxes/${box}`)).status).toBe(200);

    const log = bridge.logs();
    // The log does record these requests (so it could have leaked them)...
    expect(log).toContain(`/boxes/${box}/env`);
    expect(log).toContain(`/boxes/${box}/exec`);
    expect(log).toMatch(/"level":"debug"/);
    // ...and holds none of the values, the file's content or the token.
    const leaked = Object.entries({ ...values, token: TEST_TOKEN }).filter(([, v]) => log.includes(v));
    expect(leaked).toEqual([]);
  } finally {
    await bridge.stop();
  }
}, 180_000);
