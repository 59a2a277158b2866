// Idle sleep: a reconciler of each box (key `<namespace>/<box id>`), run by the operator's leader
// (docs/lifecycle.md, transitions 2-6 and 11). Level-based: from the caches it decides whether the
// box is due (no bridge call for the pool's idle.sleepAfterSeconds) and otherwise asks to look
// again when it will be (RequeueAfter), so a pass costs API calls only for the boxes due, however
// many bridge replicas there are. A box due is put to sleep under its record's lease: boxd's
// fence up, the workspace streamed to the store, the record naming the snapshot, then the pod's
// delete, guarded by the resourceVersion read after the fence (a call that met the fence changed
// it). A lease found expired (its holder died mid-sleep or mid-wake) is taken over and resumed.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { BoxLeases, LeaseKeeper, leaseExpiry, stateOf, type Held } from '../common/box-lease.js';
import { backupContextOf } from '../common/box-context.js';
import { sleptBoxFromPod, sleptBoxOf } from '../common/box-pod.js';
import { BoxRecords, envOf } from '../common/box-records.js';
import { BOXD_NONCE_ANNOTATION, boxdToken } from '../common/boxd.js';
import type { BoxdClient, BoxdTarget } from '../common/boxd-client.js';
import type { EnvSealer } from '../common/env-seal.js';
import { BridgeError } from '../common/errors.js';
import { plainCall, toBridgeError } from '../common/kube.js';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS, seatName } from '../common/labels.js';
import type { ObjectStore } from '../common/object-store.js';
import type { SandboxPool } from '../common/pool.js';
import { parseQuantity } from '../common/quantity.js';
import { METADATA_OBJECT, WORKSPACE_OBJECT, parseSnapshotId, snapshotKey } from '../common/snapshots.js';
import { snapshotLimits, takeSnapshot } from '../common/snapshot-writer.js';
import { outputsMountOf, uploadOutputs } from '../common/session-outputs.js';
import { memoryMountsOf, mountsClient, syncAll } from '../common/memory-store.js';
import { adoptionPatch, holdsWarmSeat, isWarmSeatOf, ownedBy, seatOf } from '../common/seats.js';
import type { EventRecorder } from './events.js';
import type { OperatorMetrics } from './metrics.js';
import type { Lister, ReconcileResult } from './pool-reconciler.js';

/** A background process keeps its box awake for at most this long (the platform's keepalive cap). */
export const KEEPALIVE_CAP_MS = 30 * 60 * 1000;
/** A sleeping box's snapshot outlives the box's own expiry by this much (clock skew, a slow reaper). */
const SNAPSHOT_MARGIN_MS = 3600 * 1000;
/** After a failed sleep: 1 min, doubling, at most 1 h. */
const BACKOFF_MIN_MS = 60_000;
const BACKOFF_MAX_MS = 3600_000;
/** How long a Failed box without an expiry of its own is kept (its status readable) before the reaper takes it. */
const FAILED_KEPT_MS = 3600_000;
/** How often the pod's guarded delete is tried again when only the kubelet changed the pod meanwhile. */
const DELETE_ATTEMPTS = 5;

export type SleepOutcome = 'slept' | 'active' | 'busy' | 'too_large' | 'error';

export interface IdleSleepOptions {
  core: k8s.CoreV1Api;
  pods: Lister<k8s.V1Pod>;
  secrets: Lister<k8s.V1Secret>;
  poolOf: (namespace: string) => SandboxPool | undefined;
  boxd: BoxdClient;
  /** The key box credentials derive from (the bridge's). */
  key: Buffer;
  store: ObjectStore;
  sealer: EnvSealer;
  identity: string;
  leaseMs: number;
  events: EventRecorder;
  metrics: OperatorMetrics;
  log: Logger;
  now?: () => number;
}

export class IdleSleepReconciler {
  private readonly now: () => number;
  /** `<namespace>/<box id>` -> the name of the pod serving it (claimed warm pods are not named after the box). */
  private readonly podOfBox = new Map<string, string>();
  /** Per box: failures in a row and when it may be tried again. */
  private readonly backoff = new Map<string, { failures: number; at: number }>();
  private readonly records = new Map<string, BoxRecords>();
  private readonly leases = new Map<string, BoxLeases>();

