// Idle sleep and wake (docs/snapshots.md, "Idle sleep"). A box with no bridge call for the pool's
// idle.sleepAfterSeconds, no call still at work in it (boxd counts them), and no background
// process younger than the 30-minute keepalive cap, is snapshotted and its pod deleted; its
// record stays, marked asleep with the snapshot. The next
// call to it, through any replica, wakes it inside the box connector: a warm or new pod, the
// workspace restored, the env from the record, the same box id; then the call proceeds.
//
// Every replica sweeps its own watch cache (level-based: each pass looks at every box afresh);
// the record Secret is the lock. A sleep or a wake starts with a compare-and-swap of the record's
// sleep label (pending / asleep / waking, with who and when), so exactly one replica acts on a
// box at a time and the others wait for it; a mark left by a replica that died is taken over once
// stale. The pod is deleted only after the snapshot is stored, and only if nothing touched the
// pod meanwhile (a delete guarded by the resource version the sleep decision saw): a call that
// came in during the snapshot wrote the pod's last-active annotation, so the sleep is given up.
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { boxdToken, newNonce } from '../../common/boxd.js';
import type { BoxShape, SessionBox } from '../../common/box-pod.js';
import { BridgeError } from '../../common/errors.js';
import { ANNOTATIONS, LABELS } from '../../common/labels.js';
import { parseQuantity } from '../../common/quantity.js';
import { boxIdOf, boxStatus, sleptBoxOf, type SleptBox } from '../box-pod.js';
import type { BoxdClient } from '../../common/boxd-client.js';
import type { BoxReader } from '../kube/box-cache.js';
import { envOf, recordOf, type BoxRecords } from '../../common/box-records.js';
import type { KubeCall } from '../kube/instrument.js';
import type { PolicySource } from '../kube/policy.js';
import { sleepStateOf, type SleepingReader } from '../kube/sleeping-records.js';
import type { BoxConnector, SleepHooks } from './box-connector.js';
import type { BoxService, CreatePath } from './boxes.js';
import type { SnapshotService } from './snapshots.js';

/** A background process keeps its box awake for at most this long (the platform's keepalive cap). */
export const KEEPALIVE_CAP_MS = 30 * 60 * 1000;
/** A sleep or wake mark older than this, its holder gone, is taken over. */
const STALE_MARK_MS = 3 * 60 * 1000;
/** After marking a box pending: calls through other replicas see the mark (or have touched the pod). */
const SETTLE_MS = 1000;
/** How often a call waiting for another replica's sleep or wake looks at the record. */
const WAIT_POLL_MS = 150;
/** A call waits this long for a box to wake before it answers 503. */
const WAKE_WAIT_MS = 5 * 60 * 1000;
/** After a failed sleep (store down), the box is not tried again for this long. */
const RETRY_AFTER_FAILURE_MS = 60_000;
/** Boxes one replica puts to sleep at once (each streams a snapshot). */
const SLEEP_CONCURRENCY = 2;
const TOUCH_MEMORY = 50_000;

export type SleepOutcome = 'slept' | 'active' | 'busy' | 'error';

export interface SleepServiceDeps {
  core: k8s.CoreV1Api;
  call: KubeCall;
  cache: BoxReader;
  sleeping: SleepingReader;
  records: BoxRecords;
  boxes: Pick<BoxService, 'revive' | 'readPod'>;
  boxd: BoxdClient;
  connector: BoxConnector;
  snapshots: Pick<SnapshotService, 'create' | 'restoreWorkspace' | 'discard' | 'available'>;
  policy: PolicySource;
  namespace: string;
  boxdKey: Buffer;
  log: Logger;
  onSlept?: (outcome: SleepOutcome) => void;
  onWoken?: (path: CreatePath | 'none', outcome: 'ok' | 'error', seconds: number) => void;
  now?: () => number;
}

