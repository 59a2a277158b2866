import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
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

test('webhooks: endpoints and signing key from their files; bad files stop the start', () => {
  const dir = mkdtempSync(join(tmpdir(), 'op-config-'));
  try {
    const file = join(dir, 'webhooks.json');
    writeFileSync(file, JSON.stringify({ endpoints: [{ url: 'https://hooks.example/a', events: ['oom_killed'] }, { url: 'https://hooks.example/b', format: 'slack' }] }));
    writeFileSync(join(dir, 'key'), 'secret\n');
    const c = loadConfig({ WEBHOOKS_FILE: file, WEBHOOK_SIGNING_KEY_FILE: join(dir, 'key') });
    expect(c.webhooks).toEqual({
      endpoints: [
        { url: 'https://hooks.example/a', events: ['oom_killed'], format: 'json' },
        { url: 'https://hooks.example/b', format: 'slack' },
      ],
      signingKey: 'secret',
    });
    expect(loadConfig({ WEBHOOKS_FILE: file, WEBHOOK_SIGNING_KEY_FILE: join(dir, 'absent') }).webhooks.signingKey).toBeUndefined();
    expect(loadConfig({}).webhooks).toEqual({ endpoints: [] });
    writeFileSync(file, JSON.stringify({ endpoints: [{ url: 'ftp://x', events: ['sneezed'] }] }));
    expect(() => loadConfig({ WEBHOOKS_FILE: file })).toThrow(/WEBHOOKS_FILE: endpoints\.0\.url[\s\S]*WEBHOOKS_FILE: endpoints\.0\.events\.0/);
    writeFileSync(file, '{');
    expect(() => loadConfig({ WEBHOOKS_FILE: file })).toThrow(/WEBHOOKS_FILE: .* is not valid JSON/);
    expect(() => loadConfig({ WEBHOOKS_FILE: join(dir, 'nope.json') })).toThrow(/WEBHOOKS_FILE: cannot read/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('WATCH_NAMESPACES is a comma-separated list of namespace names', () => {
  expect(loadConfig({ WATCH_NAMESPACES: 'sandbox, sandbox-b,,sandbox' }).WATCH_NAMESPACES).toEqual(['sandbox', 'sandbox-b']);
  expect(() => loadConfig({ WATCH_NAMESPACES: 'sandbox,Not_A_Namespace' })).toThrow(/WATCH_NAMESPACES/);
});

test('node checks: off by default, read hourly; NODE_CHECKS takes only true or false', () => {
  expect(loadConfig({})).toMatchObject({ NODE_CHECKS: false, NODE_CHECK_INTERVAL_SECONDS: 3600 });
  expect(loadConfig({ NODE_CHECKS: 'true', NODE_CHECK_INTERVAL_SECONDS: '600' })).toMatchObject({ NODE_CHECKS: true, NODE_CHECK_INTERVAL_SECONDS: 600 });
  expect(() => loadConfig({ NODE_CHECKS: 'yes' })).toThrow(/NODE_CHECKS/);
  expect(() => loadConfig({ NODE_CHECK_INTERVAL_SECONDS: '1' })).toThrow(/NODE_CHECK_INTERVAL_SECONDS/);
});

test("the egress key: the key file's first line signs (as the gateway's); none leaves it unset; a short key stops the start", () => {
  const dir = mkdtempSync(join(tmpdir(), 'egress-key-'));
  try {
    const file = join(dir, 'keys');
    writeFileSync(file, `\n${'n'.repeat(40)}\n${'o'.repeat(40)}\n`);
    expect(loadConfig({ EGRESS_KEY_FILE: file }).egressKey?.toString()).toBe('n'.repeat(40));
    expect(loadConfig({}).egressKey).toBeUndefined();
    expect(loadConfig({}).EGRESS_CA_PROPAGATION_SECONDS).toBe(180);
    expect(() => loadConfig({ EGRESS_KEY: 'short' })).toThrow(/EGRESS_KEY: must be at least 32 bytes/);
    writeFileSync(file, '\n\n');
    expect(() => loadConfig({ EGRESS_KEY_FILE: file })).toThrow(/holds no key/);
  } finally {
    rmSync(dir, { recursive: true });
  }
});
