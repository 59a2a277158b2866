// GET /api/v1/boxes/:id/pty as a WebSocket: binary frames are terminal bytes both ways; text
// frames from the caller are JSON controls ({"type":"resize","cols","rows"}); when the shell
// exits the bridge sends {"type":"exit","exit_code"} and closes with 1000. Upgrades bypass
// Express, so authentication and rate limiting are applied here explicitly. The relay applies
// backpressure both ways (a slow side pauses the other), so a box flooding its terminal, or a
// caller pasting faster than the shell reads, never grows the replica's memory.
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { WebSocketServer, type RawData, type WebSocket } from 'ws';
import { BridgeError } from '../../common/errors.js';
import { FRAME, FrameDecoder, encodeFrame, frameJson } from '../boxd/frames.js';
import { BEARER_PROTOCOL_PREFIX, PTY_PROTOCOL, PtyControl, PtyQuery, describeIssues } from '../schemas.js';
import type { TerminalService } from '../services/terminal.js';

/** The one upgrade route (GET /api/v1/boxes/{id}/pty); everything else is served by Express. */
export const PTY_PATH = /^\/api\/v1\/boxes\/([^/]+)\/pty$/;

export interface TerminalUpgradeDeps {
  terminals: TerminalService;
  /** Rejects with a BridgeError (401, 403, 429) unless the request may proceed. */
  admit: (req: IncomingMessage, token: string | undefined) => Promise<void>;
  log: Logger;
}

export function terminalUpgrades(deps: TerminalUpgradeDeps) {
  const wss = new WebSocketServer({
    noServer: true,
    maxPayload: 1024 * 1024,
    handleProtocols: (offered) => (offered.has(PTY_PROTOCOL) ? PTY_PROTOCOL : false),
  });
  const open = new Set<WebSocket>();

  const handle = async (req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> => {
    const url = new URL(req.url ?? '/', 'http://bridge');
    const match = PTY_PATH.exec(url.pathname);
    if (!match) throw new BridgeError('not_found', `no WebSocket route ${url.pathname}`);
    await deps.admit(req, presentedToken(req));
    const query = PtyQuery.safeParse(Object.fromEntries(url.searchParams));
    if (!query.success) throw new BridgeError('invalid_request', describeIssues(query.error));
    const boxId = decodeURIComponent(match[1]!);
    const box = await deps.terminals.open(boxId, query.data);
    box.socket.on('error', () => undefined); // the relay says why it closed; until then nothing may throw
    box.socket.once('close', box.release);
    if (socket.destroyed) {
      box.socket.destroy();
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      open.add(ws);
      ws.on('close', () => open.delete(ws));
      relay(ws, box.socket, box.head, deps.log.child({ box: boxId }));
    });
  };

  return {
    onUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
      socket.on('error', () => undefined);
      handle(req, socket, head).catch((err: unknown) => refuse(socket, err, deps.log));
    },
    /** Closes every open terminal (shutdown). */
    close(): void {
      for (const ws of open) ws.close(1001, 'bridge shutting down');
    },
  };
}

/** Bearer token from the Authorization header, or from the bearer subprotocol. */
function presentedToken(req: IncomingMessage): string | undefined {
  const header = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '');
  if (header) return header[1];
  for (const protocol of (req.headers['sec-websocket-protocol'] ?? '').split(',')) {
    const p = protocol.trim();
    if (p.startsWith(BEARER_PROTOCOL_PREFIX)) return Buffer.from(p.slice(BEARER_PROTOCOL_PREFIX.length), 'base64url').toString('utf8');
  }
  return undefined;
}

/** Bytes waiting to go out (to the caller, or to boxd) beyond which the other side is paused. */
const HIGH_WATER = 256 * 1024;
/** ... and below which it is resumed. */
const LOW_WATER = 64 * 1024;
/** A caller that has not answered a ping for this long is gone (its connection is dropped). */
const HEARTBEAT_MS = 30_000;

