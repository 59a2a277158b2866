// Operator configuration from the environment, validated up front so a bad value stops the
// process with a message naming the variable instead of failing later.
import { ConfigError, configProblems, readBoxdKey, readEgressKey, readSnapshotKeys } from '../common/config.js';
import { existsSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import { LOG_LEVELS } from '../common/logger.js';
import { ObjectStoreConfigSchema, objectStoreProblems } from '../common/object-store.js';
import { WebhooksFile, type WebhookEndpoint } from './webhooks.js';

const port = z.coerce.number().int().min(1).max(65535);
const positiveInt = z.coerce.number().int().positive();

export const ConfigSchema = z.object({
  KUBECONFIG: z.string().min(1).optional(),
  LOG_LEVEL: z.enum(LOG_LEVELS).default('info'),
  METRICS_PORT: port.default(9090),
  METRICS_HOST: z.string().min(1).default('0.0.0.0'),
  LEASE_NAMESPACE: z.string().regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, 'must be a namespace name').default('default'),
  LEASE_NAME: z.string().regex(/^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$/, 'must be a DNS subdomain').default('sandbox-bridge-operator'),
  POD_NAME: z.string().min(1).optional(),
  LEASE_DURATION_SECONDS: positiveInt.default(10),
  LEASE_RENEW_SECONDS: positiveInt.default(2),
  /** Label selector of the SandboxPools this operator handles (empty: all); for sharding or canaries. */
  POOL_SELECTOR: z.string().default(''),
  /**
   * The namespaces pools may use, comma-separated: the operator watches only these (it needs
   * permissions only there) and reports a pool in any other namespace as not Ready. Empty: every
   * namespace, which needs cluster-wide permissions.
   */
  WATCH_NAMESPACES: z
    .string()
    .default('')
    .transform((v) => [...new Set(v.split(',').map((n) => n.trim()).filter(Boolean))])
    .pipe(z.array(z.string().regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, 'must be namespace names, comma-separated').max(63))),
  WORKERS: positiveInt.max(32).default(2),
  REAP_CONCURRENCY: positiveInt.max(256).default(32),
  REAP_BATCH: positiveInt.default(1000),
  ORPHAN_SECRET_GRACE_SECONDS: z.coerce.number().int().min(0).default(30),
  /** A box Pending longer than this is reported (event, metric, webhook) as stuck. */
  STUCK_PENDING_SECONDS: positiveInt.default(300),
  /** Box-failure webhooks (operator/webhooks.ts): a JSON file {"endpoints": [...]}, usually a mounted Secret. */
  WEBHOOKS_FILE: z.string().min(1).optional(),
  /** The HMAC-SHA256 signing key of webhook deliveries, in a file (a mounted Secret). */
  WEBHOOK_SIGNING_KEY_FILE: z.string().min(1).optional(),
  WEBHOOK_DEBOUNCE_SECONDS: z.coerce.number().int().min(0).default(60),
  WEBHOOK_MAX_ATTEMPTS: positiveInt.max(20).default(6),
  WEBHOOK_TIMEOUT_SECONDS: positiveInt.max(120).default(10),
  /**
   * Snapshot retention (with an object store, OBJECT_STORE_*): the longest wait between two sweeps
   * of a pool's snapshots, and how old what a failed snapshot left must be before it goes.
   */
  SNAPSHOT_SWEEP_SECONDS: positiveInt.default(300),
  SNAPSHOT_INCOMPLETE_GRACE_SECONDS: positiveInt.default(3600),
  /**
   * Warm boxes: the boxd image their init container installs from and the key their credentials
   * derive from — the same as the bridge's. Without them the operator keeps no warm boxes.
   */
  BOXD_IMAGE: z.string().min(1).optional(),
  BOXD_KEY: z.string().optional(),
  BOXD_KEY_FILE: z.string().min(1).optional(),
  /**
   * Idle sleep (operator/idle-sleep.ts) needs the object store, the boxd key and the keys that
   * seal a snapshot's env — the bridge's SNAPSHOT_ENCRYPTION_KEY(_FILE). Without them boxes never sleep.
   */
  SNAPSHOT_ENCRYPTION_KEY: z.string().optional(),
  SNAPSHOT_ENCRYPTION_KEY_FILE: z.string().min(1).optional(),
  /**
   * The egress gateway's key (its key file, or the key itself): warm boxes of gateway-mode pools
   * get their proxy credential from it (common/egress-proxy.ts). Without it they get none (407).
   */
  EGRESS_KEY: z.string().optional(),
  EGRESS_KEY_FILE: z.string().min(1).optional(),
  /**
   * Rotating a pool's egress CA (operator/egress-ca.ts): how long the new CA is trusted by boxes
   * before the gateway signs with it. Longer than the kubelet takes to update a ConfigMap volume.
   */
  EGRESS_CA_PROPAGATION_SECONDS: positiveInt.default(180),
  /** Boxes put to sleep at once (each streams its workspace to the store). */
  SLEEP_WORKERS: positiveInt.max(32).default(2),
  /** How long a box lease (sleep, wake) lives unrenewed before another party may take it over. */
  BOX_LEASE_SECONDS: positiveInt.min(5).max(600).default(30),
  /**
   * Box PID limits (operator/node-checks.ts): read the kubelet configuration of each node running
   * boxes through the API server's node proxy, which needs `get` on nodes/proxy (a powerful
   * permission, so off by default), and read each again after NODE_CHECK_INTERVAL_SECONDS.
   */
  NODE_CHECKS: z.enum(['true', 'false']).default('false').transform((v) => v === 'true'),
  NODE_CHECK_INTERVAL_SECONDS: positiveInt.min(5).default(3600),
}).extend(ObjectStoreConfigSchema.shape);

