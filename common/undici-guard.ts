// undici 8 (client-node's HTTP client) speaks HTTP/2 to the API server. When it closes an idle
// HTTP/2 session it destroys the socket with an InformationalError ('socket idle timeout', code
// UND_ERR_INFO), which a stream of that session can emit with no 'error' listener: an uncaught
// exception that ended a bridge replica in the chaos suite (seed 245881085, after the API server
// was frozen for it). Informational errors are undici's own connection bookkeeping, never the
// failure of a request (a request in flight gets its own error), so they are logged and the
// process goes on. Every other uncaught exception still ends the process, as Node's default does.
// (Speaking HTTP/1.1 instead avoids the bug but opens a connection per concurrent request: under
// load that handshake storm made the API server look down and bursts of creates answer 503.)
import type { Logger } from 'pino';

export function isUndiciInformational(err: unknown): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === 'UND_ERR_INFO';
}

/** Installs the guard once per process (the bridge's and the operator's main). */
export function surviveUndiciInformationalErrors(log: Pick<Logger, 'warn'>): void {
  process.on('uncaughtException', (err, origin) => {
    if (isUndiciInformational(err)) {
      log.warn({ err: err.message, origin }, 'ignored an informational error of the HTTP client (undici)');
      return;
    }
    // Node's default: the error on stderr, exit code 1.
    process.stderr.write(`${err instanceof Error ? (err.stack ?? String(err)) : String(err)}\n`);
    process.exit(1);
  });
}
