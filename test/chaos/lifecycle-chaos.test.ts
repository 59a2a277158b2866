// Chaos for the box lifecycle (docs/lifecycle.md, "Chaos"; issue #19): a few boxes on the real
// node are driven through sleep and wake over and over by writes through two bridge replicas
// (each its own process), while the operator and the replicas are SIGKILLed at points of the
// sleeps and wakes (a seeded plan, at least 20 kill points), the API server is frozen for a
// waking replica (through its own TCP proxy), and the store is stopped for the operator
// mid-upload (through its own proxy). Checked throughout: no box pod is deleted unless its
// record names a snapshot that is stored; acknowledged writes read back. Checked at the end:
// every box Running or Sleeping (with its snapshot stored), nothing left pending or waking, no
// leaked record, seat or slot, and every acknowledged write read back through a bridge.
//
// Run: npm run test:chaos (the local cluster up, with its real node and object store).
// Replay: CHAOS_SEED=<seed> npm run test:chaos. Knobs: CHAOS_KILL_POINTS (default 25),
// CHAOS_BUDGET_SECONDS (time for the steps, default 420), CHAOS_BOXES (default 3).
import { mkdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ANNOTATIONS, LABELS, SECRET_COMPONENTS } from '../../common/labels.js';
import { ObjectStore, ObjectStoreConfigSchema } from '../../common/object-store.js';
import { sleptBoxOf } from '../../common/box-pod.js';
import { stateOf } from '../../common/box-lease.js';
import { ON_REAL_NODE } from '../support/bridge.js';
import { realNodeAvailable } from '../support/cluster.js';
import { core, kc } from '../support/lifecycle.js';
import { localObjectStore } from '../support/object-store.js';
import { Pools, installCrd, uniqueName } from '../support/operator.js';
import { Journal } from './journal.js';
import { Observer, snapshotStored } from './observer.js';
import { describeStep, makePlan } from './plan.js';
import { Fleet } from './processes.js';
import { Rng, chaosSeed } from './rng.js';
import { Scheduler } from './scheduler.js';
import { Workload, call, delay, type ChaosBox } from './workload.js';

const LEASE_SECONDS = 6;
const SLEEP_AFTER_SECONDS = 3;
const SMALL = { cpu: 0.25, memory: 256 };
const BOXES = Number(process.env.CHAOS_BOXES ?? 3);
const KILL_POINTS = Number(process.env.CHAOS_KILL_POINTS ?? 25);
const BUDGET_MS = Number(process.env.CHAOS_BUDGET_SECONDS ?? 420) * 1000;
/** Three 8 MiB parts: a sleep's upload is a multipart upload the run can see in the store, streaming for a second or so. */
const FILL_BYTES = 24 * 1024 * 1024;

const realNode = await realNodeAvailable(kc);
const storeSettings = await localObjectStore();
const skipReason = !realNode.available ? `no real node: ${realNode.reason}` : !storeSettings.available ? `no object store: ${storeSettings.reason}` : undefined;
if (skipReason) console.warn(`SKIPPED lifecycle chaos: ${skipReason}`);
const suite = skipReason ? describe.skip : describe;

const seed = chaosSeed();
const t0 = Date.now();
const lines: string[] = [];
const log = (line: string) => {
  const stamped = `[chaos +${((Date.now() - t0) / 1000).toFixed(1)}s] ${line}`;
  lines.push(stamped);
  process.stderr.write(`${stamped}\n`);
};

