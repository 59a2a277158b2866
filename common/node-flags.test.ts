// The launchers that take an entry script (npm run dev, bench/setup.ts, bench/programs.ts) pick
// that program's flags by its path.
import { NODE_FLAGS, nodeFlagsFor } from './node-flags.js';

test('each entry script gets its own program\'s flags, relative or absolute', () => {
  expect(nodeFlagsFor('dist/bridge/main.js')).toBe(NODE_FLAGS.bridge);
  expect(nodeFlagsFor('/tmp/build/dist/operator/main.js')).toBe(NODE_FLAGS.operator);
  expect(nodeFlagsFor('dist/operator/main.js')).toBe(NODE_FLAGS.operator);
  // the operator keeps --optimize-for-size (bench/results/operator-reap.md: 160 vs 452 MiB peak)
  expect(NODE_FLAGS.operator).toEqual(['--optimize-for-size']);
});

test('any other script is refused, not started with some program\'s flags', () => {
  for (const script of ['dist/bench/bridge.js', 'dist/bridge/main.ts', 'dist/notbridge/main.js', 'main.js']) {
    expect(() => nodeFlagsFor(script)).toThrow(/neither program/);
  }
});
