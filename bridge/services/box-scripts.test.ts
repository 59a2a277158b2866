// The exec wrapper script, run by the shells box images actually have (dash as Debian's sh,
// busybox ash as in the box image), locally: it is pure shell logic, no cluster needed.
import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { ENV_INCOMPLETE, EXEC_SCRIPT, envBlock } from './box-scripts.js';

const shells: Array<[string, string[]]> = [
  ['dash', ['dash']],
  ['busybox sh', ['busybox', 'sh']],
];
const workdir = mkdtempSync(`${tmpdir()}/box-scripts-`);

function run(shell: string[], command: string, stdin: Buffer | string, mode = 'env') {
  const [bin, ...pre] = shell;
  const r = spawnSync(bin!, [...pre, '-c', EXEC_SCRIPT, 'sandbox-exec', workdir, command, 'exec-1', mode], {
    input: stdin,
    env: { PATH: process.env.PATH },
  });
  return { status: r.status, stdout: r.stdout.toString('utf8'), stderr: r.stderr.toString('utf8') };
}

describe.each(shells)('EXEC_SCRIPT in %s', (_name, shell) => {
  it('exports every value exactly, whatever it holds', () => {
    const vars = {
      PLAIN: 'hello',
      EMPTY: '',
      MULTI: 'line one\nline two\n\nline four',
      TRAILING: 'ends with a newline\n',
      LEADING: '\n\nstarts with two',
      SPACES: '  padded  \t',
      SHELLY: `$(touch /tmp/pwned) \`id\` $HOME "quoted" 'single' \\back\\slash; echo nope`,
      UNICODE: 'größe – 大きさ – 🙂',
      CR: 'a\r\nb\r',
    };
    // printf %s so each value is printed as-is; a NUL-free separator between them.
    const command = Object.keys(vars)
      .map((k) => `printf '%s\\036' "$${k}"`)
      .join('; ');
    const r = run(shell, command, envBlock(vars));
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect(r.stdout.split('\x1e').slice(0, -1)).toEqual(Object.values(vars));
  });

  it('lets user variables share names with shell words without clobbering them', () => {
    const vars = { name: 'n', v: 'value', i: '7', l: 'ell', lines: '3', line: 'x', complete: '' };
    const command = Object.keys(vars)
      .map((k) => `printf '%s=%s\\036' ${k} "$${k}"`)
      .join('; ');
    const r = run(shell, command, envBlock(vars));
    expect(r.stdout.split('\x1e').slice(0, -1)).toEqual(Object.entries(vars).map(([k, v]) => `${k}=${v}`));
  });

  it('runs in the workdir with the exec id and without its own variables or stdin', () => {
    const r = run(shell, 'pwd; echo "$SANDBOX_EXEC_ID"; echo "[${__sb_v-unset}]"; cat; echo end', envBlock({ A: 'x' }));
    expect(r.stdout).toBe(`${workdir}\nexec-1\n[unset]\nend\n`);
  });

  it('runs with an empty env block', () => {
    expect(run(shell, 'echo ok', envBlock({}))).toMatchObject({ status: 0, stdout: 'ok\n' });
  });

  it('reads no stdin when told there is no env', () => {
    expect(run(shell, 'echo "ok${A-}"', '', 'none')).toMatchObject({ status: 0, stdout: 'ok\n' });
    expect(run(shell, 'echo "ok${A-}"', envBlock({ A: 'x' }), 'none')).toMatchObject({ status: 0, stdout: 'ok\n' });
  });

  it('passes the command exit status through', () => {
    expect(run(shell, 'exit 7', envBlock({})).status).toBe(7);
  });

  it.each([
    ['no input at all', ''],
    ['a block cut short inside a value', 'A\n3\none\ntwo\n'],
    ['a block without its closing empty line', 'A\n1\nvalue\n'],
  ])('runs nothing when stdin ends early: %s', (_case, input) => {
    const r = run(shell, 'echo ran', input);
    expect(r.status).toBe(ENV_INCOMPLETE);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain('command not run');
  });
});
