// A watch-backed cache of Kubernetes objects (client-node's informer) that keeps itself alive:
// client-node relists by itself on 410 Gone, but stops on any other error, so we restart it
// with capped exponential backoff. Reads come from the cache; only writes go to the API server.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';

export interface InformerOptions<T extends k8s.KubernetesObject> {
  kc: k8s.KubeConfig;
  /** Watch path, e.g. /api/v1/namespaces/<ns>/pods. */
  path: string;
  list: () => Promise<k8s.KubernetesListObject<T>>;
  labelSelector?: string;
  /** E.g. metadata.name=<name>: RBAC limited to named objects allows only such lists and watches. */
  fieldSelector?: string;
  log: Logger;
  /** Backoff bounds for restarts after an error. */
  minBackoffMs?: number;
  maxBackoffMs?: number;
}

export type CacheEvent = 'add' | 'update' | 'delete';

export class ResilientInformer<T extends k8s.KubernetesObject> {
  private readonly informer: k8s.Informer<T> & k8s.ObjectCache<T>;
  private readonly log: Logger;
  private readonly minBackoffMs: number;
  private readonly maxBackoffMs: number;
  private backoffMs: number;
  private restartTimer: NodeJS.Timeout | undefined;
  private stopped = false;
  private healthy = false;
  private synced = false;
  private firstSync: Promise<void>;
  private resolveFirstSync!: () => void;

  constructor(private readonly options: InformerOptions<T>) {
    this.log = options.log.child({ informer: options.path });
    this.minBackoffMs = options.minBackoffMs ?? 500;
    this.maxBackoffMs = options.maxBackoffMs ?? 30_000;
    this.backoffMs = this.minBackoffMs;
    this.informer = new k8s.ListWatch(
      options.path,
      new k8s.Watch(options.kc),
      options.list,
      false,
      options.labelSelector,
      options.fieldSelector,
    );
    this.firstSync = new Promise((resolve) => (this.resolveFirstSync = resolve));
    this.informer.on('error', (err: unknown) => this.onError(err));
    this.informer.on('connect', () => {
      this.healthy = true;
    });
  }

  /** Starts watching; resolves once the first list has filled the cache. */
  async start(): Promise<void> {
    this.stopped = false;
    void this.run();
    await this.firstSync;
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.restartTimer);
    void this.informer.stop();
  }

  on(event: CacheEvent, handler: (obj: T) => void): void {
    this.informer.on(event, handler);
  }

  get(name: string, namespace?: string): T | undefined {
    return this.informer.get(name, namespace);
  }

  list(namespace?: string): readonly T[] {
    return this.informer.list(namespace);
  }

  /** True once the cache has been filled and while the watch is not in error. */
  isHealthy(): boolean {
    return this.synced && this.healthy;
  }

  hasSynced(): boolean {
    return this.synced;
  }

  private async run(): Promise<void> {
    try {
      await this.informer.start();
      this.healthy = true;
      this.backoffMs = this.minBackoffMs;
      if (!this.synced) {
        this.synced = true;
        this.resolveFirstSync();
      }
    } catch (err) {
      this.onError(err);
    }
  }

  private onError(err: unknown): void {
    this.healthy = false;
    if (this.stopped || this.restartTimer) return;
    const delay = this.backoffMs;
    this.backoffMs = Math.min(this.backoffMs * 2, this.maxBackoffMs);
    this.log.warn({ err: errorSummary(err), retryInMs: delay }, 'watch failed; restarting');
    this.restartTimer = setTimeout(() => {
      this.restartTimer = undefined;
      if (!this.stopped) void this.run();
    }, delay);
    this.restartTimer.unref();
  }
}

/**
 * The metadata a trimmed cache keeps (no managed fields): a fresh object, so a cached object is
 * slimmed by assignment; `delete` would leave V8 objects in larger, slower dictionary mode.
 */
export function slimMetadata(m: k8s.V1ObjectMeta): k8s.V1ObjectMeta {
  return {
    name: m.name,
    namespace: m.namespace,
    uid: m.uid,
    resourceVersion: m.resourceVersion, // the informer compares it on relists
    creationTimestamp: m.creationTimestamp,
    deletionTimestamp: m.deletionTimestamp,
    labels: m.labels,
    annotations: m.annotations,
    ownerReferences: m.ownerReferences,
  } as k8s.V1ObjectMeta;
}

/** Page size of the initial lists of large caches (box pods, their Secrets). */
export const LIST_PAGE_SIZE = 500;

/**
 * An informer's initial list, in pages (one consistent snapshot, via continue tokens), each
 * page trimmed as it arrives: a 10,000-pod response parsed whole would push the heap, and so
 * the RSS, far beyond what the trimmed cache needs.
 */
export async function listPaged<T extends k8s.KubernetesObject>(
  page: (params: { limit: number; _continue?: string }) => Promise<k8s.KubernetesListObject<T>>,
  trim: (item: T) => void,
): Promise<k8s.KubernetesListObject<T>> {
  let cont: string | undefined;
  const items: T[] = [];
  let last: k8s.KubernetesListObject<T>;
  do {
    last = await page({ limit: LIST_PAGE_SIZE, ...(cont ? { _continue: cont } : {}) });
    for (const item of last.items) {
      trim(item);
      items.push(item);
    }
    cont = last.metadata?._continue || undefined;
  } while (cont);
  return { ...last, items };
}

function errorSummary(err: unknown): string {
  if (err instanceof k8s.ApiException) return `HTTP ${err.code}`;
  return err instanceof Error ? err.message : String(err);
}
