// ApiHealth's decisions with a scripted probe and short intervals; the real API server, frozen
// through a proxy, is in test/integration/bridge-fail-fast.test.ts.
import { ApiHealth } from './api-health.js';
import { BridgeError } from './errors.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const noStatus = (err: unknown) => !(err as { code?: number }).code;

/** A probe that answers or not, as the test says, and counts its calls. */
function scriptedProbe() {
  const state = { answers: true, calls: 0 };
  const probe = async (signal: AbortSignal) => {
    state.calls++;
    if (state.answers) return;
    // No answer: hang until the probe's own timeout aborts it.
    await new Promise((_resolve, reject) => signal.addEventListener('abort', () => reject(signal.reason)));
  };
  return { state, probe };
}

/** A call that hangs until aborted by the health's signal, as one to a frozen API server does. */
function hangingCall(health: ApiHealth) {
  return () =>
    new Promise<never>((_resolve, reject) => {
      const signal = health.signal;
      signal.addEventListener('abort', () => reject(signal.reason));
    });
}

function makeHealth(probe: (signal: AbortSignal) => Promise<void>) {
  return new ApiHealth({ probe, probeTimeoutMs: 100, suspectAfterMs: 100, recheckMs: 100 });
}

test('a call without an answer makes one probe; no answer there either: the call is aborted with a 503 and later calls are refused at once', async () => {
  const { state, probe } = scriptedProbe();
  const health = makeHealth(probe);
  state.answers = false;
  const started = performance.now();
  const pending = Promise.all([health.track(hangingCall(health), noStatus), health.track(hangingCall(health), noStatus)]);
  const err = await pending.catch((e: unknown) => e);
  expect(err).toBeInstanceOf(BridgeError);
  expect(err).toMatchObject({ type: 'cluster_unavailable', status: 503, headers: { 'Retry-After': '2' } });
  // suspectAfterMs + probeTimeoutMs, with room for a loaded machine
  expect(performance.now() - started).toBeLessThan(1000);
  expect(state.calls).toBe(1); // two hung calls, one probe
  expect(health.isUp()).toBe(false);

  let sent = false;
  const refusedAt = performance.now();
  await expect(
    health.track(async () => {
      sent = true;
    }, noStatus),
  ).rejects.toMatchObject({ type: 'cluster_unavailable', message: expect.stringMatching(/unreachable.*retry later/) });
  expect(sent).toBe(false);
  expect(performance.now() - refusedAt).toBeLessThan(50);
  health.stop();
});

test('recovers by itself once the probe answers again', async () => {
  const { state, probe } = scriptedProbe();
  const changes: boolean[] = [];
  const health = new ApiHealth({ probe, probeTimeoutMs: 100, suspectAfterMs: 100, recheckMs: 100, onChange: (up) => changes.push(up) });
  state.answers = false;
  await health.track(hangingCall(health), noStatus).catch(() => undefined);
  expect(health.isUp()).toBe(false);
  await sleep(350);
  expect(health.isUp()).toBe(false); // still probing every recheckMs
  const probesWhileDown = state.calls;
  expect(probesWhileDown).toBeGreaterThanOrEqual(2);
  state.answers = true;
  await sleep(300);
  expect(health.isUp()).toBe(true);
  expect(changes).toEqual([false, true]);
  await expect(health.track(async () => 'ok', noStatus)).resolves.toBe('ok');
  // Up again: no more probes without a reason.
  const calls = state.calls;
  await sleep(300);
  expect(state.calls).toBe(calls);
  health.stop();
});

test('a slow call whose API server still answers the probe is left alone', async () => {
  const { state, probe } = scriptedProbe();
  const health = makeHealth(probe);
  const result = await health.track(() => sleep(300).then(() => 'slow but fine'), noStatus);
  expect(result).toBe('slow but fine');
  expect(state.calls).toBe(1);
  expect(health.isUp()).toBe(true);
  health.stop();
});

test('a call that fails without any answer (refused) probes at once; an HTTP error does not', async () => {
  const { state, probe } = scriptedProbe();
  const health = makeHealth(probe);
  await expect(health.track(() => Promise.reject(Object.assign(new Error('Conflict'), { code: 409 })), noStatus)).rejects.toThrow('Conflict');
  expect(state.calls).toBe(0);
  state.answers = false;
  await expect(health.track(() => Promise.reject(new TypeError('fetch failed')), noStatus)).rejects.toThrow('fetch failed');
  expect(state.calls).toBe(1);
  await sleep(250);
  expect(health.isUp()).toBe(false);
  health.stop();
});

test('a probe answered while this process was stalled counts as an answer (its timeout fired late, before the loop read the answer)', async () => {
  // The answer is delivered in the loop's check phase, as a socket's data is read after the
  // timers of that turn; the process is stalled for 3x the probe's timeout right after the probe starts.
  let delivered = false;
  const probe = (signal: AbortSignal) =>
    new Promise<void>((resolve, reject) => {
      signal.addEventListener('abort', () => reject(signal.reason));
      setTimeout(() => setImmediate(() => ((delivered = true), resolve())), 20);
    });
  const health = makeHealth(probe);
  const call = health.track(() => sleep(150).then(() => 'ok'), noStatus);
  // The call has no answer for suspectAfterMs (100 ms): a probe starts; then the process stalls.
  await sleep(110);
  const until = performance.now() + 300;
  while (performance.now() < until) {
    /* stalled */
  }
  expect(await call).toBe('ok');
  await sleep(50);
  expect(delivered).toBe(true);
  expect(health.isUp()).toBe(true);
  health.stop();
});

test('an API server that does not answer still fails the probe in about its timeout, stalled or not', async () => {
  const { state, probe } = scriptedProbe();
  state.answers = false;
  const health = makeHealth(probe);
  const started = performance.now();
  await expect(health.track(hangingCall(health), noStatus)).rejects.toMatchObject({ type: 'cluster_unavailable' });
  expect(performance.now() - started).toBeLessThan(600);
  health.stop();
});
