// Configuration errors of both programs: every problem in one message, one line each, and a
// start-up that exits with status 2 on them instead of a stack trace.
import type { ZodError } from 'zod';

export class ConfigError extends Error {
  constructor(program: string, problems: string[]) {
    super(`invalid ${program} configuration:\n${problems.map((p) => `  ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

/** "NAME: message" for each zod issue. */
export function configProblems(error: ZodError): string[] {
  return error.issues.map((i) => `${i.path.join('.') || 'config'}: ${i.message}`);
}

/** Runs a config loader; on a ConfigError prints it and exits 2. */
export function loadOrExit<T>(load: () => T, prefix: string): T {
  try {
    return load();
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    process.stderr.write(`${prefix}${err.message}\n`);
    process.exit(2);
  }
}
