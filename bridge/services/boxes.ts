// Box lifecycle: create (policy checks, per-session slots, global cap, idempotency keys, warm
// claims), look up, delete. Free of Express types; reads come from the cache, writes go to the
// API server.
//
// A box is its record (a Secret named after the box id, taken first: that makes the session's
// slot atomic), a seat of the pool (box-seats.ts: the global cap, exact across replicas) and the
// pod serving it: a new pod named after the box (cold), or a warm pod of
// the pool's default shape claimed by a compare-and-swap on its resource version, so no warm pod
// ever serves two boxes, whichever replicas race for it.
import { createHash } from 'node:crypto';
import type * as k8s from '@kubernetes/client-node';
import { BOXD_NONCE_ANNOTATION, boxdToken, newNonce } from '../../common/boxd.js';
import { checkBoxAllow } from '../../common/box-egress.js';
import { egressProxyCredential } from '../../common/egress-proxy.js';
import { buildSessionBoxPod, warmTemplateHash, type BoxShape, type SessionBox } from '../../common/box-pod.js';
import { BridgeError } from '../../common/errors.js';
import { isNotFound } from '../../common/kube.js';
import { ANNOTATIONS, LABELS, boxName, sessionHash } from '../../common/labels.js';
import { seatOf } from '../../common/seats.js';
import type { SandboxPoolSpec } from '../../common/pool.js';
import { parseQuantity } from '../../common/quantity.js';
import { stateOf } from '../../common/box-lease.js';
import { boxIdOf, boxStatus, podlessStatus, sleepingStatus, sleptBoxOf } from '../box-view.js';
import type { BoxdClient } from '../../common/boxd-client.js';
import type { BoxReader } from '../kube/box-cache.js';
import { CREATE_POD_DEADLINE_MS, recordOf, type BoxRecords } from '../../common/box-records.js';
import type { SleepingReader } from '../kube/sleeping-records.js';
import type { BoxSeats } from '../kube/box-seats.js';
import type { NodeReader } from '../kube/node-cache.js';
import type { KubeCall } from '../kube/instrument.js';
import type { PolicySource } from '../kube/policy.js';
import { BOX_ID, type CreateBoxRequest } from '../schemas.js';
import { Expiring, WarmClaims, type ClaimSource, type LetGo, type MissReason } from './warm-claims.js';
import { warmChoices } from '../../common/warm-shapes.js';
import { giveUpWarm, takeSeat, type GiveUp } from './seat-taking.js';

const MiB = 1024 * 1024;
/** An Idempotency-Key names the same box for this long (DESIGN.md). */
const IDEMPOTENCY_WINDOW_MS = 24 * 3600 * 1000;
/** Deletes this replica sent recently, by pod UID (a sleeping box: its record's UID): answered 404 before the watch shows them. */
const RECENT_DELETES = 10_000;
/** Creates retried while the quota controller counts out pods that are gone (150 ms doubling: ~9.5 s). */
const QUOTA_RETRIES = 6;
/**
 * Boxes this replica just made are served from memory this long, until its watch shows them: the
 * agent's first call usually follows its create within milliseconds, before the watch event.
 */
const JUST_MADE_MS = 30_000;
const JUST_MADE_MAX = 1000;
/** How long a lookup that found a box's record waits for this replica's watch to show its pod. */
const WATCH_WAIT_MS = 2000;
/** How long a box found gone is answered 404 from memory (a deleted box's id is reused only by a new create in its slot). */
const GONE_MS = 5000;
const GONE_MAX = 10_000;
/** How long a woken box's new pod waits for the previous pod of its name to finish terminating. */
const REVIVE_NAME_WAIT_MS = 30_000;

export type CreatePath = 'warm' | 'cold';

export interface BoxServiceDeps {
  core: k8s.CoreV1Api;
  call: KubeCall;
  cache: BoxReader;
  policy: PolicySource;
  records: BoxRecords;
  /** Records of sleeping boxes (idle sleep); absent when it is off. */
  sleeping?: SleepingReader;
  seats: BoxSeats;
  boxd: BoxdClient;
  /** The key box credentials are derived from (common/boxd.ts). */
  boxdKey: Buffer;
  /** The key boxes' egress proxy credentials are derived from (common/egress-proxy.ts); none without it. */
  egressKey?: Buffer | undefined;
  boxdImage: string;
  namespace: string;
  namePrefix: string;
  /** Nodes (allocatable): the room a warm box resized at its claim needs. */
  nodes?: Pick<NodeReader, 'list'>;
  /** A box was made: from a warm pod or a new one, and how long it took. */
  onCreated?: (path: CreatePath, seconds: number) => void;
  /** A create of a warm shape was made cold, and why. */
  onWarmMiss?: (reason: MissReason) => void;
  now?: () => Date;
}

