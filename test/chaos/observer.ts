// What a chaos run sees of its boxes, from its own watches on the real API server (never through
// the proxies the run freezes): every version of every box record (state, snapshot named, lease)
// and every box pod. Two uses: the kill scheduler is told the moment a box reaches a point of
// its sleep or wake, and every box pod that gets a deletionTimestamp is checked on the spot —
// its box's record, as it was at the revision of that delete, must name a snapshot that is
// stored ("no pod deleted before its snapshot was stored"). Resource versions of one etcd are
// one counter (the local cluster runs a single etcd), which is what lets the check place a pod's
// delete among the record's versions.
import * as k8s from '@kubernetes/client-node';
import { type BoxState, leaseOf, stateOf } from '../../common/box-lease.js';
import { sleptBoxOf } from '../../common/box-pod.js';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS } from '../../common/labels.js';
import type { ObjectStore } from '../../common/object-store.js';
import type { Journal } from './journal.js';
import { METADATA_OBJECT, WORKSPACE_OBJECT, parseSnapshotId, snapshotKey } from '../../common/snapshots.js';

export interface RecordVersion {
  rv: number;
  uid: string;
  /** When this run saw it (ms). */
  at: number;
  deleted: boolean;
  state: BoxState | undefined;
  snapshot: string | undefined;
  holder: string | undefined;
  epoch: number | undefined;
  leaseExpiry: number | undefined;
  seat: number | undefined;
}

export interface PodView {
  uid: string;
  name: string;
  box: string;
  rv: number;
  deleting: boolean;
  gone: boolean;
  ip: string | undefined;
  phase: string | undefined;
}

export type Seen =
  | { kind: 'record'; box: string; now: RecordVersion; before: RecordVersion | undefined }
  | { kind: 'pod'; box: string; now: PodView; before: PodView | undefined };

export interface DeletionCheck {
  box: string;
  pod: string;
  podUid: string;
  /** The revision of the delete (the first version of the pod with a deletionTimestamp). */
  rv: number;
  seenAt: number;
  /** The box's record at that revision: its state and the snapshot it named. */
  state?: BoxState | 'running' | 'no record';
  snapshot?: string;
  verdict?: 'ok' | 'violation';
  why?: string;
}

export class Observer {
  /** Box id -> every version of its record seen, oldest first. */
  readonly history = new Map<string, RecordVersion[]>();
  /** Pod uid -> the pod as last seen. */
  readonly pods = new Map<string, PodView>();
  /** Seat Secrets (name -> uid of the record owning it). */
  readonly seats = new Map<string, string | undefined>();
  readonly deletions: DeletionCheck[] = [];
  readonly violations: string[] = [];
  readonly notes: string[] = [];
  /** False while the run deletes its own boxes at the end: those pod deletes are not checked. */
  checking = true;
  private readonly listeners = new Set<(s: Seen) => void>();
  private readonly core: k8s.CoreV1Api;
  private readonly aborts: AbortController[] = [];
  private stopped = false;
  /** The newest revision the Secret watch has delivered (events and bookmarks). */
  private secretsAt = 0;
  private resolver: NodeJS.Timeout | undefined;
  private readonly stuckNoted = new Set<string>();

  constructor(
    private readonly o: {
      kc: k8s.KubeConfig;
      ns: string;
      pool: string;
      store: ObjectStore;
      log: (line: string) => void;
      /** Whether the operator is up (a lease left expired while it is down is no fault of it). */
      operatorUp: () => boolean;
      journal?: Journal;
    },
  ) {
    this.core = o.kc.makeApiClient(k8s.CoreV1Api);
  }

  async start(): Promise<void> {
    await Promise.all([this.follow('secrets'), this.follow('pods')]);
    this.resolver = setInterval(() => void this.tick(), 200);
  }

  stop(): void {
    this.stopped = true;
    clearInterval(this.resolver);
    for (const a of this.aborts) a.abort();
  }

