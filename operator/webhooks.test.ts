import { createHmac } from 'node:crypto';
import { pino } from 'pino';
import { DELIVERY_HEADER, MAX_MESSAGE_CHARS, SIGNATURE_HEADER, WebhookNotifier, redactUrl, sign, slackMessage, type FailureNotice, type WebhookEndpoint } from './webhooks.js';

const log = pino({ level: 'silent' });
const notice = (box: string, reason: FailureNotice['reason'] = 'crashed'): FailureNotice => ({
  reason,
  pool: 'p1',
  namespace: 'boxes',
  box,
  podUid: `uid-${box}`,
  container: 'box',
  message: `${reason} happened`,
  occurredAt: new Date('2026-01-01T00:00:00Z'),
});

interface Seen {
  url: string;
  headers: Record<string, string>;
  body: string;
}

function recorder(statuses: number[] = []) {
  const seen: Seen[] = [];
  const fetch = (async (url: string, init: RequestInit) => {
    seen.push({ url, headers: init.headers as Record<string, string>, body: String(init.body) });
    return new Response('', { status: statuses.shift() ?? 200 });
  }) as typeof globalThis.fetch;
  return { seen, fetch };
}

async function until(check: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !check(); i++) await new Promise((r) => setTimeout(r, 5));
}

function notifier(endpoints: WebhookEndpoint[], fetch: typeof globalThis.fetch, extra: Partial<ConstructorParameters<typeof WebhookNotifier>[0]> = {}) {
  return new WebhookNotifier({ endpoints, signingKey: 'k3y', debounceMs: 200, maxAttempts: 3, timeoutMs: 1000, log, fetch, baseBackoffMs: 5, ...extra });
}

test('a signed JSON document per box; the signature covers timestamp and body', async () => {
  const r = recorder();
  const n = notifier([{ url: 'https://hooks.example/a', format: 'json' }], r.fetch);
  n.notify(notice('b1', 'oom_killed'));
  await until(() => r.seen.length === 1);
  const [d] = r.seen;
  const body = JSON.parse(d!.body);
  expect(body).toMatchObject({ type: 'box.failure', pool: 'p1', namespace: 'boxes', box_id: 'b1', pod_uid: 'uid-b1' });
  expect(body.failures).toEqual([{ reason: 'oom_killed', event_reason: 'BoxOOMKilled', container: 'box', message: 'oom_killed happened', occurred_at: '2026-01-01T00:00:00.000Z' }]);
  const [, t, v1] = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(d!.headers[SIGNATURE_HEADER]!)!;
  expect(v1).toBe(createHmac('sha256', 'k3y').update(`${t}.${d!.body}`).digest('hex'));
  expect(d!.headers[DELIVERY_HEADER]).toBe(body.id);
  n.stop();
});

test('debounce per box: the first at once, the rest of the window together, other boxes unaffected', async () => {
  const r = recorder();
  const n = notifier([{ url: 'https://hooks.example/a', format: 'json' }], r.fetch);
  for (let i = 0; i < 5; i++) n.notify(notice('b1'));
  n.notify(notice('b2'));
  await until(() => r.seen.length === 2);
  expect(r.seen.map((s) => JSON.parse(s.body).failures.length)).toEqual([1, 1]);
  await until(() => r.seen.length === 3);
  const trailing = JSON.parse(r.seen[2]!.body);
  expect([trailing.box_id, trailing.failures.length]).toEqual(['b1', 4]);
  await new Promise((r2) => setTimeout(r2, 500));
  expect(r.seen).toHaveLength(3);
  n.stop();
});

test('retries 5xx and network errors with one delivery id; gives up after maxAttempts; no retry on 4xx', async () => {
  const results: string[] = [];
  const r = recorder([503, 500, 200]);
  const n = notifier([{ url: 'https://hooks.example/a', format: 'json' }], r.fetch, { onDelivery: (x) => results.push(x), debounceMs: 0 });
  n.notify(notice('b1'));
  await until(() => results.length === 1);
  expect(results).toEqual(['delivered']);
  expect(new Set(r.seen.map((s) => s.headers[DELIVERY_HEADER])).size).toBe(1);
  expect(r.seen).toHaveLength(3);

  const refused = recorder([400]);
  const n2 = notifier([{ url: 'https://hooks.example/a', format: 'json' }], refused.fetch, { onDelivery: (x) => results.push(x) });
  n2.notify(notice('b1'));
  await until(() => results.length === 2);
  expect(results[1]).toBe('failed');
  expect(refused.seen).toHaveLength(1);

  const down = recorder([500, 500, 500, 500]);
  const n3 = notifier([{ url: 'https://hooks.example/a', format: 'json' }], down.fetch, { onDelivery: (x) => results.push(x) });
  n3.notify(notice('b1'));
  await until(() => results.length === 3);
  expect([results[2], down.seen.length]).toEqual(['failed', 3]);
  for (const x of [n, n2, n3]) x.stop();
});

