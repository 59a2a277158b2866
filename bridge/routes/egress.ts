// /api/v1/boxes/:id/egress: a box's domain policy and credentials for the egress gateway
// (docs/api.md "Egress"). Thin handlers; the work is services/egress.ts's.
import express, { Router } from 'express';
import { SetBoxEgressRequest, SetEgressCredentialsRequest } from '../schemas.js';
import type { EgressService } from '../services/egress.js';
import { boxIdParam, parse } from '../http/parse.js';

export function egressRoutes(deps: { egress: EgressService }): Router {
  const { egress } = deps;
  const router = Router();
  // Credentials are bounded far below this (common/box-egress.ts); this only stops a flood early.
  const json = express.json({ limit: '256kb', strict: true });

  router.get('/boxes/:id/egress', async (req, res) => {
    res.json(await egress.get(boxIdParam(req)));
  });

  router.patch('/boxes/:id/egress', json, async (req, res) => {
    res.json(await egress.setAllow(boxIdParam(req), parse(SetBoxEgressRequest, req.body ?? {}).allow));
  });

  router.put('/boxes/:id/egress/credentials', json, async (req, res) => {
    res.json(await egress.setCredentials(boxIdParam(req), parse(SetEgressCredentialsRequest, req.body ?? {})));
  });

  return router;
}
