// Streamed answers as newline-delimited JSON (application/x-ndjson): lines are written as they
// come, with backpressure; the caller going away aborts `signal`, which stops the work behind it.
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

export function ndjsonStream(res: Response): NdjsonStream {
  const aborter = new AbortController();
  res.on('close', () => {
    if (!res.writableFinished) aborter.abort(new BridgeError('invalid_request', 'the caller disconnected'));
  });
  const open = () => {
    if (res.headersSent) return;
    res.status(200).setHeader('Content-Type', NDJSON);
    res.setHeader('Cache-Control', 'no-store');
    res.flushHeaders();
  };
  return {
    signal: aborter.signal,
    open,
    async write(line) {
      open();
      if (!res.write(`${JSON.stringify(line)}\n`) && !res.destroyed) await once(res, 'drain', { signal: aborter.signal });
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

/** Decodes one output stream's chunks as UTF-8 without splitting characters across lines. */
export class Utf8Chunks {
  private readonly decoders = new Map<string, TextDecoder>();

  decode(stream: string, data: Buffer): string {
    let decoder = this.decoders.get(stream);
    if (!decoder) this.decoders.set(stream, (decoder = new TextDecoder('utf-8')));
    return decoder.decode(data, { stream: true });
  }
}
