// The plan of a chaos run, all of it from the seed: which process is SIGKILLed at which point of
// a sleep or a wake (docs/lifecycle.md, transitions 2-11), after what delay, for how long it
// stays down; and where the API server is frozen for the waking replica and the store stopped
// for the sleeping operator.
import type { Rng } from './rng.js';

/** Points of a sleep (the operator's) and of a wake (a bridge replica's) a kill is aimed at. */
export type Phase =
  /** The record just went `pending` (lease taken; process list, fence, pod read under way). */
  | 'sleep:pending'
  /** The workspace's multipart upload is in the store (the fence is up, the snapshot streams). */
  | 'sleep:uploading'
  /** The record names the snapshot (the pod's guarded delete is next). */
  | 'sleep:named'
  /** The pod got its deletionTimestamp while the record is still `pending` (release to `asleep` is next). */
  | 'sleep:deleting'
  /** A write through a replica meets the sleep's fence; that replica dies while the write waits. */
  | 'sleep:fence-met'
  /** The record just went `waking` (lease taken by a replica; the pod not made yet). */
  | 'wake:waking'
  /** The waking replica's new pod exists. */
  | 'wake:pod-made'
  /** The new pod has its IP: boxd's start and the restore are under way. */
  | 'wake:restoring';

export interface KillPoint {
  kind: 'kill';
  phase: Phase;
  /** operator; a bridge replica chosen by the run (fence-met); the replica holding the wake's lease (waker). */
  target: 'operator' | 'bridge' | 'waker';
  /** From the moment the phase is seen to the SIGKILL. */
  delayMs: number;
  /** sleep:fence-met: from the moment the sleep is seen to the write sent through the replica. */
  writeAfterMs: number;
  /** How long the killed process stays down before it is started again. */
  downMs: number;
}

export interface Disturbance {
  kind: 'freeze-api' | 'stop-store';
  /** freeze-api: the waking replica's API traffic stalls; stop-store: the operator's store connections are refused (refuse) or stall (freeze). */
  mode: 'freeze' | 'refuse';
  seconds: number;
}

export type Step = (KillPoint | Disturbance) & { n: number };

/** How many kill points of each kind a full plan has (25): over sleep and wake, every process. */
const KILLS: Array<[Phase, KillPoint['target'], number]> = [
  ['sleep:pending', 'operator', 3],
  ['sleep:uploading', 'operator', 4],
  ['sleep:named', 'operator', 2],
  ['sleep:deleting', 'operator', 2],
  ['sleep:fence-met', 'bridge', 3],
  ['wake:waking', 'waker', 3],
  ['wake:pod-made', 'waker', 3],
  ['wake:restoring', 'waker', 3],
  ['wake:waking', 'operator', 2],
];

export function makePlan(rng: Rng, killPoints: number): Step[] {
  const kills: KillPoint[] = [];
  for (const [phase, target, count] of KILLS) {
    for (let i = 0; i < count; i++) {
      const delayMs =
        phase === 'sleep:pending' ? rng.int(0, 300)
        : phase === 'sleep:uploading' ? rng.int(0, 500)
        : phase === 'sleep:fence-met' ? rng.int(50, 600)
        : phase === 'wake:waking' ? rng.int(0, 200)
        : phase === 'wake:pod-made' || phase === 'wake:restoring' ? rng.int(0, 400)
        : 0;
      // Now and then down longer than a box lease: the leases it held expire before it is back,
      // and the others (the operator, the other replica) take them over.
      const downMs = rng.next() < 0.25 ? rng.int(7000, 9000) : rng.int(200, 2500);
      kills.push({ kind: 'kill', phase, target, delayMs, writeAfterMs: phase === 'sleep:fence-met' ? rng.int(0, 300) : 0, downMs });
    }
  }
  rng.shuffle(kills);
  const steps: Array<KillPoint | Disturbance> = kills.slice(0, killPoints);
  // The API server frozen for a waking replica, shorter and longer than a box lease; the store
  // stopped for the operator mid-upload, refusing and stalling.
  const disturbances: Disturbance[] = [
    { kind: 'freeze-api', mode: 'freeze', seconds: 3 },
    { kind: 'freeze-api', mode: 'freeze', seconds: 10 },
    { kind: 'stop-store', mode: 'refuse', seconds: 6 },
    { kind: 'stop-store', mode: 'freeze', seconds: 8 },
  ];
  for (const d of disturbances) steps.splice(rng.int(1, steps.length), 0, d);
  return steps.map((s, i) => ({ ...s, n: i + 1 }));
}

export function describeStep(s: Step): string {
  if (s.kind === 'kill') {
    const extra = s.phase === 'sleep:fence-met' ? `write after ${s.writeAfterMs} ms, ` : '';
    return `#${s.n} SIGKILL ${s.target} at ${s.phase} (${extra}+${s.delayMs} ms, down ${s.downMs} ms)`;
  }
  return `#${s.n} ${s.kind === 'freeze-api' ? 'API server frozen for the waking replica' : `store ${s.mode === 'refuse' ? 'refusing' : 'stalled'} for the operator mid-upload`} (${s.seconds} s)`;
}