  constructor(private readonly o: IdleSleepOptions) {
    this.now = o.now ?? Date.now;
  }

  /** The queue key of a box pod or record, if it is one (warm pods are none). */
  keyOf(obj: k8s.V1Pod | k8s.V1Secret, kind: 'Pod' | 'Secret'): string | undefined {
    const ns = obj.metadata?.namespace;
    const name = obj.metadata?.name;
    if (!ns || !name) return undefined;
    if (kind === 'Secret') return obj.metadata?.labels?.[LABELS.component] === SECRET_COMPONENTS.record ? `${ns}/${name}` : undefined;
    if (obj.metadata?.labels?.[LABELS.warm]) return undefined;
    return `${ns}/${obj.metadata?.labels?.[LABELS.boxId] ?? name}`;
  }

  /** Keeps the box -> pod index current; call for every pod event. */
  observePod(pod: k8s.V1Pod, deleted: boolean): void {
    const key = this.keyOf(pod, 'Pod');
    if (!key) return;
    if (deleted) {
      if (this.podOfBox.get(key) === pod.metadata!.name) this.podOfBox.delete(key);
    } else {
      this.podOfBox.set(key, pod.metadata!.name!);
    }
  }

  async reconcile(key: string): Promise<ReconcileResult> {
    const [ns, boxId] = key.split('/') as [string, string];
    const pool = this.o.poolOf(ns);
    const record = this.o.secrets.get(boxId, ns);
    const pod = this.pod(key, ns, boxId);
    const step = planIdle({ pool, record, pod, now: this.now(), retryAt: this.backoff.get(key)?.at });
    switch (step.action) {
      case 'forget':
        this.backoff.delete(key);
        return {};
      case 'wait':
        return step.ms === undefined ? {} : { requeueAfterMs: step.ms };
      case 'resume':
        return this.resume(pool!, record!, step.state);
      case 'sleep':
        return this.sleep(key, pool!, record!, pod!);
    }
  }

  // ---- Running -> SleepPending -> Sleeping (or back to Running) ----

