// A box's record: a Secret named after the box id. Creating it takes the session's slot
// atomically (two replicas racing for a slot collide on the name, whether the box then gets a
// new pod or claims a warm one). It holds the durable copy of the box's env, and a cold pod's
// credential; the box's pod is its dependent, so deleting the record takes the pod along.
// Values never appear in the pod spec, in responses or in logs.
import * as k8s from '@kubernetes/client-node';
import { BOX_SECRET_KEYS } from './boxd.js';
import { buildBoxSecret } from './box-pod.js';
import { EGRESS_PROXY_KEY } from './egress-proxy.js';
import { BridgeError } from './errors.js';
import type { KubeCall } from './kube.js';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS, boxRecordName, sessionHash } from './labels.js';

/** Kubernetes caps a Secret at 1 MiB; keep clear of it. */
export const MAX_ENV_BYTES = 900 * 1024;
const MAX_ATTEMPTS = 5;

/**
 * A record without a pod is a create in flight, until it is not. A create makes its box's pod
 * (or claims one) within CREATE_POD_DEADLINE_MS of writing the record, or gives up (503) and
 * deletes the record (bridge/services/boxes.ts); the operator's reaper leaves a record without a
 * pod alone for RECORD_ORPHAN_GRACE_MS (operator/reaper.ts): that bound plus a Kubernetes call's
 * timeout and its watch's lag. Before, the reaper's grace for Secrets (30 s; 5 s in tests) judged
 * alone, and a create slowed by a loaded API server could lose its record mid-way: its seat went
 * with it (another box took it: 16 boxes answered in a pool of 12), and the pod it then made
 * belonged to a deleted record.
 */
export const CREATE_POD_DEADLINE_MS = 60_000;
export const RECORD_ORPHAN_GRACE_MS = 120_000;

export interface NewRecord {
  boxId: string;
  poolName: string;
  sessionId: string;
  slot: number;
  /** The credential of a cold pod that will mount this record; empty when a warm pod is claimed. */
  token: string;
  /** That pod's egress proxy credential (common/egress-proxy.ts); none without an egress key. */
  egressProxy?: string | undefined;
  env: Record<string, string>;
  idempotencyKey?: string | undefined;
  /** More annotations for the record (the box's egress allow list, common/box-egress.ts). */
  annotations?: Record<string, string>;
}

/** What a compare-and-swap of a record changes (null removes a label or annotation). */
export interface RecordChange {
  labels?: Record<string, string | null>;
  annotations?: Record<string, string | null>;
  token?: string;
  /** With token: the new pod's egress proxy credential (null removes one a pod of an earlier nonce had). */
  egressProxy?: string | null;
}

export class BoxRecords {
  constructor(
    private readonly core: k8s.CoreV1Api,
    private readonly call: KubeCall,
    private readonly namespace: string,
  ) {}

