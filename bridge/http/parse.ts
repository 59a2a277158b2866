// Request validation against the contract's zod schemas (a failure is a 400 naming each
// problem), and the few request fields every route reads the same way.
import express, { type Request, type RequestHandler } from 'express';
import type { z } from 'zod';
import { BridgeError } from '../../common/errors.js';
import { describeIssues } from '../schemas.js';

export function parse<S extends z.ZodType>(schema: S, value: unknown): z.infer<S> {
  const result = schema.safeParse(value);
  if (!result.success) throw new BridgeError('invalid_request', describeIssues(result.error));
  return result.data;
}

/** The :id route parameter. */
export const boxIdParam = (req: Request) => String(req.params.id);

/** Content-Length of a request, when the caller sent one. */
export function contentLength(req: Request): number | undefined {
  const value = req.headers['content-length'];
  return value === undefined ? undefined : Number(value);
}

/** A JSON body (Content-Type application/json, in UTF-8 or with no charset), nothing else. */
const PLAIN_JSON = /^application\/json\s*(;\s*charset\s*=\s*"?utf-8"?\s*)?$/i;

/** An error as body-parser makes it (errors.ts maps its type to the API's). */
function bodyError(status: number, type: string, message: string, extra: object = {}): Error {
  return Object.assign(new Error(message), { status, statusCode: status, expose: true, type, ...extra });
}

/**
 * express.json({ limit, strict: true }) for the body nearly every call sends (plain JSON in UTF-8,
 * not compressed), read and parsed here without body-parser's per-request machinery; anything
 * else (another charset, a Content-Encoding, another type, no body) goes to express.json, which
 * knows all of it. Same outcomes: req.body parsed, or {} for an empty body; 413 entity.too.large
 * over limit (from Content-Length before reading, or as it arrives); 400 entity.parse.failed for
 * JSON that is not an object or array; 400 request.size.invalid or request.aborted.
 */
export function jsonBody(limit: number): RequestHandler {
  const full = express.json({ limit, strict: true });
  const utf8 = new TextDecoder('utf-8');
  return (req, res, next) => {
    const type = req.headers['content-type'];
    const encoding = req.headers['content-encoding'];
    const declared = req.headers['content-length'];
    const plain = type !== undefined && PLAIN_JSON.test(type) && (encoding === undefined || encoding.toLowerCase() === 'identity');
    if (!plain || req.readableEnded || (declared === undefined && req.headers['transfer-encoding'] === undefined)) return full(req, res, next);
    const length = declared === undefined ? undefined : Number(declared);
    if (length !== undefined && length > limit) {
      req.pause();
      return next(bodyError(413, 'entity.too.large', 'request entity too large', { expected: length, length, limit }));
    }
    const chunks: Buffer[] = [];
    let received = 0;
    const stop = () => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('aborted', onAborted);
      req.off('error', onError);
    };
    const onData = (chunk: Buffer) => {
      received += chunk.length;
      if (received > limit) {
        stop();
        req.pause();
        next(bodyError(413, 'entity.too.large', 'request entity too large', { received, limit }));
        return;
      }
      chunks.push(chunk);
    };
    const onAborted = () => {
      stop();
      next(bodyError(400, 'request.aborted', 'request aborted', { received }));
    };
    const onError = (err: Error) => {
      stop();
      next(err);
    };
    const onEnd = () => {
      stop();
      if (length !== undefined && received !== length) return next(bodyError(400, 'request.size.invalid', 'request size did not match content length', { received, expected: length }));
      const text = utf8.decode(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, received));
      if (text.length === 0) {
        req.body = {};
        return next();
      }
      const first = /^[\x20\x09\x0a\x0d]*(.|$)/.exec(text)![1];
      if (first !== '{' && first !== '[') return next(bodyError(400, 'entity.parse.failed', `Unexpected token ${first} in JSON`));
      try {
        req.body = JSON.parse(text) as unknown;
      } catch (err) {
        return next(bodyError(400, 'entity.parse.failed', (err as Error).message));
      }
      next();
    };
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('aborted', onAborted);
    req.on('error', onError);
  };
}