  private async sleep(key: string, pool: SandboxPool, record: k8s.V1Secret, cached: k8s.V1Pod): Promise<ReconcileResult> {
    const ns = pool.spec.namespace;
    const boxId = record.metadata!.name!;
    const held = await this.leasesOf(ns).take(record, 'pending');
    if (!held) return { requeueAfterMs: 1000 }; // the record changed since the cache saw it: look again
    const keeper = new LeaseKeeper(this.leasesOf(ns), held, this.now);
    const started = performance.now();
    const target = this.target(cached);
    const epoch = held.lease.epoch;
    let fenced = false;
    let snapshotId: string | undefined;
    let outcome: SleepOutcome = 'error';
    const log = this.o.log.child({ box: boxId, namespace: ns, epoch });
    try {
      const signal = keeper.signal;
      const { processes } = await this.o.boxd.listProcesses(target, signal);
      const now = this.now();
      // The platform's keepalive: background tasks keep their box awake for 30 minutes at most.
      if (processes.some((p) => p.status === 'running' && now - Date.parse(p.started_at) < KEEPALIVE_CAP_MS)) {
        outcome = 'busy';
        await this.touch(cached);
        return this.giveUp(keeper, {});
      }
      const { calls } = await this.o.boxd.fence(target, epoch, signal);
      fenced = true;
      // The pod as the fence found it: its resourceVersion guards the delete below. Any call
      // that meets the fence from now on writes the pod (last-active) first, changing it.
      const pod = await this.readPod(ns, cached.metadata!.name!);
      const after = pool.spec.idle.sleepAfterSeconds * 1000;
      if (calls > 0 || !pod || pod.metadata?.uid !== cached.metadata?.uid || pod.metadata?.deletionTimestamp || this.now() - lastActive(pod) < after) {
        outcome = calls > 0 ? 'busy' : 'active';
        await this.unfence(target, epoch);
        fenced = false;
        if (calls > 0 && pod) await this.touch(pod);
        return this.giveUp(keeper, {});
      }
      // A claimed warm pod holds a seat of its own (common/seats.ts), which goes with the pod:
      // the record takes it over first, so the box keeps its seat while it sleeps.
      if (holdsWarmSeat(pod)) await this.adoptSeat(ns, seatOf(pod)!, pod.metadata!.name!, { name: held.record.metadata!.name!, uid: held.record.metadata!.uid! });
      const slept = sleptBoxFromPod(pod, new Date(this.now()), pool.spec.defaultTtlSeconds);
      const boxExpiry = Date.parse(slept.expiresAt);
      const retention = pool.spec.snapshots.retentionSeconds * 1000;
      const createdAt = new Date(this.now());
      // The session's outputs (outside /workspace) to the store first: a failed copy keeps the box awake.
      const outputs = outputsMountOf(held.record);
      if (outputs) await uploadOutputs({ boxd: this.o.boxd, target, store: this.o.store, pool: pool.metadata.name, boxId, mount: outputs, signal, now: createdAt });
      // Read-write memory stores back to their store (docs/mounts.md), under the fence: a failed sync keeps the box awake.
      await syncAll({ store: this.o.store, client: mountsClient }, target, pod, memoryMountsOf(held.record), signal);
      const metadata = await takeSnapshot({
        boxd: this.o.boxd,
        target,
        signal,
        store: this.o.store,
        sealer: this.o.sealer,
        pool: pool.metadata.name,
        box: { box_id: boxId, session_id: pod.metadata?.annotations?.[ANNOTATIONS.sessionId] ?? '', image: slept.image, cpu: slept.cpu, memory: slept.memory },
        // The record as the lease's compare-and-swap answered it: data and all.
        env: envOf(held.record),
        context: backupContextOf(held.record),
        name: 'idle-sleep',
        createdAt,
        // Lives as long as the box, whatever the retention (docs/lifecycle.md).
        expiresAt: new Date(Math.max(createdAt.getTime() + retention, (Number.isFinite(boxExpiry) ? boxExpiry : 0) + SNAPSHOT_MARGIN_MS)),
        limits: snapshotLimits(pool.spec, parseQuantity),
      });
      snapshotId = metadata.snapshot_id;
      // The record names the snapshot before the pod may go.
      const named = await keeper.update({
        annotations: { [ANNOTATIONS.sleepSnapshot]: snapshotId, [ANNOTATIONS.sleepBox]: JSON.stringify(slept), [ANNOTATIONS.expiresAt]: slept.expiresAt || null },
      });
      if (!named) throw keeper.signal.reason ?? new Error('lost the lease');
      if (!(await this.deleteGuarded(ns, pod))) {
        // A call met the fence and moved the box's activity on: it stays awake, with its data.
        outcome = 'active';
        await this.unfence(target, epoch);
        fenced = false;
        await this.discard(pool, snapshotId);
        snapshotId = undefined;
        return this.giveUp(keeper, CLEAR_SLEEP);
      }
      snapshotId = undefined; // from here on the snapshot is the box
      fenced = false; // the pod is going, and its fence with it
      await this.leasesOf(ns).release(await keeper.stop(), 'asleep');
      outcome = 'slept';
      this.backoff.delete(key);
      log.info({ snapshot: metadata.snapshot_id, bytes: metadata.size, ms: Math.round(performance.now() - started) }, 'box put to sleep');
      return {};
    } catch (err) {
      outcome = err instanceof BridgeError && err.type === 'payload_too_large' ? 'too_large' : 'error';
      if (fenced) await this.unfence(target, epoch);
      if (snapshotId) await this.discard(pool, snapshotId);
      await this.giveUp(keeper, CLEAR_SLEEP).catch(() => undefined);
      const message = err instanceof Error ? err.message : String(err);
      const retryIn = this.failed(key);
      log.warn({ err: message, outcome, retryInMs: retryIn }, 'idle sleep failed; the box keeps running');
      const streak = this.backoff.get(key)!;
      if (streak.failures === 1 || outcome === 'too_large') {
        // One Event per streak of failures (the next ones back off silently; the metric counts them).
        await this.o.events.recordOnce(objectRef(cached, 'Pod'), `sleep-failed/${epoch}`, {
          type: 'Warning',
          reason: outcome === 'too_large' ? 'SleepRefused' : 'SleepFailed',
          message:
            outcome === 'too_large'
              ? `Idle sleep refused: ${message}; the box keeps running (${/^memory store /.test(message) ? 'remove files from that read-write memory store' : 'raise spec.snapshots.maxBytes or maxEntries'} to let it sleep)`
              : `Idle sleep failed, the box keeps running and nothing was lost: ${message}; retrying in ${Math.round(retryIn / 1000)} s`,
        });
      }
      return { requeueAfterMs: retryIn };
    } finally {
      await keeper.stop();
      this.o.metrics.sleeps.inc({ outcome });
      if (outcome === 'slept') this.o.metrics.sleepDuration.observe((performance.now() - started) / 1000);
    }
  }