export class BoxService {
  private readonly now: () => Date;
  private readonly deleted = new Set<string>();
  /** Box ids found gone a moment ago: answered 404 without an API call (see locate). */
  private readonly gone = new Expiring(GONE_MS, GONE_MAX);
  /** box id -> the pod this replica just made or claimed for it, and whether its agent answered. */
  private readonly justMade = new Map<string, { pod: k8s.V1Pod; at: number; answering: boolean; seen?: boolean }>();
  private readonly warm: WarmClaims;

  constructor(private readonly deps: BoxServiceDeps) {
    this.now = deps.now ?? (() => new Date());
    this.warm = new WarmClaims({ core: deps.core, call: deps.call, cache: deps.cache, boxd: deps.boxd, namespace: deps.namespace, token: (pod) => this.token(pod), nodes: deps.nodes });
  }

  /** Creates a box; with an idempotency key, a repeated request answers with the box the first one made. */
  async create(req: CreateBoxRequest, idempotencyKey?: string) {
    const started = performance.now();
    const { cache, policy } = this.deps;
    const spec = policy.current();
    const image = req.image ?? spec.box.defaultImage;
    checkAllowed(spec, image, req.runtimeClassName, req.serviceAccountName);
    if (req.egress) checkBoxAllow(req.egress.allow, spec.egress, policy.poolName);
    const shape: BoxShape = { image, ...resources(spec, req), runtimeClassName: req.runtimeClassName, serviceAccountName: req.serviceAccountName };

    const hash = sessionHash(req.sessionId);
    const keyDigest = idempotencyKey === undefined ? undefined : digestKey(req.sessionId, idempotencyKey);
    if (keyDigest) {
      const earlier = cache.sessionBoxes(hash).find((p) => this.madeWith(p, keyDigest));
      if (earlier) return this.created(earlier);
    }
    const taken = new Set(cache.sessionBoxes(hash).map((p) => boxIdOf(p) ?? p.metadata?.name));
    if (taken.size >= spec.maxBoxesPerSession) {
      throw quotaExceeded(`session already has ${taken.size} boxes; the limit per session is ${spec.maxBoxesPerSession}`);
    }
    if (cache.activeCount() >= spec.maxBoxes) {
      throw quotaExceeded(`the pool is at its limit of ${spec.maxBoxes} boxes`);
    }
    const warm = this.claimSources(spec, shape);

    // Slot names are deterministic, so two replicas racing for one slot collide on the record's
    // name and the API server lets exactly one win; the loser moves on to the next free slot.
    for (let slot = 0; slot < spec.maxBoxesPerSession; slot++) {
      const boxId = boxName(this.deps.namePrefix, req.sessionId, slot);
      if (taken.has(boxId)) continue;
      // A cold pod would be named after the box; its credential goes into the record now, so
      // the kubelet finds the Secret it mounts complete from the start.
      const nonce = newNonce();
      const take = () =>
        this.deps.records.create({
          boxId,
          poolName: policy.poolName,
          sessionId: req.sessionId,
          slot,
          token: boxdToken(this.deps.boxdKey, this.deps.namespace, boxId, nonce),
          egressProxy: this.egressProxy(boxId, nonce),
          env: req.env ?? {},
          idempotencyKey: keyDigest,
          ...(req.egress ? { annotations: { [ANNOTATIONS.egress]: JSON.stringify({ allow: req.egress.allow }) } } : {}),
        });
      // A warm pod picked now has its agent checked while the record is written (no env: the
      // check is all a claim asks of boxd; with env, the env is pushed after the claim).
      const prepared = warm.sources.length ? this.warm.prepare(policy.poolName, warm.sources[0]!, boxId, !req.env || Object.keys(req.env).length === 0) : undefined;
      // The pod is made (or claimed) by then, or the create gives up (common/box-records.ts).
      const podDeadline = performance.now() + CREATE_POD_DEADLINE_MS;
      let record = await take().catch((err: unknown) => {
        if (prepared) this.warm.release(prepared);
        throw err;
      });
      const failed = record ? undefined : this.deps.sleeping?.get(boxId);
      if (failed && stateOf(failed) === 'failed') {
        // A Failed box (its workspace lost) gives its slot to a new box of the session.
        await this.deps.records.delete(boxId, failed.metadata!.uid!);
        this.remember(failed.metadata!.uid!);
        record = await take();
      }
      if (!record) {
        if (prepared) this.warm.release(prepared);
        // The same key racing through another replica lands on the same slot first.
        const winner = keyDigest ? (cache.get(boxId) ?? (await this.readPod(boxId))) : undefined;
        if (winner && this.madeWith(winner, keyDigest!)) return this.created(winner);
        continue;
      }
      const recordRef = { name: record.metadata!.name!, uid: record.metadata!.uid! };
      const session: SessionBox = {
        boxId,
        sessionId: req.sessionId,
        slot,
        // A claimed warm pod keeps the seat it holds; a new pod takes one below.
        seat: -1,
        record: recordRef,
        ttlSeconds: spec.defaultTtlSeconds,
        now: this.now(),
        idempotencyKey: keyDigest,
        warmDemand: warm.demand,
      };
      try {
        // The claim: one write (the pod's compare-and-swap), the record being the other.
        const claim = warm.sources.length ? await this.warm.claim(policy.poolName, warm.sources, session, req.env, prepared, podDeadline) : undefined;
        if (claim?.miss) this.deps.onWarmMiss?.(claim.miss);
        let pod = claim?.pod;
        if (!pod) {
          session.seat = await this.takeSeat(spec, recordRef, claim?.letGo ?? []);
          pod = await this.createNamedPod(spec, shape, session, nonce, podDeadline);
        } else await this.freeLetGo(claim!.letGo);
        this.deps.onCreated?.(claim?.pod ? 'warm' : 'cold', (performance.now() - started) / 1000);
        this.rememberMade(boxId, pod, Boolean(claim?.pod));
        return this.created(pod);
      } catch (err) {
        await this.deps.records.delete(boxId, session.record.uid).catch(() => undefined);
        throw explainCreateError(err, this.deps.namespace, spec);
      }
    }
    throw quotaExceeded(`session already has ${spec.maxBoxesPerSession} boxes; the limit per session is ${spec.maxBoxesPerSession}`);
  }

