// The API contract as zod schemas: requests are validated with them, and the OpenAPI
// document (openapi.ts) is generated from them, so the two cannot drift apart.
import { z } from 'zod';
import { ERROR_STATUS, type ErrorType } from '../common/errors.js';

export const MAX_EXEC_TIMEOUT_MS = 600_000;
export const DEFAULT_EXEC_TIMEOUT_MS = 120_000;
export const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

const EnvVars = z
  .record(
    z.string().regex(ENV_NAME, 'environment variable names must match ^[A-Za-z_][A-Za-z0-9_]*$'),
    z.string().refine((value) => !value.includes('\0'), 'environment variable values must not contain NUL bytes'),
  )
  .describe('Environment variables (name to value). Values are stored in a Secret and never returned.');

const Workdir = z.string().min(1).max(4096).default('/workspace').describe('Relative paths resolve under /workspace');

// ---- path and header parameters (the routes read them as strings; these describe them) ----

/** Box ids are pod names: DNS labels. Anything else is refused (400) before the cluster is asked. */
export const BOX_ID = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
export const BoxParams = z.object({ id: z.string().regex(BOX_ID).describe('box_id of the box') });
export const ProcessParams = BoxParams.extend({ pid: z.string().min(1).describe('process_id from POST /boxes/{id}/processes') });
export const SnapshotParams = z.object({ id: z.string().min(1).max(128).describe('snapshot_id from POST /boxes/{id}/snapshots') });
export const PodParams = z.object({ podName: z.string().regex(BOX_ID).describe('Name of a box pod (GET /sandboxes lists them)') });

export const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;
export const CreateBoxHeaders = z.object({
  'Idempotency-Key': z
    .string()
    .regex(IDEMPOTENCY_KEY, 'Idempotency-Key must be 1-255 visible ASCII characters')
    .optional()
    .describe('The same key (and session) within 24 h answers with the box the first request made'),
});

// ---- requests ----

// The egress part of a create (docs/api.md "Egress"; checked by common/box-egress.ts).
const EgressPattern = z.string().min(1).max(255);
export const BoxEgressRequest = z
  .object({
    allow: z
      .array(EgressPattern)
      .max(256)
      .describe("The box's allow list: a name, *.name, * or an IP address, each within the pool's spec.egress.domains.allow"),
  })
  .strict()
  .describe('Narrows what the box may reach through the egress gateway (pools in gateway mode)');
export const CreateBoxRequest = z
  .object({
    sessionId: z.string().min(1).max(1024).describe('Owning session identifier'),
    image: z.string().min(1).max(512).optional().describe("Container image; must be the pool's default or allowlisted"),
    cpu: z.number().positive().optional().describe('Cores, fractional allowed (default from the pool, 1)'),
    memory: z.number().int().positive().optional().describe('MiB (default from the pool, 512)'),
    env: EnvVars.optional(),
    runtimeClassName: z.string().min(1).max(253).optional().describe('Must be allowlisted by the pool'),
    serviceAccountName: z.string().min(1).max(253).optional().describe('Must be allowlisted by the pool'),
    snapshot_id: z
      .string()
      .min(1)
      .max(128)
      .optional()
      .describe("Restore (fork) this snapshot into the new box: its workspace and env; image, cpu and memory default to the snapshot's"),
    egress: BoxEgressRequest.optional(),
  })
  .strict();
export type CreateBoxRequest = z.infer<typeof CreateBoxRequest>;

export const CreateSnapshotRequest = z
  .object({
    ttlSeconds: z.number().int().min(60).max(31_536_000).optional().describe("Keep it this long (default and maximum: the pool's snapshots.retentionSeconds)"),
    name: z.string().min(1).max(128).optional().describe('A label of the caller\'s choosing, returned with the snapshot'),
  })
  .strict();

const ContextId = z.string().min(1).max(1024);

