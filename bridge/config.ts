// Bridge configuration: environment variables, validated with zod at start-up. A bad value
// stops the process with a message naming the variable.
import { readFileSync } from 'node:fs';
import { ConfigError, configProblems, readBoxdKey, readEgressKey, readSnapshotKeys } from '../common/config.js';
import { z } from 'zod';
import { LOG_LEVELS } from '../common/logger.js';
import { ObjectStoreConfigSchema, objectStoreProblems } from '../common/object-store.js';
import { PreviewUrls } from './services/preview-links.js';

const int = (def: number, min = 0) => z.coerce.number().int().min(min).default(def);
const MiB = 1024 * 1024;

export const ConfigSchema = z
  .object({
    PORT: int(8080),
    METRICS_PORT: int(9090),
    HOST: z.string().default('0.0.0.0'),
    LOG_LEVEL: z.enum(LOG_LEVELS).default('info'),
    /**
     * Bearer tokens (http/tokens.ts): one admin token, or a file holding it (a mounted Secret;
     * re-read when it changes), and/or a file of named tokens with scopes.
     */
    BRIDGE_TOKEN: z.string().min(16, 'must be at least 16 characters').optional(),
    BRIDGE_TOKEN_FILE: z.string().optional(),
    BRIDGE_TOKENS_FILE: z.string().optional(),
    /** SandboxPool whose policy this bridge serves. */
    POOL_NAME: z.string().default('default'),
    /** Sandbox namespace used while the SandboxPool does not exist (it names its own). */
    SANDBOX_NAMESPACE: z.string().default('sandbox'),
    /** Default box image used while the SandboxPool does not exist. */
    BOX_DEFAULT_IMAGE: z.string().optional(),
    BOX_NAME_PREFIX: z
      .string()
      .regex(/^[a-z]([-a-z0-9]{0,30}[a-z0-9])?$/, 'must be a short DNS label')
      .default('box'),
    /** How long exec/files/env wait for a new box to start before giving up. */
    BOX_START_TIMEOUT_MS: int(120_000, 1),
    /** The key box credentials are derived from (shared by every replica and the operator), or a file holding it. */
    BOXD_KEY: z.string().min(32, 'must be at least 32 characters').optional(),
    BOXD_KEY_FILE: z.string().optional(),
    /**
     * The egress gateway's key (its key file: a key per line, the first signs), or the key itself:
     * boxes of gateway-mode pools get their proxy credential from it (common/egress-proxy.ts).
     */
    EGRESS_KEY: z.string().optional(),
    EGRESS_KEY_FILE: z.string().min(1).optional(),
    /** Image whose /boxd the box's init container installs (the Dockerfile's `boxd` target). */
    BOXD_IMAGE: z.string().min(1, 'must name the boxd image'),
    /**
     * The pod annotation a CNI plugin writes a new pod's address into before the kubelet reports
     * it (Calico's; services/box-connector.ts podAddress): a new box answers up to a second
     * sooner. Empty: status.podIP only.
     */
    POD_IP_ANNOTATION: z.string().default('cni.projectcalico.org/podIP'),
    /** A new connection to a box's agent taking longer than this counts as unreachable. */
    BOXD_CONNECT_TIMEOUT_MS: int(2000, 100),
    /**
     * A call into a box that moves no byte for this long (waiting for the answer's first byte,
     * or in a body) asks boxd's health; no answer within it either ends the call with 503.
     */
    BOXD_IDLE_TIMEOUT_MS: int(5000, 100),
    /** Total deadline of a call into a box answered whole (env, processes, stdin, signals). */
    BOXD_CALL_TIMEOUT_MS: int(60_000, 1000),
    /** Total deadline of a file or archive transfer, a listing or a delete. */
    BOXD_TRANSFER_TIMEOUT_MS: int(600_000, 1000),
    /** The largest JSON answer the bridge reads from a box (a file listing, the process list). */
    BOXD_ANSWER_LIMIT_BYTES: int(32 * MiB, 64 * 1024),
    EXEC_OUTPUT_LIMIT_BYTES: int(10 * MiB, 1),
    FILE_SIZE_LIMIT_BYTES: int(50 * MiB, 1),
    ARCHIVE_SIZE_LIMIT_BYTES: int(50 * MiB, 1),
    ARCHIVE_MAX_ENTRIES: int(100_000, 1),
    /** Live background processes and terminals per box. */
    MAX_PROCESSES_PER_BOX: int(32, 1),
    /** File watches of one box at once, across every replica (boxd counts them; one more is 429). */
    FILE_WATCHES_PER_BOX: int(16, 1),
    /**
     * Bytes this replica may hold for requests at once: exec answers, JSON file reads, transfers,
     * output streams, terminals, answers from boxes (services/byte-budget.ts). Beyond: 503, retry.
     */
    TRANSFER_BUDGET_BYTES: int(192 * MiB, 4 * MiB),
    /** Requests per second and burst per token name (per replica). */
    RATE_LIMIT_RPS: int(100, 1),
    RATE_LIMIT_BURST: int(200, 1),
    /** Requests without a valid token allowed per source address and minute (per replica). */
    RATE_LIMIT_AUTH_FAILURES_PER_MINUTE: int(30, 1),
    /**
     * GET /cluster/capacity counts the requests of every pod on the box nodes (needs pods
     * list/watch in all namespaces) instead of the boxes' only (docs/capacity.md).
     */
    CAPACITY_ALL_PODS: z.enum(['true', 'false']).default('false').transform((v) => v === 'true'),
    /** Express "trust proxy": set it (e.g. 1) behind an ingress so limits apply per real client. */
    TRUST_PROXY: z.string().default('false'),
    KUBE_TIMEOUT_MS: int(15_000, 100),
    /**
     * A Kubernetes call without an answer for 1 s makes the bridge probe the API server with
     * this timeout; no answer means down, and writes then fail fast (common/api-health.ts).
     */
    KUBE_PROBE_TIMEOUT_MS: int(1000, 100),
    /** At start-up, give up (and exit, to be restarted) if the caches cannot fill in this time. */
    STARTUP_TIMEOUT_MS: int(60_000, 100),
    /** On SIGTERM, in-flight requests (execs) get this long to finish. */
    SHUTDOWN_GRACE_MS: int(30_000),
    /**
     * Key(s) sealing a snapshot's env (AES-256-GCM), one per line, at least 32 characters each:
     * the first seals, all open (rotation). Needed when the object store is configured.
     */
    SNAPSHOT_ENCRYPTION_KEY: z.string().optional(),
    SNAPSHOT_ENCRYPTION_KEY_FILE: z.string().optional(),
    /** Most entries (files, dirs, links) a snapshot may restore into a box. */
    /** How long a box lease (a wake) lives unrenewed before another party may take it over (docs/lifecycle.md). */
    BOX_LEASE_SECONDS: int(30, 5),
    /** Traffic to a box's ports (docs/ports.md): requests and WebSockets at once per box (boxd counts them, across replicas). */
    PORT_MAX_CONNECTIONS_PER_BOX: int(256, 1),
    /** Bytes per second through one box's ports, both ways together (boxd slows transfers beyond it); 0: no limit. */
    PORT_BYTES_PER_SECOND_PER_BOX: int(64 * MiB),
    /** An app must begin its answer within this: 504 otherwise. */
    PORT_FIRST_BYTE_TIMEOUT_MS: int(120_000, 100),
    /** An answer or WebSocket through a port with no byte either way for this long is closed. */
    PORT_IDLE_TIMEOUT_MS: int(600_000, 100),
    /**
     * Where preview links are served: a host pattern naming {port} and {box}
     * (https://{port}-{box}.preview.example.com), or a URL with a path prefix
     * (https://bridge.example.com/preview). Unset: no preview links (501).
     */
    PREVIEW_URL: z.string().optional(),
    /** The key preview links are signed with (HMAC-SHA256), at least 32 characters, the same on every replica; or a file holding it. */
    PREVIEW_KEY: z.string().optional(),
    PREVIEW_KEY_FILE: z.string().min(1).optional(),
    /** Lifetime of a preview link when the request names none, and the longest one may ask for. */
    PREVIEW_TTL_SECONDS: int(3600, 1),
    PREVIEW_MAX_TTL_SECONDS: int(7 * 24 * 3600, 1),
  })
  .extend(ObjectStoreConfigSchema.shape);

