// Turns anything thrown by a route into the API's JSON error body. Unknown errors are logged
// with the request id and reported as internal_error without internals.
import type { ErrorRequestHandler, RequestHandler } from 'express';
import { BridgeError } from '../../common/errors.js';

export const notFoundRoute: RequestHandler = (req, _res, next) => {
  next(new BridgeError('not_found', `no route ${req.method} ${req.path}`));
};

export const errorHandler: ErrorRequestHandler = (err: unknown, req, res, _next) => {
  const error = toBridgeError(err);
  if (error.status >= 500) req.log?.error({ err }, error.message);
  else req.log?.info({ errorType: error.type }, error.message);
  if (res.headersSent) {
    // Part of a stream went out: cut the connection, so the caller sees it incomplete rather
    // than a clean end of a truncated body.
    res.destroy();
    return;
  }
  for (const [name, value] of Object.entries(error.headers)) res.setHeader(name, value);
  res.status(error.status).json(error.toJSON());
};

/** Body-parser and other framework errors carry an HTTP status; map them to the API's types. */
function toBridgeError(err: unknown): BridgeError {
  if (err instanceof BridgeError) return err;
  const e = err as { status?: number; type?: string; message?: string; limit?: number };
  if (e?.type === 'entity.too.large') return new BridgeError('payload_too_large', `request body exceeds the limit of ${e.limit} bytes`);
  if (e?.type === 'entity.parse.failed') return new BridgeError('invalid_request', 'request body is not valid JSON');
  if (e?.type === 'encoding.unsupported' || e?.type === 'charset.unsupported') return new BridgeError('invalid_request', e.message ?? 'unsupported encoding');
  if (typeof e?.status === 'number' && e.status >= 400 && e.status < 500) return new BridgeError('invalid_request', e.message ?? 'bad request');
  return new BridgeError('internal_error', 'internal error; see the bridge logs for this request id', { cause: err });
}
