// The local cluster's object store (test/cluster/object-store/up.sh: versitygw on loopback) as
// bridge and operator settings. Each caller gets a key prefix of its own, so test files running
// side by side never see each other's snapshots.
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';

export type StoreSettings = { available: true; env: Record<string, string> } | { available: false; reason: string };

/** OBJECT_STORE_* settings of the running local store (with a fresh prefix and seal key), or why there are none. */
export async function localObjectStore(): Promise<StoreSettings> {
  const kubeconfig = process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG;
  if (!kubeconfig) return { available: false, reason: 'SANDBOX_BRIDGE_TEST_KUBECONFIG is unset: run integration tests through `npm test`' };
  const file = join(dirname(kubeconfig), 'object-store/env');
  if (!existsSync(file)) {
    return { available: false, reason: `${file} is missing: the cluster was started before the object store existed (run test/cluster/up.sh again)` };
  }
  const env: Record<string, string> = {};
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    const at = line.indexOf('=');
    if (at > 0) env[line.slice(0, at)] = line.slice(at + 1);
  }
  const health = await fetch(`${env.OBJECT_STORE_ENDPOINT}/health`, { signal: AbortSignal.timeout(2000) }).then(
    (r) => r.ok,
    () => false,
  );
  if (!health) return { available: false, reason: `the object store at ${env.OBJECT_STORE_ENDPOINT} does not answer (run test/cluster/up.sh again)` };
  return {
    available: true,
    env: { ...env, OBJECT_STORE_PREFIX: `test-${randomBytes(4).toString('hex')}`, SNAPSHOT_ENCRYPTION_KEY: randomBytes(32).toString('hex') },
  };
}

/** Every file the local store keeps under a caller's prefix (versitygw's POSIX directory): to look for bytes that must not be there. */
export function storeFilesOf(storeEnv: Record<string, string>): string[] {
  const dataDir = join(dirname(process.env.SANDBOX_BRIDGE_TEST_KUBECONFIG!), 'object-store/data');
  const files: string[] = [];
  const walk = (d: string) => {
    for (const name of readdirSync(d)) {
      const path = join(d, name);
      if (statSync(path).isDirectory()) walk(path);
      else files.push(path);
    }
  };
  walk(join(dataDir, storeEnv.OBJECT_STORE_BUCKET!, storeEnv.OBJECT_STORE_PREFIX!));
  return files;
}