export const SnapshotsQuery = z
  .object({
    session_id: ContextId.optional().describe(
      "Alone: the snapshots of boxes of this session (the box's sessionId). With tenant_id: the backup context's session_id",
    ),
    tenant_id: ContextId.optional().describe('Snapshots whose backup context (PUT /boxes/{id}/context) has this tenant_id'),
    environment_id: ContextId.optional().describe('With tenant_id: narrowed to this environment_id'),
    limit: z.coerce.number().int().min(1).max(100).default(100).describe('At most this many, newest first (1-100)'),
  })
  .strict()
  .refine((q) => q.session_id !== undefined || q.tenant_id !== undefined, { message: 'give session_id, or tenant_id (optionally with environment_id and session_id)' })
  .refine((q) => q.environment_id === undefined || q.tenant_id !== undefined, { message: 'environment_id needs tenant_id (environments are per tenant)', path: ['environment_id'] });

export const DeleteBoxQuery = z
  .object({
    snapshot: z
      .enum(['true', 'false', '1', '0'])
      .optional()
      .transform((v) => (v === undefined ? undefined : v === 'true' || v === '1'))
      .describe("Take a final snapshot first and delete only once it is stored (default: the pool's snapshots.onDelete)"),
  });

export const ExecRequest = z
  .object({
    command: z.string().min(1).max(128 * 1024).describe('Run by sh -c inside the box'),
    timeoutMs: z
      .number()
      .int()
      .positive()
      .max(MAX_EXEC_TIMEOUT_MS, `timeoutMs must be at most ${MAX_EXEC_TIMEOUT_MS} (10 minutes)`)
      .default(DEFAULT_EXEC_TIMEOUT_MS),
    workdir: Workdir,
    env: EnvVars.optional().describe('Variables for this command only, over the box environment; never stored'),
    stdin: z.string().max(512 * 1024).optional().describe('Text written to the command\'s standard input (UTF-8), which is then closed'),
  })
  .strict();
export type ExecRequest = z.infer<typeof ExecRequest>;

export const StartProcessRequest = z
  .object({
    command: z.string().min(1).max(128 * 1024).describe('Run by sh -c inside the box, in the background'),
    workdir: Workdir,
    env: EnvVars.optional().describe('Variables for this process only, over the box environment; never stored'),
    tag: z.string().min(1).max(256).optional().describe('A label of the caller\'s choosing, returned in listings'),
  })
  .strict();
export type StartProcessRequest = z.infer<typeof StartProcessRequest>;

export const SIGNALS = ['TERM', 'KILL', 'INT', 'HUP', 'QUIT', 'USR1', 'USR2', 'STOP', 'CONT'] as const;
export const SignalRequest = z.object({ signal: z.enum(SIGNALS).describe('Sent to the process group') }).strict();

const booleanQuery = z
  .enum(['true', 'false', '1', '0'])
  .optional()
  .transform((v) => v === 'true' || v === '1');

export const ProcessOutputQuery = z.object({
  since: z.coerce.number().int().min(0).default(0).describe('Byte offset to replay from (an offset from an earlier event)'),
  follow: booleanQuery.describe('Keep streaming until the process exits'),
});
export type ProcessOutputQuery = z.infer<typeof ProcessOutputQuery>;

export const StdinQuery = z.object({ eof: booleanQuery.describe('Close the process\'s standard input after this write') });

export const FileListQuery = z.object({
  path: z.string().min(1).max(4096).default('.').describe('Directory; relative paths resolve under /workspace'),
  recursive: booleanQuery.describe('Walk subdirectories too'),
  limit: z.coerce.number().int().min(1).max(100_000).default(10_000).describe('At most this many entries (then truncated: true)'),
});

export const WatchQuery = z.object({
  path: z.string().min(1).max(4096).default('.').describe('File or directory to watch; relative paths resolve under /workspace'),
  recursive: booleanQuery.describe('Watch every directory below it too (those made later included)'),
});

export const MetricsQuery = z.object({
  since: z.iso
    .datetime({ offset: true, message: 'since must be an RFC 3339 time, e.g. 2026-01-02T15:04:05Z' })
    .optional()
    .describe('RFC 3339 time: adds history, the samples boxd kept after it (every 5 s, the last 10 minutes)'),
});