  /** Ends a sleep that did not happen: the box is Running again, with change applied. */
  private async giveUp(keeper: LeaseKeeper, change: { annotations?: Record<string, null> }): Promise<ReconcileResult> {
    const held = await keeper.stop();
    await this.leasesOf(held.record.metadata!.namespace!).release(held, null, change);
    return {};
  }

  /**
   * Deletes the pod only as the fence found it. True once it is gone or going; false when a call
   * moved its activity on meanwhile (the sleep is then given up). A change by the kubelet alone
   * (status) is tried again with the newer version.
   */
  private async deleteGuarded(ns: string, fenced: k8s.V1Pod): Promise<boolean> {
    let pod = fenced;
    for (let attempt = 0; attempt < DELETE_ATTEMPTS; attempt++) {
      try {
        await this.o.core.deleteNamespacedPod({
          name: pod.metadata!.name!,
          namespace: ns,
          // Options in the body: the API server ignores query options when a DELETE has a body.
          body: { propagationPolicy: 'Background', preconditions: { uid: pod.metadata!.uid!, resourceVersion: pod.metadata!.resourceVersion! } },
        });
        return true;
      } catch (err) {
        const e = plainError(err, 'delete box pod');
        if (e.type === 'not_found') return true;
        if (e.type !== 'conflict') throw e;
      }
      const fresh = await this.readPod(ns, pod.metadata!.name!);
      if (!fresh || fresh.metadata?.uid !== fenced.metadata?.uid || fresh.metadata?.deletionTimestamp) return true;
      if (lastActive(fresh) > lastActive(fenced)) return false;
      pod = fresh;
    }
    return false;
  }

  // ---- a lease whose holder stopped (transition 11) ----

  private async resume(pool: SandboxPool, record: k8s.V1Secret, state: 'pending' | 'waking'): Promise<ReconcileResult> {
    const ns = pool.spec.namespace;
    const boxId = record.metadata!.name!;
    const key = `${ns}/${boxId}`;
    const held = await this.leasesOf(ns).take(record, state);
    if (!held) return { requeueAfterMs: 1000 };
    const log = this.o.log.child({ box: boxId, namespace: ns, epoch: held.lease.epoch, state });
    let outcome = 'error';
    try {
      let pod = await this.livePod(key, ns, boxId);
      // A sleeper that stopped with the pod still there: writing the pod makes a late delete of
      // the sleeper's fail (its resourceVersion moved on).
      if (state === 'pending' && pod && (await this.touch(pod))?.metadata?.deletionTimestamp) pod = undefined;
      const podState = !pod ? 'none' : pod.metadata?.annotations?.[ANNOTATIONS.restoring] ? 'restoring' : 'serving';
      const named = held.record.metadata?.annotations?.[ANNOTATIONS.sleepSnapshot];
      const stored = state === 'pending' && !pod && named !== undefined && sleptBoxOf(held.record) !== undefined && (await this.snapshotStored(pool, named));
      outcome = resumeOutcome(state, podState, stored);
      // A waker that stopped before its commit left a half-restored pod: it goes; the next call wakes the box anew.
      if (state === 'waking' && outcome === 'asleep' && pod) await this.deletePod(ns, pod);
      if (outcome === 'running' && state === 'pending') {
        // The fence (any epoch up to ours) comes down; a snapshot it took is no one's.
        await this.unfence(this.target(pod!), held.lease.epoch);
        if (named) await this.discard(pool, named);
        await this.leasesOf(ns).release(held, null, CLEAR_SLEEP);
      } else if (outcome === 'running') {
        // A wake that committed its pod and stopped before releasing the record.
        await this.leasesOf(ns).release(held, null, CLEAR_SLEEP);
      } else if (outcome === 'asleep') {
        await this.leasesOf(ns).release(held, 'asleep');
      } else {
        await this.fail(pool, held, 'its pod was lost while it was being put to sleep, before its snapshot was stored');
      }
      log.info({ outcome }, 'resumed a box whose lease had expired');
      return {};
    } finally {
      this.o.metrics.leasesResumed.inc({ state, outcome });
    }
  }

