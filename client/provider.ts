// Provider selection and configuration as the agent platform does it (spec 002: an environment's
// `config.sandbox_provider`, then legacy `config.type`, then SANDBOX_PROVIDER, then `subprocess`),
// and the cluster-bridge settings read from the environment (spec 001, client adapter point 6).
import type { CreateBoxRequest } from './types.js';

export const CLUSTER_BRIDGE_PROVIDER = 'cluster-bridge';
const DEFAULT_PROVIDER = 'subprocess';

/** Environment variables: process.env, or an edge runtime's env bindings. */
export type EnvSource = Readonly<Record<string, string | undefined>>;

/** The part of an environment's config that chooses its sandbox provider. */
export interface ProviderConfig {
  sandbox_provider?: string | null;
  /** Legacy name of sandbox_provider. */
  type?: string | null;
}

export interface ProviderSelection {
  provider: string;
  /** Where the choice came from, for messages. */
  source: 'config.sandbox_provider' | 'config.type' | 'SANDBOX_PROVIDER' | 'default';
}

export function selectSandboxProvider(input: { config?: ProviderConfig | null; env?: EnvSource } = {}): ProviderSelection {
  const env = input.env ?? processEnv();
  const fromConfig = nonEmpty(input.config?.sandbox_provider);
  if (fromConfig) return { provider: fromConfig, source: 'config.sandbox_provider' };
  const legacy = nonEmpty(input.config?.type);
  if (legacy) return { provider: legacy, source: 'config.type' };
  const variable = nonEmpty(env.SANDBOX_PROVIDER);
  if (variable) return { provider: variable, source: 'SANDBOX_PROVIDER' };
  return { provider: DEFAULT_PROVIDER, source: 'default' };
}

export class SandboxConfigError extends Error {
  override readonly name = 'SandboxConfigError';
  readonly problems: string[];
  constructor(problems: string[]) {
    super(`cluster-bridge sandbox configuration: ${problems.join('; ')}`);
    this.problems = problems;
  }
}

export interface ClusterBridgeSettings {
  url: string;
  token: string;
  box: Omit<CreateBoxRequest, 'sessionId'>;
}

/**
 * Validated cluster-bridge settings from the environment, or a SandboxConfigError listing every
 * problem at once (so one deploy fixes them all). Unset and empty variables are the same.
 */
export function clusterBridgeConfig(input: { config?: ProviderConfig | null; env?: EnvSource } = {}): ClusterBridgeSettings {
  const env = input.env ?? processEnv();
  const problems: string[] = [];
  const selection = selectSandboxProvider({ config: input.config, env });
  if (selection.provider !== CLUSTER_BRIDGE_PROVIDER) {
    problems.push(
      selection.source === 'default'
        ? `SANDBOX_PROVIDER is unset (set it to ${CLUSTER_BRIDGE_PROVIDER}, or config.sandbox_provider)`
        : `${selection.source} is ${JSON.stringify(selection.provider)}, not ${JSON.stringify(CLUSTER_BRIDGE_PROVIDER)}`,
    );
  }

  const url = nonEmpty(env.CLUSTER_BRIDGE_URL);
  if (!url) problems.push('CLUSTER_BRIDGE_URL is unset (the bridge base URL, e.g. https://bridge.example.com)');
  else if (!isHttpUrl(url)) problems.push(`CLUSTER_BRIDGE_URL must be an http(s) URL, got ${JSON.stringify(url)}`);

  const token = nonEmpty(env.CLUSTER_BRIDGE_TOKEN);
  // Never echo the token: it is a secret.
  if (!token) problems.push('CLUSTER_BRIDGE_TOKEN is unset (the bridge bearer token)');

  const box: Omit<CreateBoxRequest, 'sessionId'> = {};
  const image = nonEmpty(env.SANDBOX_IMAGE);
  if (image) box.image = image;

  const cpuText = nonEmpty(env.CLUSTER_CPU);
  if (cpuText) {
    const cpu = Number(cpuText);
    if (!/^\d*\.?\d+$/.test(cpuText) || !(cpu > 0)) problems.push(`CLUSTER_CPU must be a positive number of cores (e.g. 0.5 or 2), got ${JSON.stringify(cpuText)}`);
    else box.cpu = cpu;
  }

  const memoryText = nonEmpty(env.CLUSTER_MEMORY);
  if (memoryText) {
    const memory = Number(memoryText);
    if (!/^\d+$/.test(memoryText) || !(memory > 0)) {
      problems.push(`CLUSTER_MEMORY must be a positive whole number of MiB (e.g. 512), got ${JSON.stringify(memoryText)}`);
    } else box.memory = memory;
  }

  if (problems.length) throw new SandboxConfigError(problems);
  return { url: url!, token: token!, box };
}

function isHttpUrl(text: string): boolean {
  try {
    const url = new URL(text);
    return (url.protocol === 'http:' || url.protocol === 'https:') && url.host !== '';
  } catch {
    return false;
  }
}

function nonEmpty(value: string | null | undefined): string | undefined {
  const trimmed = value?.trim();
  return trimmed ? trimmed : undefined;
}

/** process.env where it exists; looked up at call time, never at module load (edge isolates have no process). */
function processEnv(): EnvSource {
  return (globalThis as { process?: { env?: EnvSource } }).process?.env ?? {};
}