  /** Takes the slot: resolves with the record, or undefined when the slot is taken. */
  async create(r: NewRecord): Promise<k8s.V1Secret | undefined> {
    checkSize(r.env);
    const body = buildBoxSecret({
      name: boxRecordName(r.boxId),
      namespace: this.namespace,
      poolName: r.poolName,
      component: SECRET_COMPONENTS.record,
      token: r.token,
      egressProxy: r.egressProxy,
      env: r.env,
      labels: {
        [LABELS.session]: sessionHash(r.sessionId),
        [LABELS.slot]: String(r.slot),
        ...(r.idempotencyKey ? { [LABELS.idempotencyKey]: r.idempotencyKey } : {}),
      },
      annotations: { ...r.annotations, [ANNOTATIONS.sessionId]: r.sessionId },
    });
    try {
      return await this.call('create box record', () => this.core.createNamespacedSecret({ namespace: this.namespace, body }));
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'conflict') return undefined;
      throw err;
    }
  }

  async read(boxId: string): Promise<k8s.V1Secret | undefined> {
    try {
      return await this.call('read box record', () => this.core.readNamespacedSecret({ name: boxRecordName(boxId), namespace: this.namespace }));
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'not_found') return undefined;
      throw err;
    }
  }

  /** Deletes the record (and so, by garbage collection, a pod still attached); absent is fine. */
  async delete(boxId: string, uid?: string): Promise<void> {
    await this.call('delete box record', () =>
      this.core.deleteNamespacedSecret({
        name: boxRecordName(boxId),
        namespace: this.namespace,
        // Options in the body: the API server ignores query options when a DELETE has a body.
        body: { propagationPolicy: 'Background', ...(uid ? { preconditions: { uid } } : {}) },
      }),
    ).catch((err: unknown) => {
      if (!(err instanceof BridgeError && (err.type === 'not_found' || err.type === 'conflict'))) throw err;
    });
  }

  /**
   * A compare-and-swap on the record's labels and annotations (null removes one), and with
   * `token` its credential (`egressProxy` its proxy credential): a merge patch carrying the resource version last read, so it fails
   * when anything changed the record since. Resolves with the record, or undefined when it lost.
   */
  async swap(record: k8s.V1Secret, change: RecordChange): Promise<k8s.V1Secret | undefined> {
    try {
      return await this.call('update box record', () =>
        this.core.patchNamespacedSecret(
          {
            name: record.metadata!.name!,
            namespace: this.namespace,
            body: {
              metadata: { resourceVersion: record.metadata!.resourceVersion, labels: change.labels, annotations: change.annotations },
              ...(change.token !== undefined || change.egressProxy !== undefined ? { data: dataOf(change) } : {}),
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

  /**
   * Sets annotations on the box's record (a compare-and-swap, tried again after a concurrent
   * change: a lease's writes survive ours, common/box-lease.ts). Resolves with the record as
   * written; 404 when the box has no record (or it is being deleted).
   */
  async annotate(boxId: string, annotations: Record<string, string | null>): Promise<k8s.V1Secret> {
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      const existing = await this.read(boxId);
      if (!existing || existing.metadata?.deletionTimestamp || existing.metadata?.labels?.[LABELS.component] !== SECRET_COMPONENTS.record) {
        throw new BridgeError('not_found', `box ${boxId} not found`);
      }
      const written = await this.swap(existing, { annotations });
      if (written) return written;
    }
    throw new BridgeError('cluster_unavailable', `could not update box ${boxId}: too many concurrent updates; retry`, { headers: { 'Retry-After': '1' } });
  }

  /** The box's durable env (for a snapshot), from the record the pod belongs to; never logged or returned by the API. */
  async readEnv(pod: k8s.V1Pod, boxId: string): Promise<Record<string, string>> {
    return envOf(await this.readOwn(pod, boxId));
  }

  /** The record the pod belongs to (its owner, by UID), read now; 409 when it has none of its own. */
  async readOwn(pod: k8s.V1Pod, boxId: string): Promise<k8s.V1Secret> {
    const existing = await this.read(boxId);
    if (!existing || existing.metadata?.uid !== recordOf(pod, boxId)) {
      throw new BridgeError('conflict', `box ${boxId} has no record of its own (it is being replaced or deleted); create a new box`);
    }
    return existing;
  }

  /**
   * Merges vars into the box's durable env and returns how many variables are now set. Only
   * the record the pod belongs to (its owner, by UID) is used. Optimistic concurrency: a
   * concurrent writer makes us re-read and retry.
   */
  async mergeEnv(pod: k8s.V1Pod, boxId: string, vars: Record<string, string>): Promise<number> {
    const owner = recordOf(pod, boxId);
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      const existing = await this.read(boxId);
      if (!existing || existing.metadata?.uid !== owner) {
        throw new BridgeError('conflict', `box ${boxId} has no record of its own (it is being replaced or deleted); create a new box`);
      }
      const merged = { ...envOf(existing), ...vars };
      checkSize(merged);
      try {
        await this.call('update box record', () =>
          this.core.replaceNamespacedSecret({
            name: boxRecordName(boxId),
            namespace: this.namespace,
            body: { ...existing, data: { ...existing.data, [BOX_SECRET_KEYS.env]: Buffer.from(JSON.stringify(merged), 'utf8').toString('base64') } },
          }),
        );
        return Object.keys(merged).length;
      } catch (err) {
        if (err instanceof BridgeError && err.type === 'conflict') continue; // lost a race; reread
        throw err;
      }
    }
    throw new BridgeError('cluster_unavailable', `could not update the environment of box ${boxId}: too many concurrent updates; retry`, {
      headers: { 'Retry-After': '1' },
    });
  }
}

/** The credentials a change writes into the record's data (base64, as the API wants it). */
function dataOf(change: RecordChange): Record<string, string | null> {
  const data: Record<string, string | null> = {};
  if (change.token !== undefined) data[BOX_SECRET_KEYS.token] = Buffer.from(change.token, 'utf8').toString('base64');
  if (change.egressProxy !== undefined) data[EGRESS_PROXY_KEY] = change.egressProxy === null ? null : Buffer.from(change.egressProxy, 'utf8').toString('base64');
  return data;
}

/** The UID of the record a box pod belongs to (its owner reference). */
export function recordOf(pod: k8s.V1Pod, boxId: string): string | undefined {
  return pod.metadata?.ownerReferences?.find((o) => o.kind === 'Secret' && o.name === boxRecordName(boxId))?.uid;
}

export function envOf(secret: k8s.V1Secret): Record<string, string> {
  const raw = secret.data?.[BOX_SECRET_KEYS.env];
  if (!raw) return {};
  try {
    return JSON.parse(Buffer.from(raw, 'base64').toString('utf8')) as Record<string, string>;
  } catch {
    return {};
  }
}

export function checkSize(vars: Record<string, string>): void {
  let bytes = 0;
  for (const [k, v] of Object.entries(vars)) bytes += k.length + Buffer.byteLength(v);
  if (bytes > MAX_ENV_BYTES) {
    throw new BridgeError('payload_too_large', `environment variables total ${bytes} bytes; the limit is ${MAX_ENV_BYTES}`);
  }
}