function relay(ws: WebSocket, boxd: Duplex, head: Buffer, log: Logger): void {
  const decoder = new FrameDecoder();
  let boxPaused = false;
  let closeReason = 'the box closed the terminal';
  // To the caller: sends complete (the callback) as its socket takes them; boxd's socket is
  // read again once what waits is under the low watermark.
  const sent = () => {
    if (boxPaused && ws.bufferedAmount <= LOW_WATER) {
      boxPaused = false;
      boxd.resume();
    }
  };
  const fromBox = (chunk: Buffer) => {
    let frames;
    try {
      frames = decoder.push(chunk);
    } catch (err) {
      log.warn({ err: (err as Error).message }, 'terminal stream from the box is malformed');
      ws.close(1011, 'terminal stream broken');
      boxd.destroy();
      return;
    }
    for (const frame of frames) {
      if (frame.type === FRAME.stdout) ws.send(frame.payload, { binary: true }, sent);
      else if (frame.type === FRAME.exit) {
        const exit = frameJson<{ exit_code: number }>(frame);
        ws.send(JSON.stringify({ type: 'exit', exit_code: exit.exit_code }));
        ws.close(1000, 'terminal ended');
      } else if (frame.type === FRAME.error) ws.close(1011, frameJson<{ message?: string }>(frame).message?.slice(0, 120) ?? 'box error');
    }
    if (!boxPaused && ws.bufferedAmount > HIGH_WATER) {
      boxPaused = true;
      boxd.pause();
    }
  };
  if (head.length) fromBox(head);
  boxd.on('data', fromBox);
  boxd.on('close', () => {
    if (ws.readyState === ws.OPEN) ws.close(1011, closeReason);
  });
  boxd.on('error', (err) => {
    // A deadline (the box stopped answering) says so; anything else is a lost connection.
    if (err instanceof BridgeError) closeReason = 'the box stopped answering';
  });

  // From the caller: while boxd's socket holds more than its watermark, the caller's socket is
  // not read (TCP pushes back to the caller).
  let callerPaused = false;
  const toBox = (frame: Buffer) => {
    if (boxd.write(frame) || callerPaused) return;
    callerPaused = true;
    ws.pause();
    boxd.once('drain', () => {
      callerPaused = false;
      ws.resume();
    });
  };
  ws.on('message', (data: RawData, isBinary: boolean) => {
    const bytes = Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data as ArrayBuffer);
    if (isBinary) {
      toBox(encodeFrame(FRAME.stdin, bytes));
      return;
    }
    try {
      const control = PtyControl.parse(JSON.parse(bytes.toString('utf8')));
      if (control.type === 'eof') toBox(encodeFrame(FRAME.eof));
      else toBox(encodeFrame(FRAME.resize, JSON.stringify({ cols: control.cols, rows: control.rows })));
    } catch {
      ws.close(1003, 'text frames must be {"type":"resize","cols","rows"} or {"type":"eof"}');
    }
  });

  // A caller that vanished without closing (no FIN: a dead network) would hold the terminal and
  // its memory until TCP gave up; a ping it does not answer ends it.
  let answered = true;
  ws.on('pong', () => (answered = true));
  const heartbeat = setInterval(() => {
    if (!answered) return ws.terminate();
    answered = false;
    ws.ping();
  }, HEARTBEAT_MS).unref();
  ws.on('close', () => {
    clearInterval(heartbeat);
    boxd.destroy();
  });
  ws.on('error', () => boxd.destroy());
}

/** Answers a refused upgrade with the API's JSON error, as a plain HTTP response. */
function refuse(socket: Duplex, err: unknown, log: Logger): void {
  const e = err instanceof BridgeError ? err : new BridgeError('internal_error', 'internal error; see the bridge logs');
  if (!(err instanceof BridgeError)) log.error({ err }, 'terminal upgrade failed');
  if (socket.destroyed) return;
  const body = JSON.stringify(e.toJSON());
  const headers = {
    'Content-Type': 'application/json',
    'Content-Length': String(Buffer.byteLength(body)),
    Connection: 'close',
    ...(e.status === 401 ? { 'WWW-Authenticate': 'Bearer realm="sandbox-bridge"' } : {}),
    ...e.headers,
  };
  const lines = Object.entries(headers).map(([k, v]) => `${k}: ${v}`);
  socket.end(`HTTP/1.1 ${e.status} ${statusText(e.status)}\r\n${lines.join('\r\n')}\r\n\r\n${body}`);
}

function statusText(status: number): string {
  return { 400: 'Bad Request', 401: 'Unauthorized', 403: 'Forbidden', 404: 'Not Found', 409: 'Conflict', 413: 'Payload Too Large', 429: 'Too Many Requests', 503: 'Service Unavailable' }[status] ?? 'Error';
}
