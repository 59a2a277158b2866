// Runs a chaos plan (plan.ts) step by step: waits until some box reaches the step's point of its
// sleep or wake (seen by the Observer), then kills the process that is working on it — the
// operator, or the replica holding the wake's lease — after the step's delay, and starts it
// again after its downtime; or freezes the waking replica's API traffic, or stops the store for
// the operator mid-upload. What each step hit (the record's state at the kill) is reported.
import type { ObjectStore } from '../../common/object-store.js';
import { poolPrefix } from '../../common/snapshots.js';
import type { Journal } from './journal.js';
import type { Observer, Seen } from './observer.js';
import { describeStep, type Step } from './plan.js';
import type { BridgeProcess, Fleet } from './processes.js';
import type { Rng } from './rng.js';
import { delay, type ChaosBox, type Workload } from './workload.js';

/** How long a step waits for its point to come before it is reported missed. */
const TRIGGER_TIMEOUT_MS = 90_000;

export interface StepResult {
  step: Step;
  outcome: 'done' | 'missed' | 'not run';
  /** Seconds into the run. */
  at?: number;
  box?: string;
  /** What was killed (operator generation, bridge index and pid) or disturbed. */
  victim?: string;
  /** The box's record and pods at the moment of the kill. */
  state?: string;
  /** Until the box's record was plain Running or asleep again, without a lease (ms after the kill). */
  settledMs?: number;
  note?: string;
}

interface Trigger {
  box: string;
  /** The replica holding the wake's lease, for wake points. */
  waker?: BridgeProcess;
}