  /** Failed: the record says why; its seat goes back to the pool at once; an Event says so. */
  private async fail(pool: SandboxPool, held: Held, reason: string): Promise<void> {
    const ns = pool.spec.namespace;
    // A Failed box is reaped at its expiry like a sleeping one; one that never got that far
    // (its sleep had not named a snapshot) is kept an hour for its status to be seen.
    const expires = held.record.metadata?.annotations?.[ANNOTATIONS.expiresAt] ?? new Date(this.now() + FAILED_KEPT_MS).toISOString();
    const released = await this.leasesOf(ns).release(held, 'failed', { annotations: { [ANNOTATIONS.failure]: reason, [ANNOTATIONS.expiresAt]: expires } });
    if (!released) return;
    const seat = sleptBoxOf(released)?.seat;
    if (seat !== undefined) await this.freeSeat(ns, seat, released.metadata!.uid!);
    this.o.metrics.boxesFailed.inc({ reason: 'lost_during_sleep' });
    await this.o.events.recordOnce(objectRef(released, 'Secret'), 'failed', { type: 'Warning', reason: 'BoxFailed', message: `Box failed: ${reason}` });
  }

  // ---- helpers ----

  private pod(key: string, ns: string, boxId: string): k8s.V1Pod | undefined {
    const pod = this.o.pods.get(this.podOfBox.get(key) ?? boxId, ns);
    return pod && (pod.metadata?.labels?.[LABELS.boxId] ?? pod.metadata?.name) === boxId && !pod.metadata?.labels?.[LABELS.warm] ? pod : undefined;
  }

  /** The box's pod now, from the API server (the cache may lag), unless gone or going. */
  /**
   * The box's pod as the API server has it now, not being deleted: found by its box-id label (a
   * claimed warm pod has another name, which a lagging watch may not show yet).
   */
  private async livePod(key: string, ns: string, boxId: string): Promise<k8s.V1Pod | undefined> {
    const name = this.pod(key, ns, boxId)?.metadata?.name ?? boxId;
    const listed = await this.o.core.listNamespacedPod({ namespace: ns, labelSelector: `${LABELS.boxId}=${boxId}` });
    const live = listed.items.filter((p) => !p.metadata?.deletionTimestamp);
    if (live.length) return live.find((p) => p.metadata?.name === name) ?? live[0];
    // Older pods named after the box without the label.
    const pod = await this.readPod(ns, boxId);
    if (!pod || pod.metadata?.deletionTimestamp || (pod.metadata?.labels?.[LABELS.boxId] ?? pod.metadata?.name) !== boxId) return undefined;
    return pod;
  }

  private target(pod: k8s.V1Pod): BoxdTarget {
    const name = pod.metadata!.name!;
    const ns = pod.metadata!.namespace!;
    return { box: name, ip: pod.status?.podIP ?? '', token: boxdToken(this.o.key, ns, name, pod.metadata?.annotations?.[BOXD_NONCE_ANNOTATION] ?? '') };
  }

  private async readPod(ns: string, name: string): Promise<k8s.V1Pod | undefined> {
    try {
      return await this.o.core.readNamespacedPod({ name, namespace: ns });
    } catch (err) {
      const e = plainError(err, 'read box pod');
      if (e.type === 'not_found') return undefined;
      throw e;
    }
  }

  /** Moves the box's activity on; answers the pod as written (undefined when it is gone). */
  private async touch(pod: k8s.V1Pod): Promise<k8s.V1Pod | undefined> {
    try {
      return await this.o.core.patchNamespacedPod(
        {
          name: pod.metadata!.name!,
          namespace: pod.metadata!.namespace!,
          body: { metadata: { annotations: { [ANNOTATIONS.lastActive]: new Date(this.now()).toISOString() } } },
        },
        k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
      );
    } catch (err) {
      const e = plainError(err, 'record box activity');
      if (e.type === 'not_found') return undefined;
      throw e;
    }
  }

