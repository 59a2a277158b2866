// Traffic to the ports of a box's apps (docs/ports.md), through the box connector like every call
// into a box: a sleeping box is woken (ports need boxes:write, and preview links stand for it), a
// call that meets a sleep's fence waits for it, the call counts as the box's activity, and a box
// deleted meanwhile ends it. boxd carries each request to the port on the box's loopback; this
// service bounds what the replica holds (the byte budget) and how long an app may take to answer.
// Preview links: made, checked and revoked here (their tokens: preview-links.ts).
import type * as k8s from '@kubernetes/client-node';
import type { BoxRecords } from '../../common/box-records.js';
import { recordOf } from '../../common/box-records.js';
import type { BoxdClient, BoxdPortAnswer, BoxdPortRequest } from '../../common/boxd-client.js';
import { BridgeError } from '../../common/errors.js';
import { ANNOTATIONS } from '../../common/labels.js';
import { wakePermission, type BoxConnector } from './box-connector.js';
import type { BoxService } from './boxes.js';
import { HOLD_BYTES, type ByteBudget } from './byte-budget.js';
import { recordTag, type PreviewClaims, type PreviewSigner, type PreviewUrls } from './preview-links.js';

export interface PortLimits {
  /** Requests and upgraded connections through one box's ports at once (boxd counts them, across replicas). */
  maxConnectionsPerBox: number;
  /** Bytes per second through one box's ports, both ways (boxd slows transfers beyond it); 0: none. */
  bytesPerSecondPerBox: number;
  /** The app must begin its answer within this (504 otherwise). */
  firstByteMs: number;
  /** An answer or upgraded connection with no byte either way for this long is closed. */
  idleMs: number;
}

export interface PreviewConfig {
  signer: PreviewSigner;
  urls: PreviewUrls;
  defaultTtlSeconds: number;
  maxTtlSeconds: number;
}

export interface PortServiceDeps {
  connector: Pick<BoxConnector, 'call'>;
  boxd: Pick<BoxdClient, 'toPort'>;
  budget: ByteBudget;
  boxes: Pick<BoxService, 'locate'>;
  records: Pick<BoxRecords, 'read' | 'swap'>;
  limits: PortLimits;
  /** Absent: no PREVIEW_URL/PREVIEW_KEY, so preview links answer 501. */
  previews?: PreviewConfig | undefined;
  now?: () => number;
}

/** A box record's UID tag and the preview generation of each port whose links were ever revoked, as read at `at`. */
interface Generations {
  record: string;
  ports: Record<number, number>;
  at: number;
}

/** Ports of one box whose links can be revoked (the record's annotation stays small). */
const MAX_REVOKED_PORTS = 256;

/** How long a replica trusts the preview generation it read from a box's record (revocations take this long to reach it). */
export const GENERATION_TTL_MS = 5000;
const MAX_SWAP_ATTEMPTS = 5;

export class PortService {
  private readonly now: () => number;
  /** box id -> its record's UID tag and preview generations, as last read. */
  private readonly generations = new Map<string, Generations>();

  constructor(private readonly deps: PortServiceDeps) {
    this.now = deps.now ?? Date.now;
  }

  get limits(): PortLimits {
    return this.deps.limits;
  }

  get previewUrls(): PreviewUrls | undefined {
    return this.deps.previews?.urls;
  }

  /**
   * Sends a request to the port and hands the app's answer (or upgraded connection) to `use`,
   * which moves it to the caller; resolves with what `use` resolves. The request is sent again
   * only when nothing of it reached the app (a fence, a box that was not there yet).
   */
  async open<T>(boxId: string, port: number, request: BoxdPortRequest, use: (answer: BoxdPortAnswer, signal: AbortSignal) => Promise<T>, signal?: AbortSignal): Promise<T> {
    checkPort(port);
    const hold = this.deps.budget.reserve(HOLD_BYTES.pipe, 'port', `a request to port ${port}`);
    try {
      return await wakePermission.run(true, () => this.deps.connector.call(
        boxId,
        async (call) => {
          const answer = await this.firstByte(call.target, port, request, call.signal);
          return use(answer, call.signal);
        },
        signal,
      ));
    } finally {
      hold.release();
    }
  }

