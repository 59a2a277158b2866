// The Express application: middleware order is request id/logging, security headers, bearer
// auth (failed attempts limited per source), request rate per token, the route's token scope,
// routes, JSON errors. Everything it needs is passed in.
import { randomUUID } from 'node:crypto';
import express, { type Express } from 'express';
import helmet from 'helmet';
import type { Logger } from 'pino';
import { pinoHttp } from 'pino-http';
import type { KeyedLimiter } from '../common/rate-limit.js';
import { authenticate, rateLimitByToken, requestToken } from './http/auth.js';
import { errorHandler, notFoundRoute } from './http/errors.js';
import { requireScope } from './http/scopes.js';
import type { TokenSource } from './http/tokens.js';
import type { BridgeMetrics } from './metrics.js';
import { openApiDocument } from './openapi.js';
import { boxRoutes } from './routes/boxes.js';
import { clusterRoutes } from './routes/cluster.js';
import { execRoutes } from './routes/exec.js';
import { fileRoutes } from './routes/files.js';
import { platformRoutes } from './routes/platform.js';
import { egressRoutes } from './routes/egress.js';
import { mountRoutes } from './routes/mounts.js';
import { snapshotRoutes } from './routes/snapshots.js';
import type { BoxService } from './services/boxes.js';
import type { ClusterService } from './services/cluster.js';
import type { EnvService } from './services/env.js';
import type { ExecService } from './services/exec.js';
import type { FileService } from './services/files.js';
import type { ProcessService } from './services/processes.js';
import type { SnapshotService } from './services/snapshots.js';
import type { BoxContextService } from './services/box-context.js';
import type { EgressService } from './services/egress.js';
import type { SessionOutputsService } from './services/session-outputs.js';
import type { MemoryMountService } from './services/mounts.js';

export interface AppDeps {
  log: Logger;
  tokens: TokenSource;
  /** Requests per token name; failed authentications per source address. */
  limits: { requests: KeyedLimiter; authFailures: KeyedLimiter };
  metrics: BridgeMetrics;
  boxes: BoxService;
  env: EnvService;
  exec: ExecService;
  processes: ProcessService;
  files: FileService;
  snapshots: SnapshotService;
  boxContext: BoxContextService;
  egress: EgressService;
  sessionOutputs: SessionOutputsService;
  memoryMounts: MemoryMountService;
  cluster: ClusterService;
  version: string;
  trustProxy: boolean | number | string;
}

const REQUEST_ID = /^[A-Za-z0-9._-]{1,128}$/;

export function createApp(deps: AppDeps): Express {
  const app = express();
  app.disable('x-powered-by');
  app.set('trust proxy', deps.trustProxy);
  app.set('etag', false);

  app.use(
    pinoHttp({
      logger: deps.log,
      // Keep a caller's request id if it is sane, so one id follows a call across services.
      genReqId: (req, res) => {
        const given = req.headers['x-request-id'];
        const id = typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
        res.setHeader('X-Request-Id', id);
        return id;
      },
      // Token names (never tokens) on each request's completion line.
      customProps: (_req, res) => {
        const token = requestToken(res as Parameters<typeof requestToken>[0]);
        return token ? { tokenName: token.name } : {};
      },
      customLogLevel: (_req, res, err) => (err || res.statusCode >= 500 ? 'error' : res.statusCode >= 400 ? 'info' : 'debug'),
      serializers: {
        req: (req: { id: unknown; method: string; url: string }) => ({ id: req.id, method: req.method, url: req.url }),
        res: (res: { statusCode: number }) => ({ statusCode: res.statusCode }),
      },
    }),
  );
  app.use(helmet());
  app.use((req, res, next) => {
    const end = deps.metrics.httpDuration.startTimer();
    res.on('finish', () => {
      // An upload answered before it was read to its end (boxd refused it before its body was
      // sent: a limit, a fence) is drained, so the client is never left blocked mid-upload.
      if (!req.complete) {
        req.unpipe();
        req.resume();
      }
      const route = req.route?.path ? `${req.baseUrl}${req.route.path}` : 'unmatched';
      end({ method: req.method, route, status: String(res.statusCode) });
      const token = requestToken(res);
      if (token) deps.metrics.tokenRequests.inc({ token: token.name, status: String(res.statusCode) });
    });
    next();
  });

  const api = express.Router();
  api.use(
    authenticate({
      tokens: deps.tokens,
      failures: deps.limits.authFailures,
      onFailure: (reason) => deps.metrics.authFailures.inc({ reason }),
      onLimited: () => deps.metrics.rateLimited.inc({ reason: 'auth_failures' }),
    }),
  );
  api.use(rateLimitByToken(deps.limits.requests, () => deps.metrics.rateLimited.inc({ reason: 'requests' })));
  api.use(requireScope());
  const document = openApiDocument(deps.version);
  api.get('/openapi.json', (_req, res) => {
    res.json(document);
  });
  api.use('/boxes', boxRoutes(deps), execRoutes(deps), fileRoutes(deps));
  api.use(snapshotRoutes(deps));
  api.use(platformRoutes(deps));
  api.use(egressRoutes(deps));
  api.use(mountRoutes(deps));
  api.use(clusterRoutes(deps.cluster));
  api.use(notFoundRoute);

  app.use('/api/v1', api);
  app.use(notFoundRoute);
  app.use(errorHandler);
  return app;
}