  private async deletePod(ns: string, pod: k8s.V1Pod): Promise<void> {
    await this.o.core
      .deleteNamespacedPod({ name: pod.metadata!.name!, namespace: ns, body: { propagationPolicy: 'Background', preconditions: { uid: pod.metadata!.uid! } } })
      .catch((err: unknown) => {
        const e = plainError(err, 'delete box pod');
        if (e.type !== 'not_found' && e.type !== 'conflict') throw e;
      });
  }

  private async unfence(target: BoxdTarget, epoch: number): Promise<void> {
    await this.o.boxd.unfence(target, epoch, AbortSignal.timeout(5000)).catch((err: unknown) => {
      // A box that does not answer keeps its fence until a call meets it (the bridge lifts it then).
      this.o.log.debug({ err: err instanceof Error ? err.message : String(err), box: target.box }, 'could not lift the fence');
    });
  }

  private async snapshotStored(pool: SandboxPool, snapshotId: string): Promise<boolean> {
    const id = parseSnapshotId(snapshotId);
    if (!id) return false;
    return (await this.o.store.getJson(this.o.store.key(snapshotKey(pool.metadata.name, id, METADATA_OBJECT)))) !== undefined;
  }

  private async discard(pool: SandboxPool, snapshotId: string): Promise<void> {
    const id = parseSnapshotId(snapshotId);
    if (!id) return;
    const { store } = this.o;
    await store
      .delete([store.key(snapshotKey(pool.metadata.name, id, METADATA_OBJECT)), store.key(snapshotKey(pool.metadata.name, id, WORKSPACE_OBJECT))])
      .catch(() => undefined); // retention removes it otherwise (no record names it)
  }

  /** Makes a warm seat the record's (guarded by the version read); throws when it is gone or another's. */
  private async adoptSeat(ns: string, n: number, podName: string, record: { name: string; uid: string }): Promise<void> {
    for (let attempt = 0; attempt < 3; attempt++) {
      const seat = await this.o.core.readNamespacedSecret({ name: seatName(n), namespace: ns }).catch((err: unknown) => {
        throw plainError(err, 'read box seat');
      });
      if (ownedBy(seat, record.uid)) return;
      if (!isWarmSeatOf(seat, podName)) break;
      try {
        // The credential stays: the pod still runs until the delete below, and may run on.
        await this.o.core.patchNamespacedSecret(
          { name: seatName(n), namespace: ns, body: adoptionPatch(seat, record, false) },
          k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
        );
        return;
      } catch (err) {
        const e = plainError(err, 'adopt box seat');
        if (e.type !== 'conflict') throw e;
      }
    }
    throw new Error(`the box's seat ${seatName(n)} is not its own`);
  }

  private async freeSeat(ns: string, seat: number, recordUid: string): Promise<void> {
    try {
      const s = await this.o.core.readNamespacedSecret({ name: seatName(seat), namespace: ns });
      if (!s.metadata?.ownerReferences?.some((o) => o.uid === recordUid)) return;
      await this.o.core.deleteNamespacedSecret({ name: seatName(seat), namespace: ns, body: { preconditions: { uid: s.metadata.uid! } } });
    } catch (err) {
      const e = plainError(err, 'free box seat');
      if (e.type !== 'not_found' && e.type !== 'conflict') throw e;
    }
  }

  /** Counts a failure of the box's sleep; answers how long until it is tried again. */
  private failed(key: string): number {
    const failures = (this.backoff.get(key)?.failures ?? 0) + 1;
    const wait = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** (failures - 1));
    this.backoff.set(key, { failures, at: this.now() + wait });
    return wait;
  }

  private recordsOf(ns: string): BoxRecords {
    let r = this.records.get(ns);
    if (!r) this.records.set(ns, (r = new BoxRecords(this.o.core, plainCall, ns)));
    return r;
  }

  private leasesOf(ns: string): BoxLeases {
    let l = this.leases.get(ns);
    if (!l) this.leases.set(ns, (l = new BoxLeases({ records: this.recordsOf(ns), identity: this.o.identity, durationMs: this.o.leaseMs, now: this.now })));
    return l;
  }
}

