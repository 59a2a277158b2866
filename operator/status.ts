// Pure status computation: conditions that keep their lastTransitionTime while unchanged, and a
// comparison that ignores timestamps so an unchanged status is never written (no write storms).
import type { V1Condition } from '@kubernetes/client-node';
import type { SandboxPoolStatus } from '../common/pool.js';

export interface ConditionInput {
  type: 'Ready' | 'Degraded';
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message: string;
}

export function setConditions(
  previous: readonly V1Condition[] | undefined,
  wanted: readonly ConditionInput[],
  generation: number | undefined,
  now: Date,
): V1Condition[] {
  return wanted.map((w) => {
    const prior = previous?.find((c) => c.type === w.type);
    const lastTransitionTime = prior && prior.status === w.status ? new Date(prior.lastTransitionTime) : now;
    return { ...w, observedGeneration: generation, lastTransitionTime };
  });
}

/** Status equality ignoring how timestamps are represented (Date from the cache vs. string). */
export function sameStatus(a: SandboxPoolStatus | undefined, b: SandboxPoolStatus): boolean {
  return JSON.stringify(normalize(a ?? {})) === JSON.stringify(normalize(b));
}

function normalize(s: SandboxPoolStatus): unknown {
  return {
    observedGeneration: s.observedGeneration,
    activeBoxes: s.activeBoxes,
    totalBoxesCreated: s.totalBoxesCreated,
    warmReady: s.warmReady ?? 0,
    warmDesired: s.warmDesired ?? 0,
    boxCountWatermark: s.boxCountWatermark
      ? { creationTimestamp: Date.parse(s.boxCountWatermark.creationTimestamp), uids: s.boxCountWatermark.uids }
      : undefined,
    conditions: (s.conditions ?? []).map((c) => ({
      type: c.type,
      status: c.status,
      reason: c.reason,
      message: c.message,
      observedGeneration: c.observedGeneration,
      lastTransitionTime: new Date(c.lastTransitionTime).getTime(),
    })),
  };
}
