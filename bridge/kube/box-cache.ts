// Box pods of the sandbox namespace, from a watch cache: every read (status, list, counts,
// session slots, warm pods to claim) is answered here without an API round trip. A session's
// box is found by its box id (the box-id label; a pod without one is a box named after itself);
// warm pods belong to no session until claimed.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { ResilientInformer, listPaged, slimMetadata } from '../../common/informer.js';
import { ANNOTATIONS, BOX_SELECTOR, LABELS } from '../../common/labels.js';
import { boxState } from '../box-view.js';

export interface BoxReader {
  /** The pod serving a box, by box id. */
  get(boxId: string): k8s.V1Pod | undefined;
  /** Any box or warm pod, by pod name. */
  pod(name: string): k8s.V1Pod | undefined;
  /** Every session's box (warm pods not included). */
  list(): readonly k8s.V1Pod[];
  /** Every box pod, warm ones included (what uses the nodes). */
  all(): readonly k8s.V1Pod[];
  /** Warm pods of a pool (made from the given template, if one is given) ready to claim: Running, Ready, not deleting. */
  warm(pool: string, template?: string): k8s.V1Pod[];
  /**
   * Unclaimed warm pods of a pool that still hold quota, whatever their template or readiness,
   * least useful first (still starting, then an old template, then ready ones).
   */
  spares(pool: string, template: string): k8s.V1Pod[];
  /** Warm pods of a pool that are ready, whatever their template. */
  warmReadyCount(pool: string): number;
  /** Boxes that count against the caps: every box not finished (deleting ones still hold their name). */
  activeCount(): number;
  sessionBoxes(sessionHash: string): k8s.V1Pod[];
  /**
   * Resolves with the pod once `ready(pod)` holds; rejects when the pod ends, vanishes, or time
   * runs out. A pod not in this replica's cache yet (created through another one) is waited for;
   * with `uid`, so is a pod of that name the cache still shows from before (another uid).
   */
  waitUntil(name: string, ready: (pod: k8s.V1Pod) => boolean, timeoutMs: number, uid?: string): Promise<k8s.V1Pod>;
  /**
   * The pod serving a box once this replica's watch shows one (made through another replica a
   * moment ago), or undefined after timeoutMs. Costs no API call.
   */
  waitForBox(boxId: string, timeoutMs: number): Promise<k8s.V1Pod | undefined>;
  /** Calls back when the pod (with uid: that very pod) is deleted or starts terminating; returns an unsubscribe function. */
  onGone(name: string, callback: () => void, uid?: string): () => void;
  isHealthy(): boolean;
  /** Changes whenever a box is added, changed or removed: lets readers cache what they derive. */
  version(): number;
}

export class BoxCache implements BoxReader {
  private readonly informer: ResilientInformer<k8s.V1Pod>;
  /** pod name -> who watches it: called with the pod, and whether that pod is gone. */
  private readonly watchers = new Map<string, Set<(pod: k8s.V1Pod, gone: boolean) => void>>();
  /** box id -> who waits for a pod of that box to show up. */
  private readonly boxWaiters = new Map<string, Set<() => void>>();
  /** box id -> pod name, and back, for session boxes. */
  private readonly podOfBox = new Map<string, string>();
  private readonly boxOfPod = new Map<string, string>();
  private changes = 0;

  constructor(
    kc: k8s.KubeConfig,
    readonly namespace: string,
    log: Logger,
  ) {
    const core = kc.makeApiClient(k8s.CoreV1Api);
    this.informer = new ResilientInformer<k8s.V1Pod>({
      kc,
      path: `/api/v1/namespaces/${namespace}/pods`,
      labelSelector: BOX_SELECTOR,
      log,
      list: () => listPaged((page) => core.listNamespacedPod({ namespace, labelSelector: BOX_SELECTOR, ...page }), trimPod),
    });
    // Registered first, so the object is trimmed in the cache before anyone else sees it.
    this.informer.on('add', trimPod);
    this.informer.on('update', trimPod);
    const notify = (pod: k8s.V1Pod, gone: boolean) => {
      const name = pod.metadata?.name;
      if (!name) return;
      for (const watcher of this.watchers.get(name) ?? []) watcher(pod, gone);
    };
    for (const event of ['add', 'update', 'delete'] as const) this.informer.on(event, () => this.changes++);
    this.informer.on('add', (pod) => this.index(pod, false));
    this.informer.on('update', (pod) => this.index(pod, false));
    this.informer.on('delete', (pod) => this.index(pod, true));
    this.informer.on('add', (pod) => notify(pod, false));
    this.informer.on('update', (pod) => notify(pod, false));
    this.informer.on('delete', (pod) => notify(pod, true));
  }

