// sandbox-bridge/platform: ClusterBridgeExecutor, the agent platform's SandboxExecutor port
// (client/platform-port.ts) over one bridge box per session, every method real. What each
// method sends and why: docs/platform.md. Fetch-only like the client, so it runs in edge
// isolates too (client/edge-safety.test.ts covers this entry point).
import { createBridgeClient, newIdempotencyKey, type BridgeClient, type BridgeClientOptions } from './client.js';
import { BridgeClientError } from './http.js';
import { clusterBridgeConfig, type EnvSource, type ProviderConfig } from './provider.js';
import {
  GIT_CHECKOUT_COMMAND,
  MAX_EXEC_TIMEOUT_MS,
  NO_GIT_EXIT,
  execTimeoutMs,
  formatExecOutput,
  gitCheckoutEnv,
  processStatus,
  secretsFor,
  type CommandSecrets,
  type PlatformProcessStatus,
} from './platform-exec.js';
import type { PlatformCapacity, PlatformProcessHandle, SandboxExecutor } from './platform-port.js';
import type { BackupContext, BoxCreated, BoxMetrics, ClusterCapacity, CreateBoxRequest, OutboundContext, ProcessSignal, Snapshot } from './types.js';

export { formatExecOutput, processStatus, startsWithWord, secretsFor, execTimeoutMs } from './platform-exec.js';
export type { PlatformProcessStatus } from './platform-exec.js';
export type { PlatformBackupHandle, PlatformCapacity, PlatformProcessHandle, SandboxExecutor } from './platform-port.js';

const WORKSPACE = '/workspace';
/** The bridge's default command timeout, named in the exec string when the caller gave none. */
const DEFAULT_EXEC_TIMEOUT_MS = 120_000;
/** The bridge's snapshot ttl bounds (bridge/schemas.ts CreateSnapshotRequest). */
const MIN_TTL_SECONDS = 60;
const MAX_TTL_SECONDS = 31_536_000;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const SIGNAL_NUMBERS: Record<string, ProcessSignal> = { '1': 'HUP', '2': 'INT', '3': 'QUIT', '9': 'KILL', '10': 'USR1', '12': 'USR2', '15': 'TERM', '18': 'CONT', '19': 'STOP' };
const SIGNALS: readonly ProcessSignal[] = ['TERM', 'KILL', 'INT', 'HUP', 'QUIT', 'USR1', 'USR2', 'STOP', 'CONT'];

/** A backup as the platform stores it (its `id` and `dir`), with what the bridge said about it. */
export interface ExecutorBackupHandle {
  /** The bridge's snapshot_id. */
  id: string;
  /** Always /workspace: what a backup holds. */
  dir: string;
  boxId: string;
  sessionId: string;
  name?: string;
  size: number;
  createdAt: string;
  expiresAt: string;
}

/**
 * The port's ProcessHandle, plus `exitCode`: set once getStatus has seen the process end (the
 * platform's bash tool reads it when an adapter offers it, for the real exit code).
 */
export interface ExecutorProcessHandle extends PlatformProcessHandle {
  exitCode: number | undefined;
  getStatus(): Promise<PlatformProcessStatus>;
}

export interface ClusterBridgeExecutorOptions {
  sessionId: string;
  /** image, cpu, memory, ... of the session's box when this executor creates it. */
  box?: Omit<CreateBoxRequest, 'sessionId' | 'snapshot_id'>;
  /** Default working directory of exec, processes and gitCheckout (the bridge's default: /workspace). */
  workdir?: string;
  /** Use this box (say, the one another executor of the session made) instead of finding or creating one. */
  boxId?: string;
  /**
   * On the first operation, use a live box the session already has (another replica's executor
   * made it) instead of creating one (default true). The oldest such box is taken.
   */
  adopt?: boolean;
}

export interface ExecutorFromEnvOptions extends Omit<BridgeClientOptions, 'url' | 'token'> {
  sessionId: string;
  /** Where to read the variables (default: process.env when there is one; an edge runtime passes its env bindings). */
  env?: EnvSource;
  /** The environment's config: `sandbox_provider: 'cluster-bridge'` selects this provider even when SANDBOX_PROVIDER says otherwise. */
  config?: ProviderConfig;
  workdir?: string;
  boxId?: string;
  adopt?: boolean;
}

