// Whether the Kubernetes API server answers, as this process last saw it, so that calls fail
// fast while it does not (DESIGN principle 9: a fast 503 with Retry-After, never a hang).
//
// No background polling while all is well. A call that has had no answer for suspectAfterMs, or
// that failed without any HTTP answer (refused, reset, timed out), makes us probe the API server
// once (GET /livez, answered even under load: the `probes` flow schema is exempt from API
// priority and fairness) with a short timeout. If the probe gets no answer either, the API server
// is down: calls in flight are aborted and new ones are refused at once with cluster_unavailable,
// and we probe every recheckMs until it answers again, which ends the outage by itself.
//
// Any HTTP answer counts as reachable, even an error status: an API server that answers "500
// etcd unavailable" answers each write quickly itself. So a frozen or unreachable API server
// turns a write into a 503 within suspectAfterMs + probeTimeoutMs (2 s by default) instead of the
// full request timeout, and every later write is refused in microseconds until it is back.
import type { Logger } from 'pino';
import { patientDeadline } from './deadline.js';
import { BridgeError } from './errors.js';

export interface ApiHealthOptions {
  /** One look at the API server: resolves if it answered at all, rejects if not (or on abort). */
  probe: (signal: AbortSignal) => Promise<void>;
  /** How long the probe may take (default 1000 ms). */
  probeTimeoutMs?: number;
  /** A call without an answer for this long makes us probe (default 1000 ms). */
  suspectAfterMs?: number;
  /** How often to probe while down (default 1000 ms). */
  recheckMs?: number;
  log?: Logger;
  /** Told of each change (metrics). */
  onChange?: (up: boolean) => void;
}

/** Retry-After of a 503 while the API server is down: about two probe intervals. */
export const UNAVAILABLE_RETRY_AFTER_S = 2;

export class ApiHealth {
  private up = true;
  private downSince = 0;
  private controller = new AbortController();
  private probing: Promise<void> | undefined;
  private recheck: NodeJS.Timeout | undefined;
  private stopped = false;
  private readonly probeTimeoutMs: number;
  private readonly suspectAfterMs: number;
  private readonly recheckMs: number;

  constructor(private readonly o: ApiHealthOptions) {
    this.probeTimeoutMs = o.probeTimeoutMs ?? 1000;
    this.suspectAfterMs = o.suspectAfterMs ?? 1000;
    this.recheckMs = o.recheckMs ?? 1000;
  }

  isUp(): boolean {
    return this.up;
  }

  /** Aborted, with the cluster_unavailable error as reason, when the API server is found down. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /**
   * Runs one call: refused at once while the API server is down, and watched while in flight
   * (see the top of this file). `send` should abort on `this.signal`.
   */
  async track<T>(send: () => Promise<T>, noAnswer: (err: unknown) => boolean): Promise<T> {
    if (!this.up) throw this.unavailable();
    const suspect = setTimeout(() => this.suspect(), this.suspectAfterMs);
    suspect.unref();
    try {
      return await send();
    } catch (err) {
      if (!(err instanceof BridgeError) && noAnswer(err)) this.suspect();
      throw err;
    } finally {
      clearTimeout(suspect);
    }
  }

  /** The error calls get while the API server is down. */
  unavailable(): BridgeError {
    const seconds = Math.max(0, Math.round((performance.now() - this.downSince) / 1000));
    return new BridgeError('cluster_unavailable', `Kubernetes API server unreachable (no answer for ${seconds} s); retry later`, {
      headers: { 'Retry-After': String(UNAVAILABLE_RETRY_AFTER_S) },
    });
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.recheck);
  }

  /** Probes once (one probe at a time); no answer means down. */
  private suspect(): void {
    if (!this.up || this.probing || this.stopped) return;
    this.probing = this.answers()
      .then((answered) => {
        if (!answered && this.up) this.markDown();
      })
      .finally(() => {
        this.probing = undefined;
      });
  }

  private async answers(): Promise<boolean> {
    // Patient: a bridge stalled on a loaded node must not call a healthy API server down.
    const deadline = patientDeadline(this.probeTimeoutMs);
    try {
      await this.o.probe(deadline.signal);
      return true;
    } catch {
      return false;
    } finally {
      deadline.clear();
    }
  }

  private markDown(): void {
    this.up = false;
    this.downSince = performance.now();
    this.o.log?.warn({ probeTimeoutMs: this.probeTimeoutMs }, 'Kubernetes API server does not answer: failing calls fast until it does');
    this.controller.abort(this.unavailable());
    this.o.onChange?.(false);
    this.scheduleRecheck();
  }

  private scheduleRecheck(): void {
    if (this.stopped) return;
    this.recheck = setTimeout(() => {
      void this.answers().then((answered) => {
        if (!answered) return this.scheduleRecheck();
        this.up = true;
        this.controller = new AbortController();
        this.o.log?.info({ downForMs: Math.round(performance.now() - this.downSince) }, 'Kubernetes API server answers again');
        this.o.onChange?.(true);
      });
    }, this.recheckMs);
    this.recheck.unref();
  }
}

