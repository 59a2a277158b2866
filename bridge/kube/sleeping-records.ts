// Box records that idle sleep is at work on (label sandbox-bridge.io/sleep: pending, asleep or
// waking), from a watch cache: every call asks it whether its box needs waking first, without an
// API round trip. Only records carrying the label are watched, and their data (env, credential)
// is dropped from the cache: it holds metadata, never secrets.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { ResilientInformer, listPaged, slimMetadata } from '../../common/informer.js';
import { LABELS } from '../../common/labels.js';

export type SleepState = 'pending' | 'asleep' | 'waking';

export const SLEEPING_SELECTOR = LABELS.sleep;

export interface SleepingReader {
  /** The record of a box idle sleep is at work on, by box id. */
  get(boxId: string): k8s.V1Secret | undefined;
  list(): readonly k8s.V1Secret[];
  /** Changes whenever such a record is added, changed or removed. */
  version(): number;
}

export class SleepingRecords implements SleepingReader {
  private readonly informer: ResilientInformer<k8s.V1Secret>;
  private changes = 0;

  constructor(
    kc: k8s.KubeConfig,
    private readonly namespace: string,
    log: Logger,
  ) {
    const core = kc.makeApiClient(k8s.CoreV1Api);
    this.informer = new ResilientInformer<k8s.V1Secret>({
      kc,
      path: `/api/v1/namespaces/${namespace}/secrets`,
      labelSelector: SLEEPING_SELECTOR,
      log,
      list: () => listPaged((page) => core.listNamespacedSecret({ namespace, labelSelector: SLEEPING_SELECTOR, ...page }), trimSecret),
    });
    this.informer.on('add', trimSecret);
    this.informer.on('update', trimSecret);
    for (const event of ['add', 'update', 'delete'] as const) this.informer.on(event, () => this.changes++);
  }

  version(): number {
    return this.changes;
  }

  start(): Promise<void> {
    return this.informer.start();
  }

  stop(): void {
    this.informer.stop();
  }

  get(boxId: string): k8s.V1Secret | undefined {
    return this.informer.get(boxId, this.namespace);
  }

  list(): readonly k8s.V1Secret[] {
    return this.informer.list(this.namespace);
  }
}

export function sleepStateOf(record: k8s.V1Secret | undefined): SleepState | undefined {
  const v = record?.metadata?.labels?.[LABELS.sleep];
  return v === 'pending' || v === 'asleep' || v === 'waking' ? v : undefined;
}

function trimSecret(secret: k8s.V1Secret): void {
  if (secret.metadata) secret.metadata = slimMetadata(secret.metadata);
  secret.data = undefined;
  secret.stringData = undefined;
}
