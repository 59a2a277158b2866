// The one place for the names sandbox-bridge stamps on Kubernetes objects.
import { createHash } from 'node:crypto';

export const API_GROUP = 'sandbox-bridge.io';
export const MANAGED_BY = 'sandbox-bridge';

export const LABELS = {
  managedBy: 'app.kubernetes.io/managed-by',
  component: 'app.kubernetes.io/component',
  /** Every box pod, warm pod and box Secret carries `sandbox-bridge.io/box=true`. */
  box: `${API_GROUP}/box`,
  /** On a session's box pod: the box id (also the name of the box's record Secret). */
  boxId: `${API_GROUP}/box-id`,
  /** On a warm pod not yet claimed: the pool it was made for. */
  warm: `${API_GROUP}/warm`,
  /** Name of the SandboxPool a box or child object belongs to. */
  pool: `${API_GROUP}/pool`,
  /** Session ids are free-form, so pods carry a hash of it: `kubectl get pods -l sandbox-bridge.io/session=<hash>`. */
  session: `${API_GROUP}/session`,
  /** Which of the session's slots (0..maxBoxesPerSession-1) the box occupies. */
  slot: `${API_GROUP}/slot`,
  /** Which of the pool's seats (0..maxBoxes-1) the box holds (box-seats.ts). */
  seat: `${API_GROUP}/seat`,
  /** Digest of the Idempotency-Key of the create request that made the box. */
  idempotencyKey: `${API_GROUP}/idempotency-key`,
  /**
   * On a box's record when it is not plain Running (docs/lifecycle.md): `pending` (a sleep is
   * snapshotting it), `asleep` (no pod; a call wakes it), `waking` (a replica is making its pod),
   * `failed` (its snapshot is gone; the reason in the failure annotation).
   */
  sleep: `${API_GROUP}/sleep`,
} as const;

export const ANNOTATIONS = {
  /** The session id verbatim. */
  sessionId: `${API_GROUP}/session-id`,
  /** RFC 3339 instant after which the operator deletes the box. */
  expiresAt: `${API_GROUP}/expires-at`,
  ttlSeconds: `${API_GROUP}/ttl-seconds`,
  /** RFC 3339 instant the box was made: its pod's creation, or the claim of a warm pod. */
  createdAt: `${API_GROUP}/created-at`,
  /** On a warm pod: the digest of the template it was made from (common/box-pod.ts). */
  warmTemplate: `${API_GROUP}/warm-template`,
  /** On a warm seat (common/seats.ts): the name of the warm pod it was made for, so no one takes a later pod's seat for it. */
  warmPod: `${API_GROUP}/warm-pod`,
  /** On a warm pod: the key of the warm shape it was made for (common/warm-shapes.ts). */
  warmShape: `${API_GROUP}/warm-shape`,
  /**
   * On a box pod: the key of the warm shape that served, or would have served, its create (claimed
   * or made cold for want of one): what sizes that shape's warm pool by recent demand.
   */
  warmDemand: `${API_GROUP}/warm-demand`,
  /**
   * On a box pod: RFC 3339 instant of the last bridge call, written at most every few seconds
   * (bridge/services/box-connector.ts); a call that meets a sleep's fence writes it at once.
   */
  lastActive: `${API_GROUP}/last-active`,
  /** On a sleeping box's record: the snapshot its workspace is in. */
  sleepSnapshot: `${API_GROUP}/sleep-snapshot`,
  /** On a record: the lease of whoever moves the box between states (JSON, common/box-lease.ts). */
  lease: `${API_GROUP}/lease`,
  /** On a record: the newest lease epoch it had (boxd's fence is raised and lifted with it). */
  epoch: `${API_GROUP}/epoch`,
  /** On a sleeping box's record: the shape its pod is made again with (JSON, common/box-pod.ts SleptBox). */
  sleepBox: `${API_GROUP}/sleep-box`,
  /**
   * On a pod made for a wake while its workspace is restored: no call is served on it (through
   * any replica) until the waker removes it, which commits the wake (docs/lifecycle.md).
   */
  restoring: `${API_GROUP}/restoring`,
  /** On a Failed box's record: why. */
  failure: `${API_GROUP}/failure`,
  /**
   * On a box's record: the platform's backup context (JSON {tenant_id, environment_id,
   * session_id}, common/box-context.ts); every later snapshot of the box carries it.
   */
  backupContext: `${API_GROUP}/backup-context`,
  /** On a box's record: the outbound context (JSON {tenant_id, session_id}) for the egress gateway's credential lookups. */
  outboundContext: `${API_GROUP}/outbound-context`,
  /**
   * On a box's record: its narrowing of the pool's egress domains, JSON {"allow": [...]}, read by
   * the egress gateway (common/box-egress.ts, gateway/source); absent: the pool's policy.
   */
  egress: `${API_GROUP}/egress`,
  /** On a box's record: the session whose outputs its /mnt/session/outputs holds (JSON {tenant_id, session_id}, common/session-outputs.ts). */
  sessionOutputs: `${API_GROUP}/session-outputs`,
  /**
   * On a box's record, one per mounted memory store: this prefix and a digest of the store's name,
   * JSON {store_name, store_id, read_only} (common/memory-store.ts); a wake mounts them again.
   * One annotation each, so two mounts at once never overwrite each other's.
   */
  memoryMount: `${API_GROUP}/memory-mount-`,
  /** On a box pod: "true" when it has the memory-store sidecar (the bridge's pod cache keeps no init containers). */
  memoryStores: `${API_GROUP}/memory-stores`,
  /**
   * On a box's record: the preview generation of each port whose links were revoked (JSON
   * {"<port>": n}; a port absent: 0). Preview links carry the one they were made under; revoking
   * a port's links moves it on (bridge/services/ports.ts).
   */
  previewGeneration: `${API_GROUP}/preview-generation`,
} as const;

