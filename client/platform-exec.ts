// The pure parts of the platform port (docs/platform.md): the exec string, which commands get
// registered command secrets, how a background process's state reads as the platform's status,
// and the fixed git command. No I/O here, so all of it is unit-tested (platform-exec.test.ts).
import type { ExecResult, ProcessInfo } from './types.js';

/** The bridge's own bounds of a command's timeout (bridge/schemas.ts ExecRequest). */
export const MAX_EXEC_TIMEOUT_MS = 600_000;

/**
 * The timeout to send for the port's `exec(command, timeout?)` (milliseconds): undefined (the
 * bridge's default, 120 s) when absent, zero, negative or not a number; rounded up to a whole
 * millisecond; at most the bridge's maximum (10 min), since the bridge refuses more with a 400
 * and an agent's tool call is better served by a command cut at 10 min than by no command.
 */
export function execTimeoutMs(timeout: number | undefined): number | undefined {
  if (timeout === undefined || !Number.isFinite(timeout) || timeout <= 0) return undefined;
  return Math.min(Math.ceil(timeout), MAX_EXEC_TIMEOUT_MS);
}

/**
 * The string the platform's adapters return for a command: stdout, then stderr on its own line
 * when there is any, trailing whitespace trimmed; then, each on its own line, what the agent must
 * know to read it right: truncated output, a timeout (`[timed out after N ms]`), and
 * `[exit N]` when N is not 0.
 */
export function formatExecOutput(result: Pick<ExecResult, 'exit_code' | 'stdout' | 'stderr' | 'timed_out' | 'stdout_truncated' | 'stderr_truncated'>, timeoutMs: number): string {
  const lines = [result.stdout.trimEnd(), result.stderr.trimEnd()].filter((s) => s !== '');
  const truncated = [result.stdout_truncated ? 'stdout' : '', result.stderr_truncated ? 'stderr' : ''].filter(Boolean);
  if (truncated.length) lines.push(`[output truncated: ${truncated.join(' and ')}]`);
  if (result.timed_out) lines.push(`[timed out after ${timeoutMs} ms]`);
  if (result.exit_code !== 0) lines.push(`[exit ${result.exit_code}]`);
  return lines.join('\n');
}

/**
 * Whether a command "starts with the prefix as a word": after leading whitespace, the command is
 * the prefix itself or the prefix followed by whitespace. So for prefix `git`: `git`, `git push`,
 * `  git\tstatus` match; `gitk`, `github-cli`, `git;env`, `echo git`, `FOO=1 git push`,
 * `/usr/bin/git push` do not. A prefix of several words (`gh api`) matches the same way. The
 * prefix is compared as given, after trimming it; an empty prefix matches nothing.
 */
export function startsWithWord(command: string, prefix: string): boolean {
  const p = prefix.trim();
  if (!p) return false;
  const c = command.trimStart();
  if (!c.startsWith(p)) return false;
  const next = c.charAt(p.length);
  return next === '' || /\s/.test(next);
}

export interface CommandSecrets {
  prefix: string;
  secrets: Record<string, string>;
}

/**
 * The registered secrets a command gets: those of every prefix it starts with as a word, a
 * longer prefix's value winning over a shorter one's for the same name. Undefined when none.
 */
export function secretsFor(command: string, registered: readonly CommandSecrets[]): Record<string, string> | undefined {
  const matching = registered.filter((r) => startsWithWord(command, r.prefix)).sort((a, b) => a.prefix.trim().length - b.prefix.trim().length);
  if (!matching.length) return undefined;
  return Object.assign({}, ...matching.map((m) => m.secrets)) as Record<string, string>;
}

/** The platform's status words for a background process. */
export type PlatformProcessStatus = 'running' | 'completed' | 'failed' | 'killed';

/**
 * A process's state as the platform reads it: running; ended by a signal (the bridge reports
 * the signal) -> killed; exit 0 -> completed; any other exit -> failed.
 */
export function processStatus(info: Pick<ProcessInfo, 'status' | 'exit_code' | 'signal'>): PlatformProcessStatus {
  if (info.status === 'running') return 'running';
  if (info.signal) return 'killed';
  return info.exit_code === 0 ? 'completed' : 'failed';
}

/** The exit code of gitCheckout's command when the box has no git. */
export const NO_GIT_EXIT = 127;

/**
 * gitCheckout's command: fixed text, run by the box's shell. The URL, branch and directory are
 * never part of it: they travel as per-call environment variables (data) and reach git as
 * arguments after `--`, so nothing in them is read by a shell or taken as an option.
 */
export const GIT_CHECKOUT_COMMAND = [
  `command -v git >/dev/null 2>&1 || { echo "git is not installed in this box's image: gitCheckout needs an image with git" >&2; exit ${NO_GIT_EXIT}; }`,
  'set -- clone',
  'if [ -n "$SBX_GIT_BRANCH" ]; then set -- "$@" --branch "$SBX_GIT_BRANCH"; fi',
  'set -- "$@" -- "$SBX_GIT_URL"',
  'if [ -n "$SBX_GIT_DIR" ]; then set -- "$@" "$SBX_GIT_DIR"; fi',
  'exec git "$@"',
].join('\n');

/** The per-call variables of gitCheckout's command. */
export function gitCheckoutEnv(repoUrl: string, options: { branch?: string; targetDir?: string }): Record<string, string> {
  return { SBX_GIT_URL: repoUrl, SBX_GIT_BRANCH: options.branch ?? '', SBX_GIT_DIR: options.targetDir ?? '' };
}