export type Config = z.infer<typeof ConfigSchema>;

export { ConfigError };

export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const parsed = ConfigSchema.safeParse(env);
  const problems = parsed.success ? [] : configProblems(parsed.error);
  // Checked here rather than in the schema so it is reported together with every other problem.
  if (!env.BRIDGE_TOKEN && !env.BRIDGE_TOKEN_FILE && !env.BRIDGE_TOKENS_FILE) {
    problems.push('BRIDGE_TOKEN: set BRIDGE_TOKEN, BRIDGE_TOKEN_FILE or BRIDGE_TOKENS_FILE');
  }
  if (!env.BOXD_KEY && !env.BOXD_KEY_FILE) problems.push('BOXD_KEY: set BOXD_KEY or BOXD_KEY_FILE');
  if (parsed.success) problems.push(...objectStoreProblems(parsed.data));
  if (parsed.success && parsed.data.OBJECT_STORE_BUCKET && !env.SNAPSHOT_ENCRYPTION_KEY && !env.SNAPSHOT_ENCRYPTION_KEY_FILE) {
    problems.push('SNAPSHOT_ENCRYPTION_KEY: with an object store (OBJECT_STORE_BUCKET), set SNAPSHOT_ENCRYPTION_KEY or SNAPSHOT_ENCRYPTION_KEY_FILE');
  }
  if (parsed.success) problems.push(...previewProblems(parsed.data));
  if (!parsed.success || problems.length > 0) throw new ConfigError('bridge', problems);
  // The token files themselves are read (and a start-up without any token refused) by createTokenSource.
  boxdKey(parsed.data);
  snapshotKeys(parsed.data);
  egressKey(parsed.data);
  previewKey(parsed.data);
  return parsed.data;
}

