// The streaming base64 decoder of file uploads (pure logic).
import { Readable } from 'node:stream';
import { randomBytes } from 'node:crypto';
import { BridgeError } from '../../common/errors.js';
import { Base64Decoder } from './files.js';

async function decode(chunks: string[]): Promise<Buffer> {
  const out: Buffer[] = [];
  for await (const chunk of Readable.from(chunks.map((c) => Buffer.from(c, 'latin1'))).pipe(new Base64Decoder())) out.push(chunk as Buffer);
  return Buffer.concat(out);
}

test('base64 decodes across arbitrary chunk boundaries and ignores whitespace', async () => {
  const bytes = randomBytes(1000);
  const text = bytes.toString('base64').replace(/(.{76})/g, '$1\r\n');
  for (const size of [1, 3, 4, 5, 77, text.length]) {
    const chunks = [];
    for (let i = 0; i < text.length; i += size) chunks.push(text.slice(i, i + size));
    expect((await decode(chunks)).equals(bytes)).toBe(true);
  }
  expect((await decode([])).length).toBe(0);
});

test.each([
  ['a character outside the alphabet', ['QUJD', 'R!=='], /not valid base64/],
  ['data after padding', ['QQ==', 'QUJD'], /not valid base64/],
  ['a length that is not a multiple of 4', ['QUJ'], /not valid base64/],
])('refuses %s', async (_name, chunks, message) => {
  await expect(decode(chunks)).rejects.toThrow(message);
  await expect(decode(chunks)).rejects.toBeInstanceOf(BridgeError);
});
