// From a box id to a boxd that answers: the box must exist, be boxd-capable and running; a new
// box is waited for (its pod IP from the watch, then boxd's health). Calls run with a signal that
// fires when the box is deleted meanwhile, so nothing hangs on a box that is gone.
import type * as k8s from '@kubernetes/client-node';
import { BOXD_NONCE_ANNOTATION, BOXD_VERSION_ANNOTATION, boxdToken } from '../../common/boxd.js';
import { BridgeError } from '../../common/errors.js';
import { BoxdUnreachableError, type BoxdClient, type BoxdTarget } from '../../common/boxd-client.js';
import { BoxGoneError, BoxStartTimeoutError, type BoxReader } from '../kube/box-cache.js';
import type { BoxService } from './boxes.js';

export interface BoxConnectorDeps {
  boxes: Pick<BoxService, 'get' | 'answering'>;
  cache: BoxReader;
  boxd: BoxdClient;
  /** The key box credentials are derived from (common/boxd.ts). */
  key: Buffer;
  namespace: string;
  /** How long a call waits for a new box to start. */
  startTimeoutMs: number;
}

/** A box that was answering and stops is given this long to come back before the call fails. */
const LOST_BOX_WAIT_MS = 10_000;
/** Between health probes of a box whose pod has an IP but whose boxd does not listen yet. */
const PROBE_INTERVAL_MS = 25;
/** Boxes known to answer, and credentials derived, by pod name; bounded so memory does not grow with churn. */
const CACHE_SIZE = 50_000;

/** Idle sleep's part in every call (bridge/services/sleep.ts). */
export interface SleepHooks {
  /**
   * Resolves once the box is not asleep (waking it, or waiting for the replica that does). With
   * recheck, the box's record is read even when this replica's watch shows no sleep.
   */
  ensureAwake(boxId: string, signal?: AbortSignal, recheck?: boolean): Promise<void>;
  /** Records the call as the box's latest activity (at most every few seconds per box). */
  touch(pod: k8s.V1Pod): Promise<boolean>;
}

export interface CallOptions {
  /** Idle sleep's own calls: they neither wake the box nor count as activity. */
  internal?: boolean;
}

export interface BoxCall {
  pod: k8s.V1Pod;
  target: BoxdTarget;
  /** Aborted when the box is deleted (or the caller's signal fires). */
  signal: AbortSignal;
}

export class BoxConnector {
  /** pod name -> uid of the pod seen answering. */
  private readonly ready = new Map<string, string>();
  /** pod name -> the credential of the pod with that nonce (an HMAC per call costs ~3% of an exec). */
  private readonly tokens = new Map<string, { nonce: string; token: string }>();

  private sleep: SleepHooks | undefined;

  constructor(private readonly deps: BoxConnectorDeps) {}

  /** Idle sleep is wired after the connector (it calls boxes through it). */
  useSleep(sleep: SleepHooks): void {
    this.sleep = sleep;
  }

  /**
   * Runs fn against the box's boxd. A connection boxd never accepted is retried once the box
   * answers again (nothing reached it, so nothing ran twice).
   */
  async call<T>(boxId: string, fn: (call: BoxCall) => Promise<T>, signal?: AbortSignal, options: CallOptions = {}): Promise<T> {
    const pod = await this.awakePod(boxId, options.internal ? undefined : this.sleep, signal);
    const name = pod.metadata!.name!;
    const aborter = new AbortController();
    const stop = this.deps.cache.onGone(name, () =>
      aborter.abort(new BridgeError('not_found', `box ${name} was deleted while the request was running`)),
    );
    const onCallerAbort = () => aborter.abort(signal?.reason);
    signal?.addEventListener('abort', onCallerAbort, { once: true });
    try {
      for (let attempt = 0; ; attempt++) {
        const live = await this.connect(pod, aborter.signal, attempt > 0);
        try {
          return await fn({ pod: live, target: this.target(live), signal: aborter.signal });
        } catch (err) {
          if (aborter.signal.aborted) throw aborter.signal.reason;
          if (!(err instanceof BoxdUnreachableError) || attempt > 0) throw unreachable(err, name);
          this.ready.delete(name);
        }
      }
    } finally {
      stop();
      signal?.removeEventListener('abort', onCallerAbort);
    }
  }