test('event filter per endpoint; a Slack-compatible {text}', async () => {
  const r = recorder();
  const n = notifier(
    [
      { url: 'https://hooks.example/json', format: 'json', events: ['evicted'] },
      { url: 'https://hooks.slack.example/services/T/B/secret', format: 'slack' },
    ],
    r.fetch,
  );
  n.notify(notice('b1', 'image_pull_failed'));
  await until(() => r.seen.length === 1);
  await new Promise((r2) => setTimeout(r2, 50));
  expect(r.seen.map((s) => s.url)).toEqual(['https://hooks.slack.example/services/T/B/secret']);
  expect(JSON.parse(r.seen[0]!.body)).toEqual({ text: expect.stringMatching(/^:rotating_light: Box b1 in pool p1 \(namespace boxes\):\n• BoxImagePullFailed: image_pull_failed happened$/) });
  n.stop();
});

test('signatures and redacted URLs', () => {
  expect(sign('k', 1700000000, '{}')).toBe(`t=1700000000,v1=${createHmac('sha256', 'k').update('1700000000.{}').digest('hex')}`);
  expect(redactUrl('https://hooks.slack.com/services/T0/B0/XXXX')).toBe('https://hooks.slack.com/…');
});

// What a box writes into its termination message (up to 4 KiB) reaches the message verbatim.
const hostile = [
  '<!channel> <!here|here> <!everyone> <@U024BE7LH> <!subteam^SAZ94GDB8> <#C024BE7LR>',
  '<http://evil.example/login|Re-authenticate here> <mailto:x@evil.example|mail>',
  '@channel @here @everyone @admin #general',
  'https://evil.example/a www.evil.example evil.example ops@evil.example &amp; &lt;',
  '\n• BoxOOMKilled: a line the box made up\r\n> a quote',
].join(' ');

test('Slack text: what a box wrote forms no mention, link or line of its own', async () => {
  const r = recorder();
  const n = notifier([{ url: 'https://hooks.slack.example/services/T/B/secret', format: 'slack' }], r.fetch);
  n.notify({ ...notice('b1'), message: `container box exited with code 1: ${hostile}` });
  await until(() => r.seen.length === 1);
  const { text } = JSON.parse(r.seen[0]!.body) as { text: string };
  const [head, ...lines] = text.split('\n');
  expect(head).toBe(':rotating_light: Box b1 in pool p1 (namespace boxes):');
  expect(lines).toHaveLength(1); // the box's newlines made no line
  // Slack's control characters only as entities: no <!channel>, <@user>, <url|text>.
  expect(text).not.toMatch(/[<>]/);
  expect(text).not.toMatch(/&(?!amp;|lt;|gt;)/);
  expect(text).toContain('&lt;!channel&gt;');
  expect(text).toContain('&lt;http:\u200b//evil.\u200bexample/login|Re-authenticate here&gt;');
  expect(text).toContain('&amp;amp;'); // an entity the box wrote shows as typed
  // No @name, #channel, scheme://, domain or address Slack would link or notify.
  expect(text).not.toMatch(/[@#][^\s\u200b]/);
  expect(text).not.toMatch(/:\/\//);
  expect(text).not.toMatch(/\.[a-z]/i);
  expect(text).toContain('@\u200bchannel @\u200bhere');
  n.stop();
});

test('a box-written message is bounded in both formats, and a Slack message in lines', async () => {
  const long = `container box exited with code 1: ${'x'.repeat(4096)}`;
  const slack = slackMessage([{ ...notice('b1'), message: long }]).text.split('\n')[1]!;
  expect(slack.length).toBeLessThanOrEqual('• BoxCrashed: '.length + MAX_MESSAGE_CHARS);
  expect(slack.endsWith('x…')).toBe(true);
  // Cut by characters, never inside a surrogate pair.
  const emoji = slackMessage([{ ...notice('b1'), message: '😀'.repeat(4096) }]).text.split('\n')[1]!;
  expect(emoji).toBe(`• BoxCrashed: ${'😀'.repeat(MAX_MESSAGE_CHARS - 1)}…`);
  // Held failures of one window: ten lines, then how many more.
  const many = slackMessage(Array.from({ length: 15 }, () => notice('b1'))).text.split('\n');
  expect(many).toHaveLength(1 + 10 + 1);
  expect(many.at(-1)).toBe('… and 5 more');

  const r = recorder();
  const n = notifier([{ url: 'https://hooks.example/a', format: 'json' }], r.fetch);
  n.notify({ ...notice('b1'), message: long });
  await until(() => r.seen.length === 1);
  const { failures } = JSON.parse(r.seen[0]!.body) as { failures: Array<{ message: string }> };
  expect(Array.from(failures[0]!.message)).toHaveLength(MAX_MESSAGE_CHARS);
  n.stop();
});
