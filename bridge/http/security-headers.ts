// helmet's security headers, worked out once. helmet() rebuilds them on every response (its
// Content-Security-Policy string included); with its defaults they never depend on the request,
// so they are taken from one run of helmet at start-up and set as they are on each response.
import { IncomingMessage, ServerResponse } from 'node:http';
import { Socket } from 'node:net';
import type { RequestHandler } from 'express';
import helmet from 'helmet';

/** The headers helmet() sets on a response, with its names' casing, in its order. */
export function helmetHeaders(): Array<[string, string]> {
  const req = new IncomingMessage(new Socket());
  req.method = 'GET';
  req.url = '/';
  const res = new ServerResponse(req);
  // The names as helmet spells them (getHeaderNames() lowercases them).
  const spelled = new Map<string, string>();
  const setHeader = res.setHeader.bind(res);
  res.setHeader = (name, value) => {
    spelled.set(name.toLowerCase(), name);
    return setHeader(name, value);
  };
  let failed: unknown;
  helmet()(req, res, (err?: unknown) => (failed = err));
  if (failed) throw new Error(`helmet failed: ${String(failed)}`);
  return res.getHeaderNames().map((name) => {
    const value = res.getHeader(name);
    return [spelled.get(name) ?? name, Array.isArray(value) ? value.join(', ') : String(value)];
  });
}

export function securityHeaders(): RequestHandler {
  const headers = helmetHeaders();
  // Names and values apart, walked by index: no iterator or pair per header per response (this
  // runs on every request; bench/results/exec-profile.md).
  const names = headers.map(([name]) => name);
  const values = headers.map(([, value]) => value);
  return (_req, res, next) => {
    for (let i = 0; i < names.length; i++) res.setHeader(names[i]!, values[i]!);
    next();
  };
}
