import { ConfigError, loadConfig } from './config.js';

test('defaults', () => {
  const c = loadConfig({});
  expect(c).toMatchObject({ LOG_LEVEL: 'info', METRICS_PORT: 9090, LEASE_NAMESPACE: 'default', LEASE_NAME: 'sandbox-bridge-operator' });
  expect(c.KUBECONFIG).toBeUndefined();
  expect(c.WATCH_NAMESPACES).toEqual([]);
  expect(c.identity).toMatch(/_[0-9a-f]{8}$/);
});

test('identity starts with POD_NAME and is unique per process', () => {
  const a = loadConfig({ POD_NAME: 'op-0' });
  const b = loadConfig({ POD_NAME: 'op-0' });
  expect(a.identity).toMatch(/^op-0_/);
  expect(a.identity).not.toBe(b.identity);
});

test('bad values are reported by variable name', () => {
  expect(() => loadConfig({ LOG_LEVEL: 'loud', METRICS_PORT: '99999' })).toThrow(ConfigError);
  expect(() => loadConfig({ LOG_LEVEL: 'loud', METRICS_PORT: '99999' })).toThrow(/LOG_LEVEL[\s\S]*METRICS_PORT|METRICS_PORT[\s\S]*LOG_LEVEL/);
  expect(() => loadConfig({ LEASE_DURATION_SECONDS: '3', LEASE_RENEW_SECONDS: '2' })).toThrow(/LEASE_RENEW_SECONDS/);
});

test('WATCH_NAMESPACES is a comma-separated list of namespace names', () => {
  expect(loadConfig({ WATCH_NAMESPACES: 'sandbox, sandbox-b,,sandbox' }).WATCH_NAMESPACES).toEqual(['sandbox', 'sandbox-b']);
  expect(() => loadConfig({ WATCH_NAMESPACES: 'sandbox,Not_A_Namespace' })).toThrow(/WATCH_NAMESPACES/);
});