  /** Seats held by the boxes this replica's watches know: those with a pod, and sleeping ones (they keep theirs). */
  private heldSeats(): Set<number> {
    const held = new Set<number>();
    for (const pod of this.deps.cache.all()) {
      const seat = Number(pod.metadata?.labels?.[LABELS.seat]);
      if (pod.metadata?.labels?.[LABELS.seat] !== undefined && Number.isInteger(seat)) held.add(seat);
    }
    for (const record of this.deps.sleeping?.list() ?? []) {
      const seat = sleptBoxOf(record)?.seat;
      if (seat !== undefined && stateOf(record) !== 'failed') held.add(seat);
    }
    return held;
  }

  /**
   * Where a create of `shape` may claim a warm box (common/warm-shapes.ts): its own warm shape's
   * pods, then those of the same image and runtime class resized in place, best first; and the
   * warm shape whose demand it is (sizes that shape's pool, docs/warm-pool.md).
   */
  private claimSources(spec: SandboxPoolSpec, shape: BoxShape): { sources: ClaimSource[]; demand?: string } {
    const choices = warmChoices(spec, shape);
    return {
      sources: choices.map((c) => ({ template: warmTemplateHash(spec, this.deps.boxdImage, c.warm.shape), ...(c.resize ? { resize: shape } : {}) })),
      ...(choices[0] ? { demand: choices[0].warm.id } : {}),
    };
  }

