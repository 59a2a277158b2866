// Commands in a box: exec (answered whole, or streamed as NDJSON with Accept:
// application/x-ndjson) and background processes. Either way a caller that disconnects before
// its answer is sent cancels the command.
import express, { Router } from 'express';
import { ExecRequest, ProcessOutputQuery, SignalRequest, StartProcessRequest, StdinQuery } from '../schemas.js';
import type { ExecService } from '../services/exec.js';
import type { ProcessService } from '../services/processes.js';
import { JsonBytes, sendJson } from '../http/json-stream.js';
import { Utf8Chunks, callerSignal, ndjsonStream, wantsNdjson, writeOutput } from '../http/ndjson.js';
import { boxIdParam, jsonBody, parse } from '../http/parse.js';

const ACCEPTS_NDJSON = /ndjson/i;

/**
 * POST /boxes/:id/exec, the busiest route: its body parser and handler, for the api router to
 * mount itself (one router level fewer than a router mounted at /boxes: express walks each
 * level's layers and rewrites req.url in and out of it on every request).
 */
export function execRoute(deps: { exec: ExecService }): express.RequestHandler[] {
  const { exec } = deps;
  const handler: express.RequestHandler = async (req, res) => {
    const body = parse(ExecRequest, req.body ?? {});
    // Content negotiation only when the caller's Accept names NDJSON at all (else it cannot win).
    if (!(ACCEPTS_NDJSON.test(req.headers.accept ?? '') && wantsNdjson(req))) {
      const signal = callerSignal(res);
      const answer = await exec.run(boxIdParam(req), body, signal);
      try {
        await sendJson(
          res,
          200,
          {
            exit_code: answer.exit_code,
            stdout: new JsonBytes(answer.stdout, 'utf8'),
            stderr: new JsonBytes(answer.stderr, 'utf8'),
            duration_ms: answer.duration_ms,
            timed_out: answer.timed_out,
            stdout_truncated: answer.stdout_truncated,
            stderr_truncated: answer.stderr_truncated,
          },
          signal,
        );
      } finally {
        answer.release();
      }
      return;
    }
    const out = ndjsonStream(res);
    const text = new Utf8Chunks();
    try {
      const exit = await exec.stream(boxIdParam(req), body, (stream, data) => writeOutput(out, text, stream, data), {
        signal: out.signal,
        onStart: out.open,
      });
      await out.write({
        type: 'exit',
        exit_code: exit.exit_code,
        duration_ms: exit.duration_ms,
        timed_out: exit.timed_out,
        stdout_truncated: exit.stdout_truncated,
        stderr_truncated: exit.stderr_truncated,
      });
      out.end();
    } catch (err) {
      out.end(err);
    }
  };
  return [jsonBody(1024 * 1024), handler];
}

/** Background processes in a box (mounted at /boxes). */
export function execRoutes(deps: { processes: ProcessService }): Router {
  const { processes } = deps;
  const router = Router();
  const json = jsonBody(1024 * 1024);
  const raw = express.raw({ type: () => true, limit: '1mb' });
  const processId = (req: express.Request) => String(req.params.pid);

  router.post('/:id/processes', json, async (req, res) => {
    res.status(201).json(await processes.start(boxIdParam(req), parse(StartProcessRequest, req.body ?? {})));
  });

  router.get('/:id/processes', async (req, res) => {
    res.json(await processes.list(boxIdParam(req)));
  });

  router.get('/:id/processes/:pid', async (req, res) => {
    res.json(await processes.get(boxIdParam(req), processId(req)));
  });

  router.get('/:id/processes/:pid/output', async (req, res) => {
    const query = parse(ProcessOutputQuery, req.query);
    const out = ndjsonStream(res);
    const text = new Utf8Chunks();
    try {
      await processes.output(
        boxIdParam(req),
        processId(req),
        query,
        (e) => {
          if (e.type === 'start') return out.write(e);
          if (e.type === 'exit') return out.write({ type: 'exit', exit_code: e.exit.exit_code, duration_ms: e.exit.duration_ms, timed_out: e.exit.timed_out });
          return writeOutput(out, text, e.type, e.data, (at) => ({ offset: e.offset + at }));
        },
        out.signal,
      );
      out.end();
    } catch (err) {
      out.end(err);
    }
  });

  router.post('/:id/processes/:pid/stdin', raw, async (req, res) => {
    const { eof } = parse(StdinQuery, req.query);
    const data = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
    res.json(await processes.stdin(boxIdParam(req), processId(req), data, eof));
  });

  router.post('/:id/processes/:pid/signal', json, async (req, res) => {
    const { signal } = parse(SignalRequest, req.body ?? {});
    res.json(await processes.signal(boxIdParam(req), processId(req), signal));
  });

  return router;
}
