// The platform port's request rules (issue 21): which queries and bodies are refused, and which
// token scope each new route needs.
import { requiredScope } from './http/scopes.js';
import { MountOutputsRequest, SetContextRequest, SnapshotsQuery } from './schemas.js';

test('GET /snapshots takes a box session alone, or a tenant narrowed by environment and/or session; nothing else', () => {
  expect(SnapshotsQuery.safeParse({ session_id: 's' }).data).toEqual({ session_id: 's', limit: 100 });
  expect(SnapshotsQuery.safeParse({ tenant_id: 't', environment_id: 'e', session_id: 's', limit: '5' }).data).toEqual({ tenant_id: 't', environment_id: 'e', session_id: 's', limit: 5 });
  expect(SnapshotsQuery.safeParse({ tenant_id: 't' }).success).toBe(true);
  for (const bad of [{}, { environment_id: 'e' }, { environment_id: 'e', session_id: 's' }, { tenant_id: '' }, { tenant_id: 't', limit: '0' }, { tenant_id: 't', other: 'x' }]) {
    expect([bad, SnapshotsQuery.safeParse(bad).success]).toEqual([bad, false]);
  }
  expect(SnapshotsQuery.safeParse({ environment_id: 'e' }).error?.issues.map((i) => i.message).join('; ')).toMatch(/environment_id needs tenant_id/);
});

test('PUT /boxes/{id}/context needs a whole backup and/or outbound context', () => {
  const backup = { tenant_id: 't', environment_id: 'e', session_id: 's' };
  expect(SetContextRequest.safeParse({ backup }).success).toBe(true);
  expect(SetContextRequest.safeParse({ outbound: { tenant_id: 't', session_id: 's' } }).success).toBe(true);
  for (const bad of [{}, { backup: { tenant_id: 't', session_id: 's' } }, { backup: { ...backup, extra: 1 } }, { outbound: { tenant_id: '', session_id: 's' } }, { other: 1 }]) {
    expect([bad, SetContextRequest.safeParse(bad).success]).toEqual([bad, false]);
  }
  expect(MountOutputsRequest.safeParse({ tenant_id: 't' }).success).toBe(false);
});

test('scopes: keepalive, context and mounts are writes; reading outputs is contents', () => {
  expect(requiredScope('POST', '/boxes/b/keepalive')).toBe('boxes:write');
  expect(requiredScope('PUT', '/boxes/b/context')).toBe('boxes:write');
  expect(requiredScope('POST', '/boxes/b/mounts/outputs')).toBe('boxes:write');
  expect(requiredScope('GET', '/sessions/s/outputs')).toBe('boxes:contents');
  expect(requiredScope('GET', '/sessions/s/outputs/a/b.txt')).toBe('boxes:contents');
  expect(requiredScope('GET', '/sessions/{sessionId}/outputs/{path}')).toBe('boxes:contents');
  expect(requiredScope('DELETE', '/sessions/s/outputs')).toBe('admin');
  expect(requiredScope('GET', '/sessions/s')).toBe('admin');
});
