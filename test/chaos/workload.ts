// The work a chaos run puts through the bridges while it kills them: each box gets writes in
// bursts (a file PUT, or an exec that writes a file) through a replica picked at random, then
// idles for a random while — long enough, often, for the operator to put it to sleep, so the
// next burst wakes it. Every write answered 200 is remembered with its content (each goes to a
// path of its own, so none overwrites another): that is what must never be lost. Reads of what
// was acknowledged, during the run and at its end, go through the bridges too (waking the box).
import { randomBytes } from 'node:crypto';
import { TEST_TOKEN } from '../support/bridge.js';
import { checkAnswer } from '../support/contract.js';
import type { Journal } from './journal.js';
import type { BridgeProcess, Fleet } from './processes.js';
import type { Rng } from './rng.js';

export interface ChaosBox {
  id: string;
  index: number;
  /** sha256 of the large file made at create (the sleep's snapshot streams it). */
  fillSha: string;
  /** path -> content of every write answered 200. */
  acked: Map<string, string>;
  /** path -> which replica answered it 200, and when (ms). */
  ackedBy: Map<string, { bridge: number; pid: number; at: number }>;
  next: number;
  /** Answers that were not 200, by status and error type; calls with no answer (a killed replica, the deadline). */
  refused: Map<string, number>;
  unanswered: number;
}

export interface Answer {
  status: number;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  json: any;
  text: string;
  ms: number;
}

