// The bridge and the operator as their own processes for the benches that count what each one
// asks of the API server: each gets its own kubeconfig (an API proxy's, bench/api-requests.ts)
// and its output is kept (parsed by the bench) instead of mixed into the bench's own.
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { nodeFlagsFor } from '../common/node-flags.js';
import { freePort, waitUntil } from './setup.js';

export interface Program {
  child: ChildProcess;
  /** The metrics / probe port (/metrics, /readyz). */
  metricsPort: number;
  /** The API port (bridges). */
  port: number;
  /** Every line the process wrote so far, stdout and stderr. */
  lines: string[];
  stop(): Promise<void>;
}

/**
 * Starts `node dist/<script>` with env (plus KUBECONFIG, PORT/METRICS_PORT on loopback) and
 * waits until it serves /readyz; throws with its output if it exits first.
 */
export async function startProgram(root: string, script: string, kubeconfig: string, env: Record<string, string>): Promise<Program> {
  const [port, metricsPort] = [await freePort(), await freePort()];
  const child = spawn(process.execPath, [...nodeFlagsFor(script), join(root, script)], {
    env: {
      PATH: process.env.PATH,
      KUBECONFIG: kubeconfig,
      LOG_LEVEL: 'warn',
      HOST: '127.0.0.1',
      PORT: String(port),
      METRICS_HOST: '127.0.0.1',
      METRICS_PORT: String(metricsPort),
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines: string[] = [];
  for (const stream of [child.stdout!, child.stderr!]) {
    let rest = '';
    stream.on('data', (d: Buffer) => {
      const parts = (rest + d.toString()).split('\n');
      rest = parts.pop() ?? '';
      lines.push(...parts.filter(Boolean));
    });
  }
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
  };
  try {
    await waitUntil(`${script} to be ready`, async () => {
      if (child.exitCode !== null) throw new Error('exited');
      return (await fetch(`http://127.0.0.1:${metricsPort}/readyz`, { signal: AbortSignal.timeout(2000) })).ok;
    }, 120_000, 100);
  } catch (err) {
    await stop();
    throw new Error(`${script} did not start (${String(err)}):\n${lines.slice(-20).join('\n')}`);
  }
  return { child, metricsPort, port, lines, stop };
}

/** A metric's value summed over its label sets, optionally only those with `labels`; undefined when /metrics does not answer. */
export async function metric(program: Program, name: string, labels: Record<string, string> = {}): Promise<number | undefined> {
  const text = await fetch(`http://127.0.0.1:${program.metricsPort}/metrics`, { signal: AbortSignal.timeout(5000) }).then((r) => r.text(), () => undefined);
  if (text === undefined) return undefined;
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) sum += Number(line.split(' ').at(-1));
  }
  return sum;
}

/** The process's pino log lines (JSON), parsed; other lines are skipped. */
export function logEntries(program: Program): Array<{ time?: string; level?: string | number; msg?: string; err?: string; [k: string]: unknown }> {
  const entries = [];
  for (const line of program.lines) {
    try {
      entries.push(JSON.parse(line) as { time?: string; msg?: string });
    } catch {
      // not a log line
    }
  }
  return entries;
}