export const FileDeleteQuery = z.object({
  path: z.string().min(1, 'path is required').max(4096).describe('File or directory; relative paths resolve under /workspace'),
  recursive: booleanQuery.describe('Delete a non-empty directory and everything in it'),
});

export const ArchiveQuery = z.object({
  path: z.string().min(1).max(4096).default('.').describe('Directory (or, for download, a file); relative paths resolve under /workspace'),
  gzip: booleanQuery.describe('Download: gzip-compress the tar'),
});

export const PtyQuery = z.object({
  cols: z.coerce.number().int().min(1).max(1000).default(80).describe('Terminal width'),
  rows: z.coerce.number().int().min(1).max(1000).default(24).describe('Terminal height'),
});

/** The subprotocol of the terminal WebSocket. */
export const PTY_PROTOCOL = 'sandbox-bridge.pty.v1';
/** `sandbox-bridge.bearer.<base64url token>`: the token as a second subprotocol, for WebSocket clients that cannot set headers. */
export const BEARER_PROTOCOL_PREFIX = 'sandbox-bridge.bearer.';

export const PtyResize = z.object({
  type: z.literal('resize'),
  cols: z.number().int().min(1).max(1000),
  rows: z.number().int().min(1).max(1000),
});

/** A text frame the caller sends on the terminal WebSocket. */
export const PtyControl = z.discriminatedUnion('type', [PtyResize, z.object({ type: z.literal('eof').describe("Close the terminal's input") })]);
/** The text frame the bridge sends when the shell has ended. */
export const PtyExit = z.object({ type: z.literal('exit'), exit_code: z.number().int() });

export const SetEnvRequest = z.object({ envVars: EnvVars }).strict();

export const FileQuery = z.object({
  path: z.string().min(1, 'path is required').max(4096).describe('File; relative paths resolve under /workspace'),
  base64: booleanQuery.describe('true: content is base64 (GET returns it so; PUT body is base64 text)'),
});

export const LogsQuery = z.object({
  tailLines: z.coerce.number().int().min(0).max(1_000_000).optional().describe('Only the last N lines'),
});

// ---- responses ----

const Condition = z.object({ type: z.string(), status: z.string() });

export const BoxCreated = z.object({
  box_id: z.string(),
  status: z.string(),
  namespace: z.string(),
  pod_name: z.string(),
  image: z.string(),
  cpu: z.string().describe('Kubernetes quantity: whole cores as "1", fractions in millicores as "500m"'),
  memory: z.string().describe('With unit, e.g. "512Mi"'),
  created_at: z.string(),
  snapshot_id: z.string().optional().describe('The snapshot restored into the box, when it was forked from one'),
});

export const BoxStatus = z.object({
  box_id: z.string(),
  pod_name: z.string(),
  namespace: z.string(),
  session_id: z.string(),
  status: z
    .enum(['Pending', 'Running', 'Sleeping', 'Failed', 'Terminated'])
    .describe(
      'Sleeping: idle, its workspace in a snapshot and no pod; the next call from a boxes:write token wakes it (Pending while it wakes). ' +
        'Failed: its workspace was lost (the reason in failure); calls answer 409; delete it (docs/lifecycle.md)',
    ),
  phase: z.string(),
  node: z.string(),
  image: z.string(),
  cpu: z.string(),
  memory: z.string(),
  created_at: z.string(),
  expires_at: z.string(),
  age_seconds: z.number().int(),
  restarts: z.number().int(),
  host_ip: z.string(),
  pod_ip: z.string(),
  conditions: z.array(Condition),
  snapshot_id: z.string().optional().describe('While Sleeping: the snapshot its workspace is in'),
  failure: z.string().optional().describe('When Failed: why'),
});

