// Request validation against the contract's zod schemas (a failure is a 400 naming each
// problem), and the few request fields every route reads the same way.
import type { Request } from 'express';
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
