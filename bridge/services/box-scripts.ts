// The only shell code the bridge sends into a box. User data (workdir, paths, sizes, env
// values, exec ids) is passed as positional arguments or on stdin, never spliced into a script;
// only the user's command itself is run by a shell, as intended.

/**
 * argv: $1 workdir, $2 command, $3 exec id. stdin: NAME=<base64 value> lines, then an empty line.
 * Exports the variables and the exec id (which marks every process of this exec, so a timeout
 * can kill exactly them), then runs the command with stdin from /dev/null.
 */
export const EXEC_SCRIPT = [
  'while IFS= read -r line && [ -n "$line" ]; do',
  '  v=$(printf %s "${line#*=}" | base64 -d; echo x)',
  '  export "${line%%=*}=${v%x}"',
  'done',
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

/** Encodes env vars for EXEC_SCRIPT's stdin. */
export function envPreamble(vars: Record<string, string>): Buffer {
  let text = '';
  for (const [name, value] of Object.entries(vars)) text += `${name}=${Buffer.from(value, 'utf8').toString('base64')}\n`;
  return Buffer.from(`${text}\n`);
}