export const Snapshot = z.object({
  snapshot_id: z.string(),
  box_id: z.string().describe('The box it was taken from'),
  session_id: z.string(),
  size: z.number().int().describe('Bytes of the compressed workspace archive'),
  created_at: z.string(),
  expires_at: z.string().describe('When the operator deletes it'),
  name: z.string().optional(),
  image: z.string(),
  cpu: z.string(),
  memory: z.string(),
  context: z
    .object({ tenant_id: z.string(), environment_id: z.string(), session_id: z.string() })
    .nullable()
    .describe("The box's backup context when it was taken (PUT /boxes/{id}/context), or null"),
});

export const SnapshotList = z.object({ snapshots: z.array(Snapshot).describe('Newest first') });

export const RestoreRequest = z
  .object({ snapshot_id: z.string().min(1).max(128).describe('The snapshot whose workspace the box takes') })
  .strict();

export const Restored = z.object({
  box_id: z.string(),
  snapshot_id: z.string(),
  entries: z.number().int().describe("Entries of /workspace now: exactly the snapshot's"),
  bytes: z.number().int().describe('Data bytes extracted'),
});

export const SnapshotDeleted = z.object({ snapshot_id: z.string(), deleted: z.literal(true) });

export const BoxDeleted = z.object({
  box_id: z.string(),
  status: z.literal('Terminated'),
  deleted_at: z.string(),
  snapshot: Snapshot.optional().describe('The final snapshot, when one was taken'),
});

export const ExecResult = z.object({
  exit_code: z.number().int(),
  stdout: z.string(),
  stderr: z.string(),
  duration_ms: z.number().int(),
  timed_out: z.boolean(),
  stdout_truncated: z.boolean(),
  stderr_truncated: z.boolean(),
});

export const FileRead = z.object({
  path: z.string(),
  size: z.number().int(),
  content: z.string(),
  encoding: z.enum(['text', 'base64']),
});

export const FileWritten = z.object({ path: z.string(), size: z.number().int(), encoding: z.enum(['text', 'base64']) });

export const EnvUpdated = z.object({ box_id: z.string(), env_count: z.number().int(), updated_at: z.string() });

export const ProcessInfo = z.object({
  process_id: z.string(),
  pid: z.number().int(),
  command: z.string(),
  tag: z.string().optional(),
  status: z.enum(['running', 'exited']),
  started_at: z.string(),
  ended_at: z.string().optional(),
  exit_code: z.number().int().optional(),
  signal: z.string().optional(),
  output_bytes: z.number().int().optional(),
  dropped_bytes: z.number().int().optional(),
});

export const ProcessList = z.object({ processes: z.array(ProcessInfo) });

export const StdinWritten = z.object({ written: z.number().int() });

export const FileList = z.object({
  path: z.string(),
  entries: z.array(
    z.object({
      path: z.string(),
      name: z.string(),
      type: z.enum(['file', 'dir', 'symlink', 'other']),
      size: z.number().int(),
      mode: z.number().int().describe('Permission bits (420 = 0644)'),
      modified: z.string().describe('RFC 3339, UTC'),
    }),
  ),
  truncated: z.boolean(),
});

export const FileDeleted = z.object({ path: z.string(), deleted: z.boolean() });

export const ArchiveWritten = z.object({ path: z.string(), entries: z.number().int(), bytes: z.number().int() });

/** One line of a streamed exec or process output (application/x-ndjson). */
export const WatchEvent = z
  .object({
    type: z.enum(['ready', 'create', 'write', 'remove', 'rename', 'chmod', 'overflow', 'end', 'error']),
    path: z.string().optional().describe('Absolute path (ready: the watched path)'),
    from: z.string().optional().describe('rename: the old path'),
    kind: z.enum(['file', 'dir']).optional().describe('file (anything but a directory) or dir'),
    dropped: z.number().int().optional().describe('overflow: events left out (absent when the kernel dropped them)'),
    reason: z
      .string()
      .optional()
      .describe('overflow: queue | kernel | directories; end: sleep (the box went to sleep), deleted (the box was deleted), removed (the watched path went)'),
    error: z.object({ type: z.string(), message: z.string() }).optional().describe('error: the stream broke off'),
  })
  .describe('One line of a file watch: ready first, then events, then end (or error)');

