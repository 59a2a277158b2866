// Outbound notifications of box failures (optional): each endpoint gets a JSON document signed
// with HMAC-SHA256, or a Slack-compatible `{"text"}` message. Never in the reconcile path:
// notify() only queues. Per endpoint and box, the first failure goes out at once and later ones
// within the debounce window are sent together when it ends, so a crash-looping box is one
// message a window, not a storm. A delivery is retried with exponential backoff and full jitter
// on network errors, timeouts, 429 and 5xx (Retry-After honoured), under one delivery id that a
// receiver can deduplicate on; other answers end it.
import { createHmac, randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { z } from 'zod';
import { EVENT_REASONS, FAILURE_REASONS, type FailureReason } from './box-health.js';

export const SIGNATURE_HEADER = 'X-Sandbox-Bridge-Signature';
export const DELIVERY_HEADER = 'X-Sandbox-Bridge-Delivery';
export const EVENT_HEADER = 'X-Sandbox-Bridge-Event';

export const WebhookEndpoint = z
  .object({
    url: z.url({ protocol: /^https?$/ }),
    /** Failure reasons to send (default: all). */
    events: z.array(z.enum(FAILURE_REASONS)).min(1).optional(),
    /** json: this module's document, signed; slack: {"text": ...} for Slack-compatible incoming webhooks. */
    format: z.enum(['json', 'slack']).default('json'),
  })
  .strict();
export const WebhooksFile = z.object({ endpoints: z.array(WebhookEndpoint) }).strict();
export type WebhookEndpoint = z.output<typeof WebhookEndpoint>;

export interface FailureNotice {
  reason: FailureReason;
  pool: string;
  namespace: string;
  box: string;
  podUid: string;
  container?: string;
  message: string;
  occurredAt: Date;
}

export interface WebhookOptions {
  endpoints: WebhookEndpoint[];
  /** HMAC-SHA256 key for the signature header; without one, deliveries are unsigned. */
  signingKey?: string;
  debounceMs: number;
  maxAttempts: number;
  timeoutMs: number;
  log: Logger;
  onDelivery?: (result: 'delivered' | 'failed' | 'dropped') => void;
  onRetry?: () => void;
  /** Retry backoff: the first ceiling, doubled per attempt up to maxBackoffMs. */
  baseBackoffMs?: number;
  maxBackoffMs?: number;
  /** Deliveries in flight at once, and waiting beyond that before new ones are dropped. */
  concurrency?: number;
  maxQueued?: number;
  fetch?: typeof fetch;
  now?: () => number;
}

/** One endpoint's window for one box: failures held back until it ends. */
interface BoxWindow {
  held: FailureNotice[];
  timer: NodeJS.Timeout;
}

export class WebhookNotifier {
  private readonly windows = new Map<string, BoxWindow>();
  private readonly waiting: Array<() => void> = [];
  private inFlight = 0;
  private queued = 0;
  private stopped = false;
  private readonly now: () => number;

  constructor(private readonly o: WebhookOptions) {
    this.now = o.now ?? Date.now;
  }

  get enabled(): boolean {
    return this.o.endpoints.length > 0;
  }

  /** Queues the failure for every endpoint that wants it; returns at once. */
  notify(notice: FailureNotice): void {
    if (this.stopped) return;
    this.o.endpoints.forEach((endpoint, index) => {
      if (endpoint.events && !endpoint.events.includes(notice.reason)) return;
      const key = `${index}|${notice.namespace}/${notice.box}/${notice.podUid}`;
      const w = this.windows.get(key);
      if (w) {
        w.held.push(notice);
        return;
      }
      this.open(key, endpoint);
      this.send(endpoint, [notice]);
    });
  }

  /** Stops sending; deliveries in flight finish their current attempt. */
  stop(): void {
    this.stopped = true;
    for (const w of this.windows.values()) clearTimeout(w.timer);
    this.windows.clear();
  }

  /** A window starts with a delivery; when it ends, what it held goes out and opens the next one. */
  private open(key: string, endpoint: WebhookEndpoint): void {
    const timer = setTimeout(() => {
      const held = this.windows.get(key)?.held ?? [];
      this.windows.delete(key);
      if (held.length === 0 || this.stopped) return;
      this.open(key, endpoint);
      this.send(endpoint, held);
    }, this.o.debounceMs);
    timer.unref();
    this.windows.set(key, { held: [], timer });
  }

  private send(endpoint: WebhookEndpoint, notices: FailureNotice[]): void {
    if (this.queued >= (this.o.maxQueued ?? 1000)) {
      this.o.onDelivery?.('dropped');
      this.o.log.warn({ url: redactUrl(endpoint.url), failures: notices.length }, 'webhook queue full; notification dropped');
      return;
    }
    this.queued++;
    void this.deliver(endpoint, notices).finally(() => this.queued--);
  }

  private async deliver(endpoint: WebhookEndpoint, notices: FailureNotice[]): Promise<void> {
    await this.slot();
    try {
      const id = randomUUID();
      const body = JSON.stringify(endpoint.format === 'slack' ? slackMessage(notices) : document(id, notices, this.now()));
      const base = this.o.baseBackoffMs ?? 1000;
      for (let attempt = 1; ; attempt++) {
        const outcome = await this.attempt(endpoint, id, body);
        if (outcome.ok) {
          this.o.onDelivery?.('delivered');
          return;
        }
        if (!outcome.retry || attempt >= this.o.maxAttempts || this.stopped) {
          this.o.onDelivery?.('failed');
          this.o.log.warn({ url: redactUrl(endpoint.url), delivery: id, attempts: attempt, error: outcome.error }, 'webhook delivery failed');
          return;
        }
        const ceiling = Math.min(this.o.maxBackoffMs ?? 60_000, base * 2 ** (attempt - 1));
        const delay = Math.max(outcome.retryAfterMs ?? 0, Math.random() * ceiling);
        this.o.onRetry?.();
        await new Promise((resolve) => setTimeout(resolve, delay).unref());
      }
    } finally {
      this.release();
    }
  }

  private async attempt(endpoint: WebhookEndpoint, id: string, body: string): Promise<{ ok: boolean; retry?: boolean; retryAfterMs?: number; error?: string }> {
    const headers: Record<string, string> = { 'content-type': 'application/json', 'user-agent': 'sandbox-bridge-operator', [DELIVERY_HEADER]: id, [EVENT_HEADER]: 'box.failure' };
    if (this.o.signingKey) headers[SIGNATURE_HEADER] = sign(this.o.signingKey, Math.floor(this.now() / 1000), body);
    try {
      const res = await (this.o.fetch ?? fetch)(endpoint.url, { method: 'POST', headers, body, signal: AbortSignal.timeout(this.o.timeoutMs), redirect: 'manual' });
      await res.arrayBuffer().catch(() => undefined);
      if (res.status >= 200 && res.status < 300) return { ok: true };
      const retryAfter = Number(res.headers.get('retry-after'));
      return {
        ok: false,
        retry: res.status === 429 || res.status >= 500,
        ...(Number.isFinite(retryAfter) && retryAfter > 0 ? { retryAfterMs: Math.min(retryAfter, 300) * 1000 } : {}),
        error: `HTTP ${res.status}`,
      };
    } catch (err) {
      return { ok: false, retry: true, error: err instanceof Error ? err.message : String(err) };
    }
  }

  private async slot(): Promise<void> {
    if (this.inFlight < (this.o.concurrency ?? 4)) {
      this.inFlight++;
      return;
    }
    await new Promise<void>((resolve) => this.waiting.push(resolve));
  }

  private release(): void {
    const next = this.waiting.shift();
    if (next) next();
    else this.inFlight--;
  }
}

/**
 * `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`: the receiver recomputes it over the
 * raw body with the shared key, compares in constant time and rejects old timestamps (replays).
 */
export function sign(key: string, unixSeconds: number, body: string): string {
  return `t=${unixSeconds},v1=${createHmac('sha256', key).update(`${unixSeconds}.${body}`).digest('hex')}`;
}

/** The JSON document: one box, one or more failures (several when the debounce held some back). */
export function document(id: string, notices: FailureNotice[], now: number) {
  const first = notices[0]!;
  return {
    id,
    type: 'box.failure',
    sent_at: new Date(now).toISOString(),
    pool: first.pool,
    namespace: first.namespace,
    box_id: first.box,
    pod_uid: first.podUid,
    failures: notices.map((n) => ({
      reason: n.reason,
      event_reason: EVENT_REASONS[n.reason],
      ...(n.container ? { container: n.container } : {}),
      message: bounded(n.message),
      occurred_at: n.occurredAt.toISOString(),
    })),
  };
}

/** A Slack message: one line per failure, at most SLACK_MAX_LINES of them; every interpolated value escaped. */
export function slackMessage(notices: FailureNotice[]): { text: string } {
  const first = notices[0]!;
  const lines = notices.slice(0, SLACK_MAX_LINES).map((n) => `• ${EVENT_REASONS[n.reason]}: ${slackEscape(bounded(n.message))}`);
  if (notices.length > SLACK_MAX_LINES) lines.push(`… and ${notices.length - SLACK_MAX_LINES} more`);
  const where = `Box ${slackEscape(first.box)} in pool ${slackEscape(first.pool)} (namespace ${slackEscape(first.namespace)})`;
  return { text: `:rotating_light: ${where}:\n${lines.join('\n')}` };
}

/** Longest failure message sent, in characters: a termination message is box-written, up to 4 KiB. */
export const MAX_MESSAGE_CHARS = 1000;
const SLACK_MAX_LINES = 10;

/** The message cut to MAX_MESSAGE_CHARS characters (never inside a surrogate pair), marked when cut. */
export function bounded(message: string): string {
  const chars = Array.from(message);
  return chars.length <= MAX_MESSAGE_CHARS ? message : `${chars.slice(0, MAX_MESSAGE_CHARS - 1).join('')}…`;
}

/**
 * Text for Slack's mrkdwn that forms no mention, link or line of its own: the failure message
 * quotes what the box wrote (a container's termination message). &, <, > become entities, so
 * <!channel>, <@U…>, <!subteam^…> and <http://evil|click> show as typed; a zero-width space after
 * @ and # keeps @here, @channel, @user and #channel from being linked (incoming webhooks link
 * names, and ignore `parse`), and one after . and : (before a non-space) keeps URLs, bare domains
 * and e-mail addresses from being auto-linked; control characters (newlines too) become spaces,
 * so box text cannot start a line that looks like another failure or a block quote.
 */
export function slackEscape(text: string): string {
  return text
    .replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g, ' ')
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/([@#.:])(?=\S)/g, `$1${ZWSP}`);
}

const ZWSP = '\u200b';

/** A webhook URL may carry its credential in the path (Slack's do): log scheme and host only. */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    return `${u.protocol}//${u.host}/…`;
  } catch {
    return '(invalid url)';
  }
}

