// The metadata-only informer against a stand-in API server on loopback: what it asks for (Accept
// headers, selectors, pages) and what it caches.
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import * as k8s from '@kubernetes/client-node';
import { pino } from 'pino';
import { METADATA_ACCEPT, ResilientInformer, type PartialObjectMetadata } from './informer.js';

const meta = (name: string, rv: string): PartialObjectMetadata => ({
  apiVersion: 'meta.k8s.io/v1',
  kind: 'PartialObjectMetadata',
  metadata: { name, namespace: 'ns', uid: `uid-${name}`, resourceVersion: rv, managedFields: [{ manager: 'bridge', operation: 'Update' }] },
});

test('metadataOnly lists in pages and watches PartialObjectMetadata, with the selectors, and caches it trimmed', async () => {
  const requests: Array<{ url: URL; accept: string | undefined }> = [];
  let watch: ServerResponse | undefined;
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url!, 'http://x');
    requests.push({ url, accept: req.headers.accept });
    res.setHeader('content-type', 'application/json');
    if (url.searchParams.get('watch') === 'true') {
      watch = res;
      res.write(`${JSON.stringify({ type: 'ADDED', object: meta('d', '11') })}\n`);
      return;
    }
    const page = url.searchParams.get('continue')
      ? { kind: 'PartialObjectMetadataList', apiVersion: 'meta.k8s.io/v1', metadata: { resourceVersion: '10' }, items: [meta('c', '9')] }
      : { kind: 'PartialObjectMetadataList', apiVersion: 'meta.k8s.io/v1', metadata: { resourceVersion: '10', continue: 'next' }, items: [meta('a', '7'), meta('b', '8')] };
    res.end(JSON.stringify(page));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const kc = new k8s.KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'c', server: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, skipTLSVerify: true }],
    users: [{ name: 'u', token: 't0ken' }],
    contexts: [{ name: 'x', cluster: 'c', user: 'u' }],
    currentContext: 'x',
  });
  const trimmed: string[] = [];
  const informer = new ResilientInformer<PartialObjectMetadata>({
    kc,
    path: '/api/v1/namespaces/ns/secrets',
    labelSelector: 'sandbox-bridge.io/box=true',
    metadataOnly: {
      trim: (s) => {
        trimmed.push(s.metadata!.name!);
        s.metadata!.managedFields = undefined;
      },
      timeoutMs: 5000,
    },
    log: pino({ level: 'silent' }),
  });
  try {
    await informer.start();
    for (let i = 0; i < 200 && informer.list().length < 4; i++) await new Promise((r) => setTimeout(r, 10));
    expect(informer.list().map((s) => s.metadata!.name).sort()).toEqual(['a', 'b', 'c', 'd']);
    expect(trimmed).toEqual(['a', 'b', 'c']);
    expect(informer.get('a', 'ns')!.metadata!.managedFields).toBeUndefined();

    const [first, second, watched] = requests;
    for (const r of [first!, second!]) {
      expect(r.accept).toBe(METADATA_ACCEPT.list);
      expect(r.url.pathname).toBe('/api/v1/namespaces/ns/secrets');
      expect([r.url.searchParams.get('labelSelector'), r.url.searchParams.get('limit')]).toEqual(['sandbox-bridge.io/box=true', '500']);
    }
    expect(second!.url.searchParams.get('continue')).toBe('next');
    expect(watched!.accept).toBe(METADATA_ACCEPT.watch);
    expect([watched!.url.searchParams.get('labelSelector'), watched!.url.searchParams.get('resourceVersion')]).toEqual(['sandbox-bridge.io/box=true', '10']);
  } finally {
    informer.stop();
    watch?.end();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});

test('resync reopens a watch that went silent from the last resource version, with no relist and no error restart', async () => {
  const lists: URL[] = [];
  const watches: Array<{ url: URL; res: ServerResponse }> = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url!, 'http://x');
    res.setHeader('content-type', 'application/json');
    if (url.searchParams.get('watch') === 'true') {
      watches.push({ url, res });
      res.flushHeaders();
      // The first watch stays silent, as one whose connection froze with the API server does;
      // the one opened again gets what happened meanwhile.
      if (watches.length === 2) res.write(`${JSON.stringify({ type: 'ADDED', object: meta('b', '11') })}\n`);
      return;
    }
    lists.push(url);
    res.end(JSON.stringify({ kind: 'PartialObjectMetadataList', apiVersion: 'meta.k8s.io/v1', metadata: { resourceVersion: '10' }, items: [meta('a', '7')] }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const kc = new k8s.KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'c', server: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, skipTLSVerify: true }],
    users: [{ name: 'u', token: 't0ken' }],
    contexts: [{ name: 'x', cluster: 'c', user: 'u' }],
    currentContext: 'x',
  });
  const warnings: string[] = [];
  const log = pino({ level: 'warn' }, { write: (line: string) => void warnings.push(line) });
  const informer = new ResilientInformer<PartialObjectMetadata>({ kc, path: '/api/v1/namespaces/ns/secrets', metadataOnly: { timeoutMs: 5000 }, log });
  try {
    await informer.start();
    for (let i = 0; i < 200 && watches.length < 1; i++) await new Promise((r) => setTimeout(r, 10));
    expect(informer.list().map((s) => s.metadata!.name)).toEqual(['a']);

    informer.resync();
    for (let i = 0; i < 200 && informer.list().length < 2; i++) await new Promise((r) => setTimeout(r, 10));
    expect(informer.list().map((s) => s.metadata!.name).sort()).toEqual(['a', 'b']);
    expect(watches.map((w) => w.url.searchParams.get('resourceVersion'))).toEqual(['10', '10']);
    // The closed watch's end is no error: no restart, no relist, nothing logged.
    await new Promise((r) => setTimeout(r, 1200));
    expect([lists.length, watches.length, warnings]).toEqual([1, 2, []]);
  } finally {
    informer.stop();
    for (const w of watches) w.res.end();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});
