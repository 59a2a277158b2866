// Preview links' rules in PortService (issue 23): expiry, per-port revocation, a box made again,
// scope to box and port. The record store is an in-memory stand-in (pure logic; the real one is
// exercised by test/integration/ports.test.ts).
import type * as k8s from '@kubernetes/client-node';
import { BridgeError } from '../../common/errors.js';
import { ANNOTATIONS } from '../../common/labels.js';
import { ByteBudget } from './byte-budget.js';
import { GENERATION_TTL_MS, PortService, generationsOf } from './ports.js';
import { PreviewSigner, PreviewUrls } from './preview-links.js';

const BOX = 'box-0123456789ab-0';

function service() {
  let now = 1_800_000_000_000;
  let record: k8s.V1Secret | undefined = { metadata: { name: `${BOX}-record`, uid: 'aaaaaaaa-1111-2222-3333-444455556666', resourceVersion: '1', annotations: {} } };
  let swaps = 0;
  const ports = new PortService({
    connector: { call: () => Promise.reject(new Error('not in this test')) },
    boxd: { toPort: () => Promise.reject(new Error('not in this test')) },
    budget: new ByteBudget(64 << 20),
    boxes: {
      locate: async (id: string) => {
        if (id !== BOX || !record) throw new BridgeError('not_found', `box ${id} not found`);
        return { record };
      },
    },
    records: {
      read: async () => record,
      swap: async (r: k8s.V1Secret, change: { annotations?: Record<string, string> }) => {
        if (r.metadata!.resourceVersion !== record?.metadata!.resourceVersion) return undefined;
        swaps++;
        record = { metadata: { ...r.metadata, resourceVersion: String(Number(r.metadata!.resourceVersion) + 1), annotations: { ...r.metadata!.annotations, ...change.annotations } } };
        return record;
      },
    } as never,
    limits: { maxConnectionsPerBox: 4, bytesPerSecondPerBox: 0, firstByteMs: 1000, idleMs: 1000 },
    previews: { signer: new PreviewSigner(Buffer.alloc(32, 7)), urls: new PreviewUrls('https://{port}-{box}.preview.example.com'), defaultTtlSeconds: 60, maxTtlSeconds: 3600 },
    now: () => now,
  });
  return {
    ports,
    advance: (ms: number) => (now += ms),
    remake: () => (record = { metadata: { name: `${BOX}-record`, uid: 'bbbbbbbb-1111-2222-3333-444455556666', resourceVersion: '9', annotations: {} } }),
    record: () => record,
    swaps: () => swaps,
  };
}

const tokenOf = (url: string) => new URL(url).searchParams.get('sandbox_bridge_preview')!;
const typeOf = (p: Promise<unknown>) => p.then(() => 'ok', (err: BridgeError) => err.type);

test('a link works until it expires, for its box and port only', async () => {
  const s = service();
  const link = await s.ports.createPreview(BOX, 8000, 30);
  expect(link).toEqual({ box_id: BOX, port: 8000, url: expect.stringMatching(/^https:\/\/8000-box-0123456789ab-0\.preview\.example\.com\/\?sandbox_bridge_preview=/), expires_at: new Date(1_800_000_030_000).toISOString() });
  const token = tokenOf(link.url);
  await expect(s.ports.checkPreview(token, { boxId: BOX, port: 8000 })).resolves.toMatchObject({ boxId: BOX, port: 8000 });
  expect(await typeOf(s.ports.checkPreview(token, { boxId: BOX, port: 8001 }))).toBe('not_found');
  expect(await typeOf(s.ports.checkPreview(token, { boxId: 'box-0123456789ab-1', port: 8000 }))).toBe('not_found');
  s.advance(29_000);
  expect(await typeOf(s.ports.checkPreview(token))).toBe('ok');
  s.advance(1_000);
  expect(await typeOf(s.ports.checkPreview(token))).toBe('gone');
  // Lifetimes: the default, and no more than the maximum.
  expect((await s.ports.createPreview(BOX, 8000)).expires_at).toBe(new Date(1_800_000_090_000).toISOString());
  expect(await typeOf(s.ports.createPreview(BOX, 8000, 3601))).toBe('invalid_request');
  expect(await typeOf(s.ports.createPreview(BOX, 0))).toBe('invalid_request');
});

test("revoking a port's links ends them and only them; later links work", async () => {
  const s = service();
  const a = tokenOf((await s.ports.createPreview(BOX, 8000)).url);
  const b = tokenOf((await s.ports.createPreview(BOX, 8001)).url);
  expect(await s.ports.revokePreviews(BOX, 8000)).toMatchObject({ box_id: BOX, port: 8000 });
  expect(await typeOf(s.ports.checkPreview(a))).toBe('gone');
  expect(await typeOf(s.ports.checkPreview(b))).toBe('ok');
  const c = tokenOf((await s.ports.createPreview(BOX, 8000)).url);
  expect(await typeOf(s.ports.checkPreview(c))).toBe('ok');
  await s.ports.revokePreviews(BOX, 8000);
  expect(generationsOf(s.record()!)).toEqual({ 8000: 2 });
  expect(s.record()!.metadata!.annotations![ANNOTATIONS.previewGeneration]).toBe('{"8000":2}');
  expect(await typeOf(s.ports.checkPreview(c))).toBe('gone');
  expect(s.swaps()).toBe(2);
});

test('a box deleted and made again under the same id is not reached by the old links', async () => {
  const s = service();
  const old = tokenOf((await s.ports.createPreview(BOX, 8000)).url);
  s.remake();
  s.advance(GENERATION_TTL_MS + 1);
  expect(await typeOf(s.ports.checkPreview(old))).toBe('not_found');
  expect(await typeOf(s.ports.checkPreview(tokenOf((await s.ports.createPreview(BOX, 8000)).url)))).toBe('ok');
});

test('generations in the record: junk is read as none', () => {
  const rec = (v: string | undefined): k8s.V1Secret => ({ metadata: { annotations: v === undefined ? {} : { [ANNOTATIONS.previewGeneration]: v } } });
  expect(generationsOf(rec(undefined))).toEqual({});
  expect(generationsOf(rec('3'))).toEqual({});
  expect(generationsOf(rec('{"8000":1,"x":2,"70000":3,"9":-1,"10":1.5}'))).toEqual({ 8000: 1 });
  expect(generationsOf(rec('{'))).toEqual({});
});
