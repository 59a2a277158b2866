// From a box id to a boxd that answers (docs/lifecycle.md): the one module of the bridge that
// knows a box may sleep. A box with a pod is served on it (a new one waited for: its pod IP from
// the watch, then boxd's health); a sleeping box is woken first when the call may wake it; a call
// that meets a sleep's fence aborts the sleep or waits for it, then is served. Calls run with a
// signal that fires when the box's pod is deleted meanwhile, so nothing hangs on a box that is gone.
import { AsyncLocalStorage } from 'node:async_hooks';
import { randomBytes } from 'node:crypto';
import { isIP } from 'node:net';
import { hostname } from 'node:os';
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { LeaseKeeper, LeaseLostError, leaseExpired, stateOf, type BoxLeases, type BoxState, type Held } from '../../common/box-lease.js';
import { shapeOfSlept, sleptBoxOf, type SessionBox } from '../../common/box-pod.js';
import { envOf, type BoxRecords } from '../../common/box-records.js';
import { BOXD_NONCE_ANNOTATION, BOXD_VERSION_ANNOTATION, boxdToken, newNonce } from '../../common/boxd.js';
import { BoxdFencedError, BoxdUnreachableError, type BoxdClient, type BoxdTarget } from '../../common/boxd-client.js';
import { BridgeError } from '../../common/errors.js';
import { buildEvent } from '../../common/events.js';
import type { KubeCall } from '../../common/kube.js';
import { ANNOTATIONS, LABELS, seatName } from '../../common/labels.js';
import { seatOf } from '../../common/seats.js';
import { boxIdOf } from '../box-view.js';
import { BoxGoneError, BoxStartTimeoutError, trimPod, type BoxReader } from '../kube/box-cache.js';
import type { PolicySource } from '../kube/policy.js';
import type { BoxService, CreatePath } from './boxes.js';
import type { SnapshotStore } from './snapshot-store.js';

/**
 * Whether calls made in this async context may wake a sleeping box: set per request from the
 * caller's scopes (only boxes:write wakes, docs/tokens.md). Outside a request (the bridge's own
 * work): yes.
 */
export const wakePermission = new AsyncLocalStorage<boolean>();

export interface BoxConnectorDeps {
  boxes: Pick<BoxService, 'locate' | 'answering' | 'revive' | 'egressProxy'>;
  cache: BoxReader;
  records: BoxRecords;
  leases: BoxLeases;
  boxd: BoxdClient;
  snapshots: Pick<SnapshotStore, 'metadata' | 'restoreInto' | 'available'>;
  policy: PolicySource;
  core: k8s.CoreV1Api;
  call: KubeCall;
  /** The key box credentials are derived from (common/boxd.ts). */
  key: Buffer;
  namespace: string;
  /** How long a call waits for a new box to start. */
  startTimeoutMs: number;
  /**
   * A pod annotation the CNI plugin writes the pod's address into as soon as it has one (Calico:
   * cni.projectcalico.org/podIP), used while the kubelet has not reported status.podIP yet;
   * undefined: status.podIP only. See podAddress.
   */
  podIpAnnotation?: string;
  log: Logger;
  onWoken?: (path: CreatePath | 'none', outcome: 'ok' | 'error' | 'failed', seconds: number) => void;
  onFenced?: (outcome: 'aborted' | 'slept' | 'taken_over') => void;
  /**
   * Refills what a box keeps outside /workspace (session outputs, services/session-outputs.ts)
   * into a woken pod, after its workspace and before the wake commits it; a failure fails the wake.
   */
  restoreMounts?: (call: BoxCall, record: k8s.V1Secret) => Promise<void>;
  now?: () => number;
}

export interface BoxCall {
  pod: k8s.V1Pod;
  target: BoxdTarget;
  /** Aborted when the box is deleted (or the caller's signal fires). */
  signal: AbortSignal;
}

export interface CallOptions {
  /**
   * The call only observes the box (a file watch, its metrics): it is not the box's activity
   * (idle sleep may take the box while it runs) and never wakes a sleeping box (409).
   */
  observe?: boolean;
}

/** A box that was answering and stops is given this long to come back before the call fails. */
const LOST_BOX_WAIT_MS = 10_000;
/** Between health probes of a box whose pod has an IP but whose boxd does not listen yet. */
const PROBE_INTERVAL_MS = 25;

/**
 * How long probe n (from 0) of a pod not yet seen answering may take: short at first, growing to
 * 2 s. A new pod's address can be known before its network is ready for it (Calico's annotation
 * comes before felix has programmed the pod's policy rules): a SYN dropped then is resent by the
 * kernel only after a second, while a new connection a moment later gets through as soon as the
 * rules are in. Growing, so a boxd slow to answer (a starting quarter-core box) is still waited for.
 */
