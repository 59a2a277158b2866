// V8 flags each program runs with. They cannot go into NODE_OPTIONS, so each launcher passes
// them on node's command line: the image's CMD (the bridge) and the chart's Deployments (each
// program's args; test/integration/chart-dockerfile.test.ts checks both against this file), and
// whatever starts them here (npm run dev, the benches, the tests) takes them from here, so what
// is measured is what ships.
//
// The operator: --optimize-for-size. It holds a watch cache plus the API client's code, and V8's
// default young generation and heap growth left most of its RSS as free heap. It trades CPU for
// memory. Measured (same build, one after the other): reaping 3,000 boxes peak RSS 314 -> 147 MiB
// but 9 -> 14 CPU-seconds and all deletes issued in 31 s instead of 22 s. (--max-semi-space-size=1
// alone: 233 MiB, 11 s; adding --max-old-space-size=256: 159 MiB, 13 s, but a hard heap cap that a
// larger pool would hit.) bench/results/operator-reap.md: 160 vs 452 MiB.
//
// The bridge: an 8 MiB new space (--max-semi-space-size=4) and old-space growth by 1.5x
// (--heap-growing-percent=50) instead of --optimize-for-size, whose 1 MiB semi-space promoted the
// state of every exec in flight and made GC the largest item of the exec path. Measured
// 2026-11-27 (bench/results/exec-profile.md, "The flag decision"): bridge CPU per exec on the
// exec load 2.08 -> 1.23 ms and 1.64 -> 1.17 ms in two runs (-41%, -29%; -38% in an earlier
// one); RSS at rest with 10,000 boxes 161 -> 195 MiB (208 in an earlier run); peak under
// bench:memory 411-415 -> 450-462 MiB. So the chart's bridge memory limit is 640Mi (it was
// 512Mi). --max-semi-space-size=2 costs the same memory for no less CPU.
export type Program = 'bridge' | 'operator';

export const NODE_FLAGS: Readonly<Record<Program, readonly string[]>> = {
  bridge: ['--max-semi-space-size=4', '--heap-growing-percent=50'],
  operator: ['--optimize-for-size'],
};

/** The flags of the program an entry script starts (`dist/bridge/main.js`, `.../dist/operator/main.js`). */
export function nodeFlagsFor(script: string): readonly string[] {
  const m = /(?:^|[\\/])(bridge|operator)[\\/]main\.js$/.exec(script);
  if (!m) throw new Error(`nodeFlagsFor: ${script} is neither program's entry script (bridge/main.js, operator/main.js)`);
  return NODE_FLAGS[m[1] as Program];
}
