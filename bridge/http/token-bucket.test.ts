import { TokenBuckets } from './token-bucket.js';

function clock() {
  let t = 0;
  return { now: () => t, advance: (ms: number) => (t += ms) };
}

test('allows a burst, then the sustained rate', () => {
  const c = clock();
  const buckets = new TokenBuckets(100, 200, c.now);
  for (let i = 0; i < 200; i++) expect(buckets.take('a').allowed).toBe(true);
  const denied = buckets.take('a');
  expect(denied.allowed).toBe(false);
  expect(denied.retryAfterSeconds).toBe(1);

  c.advance(100); // 10 tokens back
  let allowed = 0;
  for (let i = 0; i < 20; i++) if (buckets.take('a').allowed) allowed++;
  expect(allowed).toBe(10);
});

test('clients have separate buckets', () => {
  const c = clock();
  const buckets = new TokenBuckets(1, 2, c.now);
  expect(buckets.take('a').allowed).toBe(true);
  expect(buckets.take('a').allowed).toBe(true);
  expect(buckets.take('a').allowed).toBe(false);
  expect(buckets.take('b').allowed).toBe(true);
});

test('refill never exceeds the burst', () => {
  const c = clock();
  const buckets = new TokenBuckets(10, 5, c.now);
  buckets.take('a');
  c.advance(60_000);
  expect(buckets.take('a').remaining).toBe(4);
});

test('remembers at most maxClients, dropping the least recently seen', () => {
  const c = clock();
  const buckets = new TokenBuckets(1, 1, c.now, 2);
  buckets.take('a');
  buckets.take('b');
  buckets.take('a');
  buckets.take('c');
  expect(buckets.size).toBe(2);
  // 'b' was dropped, so it starts with a full bucket; 'a' is still empty.
  expect(buckets.take('b').allowed).toBe(true);
  expect(buckets.take('c').allowed).toBe(false);
});
