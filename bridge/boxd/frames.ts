// boxd's stream framing (boxd/PROTOCOL.md "Frames"): 1 byte type, 4 bytes big-endian length,
// payload. Used for exec and process output, and both ways on a PTY connection.

export const FRAME = {
  stdout: 1,
  stderr: 2,
  exit: 3,
  error: 4,
  start: 5,
  stdin: 6,
  resize: 7,
  eof: 8,
} as const;

export type FrameType = (typeof FRAME)[keyof typeof FRAME];

export interface Frame {
  type: number;
  payload: Buffer;
}

const HEADER = 5;
/** boxd splits larger output; anything bigger means the stream is not boxd's. */
const MAX_PAYLOAD = 1024 * 1024;

export function encodeFrame(type: FrameType, payload: Buffer | string = Buffer.alloc(0)): Buffer {
  const body = typeof payload === 'string' ? Buffer.from(payload, 'utf8') : payload;
  const frame = Buffer.allocUnsafe(HEADER + body.length);
  frame.writeUInt8(type, 0);
  frame.writeUInt32BE(body.length, 1);
  body.copy(frame, HEADER);
  return frame;
}

/** Incremental decoder: push chunks as they arrive, take whole frames out. */
export class FrameDecoder {
  private pending: Buffer[] = [];
  private pendingBytes = 0;

  push(chunk: Buffer): Frame[] {
    this.pending.push(chunk);
    this.pendingBytes += chunk.length;
    const frames: Frame[] = [];
    if (this.pendingBytes < HEADER) return frames;
    let buf = this.pending.length === 1 ? this.pending[0]! : Buffer.concat(this.pending, this.pendingBytes);
    let at = 0;
    while (buf.length - at >= HEADER) {
      const length = buf.readUInt32BE(at + 1);
      if (length > MAX_PAYLOAD) throw new Error(`boxd frame of ${length} bytes exceeds the protocol's ${MAX_PAYLOAD}`);
      if (buf.length - at < HEADER + length) break;
      frames.push({ type: buf.readUInt8(at), payload: buf.subarray(at + HEADER, at + HEADER + length) });
      at += HEADER + length;
    }
    buf = buf.subarray(at);
    this.pending = buf.length ? [buf] : [];
    this.pendingBytes = buf.length;
    return frames;
  }

  /** True when the stream ended in the middle of a frame. */
  get partial(): boolean {
    return this.pendingBytes > 0;
  }
}

/** Frames of a byte stream, in order. */
export async function* readFrames(stream: AsyncIterable<Buffer>): AsyncGenerator<Frame> {
  const decoder = new FrameDecoder();
  for await (const chunk of stream) yield* decoder.push(chunk);
  if (decoder.partial) throw new Error('boxd stream ended in the middle of a frame');
}

export function frameJson<T>(frame: Frame): T {
  return JSON.parse(frame.payload.toString('utf8')) as T;
}