  /** boxd's answer within firstByteMs, else 504 (the request to the app is abandoned). */
  private async firstByte(target: Parameters<BoxdClient['toPort']>[0], port: number, request: BoxdPortRequest, signal: AbortSignal): Promise<BoxdPortAnswer> {
    const { limits } = this.deps;
    const late = new AbortController();
    const timer = setTimeout(() => late.abort(new BridgeError('gateway_timeout', `the app on port ${port} did not begin its answer within ${limits.firstByteMs} ms`)), limits.firstByteMs);
    try {
      const headers = {
        ...request.headers,
        'x-boxd-port-max-connections': String(limits.maxConnectionsPerBox),
        'x-boxd-port-bytes-per-second': String(limits.bytesPerSecondPerBox),
      };
      return await this.deps.boxd.toPort(target, port, { ...request, headers }, AbortSignal.any([signal, late.signal]));
    } catch (err) {
      if (late.signal.aborted && !signal.aborted) throw late.signal.reason;
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  // ---- preview links ----

  /** A link to the port that works without the bridge's token until it expires (or the port's links are revoked). */
  async createPreview(boxId: string, port: number, ttlSeconds?: number): Promise<{ box_id: string; port: number; url: string; expires_at: string }> {
    const previews = this.configured();
    checkPort(port);
    const ttl = ttlSeconds ?? previews.defaultTtlSeconds;
    if (ttl > previews.maxTtlSeconds) throw new BridgeError('invalid_request', `expires_in_seconds must be at most ${previews.maxTtlSeconds} (PREVIEW_MAX_TTL_SECONDS)`);
    await this.deps.boxes.locate(boxId); // 404 for a box that is gone, without waking one that sleeps
    const state = await this.readGenerations(boxId);
    const expiresAt = Math.floor(this.now() / 1000) + ttl;
    const token = previews.signer.sign({ boxId, port, expiresAt, generation: state.ports[port] ?? 0, record: state.record });
    let url: string;
    try {
      url = previews.urls.urlFor(boxId, port, token);
    } catch (err) {
      throw new BridgeError('conflict', `${(err as Error).message}: use a shorter BOX_NAME_PREFIX or path mode (docs/ports.md)`);
    }
    return { box_id: boxId, port, url, expires_at: new Date(expiresAt * 1000).toISOString() };
  }

  /** Every preview link to the port made until now stops working (within GENERATION_TTL_MS on other replicas). */
  async revokePreviews(boxId: string, port: number): Promise<{ box_id: string; port: number; revoked_at: string }> {
    this.configured();
    checkPort(port);
    await this.deps.boxes.locate(boxId);
    for (let attempt = 0; attempt < MAX_SWAP_ATTEMPTS; attempt++) {
      const record = await this.deps.records.read(boxId);
      if (!record || record.metadata?.deletionTimestamp) throw new BridgeError('not_found', `box ${boxId} not found`);
      const ports = { ...generationsOf(record), [port]: (generationsOf(record)[port] ?? 0) + 1 };
      if (Object.keys(ports).length > MAX_REVOKED_PORTS) throw new BridgeError('conflict', `box ${boxId} has had the links of ${MAX_REVOKED_PORTS} ports revoked, the most it keeps`);
      const written = await this.deps.records.swap(record, { annotations: { [ANNOTATIONS.previewGeneration]: JSON.stringify(ports) } });
      if (written) {
        this.generations.set(boxId, { record: recordTag(written.metadata!.uid!), ports, at: this.now() });
        return { box_id: boxId, port, revoked_at: new Date(this.now()).toISOString() };
      }
    }
    throw new BridgeError('cluster_unavailable', `could not revoke the previews of box ${boxId}: too many concurrent updates; retry`, { headers: { 'Retry-After': '1' } });
  }

  /**
   * The claims of a preview token that may be served now: 404 for one that is not ours or whose
   * box is gone (a box made again under the same id included), 410 for one expired or revoked.
   * `expected`: the box and port the request's host names (host mode).
   */
  async checkPreview(token: string, expected?: { boxId: string; port: number }): Promise<PreviewClaims> {
    const previews = this.configured();
    const claims = previews.signer.verify(token);
    if (!claims || (expected && (expected.boxId !== claims.boxId || expected.port !== claims.port))) {
      throw new BridgeError('not_found', 'no such preview link (check the link, or ask for a new one)');
    }
    if (claims.expiresAt * 1000 <= this.now()) {
      throw new BridgeError('gone', `this preview link expired at ${new Date(claims.expiresAt * 1000).toISOString()}; ask for a new one`);
    }
    const where = await this.deps.boxes.locate(claims.boxId).catch((err: unknown) => {
      if (err instanceof BridgeError && err.type === 'not_found') throw new BridgeError('not_found', `box ${claims.boxId} of this preview link no longer exists`);
      throw err;
    });
    const current = this.cachedGenerations(claims.boxId, where.pod);
    const state = current ?? (await this.readGenerations(claims.boxId));
    if (state.record !== claims.record) throw new BridgeError('not_found', `box ${claims.boxId} of this preview link no longer exists`);
    if ((state.ports[claims.port] ?? 0) !== claims.generation) throw new BridgeError('gone', `the preview links of port ${claims.port} of box ${claims.boxId} were revoked; ask for a new link`);
    return claims;
  }

  private configured(): PreviewConfig {
    if (!this.deps.previews) throw new BridgeError('not_implemented', 'preview links need PREVIEW_URL and PREVIEW_KEY (docs/ports.md)');
    return this.deps.previews;
  }

  /** The generations read within GENERATION_TTL_MS, for the record the pod belongs to. */
  private cachedGenerations(boxId: string, pod: k8s.V1Pod | undefined): Generations | undefined {
    const seen = this.generations.get(boxId);
    if (!seen || this.now() - seen.at > GENERATION_TTL_MS) return undefined;
    // A pod of another record than the one read (the box deleted and made again): read again.
    const owner = pod ? recordOf(pod, boxId) : undefined;
    if (owner && recordTag(owner) !== seen.record) return undefined;
    return seen;
  }

  private async readGenerations(boxId: string): Promise<Generations> {
    const record = await this.deps.records.read(boxId);
    if (!record?.metadata?.uid || record.metadata.deletionTimestamp) throw new BridgeError('not_found', `box ${boxId} not found`);
    const state = { record: recordTag(record.metadata.uid), ports: generationsOf(record), at: this.now() };
    if (this.generations.size >= 50_000) this.generations.delete(this.generations.keys().next().value!);
    this.generations.set(boxId, state);
    return state;
  }
}

/** The record's preview generation per port (its annotation: JSON {"<port>": n}, ports never revoked absent). */
export function generationsOf(record: k8s.V1Secret): Record<number, number> {
  const text = record.metadata?.annotations?.[ANNOTATIONS.previewGeneration];
  if (!text) return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return {};
  }
  const out: Record<number, number> = {};
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return out;
  for (const [k, v] of Object.entries(parsed)) {
    const port = Number(k);
    if (Number.isInteger(port) && port >= 1 && port <= 65535 && Number.isSafeInteger(v) && (v as number) >= 0) out[port] = v as number;
  }
  return out;
}

/** Ports 1-65535, written plainly; boxd refuses its own (7771, 7772) with 403. */
export function checkPort(port: number): void {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new BridgeError('invalid_request', 'the port must be a number from 1 to 65535');
}