/** Preview links need a URL and a key together; the URL must be one of the two forms. */
function previewProblems(c: Config): string[] {
  const problems: string[] = [];
  const key = c.PREVIEW_KEY !== undefined || c.PREVIEW_KEY_FILE !== undefined;
  if (c.PREVIEW_URL && !key) problems.push('PREVIEW_KEY: with PREVIEW_URL, set PREVIEW_KEY or PREVIEW_KEY_FILE');
  if (key && !c.PREVIEW_URL) problems.push('PREVIEW_URL: with a preview key, set where links are served (docs/ports.md)');
  if (c.PREVIEW_URL) {
    try {
      new PreviewUrls(c.PREVIEW_URL);
    } catch (err) {
      problems.push(`PREVIEW_URL: ${(err as Error).message}`);
    }
  }
  if (c.PREVIEW_TTL_SECONDS > c.PREVIEW_MAX_TTL_SECONDS) problems.push('PREVIEW_TTL_SECONDS: must not exceed PREVIEW_MAX_TTL_SECONDS');
  return problems;
}

/** The key preview links are signed with, from PREVIEW_KEY or PREVIEW_KEY_FILE; undefined without one. */
export function previewKey(config: Pick<Config, 'PREVIEW_KEY' | 'PREVIEW_KEY_FILE'>): Buffer | undefined {
  let value = config.PREVIEW_KEY;
  if (value === undefined && config.PREVIEW_KEY_FILE) {
    try {
      value = readFileSync(config.PREVIEW_KEY_FILE, 'utf8').trim();
    } catch (err) {
      throw new ConfigError('bridge', [`PREVIEW_KEY_FILE: cannot read ${config.PREVIEW_KEY_FILE} (${(err as Error).message})`]);
    }
  }
  if (value === undefined) return undefined;
  if (Buffer.byteLength(value) < 32) throw new ConfigError('bridge', ['PREVIEW_KEY: must be at least 32 characters']);
  return Buffer.from(value, 'utf8');
}

/** The egress key (common/config.ts readEgressKey); undefined without one. */
export function egressKey(config: Pick<Config, 'EGRESS_KEY' | 'EGRESS_KEY_FILE'>): Buffer | undefined {
  return readEgressKey('bridge', config.EGRESS_KEY, config.EGRESS_KEY_FILE);
}

/** The keys sealing snapshot envs (common/config.ts readSnapshotKeys). */
export function snapshotKeys(config: Pick<Config, 'SNAPSHOT_ENCRYPTION_KEY' | 'SNAPSHOT_ENCRYPTION_KEY_FILE'>): string[] {
  return readSnapshotKeys('bridge', config.SNAPSHOT_ENCRYPTION_KEY, config.SNAPSHOT_ENCRYPTION_KEY_FILE);
}

/** The boxd key as bytes, from BOXD_KEY or BOXD_KEY_FILE. */
export function boxdKey(config: Pick<Config, 'BOXD_KEY' | 'BOXD_KEY_FILE'>): Buffer {
  return readBoxdKey('bridge', config.BOXD_KEY, config.BOXD_KEY_FILE);
}

/** Express's trust proxy setting from TRUST_PROXY ("false", "true", a hop count or a list). */
export function trustProxySetting(value: string): boolean | number | string {
  if (value === 'false' || value === '') return false;
  if (value === 'true') return true;
  if (/^\d+$/.test(value)) return Number(value);
  return value;
}
