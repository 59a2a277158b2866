// Box health from the operator's watch, against the real API server: a real OOM kill, crashes and
// a restart loop, an image that cannot be pulled and a kubelet eviction on the real node; a pod
// stuck Pending and an eviction through the API on simulated nodes. Each occurrence is an Event
// on the box pod and on its pool, a metric sample and a webhook notification to a real HTTP
// receiver on loopback, which checks the HMAC signature and the content; a box failing six ways
// at once is one or two notifications (debounce), and a new leader reports nothing twice.
import { createHmac, randomUUID, timingSafeEqual } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { LOCAL_BOX_IMAGE, REAL_NODE_LABEL, realNodeAvailable, testKubeConfig, waitFor } from '../support/cluster.js';
import { Pools, boxPod, deleteLease, installCrd, startOperator, uniqueName, type OperatorProcess } from '../support/operator.js';

const kc = testKubeConfig();
const core = kc.makeApiClient(k8s.CoreV1Api);
const shard = uniqueName('health');
const pools = new Pools(kc, shard);
const leaseName = `op-test-${shard}`;
const SIGNING_KEY = `key-${randomUUID()}`;
const DEBOUNCE_SECONDS = 15;
/** Long enough that real-node pods on a busy machine are not reported while their containers are created. */
const STUCK_PENDING_SECONDS = 30;
const realNode = await realNodeAvailable(kc);
const onReal = realNode.available ? test : test.skip;

interface Delivery {
  path: string;
  id: string;
  attempt: number;
  signatureOk: boolean;
  body: { type?: string; pool?: string; namespace?: string; box_id?: string; pod_uid?: string; failures?: Array<{ reason: string; event_reason: string; message: string; container?: string }>; text?: string };
}

/** The webhook receiver: a real HTTP server on loopback. The first attempt of every JSON delivery gets a 503, so each is retried. */
const deliveries: Delivery[] = [];
const attempts = new Map<string, number>();
let receiver: Server;
let receiverUrl: string;

function verify(req: IncomingMessage, body: string): boolean {
  const header = String(req.headers['x-sandbox-bridge-signature'] ?? '');
  const match = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(header);
  if (!match) return false;
  const [, t, v1] = match;
  if (Math.abs(Date.now() / 1000 - Number(t)) > 300) return false; // a replay
  const want = createHmac('sha256', SIGNING_KEY).update(`${t}.${body}`).digest();
  return timingSafeEqual(want, Buffer.from(v1!, 'hex'));
}

let namespace: string;
let poolName: string;
let operator: OperatorProcess;
let dir: string;

const small = { requests: { cpu: '10m', memory: '16Mi' }, limits: { cpu: '10m', memory: '16Mi' } };

/** A restricted box pod on the real node running `script` as its main process. */
function realBox(name: string, script: string, o: { memory?: string; restartPolicy?: string; image?: string; pullPolicy?: string; containers?: number; tmpLimit?: string } = {}): k8s.V1Pod {
  const pod = boxPod(name, poolName);
  const base = pod.spec!.containers[0]!;
  const resources = o.memory ? { requests: { cpu: '10m', memory: o.memory }, limits: { cpu: '10m', memory: o.memory } } : small;
  pod.spec = {
    ...pod.spec!,
    restartPolicy: o.restartPolicy ?? 'Never',
    nodeSelector: { [REAL_NODE_LABEL]: 'true' },
    tolerations: [{ key: REAL_NODE_LABEL, operator: 'Exists', effect: 'NoSchedule' }],
    containers: Array.from({ length: o.containers ?? 1 }, (_, i) => ({
      ...base,
      name: i === 0 ? 'box' : `box-${i}`,
      image: o.image ?? LOCAL_BOX_IMAGE,
      imagePullPolicy: o.pullPolicy ?? 'IfNotPresent',
      command: ['sh', '-c', script],
      resources,
      ...(o.tmpLimit ? { volumeMounts: [{ name: 'tmp', mountPath: '/tmp' }] } : {}),
    })),
    ...(o.tmpLimit ? { volumes: [{ name: 'tmp', emptyDir: { sizeLimit: o.tmpLimit } }] } : {}),
  };
  return pod;
}

function simulatedBox(name: string, nodeSelector: Record<string, string> = { type: 'kwok' }): k8s.V1Pod {
  const pod = boxPod(name, poolName, {}, small);
  pod.spec!.nodeSelector = nodeSelector;
  return pod;
}

