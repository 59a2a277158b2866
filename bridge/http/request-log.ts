// Request ids and the completion line of each request: what pino-http did, without its cost on
// requests nobody logs (it made three child loggers per request, serializing the request each
// time, and built the completion line before knowing its level was off). Here the request's
// logger is made on first use, and the completion line only when its level is enabled.
import { randomUUID } from 'node:crypto';
import type { Express, Request, RequestHandler, Response } from 'express';
import type { Level, Logger } from 'pino';
import { requestToken } from './auth.js';

declare module 'node:http' {
  interface IncomingMessage {
    /** The request id (X-Request-Id). */
    id: string;
    /** Logger bound to this request (its id, method, URL and, once authenticated, token name). */
    log: Logger;
  }
}

const REQUEST_ID = /^[A-Za-z0-9._-]{1,128}$/;
/** Per request: the logger it logs to, its line, and its bound logger once made. */
const STATE = Symbol('request log');

interface State {
  log: Logger;
  line: { id: string; method: string; url: string };
  bound?: Logger;
}

/** Level of a request's completion line: errors for 5xx, info for 4xx, debug for the rest. */
export function completionLevel(status: number): Level {
  return status >= 500 ? 'error' : status >= 400 ? 'info' : 'debug';
}

function bindings(state: State, res: Response | undefined): object {
  const token = res && requestToken(res);
  return token ? { req: state.line, tokenName: token.name } : { req: state.line };
}

/**
 * The middleware, first in the app. `req.log` is an accessor on the app's request prototype (a
 * property defined on each request would make every request object slower to use).
 */
export function requestLog(app: Express, log: Logger): RequestHandler {
  Object.defineProperty(app.request, 'log', {
    configurable: true,
    get(this: Request & { [STATE]?: State }) {
      const state = this[STATE];
      if (!state) return undefined;
      return (state.bound ??= state.log.child(bindings(state, this.res)));
    },
    set(this: Request & { [STATE]?: State }, value: Logger) {
      if (this[STATE]) this[STATE].bound = value;
    },
  });
  return (req, res, next) => {
    // Keep a caller's request id if it is sane, so one id follows a call across services.
    const given = req.headers['x-request-id'];
    const id = typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
    req.id = id;
    res.setHeader('X-Request-Id', id);
    const started = Date.now();
    // The URL as the request came in: routers rewrite req.url on the way.
    const state: State = { log, line: { id, method: req.method, url: req.originalUrl || req.url } };
    (req as Request & { [STATE]?: State })[STATE] = state;
    let logged = false;
    const done = () => {
      if (logged) return;
      logged = true;
      res.off('finish', done);
      res.off('close', done);
      complete(state, res, Date.now() - started);
    };
    res.on('finish', done);
    res.on('close', done);
    next();
  };
}

/** The completion line: `request completed`, or `request errored` for a 5xx. */
function complete(state: State, res: Response, responseTime: number): void {
  const level = completionLevel(res.statusCode);
  if (!state.log.isLevelEnabled(level)) return;
  const status = { statusCode: res.statusCode };
  if (res.statusCode >= 500) {
    state.log[level]({ ...bindings(state, res), res: status, err: new Error(`failed with status code ${res.statusCode}`), responseTime }, 'request errored');
  } else {
    state.log[level]({ ...bindings(state, res), res: status, responseTime }, 'request completed');
  }
}
