// Memory stores (docs/mounts.md): the platform's mountMemoryStore. A store is the set of objects
// under `<OBJECT_STORE_PREFIX>/memory/<store_id>/` in the object store, one object per file (its
// key after the prefix is the file's path), so the platform can write a store's files itself.
// Mounted, its files appear at /mnt/memory/<store_name>/ in the box. The box pod's mounts sidecar
// (boxd's mounts mode, boxd/mounts/) is the only writer of /mnt/memory, which the box container
// mounts read-only: a read-only store is read-only by the kernel. A read-write store lives in a
// second volume (/mnt/memory-rw) and appears under /mnt/memory as a link; what box code writes
// there goes back to the store on a sync, before a sleep deletes the pod, and before a delete.
//
// This module is the store side, shared by bridge and operator: the pod's parts, the mount list
// kept on the box's record, and fill / sync between the object store and the sidecar.
import { createHash } from 'node:crypto';
import type * as k8s from '@kubernetes/client-node';
import { BOXD_SECRET_DIR } from './boxd.js';
import { BridgeError } from './errors.js';
import { ANNOTATIONS } from './labels.js';
import type { ObjectStore } from './object-store.js';
import type { MemoryStorePolicy } from './pool.js';
import { parseQuantity } from './quantity.js';
import { MountsClient, type MountsTarget } from './mounts-client.js';

export { MountsClient, type MountsTarget } from './mounts-client.js';

/** Where box code sees the stores (read-only mount), and the read-write stores' own volume. */
export const MEMORY_DIR = '/mnt/memory';
export const MEMORY_RW_DIR = '/mnt/memory-rw';
/** The sidecar's port; the box NetworkPolicy admits the bridge and the operator to it. */
export const BOXD_MOUNTS_PORT = 7772;
export const MOUNTS_CONTAINER = 'mounts';
/** The store's key prefix under the object store's prefix: memory/<store_id>/<path>. */
export const MEMORY_KEY_PREFIX = 'memory';
/** Per box and store: the paths (with size and mtime) the box had at its last fill or sync. */
export const MEMORY_STATE_PREFIX = 'memory-state';

/** The most files one store may hold, and the largest file (both as boxd's mounts mode enforces). */
export const MAX_STORE_FILES = 10_000;
export const MAX_STORE_FILE_BYTES = 64 * 1024 * 1024;
/** Files moved at once between store and sidecar. */
const CONCURRENCY = 4;

/** A store name or id: one path component (letters, digits, . _ -), never hidden. */
export const STORE_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export function isStoreName(v: unknown): v is string {
  return typeof v === 'string' && STORE_NAME_PATTERN.test(v) && !v.includes('..');
}

/** A file path inside a store, as an object key suffix: relative, clean, no empty, . or .. steps. */
export function isStorePath(p: string): boolean {
  if (!p || p.length > 1024 || p.includes('\0') || p.startsWith('/')) return false;
  return p.split('/').every((c) => c !== '' && c !== '.' && c !== '..');
}

/** One mounted store, as the box's record keeps it (a wake mounts them all again). */
export interface MemoryMount {
  store_name: string;
  store_id: string;
  read_only: boolean;
}

/** The record annotation of the mount named storeName (a digest: names may be longer than a key allows). */
export function mountAnnotationKey(storeName: string): string {
  return ANNOTATIONS.memoryMount + createHash('sha256').update(storeName).digest('hex').slice(0, 16);
}

/** The record annotations that add m (replacing a mount of the same name), or with null remove it. */
export function mountAnnotation(m: MemoryMount, remove = false): Record<string, string | null> {
  return { [mountAnnotationKey(m.store_name)]: remove ? null : JSON.stringify({ store_name: m.store_name, store_id: m.store_id, read_only: m.read_only }) };
}

/** The box's mounted stores, from its record, by name (garbled ones left out). */
export function memoryMountsOf(record: Pick<k8s.V1Secret, 'metadata'> | undefined): MemoryMount[] {
  const mounts: MemoryMount[] = [];
  for (const [key, raw] of Object.entries(record?.metadata?.annotations ?? {})) {
    if (!key.startsWith(ANNOTATIONS.memoryMount)) continue;
    try {
      const m = JSON.parse(raw) as Partial<MemoryMount> | null;
      if (m && isStoreName(m.store_name) && isStoreName(m.store_id) && typeof m.read_only === 'boolean' && key === mountAnnotationKey(m.store_name)) {
        mounts.push({ store_name: m.store_name, store_id: m.store_id, read_only: m.read_only });
      }
    } catch {
      // not ours to read
    }
  }
  return mounts.sort((a, b) => (a.store_name < b.store_name ? -1 : 1));
}