export type OperatorConfig = z.infer<typeof ConfigSchema> & {
  identity: string;
  /** From WEBHOOKS_FILE and WEBHOOK_SIGNING_KEY_FILE, read and checked at start-up. */
  webhooks: { endpoints: WebhookEndpoint[]; signingKey?: string };
  /** From BOXD_IMAGE and BOXD_KEY(_FILE): what warm boxes need. */
  boxd?: { image: string; key: Buffer };
  /** From SNAPSHOT_ENCRYPTION_KEY(_FILE): sealing the env of idle-sleep snapshots. */
  snapshotKeys: string[];
  /** From EGRESS_KEY(_FILE): warm boxes' egress proxy credentials. */
  egressKey?: Buffer;
};

export function loadConfig(env: NodeJS.ProcessEnv = process.env): OperatorConfig {
  const parsed = ConfigSchema.safeParse(env);
  if (!parsed.success) throw new ConfigError('operator', configProblems(parsed.error));
  const c = parsed.data;
  const storeProblems = objectStoreProblems(c);
  if (storeProblems.length) throw new ConfigError('operator', storeProblems);
  if (c.LEASE_RENEW_SECONDS * 2 > c.LEASE_DURATION_SECONDS) {
    throw new ConfigError('operator', ['LEASE_RENEW_SECONDS must be at most half of LEASE_DURATION_SECONDS']);
  }
  // Unique per process even when two replicas share a host name (client-go does the same).
  const hasKey = c.BOXD_KEY !== undefined || c.BOXD_KEY_FILE !== undefined;
  if (Boolean(c.BOXD_IMAGE) !== hasKey) throw new ConfigError('operator', ['BOXD_IMAGE and BOXD_KEY (or BOXD_KEY_FILE): set both, for warm boxes, or neither']);
  const boxd = c.BOXD_IMAGE ? { image: c.BOXD_IMAGE, key: readBoxdKey('operator', c.BOXD_KEY, c.BOXD_KEY_FILE) } : undefined;
  const snapshotKeys = readSnapshotKeys('operator', c.SNAPSHOT_ENCRYPTION_KEY, c.SNAPSHOT_ENCRYPTION_KEY_FILE);
  const egressKey = readEgressKey('operator', c.EGRESS_KEY, c.EGRESS_KEY_FILE);
  return {
    ...c,
    identity: `${c.POD_NAME ?? hostname()}_${randomUUID().slice(0, 8)}`,
    webhooks: readWebhooks(c),
    snapshotKeys,
    ...(boxd ? { boxd } : {}),
    ...(egressKey ? { egressKey } : {}),
  };
}

function readWebhooks(c: z.infer<typeof ConfigSchema>): OperatorConfig['webhooks'] {
  const read = (variable: string, path: string) => {
    try {
      return readFileSync(path, 'utf8');
    } catch (err) {
      throw new ConfigError('operator', [`${variable}: cannot read ${path} (${(err as Error).message})`]);
    }
  };
  let endpoints: WebhookEndpoint[] = [];
  if (c.WEBHOOKS_FILE) {
    let json: unknown;
    try {
      json = JSON.parse(read('WEBHOOKS_FILE', c.WEBHOOKS_FILE));
    } catch (err) {
      if (err instanceof ConfigError) throw err;
      throw new ConfigError('operator', [`WEBHOOKS_FILE: ${c.WEBHOOKS_FILE} is not valid JSON (${(err as Error).message})`]);
    }
    const parsed = WebhooksFile.safeParse(json);
    if (!parsed.success) throw new ConfigError('operator', configProblems(parsed.error).map((p) => `WEBHOOKS_FILE: ${p}`));
    endpoints = parsed.data.endpoints;
  }
  // A Secret without the key (Slack-only endpoints need none) leaves deliveries unsigned;
  // createWebhooks says so in the log.
  const signingKey = c.WEBHOOK_SIGNING_KEY_FILE && existsSync(c.WEBHOOK_SIGNING_KEY_FILE) ? read('WEBHOOK_SIGNING_KEY_FILE', c.WEBHOOK_SIGNING_KEY_FILE).trim() : undefined;
  return { endpoints, ...(signingKey ? { signingKey } : {}) };
}

export { ConfigError };
