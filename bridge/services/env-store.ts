// A box's environment variables live in a Secret `<box>-env` owned by the box pod (garbage
// collected with it). Values never appear in the pod spec, in responses or in logs.
import type * as k8s from '@kubernetes/client-node';
import { BridgeError } from '../../common/errors.js';
import { LABELS, MANAGED_BY, envSecretName } from '../../common/labels.js';
import type { KubeCall } from '../kube/instrument.js';

/** Kubernetes caps a Secret at 1 MiB; keep clear of it. */
export const MAX_ENV_BYTES = 900 * 1024;

export class EnvStore {
  constructor(
    private readonly core: k8s.CoreV1Api,
    private readonly call: KubeCall,
    private readonly namespace: string,
  ) {}

  /** The box's variables; empty when it has none. */
  async read(boxId: string): Promise<Record<string, string>> {
    try {
      const secret = await this.call('read env secret', () =>
        this.core.readNamespacedSecret({ name: envSecretName(boxId), namespace: this.namespace }),
      );
      return decode(secret.data);
    } catch (err) {
      if (err instanceof BridgeError && err.type === 'not_found') return {};
      throw err;
    }
  }

  /**
   * Merges vars into the box's Secret (creating it on first use) and returns how many
   * variables are now set. Optimistic concurrency: a concurrent writer makes us retry.
   */
  async merge(pod: k8s.V1Pod, vars: Record<string, string>): Promise<number> {
    const name = envSecretName(pod.metadata!.name!);
    for (let attempt = 0; attempt < 5; attempt++) {
      let existing: k8s.V1Secret | undefined;
      try {
        existing = await this.call('read env secret', () => this.core.readNamespacedSecret({ name, namespace: this.namespace }));
      } catch (err) {
        if (!(err instanceof BridgeError && err.type === 'not_found')) throw err;
      }
      const merged = { ...decode(existing?.data), ...vars };
      checkSize(merged);
      try {
        if (existing) {
          await this.call('update env secret', () =>
            this.core.replaceNamespacedSecret({
              name,
              namespace: this.namespace,
              body: { ...existing, data: encode(merged) },
            }),
          );
        } else {
          await this.call('create env secret', () =>
            this.core.createNamespacedSecret({ namespace: this.namespace, body: this.secretFor(pod, merged) }),
          );
        }
        return Object.keys(merged).length;
      } catch (err) {
        if (err instanceof BridgeError && err.type === 'conflict') continue; // lost a race; reread
        throw err;
      }
    }
    throw new BridgeError('cluster_unavailable', `could not update the environment of box ${pod.metadata!.name}: too many concurrent updates; retry`);
  }

  private secretFor(pod: k8s.V1Pod, vars: Record<string, string>): k8s.V1Secret {
    return {
      apiVersion: 'v1',
      kind: 'Secret',
      type: 'Opaque',
      metadata: {
        name: envSecretName(pod.metadata!.name!),
        namespace: this.namespace,
        labels: {
          [LABELS.box]: 'true',
          [LABELS.managedBy]: MANAGED_BY,
          [LABELS.component]: 'box-env',
          ...(pod.metadata?.labels?.[LABELS.pool] ? { [LABELS.pool]: pod.metadata.labels[LABELS.pool] } : {}),
        },
        ownerReferences: [
          { apiVersion: 'v1', kind: 'Pod', name: pod.metadata!.name!, uid: pod.metadata!.uid!, blockOwnerDeletion: false },
        ],
      },
      data: encode(vars),
    };
  }
}

function decode(data: Record<string, string> | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(data ?? {})) out[k] = Buffer.from(v, 'base64').toString('utf8');
  return out;
}

function encode(vars: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(vars)) out[k] = Buffer.from(v, 'utf8').toString('base64');
  return out;
}

export function checkSize(vars: Record<string, string>): void {
  let bytes = 0;
  for (const [k, v] of Object.entries(vars)) bytes += k.length + Buffer.byteLength(v);
  if (bytes > MAX_ENV_BYTES) {
    throw new BridgeError('payload_too_large', `environment variables total ${bytes} bytes; the limit is ${MAX_ENV_BYTES}`);
  }
}
