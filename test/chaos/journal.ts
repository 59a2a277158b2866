// A chaos run's journal (journal.jsonl in the run directory): every record version and pod
// change the observer saw, every write and read with the replica that served it and its answer,
// every step of the plan — one JSON line each, with its time, so that a failure can be traced
// to the calls and transitions that led to it.
import { createWriteStream, type WriteStream } from 'node:fs';

export class Journal {
  private readonly out: WriteStream;

  constructor(path: string) {
    this.out = createWriteStream(path);
  }

  add(kind: string, fields: Record<string, unknown>): void {
    this.out.write(`${JSON.stringify({ t: new Date().toISOString(), kind, ...fields })}\n`);
  }

  close(): Promise<void> {
    return new Promise((resolve) => this.out.end(resolve));
  }
}
