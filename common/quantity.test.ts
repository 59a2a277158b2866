import { compareQuantities, formatCpu, formatMemory, milliValue, parseQuantity, quantityNanos, sameQuantity, wholeValue } from './quantity.js';

test.each([
  ['1', 1],
  ['0.5', 0.5],
  ['500m', 0.5],
  ['4', 4],
  ['512Mi', 512 * 2 ** 20],
  ['4Gi', 4 * 2 ** 30],
  ['1G', 1e9],
  ['1e3', 1000],
  ['100k', 100_000],
  ['.5', 0.5],
  ['1.5Gi', 1.5 * 2 ** 30],
  ['2E', 2e18],
])('parseQuantity(%s) = %d', (q, v) => {
  expect(parseQuantity(q)).toBe(v);
});

test.each(['', 'abc', '1.2.3', '4 Gi', '5x', 'Mi', '.', '1e', '1e99999'])('rejects %j', (q) => {
  expect(() => parseQuantity(q)).toThrow(/invalid quantity/);
});

test('the same amount written two ways is the same quantity, exactly (floats said 0.7 != 700m)', () => {
  // 700 * 1e-3 === 0.7000000000000001: the float comparison re-applied a LimitRange every reconcile.
  expect(sameQuantity('0.7', '700m')).toBe(true);
  expect(sameQuantity('0.1', '100m')).toBe(true);
  expect(sameQuantity('0.3', '300m')).toBe(true);
  expect(sameQuantity('1.1', '1100m')).toBe(true);
  expect(sameQuantity('1Gi', '1024Mi')).toBe(true);
  expect(sameQuantity('1G', '1e9')).toBe(true);
  expect(sameQuantity('0.5Ki', '512')).toBe(true);
  expect(sameQuantity('1', '1001m')).toBe(false);
  expect(sameQuantity('1Gi', '1G')).toBe(false);
  expect(sameQuantity('restricted', 'restricted ')).toBe(false);
  expect(sameQuantity('1', 'x')).toBe(false);
  // Differences far below a float's resolution at this size are still seen.
  expect(sameQuantity('8Ei', '9223372036854775807')).toBe(false);
  expect(sameQuantity('8Ei', '9223372036854775808')).toBe(true);
});

test('compare, milli and whole values are integers; below a nano-unit rounds up as the API server does', () => {
  expect(compareQuantities('999m', '1')).toBe(-1);
  expect(compareQuantities('4Gi', '4G')).toBe(1);
  expect(compareQuantities(0.7, '700m')).toBe(0);
  expect(milliValue('0.7')).toBe(700n);
  expect(milliValue('1.0005')).toBe(1001n);
  expect(wholeValue('512Mi')).toBe(536870912n);
  expect(wholeValue('1500m')).toBe(2n);
  expect(quantityNanos('0.5n')).toBe(1n);
  expect(quantityNanos('1n')).toBe(1n);
  expect(quantityNanos('-1m')).toBe(-1_000_000n);
});

test('formatCpu writes whole cores plainly and fractions in millicores', () => {
  expect(formatCpu(1)).toBe('1');
  expect(formatCpu(4)).toBe('4');
  expect(formatCpu(0.5)).toBe('500m');
  expect(formatCpu(0.25)).toBe('250m');
  expect(formatCpu(1.5)).toBe('1500m');
});

test('formatMemory uses the largest exact binary unit', () => {
  expect(formatMemory(512 * 2 ** 20)).toBe('512Mi');
  expect(formatMemory(4 * 2 ** 30)).toBe('4Gi');
  expect(formatMemory(1536 * 2 ** 20)).toBe('1536Mi');
  expect(formatMemory(1000)).toBe('1000');
});