  on(fn: (s: Seen) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /** The box's record as last seen (undefined: never seen, or deleted). */
  record(box: string): RecordVersion | undefined {
    const v = this.history.get(box)?.at(-1);
    return v && !v.deleted ? v : undefined;
  }

  /** The box's pods seen and not gone. */
  podsOf(box: string): PodView[] {
    return [...this.pods.values()].filter((p) => p.box === box && !p.gone);
  }

  /** Deletion checks not yet resolved. */
  pendingChecks(): DeletionCheck[] {
    return this.deletions.filter((d) => !d.verdict);
  }

  // ---- watches ----

  private async follow(kind: 'secrets' | 'pods'): Promise<void> {
    const path = `/api/v1/namespaces/${this.o.ns}/${kind}`;
    const list = async () => {
      const l = kind === 'pods' ? await this.core.listNamespacedPod({ namespace: this.o.ns }) : await this.core.listNamespacedSecret({ namespace: this.o.ns });
      const seen = new Set<string>();
      for (const item of l.items as Array<k8s.V1Pod | k8s.V1Secret>) {
        seen.add(item.metadata!.uid!);
        this.apply(kind, 'ADDED', item);
      }
      // Gone while the watch was down.
      if (kind === 'pods') for (const p of this.pods.values()) if (!p.gone && !seen.has(p.uid)) this.apply('pods', 'DELETED', { metadata: { uid: p.uid, name: p.name, resourceVersion: l.metadata?.resourceVersion, labels: { [LABELS.boxId]: p.box } } });
      return l.metadata!.resourceVersion!;
    };
    const watch = async (rv: string): Promise<void> => {
      if (this.stopped) return;
      let last = rv;
      let ended = false;
      const restart = (err: unknown) => {
        if (this.stopped || ended) return;
        ended = true;
        const gone = (err as { statusCode?: number; code?: number } | null)?.statusCode === 410 || (err as { code?: number } | null)?.code === 410;
        if (err) this.o.log(`observer: ${kind} watch ended (${gone ? '410 Gone' : String(err)}); ${gone ? 'listing again' : 'resuming'}`);
        setTimeout(() => void (gone ? list().then(watch) : watch(last)).catch((e: unknown) => restart(e)), 300);
      };
      const controller = await new k8s.Watch(this.o.kc).watch(
        path,
        { resourceVersion: last, allowWatchBookmarks: true },
        (phase, obj: k8s.V1Pod | k8s.V1Secret) => {
          last = obj.metadata?.resourceVersion ?? last;
          if (phase === 'BOOKMARK') {
            if (kind === 'secrets') this.secretsAt = Math.max(this.secretsAt, Number(last));
            return;
          }
          if (phase === 'ERROR') return restart({ code: (obj as unknown as { code?: number }).code });
          this.apply(kind, phase as 'ADDED' | 'MODIFIED' | 'DELETED', obj);
        },
        (err: unknown) => restart(err),
      );
      this.aborts.push(controller);
    };
    await watch(await list());
  }

  private apply(kind: 'secrets' | 'pods', phase: 'ADDED' | 'MODIFIED' | 'DELETED', obj: k8s.V1Pod | k8s.V1Secret): void {
    const rv = Number(obj.metadata?.resourceVersion ?? 0);
    if (kind === 'secrets') {
      this.secretsAt = Math.max(this.secretsAt, rv);
      this.applySecret(phase, obj as k8s.V1Secret, rv);
    } else {
      this.applyPod(phase, obj as k8s.V1Pod, rv);
    }
  }

  private applySecret(phase: string, s: k8s.V1Secret, rv: number): void {
    const component = s.metadata?.labels?.[LABELS.component];
    const name = s.metadata!.name!;
    if (component === SECRET_COMPONENTS.seat) {
      if (phase === 'DELETED') this.seats.delete(name);
      else this.seats.set(name, s.metadata?.ownerReferences?.find((o) => o.kind === 'Secret')?.uid);
      return;
    }
    if (component !== SECRET_COMPONENTS.record) return;
    const versions = this.history.get(name) ?? [];
    const before = versions.at(-1);
    if (before && before.rv >= rv && before.uid === s.metadata?.uid) return; // a relist repeating what was seen
    const lease = leaseOf(s);
    const now: RecordVersion = {
      rv,
      uid: s.metadata!.uid!,
      at: Date.now(),
      deleted: phase === 'DELETED',
      state: stateOf(s),
      snapshot: s.metadata?.annotations?.[ANNOTATIONS.sleepSnapshot],
      holder: lease?.holder,
      epoch: lease?.epoch,
      leaseExpiry: lease ? lease.renewed + lease.seconds * 1000 : undefined,
      seat: sleptBoxOf(s)?.seat,
    };
    versions.push(now);
    this.history.set(name, versions);
    this.emit({ kind: 'record', box: name, now, before });
  }

  private applyPod(phase: string, p: k8s.V1Pod, rv: number): void {
    if (p.metadata?.labels?.[LABELS.warm]) return;
    const box = p.metadata?.labels?.[LABELS.boxId];
    if (!box) return;
    const uid = p.metadata!.uid!;
    const before = this.pods.get(uid);
    if (before && before.rv >= rv) return;
    const now: PodView = {
      uid,
      name: p.metadata!.name!,
      box,
      rv,
      deleting: Boolean(p.metadata?.deletionTimestamp) || phase === 'DELETED',
      gone: phase === 'DELETED',
      ip: p.status?.podIP ?? before?.ip,
      phase: p.status?.phase ?? before?.phase,
    };
    this.pods.set(uid, now);
    if (now.deleting && !before?.deleting) {
      // The first version with a deletionTimestamp: its revision is the delete's. A pod seen
      // only as DELETED (its delete came while the watch was down) is placed at that revision, a
      // bound after the delete.
      if (this.checking) this.deletions.push({ box, pod: now.name, podUid: uid, rv, seenAt: Date.now() });
    }
    this.emit({ kind: 'pod', box, now, before });
  }

  private emit(s: Seen): void {
    this.o.journal?.add(s.kind, { box: s.box, ...s.now });
    for (const fn of this.listeners) {
      try {
        fn(s);
      } catch (err) {
        this.o.log(`observer: a listener failed: ${String(err)}`);
      }
    }
  }

  // ---- checks ----

  private ticking = false;

  private async tick(): Promise<void> {
    if (this.ticking) return;
    this.ticking = true;
    try {
      for (const d of this.pendingChecks()) await this.resolve(d);
      this.noteStuck();
    } catch (err) {
      this.o.log(`observer: a check failed to run: ${String(err)}`);
    } finally {
      this.ticking = false;
    }
  }

  /** Decides one deletion check once the record's versions up to the delete's revision are known. */
  private async resolve(d: DeletionCheck): Promise<void> {
    let at: RecordVersion | undefined;
    const versions = this.history.get(d.box) ?? [];
    const before = () => versions.filter((v) => v.rv < d.rv).at(-1);
    if (this.secretsAt >= d.rv) {
      at = before();
    } else {
      // The Secret watch has not passed the delete's revision yet (nothing changed since): the
      // record as the API server has it now is the record at that revision if it is older.
      const live = await this.core.readNamespacedSecret({ name: d.box, namespace: this.o.ns }).catch(() => undefined);
      if (live && Number(live.metadata?.resourceVersion) < d.rv) {
        const lease = leaseOf(live);
        at = {
          rv: Number(live.metadata?.resourceVersion),
          uid: live.metadata!.uid!,
          at: Date.now(),
          deleted: false,
          state: stateOf(live),
          snapshot: live.metadata?.annotations?.[ANNOTATIONS.sleepSnapshot],
          holder: lease?.holder,
          epoch: lease?.epoch,
          leaseExpiry: undefined,
          seat: undefined,
        };
      } else if (Date.now() - d.seenAt < 15_000) {
        return; // look again at the next tick
      } else {
        at = before();
        this.notes.push(`deletion check of ${d.pod} decided on the watched history alone (the Secret watch did not pass revision ${d.rv} in 15 s)`);
      }
    }
    d.state = !at || at.deleted ? 'no record' : (at.state ?? 'running');
    d.snapshot = at?.snapshot;
    if (!at || at.deleted) return this.verdict(d, 'violation', 'the box had no record when its pod was deleted');
    if (!at.snapshot) return this.verdict(d, 'violation', `the record (state ${d.state}, revision ${at.rv}) named no snapshot`);
    const stored = await snapshotStored(this.o.store, this.o.pool, at.snapshot);
    if (!stored.ok) return this.verdict(d, 'violation', `the record named ${at.snapshot}, which is not stored (${stored.why})`);
    this.verdict(d, 'ok');
  }

  private verdict(d: DeletionCheck, verdict: 'ok' | 'violation', why?: string): void {
    d.verdict = verdict;
    if (why) d.why = why;
    this.o.journal?.add('deletion-check', { ...d });
    if (verdict === 'violation') {
      const line = `pod ${d.pod} of box ${d.box} deleted at revision ${d.rv} before its snapshot was stored: ${why}`;
      this.violations.push(line);
      this.o.log(`VIOLATION ${line}`);
    }
  }

  /** A lease left expired for long while the operator runs: worth a note (the end checks fail on it). */
  private noteStuck(): void {
    if (!this.o.operatorUp()) return;
    const now = Date.now();
    for (const [box] of this.history) {
      const r = this.record(box);
      if (!r || (r.state !== 'pending' && r.state !== 'waking') || r.leaseExpiry === undefined) continue;
      const key = `${box}/${r.epoch}`;
      if (now - r.leaseExpiry > 30_000 && !this.stuckNoted.has(key)) {
        this.stuckNoted.add(key);
        this.notes.push(`box ${box}: record ${r.state} with a lease (epoch ${r.epoch}, ${r.holder}) expired ${Math.round((now - r.leaseExpiry) / 1000)} s ago`);
      }
    }
  }
}

/** Whether a snapshot's metadata and workspace are both in the store. */
export async function snapshotStored(store: ObjectStore, pool: string, snapshotId: string): Promise<{ ok: true } | { ok: false; why: string }> {
  const id = parseSnapshotId(snapshotId);
  if (!id) return { ok: false, why: 'not a snapshot id' };
  const metadata = await store.getJson<{ snapshot_id?: string }>(store.key(snapshotKey(pool, id, METADATA_OBJECT)));
  if (metadata?.snapshot_id !== snapshotId) return { ok: false, why: 'no metadata' };
  const workspace = store.key(snapshotKey(pool, id, WORKSPACE_OBJECT));
  for await (const o of store.list(workspace)) if (o.key === workspace) return { ok: true };
  return { ok: false, why: 'no workspace object' };
}
