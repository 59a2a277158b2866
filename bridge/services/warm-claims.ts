// Claiming warm pods (docs/warm-pool.md): which ready warm pod a create tries, in what order,
// and the claim itself. A claim is a compare-and-swap on the pod's resourceVersion, so no warm
// pod ever serves two boxes, whatever replicas race for it; nothing serializes the replicas.
//
// No warm miss while a warm pod is ready: a create tries the ready warm pods one after the other,
// each time the best-ranked one its replica has not tried yet (as its watch shows them now), and
// falls back to a new pod only when none is left. Ranks are rendezvous hashes of the box id and
// the pod, so creates racing through different replicas start on different pods, and creates of
// one replica never try the same pod version twice.
//
// Warm boxes of any shape: a create whose shape no warm shape has claims one of the same image
// and runtime class (common/warm-shapes.ts) and resizes it in place (the pod's resize
// subresource) before the box is handed out; a resize the node cannot make (or not in time)
// gives the pod up and counts the reason.
import * as k8s from '@kubernetes/client-node';
import type { BoxdClient } from '../../common/boxd-client.js';
import { BOX_CONTAINER, sessionMetadata, type BoxShape, type SessionBox } from '../../common/box-pod.js';
import { patientDeadline } from '../../common/deadline.js';
import { BridgeError } from '../../common/errors.js';
import { isNotFound } from '../../common/kube.js';
import { LABELS } from '../../common/labels.js';
import { seatOf } from '../../common/seats.js';
import { formatCpu, formatMemory, parseQuantity } from '../../common/quantity.js';
import type { BoxReader } from '../kube/box-cache.js';
import type { NodeReader } from '../kube/node-cache.js';
import type { KubeCall } from '../kube/instrument.js';

/** At most this many warm pods per create (each costs an API write): a bound, not a policy. */
const CLAIM_ATTEMPTS_MAX = 64;
/** How long a warm pod version this replica tried stays out of its picks (its watch shows the claim well before). */
const CLAIM_TRIED_MS = 30_000;
const CLAIM_TRIED_MAX = 10_000;
/** A claimed pod's agent must answer within this, or the claim is undone. */
const CLAIM_CHECK_MS = 2000;
/** How long a claim waits for the kubelet to resize the claimed pod (measured: 0.3-2 s on a loaded node). */
const RESIZE_WAIT_MS = 10_000;

/**
 * Why a create that a warm shape serves was made cold (sandbox_bridge_warm_misses_total{reason}):
 * none_ready: no warm box ready; all_taken: every one tried was claimed meanwhile; resize_no_room:
 * none could grow where it runs (the node's allocatable less the requests of the boxes on it);
 * resize_infeasible / resize_deferred: the kubelet refused the resize (PodResizePending) for good
 * or for now; resize_timeout: not done in time.
 */
export type MissReason = 'none_ready' | 'all_taken' | 'resize_no_room' | 'resize_infeasible' | 'resize_deferred' | 'resize_timeout';

/** Where a create may claim from: ready warm pods of a template, resized to `resize` when given. */
export interface ClaimSource {
  template: string;
  resize?: BoxShape | undefined;
}

export interface WarmClaimsDeps {
  core: k8s.CoreV1Api;
  call: KubeCall;
  cache: BoxReader;
  boxd: BoxdClient;
  namespace: string;
  /** boxd's credential for a pod (common/boxd.ts). */
  token: (pod: k8s.V1Pod) => string;
  /** Nodes (allocatable), for the room a resize needs; without them the kubelet alone judges. */
  nodes?: Pick<NodeReader, 'list'> | undefined;
}

/** A warm pod picked ahead of the claim, and its agent's answer if it was asked. */
export interface Prepared {
  pod: k8s.V1Pod;
  answering?: Promise<boolean>;
}

/**
 * A warm pod a claim deleted (dead, or claimed but of no use): no box can be served by it, so its
 * seat is the create's to adopt or free at once, not held until the operator's reaper sees the pod gone.
 */
export interface LetGo {
  seat: number;
  pod: string;
}

export type ClaimResult = ({ pod: k8s.V1Pod; miss?: undefined } | { pod?: undefined; miss: MissReason }) & { letGo: LetGo[] };

export class WarmClaims {
  /**
   * Warm pod versions (uid@resourceVersion) a create of this replica has tried to claim. A claim is
   * a compare-and-swap on that version, so a version tried (in flight, won or lost) cannot be won
   * again: concurrent creates through one replica never race each other for a pod. A pod changed
   * since (the kubelet's status, a lost race's winner) shows a new version and is judged again.
   */
  private readonly tried = new Expiring(CLAIM_TRIED_MS, CLAIM_TRIED_MAX);

