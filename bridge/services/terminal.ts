// Interactive terminals in a box: boxd runs a shell on a PTY and hands back a connection
// carrying frames both ways; the HTTP layer bridges it to the caller's WebSocket. A terminal
// holds its share of the replica's byte budget while it is open (refused with 503 when none is
// left): the relay keeps what it buffers under that by pausing whichever side is ahead.
import type { Duplex } from 'node:stream';
import type { BoxdClient } from '../../common/boxd-client.js';
import type { BoxConnector } from './box-connector.js';
import { HOLD_BYTES, type ByteBudget } from './byte-budget.js';

export interface OpenTerminal {
  socket: Duplex;
  head: Buffer;
  /** Gives the terminal's memory back; when the terminal is closed. */
  release(): void;
}

export class TerminalService {
  constructor(private readonly deps: { connector: BoxConnector; boxd: BoxdClient; budget: ByteBudget }) {}

  async open(boxId: string, size: { cols: number; rows: number }): Promise<OpenTerminal> {
    const hold = this.deps.budget.reserve(HOLD_BYTES.terminal, 'terminal', 'a terminal');
    try {
      const pty = await this.deps.connector.call(boxId, ({ target, signal }) => this.deps.boxd.pty(target, size, signal));
      return { ...pty, release: hold.release };
    } catch (err) {
      hold.release();
      throw err;
    }
  }
}
