// Kubernetes resource quantities ("500m", "1.5", "512Mi", "4Gi") <-> numbers.

const SUFFIX: Record<string, number> = {
  n: 1e-9,
  u: 1e-6,
  m: 1e-3,
  '': 1,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  P: 1e15,
  E: 1e18,
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
  Pi: 2 ** 50,
  Ei: 2 ** 60,
};

const QUANTITY = /^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))?$/;

/** The value of a quantity in base units (cores, bytes); throws on a malformed one. */
export function parseQuantity(quantity: string | number): number {
  if (typeof quantity === 'number') return quantity;
  const match = QUANTITY.exec(quantity.trim());
  if (!match) throw new Error(`invalid quantity "${quantity}"`);
  const [, number, exponent, suffix] = match;
  const value = Number(number) * (exponent ? 10 ** Number(exponent.slice(1)) : SUFFIX[suffix ?? '']!);
  return value;
}

/** Cores as Kubernetes writes them: whole cores as "2", fractions in millicores ("500m"). */
export function formatCpu(cores: number): string {
  const milli = Math.round(cores * 1000);
  return milli % 1000 === 0 ? String(milli / 1000) : `${milli}m`;
}

/** Bytes in the largest binary unit that divides them exactly ("512Mi", "4Gi"). */
export function formatMemory(bytes: number): string {
  const units: Array<[string, number]> = [
    ['Ti', 2 ** 40],
    ['Gi', 2 ** 30],
    ['Mi', 2 ** 20],
    ['Ki', 2 ** 10],
  ];
  const whole = Math.round(bytes);
  for (const [unit, size] of units) {
    if (whole >= size && whole % size === 0) return `${whole / size}${unit}`;
  }
  return String(whole);
}