  constructor(private readonly deps: WarmClaimsDeps) {}

  /**
   * Picks the warm pod a create will try first, before its record is written, and (with
   * `check`) asks its agent whether it answers meanwhile: the check then costs the create no
   * time. The pod counts as tried; release() gives it back if the create does not claim.
   */
  prepare(pool: string, source: ClaimSource, key: string, check: boolean): Prepared | undefined {
    const candidates = this.candidates(pool, source).filter((p) => !source.resize || this.fits(p, source.resize));
    const pod = pickWarm(candidates, key, (p) => this.tried.has(versionOf(p)));
    if (!pod) return undefined;
    this.tried.add(versionOf(pod));
    return { pod, ...(check ? { answering: this.answers(pod, key, undefined) } : {}) };
  }

  /** A prepared pod the create did not try after all (its slot was taken): others may again. */
  release(prepared: Prepared): void {
    this.tried.delete(versionOf(prepared.pod));
    void prepared.answering?.catch(() => undefined);
  }

  /**
   * Makes one of the pool's ready warm pods of the template this session's box: a merge patch
   * carrying the pod's resource version, so it fails (409) if anything changed the pod since this
   * replica saw it, another replica's claim included. That patch is the claim's one write (the
   * record, written before, holds the session's slot; the pod holds its seat since the operator
   * made it). The claimed pod's agent must answer (and takes the create-time env) before the box
   * is handed out; a pod that died meanwhile is let go.
   */
  async claim(
    pool: string,
    sources: readonly ClaimSource[],
    session: SessionBox,
    env: Record<string, string> | undefined,
    first?: Prepared,
    /** No claim is tried after this (performance.now()): the create's pod deadline (common/box-records.ts). */
    until?: number,
  ): Promise<ClaimResult> {
    let sawOne = Boolean(first);
    let why: MissReason | undefined;
    let next = first;
    const withEnv = Boolean(env && Object.keys(env).length);
    let attempts = 0;
    const letGo: LetGo[] = [];
    const drop = async (pod: k8s.V1Pod, unchanged: boolean) => {
      const seat = seatOf(pod);
      if ((await this.deleteQuietly(pod, unchanged)) && seat !== undefined) letGo.push({ seat, pod: pod.metadata!.name! });
    };
    for (const source of sources) {
      /** Nodes where this create's resize was refused: the other pods there would be too. */
      const refused = new Set<string>();
      while (attempts++ < CLAIM_ATTEMPTS_MAX && (until === undefined || performance.now() < until)) {
        let candidate = next;
        next = undefined;
        if (!candidate) {
          // Read again before every try: the watch shows other replicas' claims as they land.
          const candidates = this.candidates(pool, source);
          sawOne ||= candidates.length > 0;
          const fitting = source.resize ? candidates.filter((p) => !refused.has(p.spec?.nodeName ?? '') && this.fits(p, source.resize!)) : candidates;
          if (fitting.length < candidates.length) why ??= 'resize_no_room';
          const pod = pickWarm(fitting, session.boxId, (p) => this.tried.has(versionOf(p)));
          if (!pod) break;
          this.tried.add(versionOf(pod));
          candidate = { pod };
        }
        if (candidate.answering && !(await candidate.answering)) {
          // Dead before the claim: nobody's yet, so only as this replica saw it (a claim wins).
          await drop(candidate.pod, true);
          continue;
        }
        let pod = await this.patch(candidate.pod, session);
        if (!pod) continue; // taken or gone
        if (source.resize) {
          const resized = await this.resize(pod, source.resize);
          if (typeof resized === 'string') {
            // Ours now, but not of the shape asked for: no use to anyone.
            why = resized;
            if (resized !== 'resize_timeout') refused.add(pod.spec?.nodeName ?? '');
            await drop(pod, false);
            continue;
          }
          pod = resized;
        }
        if ((candidate.answering && !withEnv) || (await this.answers(pod, session.boxId, env))) return { pod, letGo };
        // Claimed a pod whose agent does not answer: it is no use to anyone.
        await drop(pod, false);
      }
    }
    return { miss: why ?? (sawOne ? 'all_taken' : 'none_ready'), letGo };
  }

  /** Claimable warm pods: ready, of the source's template, holding a seat of their own (common/seats.ts). */
  private candidates(pool: string, source: ClaimSource): k8s.V1Pod[] {
    return this.deps.cache.warm(pool, source.template).filter((p) => seatOf(p) !== undefined);
  }

