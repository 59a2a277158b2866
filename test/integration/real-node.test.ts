// Boxes in real containers: a restricted pod on the local cluster's real node (kubelet +
// containerd + runc, test/cluster/real-node/), driven through the Kubernetes API the way the
// bridge drives it. Skipped, with the reason printed, where the real node could not start.
import * as k8s from '@kubernetes/client-node';
import {
  createTestNamespace,
  deleteTestNamespace,
  execInPod,
  exitCodeOf,
  REAL_NODE_LABEL,
  realNodeAvailable,
  realNodeBox,
  testKubeConfig,
  waitFor,
} from '../support/cluster.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const realNode = await realNodeAvailable(kc);
if (!realNode.available) {
  // Straight to stderr: jest's reporter drops the console output of a file whose tests are all
  // skipped when it runs several files in workers.
  process.stderr.write(
    `\n[real-node] SKIPPING test/integration/real-node.test.ts: the real node is not available: ${realNode.reason}\n`,
  );
}

const box = (name: string, command: string, memory?: string) => realNodeBox(name, command, memory ? { memory } : {});

(realNode.available ? describe : describe.skip)('a restricted box on the real node', () => {
  const nodeName = realNode.available ? realNode.name : '';
  let namespace: string;

  beforeAll(async () => {
    namespace = await createTestNamespace(kc, 'real-node', {
      'pod-security.kubernetes.io/enforce': 'restricted',
      'pod-security.kubernetes.io/enforce-version': 'latest',
    });
    await core.createNamespacedPod({ namespace, body: box('box', 'echo box started; exec sleep 3600') });
    await waitFor(
      'pod box to be Running on the real node',
      async () => {
        const p = await core.readNamespacedPod({ namespace, name: 'box' });
        return p.status?.phase === 'Running' ? p : undefined;
      },
      { timeoutMs: 90_000, intervalMs: 250 },
    );
  }, 120_000);

  afterAll(async () => {
    if (namespace) await deleteTestNamespace(kc, namespace);
  });

  const exec = (argv: string[]) => execInPod(kc, namespace, 'box', 'box', argv);

  test('runs on the real node, in a real container', async () => {
    const pod = await core.readNamespacedPod({ namespace, name: 'box' });
    expect(pod.spec?.nodeName).toBe(nodeName);
    const node = await core.readNode({ name: nodeName });
    expect(node.metadata?.labels?.type).not.toBe('kwok');
    expect(node.status?.nodeInfo?.containerRuntimeVersion).toMatch(/^containerd:\/\//);
  });

  test('exec runs as uid 65534', async () => {
    const r = await exec(['id', '-u']);
    expect(r.stdout).toBe('65534\n');
    expect(exitCodeOf(r.status)).toBe(0);
  });

  test("exec starts in the container's workingDir, /workspace", async () => {
    const r = await exec(['pwd']);
    expect(r.stdout).toBe('/workspace\n');
  });

  test('a file written by one exec is read by the next', async () => {
    const write = await exec(['sh', '-c', 'echo persisted > note.txt']);
    expect(exitCodeOf(write.status)).toBe(0);
    const read = await exec(['cat', '/workspace/note.txt']);
    expect(read.stdout).toBe('persisted\n');
  });

  test('a non-zero exit comes back as NonZeroExitCode with the real exit code', async () => {
    const r = await exec(['sh', '-c', 'echo bye >&2; exit 3']);
    expect(r.stderr).toBe('bye\n');
    expect(r.status.status).toBe('Failure');
    expect(r.status.reason).toBe('NonZeroExitCode');
    expect(exitCodeOf(r.status)).toBe(3);
  });

  test('the root filesystem is read-only and the box has no capabilities', async () => {
    const r = await exec([
      'sh',
      '-c',
      'touch /etc/x 2>/dev/null && echo writable || echo read-only; grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status',
    ]);
    expect(r.stdout).toBe('read-only\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n');
  });

  test("the pod's logs show the container's output", async () => {
    const log = await core.readNamespacedPodLog({ namespace, name: 'box', container: 'box' });
    expect(log).toBe('box started\n');
  });

  test('a 64 MiB memory limit kills a 200 MiB allocation: OOMKilled in the pod status', async () => {
    // As the container's main process, so that the container (not just one exec) is OOM-killed.
    // busybox tail buffers a line without newlines whole: 200 MiB held in memory.
    await core.createNamespacedPod({
      namespace,
      body: box('oom', 'head -c 209715200 /dev/zero | tail > /dev/null; echo survived', '64Mi'),
    });
    const terminated = await waitFor(
      'pod oom to terminate',
      async () => {
        const p = await core.readNamespacedPod({ namespace, name: 'oom' });
        return p.status?.containerStatuses?.[0]?.state?.terminated;
      },
      { timeoutMs: 90_000, intervalMs: 500 },
    );
    expect(terminated.reason).toBe('OOMKilled');
  }, 120_000);

  test('a pod that only selects the real node, without the toleration, is not scheduled there', async () => {
    const pod = box('untolerated', 'sleep 1');
    pod.spec!.tolerations = [];
    await core.createNamespacedPod({ namespace, body: pod });
    const unschedulable = await waitFor('pod untolerated to be found unschedulable', async () => {
      const p = await core.readNamespacedPod({ namespace, name: 'untolerated' });
      const c = p.status?.conditions?.find((x) => x.type === 'PodScheduled');
      return c?.status === 'False' && c.reason === 'Unschedulable' ? c : undefined;
    });
    expect(unschedulable.message).toMatch(/1 node\(s\) had untolerated taint/);
    const node = await core.readNode({ name: nodeName });
    expect(node.spec?.taints).toContainEqual(expect.objectContaining({ key: REAL_NODE_LABEL, effect: 'NoSchedule' }));
  });
});

if (!realNode.available) {
  // The reason also shows in --verbose reports, as this skipped test's name.
  test.skip(`real node unavailable: ${realNode.reason}`, () => {});
}
