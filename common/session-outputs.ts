// Session outputs (issue 21; docs/api.md "Session outputs"): the files box code writes under
// /mnt/session/outputs/ (an emptyDir every box pod has, common/box-pod.ts), made a platform
// session's outputs by POST /boxes/{id}/mounts/outputs. Read live from boxd while the box runs;
// copied to the object store, one object per file, before the box's pod goes (idle sleep, under
// the fence, operator/idle-sleep.ts; a delete, bridge) and copied back into the box when it
// wakes or when a later box mounts the same session's outputs. Store layout, shared by bridge
// and operator:
//
//   <prefix>/session-outputs/<pool>/<session-digest>/files/<path>    one object per file, raw
//   <prefix>/session-outputs/<pool>/<session-digest>/manifest.json   the files' paths, sizes, mtimes; written last
//   <prefix>/session-outputs/<pool>/<session-digest>/live.json       which box holds the outputs now
//
// The digest is 128 bits of SHA-256 of the session id (common/snapshot-index.ts); the files
// hold the session id and tenant id in clear in the two JSON objects, never anything else.
import type { Readable } from 'node:stream';
import type * as k8s from '@kubernetes/client-node';
import { parseAnnotation } from './box-context.js';
import { SESSION_OUTPUTS_DIR, SESSION_OUTPUTS_SIZE_LIMIT } from './box-pod.js';
import type { BoxdClient, BoxdTarget } from './boxd-client.js';
import { BridgeError } from './errors.js';
import { ANNOTATIONS } from './labels.js';
import type { ObjectStore } from './object-store.js';
import { parseQuantity } from './quantity.js';
import { contextDigest } from './snapshot-index.js';

/** The session a box's outputs belong to (its record's annotation). */
export interface OutputsMount {
  tenant_id: string;
  session_id: string;
}

export interface OutputFile {
  /** Relative to /mnt/session/outputs/. */
  path: string;
  size: number;
  modified_at: string;
}

export interface OutputsManifest {
  version: 1;
  tenant_id: string;
  session_id: string;
  box_id: string;
  synced_at: string;
  files: OutputFile[];
}

/** Which box holds a session's outputs now: its id and its record's UID (a later box of the same id is another box). */
export interface LiveOutputs {
  version: 1;
  tenant_id: string;
  session_id: string;
  box_id: string;
  record_uid: string;
  mounted_at: string;
}

/** At most this many files are copied (and listed live): beyond, the copy fails and the box stays awake. */
export const MAX_OUTPUT_FILES = 10_000;
/** The volume's own cap: the copy of a full volume fits. */
export const MAX_OUTPUT_BYTES = parseQuantity(SESSION_OUTPUTS_SIZE_LIMIT);
/** Files copied at once each way. */
const COPY_CONCURRENCY = 4;

export function outputsPrefix(pool: string, sessionId: string): string {
  return `session-outputs/${pool}/${contextDigest(sessionId)}/`;
}

export const outputsKeys = (pool: string, sessionId: string) => {
  const base = outputsPrefix(pool, sessionId);
  return { files: `${base}files/`, manifest: `${base}manifest.json`, live: `${base}live.json` };
};

/** The outputs mount on a box's record, or undefined. */
export function outputsMountOf(record: Pick<k8s.V1Secret, 'metadata'> | undefined): OutputsMount | undefined {
  const v = parseAnnotation(record, ANNOTATIONS.sessionOutputs);
  return v && typeof v.tenant_id === 'string' && v.tenant_id && typeof v.session_id === 'string' && v.session_id
    ? { tenant_id: v.tenant_id, session_id: v.session_id }
    : undefined;
}

export function outputsMountAnnotation(m: OutputsMount): Record<string, string> {
  return { [ANNOTATIONS.sessionOutputs]: JSON.stringify({ tenant_id: m.tenant_id, session_id: m.session_id }) };
}

/**
 * A requested output path as its segments (Express gives them decoded), checked: no empty, "."
 * or ".." segment, no "/" or "\" or NUL or control character inside one, at most 4096 bytes in
 * all. 400 otherwise. The joined path is always below /mnt/session/outputs/ and a store key
 * below the session's files/ prefix, so no path reaches outside either. Pure.
 */