/**
 * What a wake does with a pod of the box it finds (read fresh): one being deleted (the pod the box
 * slept from) is left alone ('none'); one still marked restoring (a stopped waker's,
 * half-restored) goes ('delete'); any other was committed by a waker that stopped before clearing
 * the record: the box is awake ('awake'). (Pods made for a wake carry the restoring mark until
 * committed, and a record is marked asleep only once its pod's delete went through.)
 */
export function leftoverStep(pod: k8s.V1Pod): 'none' | 'awake' | 'delete' {
  if (pod.metadata?.deletionTimestamp) return 'none';
  return pod.metadata?.annotations?.[ANNOTATIONS.restoring] ? 'delete' : 'awake';
}

export function probeTimeoutMs(n: number): number {
  return Math.min(150 * 2 ** n, 2000);
}
/** Boxes known to answer, and credentials derived, by pod name; bounded so memory does not grow with churn. */
const CACHE_SIZE = 50_000;
/** A call waits this long for a box to wake, or for a sleep it met to finish or give up. */
const WAKE_WAIT_MS = 5 * 60 * 1000;
/** How often a call waiting on another replica's wake, or a sleep, looks again. */
const POLL_MS = 150;
/** How long a new pod's IP is awaited on the watch alone; then the API server is asked too, this often. */
const WATCH_GRACE_MS = 2000;
const POLL_API_MS = 500;
/** Rounds of "locate, call" one call may take (a sleep met, a wake, a sleep met again...). */
const MAX_ROUNDS = 4;