export type IdleStep =
  | { action: 'forget' }
  | { action: 'wait'; ms?: number }
  | { action: 'resume'; state: 'pending' | 'waking' }
  | { action: 'sleep' };

/**
 * What the reconcile of one box does now (docs/lifecycle.md, transitions 2 and 11), from what the
 * caches show: nothing (`wait`, and when to look again), put it to sleep, or resume a lease whose
 * holder stopped. Pure.
 */
export function planIdle(i: { pool: SandboxPool | undefined; record: k8s.V1Secret | undefined; pod: k8s.V1Pod | undefined; now: number; retryAt?: number | undefined }): IdleStep {
  const { pool, record, pod, now } = i;
  if (!pool || !record || record.metadata?.deletionTimestamp || record.metadata?.labels?.[LABELS.component] !== SECRET_COMPONENTS.record) return { action: 'forget' };
  const state = stateOf(record);
  if (state === 'pending' || state === 'waking') {
    // Someone is at work on it; once its lease runs out, it is resumed here.
    const expiry = leaseExpiry(record) ?? 0;
    return expiry > now ? { action: 'wait', ms: expiry - now + 250 } : { action: 'resume', state };
  }
  if (state) return { action: 'wait' }; // asleep (waking is the bridge's) or failed
  const after = pool.spec.idle.sleepAfterSeconds * 1000;
  if (after <= 0) return { action: 'wait' };
  // A pod still starting, or going: its events bring the box back here.
  if (!pod || pod.metadata?.deletionTimestamp || pod.status?.phase !== 'Running' || !pod.status.podIP) return { action: 'wait' };
  const expiresAt = Date.parse(pod.metadata?.annotations?.[ANNOTATIONS.expiresAt] ?? '');
  // A box expiring within the idle time is left to the reaper.
  if (Number.isFinite(expiresAt) && expiresAt - now <= after) return { action: 'wait' };
  const idle = now - lastActive(pod);
  if (idle < after) return { action: 'wait', ms: after - idle + 100 };
  if (i.retryAt !== undefined && i.retryAt > now) return { action: 'wait', ms: i.retryAt - now };
  return { action: 'sleep' };
}

/**
 * Where a box whose lease holder stopped ends up (transition 11). A sleep: its pod still there ->
 * Running (the sleep undone); gone with its snapshot named and stored -> Sleeping; gone without
 * -> Failed. A wake: its pod committed (no longer marked restoring) -> Running (only the record's
 * release was missing); otherwise -> Sleeping again (a half-made pod is deleted). Pure.
 */
export function resumeOutcome(state: 'pending' | 'waking', pod: 'none' | 'restoring' | 'serving', snapshotStored: boolean): 'running' | 'asleep' | 'failed' {
  if (state === 'waking') return pod === 'serving' ? 'running' : 'asleep';
  if (pod !== 'none') return 'running';
  return snapshotStored ? 'asleep' : 'failed';
}

/** What a sleep leaves on the record that a box back to Running must not keep. */
const CLEAR_SLEEP = { annotations: { [ANNOTATIONS.sleepSnapshot]: null, [ANNOTATIONS.sleepBox]: null, [ANNOTATIONS.expiresAt]: null } };

/** When the box's last call was (its pod's annotation; a pod without one: its creation). */
export function lastActive(pod: k8s.V1Pod): number {
  const stamped = Date.parse(pod.metadata?.annotations?.[ANNOTATIONS.lastActive] ?? '');
  if (Number.isFinite(stamped)) return stamped;
  const created = pod.metadata?.creationTimestamp;
  return created ? new Date(created).getTime() : 0;
}

function objectRef(obj: k8s.V1Pod | k8s.V1Secret, kind: 'Pod' | 'Secret') {
  const { name, namespace, uid } = obj.metadata!;
  return { apiVersion: 'v1', kind, name: name!, namespace: namespace!, uid: uid! };
}

function plainError(err: unknown, what: string): BridgeError {
  return err instanceof BridgeError ? err : toBridgeError(err, what);
}
