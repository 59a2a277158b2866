// A watch-backed cache of Kubernetes objects (client-node's informer) that keeps itself alive:
// client-node relists by itself on 410 Gone, but stops on any other error, so we restart it
// with capped exponential backoff. Reads come from the cache; only writes go to the API server.
//
// With `metadataOnly` it lists and watches only the objects' metadata (meta.k8s.io/v1
// PartialObjectMetadata, as client-go's metadata informers do): the API server leaves out spec,
// status and data, so a cache of Secrets costs the same whatever the Secrets hold.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { sharedConnectionAuth } from './kube.js';

/** An object as a metadata-only list or watch delivers it: kind, apiVersion and metadata. */
export type PartialObjectMetadata = k8s.KubernetesObject;

/** The Accept headers that ask the API server for metadata only. */
export const METADATA_ACCEPT = {
  list: 'application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1',
  watch: 'application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1',
} as const;

export interface MetadataOnly<T> {
  /** Called on each listed item as its page arrives (e.g. to drop managed fields). */
  trim?: (item: T) => void;
  /** Deadline of each list request. */
  timeoutMs: number;
}

export interface InformerOptions<T extends k8s.KubernetesObject> {
  kc: k8s.KubeConfig;
  /** Watch path, e.g. /api/v1/namespaces/<ns>/pods. */
  path: string;
  /** The initial list (and relists); required unless metadataOnly, which lists `path` itself. */
  list?: () => Promise<k8s.KubernetesListObject<T>>;
  /** List (in pages) and watch PartialObjectMetadata of `path` with the same selectors. */
  metadataOnly?: MetadataOnly<T>;
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
  private abortsToIgnore = 0;
  private healthy = false;
  private synced = false;
  private firstSync: Promise<void>;
  private resolveFirstSync!: () => void;

  constructor(private readonly options: InformerOptions<T>) {
    this.log = options.log.child({ informer: options.path });
    this.minBackoffMs = options.minBackoffMs ?? 500;
    this.maxBackoffMs = options.maxBackoffMs ?? 30_000;
    this.backoffMs = this.minBackoffMs;
    const list = options.metadataOnly ? metadataList<T>(options, options.metadataOnly) : options.list;
    if (!list) throw new Error(`informer ${options.path}: neither list nor metadataOnly given`);
    this.informer = new k8s.ListWatch(
      options.path,
      new k8s.Watch(options.metadataOnly ? metadataWatchConfig(options.kc) : options.kc),
      list,
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

  /**
   * Opens the watch again from the last resource version seen (the API server replays what was
   * missed, or answers 410 and the cache is relisted). For after an API server outage: a watch
   * whose connection froze with it shows nothing new until its 30 s inactivity timeout, and a
   * cache that old hands out pods that are gone (a replica answered 404 for a running box whose
   * pod was replaced meanwhile: chaos seed 1421579774).
   */
  resync(): void {
    if (this.stopped || !this.synced) return;
    this.log.info('reopening the watch (the API server answers again after an outage)');
    this.abortsToIgnore++;
    void this.informer.stop().then(() => {
      if (!this.stopped) void this.run();
    });
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
    // The end of a watch resync() closed is reported as an error: it is not one.
    if (this.abortsToIgnore > 0 && (err as { name?: unknown } | null)?.name === 'AbortError') {
      this.abortsToIgnore--;
      return;
    }
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

/**
 * The informer's list for metadataOnly: GETs of `path` with its selectors, asking for a
 * PartialObjectMetadataList, in pages (listPaged). A raw request: client-node's generated list
 * methods neither let us set Accept nor parse that kind.
 */
function metadataList<T extends k8s.KubernetesObject>(o: InformerOptions<T>, m: MetadataOnly<T>): () => Promise<k8s.KubernetesListObject<T>> {
  const cluster = o.kc.getCurrentCluster();
  if (!cluster) throw new Error('no active Kubernetes cluster in the kubeconfig');
  const auth = sharedConnectionAuth(o.kc);
  const http = new k8s.IsomorphicFetchHttpLibrary();
  const page = async (params: { limit: number; _continue?: string }): Promise<k8s.KubernetesListObject<T>> => {
    const url = new URL(cluster.server + o.path);
    if (o.labelSelector) url.searchParams.set('labelSelector', o.labelSelector);
    if (o.fieldSelector) url.searchParams.set('fieldSelector', o.fieldSelector);
    url.searchParams.set('limit', String(params.limit));
    if (params._continue) url.searchParams.set('continue', params._continue);
    const ctx = new k8s.RequestContext(url.toString(), k8s.HttpMethod.GET);
    await auth.applySecurityAuthentication(ctx);
    ctx.setHeaderParam('Accept', METADATA_ACCEPT.list);
    ctx.setSignal(AbortSignal.timeout(m.timeoutMs));
    const res = await http.send(ctx).toPromise();
    const text = await res.body.text();
    if (res.httpStatusCode !== 200) throw new k8s.ApiException(res.httpStatusCode, `list ${o.path}`, text, res.headers);
    const list = JSON.parse(text) as { apiVersion?: string; kind?: string; metadata?: { resourceVersion?: string; continue?: string }; items?: T[] | null };
    // Typed as client-node's lists are: the wire's `continue` is `_continue` there (listPaged reads
    // that); an empty PartialObjectMetadataList comes with `items: null`.
    const { resourceVersion, continue: cont } = list.metadata ?? {};
    return { ...list, items: list.items ?? [], metadata: { ...(resourceVersion ? { resourceVersion } : {}), ...(cont ? { _continue: cont } : {}) } };
  };
  return () => listPaged(page, m.trim ?? (() => undefined));
}

/**
 * client-node's Watch takes its request headers from its config's authentication and uses
 * nothing else of it but the cluster: this config adds the Accept header of a metadata watch.
 */
function metadataWatchConfig(kc: k8s.KubeConfig): k8s.KubeConfig {
  const config: Pick<k8s.KubeConfig, 'getCurrentCluster' | 'applySecurityAuthentication'> = {
    getCurrentCluster: () => kc.getCurrentCluster(),
    applySecurityAuthentication: async (ctx) => {
      await kc.applySecurityAuthentication(ctx);
      ctx.setHeaderParam('Accept', METADATA_ACCEPT.watch);
    },
  };
  return config as k8s.KubeConfig;
}

function errorSummary(err: unknown): string {
  if (err instanceof k8s.ApiException) return `HTTP ${err.code}`;
  return err instanceof Error ? err.message : String(err);
}
