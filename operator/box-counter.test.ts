import { countBoxes } from './box-counter.js';

const t = (s: string) => Date.parse(s);

test('counts every box once and records the newest second with its uids', () => {
  const first = countBoxes(undefined, [
    { uid: 'a', createdAt: t('2030-01-01T00:00:01Z') },
    { uid: 'b', createdAt: t('2030-01-01T00:00:02.300Z') },
    { uid: 'c', createdAt: t('2030-01-01T00:00:02.900Z') },
    { uid: 'a', createdAt: t('2030-01-01T00:00:01Z') },
  ]);
  expect(first).toEqual({ total: 3, added: 3, watermark: { creationTimestamp: '2030-01-01T00:00:02Z', uids: ['b', 'c'] } });

  // A restarted operator sees the same boxes plus new ones, including one in the watermark second.
  const status = { totalBoxesCreated: first.total, boxCountWatermark: first.watermark! };
  const second = countBoxes(status, [
    { uid: 'a', createdAt: t('2030-01-01T00:00:01Z') },
    { uid: 'b', createdAt: t('2030-01-01T00:00:02Z') },
    { uid: 'c', createdAt: t('2030-01-01T00:00:02Z') },
    { uid: 'd', createdAt: t('2030-01-01T00:00:02Z') },
  ]);
  expect(second).toEqual({ total: 4, added: 1, watermark: { creationTimestamp: '2030-01-01T00:00:02Z', uids: ['b', 'c', 'd'] } });

  const third = countBoxes({ totalBoxesCreated: 4, boxCountWatermark: second.watermark! }, [
    { uid: 'e', createdAt: t('2030-01-01T00:00:05Z') },
  ]);
  expect(third).toEqual({ total: 5, added: 1, watermark: { creationTimestamp: '2030-01-01T00:00:05Z', uids: ['e'] } });
});

test('nothing new leaves the count and watermark alone', () => {
  const status = { totalBoxesCreated: 9, boxCountWatermark: { creationTimestamp: '2030-01-01T00:00:05Z', uids: ['e'] } };
  expect(countBoxes(status, [{ uid: 'old', createdAt: t('2030-01-01T00:00:04Z') }])).toEqual({
    total: 9,
    added: 0,
    watermark: status.boxCountWatermark,
  });
  expect(countBoxes(undefined, [])).toEqual({ total: 0, added: 0 });
});
