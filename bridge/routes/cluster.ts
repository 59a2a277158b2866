// /api/v1/health, /cluster/*, /sandboxes*: read-only views.
import { Router } from 'express';
import { parse } from '../http/parse.js';
import { LogsQuery, SandboxesQuery } from '../schemas.js';
import type { ClusterService } from '../services/cluster.js';

export function clusterRoutes(cluster: ClusterService): Router {
  const router = Router();

  router.get('/health', async (_req, res) => {
    res.json(await cluster.health());
  });
  router.get('/cluster/info', async (_req, res) => {
    res.json(await cluster.clusterInfo());
  });
  router.get('/cluster/nodes', async (_req, res) => {
    res.json(await cluster.nodeList());
  });
  router.get('/cluster/capacity', async (_req, res) => {
    res.json(await cluster.capacity());
  });
  router.get('/sandboxes', (req, res) => {
    res.type('application/json').send(cluster.sandboxesJson(parse(SandboxesQuery, req.query)));
  });
  // Before /sandboxes/:podName/logs so "metrics" is never taken for a pod name.
  router.get('/sandboxes/metrics', async (_req, res) => {
    res.json(await cluster.metrics());
  });
  router.get('/sandboxes/:podName/logs', async (req, res) => {
    const { tailLines } = parse(LogsQuery, req.query);
    const text = await cluster.logs(String(req.params.podName), tailLines);
    res.type('text/plain; charset=utf-8').send(text);
  });

  return router;
}
