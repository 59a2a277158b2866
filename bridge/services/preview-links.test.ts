import { PreviewSigner, PreviewUrls, recordTag } from './preview-links.js';

const key = Buffer.from('k'.repeat(40));
const claims = { boxId: 'box-0123456789ab-0', port: 8000, expiresAt: 1_900_000_000, generation: 2, record: recordTag('4F3A9C2B-1111-2222-3333-444455556666') };

test('a token carries its claims, and only this key makes one', () => {
  const signer = new PreviewSigner(key);
  const token = signer.sign(claims);
  expect(token).toMatch(/^box-0123456789ab-0\.8000\.1900000000\.2\.4f3a9c2b\.[A-Za-z0-9_-]{43}$/);
  expect(signer.verify(token)).toEqual(claims);
  expect(new PreviewSigner(Buffer.from('x'.repeat(40))).verify(token)).toBeUndefined();
  // Any claim changed: the signature no longer fits (another box, port, a later expiry, an old generation).
  const [box, port, exp, gen, rec, sig] = token.split('.');
  for (const forged of [
    ['box-0123456789ab-1', port, exp, gen, rec, sig],
    [box, '8001', exp, gen, rec, sig],
    [box, port, '1900000001', gen, rec, sig],
    [box, port, exp, '1', rec, sig],
    [box, port, exp, gen, '00000000', sig],
    [box, port, exp, gen, rec, `${sig!.slice(0, -1)}${sig!.endsWith('A') ? 'B' : 'A'}`],
  ]) {
    expect(signer.verify(forged.join('.'))).toBeUndefined();
  }
  for (const junk of ['', 'a.b', `${token}.x`, token.toUpperCase(), `BOX.8000.1.0.4f3a9c2b.${sig}`, token.replace('.8000.', '.70000.')]) expect(signer.verify(junk)).toBeUndefined();
  expect(() => new PreviewSigner(Buffer.from('short'))).toThrow(/32 bytes/);
});

test('host mode: one host per box and port, the token in the query, a host-only cookie', () => {
  const urls = new PreviewUrls('https://{port}-{box}.preview.example.com');
  expect(urls.mode).toBe('host');
  expect(urls.urlFor('box-0123456789ab-0', 8000, 'TOKEN')).toBe('https://8000-box-0123456789ab-0.preview.example.com/?sandbox_bridge_preview=TOKEN');
  expect(urls.matchHost('8000-box-0123456789ab-0.preview.example.com')).toEqual({ boxId: 'box-0123456789ab-0', port: 8000 });
  expect(urls.matchHost('8000-BOX-0123456789AB-0.Preview.Example.com')).toEqual({ boxId: 'box-0123456789ab-0', port: 8000 });
  for (const host of ['bridge.example.com', '8000-box.preview.example.com.evil.com', 'x8000-box.preview.example.com', '99999-box.preview.example.com', '8000-.preview.example.com', undefined]) {
    expect(urls.matchHost(host)).toBeUndefined();
  }
  expect(urls.cookieName).toBe('__Host-sandbox_bridge_preview');
  // The other order, a port in the pattern, plain http.
  const local = new PreviewUrls('http://{box}--{port}.preview.localhost:8080');
  expect(local.matchHost('box-abc-0--3000.preview.localhost:8080')).toEqual({ boxId: 'box-abc-0', port: 3000 });
  expect(local.matchHost('box-abc-0--3000.preview.localhost')).toBeUndefined();
  expect(local.cookieName).toBe('sandbox_bridge_preview');
  // A DNS label holds 63 characters at most.
  expect(() => urls.urlFor(`b${'x'.repeat(60)}`, 65535, 'T')).toThrow(/63/);
});

test('path mode: every link under one prefix, the token as a path segment', () => {
  const urls = new PreviewUrls('https://bridge.example.com/preview/');
  expect(urls.mode).toBe('path');
  expect(urls.urlFor('box-a-0', 8000, 'TOK')).toBe('https://bridge.example.com/preview/TOK/');
  expect(urls.matchPath('/preview/TOK/a/b?c=d')).toEqual({ token: 'TOK', rest: '/a/b?c=d', bare: false });
  expect(urls.matchPath('/preview/TOK/')).toEqual({ token: 'TOK', rest: '/', bare: false });
  expect(urls.matchPath('/preview/TOK')).toEqual({ token: 'TOK', rest: '/', bare: true });
  expect(urls.matchPath('/preview/TOK?x=1')).toEqual({ token: 'TOK', rest: '/?x=1', bare: true });
  for (const path of ['/preview', '/preview/', '/previews/TOK/', '/api/v1/boxes', '/']) expect(urls.matchPath(path)).toBeUndefined();
  expect(urls.matchHost('anything')).toBeUndefined();
});

test('PREVIEW_URL values that cannot work are refused with a reason', () => {
  expect(() => new PreviewUrls('preview.example.com')).toThrow(/http/);
  expect(() => new PreviewUrls('https://{port}.preview.example.com')).toThrow(/\{port\} and \{box\}/);
  expect(() => new PreviewUrls('https://{port}-{box}-{port}.preview.example.com')).toThrow(/once each/);
  expect(() => new PreviewUrls('https://{port}-{box}.preview.example.com/x')).toThrow(/no path/);
  expect(() => new PreviewUrls('https://bridge.example.com')).toThrow(/prefix/);
  expect(() => new PreviewUrls('https://bridge.example.com/api/v1/p')).toThrow(/prefix/);
  expect(() => new PreviewUrls('https://bridge.example.com/a b')).toThrow();
});