export class BoxConnector {
  /** This replica, as written into the leases it takes. */
  static readonly identity = `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
  private readonly now: () => number;
  /** pod name -> the pod seen answering (with its IP, whatever a lagging watch shows). */
  private readonly ready = new Map<string, k8s.V1Pod>();
  /** pod name -> the credential of the pod with that nonce (an HMAC per call costs ~3% of an exec). */
  private readonly tokens = new Map<string, { nonce: string; token: string }>();
  /** pod uid -> when this replica last wrote the box's activity. */
  private readonly touched = new Map<string, number>();
  /** box id -> the wake (or wait for one) this replica's calls share. */
  private readonly wakes = new Map<string, Promise<void>>();

  constructor(private readonly deps: BoxConnectorDeps) {
    this.now = deps.now ?? Date.now;
  }

  /**
   * Runs fn against the box's boxd. A connection boxd never accepted is retried once the box
   * answers again, and a call boxd refused under a sleep's fence once the sleep is resolved:
   * nothing reached the box, so nothing runs twice.
   */
  async call<T>(boxId: string, fn: (call: BoxCall) => Promise<T>, signal?: AbortSignal, opts: CallOptions = {}): Promise<T> {
    const mayWake = !opts.observe && (wakePermission.getStore() ?? true);
    const wake = async (record: k8s.V1Secret | undefined) => {
      const step = podlessStep(stateOf(record), mayWake);
      if (step === 'failed') throw failed(boxId, record);
      if (step === 'refuse' && opts.observe) throw new BridgeError('conflict', `box ${boxId} is sleeping; watching it or reading its metrics never wakes it (a call with a boxes:write token does)`);
      if (step === 'refuse') throw new BridgeError('conflict', `box ${boxId} is sleeping; a call with a boxes:write token wakes it (reads never do)`);
      if (step === 'wait') await this.waitWhilePending(boxId, signal); // a sleep about to finish
      else await this.awaken(boxId, signal);
    };
    /** The pod a round found gone: the next round waits for it to come back for a while first. */
    let lost: string | undefined;
    for (let round = 0; ; round++) {
      const where = await this.deps.boxes.locate(boxId);
      if (!where.pod) {
        if (round >= MAX_ROUNDS) throw new BridgeError('cluster_unavailable', `box ${boxId} keeps changing state; retry`, { headers: { 'Retry-After': '1' } });
        await wake(where.record);
        continue;
      }
      const pod = where.pod;
      checkUsable(pod);
      if (!opts.observe) await this.touch(pod);
      try {
        return await this.run(pod, fn, signal, lost === pod.metadata!.uid);
      } catch (err) {
        if (round >= MAX_ROUNDS || signal?.aborted) throw err;
        if (err instanceof BoxdFencedError) {
          await this.meetFence(boxId, pod, signal);
          continue;
        }
        if (!(err instanceof BoxdGone) && !(err instanceof PodGone)) throw err;
        // Its boxd is gone, or its pod went while the call ran. A sleep may have taken the pod
        // (this replica's watch lags, or the call's activity write lost the race with the
        // sleep's delete): the record says (one API read); otherwise the pod is given a while to
        // come back, or, deleted, is the 404 it was.
        const record = await this.deps.records.read(boxId);
        const next = err instanceof PodGone ? deletedStep(stateOf(record), record !== undefined, lost === pod.metadata!.uid) : goneStep(stateOf(record), lost === pod.metadata!.uid);
        if (next === 'fail') throw err instanceof BoxdGone ? err.answer : err;
        if (next === 'wake') await wake(record);
        else if (next === 'wait') await this.waitWhilePending(boxId, signal);
        lost = pod.metadata!.uid;
      }
    }
  }

  // ---- a box with a pod ----

  /**
   * fn against the pod's boxd. A connection boxd never accepted is BoxdGone at once the first
   * time (the caller finds out why); when the pod was already found gone (`lost`), boxd is
   * given LOST_BOX_WAIT_MS to answer again before the call fails.
   */
  private async run<T>(pod: k8s.V1Pod, fn: (call: BoxCall) => Promise<T>, signal: AbortSignal | undefined, lost = false): Promise<T> {
    const name = pod.metadata!.name!;
    const aborter = new AbortController();
    const stop = this.deps.cache.onGone(
      name,
      () => aborter.abort(new PodGone(`box ${boxIdOf(pod) ?? name} was deleted while the request was running`)),
      pod.metadata!.uid,
    );
    const onCallerAbort = () => aborter.abort(signal?.reason);
    signal?.addEventListener('abort', onCallerAbort, { once: true });
    try {
      const live = await this.connect(pod, aborter.signal, lost);
      try {
        return await fn({ pod: live, target: this.target(live), signal: aborter.signal });
      } catch (err) {
        if (aborter.signal.aborted) throw aborter.signal.reason;
        if (!(err instanceof BoxdUnreachableError)) throw err;
        this.ready.delete(name);
        throw new BoxdGone(unreachable(err, name));
      }
    } finally {
      stop();
      signal?.removeEventListener('abort', onCallerAbort);
    }
  }

  target(pod: k8s.V1Pod): BoxdTarget {
    const name = pod.metadata!.name!;
    const nonce = pod.metadata!.annotations?.[BOXD_NONCE_ANNOTATION] ?? '';
    let cached = this.tokens.get(name);
    if (cached?.nonce !== nonce) {
      cached = { nonce, token: boxdToken(this.deps.key, this.deps.namespace, name, nonce) };
      remember(this.tokens, name, cached);
    }
    return { box: name, ip: podAddress(pod, this.deps.podIpAnnotation) ?? '', token: cached.token };
  }

  /** The live pod once its boxd answers; fast when this replica has seen it answer before. */
  private async connect(pod: k8s.V1Pod, signal: AbortSignal, lost: boolean): Promise<k8s.V1Pod> {
    const name = pod.metadata!.name!;
    const uid = pod.metadata!.uid!;
    const seen = this.deps.cache.pod(name);
    // The cache may still show the pod of that name from before (a box woken into a new pod).
    const cached = seen?.metadata?.uid === uid ? seen : pod;
    const answered = this.ready.get(name);
    if (!lost && answered?.metadata?.uid === uid) return seen?.metadata?.uid === uid && this.address(seen) ? seen : answered;
    if (!lost && cached.status?.podIP && this.deps.boxes.answering(cached)) return cached;

    const deadline = performance.now() + (lost ? LOST_BOX_WAIT_MS : this.deps.startTimeoutMs);
    for (let probe = 0; ; probe++) {
      signal.throwIfAborted();
      const remaining = deadline - performance.now();
      if (remaining <= 0) {
        const latest = this.deps.cache.pod(name);
        if (lost || (latest && this.address(latest))) {
          throw new BridgeError('cluster_unavailable', `box ${name} does not answer (its agent is not reachable)`, {
            headers: { 'Retry-After': '5' },
            cause: new BoxdUnreachableError(name, 'timeout'),
          });
        }
        throw startTimeout(new BoxStartTimeoutError(name, latest));
      }
      const live = await this.waitForIp(name, uid, remaining, signal);
      try {
        await this.deps.boxd.health(this.target(live), AbortSignal.any([signal, AbortSignal.timeout(Math.ceil(Math.min(remaining, probeTimeoutMs(probe))))]));
        remember(this.ready, name, live);
        return live;
      } catch (err) {
        if (signal.aborted) throw signal.reason;
        if (!(err instanceof BoxdUnreachableError) && !(err instanceof DOMException)) throw err;
        await delay(PROBE_INTERVAL_MS);
      }
    }
  }

  /**
   * The pod once it has an address (podAddress): from this replica's watch, and, when the watch has not shown it
   * within WATCH_GRACE_MS (a lagging watch), from the API server every POLL_API_MS as well.
   */
  private async waitForIp(name: string, uid: string, timeoutMs: number, signal: AbortSignal): Promise<k8s.V1Pod> {
    const deadline = performance.now() + timeoutMs;
    for (let first = true; ; first = false) {
      const remaining = deadline - performance.now();
      try {
        return await this.deps.cache.waitUntil(name, (p) => this.address(p) !== undefined, Math.max(1, Math.min(remaining, first ? WATCH_GRACE_MS : POLL_API_MS)), uid);
      } catch (err) {
        if (err instanceof BoxGoneError) {
          // Ended by itself is final; deleted (its box, or a sleep) is for the caller to find out.
          throw err.phase === 'Succeeded' || err.phase === 'Failed' ? new BridgeError('conflict', `${err.message}; create a new box`) : new PodGone(`box ${name} not found`);
        }
        if (!(err instanceof BoxStartTimeoutError)) throw err;
        if (deadline - performance.now() <= 0) throw startTimeout(err);
      }
      signal.throwIfAborted();
      const pod = await this.readPod(name);
      if (!pod || pod.metadata?.uid !== uid || pod.metadata?.deletionTimestamp) throw new PodGone(`box ${name} not found`);
      trimPod(pod); // kept as the pod seen answering: as small as the cache's
      if (pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed') throw new BridgeError('conflict', `box ${name} has ended (${pod.status.phase}); create a new box`);
      if (this.address(pod)) return pod;
    }
  }

  private address(pod: k8s.V1Pod): string | undefined {
    return podAddress(pod, this.deps.podIpAnnotation);
  }

  /** The box's pods as the API server has them now (its box-id label: a claimed warm pod has another name). */
  private async boxPods(boxId: string): Promise<k8s.V1Pod[]> {
    const list = await this.deps.call('list box pods', () => this.deps.core.listNamespacedPod({ namespace: this.deps.namespace, labelSelector: `${LABELS.boxId}=${boxId}` }));
    return list.items;
  }

  private async readPod(name: string): Promise<k8s.V1Pod | undefined> {
    try {
      return await this.deps.call('read box pod', () => this.deps.core.readNamespacedPod({ name, namespace: this.deps.namespace }));
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'not_found') return undefined;
      throw err;
    }
  }

  // ---- activity ----

  /** Milliseconds of idleness after which the operator puts a box to sleep; 0 when it never does. */
  private sleepAfterMs(): number {
    if (!this.deps.snapshots.available) return 0;
    return this.deps.policy.current().idle.sleepAfterSeconds * 1000;
  }

  /**
   * Records the call as the box's activity on its pod, at most once per tenth of the idle time per
   * box and replica (no API write per exec). A write that failed proves nothing; the call goes on.
   */
  private async touch(pod: k8s.V1Pod): Promise<void> {
    const after = this.sleepAfterMs();
    if (!after) return;
    const uid = pod.metadata!.uid!;
    const last = Math.max(this.touched.get(uid) ?? 0, lastActive(pod));
    if (this.now() - last < clamp(after / 10, 500, 60_000)) return;
    await this.writeActivity(pod).catch((err: unknown) => this.deps.log.debug({ err, box: pod.metadata?.name }, 'could not record box activity'));
  }

  /**
   * A keepalive (services/box-context.ts): writes the box's activity now, however recently this
   * replica wrote it. The pod as written; undefined when it is gone.
   */
  markActive(pod: k8s.V1Pod): Promise<k8s.V1Pod | undefined> {
    return this.writeActivity(pod);
  }

  /** Writes the pod's last-active now; answers the pod as the API server has it after the write (undefined: gone). */
  private async writeActivity(pod: k8s.V1Pod): Promise<k8s.V1Pod | undefined> {
    const now = this.now();
    try {
      const written = await this.deps.call('record box activity', () =>
        this.deps.core.patchNamespacedPod(
          { name: pod.metadata!.name!, namespace: this.deps.namespace, body: { metadata: { annotations: { [ANNOTATIONS.lastActive]: new Date(now).toISOString() } } } },
          k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
        ),
      );
      if (written.metadata?.uid !== pod.metadata?.uid) return undefined;
      remember(this.touched, pod.metadata!.uid!, now);
      return written;
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'not_found') return undefined;
      throw err;
    }
  }

  // ---- a call that met a sleep's fence (docs/lifecycle.md, "Why no acknowledged write is lost") ----

  /**
   * The call was refused by boxd's fence: nothing of it ran. Moving the box's activity on makes
   * the sleep's guarded delete fail if it has not happened yet; then the sleeper lifts the fence
   * (or, if it died, this replica does, once its lease ran out) and the call is sent again. If the
   * delete happened first, the call waits for the box to be Sleeping and the next round wakes it.
   */
  private async meetFence(boxId: string, pod: k8s.V1Pod, signal: AbortSignal | undefined): Promise<void> {
    const written = await this.writeActivity(pod);
    if (!written || written.metadata?.deletionTimestamp) {
      this.deps.onFenced?.('slept');
      return this.waitWhilePending(boxId, signal);
    }
    const deadline = this.now() + WAKE_WAIT_MS;
    const target = this.target(written);
    for (let wait = 50; this.now() < deadline; wait = Math.min(wait * 2, 1000)) {
      await delay(wait, signal);
      let fence: number;
      try {
        fence = (await this.deps.boxd.activity(target, AbortSignal.timeout(2000))).fence;
      } catch {
        return; // its boxd is gone: the sleep went ahead after all; the next round finds out
      }
      if (fence === 0) {
        this.deps.onFenced?.('aborted');
        return;
      }
      const record = await this.deps.records.read(boxId);
      if (stateOf(record) !== 'pending') continue; // resolved meanwhile; its boxd follows
      if (!leaseExpired(record, this.now())) continue;
      // The sleeper stopped with the fence up and the pod alive: take its lease and lift it.
      const held = await this.deps.leases.take(record!, 'pending');
      if (!held) continue;
      await this.deps.boxd.unfence(target, held.lease.epoch, AbortSignal.timeout(5000)).catch(() => undefined);
      await this.deps.leases.release(held, null, CLEAR_SLEEP);
      this.deps.onFenced?.('taken_over');
      return;
    }
    throw new BridgeError('cluster_unavailable', `box ${boxId} is being put to sleep and it did not finish in time; retry`, { headers: { 'Retry-After': '5' } });
  }

  /** Until the box's record leaves `pending` (its sleep finished, or was given up and resumed by the operator). */
  private async waitWhilePending(boxId: string, signal: AbortSignal | undefined): Promise<void> {
    const deadline = this.now() + WAKE_WAIT_MS;
    while (this.now() < deadline) {
      const record = await this.deps.records.read(boxId);
      if (stateOf(record) !== 'pending') return;
      await delay(POLL_MS * 2, signal);
    }
    throw new BridgeError('cluster_unavailable', `box ${boxId} is being put to sleep and it did not finish in time; retry`, { headers: { 'Retry-After': '5' } });
  }

  // ---- Sleeping -> Waking -> Running ----

  /** Until the box is awake: wakes it, or waits for the replica that does. Calls on this replica share one wake. */
  private async awaken(boxId: string, signal: AbortSignal | undefined): Promise<void> {
    let wake = this.wakes.get(boxId);
    if (!wake) {
      wake = this.wakeOrWait(boxId).finally(() => this.wakes.delete(boxId));
      this.wakes.set(boxId, wake);
    }
    if (!signal) return wake;
    signal.throwIfAborted();
    await new Promise<void>((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      signal.addEventListener('abort', onAbort, { once: true });
      wake.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
    });
  }

  private async wakeOrWait(boxId: string): Promise<void> {
    const deadline = this.now() + WAKE_WAIT_MS;
    while (this.now() < deadline) {
      const record = await this.deps.records.read(boxId);
      const state = stateOf(record);
      if (!record || record.metadata?.deletionTimestamp || !state || state === 'pending') return; // awake, gone (404 next), or still running
      if (state === 'failed') throw failed(boxId, record);
      if (state === 'asleep' || leaseExpired(record, this.now())) {
        // Asleep, or its waker stopped: this replica wakes it. A cold pod mounts the record, so the
        // new nonce's credentials go in with the lease.
        const nonce = newNonce();
        const held = await this.deps.leases.take(record, 'waking', {
          token: boxdToken(this.deps.key, this.deps.namespace, boxId, nonce),
          // Bound to the old pod's nonce, a credential left from before is of no use: replaced or removed.
          egressProxy: this.deps.boxes.egressProxy(boxId, nonce) ?? null,
        });
        if (held) return this.wake(boxId, held, nonce);
        continue; // another replica moved first: look again
      }
      await delay(POLL_MS);
    }
    throw new BridgeError('cluster_unavailable', `box ${boxId} is waking up and did not finish in time; retry`, { headers: { 'Retry-After': '5' } });
  }

  private async wake(boxId: string, held: Held, nonce: string): Promise<void> {
    const started = performance.now();
    const keeper = new LeaseKeeper(this.deps.leases, held, this.now);
    let path: CreatePath | 'none' = 'none';
    let made: k8s.V1Pod | undefined;
    const record = held.record;
    const slept = sleptBoxOf(record);
    const snapshotId = record.metadata?.annotations?.[ANNOTATIONS.sleepSnapshot];
    try {
      if (!slept || !snapshotId) throw new SnapshotLost(`box ${boxId} is marked asleep without its snapshot`);
      // The snapshot first: a box whose snapshot is gone is Failed before any pod is made for it.
      const metadata = await this.deps.snapshots.metadata(snapshotId).catch((err: unknown) => {
        throw err instanceof BridgeError && err.type === 'not_found' ? new SnapshotLost(`its snapshot ${snapshotId} is gone from the store`) : err;
      });
      // The pods a waker that stopped left, read fresh (a lagging watch may show none, or the pod
      // the box slept from). One committed: the box is awake and its pod may hold writes
      // acknowledged since, so the record is only cleared, as the operator's resume does. One
      // still restoring may hold a half-restored workspace: it goes.
      const leftovers = await this.boxPods(boxId);
      const awake = leftovers.find((p) => leftoverStep(p) === 'awake');
      if (awake) {
        await this.deps.leases.release(await keeper.stop(), null, CLEAR_SLEEP);
        if (slept.seat !== undefined && seatOf(awake) !== slept.seat) await this.freeSeat(slept.seat, record.metadata!.uid!).catch(() => undefined);
        this.deps.onWoken?.('none', 'ok', (performance.now() - started) / 1000);
        this.deps.log.info({ box: boxId, pod: awake.metadata?.name }, 'box found awake in the pod a stopped waker committed; its record cleared');
        return;
      }
      for (const p of leftovers) if (leftoverStep(p) === 'delete') await this.deletePod(p);
      const session: SessionBox = {
        boxId,
        sessionId: record.metadata?.annotations?.[ANNOTATIONS.sessionId] ?? '',
        slot: Number(record.metadata?.labels?.[LABELS.slot] ?? 0),
        seat: slept.seat ?? -1,
        record: { name: record.metadata!.name!, uid: record.metadata!.uid! },
        ttlSeconds: slept.ttlSeconds,
        now: new Date(this.now()),
        createdAt: new Date(slept.createdAt),
        ...(slept.expiresAt ? { expiresAt: new Date(slept.expiresAt) } : {}),
        idempotencyKey: record.metadata?.labels?.[LABELS.idempotencyKey],
        // Other replicas see the new pod at once: marked, it is not served until committed below.
        restoring: true,
      };
      const revived = await this.deps.boxes.revive(session, shapeOfSlept(slept), envOf(record), nonce);
      made = revived.pod;
      path = revived.path;
      await this.run(
        made,
        async (call) => {
          const held = { ...call, signal: AbortSignal.any([call.signal, keeper.signal]) };
          await this.deps.snapshots.restoreInto(held, metadata);
          await this.deps.restoreMounts?.(held, record);
        },
        keeper.signal,
      );
      // The commit: the pod is served from now on, through every replica. Only while this wake
      // still holds the lease (a renewal), so a waker taken over never commits its pod.
      if (!(await keeper.update({}))) throw new BridgeError('cluster_unavailable', `box ${boxId} was taken over while it woke; retry`, { headers: { 'Retry-After': '1' } });
      await this.commitPod(made);
      // Awake: a plain record again (its snapshot stays in the store until retention). A crash
      // before this leaves a committed pod and a waking record: the operator then releases it.
      await this.deps.leases.release(await keeper.stop(), null, CLEAR_SLEEP);
      // A claimed warm pod holds a seat of its own (common/seats.ts): the one the box kept while
      // it slept goes back (a crash before this leaves it to the record, freed with the box).
      if (slept.seat !== undefined && seatOf(made) !== slept.seat) await this.freeSeat(slept.seat, record.metadata!.uid!).catch(() => undefined);
      this.deps.onWoken?.(path, 'ok', (performance.now() - started) / 1000);
      this.deps.log.info({ box: boxId, path, snapshot: snapshotId, ms: Math.round(performance.now() - started) }, 'box woken');
    } catch (err) {
      const lost = err instanceof SnapshotLost;
      this.deps.onWoken?.(path, lost ? 'failed' : 'error', (performance.now() - started) / 1000);
      // Only the pod this wake made goes (by UID): never another waker's.
      if (made) await this.deletePod(made).catch(() => undefined);
      const current = await keeper.stop();
      if (lost) {
        await this.fail(current, err instanceof Error ? err.message : String(err));
        throw failed(boxId, undefined, err instanceof Error ? err.message : String(err));
      }
      this.deps.log.warn({ err, box: boxId }, 'could not wake box; it stays asleep');
      await this.deps.leases.release(current, 'asleep').catch(() => undefined);
      // Its lease lost, or its pod deleted by whoever took the lease over: the box is still
      // there (asleep, or woken by another), so a retry is the answer, not a 500 or a 404.
      if (err instanceof LeaseLostError || err instanceof PodGone) {
        throw new BridgeError('cluster_unavailable', `box ${boxId} was taken over while it woke; retry`, { headers: { 'Retry-After': '1' }, cause: err });
      }
      throw err;
    }
  }

  /** Failed (transition 10): the record says why, its seat goes back to the pool, an Event says so. */
  private async fail(held: Held, reason: string): Promise<void> {
    const released = await this.deps.leases.release(held, 'failed', { annotations: { [ANNOTATIONS.failure]: reason } }).catch(() => undefined);
    if (!released) return;
    this.deps.log.error({ box: released.metadata?.name, reason }, 'box failed: its workspace is lost');
    const seat = sleptBoxOf(released)?.seat;
    if (seat !== undefined) await this.freeSeat(seat, released.metadata!.uid!).catch(() => undefined);
    const { name, namespace, uid } = released.metadata!;
    await this.deps
      .call('record box event', () =>
        this.deps.core.createNamespacedEvent({
          namespace: this.deps.namespace,
          body: buildEvent({
            involved: { apiVersion: 'v1', kind: 'Secret', name: name!, namespace: namespace ?? this.deps.namespace, uid: uid! },
            type: 'Warning',
            reason: 'BoxFailed',
            message: `Box failed: ${reason}`,
            component: 'sandbox-bridge',
            instance: BoxConnector.identity,
            now: new Date(this.now()),
          }),
        }),
      )
      .catch(() => undefined);
  }

  private async freeSeat(seat: number, recordUid: string): Promise<void> {
    const name = seatName(seat);
    const s = await this.deps.call('read box seat', () => this.deps.core.readNamespacedSecret({ name, namespace: this.deps.namespace }));
    if (!s.metadata?.ownerReferences?.some((o) => o.uid === recordUid)) return;
    await this.deps.call('free box seat', () =>
      this.deps.core.deleteNamespacedSecret({ name, namespace: this.deps.namespace, body: { preconditions: { uid: s.metadata!.uid! } } }),
    );
  }

  /**
   * Removes the restoring mark of the pod this wake made (that pod only: its UID guards the
   * patch). The same write counts the box active from now: its pod was stamped when the wake
   * began, and a restore longer than the idle time would have the box put straight back to sleep.
   */
  private async commitPod(pod: k8s.V1Pod): Promise<void> {
    const now = this.now();
    const annotations = { [ANNOTATIONS.restoring]: null, [ANNOTATIONS.lastActive]: new Date(now).toISOString() };
    await this.deps.call('commit woken box pod', () =>
      this.deps.core.patchNamespacedPod(
        { name: pod.metadata!.name!, namespace: this.deps.namespace, body: { metadata: { uid: pod.metadata!.uid, annotations } } },
        k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
      ),
    );
    remember(this.touched, pod.metadata!.uid!, now);
  }

  private async deletePod(pod: k8s.V1Pod): Promise<void> {
    await this.deps
      .call('delete box pod', () =>
        this.deps.core.deleteNamespacedPod({
          name: pod.metadata!.name!,
          namespace: this.deps.namespace,
          // Options in the body: the API server ignores query options when a DELETE has a body.
          body: { propagationPolicy: 'Background', preconditions: { uid: pod.metadata!.uid! } },
        }),
      )
      .catch((err: unknown) => {
        if (!(err instanceof BridgeError && (err.type === 'not_found' || err.type === 'conflict'))) throw err;
      });
  }
}

/**
 * A call to a box without a pod (docs/lifecycle.md): Failed is final; only a call that may wake
 * a box wakes it (or waits for a sleep about to finish); any other is refused. Pure.
 */
export function podlessStep(state: BoxState | undefined, mayWake: boolean): 'failed' | 'refuse' | 'wait' | 'wake' {
  if (state === 'failed') return 'failed';
  if (!mayWake) return 'refuse';
  return state === 'pending' ? 'wait' : 'wake';
}

/**
 * A call whose pod's boxd stopped accepting connections, by what the box's record says: a sleep
 * took the pod (this replica's watch lags) -> wake it or wait for the sleep; a plain running box
 * -> give its boxd a while to come back once, then fail. Pure.
 */
export function goneStep(state: BoxState | undefined, lostBefore: boolean): 'wake' | 'wait' | 'retry' | 'fail' {
  if (state === 'asleep' || state === 'waking' || state === 'failed') return 'wake';
  if (state === 'pending') return 'wait';
  return lostBefore ? 'fail' : 'retry';
}

/**
 * A call whose pod was deleted while it ran, by what the box's record says: a sleep took it
 * (pending, asleep, waking, failed) -> as for a boxd gone (wake the box, or wait for the sleep;
 * nothing of the call ran under the sleep's fence, so it runs again there); no record (the box
 * was deleted) or a plain running box whose pod was deleted -> the 404 it is. Pure.
 */
export function deletedStep(state: BoxState | undefined, recordExists: boolean, lostBefore: boolean): 'wake' | 'wait' | 'retry' | 'fail' {
  if (!recordExists || state === undefined) return 'fail';
  return goneStep(state, lostBefore);
}

/** What a sleep leaves on the record that a box back to Running must not keep. */
const CLEAR_SLEEP = { annotations: { [ANNOTATIONS.sleepSnapshot]: null, [ANNOTATIONS.sleepBox]: null, [ANNOTATIONS.expiresAt]: null } };

class SnapshotLost extends Error {}

/** The pod a call ran on was deleted meanwhile: the 404 it was, unless the box's record says a sleep took it. */
class PodGone extends BridgeError {
  constructor(message: string) {
    super('not_found', message);
  }
}

/** A call found the pod's boxd not accepting connections; `answer` is what the caller gets if that lasts. */
class BoxdGone extends Error {
  constructor(readonly answer: unknown) {
    super('boxd is not accepting connections');
  }
}

function failed(boxId: string, record: k8s.V1Secret | undefined, reason?: string): BridgeError {
  const why = reason ?? record?.metadata?.annotations?.[ANNOTATIONS.failure] ?? 'its workspace is lost';
  return new BridgeError('conflict', `box ${boxId} failed: ${why}; delete it and create a new box`);
}

/** When the box's last call was (its pod's annotation; a pod without one: its creation). */
function lastActive(pod: k8s.V1Pod): number {
  const stamped = Date.parse(pod.metadata?.annotations?.[ANNOTATIONS.lastActive] ?? '');
  if (Number.isFinite(stamped)) return stamped;
  const created = pod.metadata?.creationTimestamp;
  return created ? new Date(created).getTime() : 0;
}

/** Sets key in a map bounded to CACHE_SIZE entries (the oldest goes first). */
function remember<V>(map: Map<string, V>, key: string, value: V): void {
  if (!map.has(key) && map.size >= CACHE_SIZE) map.delete(map.keys().next().value!);
  map.set(key, value);
}

function checkUsable(pod: k8s.V1Pod): void {
  const name = pod.metadata?.name;
  if (pod.metadata?.deletionTimestamp) throw new BridgeError('not_found', `box ${name} not found (it is being deleted)`);
  if (!pod.metadata?.annotations?.[BOXD_VERSION_ANNOTATION] || !pod.metadata.annotations[BOXD_NONCE_ANNOTATION]) {
    throw new BridgeError('conflict', `box ${name} was created by an older bridge without the in-box agent; create a new box`);
  }
}

function startTimeout(err: BoxStartTimeoutError): BridgeError {
  return new BridgeError('cluster_unavailable', err.message, { headers: { 'Retry-After': '5' } });
}

function unreachable(err: unknown, name: string): unknown {
  if (err instanceof BoxdUnreachableError) {
    return new BridgeError('cluster_unavailable', `box ${name} does not answer (${err.code})`, { headers: { 'Retry-After': '5' }, cause: err });
  }
  return err;
}

function clamp(v: number, min: number, max: number): number {
  return Math.min(max, Math.max(min, v));
}

function delay(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Where the box's boxd is reached: status.podIP, or, before the kubelet reports it, the address
 * the CNI plugin annotated the pod with. The kubelet reports a new pod's IP only after its next
 * PLEG relist (once a second), while the CNI plugin knows it as the sandbox is made: with boxd
 * from an image volume the box's container is up well before that report (bench/results/
 * cold-start.md). Only an address is taken from it (Calico writes "10.0.0.5/32"), and only until
 * the kubelet reports one; it is as trustworthy as whoever may patch box pods (docs/security.md).
 */
export function podAddress(pod: k8s.V1Pod, annotation?: string): string | undefined {
  if (pod.status?.podIP) return pod.status.podIP;
  if (!annotation || pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed') return undefined;
  const raw = pod.metadata?.annotations?.[annotation]?.split(',')[0]?.trim().replace(/\/\d{1,3}$/, '');
  return raw && isIP(raw) ? raw : undefined;
}
