// Snapshots in the object store: the id format and the key layout, shared by the bridge (which
// writes and reads them) and the operator (which deletes expired ones). docs/snapshots.md
// explains the layout.
//
//   <prefix>/snapshots/<pool>/<session-hash>/<snapshot-id>/workspace.tar.zst  the /workspace tar, zstd
//   <prefix>/snapshots/<pool>/<session-hash>/<snapshot-id>/snapshot.json      metadata + sealed env
//
// (Snapshots taken before zstd have workspace.tar.gz, boxd's gzip tar, instead: still read.)
//
// snapshot.json is written last: a snapshot exists once it is there. The id carries the session
// hash, the creation time and the expiry, so "latest snapshot of a session" is one list request
// and retention needs only key listings, never an object read.
import { randomBytes } from 'node:crypto';
import type { BackupContext } from './box-context.js';
import { sessionHash } from './labels.js';

export const WORKSPACE_OBJECT = 'workspace.tar.zst';
/** The workspace of snapshots taken before zstd (metadata without `compression`): boxd's gzip tar. */
export const GZIP_WORKSPACE_OBJECT = 'workspace.tar.gz';
/** Every name a workspace object may have: what deleting a snapshot by name deletes. */
export const WORKSPACE_OBJECTS = [WORKSPACE_OBJECT, GZIP_WORKSPACE_OBJECT] as const;
export const METADATA_OBJECT = 'snapshot.json';

/** The name of a snapshot's workspace object, by its metadata. */
export function workspaceObject(metadata: Pick<SnapshotMetadata, 'compression'>): (typeof WORKSPACE_OBJECTS)[number] {
  return metadata.compression === 'zstd' ? WORKSPACE_OBJECT : GZIP_WORKSPACE_OBJECT;
}

/** snap-<session hash>-<created ms, base36>-<expires s, base36>-<random>. */
const ID = /^snap-([0-9a-f]{12})-([0-9a-z]{9})-([0-9a-z]{7})-([0-9a-f]{8})$/;

export interface SnapshotId {
  id: string;
  sessionHash: string;
  createdAt: Date;
  expiresAt: Date;
}

export function newSnapshotId(sessionId: string, createdAt: Date, expiresAt: Date): SnapshotId {
  const id = [
    'snap',
    sessionHash(sessionId),
    createdAt.getTime().toString(36).padStart(9, '0'),
    Math.floor(expiresAt.getTime() / 1000).toString(36).padStart(7, '0'),
    randomBytes(4).toString('hex'),
  ].join('-');
  return { id, sessionHash: sessionHash(sessionId), createdAt, expiresAt: new Date(Math.floor(expiresAt.getTime() / 1000) * 1000) };
}

/** The parts of a snapshot id, or undefined when it is not one. */
export function parseSnapshotId(id: string): SnapshotId | undefined {
  const m = ID.exec(id);
  if (!m) return undefined;
  return { id, sessionHash: m[1]!, createdAt: new Date(parseInt(m[2]!, 36)), expiresAt: new Date(parseInt(m[3]!, 36) * 1000) };
}

/** Key prefix of a pool's snapshots (relative to the store's own prefix). */
export function poolPrefix(pool: string): string {
  return `snapshots/${pool}/`;
}

/** Key prefix of one session's snapshots. */
export function sessionPrefix(pool: string, hash: string): string {
  return `${poolPrefix(pool)}${hash}/`;
}

/** Key of one object of a snapshot. */
export function snapshotKey(pool: string, id: SnapshotId, object: (typeof WORKSPACE_OBJECTS)[number] | typeof METADATA_OBJECT): string {
  return `${sessionPrefix(pool, id.sessionHash)}${id.id}/${object}`;
}

/**
 * When a snapshot is deleted: at its own expiry, or earlier when the pool's retention has since
 * been shortened (a longer retention never extends a snapshot already taken).
 */
export function snapshotDeadline(id: SnapshotId, retentionSeconds: number): number {
  return Math.min(id.expiresAt.getTime(), id.createdAt.getTime() + retentionSeconds * 1000);
}

/** What snapshot.json holds. The env is sealed (AES-256-GCM), never in clear. */
export interface SnapshotMetadata {
  version: 1;
  snapshot_id: string;
  name?: string;
  pool: string;
  box_id: string;
  session_id: string;
  image: string;
  /** Kubernetes quantities, as the box had them. */
  cpu: string;
  memory: string;
  created_at: string;
  expires_at: string;
  /**
   * How the workspace tar is stored: 'zstd' (workspace.tar.zst); absent in snapshots taken
   * before, whose workspace.tar.gz is gzip.
   */
  compression?: 'zstd';
  /** Bytes of the workspace object as stored, and their SHA-256 (checked on restore). */
  size: number;
  sha256: string;
  /**
   * The limits it was taken under (data bytes, entries): a restore accepts up to these even if
   * the pool's limits shrank since, so a snapshot taken is always restorable. Absent in older ones.
   */
  limits?: { bytes: number; entries: number };
  /** The box's backup context when the snapshot was taken (common/box-context.ts); absent: none. */
  context?: BackupContext;
  env: SealedEnv;
}

export interface SealedEnv {
  alg: 'A256GCM';
  /** Which key sealed it (a digest of the key, not the key). */
  kid: string;
  iv: string;
  tag: string;
  data: string;
}
