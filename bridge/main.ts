// Entry point: `node dist/bridge/main.js` (container) or `npm run dev`.
import { createLogger } from '../common/logger.js';
import { loadOrExit } from '../common/config.js';
import { surviveUndiciInformationalErrors } from '../common/undici-guard.js';
import { loadConfig } from './config.js';
import { startBridge } from './server.js';

async function main(): Promise<void> {
  const config = loadOrExit(() => loadConfig(), '');
  const log = createLogger('sandbox-bridge', config.LOG_LEVEL);
  surviveUndiciInformationalErrors(log);
  const bridge = await startBridge(config, { log });
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'signal received');
    bridge.close().then(
      () => process.exit(0),
      (err: unknown) => {
        log.error({ err }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
}

main().catch((err: unknown) => {
  process.stderr.write(`sandbox-bridge failed to start: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