export class ClusterBridgeExecutor implements Required<SandboxExecutor> {
  readonly client: BridgeClient;
  readonly sessionId: string;
  private readonly createRequest: CreateBoxRequest;
  private readonly workdir: string | undefined;
  private readonly attachTo: string | undefined;
  private readonly adopt: boolean;
  /** The session's box id once known; operations share it, so racing first operations make one box. */
  private boxPromise: Promise<string> | undefined;
  private currentBoxId: string | undefined;
  /** One Idempotency-Key for the session's create, kept across attempts (as ClusterBridgeSandbox does). */
  private createKey: string | undefined;
  private destroying: Promise<void> | undefined;
  private backupContext: BackupContext | undefined;
  private outboundContext: OutboundContext | undefined;
  /** Held here only (a private field: not in JSON.stringify or a logged object), sent per exec. */
  readonly #secrets: CommandSecrets[] = [];

  constructor(client: BridgeClient, options: ClusterBridgeExecutorOptions) {
    if (!options.sessionId) throw new TypeError('sessionId is required');
    this.client = client;
    this.sessionId = options.sessionId;
    this.createRequest = { ...options.box, sessionId: options.sessionId };
    this.workdir = options.workdir;
    this.attachTo = options.boxId;
    this.adopt = options.adopt ?? true;
  }

  /**
   * An executor configured from SANDBOX_PROVIDER, CLUSTER_BRIDGE_URL, CLUSTER_BRIDGE_TOKEN,
   * SANDBOX_IMAGE, CLUSTER_CPU and CLUSTER_MEMORY, validated exactly as
   * ClusterBridgeSandbox.fromEnv does (one SandboxConfigError naming every problem).
   */
  static fromEnv(options: ExecutorFromEnvOptions): ClusterBridgeExecutor {
    const { sessionId, env, config, workdir, boxId, adopt, ...clientOptions } = options;
    const settings = clusterBridgeConfig({ env, config });
    const client = createBridgeClient({ ...clientOptions, url: settings.url, token: settings.token });
    return new ClusterBridgeExecutor(client, { sessionId, workdir, boxId, adopt, box: settings.box });
  }

  /** The session's box id, once an operation has found or made it. */
  get boxId(): string | undefined {
    return this.currentBoxId;
  }

  // ---- commands ----

