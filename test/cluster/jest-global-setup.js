// Jest globalSetup for the integration project: reuse the local cluster if it is up,
// otherwise start it (building the binaries on first use). Tests read the kubeconfig path
// from SANDBOX_BRIDGE_TEST_KUBECONFIG.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';

const root = process.cwd();
const kubeconfig = join(root, '.cluster', 'kubeconfig');
const kubectl = join(root, '.cluster', 'bin', 'kubectl');

function clusterIsUp() {
  if (!existsSync(kubeconfig) || !existsSync(kubectl)) return false;
  const probe = spawnSync(kubectl, ['--kubeconfig', kubeconfig, '--request-timeout=5s', 'get', '--raw', '/readyz'], {
    stdio: 'ignore',
  });
  return probe.status === 0;
}

export default async function globalSetup() {
  const [major, minor] = process.versions.node.split('.').map(Number);
  if (major < 22 || (major === 22 && minor < 19)) {
    throw new Error(
      `Node ${process.versions.node} is too old for @kubernetes/client-node 2.x (needs >= 22.19). ` +
        'Run the tests through npm (`npm test`), which uses the Node 24 that `npm ci` installs.',
    );
  }
  if (clusterIsUp()) {
    process.stderr.write('\n[integration] reusing the local cluster at .cluster/kubeconfig\n');
  } else {
    process.stderr.write('\n[integration] starting the local cluster (test/cluster/up.sh)\n');
    const up = spawnSync('bash', [join(root, 'test/cluster/up.sh')], { stdio: ['ignore', 'inherit', 'inherit'] });
    if (up.status !== 0) throw new Error(`test/cluster/up.sh failed with exit code ${up.status}`);
    globalThis.__sandboxBridgeStartedCluster = true;
  }
  process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG = kubeconfig;

  // Tests that run the bridge or operator as real processes start them from dist/.
  const build = spawnSync(join(root, 'node_modules/.bin/tsc'), ['-p', 'tsconfig.build.json'], {
    cwd: root,
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  if (build.status !== 0) throw new Error('tsc -p tsconfig.build.json failed');
}