/** The notifier the operator's configuration asks for, or undefined without endpoints. */
export function createWebhooks(
  config: { webhooks: { endpoints: WebhookEndpoint[]; signingKey?: string }; WEBHOOK_DEBOUNCE_SECONDS: number; WEBHOOK_MAX_ATTEMPTS: number; WEBHOOK_TIMEOUT_SECONDS: number },
  log: Logger,
  metrics: { webhookDeliveries: { inc(labels: { result: string }): void }; webhookRetries: { inc(): void } },
): WebhookNotifier | undefined {
  if (config.webhooks.endpoints.length === 0) return undefined;
  const signed = Boolean(config.webhooks.signingKey);
  log[signed ? 'info' : 'warn'](
    { endpoints: config.webhooks.endpoints.map((e) => ({ url: redactUrl(e.url), format: e.format, events: e.events ?? 'all' })), signed },
    signed ? 'box-failure webhooks configured' : 'box-failure webhooks configured without a signing key: deliveries are not signed',
  );
  return new WebhookNotifier({
    endpoints: config.webhooks.endpoints,
    ...(config.webhooks.signingKey ? { signingKey: config.webhooks.signingKey } : {}),
    debounceMs: config.WEBHOOK_DEBOUNCE_SECONDS * 1000,
    maxAttempts: config.WEBHOOK_MAX_ATTEMPTS,
    timeoutMs: config.WEBHOOK_TIMEOUT_SECONDS * 1000,
    log: log.child({ component: 'webhooks' }),
    onDelivery: (result) => metrics.webhookDeliveries.inc({ result }),
    onRetry: () => metrics.webhookRetries.inc(),
  });
}