/** One call to a bridge replica; undefined when it gave no answer (killed, or past the deadline). */
export async function call(
  bridge: Pick<BridgeProcess, 'url'>,
  method: string,
  path: string,
  o: { body?: unknown; headers?: Record<string, string>; timeoutMs?: number; contract?: (problem: string) => void } = {},
): Promise<Answer | undefined> {
  const started = performance.now();
  const raw = typeof o.body === 'string';
  let res: Response;
  let text: string;
  try {
    res = await fetch(`${bridge.url}/api/v1${path}`, {
      method,
      headers: {
        authorization: `Bearer ${TEST_TOKEN}`,
        ...(o.body !== undefined && !raw ? { 'content-type': 'application/json' } : {}),
        ...o.headers,
      },
      ...(o.body === undefined ? {} : { body: raw ? (o.body as string) : JSON.stringify(o.body) }),
      signal: AbortSignal.timeout(o.timeoutMs ?? 90_000),
    });
    text = await res.text();
  } catch {
    return undefined;
  }
  try {
    checkAnswer(method, path, res.status, res.headers.get('content-type'), text);
  } catch (err) {
    o.contract?.(`${method} ${path}: ${(err as Error).message}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json, text, ms: Math.round(performance.now() - started) };
}

export class Workload {
  readonly violations: string[] = [];
  readonly notes: string[] = [];
  /** Calls that took longer than this are listed in the report. */
  readonly slow: string[] = [];
  private stopped = false;
  private loops: Promise<void>[] = [];

  constructor(
    private readonly o: {
      fleet: Fleet;
      boxes: ChaosBox[];
      rng: Rng;
      log: (line: string) => void;
      journal?: Journal;
    },
  ) {}

  start(): void {
    this.loops = this.o.boxes.map((box) => this.writer(box, this.o.rng.fork()));
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all(this.loops);
  }

  readonly contract = (problem: string) => {
    this.violations.push(`answer outside the API contract: ${problem}`);
  };

  /** A replica up now, picked at random (waits while none is). */
  async pick(rng: Rng): Promise<BridgeProcess> {
    for (;;) {
      const up = this.o.fleet.up();
      if (up.length) return rng.pick(up);
      await delay(100);
    }
  }

  private async writer(box: ChaosBox, rng: Rng): Promise<void> {
    while (!this.stopped) {
      const burst = rng.int(1, 4);
      for (let k = 0; k < burst && !this.stopped; k++) {
        await this.write(box, rng);
        await delay(rng.int(50, 400));
      }
      // Idle: over the pool's 3 s, the box is put to sleep (and the next burst wakes it); under
      // it, a burst may land while a sleep is starting, on its fence.
      const idle = rng.int(300, 9000);
      for (const until = Date.now() + idle; Date.now() < until && !this.stopped; ) await delay(100);
    }
  }

  /** One write to a path of its own; remembered when acknowledged. */
  async write(box: ChaosBox, rng: Rng, via?: BridgeProcess): Promise<'acked' | 'refused' | 'unanswered'> {
    const n = box.next++;
    const path = `w/${n}.txt`;
    const content = `${box.id} ${n} ${randomBytes(6).toString('hex')}`;
    const bridge = via ?? (await this.pick(rng));
    const byExec = rng.next() < 0.3;
    const sent = new Date().toISOString();
    const answer = byExec
      ? await call(bridge, 'POST', `/boxes/${box.id}/exec`, { body: { command: `mkdir -p w && printf '%s' '${content}' > ${path}` }, contract: this.contract })
      : await call(bridge, 'PUT', `/boxes/${box.id}/files?path=${path}`, { body: content, headers: { 'content-type': 'application/octet-stream' }, contract: this.contract });
    const acked = answer?.status === 200 && (!byExec || answer.json?.exit_code === 0);
    this.o.journal?.add('write', {
      box: box.id, path, sent, by: byExec ? 'exec' : 'put', bridge: bridge.index, pid: bridge.pid, status: answer?.status ?? 'no answer', ms: answer?.ms, acked,
      ...(answer && !acked ? { answer: answer.text.slice(0, 300) } : {}),
    });
    if (!answer) {
      box.unanswered++;
      return 'unanswered';
    }
    if (answer.ms > 20_000) this.slow.push(`${byExec ? 'exec' : 'PUT'} ${path} to ${box.id} via bridge ${bridge.index}: ${answer.status} in ${answer.ms} ms`);
    if (acked) {
      box.acked.set(path, content);
      box.ackedBy.set(path, { bridge: bridge.index, pid: bridge.pid, at: Date.now() });
      return 'acked';
    }
    const key = `${answer.status} ${answer.json?.error?.type ?? (byExec ? `exit ${answer.json?.exit_code}` : '')}`.trim();
    box.refused.set(key, (box.refused.get(key) ?? 0) + 1);
    // A box answered as gone (404), ended or failed (409 telling the caller to make a new box):
    // none of the run's boxes is ever deleted or lost, so the caller would abandon a live box.
    if (answer.status === 404 || (answer.status === 409 && /create a new box/.test(answer.json?.error?.message ?? ''))) {
      this.violations.push(`write ${path} to ${box.id} via bridge ${bridge.index}: ${answer.status} ${answer.json?.error?.message}`);
    } else if (answer.status !== 503 && answer.status !== 409) {
      this.notes.push(`write ${path} to ${box.id} via bridge ${bridge.index}: ${answer.status} ${answer.text.slice(0, 200)}`);
    }
    return 'refused';
  }

  /**
   * Reads back some acknowledged writes of a box through a replica: a wrong or missing content is
   * a violation; no answer or a 503 proves nothing (tried again at the end).
   */
  async spotCheck(box: ChaosBox, rng: Rng, count: number): Promise<{ checked: number; wrong: number }> {
    const paths = rng.shuffle([...box.acked.keys()]).slice(0, count);
    let checked = 0;
    let wrong = 0;
    for (const path of paths) {
      const bridge = await this.pick(rng);
      const sent = new Date().toISOString();
      const answer = await call(bridge, 'GET', `/boxes/${box.id}/files?path=${path}`, { contract: this.contract });
      this.o.journal?.add('read', { box: box.id, path, sent, bridge: bridge.index, pid: bridge.pid, status: answer?.status ?? 'no answer', ms: answer?.ms, ok: answer?.json?.content === box.acked.get(path) });
      if (!answer || answer.status === 503) continue;
      checked++;
      if (answer.status !== 200 || answer.json?.content !== box.acked.get(path)) {
        wrong++;
        this.violations.push(
          `acknowledged write ${path} of ${box.id} read back via bridge ${bridge.index} at ${new Date().toISOString()}: ${answer.status} ${answer.status === 200 ? JSON.stringify(answer.json?.content) : answer.text.slice(0, 200)} (expected ${JSON.stringify(box.acked.get(path))})`,
        );
      }
    }
    return { checked, wrong };
  }

  /**
   * Every acknowledged write of the box, read back with one exec through a replica (it wakes a
   * sleeping box), and the large file's digest. Answers what is missing or different.
   */
  async readBack(box: ChaosBox, via: BridgeProcess): Promise<{ problems: string[]; answered: boolean }> {
    const command = 'sha256sum fill.bin | cut -c1-64; cd w 2>/dev/null && for f in *.txt; do printf "%s\\t%s\\n" "$f" "$(cat "$f")"; done';
    let answer: Answer | undefined;
    for (let attempt = 0; attempt < 4; attempt++) {
      answer = await call(via, 'POST', `/boxes/${box.id}/exec`, { body: { command }, timeoutMs: 120_000, contract: this.contract });
      if (answer?.status === 200) break;
      await delay(2000);
    }
    if (answer?.status !== 200) return { answered: false, problems: [`${box.id}: no answer to the read-back (${answer?.status} ${answer?.text.slice(0, 200)})`] };
    const lines = (answer.json.stdout as string).split('\n');
    const problems: string[] = [];
    if (lines[0] !== box.fillSha) problems.push(`${box.id}: fill.bin digest ${lines[0]} != ${box.fillSha}`);
    const found = new Map<string, string>();
    for (const line of lines.slice(1)) {
      const tab = line.indexOf('\t');
      if (tab > 0) found.set(`w/${line.slice(0, tab)}`, line.slice(tab + 1));
    }
    for (const [path, content] of box.acked) {
      const got = found.get(path);
      if (got === undefined) problems.push(`${box.id}: acknowledged write ${path} is missing`);
      else if (got !== content) problems.push(`${box.id}: acknowledged write ${path} holds ${JSON.stringify(got)}, not ${JSON.stringify(content)}`);
    }
    if (answer.json.stdout_truncated) problems.push(`${box.id}: the read-back's output was truncated`);
    return { answered: true, problems };
  }
}

export function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
