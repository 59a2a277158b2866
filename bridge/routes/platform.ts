// The platform port's routes (issue 21; docs/api.md "Keepalive", "Contexts", "Session outputs"):
// keepalive, the box's contexts, its session outputs mount, and reading a session's outputs.
// Thin handlers; the work is services/box-context.ts's and services/session-outputs.ts's.
import { pipeline } from 'node:stream/promises';
import express, { Router } from 'express';
import { MountOutputsRequest, SessionParams, SetContextRequest } from '../schemas.js';
import type { BoxContextService } from '../services/box-context.js';
import type { SessionOutputsService } from '../services/session-outputs.js';
import { boxIdParam, parse } from '../http/parse.js';

export function platformRoutes(deps: { boxContext: BoxContextService; sessionOutputs: SessionOutputsService }): Router {
  const { boxContext, sessionOutputs } = deps;
  const router = Router();
  const json = express.json({ limit: '1mb', strict: true });

  router.post('/boxes/:id/keepalive', async (req, res) => {
    res.json(await boxContext.keepalive(boxIdParam(req)));
  });

  router.put('/boxes/:id/context', json, async (req, res) => {
    res.json(await boxContext.setContext(boxIdParam(req), parse(SetContextRequest, req.body ?? {})));
  });

  router.post('/boxes/:id/mounts/outputs', json, async (req, res) => {
    res.json(await sessionOutputs.mount(boxIdParam(req), parse(MountOutputsRequest, req.body ?? {})));
  });

  router.get('/sessions/:sessionId/outputs', async (req, res) => {
    res.json(await sessionOutputs.list(parse(SessionParams, req.params).sessionId));
  });

  // {path} spans segments: Express hands them over decoded, one by one; the service checks each.
  router.get('/sessions/:sessionId/outputs/*path', async (req, res) => {
    const { sessionId } = parse(SessionParams, { sessionId: req.params.sessionId });
    const segments = req.params.path as unknown as string[];
    const file = await sessionOutputs.read(sessionId, segments);
    res.status(200).setHeader('Content-Type', 'application/octet-stream');
    res.setHeader('Content-Length', String(file.size));
    res.setHeader('X-Outputs-Source', file.source);
    await pipeline(file.body, res);
  });

  return router;
}