  /**
   * The box's pod, woken first if it sleeps. A sleep that took the pod just as the call came in
   * (this replica's watch did not show it yet) answers not_found once: the box is then woken
   * from its record and the call goes on, as if it had come a moment later.
   */
  private async awakePod(boxId: string, sleep: SleepHooks | undefined, signal: AbortSignal | undefined): Promise<k8s.V1Pod> {
    for (let attempt = 0; ; attempt++) {
      try {
        await sleep?.ensureAwake(boxId, signal, attempt > 0);
        const pod = await this.deps.boxes.get(boxId);
        checkUsable(pod);
        await sleep?.touch(pod);
        return pod;
      } catch (err) {
        if (!sleep || attempt > 0 || !(err instanceof BridgeError && err.type === 'not_found')) throw err;
      }
    }
  }

  private target(pod: k8s.V1Pod): BoxdTarget {
    const name = pod.metadata!.name!;
    const nonce = pod.metadata!.annotations?.[BOXD_NONCE_ANNOTATION] ?? '';
    let cached = this.tokens.get(name);
    if (cached?.nonce !== nonce) {
      cached = { nonce, token: boxdToken(this.deps.key, this.deps.namespace, name, nonce) };
      remember(this.tokens, name, cached);
    }
    return { box: name, ip: pod.status!.podIP!, token: cached.token };
  }

  /** The live pod once its boxd answers; fast when this replica has seen it answer before. */
  private async connect(pod: k8s.V1Pod, signal: AbortSignal, lost: boolean): Promise<k8s.V1Pod> {
    const name = pod.metadata!.name!;
    const cached = this.deps.cache.pod(name) ?? pod;
    if (!lost && cached.status?.podIP && (this.ready.get(name) === cached.metadata?.uid || this.deps.boxes.answering(cached))) return cached;

    const deadline = performance.now() + (lost ? LOST_BOX_WAIT_MS : this.deps.startTimeoutMs);
    for (;;) {
      signal.throwIfAborted();
      const remaining = deadline - performance.now();
      if (remaining <= 0) {
        const latest = this.deps.cache.pod(name);
        if (lost || latest?.status?.podIP) {
          throw new BridgeError('cluster_unavailable', `box ${name} does not answer (its agent is not reachable)`, { headers: { 'Retry-After': '5' } });
        }
        throw startTimeout(new BoxStartTimeoutError(name, latest));
      }
      const live = await this.waitForIp(name, remaining);
      try {
        await this.deps.boxd.health(this.target(live), AbortSignal.any([signal, AbortSignal.timeout(Math.ceil(Math.min(remaining, 2000)))]));
        remember(this.ready, name, live.metadata!.uid!);
        return live;
      } catch (err) {
        if (signal.aborted) throw signal.reason;
        if (!(err instanceof BoxdUnreachableError) && !(err instanceof DOMException)) throw err;
        await new Promise((resolve) => setTimeout(resolve, PROBE_INTERVAL_MS));
      }
    }
  }

  private async waitForIp(name: string, timeoutMs: number): Promise<k8s.V1Pod> {
    try {
      return await this.deps.cache.waitUntil(name, (p) => Boolean(p.status?.podIP), timeoutMs);
    } catch (err) {
      if (err instanceof BoxGoneError) {
        throw err.phase ? new BridgeError('conflict', `${err.message}; create a new box`) : new BridgeError('not_found', `box ${name} not found`);
      }
      if (err instanceof BoxStartTimeoutError) throw startTimeout(err);
      throw err;
    }
  }

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
    return new BridgeError('cluster_unavailable', `box ${name} does not answer (${err.code})`, { headers: { 'Retry-After': '5' } });
  }
  return err;
}
