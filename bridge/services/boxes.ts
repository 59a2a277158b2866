// Box lifecycle: create (policy checks, per-session slots, global cap), look up, delete.
// Free of Express types; reads come from the cache, writes go to the API server.
import type * as k8s from '@kubernetes/client-node';
import { BridgeError } from '../../common/errors.js';
import { LABELS, boxName, sessionHash } from '../../common/labels.js';
import type { SandboxPoolSpec } from '../../common/pool.js';
import { parseQuantity } from '../../common/quantity.js';
import { boxStatus, buildBoxPod } from '../box-pod.js';
import type { BoxReader } from '../kube/box-cache.js';
import type { KubeCall } from '../kube/instrument.js';
import type { PolicySource } from '../kube/policy.js';
import type { CreateBoxRequest } from '../schemas.js';
import type { EnvStore } from './env-store.js';

const MiB = 1024 * 1024;
const BOX_ID = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

export interface BoxServiceDeps {
  core: k8s.CoreV1Api;
  call: KubeCall;
  cache: BoxReader;
  policy: PolicySource;
  env: EnvStore;
  namespace: string;
  namePrefix: string;
  onCreated?: () => void;
  now?: () => Date;
}

export class BoxService {
  private readonly now: () => Date;

  constructor(private readonly deps: BoxServiceDeps) {
    this.now = deps.now ?? (() => new Date());
  }

  async create(req: CreateBoxRequest) {
    const { cache, policy, namespace } = this.deps;
    const spec = policy.current();
    const image = req.image ?? spec.box.defaultImage;
    checkAllowed(spec, image, req.runtimeClassName, req.serviceAccountName);
    const { cpuCores, memoryBytes } = resources(spec, req);

    const hash = sessionHash(req.sessionId);
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
        ...(req.runtimeClassName ? { runtimeClassName: req.runtimeClassName } : {}),
        ...(req.serviceAccountName ? { serviceAccountName: req.serviceAccountName } : {}),
      });
      let pod: k8s.V1Pod;
      try {
        pod = await this.deps.call('create box pod', () => this.deps.core.createNamespacedPod({ namespace, body }));
      } catch (err) {
        if (err instanceof BridgeError && err.type === 'conflict') continue;
        throw explainCreateError(err, namespace, spec);
      }
      this.deps.onCreated?.();
      if (req.env && Object.keys(req.env).length > 0) {
        try {
          await this.deps.env.merge(pod, req.env);
        } catch (err) {
          await this.deleteQuietly(name);
          throw err;
        }
      }
      const status = boxStatus(pod, this.now());
      return {
        box_id: name,
        status: status.status,
        namespace,
        pod_name: name,
        image,
        cpu: status.cpu,
        memory: status.memory,
        created_at: status.created_at || this.now().toISOString(),
      };
    }
    throw quotaExceeded(`session already has ${spec.maxBoxesPerSession} boxes; the limit per session is ${spec.maxBoxesPerSession}`);
  }

  /** The box pod: from the cache, or (just created through another replica) from the API server. */
  async get(id: string): Promise<k8s.V1Pod> {
    if (!BOX_ID.test(id)) throw new BridgeError('invalid_request', `"${id}" is not a valid box id`);
    const cached = this.deps.cache.get(id);
    if (cached) return cached;
    const pod = await this.deps.call('read box pod', () =>
      this.deps.core.readNamespacedPod({ name: id, namespace: this.deps.namespace }),
    ).catch((err: unknown) => {
      if (err instanceof BridgeError && err.type === 'not_found') throw notFound(id);
      throw err;
    });
    if (pod.metadata?.labels?.[LABELS.box] !== 'true') throw notFound(id);
    return pod;
  }

  async status(id: string) {
    return boxStatus(await this.get(id), this.now());
  }

  async delete(id: string) {
    await this.get(id);
    try {
      await this.deps.call('delete box pod', () =>
        this.deps.core.deleteNamespacedPod({ name: id, namespace: this.deps.namespace, propagationPolicy: 'Background' }),
      );
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'not_found') throw notFound(id);
      throw err;
    }
    return { box_id: id, status: 'Terminated' as const, deleted_at: this.now().toISOString() };
  }

  private async deleteQuietly(name: string): Promise<void> {
    await this.deps.core.deleteNamespacedPod({ name, namespace: this.deps.namespace }).catch(() => undefined);
  }
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