export class SleepService implements SleepHooks {
  /** This replica, as written into the marks it sets. */
  readonly identity = `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
  private readonly now: () => number;
  /** pod uid -> when this replica last wrote its activity. */
  private readonly touched = new Map<string, number>();
  /** box id -> the wake (or wait for one) this replica's calls share. */
  private readonly waits = new Map<string, Promise<void>>();
  /** box ids this replica is putting to sleep, and when failed ones may be tried again. */
  private readonly working = new Set<string>();
  private readonly retryAt = new Map<string, number>();
  private timer: NodeJS.Timeout | undefined;
  private sweeping = false;

  constructor(private readonly deps: SleepServiceDeps) {
    this.now = deps.now ?? Date.now;
  }

  /** Milliseconds of idleness after which a box sleeps; 0 when idle sleep is off (or no store). */
  sleepAfterMs(): number {
    if (!this.deps.snapshots.available) return 0;
    return this.deps.policy.current().idle.sleepAfterSeconds * 1000;
  }

  start(): void {
    const tick = () => {
      const after = this.sleepAfterMs();
      this.timer = setTimeout(tick, clamp(after / 5, 500, 30_000));
      this.timer.unref();
      if (after > 0) void this.sweep();
    };
    tick();
  }

  stop(): void {
    clearTimeout(this.timer);
  }

  // ---- activity ----

  /** Records a call on the box's pod; false when that write failed (the call goes on regardless). */
  async touch(pod: k8s.V1Pod, force = false): Promise<boolean> {
    const after = this.sleepAfterMs();
    if (!after) return true;
    const uid = pod.metadata!.uid!;
    const now = this.now();
    const last = Math.max(this.touched.get(uid) ?? 0, lastActive(pod));
    // At most once per tenth of the idle time per box and replica: no API write per exec.
    if (!force && now - last < clamp(after / 10, 500, 60_000)) return true;
    try {
      await this.patchPod(pod, { [ANNOTATIONS.lastActive]: new Date(now).toISOString() });
      if (this.touched.size >= TOUCH_MEMORY) this.touched.delete(this.touched.keys().next().value!);
      this.touched.set(uid, now);
      return true;
    } catch (err) {
      this.deps.log.debug({ err, box: pod.metadata?.name }, 'could not record box activity');
      return false;
    }
  }

  private patchPod(pod: k8s.V1Pod, annotations: Record<string, string>): Promise<k8s.V1Pod> {
    return this.deps.call('record box activity', () =>
      this.deps.core.patchNamespacedPod(
        { name: pod.metadata!.name!, namespace: this.deps.namespace, body: { metadata: { annotations } } },
        k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
      ),
    );
  }

  // ---- wake ----

  async ensureAwake(boxId: string, signal?: AbortSignal, recheck = false): Promise<void> {
    // The common case: no record in a sleep state. A recheck (the box's pod went as the call
    // came in) reads the record itself, while idle sleep is on: this replica's watch may not
    // show the sleep yet.
    if (!this.deps.sleeping.get(boxId) && !(recheck && this.sleepAfterMs() > 0)) return;
    let wait = this.waits.get(boxId);
    if (!wait) {
      wait = this.awaken(boxId).finally(() => this.waits.delete(boxId));
      this.waits.set(boxId, wait);
    }
    if (!signal) return wait;
    signal.throwIfAborted();
    await new Promise<void>((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      signal.addEventListener('abort', onAbort, { once: true });
      wait.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
    });
  }

  /** Until the record is in no sleep state: wakes the box, or waits for the replica that does. */
  private async awaken(boxId: string): Promise<void> {
    const deadline = this.now() + WAKE_WAIT_MS;
    let touchedPending = false;
    while (this.now() < deadline) {
      const record = await this.deps.records.read(boxId);
      const state = sleepStateOf(record);
      if (!record || !state || record.metadata?.deletionTimestamp) return; // awake, or gone (the call answers 404)
      const stale = this.now() - markedAt(record) > STALE_MARK_MS;
      const pod = this.livePod(boxId);
      if (state === 'pending') {
        if (pod && (this.touched.get(pod.metadata!.uid!) ?? 0) > markedAt(record)) return; // already moved on, below
        if (pod && !touchedPending) {
          // A call while the box is being snapshotted: moving its activity on makes the sleep
          // give up (the pod's delete is guarded by its resource version, and a sleeper that has
          // yet to look sees the activity), so the call proceeds at once, even when the sleeper
          // died mid-snapshot. A write that failed proves nothing: then the call waits.
          touchedPending = true;
          if (await this.touch(pod, true)) return;
        }
        if (stale) {
          // Its sleeper died: with a stored snapshot and no pod it sleeps; otherwise it runs on.
          const asleep = !pod && record.metadata?.annotations?.[ANNOTATIONS.sleepSnapshot];
          await this.deps.records.swap(record, asleep ? { labels: { [LABELS.sleep]: 'asleep' } } : clearMark());
          continue;
        }
      } else if (state === 'asleep' || stale) {
        const nonce = newNonce();
        const mine = await this.deps.records.swap(record, {
          labels: { [LABELS.sleep]: 'waking' },
          annotations: { [ANNOTATIONS.sleepBy]: this.mark() },
          // A new pod named after the box mounts the record: its credential, for the new nonce.
          token: boxdToken(this.deps.boxdKey, this.deps.namespace, boxId, nonce),
        });
        if (mine) return this.wake(boxId, mine, nonce);
        continue; // another replica moved first: look again
      }
      await delay(WAIT_POLL_MS);
    }
    throw new BridgeError('cluster_unavailable', `box ${boxId} is waking up and did not finish in time; retry`, { headers: { 'Retry-After': '5' } });
  }

  private async wake(boxId: string, record: k8s.V1Secret, nonce: string): Promise<void> {
    const started = performance.now();
    let path: CreatePath | 'none' = 'none';
    const slept = sleptBoxOf(record);
    const snapshotId = record.metadata?.annotations?.[ANNOTATIONS.sleepSnapshot];
    try {
      if (!slept || !snapshotId) throw new BridgeError('internal_error', `box ${boxId} is marked asleep without its snapshot`);
      // A pod left by a waker that died is replaced: it may hold a half-restored workspace.
      const leftover = this.deps.cache.get(boxId);
      if (leftover) await this.deletePod(leftover).catch(() => undefined);
      const session: SessionBox = {
        boxId,
        sessionId: record.metadata?.annotations?.[ANNOTATIONS.sessionId] ?? '',
        slot: Number(record.metadata?.labels?.[LABELS.slot] ?? 0),
        seat: slept.seat ?? -1,
        record: { name: record.metadata!.name!, uid: record.metadata!.uid! },
        ttlSeconds: slept.ttlSeconds,
        now: new Date(this.now()),
        createdAt: new Date(slept.createdAt),
        expiresAt: new Date(slept.expiresAt),
        idempotencyKey: record.metadata?.labels?.[LABELS.idempotencyKey],
      };
      const shape: BoxShape = {
        image: slept.image,
        cpuCores: parseQuantity(slept.cpu),
        memoryBytes: parseQuantity(slept.memory),
        runtimeClassName: slept.runtimeClassName,
        serviceAccountName: slept.serviceAccountName,
      };
      const revived = await this.deps.boxes.revive(session, shape, envOf(record), nonce);
      path = revived.path;
      await this.deps.snapshots.restoreWorkspace(boxId, snapshotId);
      // Awake: a plain record again (its snapshot stays in the store until retention).
      let current: k8s.V1Secret | undefined = record;
      for (let attempt = 0; current && attempt < 5; attempt++) {
        if (await this.deps.records.swap(current, clearMark())) break;
        current = await this.deps.records.read(boxId);
      }
      this.deps.onWoken?.(path, 'ok', (performance.now() - started) / 1000);
      this.deps.log.info({ box: boxId, path, snapshot: snapshotId, ms: Math.round(performance.now() - started) }, 'box woken');
    } catch (err) {
      this.deps.onWoken?.(path, 'error', (performance.now() - started) / 1000);
      this.deps.log.warn({ err, box: boxId }, 'could not wake box; it stays asleep');
      // Back to asleep, so the next call tries again at once; a pod made for it goes.
      const made = this.deps.cache.get(boxId);
      if (made) await this.deletePod(made).catch(() => undefined);
      const latest = await this.deps.records.read(boxId).catch(() => undefined);
      if (latest && sleepStateOf(latest) === 'waking') await this.deps.records.swap(latest, { labels: { [LABELS.sleep]: 'asleep' } }).catch(() => undefined);
      throw err;
    }
  }

  // ---- sleep ----

  /** One pass over this replica's cache: every box idle past the pool's time is put to sleep. */
  async sweep(): Promise<void> {
    if (this.sweeping) return;
    this.sweeping = true;
    try {
      const after = this.sleepAfterMs();
      if (!after) return;
      const now = this.now();
      const due = this.deps.cache.list().filter((pod) => {
        const boxId = boxIdOf(pod) ?? pod.metadata?.name ?? '';
        return (
          boxStatus(pod).status === 'Running' &&
          now - lastActive(pod) >= after &&
          !this.working.has(boxId) &&
          (this.retryAt.get(boxId) ?? 0) <= now &&
          // A box about to expire is left to the reaper.
          expiresAt(pod) - now > after
        );
      });
      let next = 0;
      const worker = async () => {
        while (next < due.length) await this.sleepBox(due[next++]!).catch(() => undefined);
      };
      await Promise.all(Array.from({ length: Math.min(SLEEP_CONCURRENCY, due.length) }, worker));
    } finally {
      this.sweeping = false;
    }
  }

  /** Puts one idle box to sleep; the box runs on unchanged whenever anything goes wrong. */
  async sleepBox(pod: k8s.V1Pod): Promise<SleepOutcome | undefined> {
    const boxId = boxIdOf(pod) ?? pod.metadata!.name!;
    this.working.add(boxId);
    let current: k8s.V1Secret | undefined;
    let snapshotId: string | undefined;
    try {
      const record = await this.deps.records.read(boxId);
      if (!record || record.metadata?.uid !== recordOf(pod, boxId)) return undefined;
      if (sleepStateOf(record)) {
        // Another replica is at it, or died at it: a stale mark on a box whose pod runs is cleared.
        if (this.now() - markedAt(record) > STALE_MARK_MS && sleepStateOf(record) === 'pending') await this.deps.records.swap(record, clearMark());
        return undefined;
      }
      current = await this.deps.records.swap(record, { labels: { [LABELS.sleep]: 'pending' }, annotations: { [ANNOTATIONS.sleepBy]: this.mark() } });
      if (!current) return undefined; // another replica took it
      await delay(SETTLE_MS);

      const live = await this.deps.boxes.readPod(pod.metadata!.name!);
      const after = this.sleepAfterMs();
      if (!live || live.metadata?.uid !== pod.metadata!.uid || live.metadata?.deletionTimestamp || !after || this.now() - lastActive(live) < after) {
        return this.finish('active', current);
      }
      const { processes, calls } = await this.deps.connector.call(
        boxId,
        async ({ target, signal }) => ({ ...(await this.deps.boxd.listProcesses(target, signal)), ...(await this.deps.boxd.activity(target, signal)) }),
        undefined,
        { internal: true },
      );
      const now = this.now();
      if (calls > 0 || processes.some((p) => p.status === 'running' && now - Date.parse(p.started_at) < KEEPALIVE_CAP_MS)) {
        // A call still at work (a long command, a stream, a terminal; through any replica), or
        // the platform's keepalive while background tasks live (each for 30 minutes at most).
        await this.touch(live, true);
        return this.finish('busy', current);
      }
      const decidedAt = live.metadata!.resourceVersion!;
      const snapshot = await this.deps.snapshots.create(boxId, { name: 'idle-sleep' }, { internal: true });
      snapshotId = snapshot.snapshot_id;
      const status = boxStatus(live);
      const slept: SleptBox = {
        image: status.image,
        cpu: status.cpu,
        memory: status.memory,
        ...(live.spec?.runtimeClassName ? { runtimeClassName: live.spec.runtimeClassName } : {}),
        // The API server names `default` for a pod that names none: that is no request of the box's.
        ...(live.spec?.serviceAccountName && live.spec.serviceAccountName !== 'default' ? { serviceAccountName: live.spec.serviceAccountName } : {}),
        createdAt: status.created_at,
        expiresAt: status.expires_at,
        ttlSeconds: Number(live.metadata?.annotations?.[ANNOTATIONS.ttlSeconds] ?? this.deps.policy.current().defaultTtlSeconds),
        sleptAt: new Date(now).toISOString(),
        ...(Number.isInteger(Number(live.metadata?.labels?.[LABELS.seat])) ? { seat: Number(live.metadata!.labels![LABELS.seat]) } : {}),
      };
      // The snapshot is stored: the record names it before the pod may go.
      current = await this.deps.records.swap(current, {
        annotations: { [ANNOTATIONS.sleepSnapshot]: snapshotId, [ANNOTATIONS.sleepBox]: JSON.stringify(slept), [ANNOTATIONS.expiresAt]: slept.expiresAt },
      });
      if (!current) return await this.giveUp(boxId, snapshotId, undefined, 'active');
      try {
        await this.deletePod(live, decidedAt);
      } catch (err) {
        if (err instanceof BridgeError && (err.type === 'conflict' || err.type === 'not_found')) {
          return await this.giveUp(boxId, snapshotId, current, 'active'); // touched meanwhile: it stays awake
        }
        throw err;
      }
      snapshotId = undefined; // from here on the snapshot is the box
      await this.deps.records.swap(current, { labels: { [LABELS.sleep]: 'asleep' }, annotations: { [ANNOTATIONS.sleepBy]: this.mark() } });
      this.deps.log.info({ box: boxId, snapshot: snapshot.snapshot_id, bytes: snapshot.size }, 'box put to sleep');
      this.deps.onSlept?.('slept');
      return 'slept';
    } catch (err) {
      this.retryAt.set(boxId, this.now() + Math.min(RETRY_AFTER_FAILURE_MS, this.sleepAfterMs() || RETRY_AFTER_FAILURE_MS));
      const message = err instanceof Error ? err.message : String(err);
      this.deps.log.warn({ err, box: boxId }, 'idle sleep failed; the box keeps running');
      await this.event(pod, 'Warning', 'SleepFailed', `Idle sleep failed, the box keeps running and nothing was lost: ${message}`);
      return await this.giveUp(boxId, snapshotId, current, 'error');
    } finally {
      this.working.delete(boxId);
    }
  }

  private async finish(outcome: SleepOutcome, record: k8s.V1Secret): Promise<SleepOutcome> {
    await this.deps.records.swap(record, clearMark());
    this.deps.onSlept?.(outcome);
    return outcome;
  }

  /** Undoes a sleep that did not complete: the mark goes, and a snapshot taken for it. */
  private async giveUp(boxId: string, snapshotId: string | undefined, record: k8s.V1Secret | undefined, outcome: SleepOutcome): Promise<SleepOutcome> {
    const latest = record ?? (await this.deps.records.read(boxId).catch(() => undefined));
    if (latest && sleepStateOf(latest) === 'pending') await this.deps.records.swap(latest, clearMark()).catch(() => undefined);
    if (snapshotId) await this.deps.snapshots.discard(snapshotId).catch(() => undefined);
    this.deps.onSlept?.(outcome);
    return outcome;
  }

  // ---- cluster access ----

  private livePod(boxId: string): k8s.V1Pod | undefined {
    const pod = this.deps.cache.get(boxId);
    return pod && !pod.metadata?.deletionTimestamp ? pod : undefined;
  }

  private async deletePod(pod: k8s.V1Pod, resourceVersion?: string): Promise<void> {
    await this.deps.call('delete box pod', () =>
      this.deps.core.deleteNamespacedPod({
        name: pod.metadata!.name!,
        namespace: this.deps.namespace,
        // Options in the body: the API server ignores query options when a DELETE has a body.
        body: { propagationPolicy: 'Background', preconditions: { uid: pod.metadata!.uid!, ...(resourceVersion ? { resourceVersion } : {}) } },
      }),
    );
  }

  private async event(pod: k8s.V1Pod, type: 'Normal' | 'Warning', reason: string, message: string): Promise<void> {
    const now = new Date(this.now());
    const { name, namespace, uid } = pod.metadata!;
    await this.deps
      .call('record box event', () =>
        this.deps.core.createNamespacedEvent({
          namespace: namespace ?? this.deps.namespace,
          body: {
            metadata: { name: `${name}.${now.getTime().toString(16)}${randomBytes(4).toString('hex')}`, namespace: namespace ?? this.deps.namespace },
            involvedObject: { apiVersion: 'v1', kind: 'Pod', name, namespace, uid },
            type,
            reason,
            message: message.slice(0, 1024),
            source: { component: 'sandbox-bridge' },
            reportingComponent: 'sandbox-bridge',
            reportingInstance: this.identity,
            firstTimestamp: now,
            lastTimestamp: now,
            count: 1,
          },
        }),
      )
      .catch((err: unknown) => this.deps.log.debug({ err, reason }, 'could not record event'));
  }

  private mark(): string {
    return `${this.identity} ${new Date(this.now()).toISOString()}`;
  }
}

/** Removes every trace of a sleep state from a record. */
function clearMark() {
  return {
    labels: { [LABELS.sleep]: null },
    annotations: { [ANNOTATIONS.sleepBy]: null, [ANNOTATIONS.sleepSnapshot]: null, [ANNOTATIONS.sleepBox]: null, [ANNOTATIONS.expiresAt]: null },
  };
}

/** When the box's last call was (its pod's annotation; a pod without one: its creation). */
export function lastActive(pod: k8s.V1Pod): number {
  const stamped = Date.parse(pod.metadata?.annotations?.[ANNOTATIONS.lastActive] ?? '');
  if (Number.isFinite(stamped)) return stamped;
  const created = pod.metadata?.creationTimestamp;
  return created ? new Date(created).getTime() : 0;
}

function expiresAt(pod: k8s.V1Pod): number {
  const at = Date.parse(pod.metadata?.annotations?.[ANNOTATIONS.expiresAt] ?? '');
  return Number.isFinite(at) ? at : Infinity;
}

function markedAt(record: k8s.V1Secret): number {
  const at = Date.parse(record.metadata?.annotations?.[ANNOTATIONS.sleepBy]?.split(' ')[1] ?? '');
  return Number.isFinite(at) ? at : 0;
}

function clamp(v: number, min: number, max: number): number {
  return Math.min(max, Math.max(min, v));
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
