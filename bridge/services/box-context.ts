// What the platform tells a box about itself (issue 21): a keepalive (activity for idle sleep,
// nothing run in the box), and its contexts (backup, outbound) kept on its record
// (common/box-context.ts). Free of Express types.
import { backupContextOf, contextAnnotations, outboundContextOf, type BackupContext, type OutboundContext } from '../../common/box-context.js';
import type { BoxRecords } from '../../common/box-records.js';
import { BridgeError } from '../../common/errors.js';
import { ANNOTATIONS } from '../../common/labels.js';
import type { BoxConnector } from './box-connector.js';
import type { BoxService } from './boxes.js';

export interface BoxContextServiceDeps {
  connector: Pick<BoxConnector, 'call' | 'markActive'>;
  boxes: Pick<BoxService, 'locate'>;
  records: Pick<BoxRecords, 'annotate'>;
}

/** How long a keepalive whose pod a sleep deleted first waits for the watch to say so (then the call is woken). */
const GONE_WAIT_MS = 10_000;

export class BoxContextService {
  constructor(private readonly deps: BoxContextServiceDeps) {}

  /**
   * Counts as activity for idle sleep (docs/api.md "Keepalive"): writes the pod's last-active
   * now. Through the box connector like any call: a sleeping box is woken (a keepalive needs
   * boxes:write), a sleep under way is given up (the write changes the pod its delete is
   * guarded by) or, when its delete came first, waited for and the box woken. Runs nothing in
   * the box; a box still starting is waited for.
   */
  async keepalive(boxId: string): Promise<{ box_id: string; last_active_at: string }> {
    return this.deps.connector.call(boxId, async ({ pod, signal }) => {
      const written = await this.deps.connector.markActive(pod);
      const at = written?.metadata?.annotations?.[ANNOTATIONS.lastActive];
      if (written && !written.metadata?.deletionTimestamp && at) return { box_id: boxId, last_active_at: at };
      // A sleep's delete came first: the connector's watch ends this call (the pod is going)
      // and its next round waits for the sleep and wakes the box.
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, GONE_WAIT_MS);
        signal.addEventListener('abort', () => (clearTimeout(timer), resolve()), { once: true });
      });
      signal.throwIfAborted();
      throw new BridgeError('cluster_unavailable', `box ${boxId} is being put to sleep; retry`, { headers: { 'Retry-After': '1' } });
    });
  }

  /**
   * Sets the box's backup and/or outbound context on its record (a context not given stays as
   * it was). Never wakes a sleeping box: the record is all it needs.
   */
  async setContext(boxId: string, body: { backup?: BackupContext | undefined; outbound?: OutboundContext | undefined }) {
    await this.deps.boxes.locate(boxId); // 400 / 404 as every box route answers them
    const record = await this.deps.records.annotate(boxId, contextAnnotations(body));
    return { box_id: boxId, backup: backupContextOf(record), outbound: outboundContextOf(record) };
  }
}
