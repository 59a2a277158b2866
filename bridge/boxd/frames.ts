// boxd's stream framing (boxd/PROTOCOL.md "Frames"): 1 byte type, 4 bytes big-endian length,
// payload. Used for exec and process output, and both ways on a PTY connection.
import type { Readable } from 'node:stream';

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

  /** maxPayload: a larger frame is refused (a stream whose frames the caller bounds tighter than the protocol). */
  constructor(private readonly maxPayload = MAX_PAYLOAD) {}

  push(chunk: Buffer): Frame[] {
    this.pending.push(chunk);
    this.pendingBytes += chunk.length;
    const frames: Frame[] = [];
    if (this.pendingBytes < HEADER) return frames;
    let buf = this.pending.length === 1 ? this.pending[0]! : Buffer.concat(this.pending, this.pendingBytes);
    let at = 0;
    while (buf.length - at >= HEADER) {
      const length = buf.readUInt32BE(at + 1);
      if (length > this.maxPayload) throw new Error(`boxd frame of ${length} bytes exceeds the ${this.maxPayload} this stream allows`);
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

/** Frames of a byte stream, in order; a frame over maxPayload fails the stream. */
export async function* readFrames(stream: AsyncIterable<Buffer>, maxPayload = MAX_PAYLOAD): AsyncGenerator<Frame> {
  const decoder = new FrameDecoder(maxPayload);
  for await (const chunk of stream) yield* decoder.push(chunk);
  if (decoder.partial) throw new Error('boxd stream ended in the middle of a frame');
}

export function frameJson<T>(frame: Frame): T {
  return JSON.parse(frame.payload.toString('utf8')) as T;
}

/**
 * Hands a stream's frames to onFrame in order, as chunks arrive (no async iteration per chunk).
 * A promise onFrame returns pauses the stream until it settles (backpressure). Resolves at the
 * stream's end; rejects (and destroys the stream) when onFrame fails, a frame is over
 * maxPayload, or the stream fails, closes early or ends inside a frame.
 */
export function consumeFrames(stream: Readable, onFrame: (frame: Frame) => void | Promise<void>, maxPayload = MAX_PAYLOAD): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const decoder = new FrameDecoder(maxPayload);
    let settled = false;
    let waiting = false;
    let ended = false;
    const finish = (err?: unknown) => {
      if (settled) return;
      settled = true;
      stream.off('data', onData);
      stream.off('end', onEnd);
      stream.off('error', finish);
      stream.off('close', onClose);
      if (err === undefined) return resolve();
      stream.destroy();
      reject(err);
    };
    /** Runs frames[at...] through onFrame; false when it had to wait (the rest follows, then the stream resumes). */
    const deliver = (frames: Frame[], at: number): boolean => {
      for (let i = at; i < frames.length; i++) {
        let pending: void | Promise<void>;
        try {
          pending = onFrame(frames[i]!);
        } catch (err) {
          finish(err);
          return false;
        }
        if (pending) {
          waiting = true;
          stream.pause();
          pending.then(() => {
            if (settled || !deliver(frames, i + 1)) return;
            waiting = false;
            if (ended) onEnd();
            else stream.resume();
          }, finish);
          return false;
        }
      }
      return true;
    };
    const onData = (chunk: Buffer) => {
      let frames: Frame[];
      try {
        frames = decoder.push(chunk);
      } catch (err) {
        return finish(err);
      }
      deliver(frames, 0);
    };
    function onEnd() {
      ended = true;
      if (waiting) return; // finished once the frames delivered so far are taken
      finish(decoder.partial ? new Error('boxd stream ended in the middle of a frame') : undefined);
    }
    const onClose = () => {
      if (!ended) finish(new Error('boxd stream closed before its end'));
    };
    stream.on('data', onData);
    stream.on('end', onEnd);
    stream.on('error', finish);
    stream.on('close', onClose);
  });
}