  /**
   * A seat of the pool for a new pod (seat-taking.ts); 429 when the pool is full. A warm pod this
   * create claimed and let go (warm-claims.ts) held a seat no box can use now: the first is made
   * the record's (one write), the others freed.
   */
  private async takeSeat(spec: SandboxPoolSpec, record: { name: string; uid: string }, letGo: readonly LetGo[] = []): Promise<number> {
    const { poolName } = this.deps.policy;
    for (const [i, g] of letGo.entries()) {
      if (await this.deps.seats.adoptWarm(g.seat, g.pod, record)) {
        await this.freeLetGo(letGo.slice(i + 1));
        return g.seat;
      }
    }
    const seat = await takeSeat(
      {
        held: () => this.heldSeats(),
        liveHeld: () => this.deps.seats.liveHeld(poolName),
        take: (held) => this.deps.seats.take(poolName, spec.maxBoxes, held, record),
        spares: () => this.deps.cache.spares(poolName, warmTemplateHash(spec, this.deps.boxdImage)),
        giveUp: (pod) => this.giveUp(pod),
        adoptWarm: (n, podName) => this.deps.seats.adoptWarm(n, podName, record),
        sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
      },
      spec.maxBoxes,
    );
    if (seat === undefined) throw quotaExceeded(`the pool is at its limit of ${spec.maxBoxes} boxes`);
    return seat;
  }

  /** Frees the seats of warm pods a claim let go (warm-claims.ts), not waiting for the operator's reaper. */
  private async freeLetGo(letGo: readonly LetGo[]): Promise<void> {
    await Promise.all(letGo.map((g) => this.deps.seats.freeWarm(g.seat, g.pod).catch(() => undefined)));
  }

  /** Deletes an unclaimed warm pod, guarded by its version so a concurrent claim wins (seat-taking.ts). */
  private giveUp(pod: k8s.V1Pod): Promise<GiveUp> {
    return giveUpWarm(
      {
        delete: async (name, uid, resourceVersion) => {
          try {
            await this.deps.call('give up warm pod', () =>
              this.deps.core.deleteNamespacedPod({ name, namespace: this.deps.namespace, body: { gracePeriodSeconds: 0, preconditions: { uid, resourceVersion } } }),
            );
            return 'deleted';
          } catch (err) {
            if (err instanceof BridgeError && err.type === 'not_found') return 'gone';
            if (err instanceof BridgeError && err.type === 'conflict') return 'changed';
            throw err;
          }
        },
        read: (name) => this.readPod(name),
      },
      pod,
      this.deps.policy.poolName,
    );
  }

  /**
   * A new pod for the box. The box holds a seat, so the pool has room for it: a ResourceQuota
   * that refuses the pod anyway still counts pods that are not boxes. Unclaimed warm pods: one is
   * given up. Pods deleted a moment ago (a warm pod the operator shrank away, a box just deleted):
   * the quota controller counts them out asynchronously, seconds later under load. The create is
   * retried meanwhile (150 ms doubling, ~9.5 s), then answers 429.
   */
  private async createPod(spec: SandboxPoolSpec, shape: BoxShape, session: SessionBox, nonce: string, podDeadline?: number): Promise<k8s.V1Pod> {
    const body = buildSessionBoxPod(
      { namespace: this.deps.namespace, poolName: this.deps.policy.poolName, shape, box: spec.box, egress: spec.egress, boxdImage: this.deps.boxdImage, nonce },
      session,
    );
    const evicted = new Set<string>();
    for (let attempt = 0; ; attempt++) {
      if (podDeadline !== undefined && performance.now() > podDeadline) {
        // Past it, the operator may take the record for an orphan: the box would not keep it.
        throw new BridgeError('cluster_unavailable', 'the box could not be made in time (the cluster is slow); retry', { headers: { 'Retry-After': '2' } });
      }
      try {
        return await this.deps.call('create box pod', () => this.deps.core.createNamespacedPod({ namespace: this.deps.namespace, body }));
      } catch (err) {
        const quota = err instanceof BridgeError && err.type === 'forbidden' && /exceeded quota/i.test(err.message);
        if (!quota || attempt >= QUOTA_RETRIES) throw err;
        // Unclaimed warm pods hold no one's data: one removed at once frees its quota now (one
        // still starting too: it holds quota as much as a ready one). The
        // resource version guards against a claim through another replica a moment ago; a delete
        // it refused (the pod changed) is tried again with the version the cache sees next.
        const seen = (p: k8s.V1Pod) => `${p.metadata!.uid}@${p.metadata!.resourceVersion}`;
        const spares = this.deps.cache.spares(this.deps.policy.poolName, warmTemplateHash(spec, this.deps.boxdImage));
        const spare = spares.find((p) => !evicted.has(seen(p)));
        if (spare) {
          evicted.add(seen(spare));
          const seat = seatOf(spare);
          if ((await this.deleteQuietly(spare, 0, true)) && seat !== undefined) await this.freeLetGo([{ seat, pod: spare.metadata!.name! }]);
        }
        await new Promise((resolve) => setTimeout(resolve, 150 * 2 ** attempt));
      }
    }
  }

