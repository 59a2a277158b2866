// Background processes in a box, through boxd: they live in boxd, so every replica sees the same
// list, status and output (replayed from any offset, then followed). Output is relayed with
// backpressure both ways (the sink's promise is awaited before the next frame is read, so a slow
// caller stops the reads from boxd, and boxd keeps the output in its ring), holding at most what
// the relay reserved of the replica's byte budget.
import { BridgeError } from '../../common/errors.js';
import type { BoxdClient, BoxdExit, BoxdProcess } from '../../common/boxd-client.js';
import { FRAME, frameJson, readFrames } from '../boxd/frames.js';
import type { ProcessOutputQuery, StartProcessRequest } from '../schemas.js';
import type { BoxConnector } from './box-connector.js';
import { resolvePath } from './box-paths.js';
import { HOLD_BYTES, type ByteBudget } from './byte-budget.js';
import type { OutputStream } from './exec.js';

export interface ProcessServiceDeps {
  connector: BoxConnector;
  boxd: BoxdClient;
  budget: ByteBudget;
  /** Live background processes (and terminals) per box. */
  maxProcessesPerBox: number;
}

export type ProcessEvent =
  | { type: 'start'; offset: number; dropped: number }
  | { type: OutputStream; data: Buffer; offset: number }
  | { type: 'exit'; exit: BoxdExit };

export class ProcessService {
  constructor(private readonly deps: ProcessServiceDeps) {}

  async start(boxId: string, req: StartProcessRequest): Promise<BoxdProcess> {
    const cwd = resolvePath(req.workdir, 'workdir');
    return this.deps.connector.call(boxId, ({ target, signal }) =>
      this.deps.boxd.startProcess(
        target,
        {
          command: req.command,
          cwd,
          ...(req.env ? { env: req.env } : {}),
          ...(req.tag ? { tag: req.tag } : {}),
          max_processes: this.deps.maxProcessesPerBox,
        },
        signal,
      ),
    );
  }

  async list(boxId: string) {
    return this.deps.connector.call(boxId, ({ target, signal }) => this.deps.boxd.listProcesses(target, signal));
  }

  async get(boxId: string, processId: string) {
    return this.deps.connector.call(boxId, ({ target, signal }) => this.deps.boxd.getProcess(target, processId, signal));
  }

  async stdin(boxId: string, processId: string, data: Buffer, eof: boolean) {
    return this.deps.connector.call(boxId, ({ target, signal }) => this.deps.boxd.processStdin(target, processId, data, eof, signal));
  }

  async signal(boxId: string, processId: string, sig: string) {
    return this.deps.connector.call(boxId, ({ target, signal }) => this.deps.boxd.signalProcess(target, processId, sig, signal));
  }

  /**
   * Output from `since` (replay), then, with follow, as it comes until the process exits or the
   * caller goes away. Events carry byte offsets, so a caller can resume where it stopped.
   */
  async output(boxId: string, processId: string, q: ProcessOutputQuery, sink: (e: ProcessEvent) => void | Promise<void>, signal?: AbortSignal) {
    const hold = this.deps.budget.reserve(HOLD_BYTES.frames, 'output', 'a process output stream');
    try {
      await this.relay(boxId, processId, q, sink, signal);
    } finally {
      hold.release();
    }
  }

  private async relay(boxId: string, processId: string, q: ProcessOutputQuery, sink: (e: ProcessEvent) => void | Promise<void>, signal?: AbortSignal) {
    await this.deps.connector.call(
      boxId,
      async ({ target, signal: boxSignal }) => {
        const res = await this.deps.boxd.processOutput(target, processId, { since: q.since, follow: q.follow }, boxSignal);
        let offset = q.since;
        try {
          for await (const frame of readFrames(res)) {
            if (frame.type === FRAME.start) {
              const start = frameJson<{ offset: number; dropped: number }>(frame);
              offset = start.offset;
              await sink({ type: 'start', ...start });
            } else if (frame.type === FRAME.stdout || frame.type === FRAME.stderr) {
              await sink({ type: frame.type === FRAME.stdout ? 'stdout' : 'stderr', data: frame.payload, offset });
              offset += frame.payload.length;
            } else if (frame.type === FRAME.exit) {
              await sink({ type: 'exit', exit: frameJson<BoxdExit>(frame) });
            }
          }
        } catch (err) {
          if (boxSignal.aborted) throw boxSignal.reason;
          if (err instanceof BridgeError) throw err;
          throw new BridgeError('cluster_unavailable', `box ${boxId} stopped answering while streaming output`, { headers: { 'Retry-After': '5' } });
        }
      },
      signal,
    );
  }
}
