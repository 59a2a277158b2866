// Snapshots: take one of a box, list a session's, read and delete one. Thin handlers; the
// work is the snapshot service's (bridge/services/snapshots.ts).
import express, { Router } from 'express';
import { CreateSnapshotRequest, RestoreRequest, SnapshotParams, SnapshotsQuery } from '../schemas.js';
import type { SnapshotService } from '../services/snapshots.js';
import { boxIdParam, parse } from '../http/parse.js';

export function snapshotRoutes(deps: { snapshots: SnapshotService }): Router {
  const { snapshots } = deps;
  const router = Router();
  const json = express.json({ limit: '1mb', strict: true });

  router.post('/boxes/:id/snapshots', json, async (req, res) => {
    res.status(201).json(await snapshots.create(boxIdParam(req), parse(CreateSnapshotRequest, req.body ?? {})));
  });

  router.post('/boxes/:id/restore', json, async (req, res) => {
    res.json(await snapshots.restoreInPlace(boxIdParam(req), parse(RestoreRequest, req.body ?? {}).snapshot_id));
  });

  router.get('/snapshots', async (req, res) => {
    const q = parse(SnapshotsQuery, req.query);
    res.json(
      await snapshots.list(
        q.tenant_id !== undefined
          ? { tenant_id: q.tenant_id, environment_id: q.environment_id, session_id: q.session_id, limit: q.limit }
          : { session_id: q.session_id!, limit: q.limit },
      ),
    );
  });

  router.get('/snapshots/:id', async (req, res) => {
    res.json(await snapshots.get(parse(SnapshotParams, req.params).id));
  });

  router.delete('/snapshots/:id', async (req, res) => {
    res.json(await snapshots.delete(parse(SnapshotParams, req.params).id));
  });

  return router;
}
