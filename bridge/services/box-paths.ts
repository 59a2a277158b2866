// Paths inside a box as the API takes them: relative ones resolve under /workspace, NUL bytes
// are refused; the result is absolute and normalized (boxd only accepts such paths).
import { posix } from 'node:path';
import { BridgeError } from '../../common/errors.js';
import { WORKSPACE } from '../box-view.js';

export function resolvePath(path: string, field: string): string {
  if (path.length === 0) throw new BridgeError('invalid_request', `${field} must not be empty`);
  if (path.includes('\0')) throw new BridgeError('invalid_request', `${field} must not contain NUL bytes`);
  const absolute = path.startsWith('/') ? path : posix.join(WORKSPACE, path);
  const normalized = posix.normalize(absolute);
  return normalized.length > 1 && normalized.endsWith('/') ? normalized.slice(0, -1) : normalized;
}