  /**
   * A new pod for a sleeping box (bridge/services/sleep.ts): same box id, record, session slot,
   * creation and expiry; a warm pod when the shape is the pool's warm shape, else a new one named
   * after the box (the record holds its credential, with the nonce given). A pod of the box still
   * terminating (the one put to sleep) holds the name: the create waits for it to go.
   */
  async revive(
    session: SessionBox,
    shape: BoxShape,
    env: Record<string, string>,
    nonce: string,
  ): Promise<{ pod: k8s.V1Pod; path: CreatePath }> {
    const { policy } = this.deps;
    const spec = policy.current();
    const warm = this.claimSources(spec, shape);
    // Served from memory until the watch shows it (it still shows the pod the box slept from).
    if (warm.sources.length) {
      const claim = await this.warm.claim(policy.poolName, warm.sources, { ...session, warmDemand: warm.demand }, env);
      // The box keeps the seat it slept with: seats of pods the claim let go are freed.
      await this.freeLetGo(claim.letGo);
      const claimed = claim.pod;
      if (claimed) {
        this.rememberMade(session.boxId, claimed, true);
        return { pod: claimed, path: 'warm' };
      }
      this.deps.onWarmMiss?.(claim.miss!);
    }
    try {
      const pod = await this.createNamedPod(spec, shape, session, nonce);
      this.rememberMade(session.boxId, pod, false);
      return { pod, path: 'cold' };
    } catch (err) {
      throw explainCreateError(err, this.deps.namespace, spec);
    }
  }

  /**
   * The box's new pod, named after it. Another pod may hold the name:
   * - one this very call made (an attempt whose answer was lost, the API server having made it):
   *   it carries this call's nonce, and is the box's pod;
   * - the box's own earlier pod (same record), put to sleep and still terminating: waited for;
   * - a pod of an earlier holder of the box's slot, whose record is gone (a box deleted a moment
   *   ago, or a create that answered an error although the API server made its pod): no one's,
   *   so deleted at once.
   */
  private async createNamedPod(spec: SandboxPoolSpec, shape: BoxShape, session: SessionBox, nonce: string, podDeadline?: number): Promise<k8s.V1Pod> {
    const deadline = Date.now() + REVIVE_NAME_WAIT_MS;
    for (;;) {
      try {
        return await this.createPod(spec, shape, session, nonce, podDeadline);
      } catch (err) {
        if (!(err instanceof BridgeError && err.type === 'conflict') || Date.now() > deadline) throw err;
        const holder = await this.readPod(session.boxId);
        if (holder?.metadata?.annotations?.[BOXD_NONCE_ANNOTATION] === nonce) return holder;
        const gone = holder === undefined || (recordOf(holder, session.boxId) !== session.record.uid && (await this.deleteQuietly(holder, 0)));
        if (!gone) await new Promise((resolve) => setTimeout(resolve, 250));
      }
    }
  }

  /**
   * Where a box is: the pod serving it, or its record when it has none (asleep, waking, failed).
   * From the caches first; a box neither knows is looked up with one API read (its record), then
   * waited for on the watch (made through another replica a moment ago). A box found gone is
   * remembered for a few seconds, so a client polling it costs no API call. 404 when gone or going.
   */
  async locate(id: string): Promise<{ pod: k8s.V1Pod; record?: undefined } | { record: k8s.V1Secret; pod?: undefined }> {
    if (!BOX_ID.test(id)) throw new BridgeError('invalid_request', `"${id}" is not a valid box id`);
    const podless = this.sleepingRecord(id);
    if (podless) return { record: podless };
    // A pod this replica just made (a create, a wake) wins over what a lagging watch still shows.
    const made = this.madeHere(id);
    if (made) return { pod: made };
    const cached = this.deps.cache.get(id);
    if (cached && !this.isDeleting(cached)) return this.servable(id, this.checkBox(id, cached));
    if (this.gone.has(id)) throw notFound(id);
    const record = await this.deps.records.read(id);
    if (!record || record.metadata?.deletionTimestamp || this.deleted.has(record.metadata?.uid ?? '')) {
      this.gone.add(id);
      throw notFound(id);
    }
    const state = stateOf(record);
    if (state && state !== 'pending') return { record };
    const pod = (await this.deps.cache.waitForBox(id, WATCH_WAIT_MS)) ?? (await this.readPod(id));
    if (pod && !this.isDeleting(pod) && pod.metadata?.labels?.[LABELS.boxId] === id) return this.servable(id, pod);
    // A sleep between its pod's delete and its record marked asleep: podless for a moment.
    if (state === 'pending') return { record };
    throw new BridgeError('cluster_unavailable', `box ${id} exists but its pod is not visible yet; retry`, { headers: { 'Retry-After': '1' } });
  }

