import { contextDigest, contextMatches, indexKey, indexQuery, indexedSnapshot, planIndexRetention } from './snapshot-index.js';
import { newSnapshotId } from './snapshots.js';

const ctx = { tenant_id: 'acme', environment_id: 'env-1', session_id: 'sess/../1' };
const at = new Date('2026-11-25T00:00:00Z');
const id = newSnapshotId('box-session', at, new Date(at.getTime() + 7 * 86400_000));

test('a marker key nests tenant, environment, session digests, then the snapshot id; free-form ids cannot change the layout', () => {
  const key = indexKey('default', ctx, id.id);
  expect(key).toBe(`snapshot-index/default/${contextDigest('acme')}/${contextDigest('env-1')}/${contextDigest('sess/../1')}/${id.id}`);
  expect(key.split('/')).toHaveLength(6);
  expect(contextDigest('a')).toMatch(/^[0-9a-f]{32}$/);
  expect(contextDigest('a')).not.toBe(contextDigest('b'));
});

test('each filter lists the narrowest prefix that holds all its snapshots', () => {
  const key = indexKey('p', ctx, id.id);
  for (const f of [
    { tenant_id: 'acme' },
    { tenant_id: 'acme', environment_id: 'env-1' },
    { tenant_id: 'acme', environment_id: 'env-1', session_id: 'sess/../1' },
    { tenant_id: 'acme', session_id: 'sess/../1' },
  ]) {
    const q = indexQuery('p', f);
    expect(key.startsWith(q.prefix)).toBe(true);
    expect(indexedSnapshot(key, q)?.id).toBe(id.id);
  }
  expect(indexQuery('p', { tenant_id: 'acme', environment_id: 'env-1', session_id: 's' }).prefix.split('/')).toHaveLength(6);
  // Tenant + session without environment: the tenant's prefix, the session digest checked per key.
  const q = indexQuery('p', { tenant_id: 'acme', session_id: 'other' });
  expect(q.prefix).toBe(`snapshot-index/p/${contextDigest('acme')}/`);
  expect(indexedSnapshot(key, q)).toBeUndefined();
  expect(key.startsWith(indexQuery('p', { tenant_id: 'other' }).prefix)).toBe(false);
  expect(indexedSnapshot('snapshot-index/p/a/b/c/not-a-snapshot', {})).toBeUndefined();
});

test('a listing keeps only snapshots whose context is exactly the filter', () => {
  expect(contextMatches(ctx, { tenant_id: 'acme' })).toBe(true);
  expect(contextMatches(ctx, { tenant_id: 'acme', environment_id: 'env-1', session_id: 'sess/../1' })).toBe(true);
  expect(contextMatches(ctx, { tenant_id: 'acme', environment_id: 'env-2' })).toBe(false);
  expect(contextMatches(ctx, { tenant_id: 'acme', session_id: 'x' })).toBe(false);
  expect(contextMatches(ctx, { tenant_id: 'acm' })).toBe(false);
  expect(contextMatches(null, { tenant_id: 'acme' })).toBe(false);
});

test('retention deletes markers whose snapshot is gone once settled, or past its deadline; keeps the rest', () => {
  const now = at.getTime() + 3600_000;
  const rel = (snap: string) => `t/e/s/${snap}`;
  const other = newSnapshotId('box-session', at, new Date(at.getTime() + 1000));
  const fresh = newSnapshotId('box-session', new Date(now), new Date(now + 86400_000));
  const deletes = planIndexRetention({
    markers: [
      { key: rel(id.id), lastModified: at }, // snapshot stored: kept
      { key: rel(other.id), lastModified: new Date(now - 1000) }, // gone, past its deadline: deleted
      { key: rel(fresh.id), lastModified: new Date(now - 1000) }, // gone (still uploading?), within the grace: kept
      { key: 'stray-object', lastModified: at }, // not a marker: left alone
    ],
    stored: new Set([id.id]),
    retentionSeconds: 7 * 86400,
    now,
    graceMs: 60_000,
  });
  expect(deletes).toEqual([rel(other.id)]);
  // Once the grace has passed, the marker of a snapshot that never completed goes too.
  expect(planIndexRetention({ markers: [{ key: rel(fresh.id), lastModified: new Date(now - 1000) }], stored: new Set(), retentionSeconds: 7 * 86400, now: now + 60_000, graceMs: 60_000 })).toEqual([rel(fresh.id)]);
});