const MetricsSample = z.object({
  time: z.string().describe('When boxd read it (RFC 3339)'),
  cpu: z.object({
    used_cores: z.number().describe('Cores used over the last sample interval'),
    usage_seconds: z.number().describe('CPU time since the box started'),
    limit_cores: z.number().nullable(),
    throttled_seconds: z.number().describe('Time the box was throttled at its CPU limit, since it started'),
    throttled_periods: z.number().int(),
  }),
  memory: z.object({
    used_bytes: z.number().int().describe('Working set (usage less inactive file cache)'),
    limit_bytes: z.number().int().nullable(),
    oom_kills: z.number().int().describe('Processes the kernel killed at the memory limit, since the box started'),
  }),
  disk: z.array(z.object({ path: z.string(), used_bytes: z.number().int(), limit_bytes: z.number().int().nullable(), partial: z.boolean().optional() })),
  processes: z.object({ count: z.number().int(), limit: z.number().int().nullable() }),
  network: z.object({ rx_bytes: z.number().int(), tx_bytes: z.number().int() }),
});

export const BoxMetrics = MetricsSample.extend({
  box_id: z.string(),
  interval_seconds: z.number().describe('boxd samples this often'),
  history: z.array(MetricsSample).optional().describe('With since: the samples kept after it, oldest first'),
});

export const OutputLine = z.discriminatedUnion('type', [
  z.object({ type: z.literal('start'), offset: z.number().int(), dropped: z.number().int() }),
  z.object({ type: z.enum(['stdout', 'stderr']), data: z.string(), offset: z.number().int().optional() }),
  z.object({
    type: z.literal('exit'),
    exit_code: z.number().int(),
    duration_ms: z.number().int(),
    timed_out: z.boolean(),
    stdout_truncated: z.boolean().optional(),
    stderr_truncated: z.boolean().optional(),
  }),
  z.object({ type: z.literal('error'), error: z.object({ type: z.string(), message: z.string() }) }),
]);

export const Health = z.object({
  status: z.enum(['ok', 'degraded']),
  version: z.string(),
  kubernetes: z.string(),
  namespace: z.string(),
  uptime_seconds: z.number().int(),
  active_boxes: z.number().int(),
  total_boxes_created: z.number().int(),
});

const Resources = z.object({ cpu: z.string(), memory: z.string(), pods: z.string() });
export const ClusterInfo = z.object({
  version: z.string(),
  platform: z.string(),
  nodes: z.number().int(),
  capacity: Resources,
  allocatable: Resources,
});

const CapAlloc = z.object({ capacity: z.string(), allocatable: z.string() });
export const NodeList = z.object({
  nodes: z.array(
    z.object({
      name: z.string(),
      status: z.string(),
      roles: z.array(z.string()),
      version: z.string(),
      cpu: CapAlloc,
      memory: CapAlloc,
      pods: CapAlloc.extend({ running: z.number().int() }),
    }),
  ),
});

export const SandboxList = z.object({
  sandboxes: z.array(
    z.object({
      name: z.string().describe('The pod serving the box'),
      box_id: z.string().describe('The box id (equal to name unless the box was a warm box when claimed)'),
      namespace: z.string(),
      status: z.string(),
      node: z.string(),
      image: z.string(),
      created_at: z.string(),
      age_seconds: z.number().int(),
      session_id: z.string(),
      cpu: z.string(),
      memory: z.string(),
    }),
  ),
  total: z.number().int().describe('Boxes matching the filter, on every page'),
  namespace: z.string(),
  continue: z.string().optional().describe('Present when more boxes match: pass it as ?continue= (with the same filter) for the next page'),
});

/** GET /sandboxes: optional filter and pages, oldest box first (then by name). */
export const SandboxesQuery = z
  .object({
    session_id: z.string().min(1).max(1024).optional().describe('Only the boxes of this session'),
    status: BoxStatus.shape.status.optional().describe('Only boxes in this status'),
    limit: z.coerce.number().int().min(1).max(1000).optional().describe('At most this many boxes per page (1-1000)'),
    continue: z.string().min(1).max(1024).optional().describe('The continue token of the previous page'),
  })
  .strict();
