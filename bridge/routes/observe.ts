// /api/v1/boxes/:id/files/watch (NDJSON file-system events) and /api/v1/boxes/:id/metrics (the
// box's use): observing a box, never waking it or keeping it awake (services/observe.ts).
import { Router } from 'express';
import { ndjsonStream } from '../http/ndjson.js';
import { boxIdParam, parse } from '../http/parse.js';
import { MetricsQuery, WatchQuery } from '../schemas.js';
import type { ObserveService } from '../services/observe.js';

export function observeRoutes(deps: { observe: ObserveService }): Router {
  const { observe } = deps;
  const router = Router();

  router.get('/boxes/:id/files/watch', async (req, res) => {
    const q = parse(WatchQuery, req.query);
    const out = ndjsonStream(res);
    try {
      await observe.watch(boxIdParam(req), q, (e) => out.write(e), out.signal);
      out.end();
    } catch (err) {
      if (out.signal.aborted) return;
      out.end(err); // before the first line: the usual JSON error; after: a last error line
    }
  });

  router.get('/boxes/:id/metrics', async (req, res) => {
    const q = parse(MetricsQuery, req.query);
    res.json(await observe.metrics(boxIdParam(req), q.since));
  });

  return router;
}