  /**
   * A pod a wake made is served only once that wake committed it (docs/lifecycle.md): one still
   * marked restoring in this replica's watch is read again (one API read, only while a wake
   * runs); if it still is, the box is being woken, and the call waits for it as for any wake.
   */
  private async servable(id: string, pod: k8s.V1Pod): Promise<{ pod: k8s.V1Pod } | { record: k8s.V1Secret }> {
    if (!pod.metadata?.annotations?.[ANNOTATIONS.restoring]) return { pod };
    const fresh = await this.readPod(pod.metadata.name!);
    if (fresh && fresh.metadata?.uid === pod.metadata.uid && !fresh.metadata?.annotations?.[ANNOTATIONS.restoring] && !this.isDeleting(fresh)) return { pod: fresh };
    const record = await this.deps.records.read(id);
    if (!record || record.metadata?.deletionTimestamp) throw notFound(id);
    return { record };
  }

  /** The pod serving a box (404 when it has none: gone, or asleep). */
  async get(id: string): Promise<k8s.V1Pod> {
    const where = await this.locate(id);
    if (!where.pod) throw new BridgeError('conflict', `box ${id} has no pod now (it is ${podlessStatus(where.record).toLowerCase()})`);
    return where.pod;
  }

  async status(id: string) {
    const where = await this.locate(id);
    return where.pod ? boxStatus(where.pod, this.now()) : sleepingStatus(where.record, this.now());
  }

  /**
   * The record of a box without a pod now, from this replica's watch of records in a state:
   * asleep, being woken (its new pod not shown yet), or failed.
   */
  sleepingRecord(id: string): k8s.V1Secret | undefined {
    const record = this.deps.sleeping?.get(id);
    const state = stateOf(record);
    if (!record || !state || state === 'pending' || record.metadata?.deletionTimestamp || this.deleted.has(record.metadata?.uid ?? '')) return undefined;
    if (state === 'failed') return record;
    const pod = this.deps.cache.get(id);
    return pod && !pod.metadata?.deletionTimestamp ? undefined : (this.madeHere(id) ? undefined : record);
  }

