// Memory stores, the bridge's side (docs/mounts.md; the store side and layout: common/memory-store.ts).
// A mount is recorded on the box's record, then the store is filled into the box through the
// pod's mounts sidecar; a sync writes a read-write store back. The same happens around the
// box's pod going: before a delete here, before a sleep by the operator, and a wake mounts the
// record's stores again (restoreMounts, wired into the box connector). Free of Express types.
import type * as k8s from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { BoxRecords } from '../../common/box-records.js';
import { BridgeError } from '../../common/errors.js';
import {
  MEMORY_DIR,
  fillStore,
  forgetBox,
  hasMountsSidecar,
  memoryMountsOf,
  mountAnnotation,
  mountStep,
  syncAll,
  syncStore,
  type MemoryMount,
  type MountsClient,
  type StoreCount,
} from '../../common/memory-store.js';
import type { ObjectStore } from '../../common/object-store.js';
import type { PolicySource } from '../kube/policy.js';
import { wakePermission, type BoxCall, type BoxConnector } from './box-connector.js';
import type { BoxService } from './boxes.js';

export interface MemoryMountServiceDeps {
  connector: Pick<BoxConnector, 'call'>;
  boxes: Pick<BoxService, 'locate'>;
  records: Pick<BoxRecords, 'read' | 'readOwn' | 'annotate'>;
  /** Undefined without an object store: the routes answer 501. */
  store: ObjectStore | undefined;
  policy: Pick<PolicySource, 'current' | 'poolName'>;
  client: MountsClient;
  log: Logger;
}

export interface MemoryMountView extends MemoryMount, StoreCount {
  path: string;
}

export interface MemorySyncView extends StoreCount {
  store_name: string;
  store_id: string;
}

export class MemoryMountService {
  constructor(private readonly deps: MemoryMountServiceDeps) {}

  /**
   * Mounts the store at /mnt/memory/<store_name>. The record names it first (so a sleep syncs
   * it and a wake mounts it again), then its files are filled in. The same store mounted the
   * same way again: a read-only one is filled again (the store's files now), a read-write one is
   * left as box code made it. Wakes a sleeping box (it needs boxes:write).
   */
  async mount(boxId: string, m: MemoryMount): Promise<MemoryMountView> {
    const store = this.configured();
    return this.deps.connector.call(boxId, async ({ pod, target, signal }) => {
      this.checkSidecar(pod, boxId);
      const record = await this.deps.records.readOwn(pod, boxId);
      const mounts = memoryMountsOf(record);
      const step = mountStep(mounts, m);
      if (step === 'conflict') {
        const had = mounts.find((x) => x.store_name === m.store_name)!;
        throw new BridgeError(
          'conflict',
          `box ${boxId} already has ${MEMORY_DIR}/${m.store_name} mounted (store ${had.store_id}, ${had.read_only ? 'read-only' : 'read-write'}); mount under another name`,
        );
      }
      if (step === 'new') await this.deps.records.annotate(boxId, mountAnnotation(m));
      const count =
        step === 'same' && !m.read_only
          ? await this.deps.client.list(target, m.store_name, signal).then((files) => ({ files: files.length, bytes: files.reduce((n, f) => n + f.size, 0) }))
          : await fillStore({ store, client: this.deps.client }, target, m, this.limits(), signal).catch(async (err: unknown) => {
              // A store refused as it is (too large, ...) never mounts: off the record again, or every
              // wake would fail on it. A 503 keeps it there (the store's files are untouched; a retry completes it).
              if (step === 'new' && err instanceof BridgeError && err.status < 500) {
                await this.deps.records.annotate(boxId, mountAnnotation(m, true)).catch(() => undefined);
              }
              throw err;
            });
      return { path: `${MEMORY_DIR}/${m.store_name}`, store_name: m.store_name, store_id: m.store_id, read_only: m.read_only, ...count };
    });
  }

