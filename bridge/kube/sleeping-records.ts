// Box records in a state beyond Running (label sandbox-bridge.io/sleep: pending, asleep, waking
// or failed; docs/lifecycle.md), from a watch cache: every call asks it whether its box needs
// waking first, without an API round trip. Only records carrying the label are watched, and only
// their metadata (PartialObjectMetadata): the env and credential a record holds never reach this
// process through the watch, so its memory does not grow with env sizes.
import type * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { ResilientInformer, slimMetadata } from '../../common/informer.js';
import { LABELS } from '../../common/labels.js';

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
    this.informer = new ResilientInformer<k8s.V1Secret>({
      kc,
      path: `/api/v1/namespaces/${namespace}/secrets`,
      labelSelector: SLEEPING_SELECTOR,
      log,
      metadataOnly: { trim: trimSecret, timeoutMs: 60_000 },
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

  /** Reopens the watch after an API server outage (ResilientInformer.resync). */
  resync(): void {
    this.informer.resync();
  }

  get(boxId: string): k8s.V1Secret | undefined {
    return this.informer.get(boxId, this.namespace);
  }

  list(): readonly k8s.V1Secret[] {
    return this.informer.list(this.namespace);
  }
}

function trimSecret(secret: k8s.V1Secret): void {
  if (secret.metadata) secret.metadata = slimMetadata(secret.metadata);
  secret.data = undefined;
  secret.stringData = undefined;
}
