import { formatCpu, formatMemory, parseQuantity } from './quantity.js';

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
])('parseQuantity(%s) = %d', (q, v) => {
  expect(parseQuantity(q)).toBeCloseTo(v, 9);
});

test.each(['', 'abc', '1.2.3', '4 Gi', '5x', 'Mi'])('rejects %j', (q) => {
  expect(() => parseQuantity(q)).toThrow(/invalid quantity/);
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