  /**
   * Deletes a box once: the pod's delete is conditional on the resource version we saw, so a
   * second DELETE racing through another replica whose watch has not seen the first one finds
   * the pod changed, re-reads it, and answers 404. Then the record goes (the operator reaps a
   * record left behind by a failure here). A box without a pod: its record goes (its snapshot
   * stays until retention, docs/snapshots.md).
   */
  async delete(id: string) {
    const where = await this.locate(id);
    if (where.record) {
      await this.deps.records.delete(id, where.record.metadata!.uid!);
      this.remember(where.record.metadata!.uid!);
      this.gone.add(id);
      return { box_id: id, status: 'Terminated' as const, deleted_at: this.now().toISOString() };
    }
    let pod = where.pod;
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        const preconditions = { uid: pod.metadata!.uid!, resourceVersion: pod.metadata!.resourceVersion! };
        await this.deps.call('delete box pod', () =>
          this.deps.core.deleteNamespacedPod({
            name: pod.metadata!.name!,
            namespace: this.deps.namespace,
            body: { propagationPolicy: 'Background', preconditions },
          }),
        );
        this.remember(pod.metadata!.uid!);
        this.gone.add(id);
        await this.deps.records.delete(id).catch(() => undefined);
        return { box_id: id, status: 'Terminated' as const, deleted_at: this.now().toISOString() };
      } catch (err) {
        if (err instanceof BridgeError && err.type === 'not_found') throw notFound(id);
        if (!(err instanceof BridgeError && err.type === 'conflict')) throw err;
      }
      const fresh = await this.readPod(pod.metadata!.name!);
      if (!fresh || fresh.metadata?.uid !== pod.metadata!.uid || this.isDeleting(fresh)) throw notFound(id);
      pod = fresh;
    }
    throw new BridgeError('cluster_unavailable', `box ${id} kept changing while being deleted; retry`, { headers: { 'Retry-After': '1' } });
  }

  /** Boxes that count against the pool's cap (warm pods not included). */
  activeCount(): number {
    return this.deps.cache.activeCount();
  }

  /**
   * The egress proxy credential of the pod a record's box gets with this nonce (a cold pod is
   * named after its box), written wherever its boxd credential is; undefined without an egress key.
   */
  egressProxy(podName: string, nonce: string): string | undefined {
    return this.deps.egressKey ? egressProxyCredential(this.deps.egressKey, this.deps.namespace, podName, nonce) : undefined;
  }

  /** boxd's credential for a box pod (see common/boxd.ts). */
  token(pod: k8s.V1Pod): string {
    return boxdToken(this.deps.boxdKey, this.deps.namespace, pod.metadata!.name!, pod.metadata!.annotations?.[BOXD_NONCE_ANNOTATION] ?? '');
  }

  private created(pod: k8s.V1Pod) {
    const status = boxStatus(pod, this.now());
    return {
      box_id: status.box_id,
      status: status.status,
      namespace: this.deps.namespace,
      pod_name: status.pod_name,
      image: status.image,
      cpu: status.cpu,
      memory: status.memory,
      created_at: status.created_at || this.now().toISOString(),
    };
  }

  private madeWith(pod: k8s.V1Pod, keyDigest: string): boolean {
    if (pod.metadata?.labels?.[LABELS.idempotencyKey] !== keyDigest || this.isDeleting(pod)) return false;
    const created = boxStatus(pod).created_at;
    return this.now().getTime() - (created ? Date.parse(created) : 0) < IDEMPOTENCY_WINDOW_MS;
  }

  /** Whether this replica made the pod and saw its agent answer (a claimed warm pod): no probe needed. */
  answering(pod: k8s.V1Pod): boolean {
    const made = this.justMade.get(boxIdOf(pod) ?? '');
    return made?.answering === true && made.pod.metadata?.uid === pod.metadata?.uid;
  }

  private rememberMade(boxId: string, pod: k8s.V1Pod, answering: boolean): void {
    if (this.justMade.size >= JUST_MADE_MAX) this.justMade.delete(this.justMade.keys().next().value!);
    this.justMade.set(boxId, { pod, at: performance.now(), answering });
    this.gone.delete(boxId);
  }

  /** The pod this replica just made for the box, until its watch shows it (from then on the cache is the truth). */
  private madeHere(id: string): k8s.V1Pod | undefined {
    const made = this.justMade.get(id);
    if (!made) return undefined;
    made.seen ||= this.deps.cache.pod(made.pod.metadata!.name!)?.metadata?.uid === made.pod.metadata?.uid;
    if (made.seen || performance.now() - made.at > JUST_MADE_MS || this.isDeleting(made.pod)) return undefined;
    return made.pod;
  }

  private isDeleting(pod: k8s.V1Pod): boolean {
    return Boolean(pod.metadata?.deletionTimestamp) || this.deleted.has(pod.metadata?.uid ?? '');
  }

  private remember(uid: string): void {
    if (this.deleted.size >= RECENT_DELETES) this.deleted.delete(this.deleted.values().next().value!);
    this.deleted.add(uid);
  }

  /** A pod of the namespace by name, from the API server (not the cache); undefined when absent. */
  async readPod(name: string): Promise<k8s.V1Pod | undefined> {
    try {
      return await this.deps.call('read box pod', () => this.deps.core.readNamespacedPod({ name, namespace: this.deps.namespace }));
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'not_found') return undefined;
      throw err;
    }
  }

  /** A cached pod is the box's only while it carries no warm label (a pod named like a box id that is warm is none). */
  private checkBox(id: string, pod: k8s.V1Pod): k8s.V1Pod {
    if (pod.metadata?.labels?.[LABELS.box] !== 'true' || pod.metadata?.labels?.[LABELS.warm]) throw notFound(id);
    return pod;
  }

  /** True when the pod is deleted or gone; errors are swallowed (false). */
  private async deleteQuietly(pod: k8s.V1Pod, gracePeriodSeconds?: number, unchanged = false): Promise<boolean> {
    const { name, uid, resourceVersion } = pod.metadata!;
    try {
      await this.deps.core.deleteNamespacedPod({
        name: name!,
        namespace: this.deps.namespace,
        // In the body: the API server ignores query options when a DELETE has a body.
        body: {
          ...(gracePeriodSeconds !== undefined ? { gracePeriodSeconds } : {}),
          preconditions: { uid: uid!, ...(unchanged ? { resourceVersion: resourceVersion! } : {}) },
        },
      });
      return true;
    } catch (err) {
      return isNotFound(err);
    }
  }
}

