// /api/v1/boxes: box lifecycle and env. Thin handlers; validation by the zod schemas, work by
// the services.
import express, { Router, type Request } from 'express';
import { BridgeError } from '../../common/errors.js';
import { CreateBoxRequest, DeleteBoxQuery, IDEMPOTENCY_KEY, SetEnvRequest } from '../schemas.js';
import type { BoxService } from '../services/boxes.js';
import type { EnvService } from '../services/env.js';
import type { SessionOutputsService } from '../services/session-outputs.js';
import type { MemoryMountService } from '../services/mounts.js';
import type { SnapshotService } from '../services/snapshots.js';
import { boxIdParam, parse } from '../http/parse.js';

export function boxRoutes(deps: { boxes: BoxService; env: EnvService; snapshots: SnapshotService; sessionOutputs: SessionOutputsService; memoryMounts: MemoryMountService }): Router {
  const { boxes, env, snapshots } = deps;
  const router = Router();
  const json = express.json({ limit: '1mb', strict: true });

  router.post('/', json, async (req, res) => {
    const body = parse(CreateBoxRequest, req.body ?? {});
    const { snapshot_id: snapshotId } = body;
    // With a snapshot_id the new box is a fork of that snapshot (SnapshotService.fork).
    res.status(201).json(snapshotId ? await snapshots.fork({ ...body, snapshot_id: snapshotId }, idempotencyKey(req)) : await boxes.create(body, idempotencyKey(req)));
  });

  router.get('/:id/status', async (req, res) => {
    res.json(await boxes.status(boxIdParam(req)));
  });

  router.delete('/:id', async (req, res) => {
    const { snapshot } = parse(DeleteBoxQuery, req.query);
    await deps.sessionOutputs.beforeDelete(boxIdParam(req)); // its outputs copied to the store first
    await deps.memoryMounts.beforeDelete(boxIdParam(req)); // and its read-write memory stores
    res.json((snapshot ?? snapshots.snapshotOnDelete()) ? await snapshots.deleteWithSnapshot(boxIdParam(req)) : await boxes.delete(boxIdParam(req)));
  });

  router.post('/:id/env', json, async (req, res) => {
    const { envVars } = parse(SetEnvRequest, req.body ?? {});
    res.json(await env.merge(boxIdParam(req), envVars));
  });

  return router;
}

function idempotencyKey(req: Request): string | undefined {
  const key = req.get('idempotency-key');
  if (key === undefined) return undefined;
  if (!IDEMPOTENCY_KEY.test(key)) throw new BridgeError('invalid_request', 'Idempotency-Key must be 1-255 visible ASCII characters');
  return key;
}
