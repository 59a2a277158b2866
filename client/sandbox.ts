// ClusterBridgeSandbox: the agent runtime's sandbox for one session, backed by a bridge box.
// Spec (client adapter): the box is created lazily on the first operation of the session, the
// operations post to the box endpoints, and destroying the sandbox deletes the box.
import { createBridgeClient, fileBytes, newIdempotencyKey, type BridgeClient, type BridgeClientOptions } from './client.js';
import { BridgeClientError, type CallOptions } from './http.js';
import { CLUSTER_BRIDGE_PROVIDER, clusterBridgeConfig, selectSandboxProvider, type EnvSource, type ProviderConfig } from './provider.js';
import type { BoxCreated, BoxStatus, CreateBoxRequest, EnvUpdated, ExecResult, FileWritten, Snapshot } from './types.js';

/** A workspace backup as the agent platform's sandbox interface holds it: a bridge snapshot. */
export interface WorkspaceBackupHandle {
  /** The bridge's snapshot_id. */
  id: string;
  sessionId: string;
  boxId: string;
  name?: string;
  /** Bytes of the compressed workspace. */
  size: number;
  createdAt: string;
  expiresAt: string;
}

export interface WorkspaceRestoreResult {
  ok: boolean;
  error?: string;
}

export interface ClusterBridgeSandboxOptions extends Omit<CreateBoxRequest, 'sessionId'> {
  sessionId: string;
  /** Default working directory for exec (the bridge's default is /workspace). */
  workdir?: string;
}

export interface ExecOptions extends CallOptions {
  /** Command timeout inside the box (bridge default 120000, at most 600000). */
  timeoutMs?: number;
  workdir?: string;
}

export interface FromEnvOptions extends Omit<BridgeClientOptions, 'url' | 'token'> {
  sessionId: string;
  /** Where to read the variables (default: process.env when there is one; pass your runtime's env bindings on edge platforms). */
  env?: EnvSource;
  /** The environment's config: `sandbox_provider: 'cluster-bridge'` selects this provider even when SANDBOX_PROVIDER says otherwise. */
  config?: ProviderConfig;
  workdir?: string;
}

export class ClusterBridgeSandbox {
  readonly client: BridgeClient;
  readonly sessionId: string;
  private readonly createRequest: CreateBoxRequest;
  private readonly workdir: string | undefined;
  private creating: Promise<BoxCreated> | undefined;
  /**
   * One Idempotency-Key for the session's box, kept across create attempts: when a create timed
   * out after the bridge made the box, the next operation's create gets that box, not a second.
   */
  private createKey: string | undefined;
  private created: BoxCreated | undefined;
  private destroying: Promise<void> | undefined;

  constructor(client: BridgeClient, options: ClusterBridgeSandboxOptions) {
    if (!options.sessionId) throw new TypeError('sessionId is required');
    const { workdir, ...createRequest } = options;
    this.client = client;
    this.sessionId = options.sessionId;
    this.createRequest = createRequest;
    this.workdir = workdir;
  }

  /**
   * A sandbox configured from SANDBOX_PROVIDER, CLUSTER_BRIDGE_URL, CLUSTER_BRIDGE_TOKEN,
   * SANDBOX_IMAGE, CLUSTER_CPU (cores) and CLUSTER_MEMORY (MiB). Throws one error naming every
   * missing or invalid variable.
   */
  static fromEnv(options: FromEnvOptions): ClusterBridgeSandbox {
    const { sessionId, env, config, workdir, ...clientOptions } = options;
    const settings = clusterBridgeConfig({ env, config });
    const client = createBridgeClient({ ...clientOptions, url: settings.url, token: settings.token });
    return new ClusterBridgeSandbox(client, { sessionId, workdir, ...settings.box });
  }

  /** The box id once the box exists (undefined before the first operation). */
  get boxId(): string | undefined {
    return this.created?.box_id;
  }

  /** The create response once the box exists. */
  get box(): BoxCreated | undefined {
    return this.created;
  }

