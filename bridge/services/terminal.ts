// Interactive terminals in a box: boxd runs a shell on a PTY and hands back a connection
// carrying frames both ways; the HTTP layer bridges it to the caller's WebSocket.
import type { Duplex } from 'node:stream';
import type { BoxdClient } from '../../common/boxd-client.js';
import type { BoxConnector } from './box-connector.js';

export class TerminalService {
  constructor(private readonly deps: { connector: BoxConnector; boxd: BoxdClient }) {}

  async open(boxId: string, size: { cols: number; rows: number }): Promise<{ socket: Duplex; head: Buffer }> {
    return this.deps.connector.call(boxId, ({ target, signal }) => this.deps.boxd.pty(target, size, signal));
  }
}
