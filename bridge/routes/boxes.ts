// /api/v1/boxes: thin handlers; validation by the zod schemas, work by the services.
import express, { Router, type Request } from 'express';
import type { z } from 'zod';
import { BridgeError } from '../../common/errors.js';
import { CreateBoxRequest, ExecRequest, FileQuery, SetEnvRequest, describeIssues } from '../schemas.js';
import type { BoxCommands } from '../services/box-commands.js';
import type { BoxService } from '../services/boxes.js';
import type { EnvStore } from '../services/env-store.js';

export function parse<S extends z.ZodType>(schema: S, value: unknown): z.infer<S> {
  const result = schema.safeParse(value);
  if (!result.success) throw new BridgeError('invalid_request', describeIssues(result.error));
  return result.data;
}

const id = (req: Request) => String(req.params.id);

export function boxRoutes(deps: { boxes: BoxService; commands: BoxCommands; env: EnvStore; fileSizeLimit: number }): Router {
  const { boxes, commands, env } = deps;
  const router = Router();
  const json = express.json({ limit: '1mb', strict: true });
  // Base64 text is 4/3 the size of the bytes it carries.
  const raw = express.raw({ type: () => true, limit: Math.ceil((deps.fileSizeLimit * 4) / 3) + 4 });

  router.post('/', json, async (req, res) => {
    res.status(201).json(await boxes.create(parse(CreateBoxRequest, req.body ?? {})));
  });

  router.get('/:id/status', async (req, res) => {
    res.json(await boxes.status(id(req)));
  });

  router.delete('/:id', async (req, res) => {
    res.json(await boxes.delete(id(req)));
  });

  router.post('/:id/exec', json, async (req, res) => {
    res.json(await commands.exec(id(req), parse(ExecRequest, req.body ?? {})));
  });

  router.get('/:id/files', async (req, res) => {
    const q = parse(FileQuery, req.query);
    res.json(await commands.readFile(id(req), q.path, q.base64));
  });

  router.put('/:id/files', raw, async (req, res) => {
    const q = parse(FileQuery, req.query);
    const body = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
    let content = body;
    if (q.base64) {
      const text = body.toString('ascii').replace(/\s+/g, '');
      if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text) || text.length % 4 !== 0) {
        throw new BridgeError('invalid_request', 'base64=true but the body is not valid base64');
      }
      content = Buffer.from(text, 'base64');
    }
    res.json(await commands.writeFile(id(req), q.path, content, q.base64 ? 'base64' : 'text'));
  });

  router.post('/:id/env', json, async (req, res) => {
    const { envVars } = parse(SetEnvRequest, req.body ?? {});
    const pod = await boxes.get(id(req));
    const count = await env.merge(pod, envVars);
    res.json({ box_id: id(req), env_count: count, updated_at: new Date().toISOString() });
  });

  return router;
}
