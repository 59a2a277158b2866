// A box's environment: the running box's copy lives in boxd (every later exec gets it, from any
// replica, with no API call); the durable copy is the box's record Secret, which a cold box's
// boxd loads at start (a claimed warm box gets it pushed at the claim).
// The record is written first, so a value boxd has was always stored.
import type { BoxdClient } from '../../common/boxd-client.js';
import type { BoxRecords } from '../../common/box-records.js';
import { boxIdOf } from '../box-view.js';
import type { BoxConnector } from './box-connector.js';

export class EnvService {
  constructor(
    private readonly deps: { connector: BoxConnector; boxd: BoxdClient; records: BoxRecords; now?: () => Date },
  ) {}

  async merge(boxId: string, vars: Record<string, string>) {
    return this.deps.connector.call(boxId, async ({ pod, target, signal }) => {
      const count = await this.deps.records.mergeEnv(pod, boxIdOf(pod) ?? boxId, vars);
      await this.deps.boxd.setEnv(target, vars, signal);
      return { box_id: boxId, env_count: count, updated_at: (this.deps.now?.() ?? new Date()).toISOString() };
    });
  }
}
