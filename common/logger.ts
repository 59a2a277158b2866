// pino JSON logs for both programs. Secrets never reach a log line: the bearer token, env
// values and file contents are redacted wherever they might appear.
import { pino, type Logger, type LevelWithSilent } from 'pino';

export const LOG_LEVELS = ['debug', 'info', 'warn', 'error'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

export const REDACT_PATHS = [
  'req.headers.authorization',
  'req.headers.cookie',
  'headers.authorization',
  'authorization',
  'token',
  '*.token',
  'env',
  '*.env',
  'envVars',
  '*.envVars',
  'content',
  '*.content',
];

export function createLogger(name: string, level: LogLevel | LevelWithSilent = 'info'): Logger {
  return pino({
    name,
    level,
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    base: { service: name },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label) => ({ level: label }) },
  });
}
