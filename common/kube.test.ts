// sharedConnectionAuth: one connection pool per client, auth headers refreshed on a schedule.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import * as http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { AUTH_REFRESH_MS, makeApiClient, sharedConnectionAuth } from './kube.js';

function fakeKubeConfig() {
  let calls = 0;
  const closed: number[] = [];
  const kc = {
    async applySecurityAuthentication(context: k8s.RequestContext) {
      const n = ++calls;
      context.setHeaderParam('Authorization', `Bearer token-${n}`);
      context.setDispatcher({ id: n, close: async () => void closed.push(n) } as unknown as ReturnType<k8s.RequestContext['getDispatcher']> & object);
    },
  };
  return { kc, calls: () => calls, closed };
}

const request = () => new k8s.RequestContext('https://api.example/api/v1/pods', k8s.HttpMethod.GET);

describe('sharedConnectionAuth', () => {
  it('reuses the headers and the first connection pool until the refresh interval passes', async () => {
    let now = 1_000_000;
    const { kc, calls, closed } = fakeKubeConfig();
    const auth = sharedConnectionAuth(kc, () => now);

    const first = request();
    await auth.applySecurityAuthentication(first);
    const second = request();
    await auth.applySecurityAuthentication(second);
    expect(calls()).toBe(1);
    expect(second.getHeaders()).toMatchObject({ Authorization: 'Bearer token-1' });
    expect(second.getDispatcher()).toBe(first.getDispatcher());

    now += AUTH_REFRESH_MS + 1;
    const later = request();
    await auth.applySecurityAuthentication(later);
    expect(calls()).toBe(2);
    expect(later.getHeaders()).toMatchObject({ Authorization: 'Bearer token-2' }); // a rotated token is picked up
    expect(later.getDispatcher()).toBe(first.getDispatcher()); // still the one pool
    expect(closed).toEqual([2]); // the Agent client-node made for the refresh is closed unused
  });
});

describe('connections to the API server', () => {
  it('speak HTTP/1.1 even to a server that offers HTTP/2 (undici 8 negotiates it by default)', async () => {
    // A TLS server of the test's own on loopback that offers h2 and http/1.1, as kube-apiserver does.
    const dir = mkdtempSync(join(tmpdir(), 'kube-test-'));
    let key: Buffer, cert: Buffer;
    try {
      execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', join(dir, 'k'), '-out', join(dir, 'c'), '-days', '1', '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1'], { stdio: 'ignore' });
      key = readFileSync(join(dir, 'k'));
      cert = readFileSync(join(dir, 'c'));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    const versions: string[] = [];
    const server = http2.createSecureServer({ key, cert, allowHTTP1: true }, (req, res) => {
      versions.push(req.httpVersion);
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ kind: 'APIResourceList', apiVersion: 'v1', groupVersion: 'v1', resources: [] }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const kc = new k8s.KubeConfig();
      kc.loadFromOptions({
        clusters: [{ name: 'c', server: `https://127.0.0.1:${(server.address() as AddressInfo).port}`, caData: cert.toString('base64') }],
        users: [{ name: 'u', token: 'a-token' }],
        contexts: [{ name: 'x', cluster: 'c', user: 'u' }],
        currentContext: 'x',
      });
      const api = makeApiClient(kc, k8s.CoreV1Api, 5_000);
      await api.getAPIResources();
      await api.getAPIResources();
      expect(versions).toEqual(['1.1', '1.1']);
    } finally {
      server.close();
    }
  });
});
