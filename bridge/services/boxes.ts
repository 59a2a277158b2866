// Box lifecycle: create (policy checks, per-session slots, global cap, idempotency keys), look
// up, delete. Free of Express types; reads come from the cache, writes go to the API server.
import { createHash } from 'node:crypto';
import type * as k8s from '@kubernetes/client-node';
import { boxdToken } from '../../common/boxd.js';
import { BridgeError } from '../../common/errors.js';
import { LABELS, boxName, sessionHash } from '../../common/labels.js';
import type { SandboxPoolSpec } from '../../common/pool.js';
import { parseQuantity } from '../../common/quantity.js';
import { boxStatus, buildBoxPod } from '../box-pod.js';
import type { BoxReader } from '../kube/box-cache.js';
import type { BoxSecrets } from '../kube/box-secrets.js';
import type { KubeCall } from '../kube/instrument.js';
import type { PolicySource } from '../kube/policy.js';
import { BOX_ID, type CreateBoxRequest } from '../schemas.js';

const MiB = 1024 * 1024;
/** An Idempotency-Key names the same box for this long (DESIGN.md). */
const IDEMPOTENCY_WINDOW_MS = 24 * 3600 * 1000;
/** Deletes this replica sent recently, by pod UID: answered 404 before the watch shows them. */
const RECENT_DELETES = 10_000;

export interface BoxServiceDeps {
  core: k8s.CoreV1Api;
  call: KubeCall;
  cache: BoxReader;
  policy: PolicySource;
  secrets: BoxSecrets;
  /** The key box credentials are derived from (common/boxd.ts). */
  boxdKey: Buffer;
  boxdImage: string;
  namespace: string;
  namePrefix: string;
  onCreated?: () => void;
  now?: () => Date;
}

export class BoxService {
  private readonly now: () => Date;
  private readonly deleted = new Set<string>();

  constructor(private readonly deps: BoxServiceDeps) {
    this.now = deps.now ?? (() => new Date());
  }

  /** Creates a box; with an idempotency key, a repeated request answers with the box the first one made. */
  async create(req: CreateBoxRequest, idempotencyKey?: string) {
    const { cache, policy, namespace } = this.deps;
    const spec = policy.current();
    const image = req.image ?? spec.box.defaultImage;
    checkAllowed(spec, image, req.runtimeClassName, req.serviceAccountName);
    const { cpuCores, memoryBytes } = resources(spec, req);

    const hash = sessionHash(req.sessionId);
    const keyDigest = idempotencyKey === undefined ? undefined : digestKey(req.sessionId, idempotencyKey);
    if (keyDigest) {
      const earlier = cache.sessionBoxes(hash).find((p) => this.madeWith(p, keyDigest));
      if (earlier) return this.created(earlier);
    }
    const taken = new Set(cache.sessionBoxes(hash).map((p) => p.metadata?.name));
    if (taken.size >= spec.maxBoxesPerSession) {
      throw quotaExceeded(`session already has ${taken.size} boxes; the limit per session is ${spec.maxBoxesPerSession}`);
    }
    if (cache.activeCount() >= spec.maxBoxes) {
      throw quotaExceeded(`the pool is at its limit of ${spec.maxBoxes} boxes`);
    }

    // Slot names are deterministic, so two replicas racing for one slot collide on the name
    // and the API server lets exactly one win; the loser moves on to the next free slot.
    for (let slot = 0; slot < spec.maxBoxesPerSession; slot++) {
      const name = boxName(this.deps.namePrefix, req.sessionId, slot);
      if (taken.has(name)) continue;
      const body = buildBoxPod({
        name,
        namespace,
        poolName: policy.poolName,
        sessionId: req.sessionId,
        slot,
        image,
        cpuCores,
        memoryBytes,
        ttlSeconds: spec.defaultTtlSeconds,
        now: this.now(),
        box: spec.box,
        boxdImage: this.deps.boxdImage,
        ...(keyDigest ? { idempotencyKey: keyDigest } : {}),
        ...(req.runtimeClassName ? { runtimeClassName: req.runtimeClassName } : {}),
        ...(req.serviceAccountName ? { serviceAccountName: req.serviceAccountName } : {}),
      });
      let pod: k8s.V1Pod;
      try {
        pod = await this.deps.call('create box pod', () => this.deps.core.createNamespacedPod({ namespace, body }));
      } catch (err) {
        if (err instanceof BridgeError && err.type === 'conflict') {
          // The same key racing through another replica lands on the same slot first.
          const winner = keyDigest ? await this.readPod(name) : undefined;
          if (winner && this.madeWith(winner, keyDigest!)) return this.created(winner);
          continue;
        }
        throw explainCreateError(err, namespace, spec);
      }
      this.deps.onCreated?.();
      try {
        await this.deps.secrets.create(pod, this.token(pod), req.env ?? {});
      } catch (err) {
        await this.deleteQuietly(pod);
        throw err;
      }
      return this.created(pod);
    }
    throw quotaExceeded(`session already has ${spec.maxBoxesPerSession} boxes; the limit per session is ${spec.maxBoxesPerSession}`);
  }

