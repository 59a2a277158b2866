// The frame codec, byte by byte (pure logic): frames split or merged arbitrarily by TCP come out whole.
import { Readable } from 'node:stream';
import { FRAME, FrameDecoder, encodeFrame, readFrames } from './frames.js';

test('frames survive any chunking', () => {
  const stream = Buffer.concat([
    encodeFrame(FRAME.start, '{"pid":7}'),
    encodeFrame(FRAME.stdout, Buffer.from([0, 1, 2, 255])),
    encodeFrame(FRAME.stderr, ''),
    encodeFrame(FRAME.exit, '{"exit_code":0}'),
  ]);
  for (const size of [1, 2, 3, 5, 7, stream.length]) {
    const decoder = new FrameDecoder();
    const frames = [];
    for (let i = 0; i < stream.length; i += size) frames.push(...decoder.push(stream.subarray(i, i + size)));
    expect(frames.map((f) => [f.type, f.payload.toString('hex')])).toEqual([
      [FRAME.start, Buffer.from('{"pid":7}').toString('hex')],
      [FRAME.stdout, '000102ff'],
      [FRAME.stderr, ''],
      [FRAME.exit, Buffer.from('{"exit_code":0}').toString('hex')],
    ]);
    expect(decoder.partial).toBe(false);
  }
});

test('a stream cut inside a frame, or a frame too large, is an error', async () => {
  const cut = encodeFrame(FRAME.stdout, 'hello').subarray(0, 7);
  await expect(
    (async () => {
      for await (const _ of readFrames(Readable.from([cut]))) void _;
    })(),
  ).rejects.toThrow(/middle of a frame/);
  const huge = Buffer.from([FRAME.stdout, 0x7f, 0xff, 0xff, 0xff]);
  expect(() => new FrameDecoder().push(huge)).toThrow(/exceeds/);
});
