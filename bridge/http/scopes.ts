// Which token scope each route needs, in one table (docs/tokens.md lists it for people). Paths are
// relative to /api/v1. `admin` passes every check. A path no rule names needs `admin`, so a route
// added later is closed to scoped tokens until it is placed here.
import type { RequestHandler } from 'express';
import { BridgeError } from '../../common/errors.js';
import { wakePermission } from '../services/box-connector.js';
import { hasScope, type Scope, type Token } from './tokens.js';

const READ_METHODS = new Set(['GET', 'HEAD']);

/**
 * Reads that return what is inside a box (files, file watches, archives, process output), not facts about it:
 * they need boxes:contents (docs/tokens.md). Paths as OpenAPI writes them ({id}) or as requested.
 */
const CONTENTS = [/^\/boxes\/[^/]+\/files(\/list|\/watch)?$/, /^\/boxes\/[^/]+\/archive$/, /^\/boxes\/[^/]+\/processes\/[^/]+\/output$/];

/** Traffic to a box's ports, as OpenAPI writes it ({port}) or as requested. */
const PORTS = /^\/boxes\/[^/]+\/ports\/[^/]+(\/.*)?$/;

/** The scope a request needs; undefined: any valid token. */
export function requiredScope(method: string, path: string): Scope | undefined {
  if (path === '/health' || path === '/openapi.json') return undefined;
  const read = READ_METHODS.has(method.toUpperCase());
  if (path === '/boxes' || path.startsWith('/boxes/') || path === '/snapshots' || path.startsWith('/snapshots/')) {
    // A terminal is a GET (the WebSocket upgrade) but types commands into the box; an app behind a
    // port may act on any request, whatever its method (docs/ports.md).
    if (!read || path.endsWith('/pty') || PORTS.test(path)) return 'boxes:write';
    return CONTENTS.some((re) => re.test(path)) ? 'boxes:contents' : 'boxes:read';
  }
  // A session's outputs are files box code wrote: contents (never a wake, services/session-outputs.ts).
  if (/^\/sessions\/[^/]+\/outputs(\/.*)?$/.test(path)) return read ? 'boxes:contents' : 'admin';
  if (path.startsWith('/cluster/')) return read ? 'cluster:read' : 'admin';
  if (path === '/sandboxes' || path.startsWith('/sandboxes/')) return read ? 'sandboxes:read' : 'admin';
  return 'admin';
}

/**
 * Refuses a request whose token lacks the route's scope: 403 forbidden naming the scope. What the
 * request may do to a sleeping box follows from the token too: only boxes:write wakes one.
 */
export function requireScope(): RequestHandler {
  return (req, res, next) => {
    const token = res.locals.token as Token | undefined;
    const needed = requiredScope(req.method, req.path);
    if (!token) return next(new BridgeError('unauthorized', 'not authenticated'));
    if (needed === undefined || hasScope(token, needed)) return wakePermission.run(hasScope(token, 'boxes:write'), next);
    next(
      new BridgeError(
        'forbidden',
        `token "${token.name}" lacks the scope ${needed}, which ${req.method} ${req.baseUrl}${req.path} needs (it has: ${[...token.scopes].join(', ')})`,
      ),
    );
  };
}
