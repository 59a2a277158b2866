// A box's Secret `<box>-secret`: boxd's credential and the durable copy of the box's env (one
// JSON object), owned by the box pod so it is garbage-collected with it. Every read and write
// checks the owner UID: a Secret left behind by an earlier box of the same name is never used
// as this box's. Values never appear in the pod spec, in responses or in logs.
import type * as k8s from '@kubernetes/client-node';
import { BOX_SECRET_KEYS } from '../../common/boxd.js';
import { BridgeError } from '../../common/errors.js';
import { LABELS, MANAGED_BY, boxSecretName } from '../../common/labels.js';
import type { KubeCall } from './instrument.js';

/** Kubernetes caps a Secret at 1 MiB; keep clear of it. */
export const MAX_ENV_BYTES = 900 * 1024;
const MAX_ATTEMPTS = 5;

export class BoxSecrets {
  constructor(
    private readonly core: k8s.CoreV1Api,
    private readonly call: KubeCall,
    private readonly namespace: string,
  ) {}

  /** Creates the Secret of a just-created box; replaces a stale one left by a predecessor. */
  async create(pod: k8s.V1Pod, token: string, env: Record<string, string>): Promise<void> {
    checkSize(env);
    const body = this.secretFor(pod, token, env);
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      try {
        await this.call('create box secret', () => this.core.createNamespacedSecret({ namespace: this.namespace, body }));
        return;
      } catch (err) {
        if (!(err instanceof BridgeError && err.type === 'conflict')) throw err;
      }
      const existing = await this.read(body.metadata!.name!);
      if (existing && ownerUid(existing) === pod.metadata!.uid) return;
      if (existing) await this.deleteStale(existing);
    }
    throw new BridgeError('cluster_unavailable', `could not create the Secret of box ${pod.metadata!.name}; retry`, { headers: { 'Retry-After': '1' } });
  }

  /**
   * Merges vars into the box's durable env and returns how many variables are now set.
   * Optimistic concurrency: a concurrent writer makes us re-read and retry.
   */
  async mergeEnv(pod: k8s.V1Pod, vars: Record<string, string>): Promise<number> {
    const name = boxSecretName(pod.metadata!.name!);
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      const existing = await this.read(name);
      if (!existing || ownerUid(existing) !== pod.metadata!.uid) {
        throw new BridgeError('conflict', `box ${pod.metadata!.name} has no Secret of its own (it is being replaced or deleted); create a new box`);
      }
      const merged = { ...envOf(existing), ...vars };
      checkSize(merged);
      try {
        await this.call('update box secret', () =>
          this.core.replaceNamespacedSecret({
            name,
            namespace: this.namespace,
            body: { ...existing, data: { ...existing.data, [BOX_SECRET_KEYS.env]: encode(JSON.stringify(merged)) } },
          }),
        );
        return Object.keys(merged).length;
      } catch (err) {
        if (err instanceof BridgeError && err.type === 'conflict') continue; // lost a race; reread
        throw err;
      }
    }
    throw new BridgeError('cluster_unavailable', `could not update the environment of box ${pod.metadata!.name}: too many concurrent updates; retry`, {
      headers: { 'Retry-After': '1' },
    });
  }

  /** The box's durable env (for a snapshot); never logged or returned by the API. */
  async readEnv(pod: k8s.V1Pod): Promise<Record<string, string>> {
    const existing = await this.read(boxSecretName(pod.metadata!.name!));
    if (!existing || ownerUid(existing) !== pod.metadata!.uid) {
      throw new BridgeError('conflict', `box ${pod.metadata!.name} has no Secret of its own (it is being replaced or deleted); create a new box`);
    }
    return envOf(existing);
  }

  private async read(name: string): Promise<k8s.V1Secret | undefined> {
    try {
      return await this.call('read box secret', () => this.core.readNamespacedSecret({ name, namespace: this.namespace }));
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'not_found') return undefined;
      throw err;
    }
  }

  private async deleteStale(secret: k8s.V1Secret): Promise<void> {
    await this.call('delete stale box secret', () =>
      this.core.deleteNamespacedSecret({
        name: secret.metadata!.name!,
        namespace: this.namespace,
        body: { preconditions: { uid: secret.metadata!.uid! } },
      }),
    ).catch((err: unknown) => {
      if (!(err instanceof BridgeError && (err.type === 'not_found' || err.type === 'conflict'))) throw err;
    });
  }

  private secretFor(pod: k8s.V1Pod, token: string, env: Record<string, string>): k8s.V1Secret {
    const name = pod.metadata!.name!;
    return {
      apiVersion: 'v1',
      kind: 'Secret',
      type: 'Opaque',
      metadata: {
        name: boxSecretName(name),
        namespace: this.namespace,
        labels: {
          [LABELS.box]: 'true',
          [LABELS.managedBy]: MANAGED_BY,
          [LABELS.component]: 'box-secret',
          ...(pod.metadata?.labels?.[LABELS.pool] ? { [LABELS.pool]: pod.metadata.labels[LABELS.pool] } : {}),
        },
        ownerReferences: [{ apiVersion: 'v1', kind: 'Pod', name, uid: pod.metadata!.uid!, blockOwnerDeletion: false }],
      },
      data: { [BOX_SECRET_KEYS.token]: encode(token), [BOX_SECRET_KEYS.env]: encode(JSON.stringify(env)) },
    };
  }
}

function ownerUid(secret: k8s.V1Secret): string | undefined {
  return secret.metadata?.ownerReferences?.find((o) => o.kind === 'Pod')?.uid;
}

function envOf(secret: k8s.V1Secret): Record<string, string> {
  const raw = secret.data?.[BOX_SECRET_KEYS.env];
  if (!raw) return {};
  try {
    return JSON.parse(Buffer.from(raw, 'base64').toString('utf8')) as Record<string, string>;
  } catch {
    return {};
  }
}

function encode(text: string): string {
  return Buffer.from(text, 'utf8').toString('base64');
}

export function checkSize(vars: Record<string, string>): void {
  let bytes = 0;
  for (const [k, v] of Object.entries(vars)) bytes += k.length + Buffer.byteLength(v);
  if (bytes > MAX_ENV_BYTES) {
    throw new BridgeError('payload_too_large', `environment variables total ${bytes} bytes; the limit is ${MAX_ENV_BYTES}`);
  }
}
