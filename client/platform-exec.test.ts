// The pure logic of the platform port: the exec string, the command-secret prefix rule, the
// process status mapping, timeouts, signals and the git command's data-only arguments.
import { execTimeoutMs, formatExecOutput, GIT_CHECKOUT_COMMAND, gitCheckoutEnv, processStatus, secretsFor, startsWithWord, type CommandSecrets } from './platform-exec.js';
import { capacityOf, signalOf } from './platform.js';

const result = (r: Partial<Parameters<typeof formatExecOutput>[0]> = {}) => ({
  exit_code: 0,
  stdout: '',
  stderr: '',
  timed_out: false,
  stdout_truncated: false,
  stderr_truncated: false,
  ...r,
});

describe('the exec string', () => {
  test.each([
    ['stdout only, trailing whitespace trimmed', result({ stdout: 'hello\n\n  ' }), 'hello'],
    ['leading whitespace kept', result({ stdout: '  indented\n' }), '  indented'],
    ['stderr on its own line after stdout', result({ stdout: 'out\n', stderr: 'err\n' }), 'out\nerr'],
    ['stderr on its own line when stdout has no newline', result({ stdout: 'out', stderr: 'err' }), 'out\nerr'],
    ['stderr alone', result({ stderr: 'only err\n' }), 'only err'],
    ['whitespace-only stderr is none', result({ stdout: 'out\n', stderr: ' \n' }), 'out'],
    ['no output at all', result(), ''],
    ['non-zero exit', result({ stdout: 'out\n', stderr: 'err\n', exit_code: 3 }), 'out\nerr\n[exit 3]'],
    ['non-zero exit, no output', result({ exit_code: 1 }), '[exit 1]'],
    ['inner lines kept as they are', result({ stdout: 'a\n\nb\n' }), 'a\n\nb'],
    ['timeout says so, with the exit', result({ stdout: 'partial\n', exit_code: 124, timed_out: true }), 'partial\n[timed out after 5000 ms]\n[exit 124]'],
    ['truncated output says so', result({ stdout: 'x', stdout_truncated: true, stderr_truncated: true }), 'x\n[output truncated: stdout and stderr]'],
  ])('%s', (_name, r, expected) => {
    expect(formatExecOutput(r, 5000)).toBe(expected);
  });
});

describe('exec timeouts', () => {
  test.each([
    [undefined, undefined],
    [0, undefined],
    [-5, undefined],
    [Number.NaN, undefined],
    [1500, 1500],
    [1500.2, 1501],
    [600_000, 600_000],
    [3_600_000, 600_000],
  ])('%p -> %p', (given, sent) => {
    expect(execTimeoutMs(given)).toBe(sent);
  });
});

describe('"starts with the prefix as a word"', () => {
  test.each([
    ['git', 'git', true],
    ['git push origin main', 'git', true],
    ['  git\tstatus', 'git', true],
    ['git\nstatus', 'git', true],
    ['gitk', 'git', false],
    ['github-cli', 'git', false],
    ['git;env', 'git', false],
    ['git&&env', 'git', false],
    ['echo git', 'git', false],
    ['FOO=1 git push', 'git', false],
    ['/usr/bin/git push', 'git', false],
    ['Git push', 'git', false],
    ['gh api /user', 'gh api', true],
    ['gh apis', 'gh api', false],
    ['gh pr list', 'gh api', false],
    ['git push', ' git ', true],
    ['anything', '', false],
    ['anything', '   ', false],
    [' ', 'git', false],
  ])('%p with prefix %p: %p', (command, prefix, expected) => {
    expect(startsWithWord(command, prefix)).toBe(expected);
  });

  test('secrets: only matching prefixes, the longer prefix winning a name', () => {
    const registered: CommandSecrets[] = [
      { prefix: 'gh', secrets: { GH_TOKEN: 'short', OTHER: 'o' } },
      { prefix: 'gh api', secrets: { GH_TOKEN: 'long' } },
      { prefix: 'git', secrets: { GIT_TOKEN: 'g' } },
    ];
    expect(secretsFor('gh api /user', registered)).toEqual({ GH_TOKEN: 'long', OTHER: 'o' });
    expect(secretsFor('gh pr list', registered)).toEqual({ GH_TOKEN: 'short', OTHER: 'o' });
    expect(secretsFor('git clone x', registered)).toEqual({ GIT_TOKEN: 'g' });
    expect(secretsFor('echo $GH_TOKEN', registered)).toBeUndefined();
    expect(secretsFor('ghx', registered)).toBeUndefined();
  });
});

describe('process status', () => {
  test.each([
    [{ status: 'running' as const }, 'running'],
    [{ status: 'exited' as const, exit_code: 0 }, 'completed'],
    [{ status: 'exited' as const, exit_code: 2 }, 'failed'],
    [{ status: 'exited' as const, exit_code: 143, signal: 'TERM' }, 'killed'],
    [{ status: 'exited' as const, exit_code: 137, signal: 'KILL' }, 'killed'],
  ])('%p -> %p', (info, expected) => {
    expect(processStatus(info)).toBe(expected);
  });
});

test('signals: names with or without SIG, any case, and numbers; others refused', () => {
  expect(signalOf('SIGTERM')).toBe('TERM');
  expect(signalOf('kill')).toBe('KILL');
  expect(signalOf('sigint')).toBe('INT');
  expect(signalOf(9)).toBe('KILL');
  expect(signalOf('15')).toBe('TERM');
  expect(() => signalOf('SIGSEGV')).toThrow(/unsupported signal "SIGSEGV"/);
});

test('gitCheckout: the command is fixed text; url, branch and directory are data', () => {
  const hostile = `https://example.com/r.git"; rm -rf / #$(id)`;
  const env = gitCheckoutEnv(hostile, { branch: '--upload-pack=evil', targetDir: 'dir; reboot' });
  expect(env).toEqual({ SBX_GIT_URL: hostile, SBX_GIT_BRANCH: '--upload-pack=evil', SBX_GIT_DIR: 'dir; reboot' });
  for (const value of Object.values(env)) expect(GIT_CHECKOUT_COMMAND).not.toContain(value);
  // The URL comes after --, so git never reads it as an option.
  expect(GIT_CHECKOUT_COMMAND).toContain('-- "$SBX_GIT_URL"');
  expect(gitCheckoutEnv('u', {})).toEqual({ SBX_GIT_URL: 'u', SBX_GIT_BRANCH: '', SBX_GIT_DIR: '' });
});

test('capacity in the platform shape', () => {
  expect(
    capacityOf({ cpu: { used: 1.5, total: 8, unit: 'cores' }, memory: { used: 512, total: 16384, unit: 'MiB' }, pods: { used: 3, total: 110 }, boxes: { active: 2, warm: 1, max: 50 } }),
  ).toEqual({ cpu: { used: 1.5, total: 8, unit: 'cores' }, memory: { used: 512, total: 16384, unit: 'MiB' }, pods: { used: 3, total: 110 } });
});
