// The frame codec, byte by byte (pure logic): frames split or merged arbitrarily by TCP come out whole.
import { Readable } from 'node:stream';
import { FRAME, FrameDecoder, consumeFrames, encodeFrame, readFrames } from './frames.js';

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

test('a stream read with a tighter bound refuses a frame over it, before its payload arrives', () => {
  const decoder = new FrameDecoder(64 * 1024);
  expect(decoder.push(encodeFrame(FRAME.stdout, Buffer.alloc(64 * 1024))).map((f) => f.payload.length)).toEqual([64 * 1024]);
  // Only the header of the larger frame: refused from its length alone.
  expect(() => decoder.push(encodeFrame(FRAME.stdout, Buffer.alloc(64 * 1024 + 1)).subarray(0, 5))).toThrow(/exceeds the 65536/);
});

describe('consumeFrames', () => {
  const stream = Buffer.concat([
    encodeFrame(FRAME.start, '{"pid":7}'),
    encodeFrame(FRAME.stdout, 'one'),
    encodeFrame(FRAME.stderr, 'two'),
    encodeFrame(FRAME.stdout, 'three'),
    encodeFrame(FRAME.exit, '{"exit_code":0}'),
  ]);
  const chunked = (size: number) => Readable.from(Array.from({ length: Math.ceil(stream.length / size) }, (_, i) => stream.subarray(i * size, (i + 1) * size)));
  const names = (frames: Array<{ type: number; payload: Buffer }>) => frames.map((f) => `${f.type}:${f.payload.toString()}`);
  const all = ['5:{"pid":7}', '1:one', '2:two', '1:three', '3:{"exit_code":0}'];

  test('hands every frame over in order, however the stream is cut', async () => {
    for (const size of [1, 4, 9, stream.length]) {
      const seen: Array<{ type: number; payload: Buffer }> = [];
      await consumeFrames(chunked(size), (f) => void seen.push(f));
      expect(names(seen)).toEqual(all);
    }
  });

  test('waits for a promise onFrame returns, with the stream paused, and keeps the order', async () => {
    const source = chunked(stream.length);
    const seen: Array<{ type: number; payload: Buffer }> = [];
    let pausedWhileWaiting = 0;
    await consumeFrames(source, (f) => {
      seen.push(f);
      if (f.type !== FRAME.stdout) return;
      return new Promise<void>((resolve) =>
        setTimeout(() => {
          if (source.isPaused()) pausedWhileWaiting++;
          resolve();
        }, 20),
      );
    });
    expect(names(seen)).toEqual(all);
    expect(pausedWhileWaiting).toBe(2);
  });

  test('fails on a stream cut inside a frame, a frame over the bound, an onFrame error, or a stream destroyed early', async () => {
    await expect(consumeFrames(Readable.from([stream.subarray(0, stream.length - 2)]), () => undefined)).rejects.toThrow(/middle of a frame/);
    await expect(consumeFrames(Readable.from([encodeFrame(FRAME.stdout, 'x'.repeat(100))]), () => undefined, 64)).rejects.toThrow(/exceeds the 64/);
    const source = chunked(3);
    await expect(
      consumeFrames(source, (f) => {
        if (f.type === FRAME.stderr) throw new Error('sink failed');
      }),
    ).rejects.toThrow('sink failed');
    expect(source.destroyed).toBe(true);
    const early = new Readable({ read() {} });
    early.push(encodeFrame(FRAME.stdout, 'x'));
    setTimeout(() => early.destroy(), 10);
    await expect(consumeFrames(early, () => undefined)).rejects.toThrow(/closed before its end/);
  });
});