export function outputPath(segments: readonly string[] | string): string {
  const parts = typeof segments === 'string' ? segments.split('/') : segments;
  const bad = (why: string) => new BridgeError('invalid_request', `output path ${JSON.stringify(parts.join('/'))} ${why}`);
  if (parts.length === 0) throw bad('is empty');
  for (const p of parts) {
    if (p === '' || p === '.' || p === '..') throw bad('has an empty, "." or ".." segment');
    if (/[/\\\x00-\x1f\x7f]/.test(p)) throw bad('has a slash, backslash or control character inside a segment');
  }
  const joined = parts.join('/');
  if (Buffer.byteLength(joined) > 4096) throw bad('is longer than 4096 bytes');
  return joined;
}

/** Whether a relative path from a box's listing can be an output (stored and read back by the same rules). */
export function isStorablePath(rel: string): boolean {
  try {
    return outputPath(rel) === rel && Buffer.byteLength(rel) <= 900; // S3 keys end at 1024 bytes, with the prefix
  } catch {
    return false;
  }
}

/**
 * The regular files under the box's outputs directory (symlinks, directories and others are not
 * outputs), relative to it, by path. More than MAX_OUTPUT_FILES entries: 413.
 */
export async function listBoxOutputs(boxd: BoxdClient, target: BoxdTarget, signal?: AbortSignal): Promise<OutputFile[]> {
  const listing = await boxd.listFiles(target, { path: SESSION_OUTPUTS_DIR, recursive: true, limit: MAX_OUTPUT_FILES * 2 }, signal);
  if (listing.truncated) throw new BridgeError('payload_too_large', `more than ${MAX_OUTPUT_FILES * 2} entries under ${SESSION_OUTPUTS_DIR}`);
  const base = `${listing.path.replace(/\/+$/, '')}/`;
  const files: OutputFile[] = [];
  for (const e of listing.entries) {
    if (e.type !== 'file' || !e.path.startsWith(base)) continue;
    const rel = e.path.slice(base.length);
    if (isStorablePath(rel)) files.push({ path: rel, size: e.size, modified_at: e.modified });
  }
  if (files.length > MAX_OUTPUT_FILES) throw new BridgeError('payload_too_large', `${files.length} files under ${SESSION_OUTPUTS_DIR}; at most ${MAX_OUTPUT_FILES} are kept`);
  return files.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

export interface CopyRequest {
  boxd: BoxdClient;
  target: BoxdTarget;
  store: ObjectStore;
  pool: string;
  boxId: string;
  mount: OutputsMount;
  signal: AbortSignal;
  now: Date;
}

/**
 * Copies the box's outputs into the store: every file (one object each), then the manifest
 * (written last: readers see the previous copy whole until then), then the objects of files
 * that are no longer there. Resolves with the manifest. Any failure rejects; the caller keeps
 * the box (a sleep gives up, a delete answers the error).
 */
export async function uploadOutputs(r: CopyRequest): Promise<OutputsManifest> {
  const keys = outputsKeys(r.pool, r.mount.session_id);
  await r.store.check();
  const files = await listBoxOutputs(r.boxd, r.target, r.signal);
  const total = files.reduce((n, f) => n + f.size, 0);
  if (total > MAX_OUTPUT_BYTES) throw new BridgeError('payload_too_large', `the outputs hold ${total} bytes; at most ${MAX_OUTPUT_BYTES} are kept`);
  await eachLimited(files, async (f) => {
    const res = await r.boxd.readFile(r.target, `${SESSION_OUTPUTS_DIR}/${f.path}`, MAX_OUTPUT_BYTES, r.signal);
    f.size = Number(res.headers['content-length'] ?? f.size);
    try {
      await r.store.upload(r.store.key(keys.files + f.path), res, { contentType: 'application/octet-stream', signal: r.signal });
    } finally {
      res.destroy(); // after a failed upload, boxd's stream is released too
    }
  });
  const manifest: OutputsManifest = {
    version: 1,
    tenant_id: r.mount.tenant_id,
    session_id: r.mount.session_id,
    box_id: r.boxId,
    synced_at: r.now.toISOString(),
    files,
  };
  await r.store.putJson(r.store.key(keys.manifest), manifest);
  const kept = new Set(files.map((f) => r.store.key(keys.files + f.path)));
  const stale: string[] = [];
  for await (const o of r.store.list(r.store.key(keys.files))) if (!kept.has(o.key)) stale.push(o.key);
  if (stale.length) await r.store.delete(stale);
  return manifest;
}

/**
 * Copies the session's stored outputs into the box (a wake, or a new box mounting the session's
 * outputs), each file written whole by boxd (parents made). Resolves with how many files.
 */
export async function restoreOutputs(r: Omit<CopyRequest, 'now' | 'boxId'>): Promise<number> {
  const keys = outputsKeys(r.pool, r.mount.session_id);
  const manifest = await r.store.getJson<OutputsManifest>(r.store.key(keys.manifest));
  if (!manifest || manifest.session_id !== r.mount.session_id) return 0;
  let restored = 0;
  await eachLimited(manifest.files, async (f) => {
    if (!isStorablePath(f.path)) return;
    const object = await r.store.getStream(r.store.key(keys.files + f.path), r.signal);
    if (!object) return; // removed since the manifest was written (a newer copy is under way)
    try {
      await r.boxd.writeFile(r.target, `${SESSION_OUTPUTS_DIR}/${f.path}`, object.body as Readable, {
        maxBytes: MAX_OUTPUT_BYTES,
        contentLength: object.size,
        signal: r.signal,
      });
    } finally {
      (object.body as Readable).destroy(); // after a refusal, the store's stream is released too
    }
    restored++;
  });
  return restored;
}

/** Runs fn over items, COPY_CONCURRENCY at a time; the first failure stops the rest and rejects. */
async function eachLimited<T>(items: readonly T[], fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  let failed = false;
  const worker = async () => {
    while (!failed && next < items.length) {
      const item = items[next++]!;
      try {
        await fn(item);
      } catch (err) {
        failed = true;
        throw err;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(COPY_CONCURRENCY, items.length) }, worker));
}

/** Key prefix of a pool's session outputs (relative to the store's own prefix). */
export function outputsPoolPrefix(pool: string): string {
  return `session-outputs/${pool}/`;
}

/** The session digests live box records hold the outputs of: never deleted by retention. */
export function mountedSessions(records: ReadonlyArray<Pick<k8s.V1Secret, 'metadata'>>): Set<string> {
  const digests = new Set<string>();
  for (const r of records) {
    const m = outputsMountOf(r);
    if (m && !r.metadata?.deletionTimestamp) digests.add(contextDigest(m.session_id));
  }
  return digests;
}

/**
 * Pure: which objects of a pool's session outputs retention deletes. `objects` are keys relative
 * to the pool's prefix ("<session-digest>/..."). A session's outputs go whole, once the newest of
 * its objects is older than the retention and no live box record holds them (a box asleep longer
 * than the retention keeps its outputs, as it keeps its snapshot).
 */
export function planOutputsRetention(input: {
  objects: ReadonlyArray<{ key: string; lastModified: Date }>;
  mounted: ReadonlySet<string>;
  retentionSeconds: number;
  now: number;
}): { deletes: string[]; sessions: number } {
  const groups = new Map<string, { keys: string[]; newest: number }>();
  for (const o of input.objects) {
    const digest = o.key.split('/')[0]!;
    if (!/^[0-9a-f]{32}$/.test(digest)) continue; // not ours: left alone
    const g = groups.get(digest) ?? { keys: [], newest: 0 };
    g.keys.push(o.key);
    g.newest = Math.max(g.newest, o.lastModified.getTime());
    groups.set(digest, g);
  }
  const deletes: string[] = [];
  let sessions = 0;
  for (const [digest, g] of groups) {
    if (g.newest + input.retentionSeconds * 1000 > input.now || input.mounted.has(digest)) continue;
    deletes.push(...g.keys);
    sessions++;
  }
  return { deletes, sessions };
}
