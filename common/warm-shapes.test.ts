import { withDefaults } from './pool.js';
import { shapeKey, warmChoices, warmShapes } from './warm-shapes.js';

const MiB = 1024 * 1024;
const spec = (warm: Parameters<typeof withDefaults>[0]['warm']) =>
  withDefaults({ namespace: 'ns', box: { defaultImage: 'img', defaultCpu: '1', defaultMemory: '512Mi' }, allowedImages: ['other'], warm });

test('the single form keeps the default shape; shapes add theirs, defaults filled in, a repeat kept once', () => {
  expect(warmShapes(spec({ count: 0 }))).toEqual([]);
  const shapes = warmShapes(spec({ count: 2, shapes: [{ cpu: '250m', count: 3, max: 6 }, { memory: '2Gi', count: 1 }, { cpu: '1', count: 9 }] }));
  expect(shapes.map((w) => [w.shape.cpuCores, w.shape.memoryBytes / MiB, w.count, w.max])).toEqual([
    [1, 512, 2, undefined],
    [0.25, 512, 3, 6],
    [1, 2048, 1, undefined],
  ]);
  expect(new Set(shapes.map((w) => w.key)).size).toBe(3);
  // Only shapes, no default count: the default shape is not kept.
  expect(warmShapes(spec({ count: 0, shapes: [{ cpu: '2', count: 1 }] })).map((w) => w.shape.cpuCores)).toEqual([2]);
});

test('a create is served by its exact shape first, then by resizing: shrinking before growing, least change first', () => {
  const s = spec({ count: 1, shapes: [{ cpu: '250m', memory: '256Mi', count: 1 }, { cpu: '2', memory: '1Gi', count: 1 }, { image: 'other', count: 1 }] });
  const order = (cpu: number, memoryMi: number) =>
    warmChoices(s, { image: 'img', cpuCores: cpu, memoryBytes: memoryMi * MiB }).map((c) => `${c.warm.shape.cpuCores}/${c.warm.shape.memoryBytes / MiB}${c.resize ? ' resize' : ''}`);
  expect(order(1, 512)).toEqual(['1/512', '2/1024 resize', '0.25/256 resize']);
  expect(order(0.5, 256)).toEqual(['1/512 resize', '2/1024 resize', '0.25/256 resize']);
  expect(order(0.25, 256)).toEqual(['0.25/256', '1/512 resize', '2/1024 resize']);
  expect(order(3, 512)).toEqual(['2/1024 resize', '1/512 resize', '0.25/256 resize']);
  // Another image or runtime class is never resized into; a service account is never served warm.
  expect(warmChoices(s, { image: 'other', cpuCores: 1, memoryBytes: 512 * MiB }).map((c) => c.resize)).toEqual([false]);
  expect(warmChoices(s, { image: 'img', cpuCores: 1, memoryBytes: 512 * MiB, runtimeClassName: 'gvisor' })).toEqual([]);
  expect(warmChoices(s, { image: 'img', cpuCores: 1, memoryBytes: 512 * MiB, serviceAccountName: 'sa' })).toEqual([]);
});

test('shape keys: equal for equal shapes however written', () => {
  expect(shapeKey({ image: 'i', cpuCores: 0.5, memoryBytes: 512 * MiB })).toBe(shapeKey({ image: 'i', cpuCores: 0.5, memoryBytes: 536870912 }));
  expect(shapeKey({ image: 'i', cpuCores: 0.5, memoryBytes: 512 * MiB })).not.toBe(shapeKey({ image: 'i', cpuCores: 0.5, memoryBytes: 512 * MiB, runtimeClassName: 'g' }));
});

test('a shape the pool would refuse to a create (image, runtime class, maxima) is not kept warm', () => {
  const s = withDefaults({
    namespace: 'ns',
    box: { defaultImage: 'img', maxCpu: '2', maxMemory: '1Gi' },
    allowedImages: ['reg/*'],
    warm: { count: 0, shapes: [{ image: 'reg/x', count: 1 }, { image: 'evil', count: 1 }, { cpu: '3', count: 1 }, { memory: '2Gi', count: 1 }, { runtimeClassName: 'gvisor', count: 1 }] },
  });
  expect(warmShapes(s).map((w) => w.shape.image)).toEqual(['reg/x']);
});
