// boxd from an image volume (a pool's `boxdDelivery: ImageVolume`): the box pod mounts the boxd
// image itself, read-only, and has no init container to copy boxd (the faster cold start,
// docs/performance.md). It needs a runtime that mounts image volumes: the real node's containerd,
// built from its Go module (test/cluster/versions.env). A box made so answers like any other, and
// nothing in it can change the boxd it runs on.
import * as k8s from '@kubernetes/client-node';
import { BOXD_BINARY, BOXD_BIN_DIR } from '../../common/boxd.js';
import { LABELS } from '../../common/labels.js';
import type { RunningBridge } from '../../bridge/server.js';
import { ON_REAL_NODE, TEST_BOXD_IMAGE, api, startTestBridge, testPolicy } from '../support/bridge.js';
import { createTestNamespace, deleteTestNamespace, realNodeAvailable, testKubeConfig } from '../support/cluster.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const realNode = await realNodeAvailable(kc);
if (!realNode.available) console.warn(`SKIPPED boxd image volume tests on a real node: ${realNode.reason}`);
const suite = realNode.available ? describe : describe.skip;

suite('a box whose boxd comes from an image volume', () => {
  let namespace: string;
  let bridge: RunningBridge;
  let call: ReturnType<typeof api>;
  let box: string;
  const exec = async (command: string) => {
    const res = await call('POST', `/boxes/${box}/exec`, { command });
    expect(res.status).toBe(200);
    return res.json as { exit_code: number; stdout: string; stderr: string };
  };

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'boxd-volume', { 'pod-security.kubernetes.io/enforce': 'restricted' });
    bridge = await startTestBridge(kc, testPolicy(namespace, { ...ON_REAL_NODE, box: { ...ON_REAL_NODE.box, boxdDelivery: 'ImageVolume' } }));
    call = api(bridge);
    const created = await call('POST', '/boxes', { sessionId: 'image-volume', cpu: 0.25, memory: 64 });
    expect(created.status).toBe(201);
    box = created.json.box_id;
  }, 120_000);

  afterAll(async () => {
    await bridge?.close();
    if (namespace) await deleteTestNamespace(kc, namespace);
  });

  test('its pod mounts the boxd image read-only and has no init container', async () => {
    const pods = await core.listNamespacedPod({ namespace, labelSelector: `${LABELS.boxId}=${box}` });
    expect(pods.items).toHaveLength(1);
    const spec = pods.items[0]!.spec!;
    expect(spec.initContainers ?? []).toEqual([]);
    expect(spec.volumes?.find((v) => v.name === 'boxd')?.image?.reference).toBe(TEST_BOXD_IMAGE);
    const mount = spec.containers.find((c) => c.name === 'box')?.volumeMounts?.find((m) => m.name === 'boxd');
    expect(mount).toMatchObject({ mountPath: BOXD_BIN_DIR, readOnly: true });
  });

  test('exec runs as the box user under boxd (PID 1) from the volume', async () => {
    expect(await exec('id -u; pwd; cat /proc/1/comm; readlink /proc/1/exe')).toMatchObject({
      exit_code: 0,
      stdout: `65534\n/workspace\nboxd\n${BOXD_BINARY}\n`,
      stderr: '',
    });
  });

  test('the box cannot change or add to the boxd it runs on', async () => {
    const res = await exec(
      `cp /bin/busybox ${BOXD_BINARY} 2>/dev/null; echo replace=$?; touch ${BOXD_BIN_DIR}/x 2>/dev/null; echo add=$?; ` +
        `grep -c " ${BOXD_BIN_DIR} .* ro[ ,]" /proc/mounts`,
    );
    expect(res.exit_code).toBe(0);
    const [replace, add, readOnlyMounts] = res.stdout.trim().split('\n');
    expect(replace).not.toBe('replace=0');
    expect(add).not.toBe('add=0');
    expect(readOnlyMounts).toBe('1');
  });

  test('files written by one exec are read by the next', async () => {
    expect((await exec('printf volume > note.txt; cat /workspace/note.txt')).stdout).toBe('volume');
  });
});

if (!realNode.available) test.skip(`real node unavailable: ${realNode.reason}`, () => {});