async function podEvents(name: string, reason: string): Promise<k8s.CoreV1Event[]> {
  const list = await core.listNamespacedEvent({ namespace, fieldSelector: `involvedObject.name=${name},reason=${reason}` });
  return list.items;
}

async function eventFor(name: string, reason: string, timeoutMs = 120_000): Promise<k8s.CoreV1Event> {
  return waitFor(`event ${reason} on ${name}`, async () => (await podEvents(name, reason))[0], { timeoutMs, intervalMs: 500 });
}

/** JSON notifications that reached the receiver for one box (one per delivery id, whatever the retries). */
function notificationsFor(box: string): Delivery[] {
  const byId = new Map<string, Delivery>();
  for (const d of deliveries) if (d.path === '/hook' && d.body.box_id === box && d.attempt > 1) byId.set(d.id, d);
  return [...byId.values()];
}

function notifiedReasons(box: string): string[] {
  return notificationsFor(box).flatMap((d) => d.body.failures!.map((f) => f.reason));
}

beforeAll(async () => {
  receiver = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      const id = String(req.headers['x-sandbox-bridge-delivery'] ?? '');
      const attempt = (attempts.get(id) ?? 0) + 1;
      attempts.set(id, attempt);
      deliveries.push({ path: req.url ?? '', id, attempt, signatureOk: verify(req, body), body: JSON.parse(body) as Delivery['body'] });
      res.statusCode = req.url === '/hook' && attempt === 1 ? 503 : 200;
      res.end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  receiverUrl = `http://127.0.0.1:${(receiver.address() as { port: number }).port}`;

  dir = mkdtempSync(join(tmpdir(), 'operator-health-'));
  writeFileSync(
    join(dir, 'webhooks.json'),
    JSON.stringify({
      endpoints: [
        { url: `${receiverUrl}/hook` },
        { url: `${receiverUrl}/slack`, format: 'slack', events: ['oom_killed', 'evicted'] },
      ],
    }),
  );
  writeFileSync(join(dir, 'signing-key'), `${SIGNING_KEY}\n`);
  await installCrd(kc);
  operator = await startHealthOperator('health-a');
  ({ name: poolName, ns: namespace } = await pools.createReady());

  const create = (pod: k8s.V1Pod) => core.createNamespacedPod({ namespace, body: pod });
  await create(simulatedBox('stuck', { 'sandbox-bridge.io/no-such-node': 'true' }));
  await create(simulatedBox('evict-api'));
  if (realNode.available) {
    // busybox tail holds a line without newlines whole: 200 MiB under a 64 MiB limit. The kernel
    // kills tail, the shell ends, and the runtime reports the container OOMKilled.
    await create(realBox('oom', 'head -c 209715200 /dev/zero | tail > /dev/null; echo survived', { memory: '64Mi' }));
    await create(realBox('pull', 'sleep 3600', { image: 'sandbox-bridge/no-such-image:1', pullPolicy: 'Never' }));
    await create(realBox('crash', 'echo bye; exit 3'));
    await create(realBox('crashloop', 'exit 1', { restartPolicy: 'Always' }));
    await create(realBox('six', 'exit 2', { containers: 6 }));
    await create(realBox('evict-disk', 'head -c 83886080 /dev/zero > /tmp/fill; sleep 3600', { tmpLimit: '64Mi' }));
  }
}, 120_000);

