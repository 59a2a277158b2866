// The index of snapshots by backup context (docs/snapshots.md, "Listing by backup context"): one
// empty marker object per snapshot that carries a context, under
//
//   <prefix>/snapshot-index/<pool>/<tenant-digest>/<environment-digest>/<session-digest>/<snapshot-id>
//
// so "a tenant's snapshots", "a tenant's environment's" and "one (tenant, environment, session)'s"
// are each one key-prefix listing of exactly those snapshots, never a scan of the bucket. The
// snapshot id at the end carries the creation time (newest first without reading anything) and
// the expiry (retention removes markers without reading anything). A marker is written before
// the snapshot's metadata (common/snapshot-writer.ts), so every snapshot that exists is indexed; a
// marker whose snapshot never completed or was deleted is skipped by listings and removed by
// retention (operator/snapshot-retention.ts). Digests keep free-form ids out of keys (a "/" in a
// tenant id cannot change the layout); listings check the metadata's context exactly.
import { createHash } from 'node:crypto';
import type { BackupContext } from './box-context.js';
import { parseSnapshotId, snapshotDeadline, type SnapshotId } from './snapshots.js';

/** Which snapshots to list: a tenant, optionally narrowed to an environment and/or a session. */
export interface ContextFilter {
  tenant_id: string;
  environment_id?: string | undefined;
  session_id?: string | undefined;
}

/** 128 bits of SHA-256, hex: ids of any length and alphabet as one key segment, collisions out of reach. */
export function contextDigest(id: string): string {
  return createHash('sha256').update(id).digest('hex').slice(0, 32);
}

/** Key prefix of a pool's index (relative to the store's own prefix). */
export function indexPoolPrefix(pool: string): string {
  return `snapshot-index/${pool}/`;
}

/** The marker of one snapshot. */
export function indexKey(pool: string, context: BackupContext, snapshotId: string): string {
  return `${indexPoolPrefix(pool)}${contextDigest(context.tenant_id)}/${contextDigest(context.environment_id)}/${contextDigest(context.session_id)}/${snapshotId}`;
}

/**
 * The narrowest prefix a filter can list, and the session digest its keys must carry when the
 * filter names a session but no environment (the session is the third segment).
 */
export function indexQuery(pool: string, f: ContextFilter): { prefix: string; sessionDigest?: string } {
  let prefix = `${indexPoolPrefix(pool)}${contextDigest(f.tenant_id)}/`;
  if (f.environment_id === undefined) return { prefix, ...(f.session_id !== undefined ? { sessionDigest: contextDigest(f.session_id) } : {}) };
  prefix += `${contextDigest(f.environment_id)}/`;
  if (f.session_id !== undefined) prefix += `${contextDigest(f.session_id)}/`;
  return { prefix };
}

/** The snapshot a listed marker key (full or relative) points at, if it is one the query wants. */
export function indexedSnapshot(key: string, query: { sessionDigest?: string }): SnapshotId | undefined {
  const parts = key.split('/');
  if (query.sessionDigest !== undefined && parts.at(-2) !== query.sessionDigest) return undefined;
  return parseSnapshotId(parts.at(-1) ?? '');
}

/** Whether a snapshot's context is the one a filter asks for (digests only narrow; this decides). */
export function contextMatches(context: BackupContext | null | undefined, f: ContextFilter): boolean {
  if (!context || context.tenant_id !== f.tenant_id) return false;
  if (f.environment_id !== undefined && context.environment_id !== f.environment_id) return false;
  return f.session_id === undefined || context.session_id === f.session_id;
}

/**
 * Pure: which markers of a pool's index retention deletes. `markers` are keys relative to the
 * index's pool prefix ("<t>/<e>/<s>/<snapshot-id>"); `stored` the snapshot ids that still have
 * objects after this sweep's deletes. A marker goes once its snapshot is gone (deleted, or never
 * completed) and it was written at least the grace ago (its snapshot may still be uploading), or
 * once its snapshot is past its deadline and no longer stored.
 */
export function planIndexRetention(input: {
  markers: ReadonlyArray<{ key: string; lastModified: Date }>;
  stored: ReadonlySet<string>;
  retentionSeconds: number;
  now: number;
  graceMs: number;
}): string[] {
  const deletes: string[] = [];
  for (const m of input.markers) {
    const parts = m.key.split('/');
    if (parts.length !== 4) continue; // not a marker: left alone
    const id = parseSnapshotId(parts[3]!);
    if (!id || input.stored.has(id.id)) continue;
    const settled = m.lastModified.getTime() + input.graceMs <= input.now;
    if (settled || snapshotDeadline(id, input.retentionSeconds) <= input.now) deletes.push(m.key);
  }
  return deletes;
}
