// A box's environment: the running box's copy lives in boxd (every later exec gets it, from any
// replica, with no API call); the durable copy is the box's Secret, which boxd loads at start.
// The Secret is written first, so a value boxd has was always stored.
import type { BoxdClient } from '../boxd/client.js';
import type { BoxSecrets } from '../kube/box-secrets.js';
import type { BoxConnector } from './box-connector.js';

export class EnvService {
  constructor(
    private readonly deps: { connector: BoxConnector; boxd: BoxdClient; secrets: BoxSecrets; now?: () => Date },
  ) {}

  async merge(boxId: string, vars: Record<string, string>) {
    return this.deps.connector.call(boxId, async ({ pod, target, signal }) => {
      const count = await this.deps.secrets.mergeEnv(pod, vars);
      await this.deps.boxd.setEnv(target, vars, signal);
      return { box_id: pod.metadata!.name!, env_count: count, updated_at: (this.deps.now?.() ?? new Date()).toISOString() };
    });
  }
}