suite('box lifecycle under chaos', () => {
  const runDir = join(tmpdir(), `sandbox-bridge-chaos-${seed}-${Date.now()}`);
  let pools: Pools;
  let fleet: Fleet;
  let observer: Observer;
  let store: ObjectStore;
  let workload: Workload;
  let scheduler: Scheduler;
  let pool: { name: string; ns: string };
  let journal: Journal;
  const boxes: ChaosBox[] = [];

  beforeAll(async () => {
    if (!storeSettings.available) return;
    mkdirSync(runDir, { recursive: true });
    journal = new Journal(join(runDir, 'journal.jsonl'));
    log(`CHAOS_SEED=${seed} (replay: CHAOS_SEED=${seed} npm run test:chaos); logs in ${runDir}; store prefix ${storeSettings.env.OBJECT_STORE_PREFIX}`);
    await installCrd(kc);
    pools = new Pools(kc, uniqueName('chaos'));
    fleet = new Fleet({ kc, runDir, shard: pools.shard, leaseName: uniqueName('chaos-lease'), storeEnv: storeSettings.env, leaseSeconds: LEASE_SECONDS, bridges: 2 });
    await fleet.startOperatorFirst();
    pool = await pools.createReady({ maxBoxes: 10, box: ON_REAL_NODE.box, idle: { sleepAfterSeconds: SLEEP_AFTER_SECONDS } });
    fleet.pool = pool;
    await fleet.startBridges();
    store = new ObjectStore(ObjectStoreConfigSchema.parse(storeSettings.env));
    observer = new Observer({ kc, ns: pool.ns, pool: pool.name, store, log, journal, operatorUp: () => fleet.operator !== undefined });
    await observer.start();
    const first = fleet.up()[0]!;
    for (let i = 0; i < BOXES; i++) {
      const made = await call(first, 'POST', '/boxes', { body: { sessionId: `chaos-${seed}-${i}`, ...SMALL }, timeoutMs: 120_000 });
      if (made?.status !== 201) throw new Error(`could not create box ${i}: ${made?.status} ${made?.text}`);
      const id = made.json.box_id as string;
      const fill = await call(first, 'POST', `/boxes/${id}/exec`, { body: { command: `head -c ${FILL_BYTES} /dev/urandom > fill.bin && sha256sum fill.bin | cut -c1-64` }, timeoutMs: 120_000 });
      if (fill?.status !== 200 || fill.json.exit_code !== 0) throw new Error(`could not fill box ${id}: ${fill?.text}`);
      boxes.push({ id, index: i, fillSha: (fill.json.stdout as string).trim(), acked: new Map(), ackedBy: new Map(), next: 0, refused: new Map(), unanswered: 0 });
    }
    log(`pool ${pool.name} (namespace ${pool.ns}), boxes ${boxes.map((b) => b.id).join(', ')}, bridges pids ${fleet.up().map((b) => b.pid).join(', ')}`);
  }, 300_000);

  afterAll(async () => {
    if (!storeSettings.available) return;
    await workload?.stop();
    await scheduler?.stop();
    if (observer) observer.checking = false;
    const bridge = fleet?.up()[0];
    for (const box of boxes) if (bridge) await call(bridge, 'DELETE', `/boxes/${box.id}`, { timeoutMs: 30_000 });
    observer?.stop();
    await fleet?.stop();
    await pools?.cleanup();
    if (store) {
      // This run's snapshots and whatever its killed sleeps left in the store.
      const prefix = storeSettings.env.OBJECT_STORE_PREFIX!;
      const keys: string[] = [];
      for await (const o of store.list(`${prefix}/`)) keys.push(o.key);
      await store.delete(keys).catch(() => undefined);
      for await (const u of store.listUploads(`${prefix}/`)) await store.abortUpload(u.key, u.uploadId).catch(() => undefined);
      store.close();
    }
    writeFileSync(join(runDir, 'run.log'), `${lines.join('\n')}\n`);
    await journal?.close();
  }, 180_000);

  test(`SIGKILLs at points of sleep and wake, a frozen API server, a stopped store: nothing acknowledged is lost, nothing leaks`, async () => {
    const rng = new Rng(seed);
    const plan = makePlan(rng.fork(), KILL_POINTS);
    log(`plan (${plan.filter((s) => s.kind === 'kill').length} kill points):\n  ${plan.map(describeStep).join('\n  ')}`);
    workload = new Workload({ fleet, boxes, rng: rng.fork(), log, journal });
    scheduler = new Scheduler({ fleet, observer, workload, boxes, store, pool: pool.name, rng: rng.fork(), deadline: Date.now() + BUDGET_MS, log, journal });
    const started = Date.now();
    workload.start();
    await scheduler.run(plan);
    await workload.stop();
    await scheduler.stop();
    const chaosSeconds = Math.round((Date.now() - started) / 1000);

    // ---- the end state chaos left ----
    await fleet.heal();
    log('chaos over: every process up, every proxy passing; waiting for every box to settle');
    const settled = await waitSettled(observer, boxes, 120_000);
    const problems: string[] = [];
    if (!settled) problems.push(`boxes still pending or waking 120 s after the chaos: ${boxes.map((b) => `${b.id}=${observer.record(b.id)?.state}`).join(', ')}`);
    // What the API server and the store show settles too (a woken pod's phase follows its
    // boxd by a moment): looked at again for a while before a difference counts.
    let end = await endState(pool.ns, pool.name, boxes, store);
    for (let i = 0; i < 10 && end.problems.length; i++) {
      await delay(1000);
      end = await endState(pool.ns, pool.name, boxes, store);
    }
    problems.push(...end.problems);
    log(`end state: ${end.summary}`);

    // ---- every acknowledged write, read back through the bridges ----
    for (const box of boxes) {
      const via = fleet.up()[box.index % fleet.up().length]!;
      const read = await workload.readBack(box, via);
      problems.push(...read.problems.map((p) => explain(p, box, observer)));
      log(`read back ${box.acked.size} acknowledged writes of ${box.id} via bridge ${via.index}: ${read.problems.length ? `${read.problems.length} problems` : 'all there'}`);
    }
    // Deletion checks still open are given their time.
    for (let i = 0; i < 100 && observer.pendingChecks().length; i++) await delay(200);
    const openChecks = observer.pendingChecks().length;

    // ---- the report ----
    const kills = scheduler.results.filter((r) => r.step.kind === 'kill' && r.outcome === 'done');
    const sleepKills = kills.filter((r) => r.step.kind === 'kill' && r.step.phase.startsWith('sleep:'));
    const deletions = observer.deletions;
    const byState = new Map<string, number>();
    for (const d of deletions) byState.set(`${d.state}`, (byState.get(`${d.state}`) ?? 0) + 1);
    const report = [
      `seed ${seed}; ${chaosSeconds} s of chaos, ${Math.round((Date.now() - t0) / 1000)} s in all; logs in ${runDir}`,
      `kill points done: ${kills.length} (sleep ${sleepKills.length}, wake ${kills.length - sleepKills.length}); ` +
        `operator ${kills.filter((r) => r.victim?.startsWith('operator')).length}, bridge 0 ${kills.filter((r) => r.victim?.startsWith('bridge 0')).length}, bridge 1 ${kills.filter((r) => r.victim?.startsWith('bridge 1')).length}; ` +
        `missed ${scheduler.results.filter((r) => r.outcome === 'missed').length}, not run ${scheduler.results.filter((r) => r.outcome === 'not run').length}`,
      `disturbances done: ${scheduler.results.filter((r) => r.step.kind !== 'kill' && r.outcome === 'done').length} of ${scheduler.results.filter((r) => r.step.kind !== 'kill').length}`,
      `writes acknowledged ${boxes.reduce((n, b) => n + b.acked.size, 0)}, refused ${boxes.reduce((n, b) => n + [...b.refused.values()].reduce((a, c) => a + c, 0), 0)} (${[...new Set(boxes.flatMap((b) => [...b.refused.keys()]))].join(', ')}), unanswered ${boxes.reduce((n, b) => n + b.unanswered, 0)}`,
      `pod deletions checked: ${deletions.length} (record at the delete: ${[...byState].map(([s, n]) => `${s} ${n}`).join(', ')}), violations ${deletions.filter((d) => d.verdict === 'violation').length}, undecided ${openChecks}`,
      `unplanned exits: ${fleet.unplanned.length ? fleet.unplanned.join('; ') : 'none'}`,
      ...scheduler.results.map((r) => `  ${describeStep(r.step)}: ${r.outcome}${r.box ? ` ${r.box}` : ''}${r.at !== undefined ? ` @${r.at}s` : ''}${r.victim ? ` ${r.victim}` : ''}${r.state ? `; ${r.state}` : ''}${r.settledMs !== undefined ? `; settled in ${(r.settledMs / 1000).toFixed(1)} s` : ''}${r.note ? `; ${r.note}` : ''}`),
      ...workload.slow.map((s) => `  slow: ${s}`),
      ...workload.notes.map((s) => `  note: ${s}`),
      ...observer.notes.map((s) => `  note: ${s}`),
    ];
    log(`REPORT\n${report.join('\n')}`);
    writeFileSync(join(runDir, 'report.json'), JSON.stringify({ seed, chaosSeconds, results: scheduler.results, deletions, problems, violations: [...observer.violations, ...workload.violations] }, null, 2));

    // A process that dies by itself is a defect too (seed 245881085: a replica's HTTP/2 crash).
    expect({ problems, violations: [...observer.violations, ...workload.violations], openChecks, unplannedExits: fleet.unplanned }).toEqual({
      problems: [],
      violations: [],
      openChecks: 0,
      unplannedExits: [],
    });
    if (KILL_POINTS >= 20) expect(kills.length).toBeGreaterThanOrEqual(20);
  });
});