  /**
   * Whether the pod can grow to `want` where it runs: the growth within the node's allocatable
   * less the requests of the box pods this replica sees there (other pods are the kubelet's to
   * judge: it answers PodResizePending). Shrinking always fits; an unknown node too.
   */
  private fits(pod: k8s.V1Pod, want: BoxShape): boolean {
    const now = containerResources(pod);
    const grow = { cpu: want.cpuCores - now.cpu, memory: want.memoryBytes - now.memory };
    if (grow.cpu <= 0 && grow.memory <= 0) return true;
    const nodeName = pod.spec?.nodeName;
    const node = nodeName ? this.deps.nodes?.list().find((n) => n.metadata?.name === nodeName) : undefined;
    const allocatable = node?.status?.allocatable;
    if (!allocatable) return true;
    const used = { cpu: 0, memory: 0 };
    for (const p of this.deps.cache.all()) {
      if (p.spec?.nodeName !== nodeName || p.status?.phase === 'Succeeded' || p.status?.phase === 'Failed') continue;
      const r = containerResources(p);
      used.cpu += r.cpu;
      used.memory += r.memory;
    }
    const free = { cpu: parseQuantity(String(allocatable.cpu ?? '0')) - used.cpu, memory: parseQuantity(String(allocatable.memory ?? '0')) - used.memory };
    return grow.cpu <= free.cpu && grow.memory <= free.memory;
  }

  /**
   * Resizes the claimed pod's box container in place (requests = limits: the box stays
   * Guaranteed) and waits until the kubelet reports it done. The pod as the watch then shows it,
   * or why not.
   */
  private async resize(pod: k8s.V1Pod, want: BoxShape): Promise<k8s.V1Pod | MissReason> {
    const size = { cpu: formatCpu(want.cpuCores), memory: formatMemory(want.memoryBytes) };
    try {
      await this.deps.call('resize warm pod', () =>
        this.deps.core.patchNamespacedPodResize(
          { name: pod.metadata!.name!, namespace: this.deps.namespace, body: { spec: { containers: [{ name: BOX_CONTAINER, resources: { requests: size, limits: size } }] } } },
          k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.StrategicMergePatch),
        ),
      );
    } catch (err) {
      if (err instanceof BridgeError && (err.type === 'invalid_request' || err.type === 'forbidden' || err.type === 'conflict')) return 'resize_infeasible';
      throw err;
    }
    const done = (p: k8s.V1Pod) => resizeState(p, want) !== 'in_progress';
    const seen = await this.deps.cache.waitUntil(pod.metadata!.name!, done, RESIZE_WAIT_MS, pod.metadata!.uid).catch(() => undefined);
    if (!seen) return 'resize_timeout';
    const state = resizeState(seen, want);
    return state === 'done' ? seen : state === 'in_progress' ? 'resize_timeout' : state;
  }

  private async patch(warmPod: k8s.V1Pod, session: SessionBox): Promise<k8s.V1Pod | undefined> {
    const meta = sessionMetadata(session);
    // The pod keeps the seat it holds (a woken box's own seat is freed once the wake commits).
    const labels: Record<string, string | null> = { ...meta.labels, [LABELS.warm]: null };
    delete labels[LABELS.seat];
    try {
      return await this.deps.call('claim warm pod', () =>
        this.deps.core.patchNamespacedPod(
          {
            name: warmPod.metadata!.name!,
            namespace: this.deps.namespace,
            body: {
              metadata: {
                resourceVersion: warmPod.metadata!.resourceVersion,
                labels,
                annotations: meta.annotations,
                ownerReferences: meta.ownerReferences,
              },
            },
          },
          k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
        ),
      );
    } catch (err) {
      if (err instanceof BridgeError && (err.type === 'conflict' || err.type === 'not_found')) return undefined;
      throw err;
    }
  }

  private async answers(pod: k8s.V1Pod, box: string, env: Record<string, string> | undefined): Promise<boolean> {
    // Patient: a replica stalled on a loaded node must not let a live warm pod go as dead.
    const deadline = patientDeadline(CLAIM_CHECK_MS);
    try {
      const target = { box, ip: pod.status!.podIP!, token: this.deps.token(pod) };
      if (env && Object.keys(env).length) await this.deps.boxd.setEnv(target, env, deadline.signal);
      else await this.deps.boxd.health(target, deadline.signal);
      return true;
    } catch {
      return false;
    } finally {
      deadline.clear();
    }
  }

  /** Deletes the pod at once (grace 0: gone from the API server); true when it is gone. */
  private async deleteQuietly(pod: k8s.V1Pod, unchanged: boolean): Promise<boolean> {
    const { name, uid, resourceVersion } = pod.metadata!;
    try {
      await this.deps.core.deleteNamespacedPod({
        name: name!,
        namespace: this.deps.namespace,
        body: { gracePeriodSeconds: 0, preconditions: { uid: uid!, ...(unchanged ? { resourceVersion: resourceVersion! } : {}) } },
      });
      return true;
    } catch (err) {
      return isNotFound(err);
    }
  }
}

