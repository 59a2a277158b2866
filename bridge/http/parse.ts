// Request validation against the contract's zod schemas: a failure is a 400 naming each problem.
import type { z } from 'zod';
import { BridgeError } from '../../common/errors.js';
import { describeIssues } from '../schemas.js';

export function parse<S extends z.ZodType>(schema: S, value: unknown): z.infer<S> {
  const result = schema.safeParse(value);
  if (!result.success) throw new BridgeError('invalid_request', describeIssues(result.error));
  return result.data;
}
