// sandbox-bridge/client: the fetch-only client agent runtimes use to reach the bridge.
// Runs unchanged in Node 20+ and in fetch-only edge isolates: nothing in this module graph
// imports a Node built-in or touches Buffer/process at load (client/edge-safety.test.ts checks).
export { createBridgeClient, fileBytes, DEFAULT_TIMEOUT_MS, SNAPSHOT_TIMEOUT_MS } from './client.js';
export type { BridgeClient, BridgeClientOptions, CreateBoxOptions, FileReadOptions, SandboxesOptions } from './client.js';
export { BridgeClientError, parseRetryAfter } from './http.js';
export { PTY_PROTOCOL } from './streams.js';
export type { Terminal } from './streams.js';
export type { CallOptions, ClientFailure, FetchLike, RetryOptions } from './http.js';
export { ClusterBridgeSandbox, clusterBridgeSandboxFactory } from './sandbox.js';
export type { ClusterBridgeSandboxOptions, ExecOptions, FromEnvOptions, WorkspaceBackupHandle, WorkspaceRestoreResult } from './sandbox.js';
export { CLUSTER_BRIDGE_PROVIDER, SandboxConfigError, clusterBridgeConfig, selectSandboxProvider } from './provider.js';
export type { ClusterBridgeSettings, EnvSource, ProviderConfig, ProviderSelection } from './provider.js';
export { decodeBase64, encodeBase64 } from './base64.js';
export type * from './types.js';
