// The only shell code the bridge sends into a box. User data (workdir, paths, sizes, env
// values, exec ids) is passed as positional arguments or on stdin, never spliced into a script;
// only the user's command itself is run by a shell, as intended.

/** EXEC_SCRIPT's own variables; user env names with this prefix are refused (400). */
export const RESERVED_ENV_PREFIX = '__sb_';

/** EXEC_SCRIPT's exit status when its env block was cut short. */
export const ENV_INCOMPLETE = 125;

/**
 * argv: $1 workdir, $2 command, $3 exec id, $4 "env" when stdin carries the env block from
 * envBlock() (which ends with an empty line; a box without env gets no stdin at all, the
 * cheaper exec). Exports the variables and the exec id (which marks every process of this
 * exec, so a timeout can kill exactly them), then runs the command with stdin from /dev/null.
 * If stdin ends before the empty line (the bridge could not read the env), nothing runs: 125.
 * Only shell builtins until the command itself: no fork per variable, in dash and busybox alike.
 * Its own variables carry the prefix RESERVED_ENV_PREFIX, which env names may not use.
 */
export const EXEC_SCRIPT = [
  '__sb_done=',
  '[ "$4" = env ] || __sb_done=1',
  'while [ -z "$__sb_done" ] && IFS= read -r __sb_name; do',
  '  [ -z "$__sb_name" ] && { __sb_done=1; break; }',
  '  IFS= read -r __sb_lines || break',
  '  __sb_v= __sb_i=0',
  '  while [ "$__sb_i" -lt "$__sb_lines" ] && IFS= read -r __sb_l; do',
  '    if [ "$__sb_i" -eq 0 ]; then __sb_v=$__sb_l; else __sb_v="$__sb_v',
  '$__sb_l"; fi',
  '    __sb_i=$((__sb_i + 1))',
  '  done',
  '  export "$__sb_name=$__sb_v"',
  'done',
  `[ -n "$__sb_done" ] || { echo "sandbox-bridge: incomplete environment; command not run" >&2; exit ${ENV_INCOMPLETE}; }`,
  'unset __sb_done __sb_name __sb_lines __sb_v __sb_i __sb_l',
  'export SANDBOX_EXEC_ID="$3"',
  'cd "$1" || exit 1',
  'exec sh -c "$2" </dev/null',
].join('\n');

/**
 * argv: $1 exec id. Kills every process whose environment carries that exec id. They are
 * stopped first and killed together, so none can run on (e.g. print more output) while its
 * siblings die; the scan repeats until none is left, catching anything forked meanwhile.
 */
export const KILL_SCRIPT = [
  'i=0',
  'while [ $i -lt 20 ]; do',
  '  found=',
  '  for p in /proc/[0-9]*; do',
  '    [ "$p" = "/proc/$$" ] && continue',
  '    grep -qs "SANDBOX_EXEC_ID=$1" "$p/environ" && kill -STOP "${p#/proc/}" 2>/dev/null && found="$found ${p#/proc/}"',
  '  done',
  '  [ -z "$found" ] && exit 0',
  '  kill -KILL $found 2>/dev/null',
  '  i=$((i + 1))',
  'done',
].join('\n');

export const READ_NOT_FOUND = 44;
export const READ_IS_DIRECTORY = 45;
export const READ_DENIED = 46;

/** argv: $1 absolute path, $2 bytes to read at most. */
export const READ_SCRIPT = [
  `[ -e "$1" ] || { echo "no such file: $1" >&2; exit ${READ_NOT_FOUND}; }`,
  `[ -d "$1" ] && { echo "is a directory: $1" >&2; exit ${READ_IS_DIRECTORY}; }`,
  `[ -r "$1" ] || { echo "permission denied: $1" >&2; exit ${READ_DENIED}; }`,
  'exec head -c "$2" "$1"',
].join('\n');

/**
 * argv: $1 absolute path, $2 byte count. stdin: exactly that many bytes (head -c stops after
 * them, so no end-of-input signal is needed). Creates parent directories; prints the size written.
 */
export const WRITE_SCRIPT = [
  'd=${1%/*}',
  '[ -z "$d" ] || mkdir -p "$d" || exit 1',
  'head -c "$2" > "$1" || exit 1',
  'wc -c < "$1"',
].join('\n');

/**
 * The env block for EXEC_SCRIPT's stdin: per variable its name, its number of lines, then its
 * lines (so values may hold newlines and anything else, read with `read -r` and no decoding);
 * an empty line ends the block.
 */
export function envBlock(vars: Record<string, string>): Buffer {
  let text = '';
  for (const [name, value] of Object.entries(vars)) {
    const lines = value.split('\n');
    text += `${name}\n${lines.length}\n${lines.join('\n')}\n`;
  }
  return Buffer.from(`${text}\n`, 'utf8');
}
