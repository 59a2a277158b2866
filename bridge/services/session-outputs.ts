// Session outputs, the bridge's side (docs/api.md "Session outputs"; the store side and layout:
// common/session-outputs.ts). A mount names the session on the box's record and in the store's
// live.json, after copying in what the session's earlier boxes left. Reads go to the box while it
// runs (never waking it: reading outputs is boxes:contents) and to the store's copy otherwise.
// The copy is made before a box's pod goes: by the operator's idle sleep, by a delete here, and
// copied back by a wake (restoreMounts, wired into the box connector). Free of Express types.
import type { Readable } from 'node:stream';
import type * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { SESSION_OUTPUTS_DIR } from '../../common/box-pod.js';
import { recordOf, type BoxRecords } from '../../common/box-records.js';
import type { BoxdClient } from '../../common/boxd-client.js';
import { BridgeError } from '../../common/errors.js';
import type { ObjectStore } from '../../common/object-store.js';
import {
  MAX_OUTPUT_BYTES,
  listBoxOutputs,
  outputPath,
  outputsKeys,
  outputsMountAnnotation,
  outputsMountOf,
  restoreOutputs,
  uploadOutputs,
  type LiveOutputs,
  type OutputFile,
  type OutputsManifest,
  type OutputsMount,
} from '../../common/session-outputs.js';
import type { PolicySource } from '../kube/policy.js';
import { wakePermission, type BoxCall, type BoxConnector } from './box-connector.js';
import type { BoxService } from './boxes.js';
import { HOLD_BYTES, type ByteBudget } from './byte-budget.js';

export interface SessionOutputsServiceDeps {
  connector: Pick<BoxConnector, 'call'>;
  boxes: Pick<BoxService, 'locate'>;
  records: Pick<BoxRecords, 'read' | 'readOwn' | 'annotate'>;
  boxd: BoxdClient;
  /** Undefined without an object store: the outputs routes answer 501. */
  store: ObjectStore | undefined;
  policy: Pick<PolicySource, 'poolName'>;
  budget: ByteBudget;
  log: Logger;
  now?: () => Date;
}

export interface OutputList {
  session_id: string;
  source: 'box' | 'store';
  files: OutputFile[];
}

/** The box is not (or no longer) the live holder of the session's outputs: read the store's copy. */
class NotLive extends Error {}

export class SessionOutputsService {
  private readonly now: () => Date;

  constructor(private readonly deps: SessionOutputsServiceDeps) {
    this.now = deps.now ?? (() => new Date());
  }

  /**
   * Makes the box's /mnt/session/outputs/ the session's outputs: the session's files stored by
   * earlier boxes are copied in (when this box did not hold them already), then the record and
   * the store's live.json name the box. Wakes a sleeping box (it needs boxes:write). A box
   * already holding another session's outputs: 409.
   */
  async mount(boxId: string, m: OutputsMount): Promise<{ path: string; tenant_id: string; session_id: string }> {
    const store = this.configured();
    const keys = outputsKeys(this.pool, m.session_id);
    return this.deps.connector.call(boxId, async ({ pod, target, signal }) => {
      await this.deps.boxd.listFiles(target, { path: SESSION_OUTPUTS_DIR, recursive: false, limit: 1 }, signal).catch((err: unknown) => {
        if (err instanceof BridgeError && err.type === 'not_found') {
          throw new BridgeError('conflict', `box ${boxId} has no ${SESSION_OUTPUTS_DIR} (it was made before session outputs); create a new box`);
        }
        throw err;
      });
      const record = await this.deps.records.readOwn(pod, boxId);
      const previous = outputsMountOf(record);
      // One session per box: its directory cannot be two sessions' outputs (a repeated mount is fine).
      if (previous && previous.session_id !== m.session_id) {
        throw new BridgeError('conflict', `box ${boxId} already holds the outputs of another session; a box holds one session's outputs (create a new box)`);
      }
      if (!previous) await restoreOutputs({ boxd: this.deps.boxd, target, store, pool: this.pool, mount: m, signal });
      const written = await this.deps.records.annotate(boxId, outputsMountAnnotation(m));
      const live: LiveOutputs = { version: 1, ...m, box_id: boxId, record_uid: written.metadata!.uid!, mounted_at: this.now().toISOString() };
      await store.putJson(store.key(keys.live), live);
      return { path: SESSION_OUTPUTS_DIR, tenant_id: m.tenant_id, session_id: m.session_id };
    });
  }

  /** The session's output files: from the box holding them while it runs, else the store's copy. 404 for a session never mounted. */
  async list(sessionId: string): Promise<OutputList> {
    const store = this.configured();
    const keys = outputsKeys(this.pool, sessionId);
    const live = await store.getJson<LiveOutputs>(store.key(keys.live));
    if (live?.session_id === sessionId) {
      try {
        const files = await this.onLiveBox(live, ({ target, signal }) => listBoxOutputs(this.deps.boxd, target, signal));
        return { session_id: sessionId, source: 'box', files };
      } catch (err) {
        if (!(err instanceof NotLive)) throw err;
      }
    }
    const manifest = await store.getJson<OutputsManifest>(store.key(keys.manifest));
    if (manifest?.session_id === sessionId) return { session_id: sessionId, source: 'store', files: manifest.files };
    if (live?.session_id === sessionId) return { session_id: sessionId, source: 'store', files: [] }; // mounted, never copied
    throw new BridgeError('not_found', `session ${sessionId} has no outputs (POST /boxes/{id}/mounts/outputs makes a box's ${SESSION_OUTPUTS_DIR} its outputs)`);
  }

