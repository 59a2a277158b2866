// Files and archives in a box. Uploads and archive transfers stream through (no whole-body
// buffering); GET /files answers the spec's JSON (encoded piece by piece), or the raw bytes with
// Accept: application/octet-stream.
import { pipeline } from 'node:stream/promises';
import { Router } from 'express';
import { ArchiveQuery, FileDeleteQuery, FileListQuery, FileQuery } from '../schemas.js';
import type { FileService } from '../services/files.js';
import { JsonBytes, sendJson } from '../http/json-stream.js';
import { callerSignal } from '../http/ndjson.js';
import { boxIdParam, contentLength, parse } from '../http/parse.js';

export function fileRoutes(deps: { files: FileService }): Router {
  const { files } = deps;
  const router = Router();

  router.get('/:id/files', async (req, res) => {
    const q = parse(FileQuery, req.query);
    if (req.accepts(['application/json', 'application/octet-stream']) === 'application/octet-stream') {
      const file = await files.download(boxIdParam(req), q.path);
      res.status(200).setHeader('Content-Type', 'application/octet-stream');
      res.setHeader('Content-Length', String(file.size));
      await pipeline(file.body, res);
      return;
    }
    const signal = callerSignal(res);
    const file = await files.read(boxIdParam(req), q.path, q.base64, signal);
    try {
      const content = new JsonBytes([file.content], file.encoding === 'text' ? 'utf8' : 'base64');
      await sendJson(res, 200, { path: file.path, size: file.size, content, encoding: file.encoding }, signal);
    } finally {
      file.release();
    }
  });

  router.put('/:id/files', async (req, res) => {
    const q = parse(FileQuery, req.query);
    const length = contentLength(req);
    res.json(await files.write(boxIdParam(req), q.path, req, { base64: q.base64, ...(length !== undefined ? { contentLength: length } : {}) }));
  });

  router.get('/:id/files/list', async (req, res) => {
    res.json(await files.list(boxIdParam(req), parse(FileListQuery, req.query)));
  });

  router.delete('/:id/files', async (req, res) => {
    res.json(await files.delete(boxIdParam(req), parse(FileDeleteQuery, req.query)));
  });

  router.get('/:id/archive', async (req, res) => {
    const q = parse(ArchiveQuery, req.query);
    const body = await files.downloadArchive(boxIdParam(req), q);
    res.status(200).setHeader('Content-Type', q.gzip ? 'application/gzip' : 'application/x-tar');
    await pipeline(body, res);
  });

  router.put('/:id/archive', async (req, res) => {
    const q = parse(ArchiveQuery, req.query);
    res.json(await files.uploadArchive(boxIdParam(req), q.path, req, contentLength(req)));
  });

  return router;
}
