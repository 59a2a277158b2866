import { sameStatus, setConditions } from './status.js';

const T0 = new Date('2030-01-01T00:00:00Z');
const T1 = new Date('2030-01-01T00:01:00Z');

test('lastTransitionTime moves only when a condition status changes', () => {
  const first = setConditions(undefined, [{ type: 'Ready', status: 'True', reason: 'Reconciled', message: 'ok' }], 1, T0);
  const same = setConditions(first, [{ type: 'Ready', status: 'True', reason: 'Reconciled', message: 'ok' }], 2, T1);
  expect(same[0]!.lastTransitionTime).toEqual(T0);
  expect(same[0]!.observedGeneration).toBe(2);
  const flipped = setConditions(same, [{ type: 'Ready', status: 'False', reason: 'ApplyFailed', message: 'x' }], 2, T1);
  expect(flipped[0]!.lastTransitionTime).toEqual(T1);
});

test('sameStatus ignores Date vs string timestamps but sees real changes', () => {
  const conditions = setConditions(undefined, [{ type: 'Ready', status: 'True', reason: 'Reconciled', message: 'ok' }], 1, T0);
  const live = {
    observedGeneration: 1,
    activeBoxes: 2,
    totalBoxesCreated: 5,
    conditions: conditions.map((c) => ({ ...c, lastTransitionTime: '2030-01-01T00:00:00Z' as unknown as Date })),
  };
  expect(sameStatus(live, { observedGeneration: 1, activeBoxes: 2, totalBoxesCreated: 5, conditions })).toBe(true);
  expect(sameStatus(live, { observedGeneration: 1, activeBoxes: 3, totalBoxesCreated: 5, conditions })).toBe(false);
  expect(sameStatus(undefined, { activeBoxes: 0 })).toBe(false);
});
