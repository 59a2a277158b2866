// The pool policy the bridge serves: the SandboxPool named POOL_NAME, watched so that
// `kubectl edit sbp` takes effect without a restart. Until the pool exists (no operator or CRD
// yet) the built-in defaults apply, in SANDBOX_NAMESPACE.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { ResilientInformer } from '../../common/informer.js';
import {
  POOL_GROUP,
  POOL_PLURAL,
  POOL_VERSION,
  withDefaults,
  type SandboxPool,
  type SandboxPoolSpec,
} from '../../common/pool.js';

export interface PolicySource {
  /** The pool's name (label value on boxes). */
  readonly poolName: string;
  current(): SandboxPoolSpec;
  /** The pool object, when it exists (its status carries totalBoxesCreated). */
  pool(): SandboxPool | undefined;
  isHealthy(): boolean;
}

/** A fixed policy: for tests and for running without the CRD. */
export function staticPolicy(poolName: string, spec: SandboxPoolSpec): PolicySource {
  return { poolName, current: () => spec, pool: () => undefined, isHealthy: () => true };
}

export class WatchedPolicy implements PolicySource {
  private readonly informer: ResilientInformer<SandboxPool & k8s.KubernetesObject>;

  constructor(
    kc: k8s.KubeConfig,
    readonly poolName: string,
    private readonly fallback: SandboxPoolSpec,
    log: Logger,
  ) {
    const custom = kc.makeApiClient(k8s.CustomObjectsApi);
    const path = `/apis/${POOL_GROUP}/${POOL_VERSION}/${POOL_PLURAL}`;
    this.informer = new ResilientInformer({
      kc,
      path,
      log,
      list: async () => {
        try {
          return (await custom.listClusterCustomObject({
            group: POOL_GROUP,
            version: POOL_VERSION,
            plural: POOL_PLURAL,
          })) as k8s.KubernetesListObject<SandboxPool & k8s.KubernetesObject>;
        } catch (err) {
          // No CRD installed: an empty pool list, so the fallback policy applies; the informer's
          // watch then fails and restarts with backoff until the CRD appears.
          if (err instanceof k8s.ApiException && err.code === 404) return { items: [], metadata: {} };
          throw err;
        }
      },
    });
  }

  start(): Promise<void> {
    return this.informer.start();
  }

  stop(): void {
    this.informer.stop();
  }

  pool(): SandboxPool | undefined {
    return this.informer.get(this.poolName);
  }

  current(): SandboxPoolSpec {
    const pool = this.pool();
    if (!pool) return this.fallback;
    // Read on every request (an exec reads it twice): worked out once per version of the pool.
    if (this.defaulted?.spec !== pool.spec) this.defaulted = { spec: pool.spec, value: withDefaults(pool.spec) };
    return this.defaulted.value;
  }

  private defaulted: { spec: SandboxPool['spec']; value: SandboxPoolSpec } | undefined;

  isHealthy(): boolean {
    return this.informer.hasSynced();
  }
}
