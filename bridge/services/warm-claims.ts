// Claiming warm pods (docs/warm-pool.md): which ready warm pod a create tries, in what order,
// and the claim itself. A claim is a compare-and-swap on the pod's resourceVersion, so no warm
// pod ever serves two boxes, whatever replicas race for it; nothing serializes the replicas.
//
// No warm miss while a warm pod is ready: a create tries the ready warm pods one after the other,
// each time the best-ranked one its replica has not tried yet (as its watch shows them now), and
// falls back to a new pod only when none is left. Ranks are rendezvous hashes of the box id and
// the pod, so creates racing through different replicas start on different pods, and creates of
// one replica never try the same pod version twice.
import * as k8s from '@kubernetes/client-node';
import type { BoxdClient } from '../../common/boxd-client.js';
import { sessionMetadata, type SessionBox } from '../../common/box-pod.js';
import { BridgeError } from '../../common/errors.js';
import { LABELS } from '../../common/labels.js';
import type { BoxReader } from '../kube/box-cache.js';
import type { KubeCall } from '../kube/instrument.js';

/** At most this many warm pods per create (each costs an API write): a bound, not a policy. */
const CLAIM_ATTEMPTS_MAX = 64;
/** How long a warm pod version this replica tried stays out of its picks (its watch shows the claim well before). */
const CLAIM_TRIED_MS = 30_000;
const CLAIM_TRIED_MAX = 10_000;
/** A claimed pod's agent must answer within this, or the claim is undone. */
const CLAIM_CHECK_MS = 2000;

/** Why a create of a warm shape was made cold (sandbox_bridge_warm_misses_total{reason}). */
export type MissReason = 'none_ready' | 'all_taken';

export interface WarmClaimsDeps {
  core: k8s.CoreV1Api;
  call: KubeCall;
  cache: BoxReader;
  boxd: BoxdClient;
  namespace: string;
  /** boxd's credential for a pod (common/boxd.ts). */
  token: (pod: k8s.V1Pod) => string;
}

export type ClaimResult = { pod: k8s.V1Pod; miss?: undefined } | { pod?: undefined; miss: MissReason };

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
   * Makes one of the pool's ready warm pods of the template this session's box: a merge patch
   * carrying the pod's resource version, so it fails (409) if anything changed the pod since this
   * replica saw it, another replica's claim included. The claimed pod's agent must answer (and
   * takes the create-time env) before the box is handed out; a pod that died meanwhile is let go.
   */
  async claim(pool: string, template: string, session: SessionBox, env: Record<string, string> | undefined): Promise<ClaimResult> {
    let sawOne = false;
    for (let attempt = 0; attempt < CLAIM_ATTEMPTS_MAX; attempt++) {
      // Read again before every try: the watch shows other replicas' claims as they land.
      const candidates = this.deps.cache.warm(pool, template);
      sawOne ||= candidates.length > 0;
      const warmPod = pickWarm(candidates, session.boxId, (p) => this.tried.has(versionOf(p)));
      if (!warmPod) break;
      this.tried.add(versionOf(warmPod));
      const pod = await this.patch(warmPod, session);
      if (!pod) continue; // taken or gone
      if (await this.answers(pod, session, env)) return { pod };
      // Claimed a pod whose agent does not answer: it is no use to anyone.
      await this.deleteQuietly(pod);
    }
    return { miss: sawOne ? 'all_taken' : 'none_ready' };
  }

  private async patch(warmPod: k8s.V1Pod, session: SessionBox): Promise<k8s.V1Pod | undefined> {
    const meta = sessionMetadata(session);
    try {
      return await this.deps.call('claim warm pod', () =>
        this.deps.core.patchNamespacedPod(
          {
            name: warmPod.metadata!.name!,
            namespace: this.deps.namespace,
            body: {
              metadata: {
                resourceVersion: warmPod.metadata!.resourceVersion,
                labels: { ...meta.labels, [LABELS.warm]: null },
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

  private async answers(pod: k8s.V1Pod, session: SessionBox, env: Record<string, string> | undefined): Promise<boolean> {
    try {
      const target = { box: session.boxId, ip: pod.status!.podIP!, token: this.deps.token(pod) };
      const signal = AbortSignal.timeout(CLAIM_CHECK_MS);
      if (env && Object.keys(env).length) await this.deps.boxd.setEnv(target, env, signal);
      else await this.deps.boxd.health(target, signal);
      return true;
    } catch {
      return false;
    }
  }

  private async deleteQuietly(pod: k8s.V1Pod): Promise<void> {
    await this.deps.core
      .deleteNamespacedPod({ name: pod.metadata!.name!, namespace: this.deps.namespace, body: { gracePeriodSeconds: 0, preconditions: { uid: pod.metadata!.uid! } } })
      .catch(() => undefined);
  }
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