  /** Writes a read-write store back to the object store now. 404 when not mounted, 409 when read-only. */
  async sync(boxId: string, storeName: string): Promise<MemorySyncView> {
    const store = this.configured();
    return this.deps.connector.call(boxId, async ({ pod, target, signal }) => {
      const m = memoryMountsOf(await this.deps.records.readOwn(pod, boxId)).find((x) => x.store_name === storeName);
      if (!m) throw new BridgeError('not_found', `box ${boxId} has no memory store mounted as ${storeName}`);
      if (m.read_only) throw new BridgeError('conflict', `${MEMORY_DIR}/${storeName} of box ${boxId} is mounted read-only: there is nothing to sync`);
      this.checkSidecar(pod, boxId);
      const count = await syncStore({ store, client: this.deps.client }, target, m, signal);
      return { store_name: m.store_name, store_id: m.store_id, ...count };
    });
  }

  /**
   * Before a box is deleted: its read-write stores are written back (a box without any, or
   * without a pod — asleep, synced by its sleep — needs nothing). The object store failing keeps
   * the box (the delete answers the error, nothing lost); a box whose sidecar cannot be reached,
   * or whose store is past the limits, is deleted all the same (what its last sync or sleep wrote stays).
   */
  async beforeDelete(boxId: string): Promise<void> {
    const store = this.deps.store;
    if (!store) return;
    const where = await this.deps.boxes.locate(boxId);
    // A pod without the sidecar never had a store (no record read for the pools without them).
    if (where.pod && !hasMountsSidecar(where.pod)) return;
    const mounts = memoryMountsOf(where.record ?? (await this.deps.records.read(boxId)));
    if (!mounts.some((m) => !m.read_only)) return;
    if (where.pod) {
      await store.check();
      try {
        await wakePermission.run(false, () =>
          this.deps.connector.call(boxId, async ({ pod, target, signal }) => {
            await syncAll({ store, client: this.deps.client }, target, pod, mounts, signal);
          }),
        );
      } catch (err) {
        // The object store failing keeps the box (503 or 500, nothing lost; a retry may pass). The
        // box's side failing does not keep it from going: an agent or sidecar that does not answer,
        // or a store past the limits (it could never be synced, and the caller wants the box gone).
        if (!(err instanceof BridgeError) || /object store/.test(err.message)) throw err;
        this.deps.log.warn({ box: boxId, err: err.message }, 'could not sync the memory stores of a box being deleted; deleting it all the same');
      }
    }
    await forgetBox(store, boxId, mounts).catch(() => undefined);
  }

  /** For the box connector's wake: the record's stores mounted again in the woken pod. */
  async restoreMounts(call: Pick<BoxCall, 'pod' | 'target' | 'signal'>, record: k8s.V1Secret): Promise<void> {
    const mounts = memoryMountsOf(record);
    if (!mounts.length || !this.deps.store) return;
    if (!hasMountsSidecar(call.pod)) {
      // The pool turned memory stores off while the box slept: its stores stay in the object store.
      this.deps.log.warn({ box: call.target.box, stores: mounts.length }, 'woken box has no memory-store sidecar: its stores are not mounted again');
      return;
    }
    for (const m of mounts) {
      await fillStore({ store: this.deps.store, client: this.deps.client }, call.target, m, this.limits(), call.signal).catch((err: unknown) => {
        // A store that grew past the limits since it was mounted must not keep the box asleep for
        // good: it wakes without that store. Anything else (503) fails the wake, tried again later.
        if (!(err instanceof BridgeError && err.status < 500)) throw err;
        this.deps.log.warn({ box: call.target.box, store: m.store_name, err: err.message }, 'woken box: a memory store could not be mounted again');
      });
    }
  }

  private checkSidecar(pod: k8s.V1Pod, boxId: string): void {
    if (hasMountsSidecar(pod)) return;
    const on = this.deps.policy.current().box.memoryStores?.enabled;
    throw new BridgeError(
      'conflict',
      on
        ? `box ${boxId} was made before its pool turned memory stores on; create a new box`
        : `memory stores are off in pool ${this.deps.policy.poolName} (spec.box.memoryStores.enabled, chart value box.memoryStores.enabled)`,
    );
  }

  private limits(): { sizeLimit: string } {
    return { sizeLimit: this.deps.policy.current().box.memoryStores?.sizeLimit ?? '256Mi' };
  }

  private configured(): ObjectStore {
    if (!this.deps.store) throw new BridgeError('not_implemented', 'memory stores need the object store (OBJECT_STORE_BUCKET)');
    return this.deps.store;
  }
}
