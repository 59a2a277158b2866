// A box under gVisor: the real node's `gvisor` RuntimeClass (runsc and containerd-shim-runsc-v1
// built from gVisor's Go module, test/cluster/build.sh) runs a restricted box whose kernel is
// gVisor's (the Sentry), and exec and files work through the API server as they do under runc.
// Skipped, printing runsc's own error, where the RuntimeClass could not be set up.
import { readFileSync } from 'node:fs';
import * as k8s from '@kubernetes/client-node';
import {
  GVISOR_RUNTIME_CLASS,
  createTestNamespace,
  deleteTestNamespace,
  execInPod,
  exitCodeOf,
  gvisorAvailable,
  realNodeBox,
  testKubeConfig,
  waitRunning,
} from '../support/cluster.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const gvisor = await gvisorAvailable(kc);
if (!gvisor.available) {
  process.stderr.write(`\n[gvisor] SKIPPING test/integration/gvisor.test.ts: ${gvisor.reason}\n`);
}

(gvisor.available ? describe : describe.skip)('a box with runtimeClassName gvisor', () => {
  let namespace: string;
  const exec = (argv: string[]) => execInPod(kc, namespace, 'box', 'box', argv);

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'gvisor', {
      'pod-security.kubernetes.io/enforce': 'restricted',
      'pod-security.kubernetes.io/enforce-version': 'latest',
    });
    // No node selector of its own: the RuntimeClass's scheduling puts it on the real node.
    const pod = realNodeBox('box', 'echo started; exec sleep 3600', { runtimeClassName: GVISOR_RUNTIME_CLASS });
    delete pod.spec!.nodeSelector;
    delete pod.spec!.tolerations;
    await core.createNamespacedPod({ namespace, body: pod });
    await waitRunning(kc, namespace, 'box', 120_000);
  }, 150_000);

  afterAll(async () => {
    if (namespace) await deleteTestNamespace(kc, namespace);
  });

  test('the RuntimeClass placed it on the real node', async () => {
    const pod = await core.readNamespacedPod({ namespace, name: 'box' });
    expect(pod.spec?.runtimeClassName).toBe(GVISOR_RUNTIME_CLASS);
    expect(pod.spec?.nodeSelector).toEqual({ 'sandbox-bridge.io/real-node': 'true' });
  });

  test("it runs on gVisor's kernel, not the host's", async () => {
    const version = await exec(['cat', '/proc/version']);
    const host = readFileSync('/proc/version', 'utf8');
    expect(version.stdout).not.toBe(host);
    const dmesg = await exec(['dmesg']);
    expect(dmesg.stdout).toMatch(/gVisor/);
  });

  test('exec: uid 65534 in /workspace, exit codes come back', async () => {
    const who = await exec(['sh', '-c', 'id -u; pwd']);
    expect(who.stdout).toBe('65534\n/workspace\n');
    const fail = await exec(['sh', '-c', 'exit 7']);
    expect(exitCodeOf(fail.status)).toBe(7);
  });

  test('files: written by one exec, read by the next; the root filesystem stays read-only', async () => {
    expect(exitCodeOf((await exec(['sh', '-c', 'printf gvisor > note.txt'])).status)).toBe(0);
    expect((await exec(['cat', '/workspace/note.txt'])).stdout).toBe('gvisor');
    const root = await exec(['sh', '-c', 'touch /etc/x 2>/dev/null && echo writable || echo read-only']);
    expect(root.stdout).toBe('read-only\n');
  });

  test("the pod's log holds the container's output", async () => {
    expect(await core.readNamespacedPodLog({ namespace, name: 'box', container: 'box' })).toBe('started\n');
  });
});

if (!gvisor.available) test.skip(`gVisor unavailable: ${gvisor.reason}`, () => {});
