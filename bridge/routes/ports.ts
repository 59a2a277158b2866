// /api/v1/boxes/:id/ports/:port/preview (docs/ports.md): preview links to a box's port, made and revoked.
// The traffic itself (/boxes/:id/ports/:port/..., and the links) is http/ports.ts's; the work is
// services/ports.ts's.
import express, { Router } from 'express';
import { boxIdParam, parse } from '../http/parse.js';
import { portRoute } from '../http/ports.js';
import { CreatePreviewRequest, PortPreviewParams } from '../schemas.js';
import type { PortService } from '../services/ports.js';

export function portRoutes(deps: { ports: PortService; trustProxy: boolean | number | string }): Router {
  const { ports } = deps;
  const router = Router();
  const json = express.json({ limit: '16kb', strict: true });

  // The exact path .../ports/:port/preview is the bridge's for POST and DELETE: an app's own
  // /preview is reached with other methods here, or any method through a preview link.
  router.post('/boxes/:id/ports/:port/preview', json, async (req, res) => {
    const { port } = parse(PortPreviewParams, req.params);
    const body = parse(CreatePreviewRequest, req.body ?? {});
    res.json(await ports.createPreview(boxIdParam(req), port, body.expires_in_seconds));
  });

  router.delete('/boxes/:id/ports/:port/preview', async (req, res) => {
    const { port } = parse(PortPreviewParams, req.params);
    res.json(await ports.revokePreviews(boxIdParam(req), port));
  });

  // Every method of /boxes/:id/ports/:port/...: a middleware rather than routes (Express would
  // know only the methods it lists, and clean nothing of the path, which goes to the app as it came).
  router.use(portRoute(deps));
  return router;
}