  start(): Promise<void> {
    return this.informer.start();
  }

  stop(): void {
    this.informer.stop();
  }

  /** Reopens the watch after an API server outage (ResilientInformer.resync). */
  resync(): void {
    this.informer.resync();
  }

  isHealthy(): boolean {
    return this.informer.isHealthy();
  }

  version(): number {
    return this.changes;
  }

  get(boxId: string): k8s.V1Pod | undefined {
    const name = this.podOfBox.get(boxId);
    return name === undefined ? undefined : this.pod(name);
  }

  pod(name: string): k8s.V1Pod | undefined {
    return this.informer.get(name, this.namespace);
  }

  list(): readonly k8s.V1Pod[] {
    return this.informer.list(this.namespace).filter((pod) => !isWarm(pod));
  }

  all(): readonly k8s.V1Pod[] {
    return this.informer.list(this.namespace);
  }

  warm(pool: string, template?: string): k8s.V1Pod[] {
    return this.informer
      .list(this.namespace)
      .filter(
        (pod) =>
          pod.metadata?.labels?.[LABELS.warm] === pool &&
          (template === undefined || pod.metadata?.annotations?.[ANNOTATIONS.warmTemplate] === template) &&
          isReady(pod),
      );
  }

  spares(pool: string, template: string): k8s.V1Pod[] {
    const worth = (pod: k8s.V1Pod) => (isReady(pod) ? 2 : 0) + (pod.metadata?.annotations?.[ANNOTATIONS.warmTemplate] === template ? 1 : 0);
    return this.informer
      .list(this.namespace)
      .filter((pod) => pod.metadata?.labels?.[LABELS.warm] === pool && !pod.metadata.deletionTimestamp)
      .sort((x, y) => worth(x) - worth(y));
  }

  warmReadyCount(pool: string): number {
    let n = 0;
    for (const pod of this.informer.list(this.namespace)) if (pod.metadata?.labels?.[LABELS.warm] === pool && isReady(pod)) n++;
    return n;
  }

  private index(pod: k8s.V1Pod, gone: boolean): void {
    const name = pod.metadata?.name;
    if (!name) return;
    const before = this.boxOfPod.get(name);
    const now = gone || isWarm(pod) ? undefined : (pod.metadata?.labels?.[LABELS.boxId] ?? name);
    if (before === now) return;
    if (before !== undefined) {
      this.boxOfPod.delete(name);
      if (this.podOfBox.get(before) === name) this.podOfBox.delete(before);
    }
    if (now !== undefined) {
      this.boxOfPod.set(name, now);
      this.podOfBox.set(now, name);
      for (const wake of this.boxWaiters.get(now) ?? []) wake();
    }
  }

  activeCount(): number {
    let n = 0;
    for (const pod of this.list()) {
      const phase = pod.status?.phase;
      if (phase !== 'Succeeded' && phase !== 'Failed') n++;
    }
    return n;
  }

  sessionBoxes(sessionHash: string): k8s.V1Pod[] {
    return this.list().filter((pod) => pod.metadata?.labels?.[LABELS.session] === sessionHash);
  }

  private watch(name: string, watcher: (pod: k8s.V1Pod, gone: boolean) => void): () => void {
    let set = this.watchers.get(name);
    if (!set) this.watchers.set(name, (set = new Set()));
    set.add(watcher);
    return () => {
      set.delete(watcher);
      if (set.size === 0) this.watchers.delete(name);
    };
  }

  waitUntil(name: string, ready: (pod: k8s.V1Pod) => boolean, timeoutMs: number, uid?: string): Promise<k8s.V1Pod> {
    return new Promise((resolve, reject) => {
      const check = (pod: k8s.V1Pod | undefined, gone: boolean): boolean => {
        // Another pod of that name (the one before, still shown or going): not the one waited for.
        if (uid && pod && pod.metadata?.uid !== uid) return false;
        if (!pod || gone) {
          // Not yet in this replica's cache (created through another replica a moment ago): wait.
          if (!pod) return false;
          reject(new BoxGoneError(name));
          return true;
        }
        if (boxState(pod) === 'Terminated') reject(new BoxGoneError(name, pod.status?.phase));
        else if (ready(pod)) resolve(pod);
        else return false;
        return true;
      };
      if (check(this.pod(name), false)) return;
      const timer = setTimeout(() => {
        unsubscribe();
        reject(new BoxStartTimeoutError(name, this.pod(name)));
      }, timeoutMs);
      const unsubscribe = this.watch(name, (pod, gone) => {
        if (check(pod, gone)) {
          clearTimeout(timer);
          unsubscribe();
        }
      });
    });
  }

