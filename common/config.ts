// Configuration errors of both programs: every problem in one message, one line each, and a
// start-up that exits with status 2 on them instead of a stack trace.
import { readFileSync } from 'node:fs';
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

/**
 * The key box credentials are derived from (common/boxd.ts), from its variable or a file (a
 * mounted Secret), at least 32 characters. Read once: changing it strands every running box.
 */
export function readBoxdKey(program: string, key: string | undefined, file: string | undefined): Buffer {
  let value = key;
  if (value === undefined && file) {
    try {
      value = readFileSync(file, 'utf8').trim();
    } catch (err) {
      throw new ConfigError(program, [`BOXD_KEY_FILE: cannot read ${file} (${(err as Error).message})`]);
    }
  }
  if (!value || value.length < 32) throw new ConfigError(program, ['BOXD_KEY: must be at least 32 characters']);
  return Buffer.from(value, 'utf8');
}

/**
 * The key boxes' egress proxy credentials are signed with (common/egress-proxy.ts): EGRESS_KEY, or
 * the first non-empty line of EGRESS_KEY_FILE (the gateway's key file: one key per line, the first
 * signs, every one verifies; a line's bytes are the key). Undefined when neither is set: boxes
 * then get no credential and a gateway pool's boxes are refused (407), never let out unchecked.
 */
export function readEgressKey(program: string, key: string | undefined, file: string | undefined): Buffer | undefined {
  let value = key;
  if (value === undefined && file) {
    try {
      value = readFileSync(file, 'utf8')
        .split('\n')
        .map((l) => l.trim())
        .find(Boolean);
    } catch (err) {
      throw new ConfigError(program, [`EGRESS_KEY_FILE: cannot read ${file} (${(err as Error).message})`]);
    }
    if (value === undefined) throw new ConfigError(program, [`EGRESS_KEY_FILE: ${file} holds no key`]);
  }
  if (value === undefined) return undefined;
  if (Buffer.byteLength(value) < 32) throw new ConfigError(program, ['EGRESS_KEY: must be at least 32 bytes']);
  return Buffer.from(value, 'utf8');
}

/**
 * The keys sealing snapshot envs, from SNAPSHOT_ENCRYPTION_KEY or its file (one per line, the
 * first seals); empty when neither is set.
 */
export function readSnapshotKeys(program: string, key: string | undefined, file: string | undefined): string[] {
  let text = key;
  if (text === undefined && file) {
    try {
      text = readFileSync(file, 'utf8');
    } catch (err) {
      throw new ConfigError(program, [`SNAPSHOT_ENCRYPTION_KEY_FILE: cannot read ${file} (${(err as Error).message})`]);
    }
  }
  const keys = (text ?? '').split('\n').map((k) => k.trim()).filter(Boolean);
  if (keys.some((k) => k.length < 32)) throw new ConfigError(program, ['SNAPSHOT_ENCRYPTION_KEY: every key must be at least 32 characters']);
  return keys;
}
