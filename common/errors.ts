// Error types of the API contract (DESIGN.md): every failure is
// {"error": {"type": "...", "message": "..."}} with the status below.

export const ERROR_STATUS = {
  invalid_request: 400,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  conflict: 409,
  /** A preview link that expired or was revoked (docs/ports.md). */
  gone: 410,
  payload_too_large: 413,
  quota_exceeded: 429,
  rate_limited: 429,
  internal_error: 500,
  not_implemented: 501,
  /** The ports route: nothing listens on the port in the box, or the app broke the connection off. */
  bad_gateway: 502,
  cluster_unavailable: 503,
  /** The ports route: the app did not begin its answer in time. */
  gateway_timeout: 504,
} as const;

export type ErrorType = keyof typeof ERROR_STATUS;

export class BridgeError extends Error {
  readonly type: ErrorType;
  readonly status: number;
  /** Extra response headers, e.g. Retry-After. */
  readonly headers: Record<string, string>;

  constructor(type: ErrorType, message: string, options: { headers?: Record<string, string>; cause?: unknown } = {}) {
    super(message, { cause: options.cause });
    this.name = 'BridgeError';
    this.type = type;
    this.status = ERROR_STATUS[type];
    this.headers = options.headers ?? {};
  }

  toJSON(): { error: { type: ErrorType; message: string } } {
    return { error: { type: this.type, message: this.message } };
  }
}
