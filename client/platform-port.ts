// The agent platform's sandbox port, as method signatures only: what `sandbox-bridge/platform`
// must satisfy. Written by us from reading `packages/sandbox/src/ports.ts` of the public GitHub
// repository duyet/open-managed-agents (interfaces SandboxExecutor, ProcessHandle and
// SandboxCapacity), at commit 2ce6ce00a19e8e7a479a506ee64a2f830f35370a (2026-07-17; read
// 2026-11-25). Only the shapes are kept: the names and types the platform calls with and
// expects back. If the platform changes its port, change this file and the type test
// (platform.types.test.ts) tells what no longer fits.
//
// Types only: nothing here exists at runtime.

export interface PlatformProcessHandle {
  id: string;
  pid: number;
  kill(signal: string): Promise<void>;
  getLogs(): Promise<{ stdout: string; stderr: string }>;
  getStatus(): Promise<string>;
}

export interface PlatformBackupHandle {
  id: string;
  dir: string;
  localBucket?: boolean;
}

export interface PlatformCapacity {
  cpu?: { used: number; total: number; unit: 'cores' };
  memory?: { used: number; total: number; unit: 'MiB' | 'GiB' };
  pods?: { used: number; total: number };
}

/** Every method but exec, readFile and writeFile is optional in the platform's port. */
export interface SandboxExecutor {
  exec(command: string, timeout?: number): Promise<string>;
  startProcess?(command: string): Promise<PlatformProcessHandle | null>;
  setEnvVars?(envVars: Record<string, string>): Promise<void>;
  gitCheckout?(repoUrl: string, options: { branch?: string; targetDir?: string }): Promise<unknown>;
  registerCommandSecrets?(commandPrefix: string, secrets: Record<string, string>): void;
  setOutboundContext?(opts: { tenantId: string; sessionId: string }): Promise<void>;
  setBackupContext?(opts: { tenantId: string; environmentId: string; sessionId: string }): Promise<void>;
  snapshotWorkspaceNow?(): Promise<void>;
  readFile(path: string): Promise<string>;
  readFileBytes?(path: string): Promise<Uint8Array>;
  writeFile(path: string, content: string): Promise<string>;
  writeFileBytes?(path: string, bytes: Uint8Array): Promise<string>;
  mountMemoryStore?(opts: { storeName: string; storeId: string; readOnly: boolean }): Promise<void>;
  mountSessionOutputs?(opts: { tenantId: string; sessionId: string }): Promise<void>;
  createWorkspaceBackup?(opts: { name?: string; ttlSec: number }): Promise<PlatformBackupHandle | null>;
  restoreWorkspaceBackup?(handle: PlatformBackupHandle): Promise<{ ok: boolean; error?: string }>;
  destroy?(): Promise<void>;
  renewActivityTimeout?(): Promise<void>;
  ping?(): Promise<{ status: 'ok' | 'error'; latencyMs: number; details?: string }>;
  getCapacity?(): Promise<PlatformCapacity | null>;
}