  async exec(command: string, opts: ExecOptions = {}): Promise<ExecResult> {
    const id = await this.ensureBox('exec');
    const workdir = opts.workdir ?? this.workdir;
    const req = { command, ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}), ...(workdir ? { workdir } : {}) };
    // opts.timeoutMs is the command's timeout; the HTTP deadline is derived from it by the client.
    return this.client.exec(id, req, { signal: opts.signal });
  }

  /** The file as text (UTF-8; bytes that are not valid UTF-8 become U+FFFD). */
  async readFile(path: string, opts: CallOptions = {}): Promise<string> {
    const id = await this.ensureBox('read file');
    const file = await this.client.readFile(id, path, opts);
    return file.encoding === 'text' ? file.content : new TextDecoder().decode(fileBytes(file));
  }

  /** The file's exact bytes. */
  async readFileBytes(path: string, opts: CallOptions = {}): Promise<Uint8Array> {
    const id = await this.ensureBox('read file');
    return fileBytes(await this.client.readFile(id, path, { ...opts, base64: true }));
  }

  /** Writes text (UTF-8) or bytes; parent directories are created. */
  async writeFile(path: string, content: string | Uint8Array, opts: CallOptions = {}): Promise<FileWritten> {
    const id = await this.ensureBox('write file');
    return this.client.writeFile(id, path, content, opts);
  }

  /** Merges variables into the box's environment; later exec calls see them. */
  async setEnvVars(envVars: Record<string, string>, opts: CallOptions = {}): Promise<EnvUpdated> {
    const id = await this.ensureBox('set env');
    return this.client.setEnv(id, envVars, opts);
  }

  /** The box's status (creates the box if this is the session's first operation). */
  async status(opts: CallOptions = {}): Promise<BoxStatus> {
    const id = await this.ensureBox('status');
    return this.client.status(id, opts);
  }

  /**
   * Snapshots the workspace (/workspace and the env) as a backup the bridge keeps for
   * `ttlSec` (at most the pool's retention). Null when there is nothing to back up (no box was
   * ever created) or the bridge has no object store (501); other failures (the store down: 503)
   * throw, so a caller never mistakes a failed backup for an unneeded one.
   */
  async createWorkspaceBackup(options: { name?: string; ttlSec?: number } = {}, opts: CallOptions = {}): Promise<WorkspaceBackupHandle | null> {
    const box = this.creating ? await this.creating.catch(() => undefined) : undefined;
    if (!box) return null;
    try {
      const snap = await this.client.snapshot(
        box.box_id,
        { ...(options.name !== undefined ? { name: options.name } : {}), ...(options.ttlSec !== undefined ? { ttlSeconds: options.ttlSec } : {}) },
        opts,
      );
      return handleOf(snap);
    } catch (err) {
      if (err instanceof BridgeClientError && err.status === 501) return null;
      throw err;
    }
  }

  /** The session's newest backup, or null (none, or no object store at the bridge). */
  async latestWorkspaceBackup(opts: CallOptions = {}): Promise<WorkspaceBackupHandle | null> {
    try {
      const { snapshots } = await this.client.listSnapshots(this.sessionId, { ...opts, limit: 1 });
      return snapshots[0] ? handleOf(snapshots[0]) : null;
    } catch (err) {
      if (err instanceof BridgeClientError && err.status === 501) return null;
      throw err;
    }
  }

  /**
   * Restores a backup: before the session's first operation, the session's box is created from
   * it; otherwise a new box is forked from it and, once it is ready, replaces the current one
   * (which is deleted), so the sandbox never is without a box. Never throws.
   */
  async restoreWorkspaceBackup(handle: WorkspaceBackupHandle | string, opts: CallOptions = {}): Promise<WorkspaceRestoreResult> {
    const snapshotId = typeof handle === 'string' ? handle : handle.id;
    if (this.destroying) return { ok: false, error: `the sandbox of session ${this.sessionId} was destroyed` };
    const before = this.creating;
    const previous = before ? await before.catch(() => undefined) : undefined;
    // Operations from now on wait for the restored box.
    const fork = this.client.fromSnapshot(snapshotId, { ...this.createRequest, sessionId: this.sessionId }, opts);
    this.creating = fork;
    try {
      const box = await fork;
      this.created = box;
      // The restore succeeded; a replaced box that cannot be deleted now is left to its TTL.
      if (previous && previous.box_id !== box.box_id) await this.client.deleteBox(previous.box_id, { snapshot: false }).catch(() => undefined);
      return { ok: true };
    } catch (err) {
      // The fork failed: the sandbox keeps the box it had (or makes one lazily, as before).
      if (this.creating === fork) this.creating = previous ? before : undefined;
      return { ok: false, error: err instanceof Error ? err.message : String(err) };
    }
  }

  /**
   * Deletes the box. Idempotent: a box that is already gone (404) counts as deleted, a sandbox
   * that never created a box does nothing, and later calls return the first call's outcome.
   * Operations after destroy fail with type `sandbox_destroyed` rather than creating a new box.
   * With `snapshot: true` a final snapshot is taken first and the box deleted only once it is
   * stored (the platform's "eager final snapshot, then destroy"); if that fails, so does destroy.
   */
  destroy(opts: CallOptions & { snapshot?: boolean } = {}): Promise<void> {
    this.destroying ??= this.deleteBox(opts).catch((err: unknown) => {
      this.destroying = undefined; // a failed delete (say, 503 after retries) may be tried again
      throw err;
    });
    return this.destroying;
  }

  private async deleteBox(opts: CallOptions & { snapshot?: boolean }): Promise<void> {
    // A create in flight would otherwise leave a box behind.
    const box = this.creating ? await this.creating.catch(() => undefined) : undefined;
    if (!box) return;
    try {
      await this.client.deleteBox(box.box_id, opts);
    } catch (err) {
      if (!(err instanceof BridgeClientError && err.status === 404)) throw err;
    }
  }

  private async ensureBox(operation: string): Promise<string> {
    if (this.destroying) {
      throw new BridgeClientError({
        operation,
        status: 0,
        type: 'sandbox_destroyed',
        message: `${operation} failed: the sandbox of session ${this.sessionId} was destroyed`,
      });
    }
    // One create per session even when several first operations race: they share the promise.
    // No caller signal: one caller giving up must not fail the others, nor orphan a box whose
    // id we never learn; the client's deadline still bounds it.
    this.createKey ??= newIdempotencyKey();
    this.creating ??= this.client.createBox({ ...this.createRequest, sessionId: this.sessionId }, { idempotencyKey: this.createKey }).then(
      (box) => {
        this.created = box;
        return box;
      },
      (err: unknown) => {
        this.creating = undefined; // the next operation tries again
        throw err;
      },
    );
    return (await this.creating).box_id;
  }
}