  /**
   * The box pod: from the cache, or (just created through another replica) from the API server.
   * A box that is being deleted is gone for every route (404).
   */
  async get(id: string): Promise<k8s.V1Pod> {
    if (!BOX_ID.test(id)) throw new BridgeError('invalid_request', `"${id}" is not a valid box id`);
    const pod = this.deps.cache.get(id) ?? (await this.readPod(id));
    if (!pod || pod.metadata?.labels?.[LABELS.box] !== 'true' || this.isDeleting(pod)) throw notFound(id);
    return pod;
  }

  async status(id: string) {
    return boxStatus(await this.get(id), this.now());
  }

  /**
   * Deletes a box once: the delete is conditional on the resource version we saw, so a second
   * DELETE racing through another replica whose watch has not seen the first one finds the
   * pod changed, re-reads it, and answers 404.
   */
  async delete(id: string) {
    let pod = await this.get(id);
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        const preconditions = { uid: pod.metadata!.uid!, resourceVersion: pod.metadata!.resourceVersion! };
        await this.deps.call('delete box pod', () =>
          this.deps.core.deleteNamespacedPod({ name: id, namespace: this.deps.namespace, propagationPolicy: 'Background', body: { preconditions } }),
        );
        this.remember(pod.metadata!.uid!);
        return { box_id: id, status: 'Terminated' as const, deleted_at: this.now().toISOString() };
      } catch (err) {
        if (err instanceof BridgeError && err.type === 'not_found') throw notFound(id);
        if (!(err instanceof BridgeError && err.type === 'conflict')) throw err;
      }
      const fresh = await this.readPod(id);
      if (!fresh || fresh.metadata?.uid !== pod.metadata!.uid || this.isDeleting(fresh)) throw notFound(id);
      pod = fresh;
    }
    throw new BridgeError('cluster_unavailable', `box ${id} kept changing while being deleted; retry`, { headers: { 'Retry-After': '1' } });
  }

  /** boxd's credential for this box (see common/boxd.ts). */
  token(pod: k8s.V1Pod): string {
    return boxdToken(this.deps.boxdKey, this.deps.namespace, pod.metadata!.name!, pod.metadata!.uid!);
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
    const created = pod.metadata?.creationTimestamp ? new Date(pod.metadata.creationTimestamp).getTime() : 0;
    return this.now().getTime() - created < IDEMPOTENCY_WINDOW_MS;
  }

  private isDeleting(pod: k8s.V1Pod): boolean {
    return Boolean(pod.metadata?.deletionTimestamp) || this.deleted.has(pod.metadata?.uid ?? '');
  }

  private remember(uid: string): void {
    if (this.deleted.size >= RECENT_DELETES) this.deleted.delete(this.deleted.values().next().value!);
    this.deleted.add(uid);
  }

  private async readPod(name: string): Promise<k8s.V1Pod | undefined> {
    try {
      return await this.deps.call('read box pod', () => this.deps.core.readNamespacedPod({ name, namespace: this.deps.namespace }));
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'not_found') return undefined;
      throw err;
    }
  }

  private async deleteQuietly(pod: k8s.V1Pod): Promise<void> {
    const { name, uid } = pod.metadata!;
    await this.deps.core
      .deleteNamespacedPod({ name: name!, namespace: this.deps.namespace, body: { preconditions: { uid: uid! } } })
      .catch(() => undefined);
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
