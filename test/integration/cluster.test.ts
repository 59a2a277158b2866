// The local cluster behaves like a real one where the project depends on it: Pod Security
// admission, scheduling onto (simulated) nodes, and the exec subresource.
import * as k8s from '@kubernetes/client-node';
import { apiMessage } from '../../common/kube.js';
import {
  createTestNamespace,
  deleteTestNamespace,
  execInPod,
  exitCodeOf,
  restrictedPod,
  testKubeConfig,
  waitFor,
} from '../support/cluster.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
let namespace: string;

beforeAll(async () => {
  namespace = await createTestNamespace(kc, 'cluster', {
    'pod-security.kubernetes.io/enforce': 'restricted',
    'pod-security.kubernetes.io/enforce-version': 'latest',
  });
});

afterAll(async () => {
  await deleteTestNamespace(kc, namespace);
});

test('the API server and simulated nodes are ready', async () => {
  const nodes = await core.listNode({ labelSelector: 'type=kwok' });
  expect(nodes.items.length).toBeGreaterThanOrEqual(1);
  for (const node of nodes.items) {
    const ready = node.status?.conditions?.find((c) => c.type === 'Ready');
    expect(ready?.status).toBe('True');
  }
});

async function runPod(name: string): Promise<k8s.V1Pod> {
  const created = await core.createNamespacedPod({
    namespace,
    body: restrictedPod(name, { nodeSelector: { type: 'kwok' } }),
  });
  expect(created.metadata?.name).toBe(name);
  return waitFor(`pod ${name} to be Running`, async () => {
    const p = await core.readNamespacedPod({ namespace, name });
    return p.status?.phase === 'Running' ? p : undefined;
  });
}

test('a compliant pod in a restricted namespace is scheduled to a simulated node and runs', async () => {
  const pod = await runPod('compliant');
  const node = await core.readNode({ name: pod.spec!.nodeName! });
  expect(node.metadata?.labels?.type).toBe('kwok');
});

test('exec through the API server returns stdout, stderr and the status', async () => {
  await runPod('exec-target');

  const ok = await execInPod(kc, namespace, 'exec-target', 'box', ['sh', '-c', 'echo out; echo err >&2; id -u']);
  // Simulated exec runs on the host as nobody (test/cluster/kwok.yaml).
  expect(ok.stdout).toBe('out\n65534\n');
  expect(ok.stderr).toBe('err\n');
  expect(exitCodeOf(ok.status)).toBe(0);

  // A real kubelet reports a non-zero exit as reason NonZeroExitCode with an ExitCode cause;
  // kwok's simulation reports a Failure whose message carries "exit status N" instead.
  // Exit-code behaviour is tested on the real node.
  const failed = await execInPod(kc, namespace, 'exec-target', 'box', ['sh', '-c', 'exit 3']);
  expect(failed.status.status).toBe('Failure');
  expect(failed.status.message).toMatch(/exit status 3/);
});

test('Pod Security admission rejects a non-compliant pod', async () => {
  const privileged = restrictedPod('privileged');
  privileged.spec!.securityContext = {};
  privileged.spec!.containers[0]!.securityContext = { privileged: true };

  const rejection = await core.createNamespacedPod({ namespace, body: privileged }).then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(rejection).toBeInstanceOf(k8s.ApiException);
  const apiErr = rejection as k8s.ApiException<string>;
  expect(apiErr.code).toBe(403);
  expect(apiMessage(apiErr)).toMatch(/violates PodSecurity "restricted:latest"/);
  expect(apiMessage(apiErr)).toMatch(/must not set securityContext.privileged=true/);

  const pods = await core.listNamespacedPod({ namespace });
  expect(pods.items.map((p) => p.metadata?.name)).not.toContain('privileged');
});
