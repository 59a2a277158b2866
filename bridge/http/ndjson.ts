// Streamed answers as newline-delimited JSON (application/x-ndjson): lines are written as they
// come, with backpressure; the caller going away aborts `signal`, which stops the work behind it.
// Output is cut into lines of at most 32 KiB of bytes, so a line's JSON (up to 6 bytes per byte
// of control characters) stays within what the relay reserved of the memory budget.
import { once } from 'node:events';
import { TextDecoder } from 'node:util';
import type { Request, Response } from 'express';
import { BridgeError } from '../../common/errors.js';

export const NDJSON = 'application/x-ndjson';

export interface NdjsonStream {
  /** Fires when the caller disconnects before the stream ended. */
  signal: AbortSignal;
  /** Sends the status line and headers now (time to first byte), if not sent yet. */
  open(): void;
  write(line: unknown): Promise<void>;
  /** Ends the stream; an error becomes an error line (or a normal error answer if nothing was sent). */
  end(err?: unknown): void;
}

export function wantsNdjson(req: Request): boolean {
  return req.accepts(['application/json', NDJSON]) === NDJSON;
}

/**
 * Aborts when the caller disconnects before its answer was sent whole: the route hands it to
 * the service, which stops the work (boxd kills a command whose connection closes).
 */
export function callerSignal(res: Response): AbortSignal {
  const aborter = new AbortController();
  const gone = () => aborter.abort(new BridgeError('invalid_request', 'the caller disconnected'));
  if (res.destroyed && !res.writableFinished) gone();
  else
    res.on('close', () => {
      if (!res.writableFinished) gone();
    });
  return aborter.signal;
}

export function ndjsonStream(res: Response): NdjsonStream {
  const signal = callerSignal(res);
  const open = () => {
    if (res.headersSent) return;
    res.status(200).setHeader('Content-Type', NDJSON);
    res.setHeader('Cache-Control', 'no-store');
    res.flushHeaders();
  };
  return {
    signal,
    open,
    async write(line) {
      open();
      if (!res.write(`${JSON.stringify(line)}\n`) && !res.destroyed) await once(res, 'drain', { signal });
    },
    end(err) {
      if (err === undefined) {
        open();
        res.end();
        return;
      }
      if (!res.headersSent) throw err; // the error handler answers it as usual
      const e = err instanceof BridgeError ? err : new BridgeError('internal_error', 'internal error; see the bridge logs for this request id');
      if (!res.destroyed) res.end(`${JSON.stringify({ type: 'error', ...e.toJSON() })}\n`);
    },
  };
}

/** Output bytes per line at most. */
const LINE_BYTES = 32 * 1024;

/**
 * Writes output as lines `{type, data, ...extra(at)}`, at most LINE_BYTES of it per line (`at`:
 * where the line's bytes start in data, e.g. for offsets). Lines without text (a character cut
 * at the end of a piece) are left out.
 */
export async function writeOutput(out: NdjsonStream, text: Utf8Chunks, type: string, data: Buffer, extra: (at: number) => object = () => ({})): Promise<void> {
  for (let at = 0; at < data.length; at += LINE_BYTES) {
    const decoded = text.decode(type, data.subarray(at, at + LINE_BYTES));
    if (decoded) await out.write({ type, data: decoded, ...extra(at) });
  }
}

/** Decodes one output stream's chunks as UTF-8 without splitting characters across lines. */
export class Utf8Chunks {
  private readonly decoders = new Map<string, TextDecoder>();

  decode(stream: string, data: Buffer): string {
    let decoder = this.decoders.get(stream);
    if (!decoder) this.decoders.set(stream, (decoder = new TextDecoder('utf-8')));
    return decoder.decode(data, { stream: true });
  }
}