/**
 * A missing write explained: which replica acknowledged it, when, and what the box's record
 * said at that moment (e.g. a wake under way by another replica).
 */
function explain(problem: string, box: ChaosBox, observer: Observer): string {
  const path = /acknowledged write (\S+)/.exec(problem)?.[1];
  const by = path ? box.ackedBy.get(path) : undefined;
  if (!by) return problem;
  const record = (observer.history.get(box.id) ?? []).filter((v) => v.at <= by.at).at(-1);
  const lease = record?.holder ? `, lease epoch ${record.epoch} held by ${record.holder}` : '';
  return `${problem} (acknowledged by bridge ${by.bridge}, pid ${by.pid}, at ${new Date(by.at).toISOString()}, when the record was ${record?.state ?? 'running'}${lease})`;
}

/** Until no box's record is pending or waking (leases resumed, wakes done). */
async function waitSettled(observer: Observer, boxes: ChaosBox[], timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (boxes.every((b) => {
      const s = observer.record(b.id)?.state;
      return s !== 'pending' && s !== 'waking';
    })) return true;
    await delay(250);
  }
  return false;
}

/**
 * The end state from the API server and the store: each box Running (one live pod, a plain
 * record) or Sleeping (no live pod, its record naming a stored snapshot), no lease left, no
 * record but the boxes', each seat owned by a live record and each box holding one.
 */
