// Jest globalSetup of the chaos suite: the local cluster must already be up (it is shared, and a
// chaos run must not start or stop it); the bridge and operator run as processes from dist/, so
// the sources are compiled first. Tests read the kubeconfig path from SANDBOX_BRIDGE_TEST_KUBECONFIG.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';

const root = process.cwd();
const kubeconfig = join(root, '.cluster', 'kubeconfig');
const kubectl = join(root, '.cluster', 'bin', 'kubectl');

export default async function globalSetup() {
  const [major, minor] = process.versions.node.split('.').map(Number);
  if (major < 22 || (major === 22 && minor < 19)) {
    throw new Error(`Node ${process.versions.node} is too old (needs >= 22.19): run the suite with \`npm run test:chaos\`.`);
  }
  const up =
    existsSync(kubeconfig) &&
    existsSync(kubectl) &&
    spawnSync(kubectl, ['--kubeconfig', kubeconfig, '--request-timeout=10s', 'get', '--raw', '/readyz'], { stdio: 'ignore' }).status === 0;
  if (!up) throw new Error('the chaos suite needs the local cluster up: run `npm run cluster:up` first (it does not start one itself)');
  process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG = kubeconfig;
  const build = spawnSync(join(root, 'node_modules/.bin/tsc'), ['-p', 'tsconfig.build.json'], { cwd: root, stdio: ['ignore', 'inherit', 'inherit'] });
  if (build.status !== 0) throw new Error('tsc -p tsconfig.build.json failed');
}