/** The box container's cpu (cores) and memory (bytes) as the pod spec has them now (limits = requests). */
export function containerResources(pod: k8s.V1Pod): { cpu: number; memory: number } {
  const r = pod.spec?.containers?.find((c) => c.name === BOX_CONTAINER)?.resources;
  const q = (name: 'cpu' | 'memory') => {
    const v = r?.requests?.[name] ?? r?.limits?.[name];
    return v === undefined ? 0 : parseQuantity(String(v));
  };
  return { cpu: q('cpu'), memory: q('memory') };
}

/**
 * Where an in-place resize of the box container to `want` is, from the pod's status: done (the
 * kubelet reports the container running with those limits), refused (PodResizePending: Infeasible
 * for good, Deferred for now), or still in progress.
 */
export function resizeState(pod: k8s.V1Pod, want: BoxShape): 'done' | 'in_progress' | 'resize_infeasible' | 'resize_deferred' {
  const pending = pod.status?.conditions?.find((c) => c.type === 'PodResizePending' && c.status === 'True');
  if (pending) return pending.reason === 'Infeasible' ? 'resize_infeasible' : 'resize_deferred';
  const limits = pod.status?.containerStatuses?.find((c) => c.name === BOX_CONTAINER)?.resources?.limits;
  const cpu = limits?.cpu === undefined ? undefined : parseQuantity(String(limits.cpu));
  const memory = limits?.memory === undefined ? undefined : parseQuantity(String(limits.memory));
  return cpu !== undefined && memory !== undefined && Math.abs(cpu - want.cpuCores) < 0.0005 && memory === want.memoryBytes ? 'done' : 'in_progress';
}

export function versionOf(pod: k8s.V1Pod): string {
  return `${pod.metadata!.uid}@${pod.metadata!.resourceVersion}`;
}

/**
 * The warm pod a create tries next: of those not yet tried, the one ranked first for this key
 * (rendezvous hashing: rank = hash(key, pod uid)). Different keys rank the pods in independent
 * orders, so creates racing through different replicas mostly start on different pods, and a
 * pod leaving or joining moves no other pod's rank.
 */
export function pickWarm(candidates: readonly k8s.V1Pod[], key: string, tried: (pod: k8s.V1Pod) => boolean): k8s.V1Pod | undefined {
  let best: k8s.V1Pod | undefined;
  let bestRank = -1;
  for (const pod of candidates) {
    if (tried(pod)) continue;
    const rank = rendezvous(key, pod.metadata?.uid ?? pod.metadata?.name ?? '');
    if (rank > bestRank) [best, bestRank] = [pod, rank];
  }
  return best;
}

/** 32-bit FNV-1a of key, NUL, item, with a final avalanche (murmur3's fmix32), as an unsigned number. */
export function rendezvous(key: string, item: string): number {
  let h = 0x811c9dc5;
  const mix = (s: string) => {
    for (let i = 0; i < s.length; i++) {
      h ^= s.charCodeAt(i);
      h = Math.imul(h, 0x01000193);
    }
  };
  mix(key);
  h ^= 0;
  h = Math.imul(h, 0x01000193);
  mix(item);
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** A bounded set whose members are forgotten after ttlMs. */
export class Expiring {
  private readonly at = new Map<string, number>();

  constructor(
    private readonly ttlMs: number,
    private readonly max: number,
  ) {}

  add(key: string): void {
    this.at.delete(key);
    if (this.at.size >= this.max) this.at.delete(this.at.keys().next().value!);
    this.at.set(key, performance.now() + this.ttlMs);
  }

  has(key: string): boolean {
    const until = this.at.get(key);
    if (until === undefined) return false;
    if (until > performance.now()) return true;
    this.at.delete(key);
    return false;
  }

  delete(key: string): void {
    this.at.delete(key);
  }
}
