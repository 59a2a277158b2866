import { buildBoxPod } from './box-pod.js';
import { ANNOTATIONS } from './labels.js';
import { BOXD_MOUNTS_PORT, hasMountsSidecar, isStoreName, isStorePath, memoryMountsOf, mountAnnotation, mountAnnotationKey, mountStep, syncPlan, type MemoryMount } from './memory-store.js';
import { POOL_DEFAULTS } from './pool.js';

test('store names and file paths: one clean component / a clean relative path', () => {
  for (const ok of ['notes', 'a.b_c-1', 'X'.repeat(128)]) expect(isStoreName(ok)).toBe(true);
  for (const bad of ['', '.hidden', '-x', 'a/b', 'a..b', 'X'.repeat(129), 'sp ace']) expect(isStoreName(bad)).toBe(false);
  for (const ok of ['a.md', 'dir/sub/file', 'ünï côde.txt']) expect(isStorePath(ok)).toBe(true);
  for (const bad of ['', '/abs', 'a//b', 'dir/', './a', 'a/../b', '..', 'a\0b']) expect(isStorePath(bad)).toBe(false);
});

test("the record's mounts: one annotation per name (a digest), parsed defensively", () => {
  const m: MemoryMount = { store_name: 'notes', store_id: 'st_1', read_only: true };
  const long: MemoryMount = { store_name: 'n'.repeat(128), store_id: 'st_2', read_only: false };
  const annotations = {
    ...mountAnnotation(long),
    ...mountAnnotation(m),
    [`${ANNOTATIONS.memoryMount}garbled`]: 'not json',
    [mountAnnotationKey('evil')]: JSON.stringify({ store_name: '../x', store_id: 's', read_only: true }),
    // A value under another name's key is not that mount.
    [mountAnnotationKey('other')]: JSON.stringify({ store_name: 'notes2', store_id: 's', read_only: true }),
    unrelated: 'x',
  } as Record<string, string>;
  expect(memoryMountsOf({ metadata: { annotations } })).toEqual([long, m]);
  expect(mountAnnotationKey(long.store_name).length - 'sandbox-bridge.io/'.length).toBeLessThanOrEqual(63);
  expect(mountAnnotation(m, true)).toEqual({ [mountAnnotationKey('notes')]: null });
  expect(memoryMountsOf(undefined)).toEqual([]);
});

test('a mount under a name already mounted: the same store the same way, or a conflict', () => {
  const m: MemoryMount = { store_name: 'notes', store_id: 'st_1', read_only: true };
  expect(mountStep([], m)).toBe('new');
  expect(mountStep([m], { ...m })).toBe('same');
  expect(mountStep([m], { ...m, read_only: false })).toBe('conflict');
  expect(mountStep([m], { ...m, store_id: 'st_2' })).toBe('conflict');
});

test('a sync puts what changed since the last one and deletes only what the box saw and removed', () => {
  const base = { 'kept.md': '3:100', 'changed.md': '3:100', 'removed.md': '1:1' };
  const now = [
    { path: 'kept.md', size: 3, mtime: 100 },
    { path: 'changed.md', size: 3, mtime: 200 },
    { path: 'new/file.md', size: 9, mtime: 300 },
    { path: 'bad//name', size: 1, mtime: 1 },
  ];
  expect(syncPlan(base, now)).toEqual({ put: ['changed.md', 'new/file.md'], delete: ['removed.md'] });
  // A first sync (no state): everything is put, nothing deleted (files others added are not the box's to delete).
  expect(syncPlan({}, now.slice(0, 1))).toEqual({ put: ['kept.md'], delete: [] });
});

test('a pool with memory stores: the sidecar, the read-only mount in the box, the rw volume; without: nothing', () => {
  const params = (enabled: boolean) => ({
    name: 'b',
    namespace: 'ns',
    poolName: 'p',
    shape: { image: 'img', cpuCores: 1, memoryBytes: 512 * 1024 * 1024 },
    box: { ...POOL_DEFAULTS.box, memoryStores: { enabled, sizeLimit: '64Mi' } },
    boxdImage: 'boxd:1',
    nonce: 'n',
    secretName: 'b',
    egress: POOL_DEFAULTS.egress,
  });
  const pod = buildBoxPod(params(true));
  expect(hasMountsSidecar(pod)).toBe(true);
  expect(hasMountsSidecar(buildBoxPod(params(false)))).toBe(false);
  const sidecar = pod.spec!.initContainers!.find((c) => c.name === 'mounts')!;
  expect(sidecar).toMatchObject({ image: 'boxd:1', args: ['mounts'], restartPolicy: 'Always', ports: [{ containerPort: BOXD_MOUNTS_PORT }] });
  expect(sidecar.securityContext).toMatchObject({ readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } });
  expect(sidecar.volumeMounts!.filter((v) => v.name.startsWith('memory')).every((v) => !v.readOnly)).toBe(true);
  const box = pod.spec!.containers[0]!;
  expect(box.volumeMounts).toEqual(
    expect.arrayContaining([
      { name: 'memory', mountPath: '/mnt/memory', readOnly: true },
      { name: 'memory-rw', mountPath: '/mnt/memory-rw' },
    ]),
  );
  expect(pod.spec!.volumes!.filter((v) => v.name.startsWith('memory'))).toEqual([
    { name: 'memory', emptyDir: { sizeLimit: '64Mi' } },
    { name: 'memory-rw', emptyDir: { sizeLimit: '64Mi' } },
  ]);
  const plain = buildBoxPod(params(false));
  expect(plain.spec!.initContainers!.map((c) => c.name)).toEqual(['boxd-install']);
  expect(JSON.stringify(plain)).not.toContain('/mnt/memory');
});