export class Scheduler {
  readonly results: StepResult[] = [];
  private readonly started = Date.now();
  private uploadsPolling = false;
  private stopped = false;
  /** The read-back running in the background between steps, if any. */
  private spot: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly o: {
      fleet: Fleet;
      observer: Observer;
      workload: Workload;
      boxes: ChaosBox[];
      store: ObjectStore;
      pool: string;
      rng: Rng;
      deadline: number;
      log: (line: string) => void;
      journal?: Journal;
    },
  ) {}

  async run(plan: Step[]): Promise<void> {
    for (const step of plan) {
      if (Date.now() > this.o.deadline) {
        this.results.push({ step, outcome: 'not run', note: 'the run\'s time budget was spent' });
        continue;
      }
      this.o.log(`step ${describeStep(step)}: waiting for its point`);
      const result = await this.execute(step);
      this.results.push(result);
      this.o.journal?.add('step', { ...result, step: describeStep(step) });
      this.o.log(`step #${step.n}: ${result.outcome}${result.box ? ` on ${result.box}` : ''}${result.victim ? `, ${result.victim}` : ''}${result.state ? `, at ${result.state}` : ''}${result.note ? ` (${result.note})` : ''}`);
      // Let the cluster move on a little before the next step, and read some writes back meanwhile.
      const box = this.o.rng.pick(this.o.boxes);
      const rng = this.o.rng.fork();
      this.spot = this.spot.then(() => this.o.workload.spotCheck(box, rng, 3));
      await delay(this.o.rng.int(500, 3000));
    }
  }

  /** Ends the background measurements, once the last read-back is done. */
  async stop(): Promise<void> {
    this.stopped = true;
    await this.spot;
  }

  private seconds(): number {
    return Math.round((Date.now() - this.started) / 100) / 10;
  }

  private async execute(step: Step): Promise<StepResult> {
    const trigger = await this.waitFor(step);
    if (!trigger) return { step, outcome: 'missed', note: `its point did not come within ${TRIGGER_TIMEOUT_MS / 1000} s` };
    const { fleet } = this.o;
    const result: StepResult = { step, outcome: 'done', box: trigger.box, at: this.seconds() };
    if (step.kind !== 'kill') {
      if (step.kind === 'freeze-api') {
        const b = trigger.waker!;
        const proxy = fleet.apiProxies[b.index]!;
        result.victim = `bridge ${b.index} (pid ${b.pid}) API traffic`;
        result.state = this.stateOf(trigger.box);
        proxy.freeze();
        await delay(step.seconds * 1000);
        proxy.thaw();
      } else {
        result.victim = 'operator store traffic';
        result.state = this.stateOf(trigger.box);
        if (step.mode === 'refuse') fleet.storeProxy.set('refuse');
        else fleet.storeProxy.freeze();
        await delay(step.seconds * 1000);
        fleet.storeProxy.set('forward');
        fleet.storeProxy.thaw();
      }
      this.settle(result, trigger.box);
      return result;
    }
    if (step.target === 'operator') {
      await delay(step.delayMs);
      const op = fleet.operator;
      if (!op) return { ...result, outcome: 'missed', note: 'the operator was already down' };
      result.victim = `operator ${op.name} (pid ${op.proc.pid})`;
      result.state = this.stateOf(trigger.box);
      await fleet.killOperator();
      this.settle(result, trigger.box);
      await delay(step.downMs);
      await fleet.restartOperator();
      return result;
    }
    let bridge: BridgeProcess;
    let write: Promise<unknown> | undefined;
    if (step.target === 'waker') {
      bridge = trigger.waker!;
      await delay(step.delayMs);
    } else {
      // sleep:fence-met: a write through a replica, sent while the sleep runs; that replica dies while it waits.
      bridge = this.o.rng.pick(fleet.up());
      await delay(step.writeAfterMs);
      const box = this.o.boxes.find((b) => b.id === trigger.box)!;
      const before = this.o.observer.record(trigger.box)?.state;
      write = this.o.workload.write(box, this.o.rng.fork(), bridge);
      result.note = `write sent with the record ${before ?? 'running'}`;
      await delay(step.delayMs);
    }
    if (fleet.bridges[bridge.index] !== bridge) return { ...result, outcome: 'missed', note: 'the replica was already down' };
    result.victim = `bridge ${bridge.index} (pid ${bridge.pid})`;
    result.state = this.stateOf(trigger.box);
    await fleet.killBridge(bridge.index);
    this.settle(result, trigger.box);
    await write;
    await delay(step.downMs);
    await fleet.startBridge(bridge.index);
    return result;
  }

  /** The box's record and pods as the observer has them now (journaled: the moment of a kill). */
  private stateOf(box: string): string {
    const r = this.o.observer.record(box);
    const pods = this.o.observer.podsOf(box);
    const record = r ? `${r.state ?? 'running'}${r.snapshot ? ' (snapshot named)' : ''}${r.holder ? ` lease ${r.epoch}` : ''}` : 'no record';
    const state = `record ${record}, pods ${pods.map((p) => (p.deleting ? 'deleting' : p.ip ? 'up' : 'starting')).join('+') || 'none'}`;
    this.o.journal?.add('strike', { box, state });
    return state;
  }

  /** Measures, in the background, how long the box takes to be plain Running or asleep again. */
  private settle(result: StepResult, box: string): void {
    const from = Date.now();
    void (async () => {
      while (Date.now() - from < 120_000 && !this.stopped) {
        const r = this.o.observer.record(box);
        if (r && (r.state === undefined || r.state === 'asleep') && !r.holder) {
          result.settledMs = Date.now() - from;
          return;
        }
        await delay(100);
      }
    })();
  }

  // ---- the points of a sleep and a wake ----

  private waitFor(step: Step): Promise<Trigger | undefined> {
    const { observer, fleet } = this.o;
    return new Promise((resolve) => {
      let done = false;
      const finish = (t: Trigger | undefined) => {
        if (done) return;
        done = true;
        off();
        clearTimeout(timer);
        resolve(t);
      };
      const timer = setTimeout(() => finish(undefined), TRIGGER_TIMEOUT_MS);
      const phase = step.kind === 'kill' ? step.phase : step.kind === 'freeze-api' ? 'wake:waking' : 'sleep:uploading';
      const wantsWaker = step.kind === 'freeze-api' || (step.kind === 'kill' && step.target === 'waker');
      const off = observer.on((s: Seen) => {
        if (done) return;
        if (step.kind === 'kill' && step.target === 'operator' && !fleet.operator) return;
        const record = observer.record(s.box);
        const waker = fleet.bridgeByPid(bridgePid(record?.holder) ?? -1);
        const wake = record?.state === 'waking' && waker !== undefined;
        switch (phase) {
          case 'sleep:pending':
          case 'sleep:fence-met':
            if (newSleep(s)) finish({ box: s.box });
            return;
          case 'sleep:uploading':
            if (newSleep(s) && !this.uploadsPolling) void this.pollUpload(s.box, s.kind === 'record' ? s.now.epoch : undefined, () => done).then((found) => found && finish({ box: s.box }));
            return;
          case 'sleep:named':
            if (s.kind === 'record' && s.now.state === 'pending' && s.now.snapshot && !s.before?.snapshot) finish({ box: s.box });
            return;
          case 'sleep:deleting':
            if (s.kind === 'pod' && s.now.deleting && !s.now.gone && !s.before?.deleting && record?.state === 'pending') finish({ box: s.box });
            return;
          case 'wake:waking':
            if (s.kind === 'record' && wake && (s.before?.state !== 'waking' || s.before.epoch !== s.now.epoch)) {
              if (wantsWaker) finish({ box: s.box, waker });
              else finish({ box: s.box });
            }
            return;
          case 'wake:pod-made':
            if (s.kind === 'pod' && wake && !s.before && !s.now.deleting) finish({ box: s.box, waker });
            return;
          case 'wake:restoring':
            if (s.kind === 'pod' && wake && s.now.ip && !s.before?.ip && !s.now.deleting) finish({ box: s.box, waker });
            return;
        }
      });
    });
  }

  /**
   * While the box's sleep (lease epoch) runs, looks for its workspace's multipart upload in the
   * store: a key that was not there when the sleep began.
   */
  private async pollUpload(box: string, epoch: number | undefined, cancelled: () => boolean): Promise<boolean> {
    this.uploadsPolling = true;
    try {
      const prefix = this.o.store.key(poolPrefix(this.o.pool));
      const keys = async () => {
        const found = new Set<string>();
        for await (const u of this.o.store.listUploads(prefix)) found.add(`${u.key}#${u.uploadId}`);
        return found;
      };
      const before = await keys();
      while (!cancelled()) {
        const r = this.o.observer.record(box);
        if (r?.state !== 'pending' || r.epoch !== epoch) return false;
        for (const k of await keys()) if (!before.has(k)) return true;
        await delay(100);
      }
      return false;
    } catch (err) {
      this.o.log(`could not list the store's uploads: ${String(err)}`);
      return false;
    } finally {
      this.uploadsPolling = false;
    }
  }
}

/** A sleep the operator just began: the record went `pending` under a new lease of the operator's. */
function newSleep(s: Seen): boolean {
  return s.kind === 'record' && s.now.state === 'pending' && isOperator(s.now.holder) && (s.before?.state !== 'pending' || s.before.epoch !== s.now.epoch);
}

function isOperator(holder: string | undefined): boolean {
  return holder?.startsWith('chaos-operator-') ?? false;
}

/** The pid in a bridge replica's lease holder (`<host>-<pid>-<hex>`, bridge/services/box-connector.ts). */
export function bridgePid(holder: string | undefined): number | undefined {
  const m = /-(\d+)-[0-9a-f]{6}$/.exec(holder ?? '');
  return m ? Number(m[1]) : undefined;
}