  /** One output file's bytes, streamed (from the live box, else the store). */
  async read(sessionId: string, segments: readonly string[]): Promise<{ path: string; size: number; body: Readable; source: 'box' | 'store' }> {
    const path = outputPath(segments);
    const store = this.configured();
    const keys = outputsKeys(this.pool, sessionId);
    const live = await store.getJson<LiveOutputs>(store.key(keys.live));
    const hold = this.deps.budget.reserve(HOLD_BYTES.pipe, 'file', `reading output ${path}`);
    try {
      if (live?.session_id === sessionId) {
        try {
          const res = await this.onLiveBox(live, ({ target }) => this.deps.boxd.readFile(target, `${SESSION_OUTPUTS_DIR}/${path}`, MAX_OUTPUT_BYTES));
          res.once('close', hold.release);
          return { path, size: Number(res.headers['content-length'] ?? 0), body: res, source: 'box' };
        } catch (err) {
          if (!(err instanceof NotLive)) throw err;
        }
      }
      const object = await store.getStream(store.key(keys.files + path));
      if (!object) throw new BridgeError('not_found', `session ${sessionId} has no output ${path}`);
      object.body.once('close', hold.release);
      return { path, size: object.size, body: object.body, source: 'store' };
    } catch (err) {
      hold.release();
      throw err;
    }
  }

  /**
   * Before a box is deleted: its outputs are copied to the store (a box without an outputs
   * mount, or without a pod — asleep, its copy made by the sleep — needs nothing). A store
   * that fails keeps the box (the delete answers the error, 503, nothing lost); a box whose agent
   * cannot be reached is deleted all the same (nobody can read its files; the copy of its last
   * sleep stays).
   */
  async beforeDelete(boxId: string): Promise<void> {
    const store = this.deps.store;
    if (!store) return;
    const where = await this.deps.boxes.locate(boxId);
    if (!where.pod) return;
    const mount = outputsMountOf(await this.deps.records.read(boxId));
    if (!mount) return;
    await store.check();
    let reached = false;
    try {
      await wakePermission.run(false, () =>
        this.deps.connector.call(boxId, async ({ target, signal }) => {
          reached = true;
          await uploadOutputs({ boxd: this.deps.boxd, target, store, pool: this.pool, boxId, mount, signal, now: this.now() });
        }),
      );
    } catch (err) {
      if (reached) throw err;
      this.deps.log.warn({ box: boxId, err: err instanceof Error ? err.message : String(err) }, 'could not copy the outputs of a box being deleted: its agent does not answer');
    }
  }

  /** For the box connector's wake: the session's outputs copied back into the woken pod. */
  async restoreMounts(call: Pick<BoxCall, 'target' | 'signal'>, record: k8s.V1Secret): Promise<void> {
    const mount = outputsMountOf(record);
    if (!mount || !this.deps.store) return;
    await restoreOutputs({ boxd: this.deps.boxd, target: call.target, store: this.deps.store, pool: this.pool, mount, signal: call.signal });
  }

  /**
   * fn on the box live.json names, if it runs now and is that box (its record's UID: a later box
   * of the same id is another); never wakes it. NotLive otherwise: the store's copy is the answer.
   */
  private async onLiveBox<T>(live: LiveOutputs, fn: (call: BoxCall) => Promise<T>): Promise<T> {
    const where = await this.deps.boxes.locate(live.box_id).catch((err: unknown) => {
      if (err instanceof BridgeError && (err.type === 'not_found' || err.type === 'invalid_request')) return undefined;
      throw err;
    });
    if (!where?.pod || recordOf(where.pod, live.box_id) !== live.record_uid) throw new NotLive();
    return wakePermission.run(false, () =>
      this.deps.connector
        .call(live.box_id, (call) => {
          if (recordOf(call.pod, live.box_id) !== live.record_uid) throw new NotLive();
          return fn(call);
        })
        .catch((err: unknown) => {
          // Asleep or gone meanwhile (a sleep copies before its pod goes): the store's copy.
          if (err instanceof BridgeError && (err.type === 'conflict' || (err.type === 'not_found' && /^box /.test(err.message)))) throw new NotLive();
          throw err;
        }),
    );
  }

  private get pool(): string {
    return this.deps.policy.poolName;
  }

  private configured(): ObjectStore {
    if (!this.deps.store) {
      throw new BridgeError('not_implemented', 'session outputs need an object store: set objectStore.bucket in the chart, or OBJECT_STORE_BUCKET for the bridge (docs/snapshots.md)');
    }
    return this.deps.store;
  }
}