/**
 * What a new mount means against the box's list: a store already mounted under that name the
 * same way is `same` (a read-only one is filled again, a read-write one left as box code made
 * it); mounted differently is a conflict, since the box's view of that name would change under it.
 */
export function mountStep(mounts: readonly MemoryMount[], m: MemoryMount): 'new' | 'same' | 'conflict' {
  const had = mounts.find((x) => x.store_name === m.store_name);
  if (!had) return 'new';
  return had.store_id === m.store_id && had.read_only === m.read_only ? 'same' : 'conflict';
}

// --- the pod -------------------------------------------------------------------------------

/**
 * The parts a pool with memory stores adds to every box pod: the two volumes, the box
 * container's mounts of them (the store volume read-only), and the sidecar (a native sidecar:
 * an init container that keeps running, started before the box and stopped after it).
 */
export function memoryPodParts(policy: MemoryStorePolicy | undefined, boxdImage: string, secretVolume: string, securityContext: k8s.V1SecurityContext) {
  if (!policy?.enabled) return undefined;
  const resources = { requests: { cpu: '50m', memory: '32Mi' }, limits: { cpu: '50m', memory: '32Mi' } };
  const sidecar: k8s.V1Container = {
    name: MOUNTS_CONTAINER,
    image: boxdImage,
    imagePullPolicy: 'IfNotPresent',
    args: ['mounts'],
    restartPolicy: 'Always',
    env: [
      { name: 'BOXD_MOUNTS_PORT', value: String(BOXD_MOUNTS_PORT) },
      // Keeps the Go heap under the container's limit.
      { name: 'GOMEMLIMIT', value: '24MiB' },
    ],
    ports: [{ name: 'mounts', containerPort: BOXD_MOUNTS_PORT, protocol: 'TCP' }],
    resources,
    securityContext,
    volumeMounts: [
      { name: 'memory', mountPath: MEMORY_DIR },
      { name: 'memory-rw', mountPath: MEMORY_RW_DIR },
      { name: secretVolume, mountPath: BOXD_SECRET_DIR, readOnly: true },
    ],
  };
  return {
    sidecar,
    annotations: { [ANNOTATIONS.memoryStores]: 'true' },
    boxMounts: [
      { name: 'memory', mountPath: MEMORY_DIR, readOnly: true },
      { name: 'memory-rw', mountPath: MEMORY_RW_DIR },
    ] satisfies k8s.V1VolumeMount[],
    volumes: [
      { name: 'memory', emptyDir: { sizeLimit: policy.sizeLimit } },
      { name: 'memory-rw', emptyDir: { sizeLimit: policy.sizeLimit } },
    ] satisfies k8s.V1Volume[],
  };
}

/** Whether a pod has the sidecar (a pod made before its pool turned memory stores on has not), by its annotation. */
export function hasMountsSidecar(pod: k8s.V1Pod | undefined): boolean {
  return pod?.metadata?.annotations?.[ANNOTATIONS.memoryStores] === 'true';
}

/** The sidecar's client, as bridge and operator both use it. */
export const mountsClient = new MountsClient({ port: BOXD_MOUNTS_PORT });

// --- the store -----------------------------------------------------------------------------

/** The key prefix of a store's files (ends in /). */
export function storePrefix(store: Pick<ObjectStore, 'key'>, storeId: string): string {
  return `${store.key(MEMORY_KEY_PREFIX, storeId)}/`;
}

function stateKey(store: Pick<ObjectStore, 'key'>, boxId: string, storeName: string): string {
  return store.key(MEMORY_STATE_PREFIX, boxId, `${storeName}.json`);
}

/** A box's view of a read-write store at its last fill or sync: path -> "size:mtime". */
interface StoreState {
  store_id: string;
  files: Record<string, string>;
}

export interface StoreCount {
  files: number;
  bytes: number;
}

/**
 * Fills the store into the box: every object under the store's prefix becomes a file, staged
 * beside the mount point and swapped in at the end, so the box never sees half a store. Objects
 * whose key is no clean relative path (a "directory" marker, ..) are not files and are left out.
 */