async function endState(ns: string, pool: string, boxes: ChaosBox[], store: ObjectStore): Promise<{ problems: string[]; summary: string }> {
  const problems: string[] = [];
  const secrets = (await core.listNamespacedSecret({ namespace: ns })).items;
  const pods = (await core.listNamespacedPod({ namespace: ns })).items;
  const records = secrets.filter((s) => s.metadata?.labels?.[LABELS.component] === SECRET_COMPONENTS.record);
  const seats = secrets.filter((s) => s.metadata?.labels?.[LABELS.component] === SECRET_COMPONENTS.seat);
  const states: string[] = [];
  const heldSeats: number[] = [];
  for (const box of boxes) {
    const record = records.find((r) => r.metadata?.name === box.id);
    const live = pods.filter((p) => p.metadata?.labels?.[LABELS.boxId] === box.id && !p.metadata?.deletionTimestamp);
    if (!record) {
      problems.push(`${box.id}: its record is gone`);
      continue;
    }
    const state = stateOf(record);
    if (record.metadata?.annotations?.[ANNOTATIONS.lease]) problems.push(`${box.id}: a lease is left on its record`);
    if (state === undefined) {
      states.push(`${box.id} Running`);
      if (live.length !== 1 || live[0]!.status?.phase !== 'Running') problems.push(`${box.id}: Running with ${live.length} live pods (${live.map((p) => p.status?.phase).join(', ')})`);
      const seat = Number(live[0]?.metadata?.labels?.[LABELS.seat]);
      if (Number.isInteger(seat)) heldSeats.push(seat);
    } else if (state === 'asleep') {
      states.push(`${box.id} Sleeping`);
      if (live.length) problems.push(`${box.id}: Sleeping with ${live.length} live pods`);
      const snapshot = record.metadata?.annotations?.[ANNOTATIONS.sleepSnapshot];
      const stored = snapshot ? await snapshotStored(store, pool, snapshot) : { ok: false as const, why: 'none named' };
      if (!stored.ok) problems.push(`${box.id}: Sleeping, but its snapshot ${snapshot} is not stored (${stored.why})`);
      const seat = sleptBoxOf(record)?.seat;
      if (seat !== undefined) heldSeats.push(seat);
    } else {
      states.push(`${box.id} ${state}`);
      problems.push(`${box.id}: left ${state}${state === 'failed' ? ` (${record.metadata?.annotations?.[ANNOTATIONS.failure]})` : ''}`);
    }
  }
  // Leaked slots: a record that is no box of the run's; leaked seats: one no live record owns.
  for (const r of records) if (!boxes.some((b) => b.id === r.metadata?.name)) problems.push(`leaked record ${r.metadata?.name} (${stateOf(r) ?? 'running'})`);
  const recordUids = new Set(records.map((r) => r.metadata?.uid));
  for (const s of seats) {
    const owner = s.metadata?.ownerReferences?.find((o) => o.kind === 'Secret');
    if (!owner || !recordUids.has(owner.uid)) problems.push(`leaked seat ${s.metadata?.name} (owner ${owner?.name ?? 'none'})`);
  }
  if (seats.length !== boxes.length) problems.push(`${seats.length} seats for ${boxes.length} boxes`);
  if (new Set(heldSeats).size !== boxes.length) problems.push(`the boxes hold seats ${heldSeats.join(', ')}`);
  const strays = pods.filter((p) => !p.metadata?.labels?.[LABELS.warm] && !boxes.some((b) => b.id === p.metadata?.labels?.[LABELS.boxId]));
  for (const p of strays) problems.push(`stray pod ${p.metadata?.name}`);
  return { problems, summary: `${states.join(', ')}; ${records.length} records, ${seats.length} seats, ${pods.length} pods` };
}