/** A key names a box only within its session, and is stored as a digest (a label value). */
function digestKey(sessionId: string, key: string): string {
  return createHash('sha256').update(sessionId).update('\0').update(key).digest('hex').slice(0, 32);
}

function notFound(id: string): BridgeError {
  return new BridgeError('not_found', `box ${id} not found`);
}

function quotaExceeded(message: string): BridgeError {
  return new BridgeError('quota_exceeded', message, { headers: { 'Retry-After': '30' } });
}

/** Image, runtime class and service account must be the pool's default or on its allowlists. */
export function checkAllowed(spec: SandboxPoolSpec, image: string, runtimeClassName?: string, serviceAccountName?: string): void {
  if (image !== spec.box.defaultImage && !spec.allowedImages.some((pattern) => matches(pattern, image))) {
    throw new BridgeError('forbidden', `image "${image}" is not allowed by the pool policy (allowedImages)`);
  }
  if (runtimeClassName && !spec.allowedRuntimeClassNames.includes(runtimeClassName)) {
    throw new BridgeError('forbidden', `runtimeClassName "${runtimeClassName}" is not allowed by the pool policy (allowedRuntimeClassNames)`);
  }
  if (serviceAccountName && !spec.allowedServiceAccountNames.includes(serviceAccountName)) {
    throw new BridgeError(
      'forbidden',
      `serviceAccountName "${serviceAccountName}" is not allowed by the pool policy (allowedServiceAccountNames)`,
    );
  }
}

/** An allowlist entry is an exact image or a prefix ending in "*" ("registry.example.com/tools/*"). */
function matches(pattern: string, image: string): boolean {
  return pattern.endsWith('*') ? image.startsWith(pattern.slice(0, -1)) : pattern === image;
}

/** Requested (or default) cpu cores and memory bytes, checked against the pool maxima. */
export function resources(spec: SandboxPoolSpec, req: Pick<CreateBoxRequest, 'cpu' | 'memory'>) {
  const cpuCores = req.cpu ?? parseQuantity(spec.box.defaultCpu);
  const memoryBytes = req.memory !== undefined ? req.memory * MiB : parseQuantity(spec.box.defaultMemory);
  const maxCpu = parseQuantity(spec.box.maxCpu);
  const maxMemory = parseQuantity(spec.box.maxMemory);
  if (cpuCores < 0.001) throw new BridgeError('invalid_request', 'cpu must be at least 0.001 cores');
  if (cpuCores > maxCpu) throw new BridgeError('invalid_request', `cpu ${cpuCores} exceeds the maximum of ${spec.box.maxCpu} cores`);
  if (memoryBytes > maxMemory) {
    throw new BridgeError('invalid_request', `memory ${Math.round(memoryBytes / MiB)} MiB exceeds the maximum of ${spec.box.maxMemory}`);
  }
  return { cpuCores, memoryBytes };
}

function explainCreateError(err: unknown, namespace: string, spec: SandboxPoolSpec): unknown {
  if (!(err instanceof BridgeError)) return err;
  if (err.type === 'forbidden' && /exceeded quota/i.test(err.message)) {
    return quotaExceeded(`the pool is at its limit of ${spec.maxBoxes} boxes (ResourceQuota in ${namespace})`);
  }
  if (err.type === 'not_found') {
    return new BridgeError('cluster_unavailable', `sandbox namespace "${namespace}" does not exist: is the operator running and the SandboxPool created?`);
  }
  return err;
}
