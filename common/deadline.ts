// Deadlines for probes that decide something drastic (a peer judged down, a warm pod let go).

/**
 * A deadline for a health probe, fair to a stalled process. When this process itself was stalled
 * (CPU starved on a loaded node, a long synchronous task), its timers run late, and they run
 * before the event loop reads the sockets: a probe's timeout would fire while the answer sits
 * unread, and a busy bridge would call a healthy peer dead (in the tests: 38 of 40 racing creates
 * answered 503 at load 15, the API server judged down). So a timeout that fires late gives the
 * answer one more window, and the abort itself waits until the loop has read its sockets
 * (setImmediate runs after the poll phase). A peer that does not answer still fails in about
 * timeoutMs when this process runs on time.
 */
export function patientDeadline(timeoutMs: number): { signal: AbortSignal; clear: () => void } {
  const controller = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  let immediate: NodeJS.Immediate | undefined;
  let extended = false;
  const arm = () => {
    const armedAt = performance.now();
    timer = setTimeout(() => {
      const late = performance.now() - armedAt - timeoutMs;
      if (late > timeoutMs / 2 && !extended) {
        extended = true;
        return arm();
      }
      immediate = setImmediate(() => controller.abort(new Error(`no answer within ${timeoutMs} ms`)));
    }, timeoutMs);
  };
  arm();
  return {
    signal: controller.signal,
    clear: () => {
      clearTimeout(timer);
      if (immediate) clearImmediate(immediate);
    },
  };
}