/** app.kubernetes.io/component values of the Secrets boxes use. */
export const SECRET_COMPONENTS = {
  /** A box's record, named after the box: the session slot it holds, its env, a cold pod's credential. */
  record: 'box-record',
  /**
   * A warm pod's own credential (and empty env), owned by the pool: named box-seat-<n>, it is
   * also the seat the warm pod holds (common/seats.ts). Older warm pods' are named <pod>-boxd.
   */
  credential: 'box-credential',
  /** One of the pool's maxBoxes seats, owned by the record of the box holding it. */
  seat: 'box-seat',
} as const;

/** Label selector matching every box pod. */
export const BOX_SELECTOR = `${LABELS.box}=true`;

/** Stable, label-safe digest of a session id (12 hex chars of SHA-256). */
export function sessionHash(sessionId: string): string {
  return createHash('sha256').update(sessionId).digest('hex').slice(0, 12);
}

/**
 * Deterministic box name for a session's slot: `<prefix>-<session-hash>-<slot>`. Two replicas
 * creating the same slot at once collide on the name, so the API server makes the per-session
 * cap atomic.
 */
/** The Secret that is seat n of a pool's namespace. */
export function seatName(n: number): string {
  return `box-seat-${n}`;
}

/** The seat a Secret's name stands for (box-seat-<n>), or undefined. */
export function seatNumberOf(name: string | undefined): number | undefined {
  const m = /^box-seat-(\d+)$/.exec(name ?? '');
  return m ? Number(m[1]) : undefined;
}

export function boxName(prefix: string, sessionId: string, slot: number): string {
  return `${prefix}-${sessionHash(sessionId)}-${slot}`;
}

/**
 * Name of a box's record Secret: the box id itself. Creating it is what takes the session's slot,
 * atomically, whether the box then gets a new pod or claims a warm one.
 */
export function boxRecordName(boxId: string): string {
  return boxId;
}

/** Name of a warm pod's own credential Secret. */
export function warmCredentialName(pod: string): string {
  return `${pod}-boxd`;
}