  async exec(command: string, timeout?: number): Promise<string> {
    const id = await this.ensureBox('exec');
    const timeoutMs = execTimeoutMs(timeout);
    const env = secretsFor(command, this.#secrets);
    const result = await this.client.exec(id, {
      command,
      ...(timeoutMs !== undefined ? { timeoutMs } : {}),
      ...(this.workdir ? { workdir: this.workdir } : {}),
      ...(env ? { env } : {}),
    });
    return formatExecOutput(result, timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS);
  }

  async startProcess(command: string): Promise<ExecutorProcessHandle> {
    const id = await this.ensureBox('start process');
    const env = secretsFor(command, this.#secrets);
    const info = await this.client.startProcess(id, { command, ...(this.workdir ? { workdir: this.workdir } : {}), ...(env ? { env } : {}) });
    return this.handle(id, info.process_id, info.pid);
  }

  /** A handle on a process of this session's box by its id: what another replica's executor uses. */
  async getProcess(processId: string): Promise<ExecutorProcessHandle> {
    const id = await this.ensureBox('get process');
    const info = await this.client.getProcess(id, processId);
    return this.handle(id, info.process_id, info.pid);
  }

  registerCommandSecrets(commandPrefix: string, secrets: Record<string, string>): void {
    const prefix = commandPrefix.trim();
    if (!prefix) throw new TypeError('registerCommandSecrets: the command prefix is empty');
    const bad = Object.keys(secrets).filter((name) => !ENV_NAME.test(name));
    // Names only: a value is never put in a message.
    if (bad.length) throw new TypeError(`registerCommandSecrets: invalid variable names ${bad.map((n) => JSON.stringify(n)).join(', ')} (must match ${ENV_NAME.source})`);
    const at = this.#secrets.findIndex((r) => r.prefix === prefix);
    const entry = { prefix, secrets: { ...secrets } };
    if (at >= 0) this.#secrets[at] = entry;
    else this.#secrets.push(entry);
  }

  async gitCheckout(repoUrl: string, options: { branch?: string; targetDir?: string } = {}): Promise<{ repoUrl: string; branch: string | null; targetDir: string | null; output: string }> {
    if (!repoUrl) throw new TypeError('gitCheckout: repoUrl is empty');
    const id = await this.ensureBox('git checkout');
    // Secrets registered for "git" reach this clone as they would reach `git clone <url>`.
    const env = { ...secretsFor(`git clone ${repoUrl}`, this.#secrets), ...gitCheckoutEnv(repoUrl, options) };
    const result = await this.client.exec(id, {
      command: GIT_CHECKOUT_COMMAND,
      env,
      timeoutMs: MAX_EXEC_TIMEOUT_MS,
      ...(this.workdir ? { workdir: this.workdir } : {}),
    });
    const output = formatExecOutput(result, MAX_EXEC_TIMEOUT_MS);
    if (result.exit_code === NO_GIT_EXIT && result.stderr.includes('git is not installed')) {
      throw new Error(`gitCheckout: git is not installed in the box's image${this.createRequest.image ? ` (${this.createRequest.image})` : ''}; use an image with git`);
    }
    if (result.exit_code !== 0) throw new Error(`gitCheckout: git clone of ${repoUrl} failed: ${output}`);
    return { repoUrl, branch: options.branch ?? null, targetDir: options.targetDir ?? null, output };
  }

  // ---- files and env ----

  async setEnvVars(envVars: Record<string, string>): Promise<void> {
    const id = await this.ensureBox('set env');
    await this.client.setEnv(id, envVars);
  }

  /** The file as text (UTF-8; bytes that are not UTF-8 become U+FFFD). */
  async readFile(path: string): Promise<string> {
    return new TextDecoder().decode(await this.readFileBytes(path));
  }

  /** The file's exact bytes (GET /files as application/octet-stream: raw, no base64). */
  async readFileBytes(path: string): Promise<Uint8Array> {
    const id = await this.ensureBox('read file');
    return this.client.downloadFile(id, path);
  }

  /** Writes UTF-8 text; returns the file's absolute path. */
  async writeFile(path: string, content: string): Promise<string> {
    const id = await this.ensureBox('write file');
    return (await this.client.writeFile(id, path, content)).path;
  }

  /** Writes bytes exactly (sent as base64); returns the file's absolute path. */
  async writeFileBytes(path: string, bytes: Uint8Array): Promise<string> {
    const id = await this.ensureBox('write file');
    return (await this.client.writeFile(id, path, bytes)).path;
  }

  // ---- mounts and context ----

  async mountMemoryStore(opts: { storeName: string; storeId: string; readOnly: boolean }): Promise<void> {
    const id = await this.ensureBox('mount memory store');
    await this.client.mountMemoryStore(id, { store_name: opts.storeName, store_id: opts.storeId, read_only: opts.readOnly });
  }

  async mountSessionOutputs(opts: { tenantId: string; sessionId: string }): Promise<void> {
    const id = await this.ensureBox('mount session outputs');
    await this.client.mountSessionOutputs(id, { tenant_id: opts.tenantId, session_id: opts.sessionId });
  }

  /**
   * Labels the box's snapshots (idle-sleep and final ones included) with this context. Before
   * the box exists it is kept and sent with the box's first operation, so a restore that comes
   * next can still make the box from its backup.
   */
  async setBackupContext(opts: { tenantId: string; environmentId: string; sessionId: string }): Promise<void> {
    this.backupContext = { tenant_id: opts.tenantId, environment_id: opts.environmentId, session_id: opts.sessionId };
    await this.sendContext({ backup: this.backupContext });
  }

  /** Records who the box's outbound calls are for (kept on the box; see docs/platform.md). Sent like setBackupContext. */
  async setOutboundContext(opts: { tenantId: string; sessionId: string }): Promise<void> {
    this.outboundContext = { tenant_id: opts.tenantId, session_id: opts.sessionId };
    await this.sendContext({ outbound: this.outboundContext });
  }

  /** Counts as activity for idle sleep, running nothing. Without a box there is nothing to keep awake. */
  async renewActivityTimeout(): Promise<void> {
    const id = await this.existingBox('keepalive');
    if (id) await this.client.keepalive(id);
  }

  /**
   * The box's CPU, memory (with its limit and OOM kills), disk, processes and network use
   * (GET /boxes/:id/metrics); since: also the samples after it (boxd keeps 10 minutes at 5 s).
   * Without a box, or with the box asleep: null (reading metrics never creates or wakes one).
   */
  async getMetrics(opts: { since?: Date } = {}): Promise<BoxMetrics | null> {
    const id = await this.existingBox('metrics');
    if (!id) return null;
    try {
      return await this.client.boxMetrics(id, opts.since ? { since: opts.since } : {});
    } catch (err) {
      if (err instanceof BridgeClientError && err.status === 409) return null;
      throw err;
    }
  }

  // ---- ports (docs/ports.md) ----

  /**
   * A link that opens a port an app in the box listens on (loopback is enough) in a browser
   * without the bridge token, until it expires (POST /boxes/:id/ports/:port/preview). Without a
   * box: null (there is no app to show). Making the link never wakes a sleeping box; opening it
   * does. Rejects with 501 when the bridge has no PREVIEW_URL.
   */
  async previewUrl(port: number, opts: { expiresInSeconds?: number } = {}): Promise<{ url: string; expiresAt: Date } | null> {
    const id = await this.existingBox('preview');
    if (!id) return null;
    const link = await this.client.createPreview(id, port, opts);
    return { url: link.url, expiresAt: new Date(link.expires_at) };
  }

  // ---- backups ----

  /** A snapshot of the workspace now (labelled with the backup context). Without a box: nothing to take. */
  async snapshotWorkspaceNow(): Promise<void> {
    const id = await this.existingBox('snapshot');
    if (id) await this.client.snapshot(id);
  }

  /**
   * Snapshots /workspace (and the env) for `ttlSec` (60 s to a year; at most the pool's
   * retention). Null when there is no box yet (nothing to back up) or the bridge has no object
   * store (501); any other failure throws, so a failed backup never reads as an unneeded one.
   */
  async createWorkspaceBackup(opts: { name?: string; ttlSec: number }): Promise<ExecutorBackupHandle | null> {
    const id = await this.existingBox('backup');
    if (!id) return null;
    const ttlSeconds = Number.isFinite(opts.ttlSec) ? Math.min(MAX_TTL_SECONDS, Math.max(MIN_TTL_SECONDS, Math.ceil(opts.ttlSec))) : undefined;
    try {
      const snap = await this.client.snapshot(id, { ...(opts.name ? { name: opts.name.slice(0, 128) } : {}), ...(ttlSeconds !== undefined ? { ttlSeconds } : {}) });
      return backupHandle(snap);
    } catch (err) {
      if (err instanceof BridgeClientError && err.status === 501) return null;
      throw err;
    }
  }

  /**
   * Restores a backup's workspace into this session's box; never throws. Before the box exists
   * the box is made from the backup (one call). Otherwise the box keeps its id, env and
   * processes and its /workspace becomes the backup's exactly: see restoreInto.
   */
  async restoreWorkspaceBackup(handle: { id: string; dir?: string; localBucket?: boolean }): Promise<{ ok: boolean; error?: string }> {
    try {
      if (!handle || typeof handle.id !== 'string' || !handle.id) return { ok: false, error: 'restoreWorkspaceBackup: the handle has no id' };
      if (this.destroying) return { ok: false, error: `the sandbox of session ${this.sessionId} was destroyed` };
      const snap = await this.client.getSnapshot(handle.id).catch((err: unknown) => {
        if (err instanceof BridgeClientError && (err.status === 404 || err.status === 400)) return undefined;
        throw err;
      });
      if (!snap) return { ok: false, error: `backup ${handle.id} not found: it expired or was deleted` };
      if (Date.parse(snap.expires_at) <= Date.now()) return { ok: false, error: `backup ${handle.id} expired at ${snap.expires_at}` };
      const adoptable = this.boxPromise || this.attachTo ? undefined : await this.sessionBox();
      // Checked again after the listing: an operation may have started making the box meanwhile.
      if (!this.boxPromise && !this.attachTo && !adoptable) {
        await this.createFrom(snap.snapshot_id);
        return { ok: true };
      }
      await this.restoreInto(await this.ensureBox('restore'), snap.snapshot_id);
      return { ok: true };
    } catch (err) {
      return { ok: false, error: err instanceof Error ? err.message : String(err) };
    }
  }

  // ---- lifecycle and health ----

  /**
   * Deletes the box. Idempotent: a box already gone counts as deleted, an executor that never
   * had a box does nothing; later operations fail with type `sandbox_destroyed`.
   */
  destroy(): Promise<void> {
    this.destroying ??= this.deleteBox().catch((err: unknown) => {
      this.destroying = undefined; // a failed delete may be tried again
      throw err;
    });
    return this.destroying;
  }

  /**
   * Never throws. With a box: its status (GET, which never wakes a sleeping box), ok while it is
   * Pending, Running or Sleeping. Without one: the bridge's health.
   */
  async ping(): Promise<{ status: 'ok' | 'error'; latencyMs: number; details?: string }> {
    const started = Date.now();
    const latencyMs = () => Date.now() - started;
    try {
      const id = this.currentBoxId;
      if (id) {
        const s = await this.client.status(id, { timeoutMs: 10_000 });
        if (s.status === 'Failed' || s.status === 'Terminated') return { status: 'error', latencyMs: latencyMs(), details: `box ${id} is ${s.status}${s.failure ? `: ${s.failure}` : ''}` };
      } else {
        const h = await this.client.health({ timeoutMs: 10_000 });
        if (h.status !== 'ok') return { status: 'error', latencyMs: latencyMs(), details: `bridge health is ${h.status}` };
      }
      return { status: 'ok', latencyMs: latencyMs() };
    } catch (err) {
      return { status: 'error', latencyMs: latencyMs(), details: err instanceof Error ? err.message : String(err) };
    }
  }

  /** The cluster's capacity for boxes (GET /cluster/capacity); null when it cannot be read. Never throws. */
  async getCapacity(): Promise<PlatformCapacity | null> {
    try {
      return capacityOf(await this.client.getCapacity({ timeoutMs: 10_000 }));
    } catch {
      return null;
    }
  }

  // ---- the box ----

  private handle(boxId: string, processId: string, pid: number): ExecutorProcessHandle {
    const client = this.client;
    const handle: ExecutorProcessHandle = {
      id: processId,
      pid,
      exitCode: undefined,
      async kill(signal = 'TERM') {
        try {
          await client.signalProcess(boxId, processId, signalOf(signal));
        } catch (err) {
          // Already exited: nothing left to kill.
          if (!(err instanceof BridgeClientError && err.status === 409)) throw err;
        }
      },
      async getLogs() {
        let stdout = '';
        let stderr = '';
        for await (const event of client.processOutput(boxId, processId)) {
          if (event.type === 'stdout') stdout += event.data;
          else if (event.type === 'stderr') stderr += event.data;
        }
        return { stdout, stderr };
      },
      async getStatus(): Promise<PlatformProcessStatus> {
        const info = await client.getProcess(boxId, processId);
        if (info.status === 'exited') handle.exitCode = info.exit_code;
        return processStatus(info);
      },
    };
    return handle;
  }

  private ensureBox(operation: string): Promise<string> {
    if (this.destroying) return Promise.reject(destroyedError(operation, this.sessionId));
    this.boxPromise ??= this.acquireBox().then(
      (id) => {
        this.currentBoxId = id;
        return id;
      },
      (err: unknown) => {
        this.boxPromise = undefined; // the next operation tries again
        throw err;
      },
    );
    return this.boxPromise;
  }

  /** The box if this executor has (or is getting) one; undefined otherwise. Never creates one. */
  private async existingBox(operation: string): Promise<string | undefined> {
    if (this.destroying) throw destroyedError(operation, this.sessionId);
    if (this.boxPromise) return this.boxPromise;
    if (this.attachTo || (await this.sessionBox())) return this.ensureBox(operation);
    return undefined;
  }

  private async acquireBox(): Promise<string> {
    const id = this.attachTo ?? (await this.sessionBox()) ?? (await this.create()).box_id;
    await this.applyContext(id);
    return id;
  }

  /** A live box of the session another executor made, when adopting (the oldest: the list's order). */
  private async sessionBox(): Promise<string | undefined> {
    if (!this.adopt) return undefined;
    const { sandboxes } = await this.client.sandboxes({ sessionId: this.sessionId });
    return sandboxes.find((b) => b.status === 'Running' || b.status === 'Pending' || b.status === 'Sleeping')?.box_id;
  }

  private create(): Promise<BoxCreated> {
    this.createKey ??= newIdempotencyKey();
    return this.client.createBox(this.createRequest, { idempotencyKey: this.createKey });
  }

  /** The session's first box, made from a snapshot (the fast restore: nothing to replace). */
  private async createFrom(snapshotId: string): Promise<void> {
    const { sessionId, ...rest } = this.createRequest;
    const made = this.client.fromSnapshot(snapshotId, { ...rest, sessionId }).then(async (box) => {
      await this.applyContext(box.box_id);
      this.currentBoxId = box.box_id;
      return box.box_id;
    });
    this.boxPromise = made;
    await made.catch((err: unknown) => {
      if (this.boxPromise === made) this.boxPromise = undefined;
      throw err;
    });
  }

  /**
   * Makes the box's /workspace the snapshot's, keeping the box (id, env, processes): the bridge
   * extracts the whole snapshot in the box before anything in /workspace changes, then swaps
   * (POST /boxes/{id}/restore). A failure before the swap leaves the workspace as it was.
   */
  private async restoreInto(boxId: string, snapshotId: string): Promise<void> {
    await this.client.restoreSnapshot(boxId, snapshotId);
  }

  private async sendContext(req: { backup?: BackupContext; outbound?: OutboundContext }): Promise<void> {
    if (this.destroying) throw destroyedError('set context', this.sessionId);
    // Before the box exists, acquireBox sends it with the rest; while it is being made, after.
    if (!this.boxPromise) return;
    await this.client.setContext(await this.boxPromise, req);
  }

  private async applyContext(boxId: string): Promise<void> {
    const req = { ...(this.backupContext ? { backup: this.backupContext } : {}), ...(this.outboundContext ? { outbound: this.outboundContext } : {}) };
    if (req.backup || req.outbound) await this.client.setContext(boxId, req);
  }

  private async deleteBox(): Promise<void> {
    // A box being made would otherwise be left behind.
    const id = this.boxPromise ? await this.boxPromise.catch(() => undefined) : undefined;
    if (!id) return;
    try {
      await this.client.deleteBox(id);
    } catch (err) {
      if (!(err instanceof BridgeClientError && err.status === 404)) throw err;
    }
  }
}

function backupHandle(s: Snapshot): ExecutorBackupHandle {
  return {
    id: s.snapshot_id,
    dir: WORKSPACE,
    boxId: s.box_id,
    sessionId: s.session_id,
    ...(s.name !== undefined ? { name: s.name } : {}),
    size: s.size,
    createdAt: s.created_at,
    expiresAt: s.expires_at,
  };
}

/** The bridge's capacity in the platform's shape (cores, MiB, pods). */
export function capacityOf(c: ClusterCapacity): PlatformCapacity {
  return {
    cpu: { used: c.cpu.used, total: c.cpu.total, unit: 'cores' },
    memory: { used: c.memory.used, total: c.memory.total, unit: 'MiB' },
    pods: { used: c.pods.used, total: c.pods.total },
  };
}

/** `TERM`, `SIGTERM`, `sigterm` and `15` are the same signal; anything else is refused here, before a call. */
export function signalOf(signal: string | number): ProcessSignal {
  const text = String(signal).trim().toUpperCase().replace(/^SIG/, '');
  const named = SIGNAL_NUMBERS[text] ?? (SIGNALS as readonly string[]).find((s) => s === text);
  if (!named) throw new TypeError(`kill: unsupported signal ${JSON.stringify(signal)} (one of ${SIGNALS.join(', ')})`);
  return named as ProcessSignal;
}

function destroyedError(operation: string, sessionId: string): BridgeClientError {
  return new BridgeClientError({ operation, status: 0, type: 'sandbox_destroyed', message: `${operation} failed: the sandbox of session ${sessionId} was destroyed` });
}
