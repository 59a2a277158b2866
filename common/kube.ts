// Kubernetes access shared by the bridge and the operator: loading credentials, building API
// clients with a per-request timeout, and turning client errors into the API's error types.
import * as k8s from '@kubernetes/client-node';
import { UNAVAILABLE_RETRY_AFTER_S, type ApiHealth } from './api-health.js';
import { BridgeError } from './errors.js';

/** In-cluster credentials when running in a pod, otherwise KUBECONFIG / ~/.kube/config. */
export function loadKubeConfig(kubeconfigPath?: string): k8s.KubeConfig {
  const kc = new k8s.KubeConfig();
  if (kubeconfigPath) kc.loadFromFile(kubeconfigPath);
  else kc.loadFromDefault();
  if (!kc.getCurrentCluster()) throw new Error('no Kubernetes cluster configured (KUBECONFIG or in-cluster service account)');
  return kc;
}

type ApiConstructor<T> = new (config: k8s.Configuration) => T;

/**
 * Like KubeConfig.makeApiClient, plus a timeout on every request: an API server that accepts
 * the connection and never answers must become a 503, not a hung request. With `health`, every
 * request also goes through it (api-health.ts): refused at once while the API server is known
 * to be down, aborted when it is found down, and watched so that it is found down within ~2 s.
 */
export function makeApiClient<T>(kc: k8s.KubeConfig, api: ApiConstructor<T>, timeoutMs: number, options: { health?: ApiHealth } = {}): T {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error('no active Kubernetes cluster in the kubeconfig');
  const timeout: k8s.ObservableMiddleware = {
    pre: (ctx) => {
      ctx.setSignal(AbortSignal.timeout(timeoutMs));
      return new k8s.Observable(Promise.resolve(ctx));
    },
    post: (res) => new k8s.Observable(Promise.resolve(res)),
  };
  const config = k8s.createConfiguration({
    baseServer: new k8s.ServerConfiguration(cluster.server, {}),
    authMethods: { default: sharedConnectionAuth(kc) },
    middleware: [timeout],
    ...(options.health ? { httpApi: healthTracked(new k8s.IsomorphicFetchHttpLibrary(), options.health) } : {}),
  });
  return new api(config);
}

function healthTracked(http: k8s.HttpLibrary, health: ApiHealth): k8s.HttpLibrary {
  return {
    send: (ctx) => {
      const sent = health.track(
        async () => {
          const down = health.signal;
          const own = ctx.getSignal();
          ctx.setSignal(own ? AbortSignal.any([own, down]) : down);
          try {
            return await http.send(ctx).toPromise();
          } catch (err) {
            // Aborted because the API server was found down: say so, not "operation aborted".
            if (down.aborted && !own?.aborted) throw down.reason;
            throw err;
          }
        },
        (err) => apiStatusCode(err) === undefined,
      );
      return new k8s.Observable(sent);
    },
  };
}

/**
 * A probe for ApiHealth: GET /livez on its own connection pool (never queued behind hung calls).
 * Any HTTP answer resolves; only no answer (refused, reset, timeout) rejects.
 */
export function apiServerProbe(kc: k8s.KubeConfig): (signal: AbortSignal) => Promise<void> {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error('no active Kubernetes cluster in the kubeconfig');
  const auth = sharedConnectionAuth(kc);
  const http = new k8s.IsomorphicFetchHttpLibrary();
  return async (signal) => {
    const ctx = new k8s.RequestContext(`${cluster.server}/livez`, k8s.HttpMethod.GET);
    await auth.applySecurityAuthentication(ctx);
    ctx.setSignal(signal);
    const res = await http.send(ctx).toPromise();
    await res.body.text();
  };
}

/**
 * KubeConfig's authentication, but with one connection pool per client. client-node gives every
 * request a new undici Agent, i.e. a new TCP+TLS connection each time: milliseconds per call and
 * a socket left behind. Even closed unused, each Agent cost ~0.1 ms of CPU (profiled in the
 * operator's reap bench), so KubeConfig's authentication is run at most every AUTH_REFRESH_MS and
 * its headers (bearer tokens, which client-node refreshes from their file or plugin) are reused
 * in between; the TLS client certificate is read once, when the pool is made.
 */
