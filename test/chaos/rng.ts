// A small seeded generator (mulberry32): the chaos plan — which process dies at which moment of
// which transition, how long it stays down, how long each writer idles — comes from one seed,
// printed by every run, so a failing run can be replayed with CHAOS_SEED=<seed>. Timing still
// differs between runs (the cluster runs at its own pace); the plan does not.
export class Rng {
  private state: number;

  constructor(readonly seed: number) {
    this.state = seed >>> 0;
  }

  /** A float in [0, 1). */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** An integer in [min, max]. */
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }

  pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.next() * items.length)]!;
  }

  shuffle<T>(items: T[]): T[] {
    for (let i = items.length - 1; i > 0; i--) {
      const j = Math.floor(this.next() * (i + 1));
      [items[i], items[j]] = [items[j]!, items[i]!];
    }
    return items;
  }

  /** An independent generator derived from this one (a writer's own stream). */
  fork(): Rng {
    return new Rng(Math.floor(this.next() * 2 ** 32));
  }
}

/** The seed of this run: CHAOS_SEED when set (a replay), else a fresh one. */
export function chaosSeed(): number {
  const given = process.env.CHAOS_SEED;
  if (given) {
    const n = Number(given);
    if (!Number.isSafeInteger(n) || n < 0) throw new Error(`CHAOS_SEED=${given} is not a non-negative integer`);
    return n >>> 0;
  }
  return Math.floor(Math.random() * 2 ** 32);
}
