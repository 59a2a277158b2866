import { jest } from '@jest/globals';
import { KeyedLimiter } from './rate-limit.js';

beforeEach(() => {
  jest.useFakeTimers({ now: 1_000_000 });
});
afterEach(() => {
  jest.useRealTimers();
});

test('allows `points` per window, then refuses with the seconds until the window ends', async () => {
  const limiter = new KeyedLimiter(3, 10);
  for (let i = 0; i < 3; i++) expect(await limiter.take('a')).toMatchObject({ allowed: true, limit: 3, remaining: 2 - i });
  jest.advanceTimersByTime(4000);
  expect(await limiter.take('a')).toEqual({ allowed: false, limit: 3, remaining: 0, resetSeconds: 6 });
  jest.advanceTimersByTime(6001);
  expect(await limiter.take('a')).toMatchObject({ allowed: true, remaining: 2 });
});

test('keys are independent', async () => {
  const limiter = new KeyedLimiter(1, 60);
  expect((await limiter.take('a')).allowed).toBe(true);
  expect((await limiter.take('a')).allowed).toBe(false);
  expect((await limiter.take('b')).allowed).toBe(true);
});

test('a rate with bursts: the whole burst at once, then the window of burst/rate seconds', async () => {
  const limiter = KeyedLimiter.fromRate(100, 200);
  expect(limiter.windowSeconds).toBe(2);
  let allowed = 0;
  for (let i = 0; i < 250; i++) if ((await limiter.take('k')).allowed) allowed++;
  expect(allowed).toBe(200);
  expect((await limiter.take('k')).resetSeconds).toBe(2);
});

test('invalid limits are refused', () => {
  expect(() => new KeyedLimiter(0, 1)).toThrow(RangeError);
  expect(() => new KeyedLimiter(1, 0)).toThrow(RangeError);
});