export type SandboxesQuery = z.infer<typeof SandboxesQuery>;

const UsedOfTotal = z.object({ used: z.number(), total: z.number() });
export const ClusterCapacity = z.object({
  cpu: UsedOfTotal.extend({ unit: z.literal('cores') }).describe('Requested and allocatable cores of the nodes boxes can be scheduled on'),
  memory: UsedOfTotal.extend({ unit: z.literal('MiB') }),
  pods: UsedOfTotal,
  boxes: z
    .object({ active: z.number().int(), warm: z.number().int(), max: z.number().int() })
    .describe("The pool's boxes: active now, warm (pre-started, unclaimed) and its global cap"),
});

export const PodMetricsList = z.object({
  metrics: z.array(
    z.object({
      pod_name: z.string(),
      namespace: z.string(),
      cpu: z.string(),
      memory: z.string(),
      timestamp: z.string(),
      window_seconds: z.number(),
    }),
  ),
});

// ---- the platform port (issue 21): keepalive, contexts, session outputs ----

export const KeepaliveResult = z.object({
  box_id: z.string(),
  last_active_at: z.string().describe('RFC 3339: the activity now recorded; the box sleeps no earlier than this plus the pool\'s idle.sleepAfterSeconds'),
});

export const BackupContext = z
  .object({ tenant_id: ContextId, environment_id: ContextId, session_id: ContextId })
  .strict()
  .describe("Labels every later snapshot of the box (API, idle sleep, final); GET /snapshots?tenant_id=&environment_id=&session_id= finds them");
export const OutboundContext = z
  .object({ tenant_id: ContextId, session_id: ContextId })
  .strict()
  .describe("Kept on the box's record for the egress gateway's credential lookups (issue 22); stored only until then");

export const SetContextRequest = z
  .object({ backup: BackupContext.optional(), outbound: OutboundContext.optional() })
  .strict()
  .refine((b) => b.backup !== undefined || b.outbound !== undefined, { message: 'give backup, outbound or both' });

export const ContextSet = z.object({
  box_id: z.string(),
  backup: z.object({ tenant_id: z.string(), environment_id: z.string(), session_id: z.string() }).nullable(),
  outbound: z.object({ tenant_id: z.string(), session_id: z.string() }).nullable(),
});

export const MountOutputsRequest = z.object({ tenant_id: ContextId, session_id: ContextId }).strict();

export const OutputsMounted = z.object({
  path: z.literal('/mnt/session/outputs'),
  tenant_id: z.string(),
  session_id: z.string(),
});

export const SessionParams = z.object({ sessionId: z.string().min(1).max(1024).describe('The session id given to POST /boxes/{id}/mounts/outputs') });
export const SessionOutputParams = SessionParams.extend({
  path: z.string().min(1).max(4096).describe('Path under /mnt/session/outputs/, its segments as they are (no ".", ".." or empty ones)'),
});

export const SessionOutputList = z.object({
  session_id: z.string(),
  source: z.enum(['box', 'store']).describe('box: read live from the running box; store: the copy uploaded when it last slept or was destroyed'),
  files: z.array(z.object({ path: z.string().describe('Relative to /mnt/session/outputs/'), size: z.number().int(), modified_at: z.string() })),
});

// ---- memory stores (docs/mounts.md) ----
const StoreName = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/)
  .refine((v) => !v.includes('..'), { message: 'must not contain ".."' });

export const MountMemoryRequest = z
  .object({
    store_name: StoreName.describe('The directory under /mnt/memory/ the store appears as'),
    store_id: StoreName.describe('The store: its files are the objects under memory/<store_id>/ in the object store (docs/mounts.md)'),
    read_only: z.boolean().describe('true: a read-only mount (the kernel refuses writes); false: what box code writes goes back to the store'),
  })
  .strict();

export const MemoryStoreParams = BoxParams.extend({ storeName: StoreName.describe('store_name of the mount') });

