// The guard in a process of its own: an informational undici error thrown uncaught is survived,
// any other still ends the process with code 1.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';

const guard = join(process.cwd(), 'common/undici-guard.ts');

function run(throwing: string): { status: number | null; stdout: string } {
  const script = [
    `import { surviveUndiciInformationalErrors } from ${JSON.stringify(guard)};`,
    'surviveUndiciInformationalErrors({ warn: (o, m) => console.log("warned", m) });',
    `setTimeout(() => { ${throwing} }, 10);`,
    'setTimeout(() => console.log("alive"), 100);',
  ].join('\n');
  const r = spawnSync(process.execPath, ['--experimental-strip-types', '--no-warnings', '--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
  return { status: r.status, stdout: r.stdout };
}

test("undici's 'socket idle timeout' (UND_ERR_INFO) thrown uncaught: logged, the process goes on", () => {
  const r = run("const e = new Error('socket idle timeout'); e.name = 'InformationalError'; e.code = 'UND_ERR_INFO'; throw e;");
  expect(r).toEqual({ status: 0, stdout: 'warned ignored an informational error of the HTTP client (undici)\nalive\n' });
});

test('any other uncaught exception still ends the process with code 1', () => {
  const r = run("const e = new Error('boom'); e.code = 'ECONNRESET'; throw e;");
  expect(r).toEqual({ status: 1, stdout: '' });
});