  waitForBox(boxId: string, timeoutMs: number): Promise<k8s.V1Pod | undefined> {
    const live = () => {
      const pod = this.get(boxId);
      return pod && !pod.metadata?.deletionTimestamp ? pod : undefined;
    };
    const found = live();
    if (found || timeoutMs <= 0) return Promise.resolve(found);
    return new Promise((resolve) => {
      let set = this.boxWaiters.get(boxId);
      if (!set) this.boxWaiters.set(boxId, (set = new Set()));
      const done = () => {
        const pod = live();
        if (!pod && !timedOut) return;
        clearTimeout(timer);
        set.delete(done);
        if (set.size === 0) this.boxWaiters.delete(boxId);
        resolve(pod);
      };
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        done();
      }, timeoutMs);
      set.add(done);
    });
  }

  onGone(name: string, callback: () => void, uid?: string): () => void {
    return this.watch(name, (pod, gone) => {
      if (uid && pod.metadata?.uid !== uid) return; // the pod of that name before or after
      if (gone || pod.metadata?.deletionTimestamp) callback();
    });
  }
}

function isWarm(pod: k8s.V1Pod): boolean {
  return Boolean(pod.metadata?.labels?.[LABELS.warm]);
}

/** Claimable: running, its boxd answering the kubelet's readiness probe, not on its way out. */
function isReady(pod: k8s.V1Pod): boolean {
  return (
    !pod.metadata?.deletionTimestamp &&
    pod.status?.phase === 'Running' &&
    Boolean(pod.status.podIP) &&
    pod.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') === true
  );
}

/**
 * Keeps only what the bridge reads from a cached pod, in place (the informer caches this very
 * object): at 10,000 boxes the cache is most of the bridge's memory. The parts are replaced
 * with small fresh objects rather than pruned with `delete`, which would leave V8 objects in
 * slower, larger dictionary mode.
 */
export function trimPod(pod: k8s.V1Pod): void {
  if (pod.metadata) pod.metadata = slimMetadata(pod.metadata); // uid: owner of the box's env Secret
  const spec = pod.spec;
  if (spec) {
    pod.spec = {
      nodeName: spec.nodeName,
      // requests: what GET /cluster/capacity counts as used
      containers: spec.containers.map((c) => ({ name: c.name, image: c.image, resources: { limits: c.resources?.limits ?? {}, requests: c.resources?.requests } })),
    } as k8s.V1PodSpec;
  }
  const status = pod.status;
  if (status) {
    pod.status = {
      phase: status.phase,
      hostIP: status.hostIP,
      podIP: status.podIP,
      // reason and message explain a box that does not start (BoxStartTimeoutError)
      conditions: status.conditions?.map((c) => ({ type: c.type, status: c.status, reason: c.reason, message: c.message }) as k8s.V1PodCondition),
      containerStatuses: status.containerStatuses?.map(
        (c) =>
          ({
            name: c.name,
            restartCount: c.restartCount,
            ready: c.ready,
            // An in-place resize is done when the kubelet reports these (bridge/services/warm-claims.ts).
            ...(c.resources?.limits ? { resources: { limits: { cpu: c.resources.limits.cpu, memory: c.resources.limits.memory } } } : {}),
            state: {
              running: c.state?.running ? {} : undefined,
              waiting: c.state?.waiting ? { reason: c.state.waiting.reason, message: c.state.waiting.message } : undefined,
              terminated: c.state?.terminated ? { exitCode: c.state.terminated.exitCode, reason: c.state.terminated.reason } : undefined,
            },
          }) as k8s.V1ContainerStatus,
      ),
    } as k8s.V1PodStatus;
  }
}

export class BoxGoneError extends Error {
  constructor(
    readonly box: string,
    readonly phase?: string,
  ) {
    super(phase ? `box ${box} has ended (phase ${phase})` : `box ${box} no longer exists`);
  }
}

export class BoxStartTimeoutError extends Error {
  constructor(
    readonly box: string,
    pod: k8s.V1Pod | undefined,
  ) {
    const waiting = pod?.status?.containerStatuses?.[0]?.state?.waiting;
    const unscheduled = pod?.status?.conditions?.find((c) => c.type === 'PodScheduled' && c.status === 'False');
    const why = waiting
      ? `${waiting.reason ?? 'waiting'}${waiting.message ? `: ${waiting.message}` : ''}`
      : unscheduled
        ? `not scheduled: ${unscheduled.message ?? unscheduled.reason ?? ''}`
        : `phase ${pod?.status?.phase ?? 'unknown'}`;
    super(`box ${box} did not start in time (${why})`);
  }
}