export async function fillStore(
  d: { store: ObjectStore; client: MountsClient },
  t: MountsTarget,
  m: MemoryMount,
  limits: { sizeLimit: string },
  signal?: AbortSignal,
): Promise<StoreCount> {
  const prefix = storePrefix(d.store, m.store_id);
  const maxBytes = parseQuantity(limits.sizeLimit);
  const files: Array<{ key: string; path: string; size: number }> = [];
  let bytes = 0;
  for await (const o of d.store.list(prefix)) {
    const path = o.key.slice(prefix.length);
    if (!isStorePath(path)) continue;
    if (o.size > MAX_STORE_FILE_BYTES) throw new BridgeError('payload_too_large', `store ${m.store_id}: ${path} is ${o.size} bytes, more than the ${MAX_STORE_FILE_BYTES} a store file may have`);
    bytes += o.size;
    files.push({ key: o.key, path, size: o.size });
    if (files.length > MAX_STORE_FILES) throw new BridgeError('payload_too_large', `store ${m.store_id} has more than ${MAX_STORE_FILES} files`);
    if (bytes > maxBytes) throw new BridgeError('payload_too_large', `store ${m.store_id} holds more than the pool's memory volume takes (${limits.sizeLimit})`);
  }
  await d.client.stage(t, m.store_name, m.read_only, signal);
  await eachLimited(files, async (f) => {
    const got = await d.store.getStream(f.key, signal);
    if (!got) return; // deleted since the listing: not part of the store any more
    await d.client.putStaged(t, m.store_name, m.read_only, f.path, got.body, signal);
  });
  await d.client.commit(t, m.store_name, m.read_only, signal);
  if (!m.read_only) await d.store.putJson(stateKey(d.store, t.box, m.store_name), stateOf(m, await d.client.list(t, m.store_name, signal)));
  return { files: files.length, bytes };
}

/**
 * Writes a read-write store back: every file box code changed since the last fill or sync is
 * put (one object per file), every file it deleted since then is deleted from the store. Files
 * the box never saw (written by others since) are left alone; the same file changed in two
 * boxes: the last sync wins.
 */
export async function syncStore(d: { store: ObjectStore; client: MountsClient }, t: MountsTarget, m: MemoryMount, signal?: AbortSignal): Promise<StoreCount> {
  // No directory: never filled (a mount that failed), or box code removed it whole (its files go).
  const listed = await d.client.list(t, m.store_name, signal).catch((err: unknown) => {
    if (err instanceof BridgeError && err.type === 'not_found') return [];
    throw err;
  });
  const key = stateKey(d.store, t.box, m.store_name);
  const before = await d.store.getJson<StoreState>(key);
  const base = before?.store_id === m.store_id ? before.files : {};
  const plan = syncPlan(base, listed);
  const prefix = storePrefix(d.store, m.store_id);
  await eachLimited(plan.put, async (path) => {
    const body = await d.client.read(t, m.store_name, path, signal);
    await d.store.upload(prefix + path, body, { contentType: 'application/octet-stream', ...(signal ? { signal } : {}) });
  });
  if (plan.delete.length) await d.store.delete(plan.delete.map((p) => prefix + p));
  await d.store.putJson(key, stateOf(m, listed));
  return { files: listed.filter((f) => isStorePath(f.path)).length, bytes: listed.reduce((n, f) => n + f.size, 0) };
}

export interface ListedFile {
  path: string;
  size: number;
  mtime: number;
}

/** Pure: what a sync puts and deletes, from the box's last known state and its files now. */
export function syncPlan(base: Record<string, string>, now: readonly ListedFile[]): { put: string[]; delete: string[] } {
  const current = new Map(now.filter((f) => isStorePath(f.path)).map((f) => [f.path, `${f.size}:${f.mtime}`]));
  return {
    put: [...current].filter(([p, v]) => base[p] !== v).map(([p]) => p),
    delete: Object.keys(base).filter((p) => !current.has(p) && isStorePath(p)),
  };
}

function stateOf(m: MemoryMount, listed: readonly ListedFile[]): StoreState {
  return { store_id: m.store_id, files: Object.fromEntries(listed.filter((f) => isStorePath(f.path)).map((f) => [f.path, `${f.size}:${f.mtime}`])) };
}

/**
 * Syncs every read-write store of a box (before a sleep deletes its pod, before a delete): all
 * or an error. A pod without the sidecar has nothing to sync.
 */
export async function syncAll(
  d: { store: ObjectStore; client: MountsClient },
  t: MountsTarget,
  pod: k8s.V1Pod,
  mounts: readonly MemoryMount[],
  signal?: AbortSignal,
): Promise<number> {
  const rw = mounts.filter((m) => !m.read_only);
  if (!rw.length || !hasMountsSidecar(pod)) return 0;
  for (const m of rw) {
    await syncStore(d, t, m, signal).catch((err: unknown) => {
      // Named, so an Event or an answer says which store (and that it is one).
      if (err instanceof BridgeError) throw new BridgeError(err.type, `memory store ${m.store_name}: ${err.message}`, { headers: err.headers, cause: err });
      throw err;
    });
  }
  return rw.length;
}

/** Forgets a deleted box's read-write state (its stores stay). */
export async function forgetBox(store: ObjectStore, boxId: string, mounts: readonly MemoryMount[]): Promise<void> {
  const keys = mounts.filter((m) => !m.read_only).map((m) => stateKey(store, boxId, m.store_name));
  if (keys.length) await store.delete(keys);
}

async function eachLimited<T>(items: readonly T[], fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await fn(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(CONCURRENCY, items.length) }, worker));
}