export const MemoryMounted = z.object({
  path: z.string().describe('/mnt/memory/<store_name>'),
  store_name: z.string(),
  store_id: z.string(),
  read_only: z.boolean(),
  files: z.number().int().describe('Files in the mount'),
  bytes: z.number().int(),
});

export const MemorySynced = z.object({
  store_name: z.string(),
  store_id: z.string(),
  files: z.number().int().describe('Files the store has from this box now'),
  bytes: z.number().int(),
});

/** GET /openapi.json: what a client relies on; the rest is OpenAPI 3.1. */
export const OpenApiDocumentBody = z.looseObject({
  openapi: z.literal('3.1.0'),
  info: z.looseObject({ title: z.string(), version: z.string() }),
  paths: z.record(z.string(), z.record(z.string(), z.unknown())),
});

export const ErrorBody = z.object({
  error: z.object({
    type: z.enum(Object.keys(ERROR_STATUS) as [ErrorType, ...ErrorType[]]),
    message: z.string(),
  }),
});

/** zod issues as one readable line: "cpu: Number must be positive; memory: ..." */
export function describeIssues(error: z.ZodError): string {
  return error.issues
    .map((issue) => {
      const where = issue.path.length ? issue.path.join('.') : 'body';
      if (issue.code === 'unrecognized_keys') return `${where}: unknown field(s) ${issue.keys.join(', ')}`;
      // A record key that fails its own schema: report that schema's message, not zod's generic one.
      if (issue.code === 'invalid_key') return `${where}: ${issue.issues[0]?.message ?? issue.message}`;
      return `${where}: ${issue.message}`;
    })
    .join('; ');
}

// ---- egress (docs/api.md "Egress"; the rules are common/box-egress.ts's) ----

export const SetBoxEgressRequest = z
  .object({
    allow: z
      .array(EgressPattern)
      .max(256)
      .nullable()
      .describe("The box's new allow list, each entry within the pool's; null: the pool's list again"),
  })
  .strict();
export const SetEgressCredentialsRequest = z
  .record(z.string().min(1).max(253), z.record(z.string().min(1).max(128), z.string()))
  .describe('Host (exact name) to headers the egress gateway sets on the box\'s requests to it; replaces all earlier ones ({} removes them). Never returned');
export const BoxEgress = z.object({
  box_id: z.string(),
  mode: z.enum(['direct', 'gateway']),
  box_allow: z.array(z.string()).nullable().describe("The box's own allow list; null: the pool's applies"),
  allow: z.array(z.string()).describe('What the box may reach (deny wins)'),
  deny: z.array(z.string()),
  plain_http: z.array(z.string()),
  credential_hosts: z.array(z.string()).describe('Hosts with registered credentials (never their values)'),
});
export const EgressCredentialsSet = z.object({ box_id: z.string(), credential_hosts: z.array(z.string()), updated_at: z.string() });

// ---- ports and preview links (docs/ports.md) ----

export const PortParams = BoxParams.extend({
  port: z.coerce.number().int().min(1).max(65535).describe('A port an app in the box listens on (on any address of the box, its loopback included)'),
  path: z.string().describe("The app's path, its segments and query as they are (empty: /)"),
});
export const PortPreviewParams = BoxParams.extend({
  port: z.coerce.number().int().min(1).max(65535).describe('The port the link reaches'),
});
export const CreatePreviewRequest = z
  .object({
    expires_in_seconds: z.number().int().min(1).optional().describe('Lifetime of the link (default PREVIEW_TTL_SECONDS, at most PREVIEW_MAX_TTL_SECONDS)'),
  })
  .strict();
export const PreviewCreated = z.object({
  box_id: z.string(),
  port: z.number().int(),
  url: z.string().describe('Opens the port in a browser without the bridge token, until expires_at'),
  expires_at: z.string(),
});
export const PreviewsRevoked = z.object({
  box_id: z.string(),
  port: z.number().int(),
  revoked_at: z.string().describe('Every preview link to the port made before this stops working (within 5 s on every replica)'),
});
