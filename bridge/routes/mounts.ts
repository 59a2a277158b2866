// Memory stores (issue 21; docs/api.md "Memory stores", docs/mounts.md): mount a store into a
// box, sync a read-write one back. Thin handlers; the work is services/mounts.ts's.
import express, { Router } from 'express';
import { MemoryStoreParams, MountMemoryRequest } from '../schemas.js';
import type { MemoryMountService } from '../services/mounts.js';
import { boxIdParam, parse } from '../http/parse.js';

export function mountRoutes(deps: { memoryMounts: MemoryMountService }): Router {
  const { memoryMounts } = deps;
  const router = Router();
  const json = express.json({ limit: '1mb', strict: true });

  router.post('/boxes/:id/mounts/memory', json, async (req, res) => {
    res.json(await memoryMounts.mount(boxIdParam(req), parse(MountMemoryRequest, req.body ?? {})));
  });

  router.post('/boxes/:id/mounts/memory/:storeName/sync', async (req, res) => {
    res.json(await memoryMounts.sync(boxIdParam(req), parse(MemoryStoreParams, req.params).storeName));
  });

  return router;
}
