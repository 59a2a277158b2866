// Stops the local cluster if this test run started it; a cluster that was already up
// (e.g. from `npm run cluster:up`) is left running. KEEP_CLUSTER=1 keeps it either way.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';

export default async function globalTeardown() {
  if (!globalThis.__sandboxBridgeStartedCluster || process.env.KEEP_CLUSTER === '1') return;
  spawnSync('bash', [join(process.cwd(), 'test/cluster/down.sh')], { stdio: ['ignore', 'inherit', 'inherit'] });
}