function handleOf(s: Snapshot): WorkspaceBackupHandle {
  return {
    id: s.snapshot_id,
    sessionId: s.session_id,
    boxId: s.box_id,
    ...(s.name !== undefined ? { name: s.name } : {}),
    size: s.size,
    createdAt: s.created_at,
    expiresAt: s.expires_at,
  };
}

/**
 * For a runtime's provider registry: given an environment's config (and env), a per-session
 * sandbox factory when that environment selects cluster-bridge, otherwise undefined. The
 * settings are validated once, here, so a misconfiguration shows when the environment loads
 * rather than at a session's first command; all sessions share one client.
 */
export function clusterBridgeSandboxFactory(
  options: Omit<FromEnvOptions, 'sessionId'> = {},
): ((sessionId: string) => ClusterBridgeSandbox) | undefined {
  if (selectSandboxProvider({ config: options.config, env: options.env }).provider !== CLUSTER_BRIDGE_PROVIDER) return undefined;
  const { env, config, workdir, ...clientOptions } = options;
  const settings = clusterBridgeConfig({ env, config });
  const client = createBridgeClient({ ...clientOptions, url: settings.url, token: settings.token });
  return (sessionId) => new ClusterBridgeSandbox(client, { sessionId, workdir, ...settings.box });
}