export function sharedConnectionAuth(kc: Pick<k8s.KubeConfig, 'applySecurityAuthentication'>, now: () => number = () => performance.now()): k8s.SecurityAuthentication {
  let dispatcher: ReturnType<k8s.RequestContext['getDispatcher']>;
  let headers: Record<string, string> | undefined;
  let fetchedAt = 0;
  return {
    getName: () => 'kubeconfig',
    async applySecurityAuthentication(context: k8s.RequestContext) {
      if (headers === undefined || now() - fetchedAt > AUTH_REFRESH_MS) {
        const fresh = new k8s.RequestContext(context.getUrl(), context.getHttpMethod());
        await kc.applySecurityAuthentication(fresh);
        headers = { ...fresh.getHeaders() };
        fetchedAt = now();
        const agent = fresh.getDispatcher();
        if (dispatcher === undefined) dispatcher = agent;
        else if (agent !== dispatcher) void (agent as { close?: () => Promise<void> } | undefined)?.close?.();
      }
      for (const [name, value] of Object.entries(headers)) context.setHeaderParam(name, value);
      if (dispatcher !== undefined) context.setDispatcher(dispatcher);
    },
  };
}

/**
 * How long authentication headers are reused. Well inside any token's refresh margin: kubelets
 * rotate projected service-account tokens at 80% of a lifetime of an hour or more.
 */
export const AUTH_REFRESH_MS = 10_000;

/** HTTP status of a Kubernetes API error, or undefined for transport failures. */
export function apiStatusCode(err: unknown): number | undefined {
  if (err instanceof k8s.ApiException) return err.code;
  // A timed-out request is a DOMException whose legacy numeric `code` (23) is not an HTTP status.
  if (err instanceof DOMException) return undefined;
  const code = (err as { statusCode?: unknown; code?: unknown } | null)?.statusCode ?? (err as { code?: unknown } | null)?.code;
  return typeof code === 'number' && code >= 100 && code <= 599 ? code : undefined;
}

export function isNotFound(err: unknown): boolean {
  return apiStatusCode(err) === 404;
}

export function isConflict(err: unknown): boolean {
  return apiStatusCode(err) === 409;
}

/** The message of a Kubernetes Status body, when the error carries one. */
export function apiMessage(err: unknown): string {
  if (err instanceof k8s.ApiException) {
    const body: unknown = err.body;
    if (typeof body === 'string') {
      try {
        const status = JSON.parse(body) as { message?: string };
        if (status.message) return status.message;
      } catch {
        return body;
      }
    }
    if (body && typeof body === 'object' && 'message' in body) return String((body as { message: unknown }).message);
  }
  if (err instanceof DOMException && (err.name === 'TimeoutError' || err.name === 'AbortError')) return 'no answer in time';
  return err instanceof Error ? err.message : String(err);
}

/** Runs one Kubernetes API call; its errors come out as the API's error types (toBridgeError). */
export type KubeCall = <T>(operation: string, fn: () => Promise<T>) => Promise<T>;

/** A KubeCall that only maps errors (the operator's; the bridge's also times and counts them). */
export const plainCall: KubeCall = async (operation, fn) => {
  try {
    return await fn();
  } catch (err) {
    throw toBridgeError(err, operation);
  }
};

/**
 * Maps an error from the Kubernetes client to the API's error types. `what` names the
 * operation for the message ("create box", "list nodes").
 */
export function toBridgeError(err: unknown, what: string): BridgeError {
  if (err instanceof BridgeError) return err;
  const code = apiStatusCode(err);
  const message = apiMessage(err);
  const retry = { 'Retry-After': String(UNAVAILABLE_RETRY_AFTER_S) };
  switch (code) {
    case undefined:
      return new BridgeError('cluster_unavailable', `${what}: Kubernetes API unreachable (${message})`, { cause: err, headers: retry });
    case 400:
    case 422:
      return new BridgeError('invalid_request', `${what}: ${message}`, { cause: err });
    case 401:
    case 403:
      return new BridgeError('forbidden', `${what}: the bridge's Kubernetes permissions do not allow this (${message})`, {
        cause: err,
      });
    case 404:
      return new BridgeError('not_found', `${what}: ${message}`, { cause: err });
    case 409:
      return new BridgeError('conflict', `${what}: ${message}`, { cause: err });
    case 429:
    case 500:
    case 502:
    case 503:
    case 504:
      return new BridgeError('cluster_unavailable', `${what}: Kubernetes API unavailable (${code}: ${message})`, {
        cause: err,
        headers: retry,
      });
    default:
      return new BridgeError('internal_error', `${what}: Kubernetes API error ${code}: ${message}`, { cause: err });
  }
}