afterAll(async () => {
  if (process.env.HEALTH_TEST_DUMP) writeFileSync(process.env.HEALTH_TEST_DUMP, JSON.stringify({ deliveries, logs: operator?.logs() }, null, 1));
  await pools.cleanup();
  await operator?.stop();
  await deleteLease(kc, leaseName);
  await new Promise<void>((resolve) => receiver?.close(() => resolve()));
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function startHealthOperator(name: string): Promise<OperatorProcess> {
  return startOperator({
    shard,
    leaseName,
    name,
    env: {
      STUCK_PENDING_SECONDS: String(STUCK_PENDING_SECONDS),
      WEBHOOKS_FILE: join(dir, 'webhooks.json'),
      WEBHOOK_SIGNING_KEY_FILE: join(dir, 'signing-key'),
      WEBHOOK_DEBOUNCE_SECONDS: String(DEBOUNCE_SECONDS),
    },
  });
}

test('a box Pending past the threshold: one BoxStuckPending with the scheduler\'s reason, on the pod and the pool', async () => {
  const event = await eventFor('stuck', 'BoxStuckPending', (STUCK_PENDING_SECONDS + 30) * 1000);
  expect(event.type).toBe('Warning');
  expect(event.message).toMatch(/^Pending for \d+ s: not scheduled: 0\/\d+ nodes are available/);
  expect(event.source?.component).toBe('sandbox-bridge-operator');
  const created = Date.parse(String((await core.readNamespacedPod({ name: 'stuck', namespace })).metadata!.creationTimestamp));
  expect(new Date(event.firstTimestamp!).getTime() - created).toBeGreaterThanOrEqual((STUCK_PENDING_SECONDS - 1) * 1000); // second resolution
  const poolEvent = await waitFor('the pool event', async () => {
    const events = await core.listNamespacedEvent({ namespace: 'default', fieldSelector: `involvedObject.name=${poolName},reason=BoxStuckPending` });
    return events.items[0];
  });
  expect(poolEvent.message).toContain('Box stuck');
  const notified = await waitFor('the notification', async () => notificationsFor('stuck')[0]);
  expect(notified.signatureOk).toBe(true);
  expect(notified.body).toMatchObject({ type: 'box.failure', pool: poolName, namespace, box_id: 'stuck', failures: [{ reason: 'stuck_pending', event_reason: 'BoxStuckPending' }] });
}, 120_000);

test('an eviction through the Eviction API: BoxEvicted, to both endpoints', async () => {
  await waitFor('evict-api to run', async () => ((await core.readNamespacedPod({ name: 'evict-api', namespace })).status?.phase === 'Running' ? true : undefined));
  await core.createNamespacedPodEviction({ name: 'evict-api', namespace, body: { metadata: { name: 'evict-api', namespace } } });
  const event = await eventFor('evict-api', 'BoxEvicted', 30_000);
  expect(event.message).toContain('EvictionByEvictionAPI');
  await waitFor('the notifications', async () => (notifiedReasons('evict-api').includes('evicted') ? true : undefined));
  const slack = await waitFor('the Slack message', async () => deliveries.find((d) => d.path === '/slack' && d.body.text?.includes('evict-api')));
  expect(slack.body.text).toMatch(/^:rotating_light: Box evict-api in pool .*\n• BoxEvicted: evicted \(EvictionByEvictionAPI\)/);
  expect(await podEvents('evict-api', 'BoxCrashed')).toEqual([]); // stopping it was not a crash
});

onReal('OOMKilled for real: BoxOOMKilled, and the Slack endpoint gets it too', async () => {
  const event = await eventFor('oom', 'BoxOOMKilled', 180_000);
  expect(event.message).toMatch(/container box was OOMKilled/);
  await waitFor('the notifications', async () => (notifiedReasons('oom').includes('oom_killed') ? true : undefined));
  expect(deliveries.some((d) => d.path === '/slack' && d.body.text?.includes('BoxOOMKilled'))).toBe(true);
}, 200_000);

onReal('an image that cannot be pulled: BoxImagePullFailed, and no BoxStuckPending besides', async () => {
  const event = await eventFor('pull', 'BoxImagePullFailed', 180_000);
  expect(event.message).toMatch(/image sandbox-bridge\/no-such-image:1 of container box cannot be pulled \(ErrImageNeverPull\)/);
  const created = Date.parse(String((await core.readNamespacedPod({ name: 'pull', namespace })).metadata!.creationTimestamp));
  await new Promise((r) => setTimeout(r, Math.max(0, created + (STUCK_PENDING_SECONDS + 5) * 1000 - Date.now()))); // past the Pending threshold
  expect(await podEvents('pull', 'BoxStuckPending')).toEqual([]);
  expect(deliveries.some((d) => d.path === '/slack' && d.body.text?.includes('pull'))).toBe(false); // not in its events
}, 240_000);

onReal('a crash, and each restart of a crash loop, is one BoxCrashed', async () => {
  expect((await eventFor('crash', 'BoxCrashed', 180_000)).message).toBe('container box exited with code 3 (Error)');
  await waitFor('a second crash of the loop', async () => ((await podEvents('crashloop', 'BoxCrashed')).length >= 2 ? true : undefined), { timeoutMs: 180_000, intervalMs: 1000 });
  await core.deleteNamespacedPod({ name: 'crashloop', namespace, gracePeriodSeconds: 0 });
  const events = await podEvents('crashloop', 'BoxCrashed');
  expect(events.every((e) => e.count === 1)).toBe(true);
  expect(new Set(events.map((e) => e.metadata?.name)).size).toBe(events.length);
}, 400_000);

onReal('a kubelet eviction (emptyDir over its limit): BoxEvicted with the kubelet\'s reason', async () => {
  // The kubelet measures emptyDir usage every minute or so: this can take a while.
  const event = await eventFor('evict-disk', 'BoxEvicted', 240_000);
  expect(event.message).toMatch(/evicted by its node: .*exceeds the limit "64Mi"/);
  expect(await podEvents('evict-disk', 'BoxCrashed')).toEqual([]);
}, 260_000);

onReal('six failures of one box at once: six events and samples, one or two notifications (debounce), every one signed', async () => {
  await waitFor('six crash events', async () => ((await podEvents('six', 'BoxCrashed')).length === 6 ? true : undefined), { timeoutMs: 180_000 });
  // The first notification at once, the others together when the window ends.
  const crashed = () => notifiedReasons('six').filter((r) => r === 'crashed');
  await waitFor('all six failures notified', async () => (crashed().length === 6 ? true : undefined), { timeoutMs: (DEBOUNCE_SECONDS + 30) * 1000 });
  const notes = notificationsFor('six').filter((n) => n.body.failures!.some((f) => f.reason === 'crashed'));
  expect(notes.length).toBeLessThanOrEqual(2);
  expect(notes.flatMap((n) => n.body.failures!.filter((f) => f.reason === 'crashed').map((f) => f.container)).sort()).toEqual(['box', 'box-1', 'box-2', 'box-3', 'box-4', 'box-5']);
}, 240_000);

test('no duplicates: each occurrence once in events, metrics and notifications; retries under one delivery id; a new leader repeats nothing', async () => {
  const boxes = realNode.available ? ['stuck', 'evict-api', 'oom', 'pull', 'crash', 'six', 'evict-disk'] : ['stuck', 'evict-api'];
  await waitFor('every box notified', async () => (boxes.every((b) => notificationsFor(b).length > 0) ? true : undefined), { timeoutMs: 60_000 });
  await new Promise((r) => setTimeout(r, (DEBOUNCE_SECONDS + 2) * 1000)); // any window still open ends

  const snapshot = async () => {
    const events = (await core.listNamespacedEvent({ namespace })).items.filter((e) => e.source?.component === 'sandbox-bridge-operator');
    return events.map((e) => `${e.involvedObject.name}/${e.reason}/${e.metadata?.name}`).sort();
  };
  const before = await snapshot();
  for (const e of before) expect(before.filter((x) => x === e)).toHaveLength(1);
  // Every failure notified exactly as often as it was recorded, signed, and only after a retry.
  for (const box of realNode.available ? [...boxes, 'crashloop'] : boxes) {
    const recorded = before.filter((e) => e.startsWith(`${box}/`)).length;
    expect({ box, notified: notifiedReasons(box).length }).toEqual({ box, notified: recorded });
  }
  const json = deliveries.filter((d) => d.path === '/hook');
  expect(json.every((d) => d.signatureOk)).toBe(true);
  expect(json.filter((d) => d.attempt === 1).length).toBe(json.filter((d) => d.attempt === 2).length);
  expect(await operator.metric('sandbox_operator_box_failures_total')).toBe(before.length);
  expect(await operator.metric('sandbox_operator_webhook_retries_total')).toBeGreaterThanOrEqual(json.filter((d) => d.attempt === 2).length);

  // A new leader (the old one stopped, the lease released) sees the same failed and Pending pods.
  const delivered = deliveries.length;
  await operator.stop();
  operator = await startHealthOperator('health-b');
  await waitFor('the new leader', async () => ((await operator.metric('sandbox_operator_leader')) === 1 ? true : undefined), { timeoutMs: 30_000 });
  await new Promise((r) => setTimeout(r, 8000)); // the stuck and pull pods are still there, Pending
  // The stuck pod's Pending threshold is long past: the new leader tried it once more (a 409).
  expect(await snapshot()).toEqual(before);
  expect(deliveries.length).toBe(delivered);
  expect(await operator.metric('sandbox_operator_box_failures_total')).toBe(0);
}, 180_000);
