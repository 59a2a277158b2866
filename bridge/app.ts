// The Express application: middleware order is request id/logging, security headers, bearer
// auth (failed attempts limited per source), request rate per token, the route's token scope,
// routes, JSON errors. Everything it needs is passed in.
import express, { type Express } from 'express';
import type { Logger } from 'pino';
import type { KeyedLimiter } from '../common/rate-limit.js';
import { authenticate, rateLimitByToken, requestToken } from './http/auth.js';
import { errorHandler, notFoundRoute } from './http/errors.js';
import { requestLog } from './http/request-log.js';
import { requireScope } from './http/scopes.js';
import { securityHeaders } from './http/security-headers.js';
import type { TokenSource } from './http/tokens.js';
import type { BridgeMetrics } from './metrics.js';
import { openApiDocument } from './openapi.js';
import { boxRoutes } from './routes/boxes.js';
import { clusterRoutes } from './routes/cluster.js';
import { execRoute, execRoutes } from './routes/exec.js';
import { fileRoutes } from './routes/files.js';
import { platformRoutes } from './routes/platform.js';
import { egressRoutes } from './routes/egress.js';
import { mountRoutes } from './routes/mounts.js';
import { portRoutes } from './routes/ports.js';
import { observeRoutes } from './routes/observe.js';
import { previewRoutes } from './http/ports.js';
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
import type { PortService } from './services/ports.js';
import type { ObserveService } from './services/observe.js';

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
  ports: PortService;
  observe: ObserveService;
  cluster: ClusterService;
  version: string;
  trustProxy: boolean | number | string;
}

export function createApp(deps: AppDeps): Express {
  const app = express();
  app.disable('x-powered-by');
  app.set('trust proxy', deps.trustProxy);
  app.set('etag', false);

  // Preview links first: no bearer token, and a URL holding a secret the request log must not see.
  app.use(previewRoutes({ ports: deps.ports, log: deps.log, trustProxy: deps.trustProxy, failures: deps.limits.authFailures }));
  app.use(requestLog(app, deps.log));
  app.use(securityHeaders());
  // Each request's observation goes to its label set's child, looked up by one string instead of
  // prom-client hashing the labels per call (method, route template and status are few).
  const durations = new Map<string, { observe(seconds: number): void }>();
  const duration = (method: string, route: string, status: string) => {
    const key = `${method} ${route} ${status}`;
    let child = durations.get(key);
    if (!child) durations.set(key, (child = deps.metrics.httpDuration.labels({ method, route, status })));
    return child;
  };
  app.use((req, res, next) => {
    const started = performance.now();
    res.on('finish', () => {
      // An upload answered before it was read to its end (boxd refused it before its body was
      // sent: a limit, a fence) is drained, so the client is never left blocked mid-upload.
      if (!req.complete) {
        req.unpipe();
        req.resume();
      }
      const route = req.route?.path ? `${req.baseUrl}${req.route.path}` : 'unmatched';
      duration(req.method, route, String(res.statusCode)).observe((performance.now() - started) / 1000);
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
  // Exec first: the busiest route, on this router itself (none of these routes' paths overlap).
  api.post('/boxes/:id/exec', ...execRoute(deps));
  api.use('/boxes', execRoutes(deps), boxRoutes(deps), fileRoutes(deps));
  api.use(snapshotRoutes(deps));
  api.use(platformRoutes(deps));
  api.use(egressRoutes(deps));
  api.use(mountRoutes(deps));
  api.use(observeRoutes(deps));
  api.use(portRoutes(deps));
  api.use(clusterRoutes(deps.cluster));
  api.use(notFoundRoute);

  app.use('/api/v1', api);
  app.use(notFoundRoute);
  app.use(errorHandler);
  return app;
}
