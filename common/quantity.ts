// Kubernetes resource quantities ("500m", "1.5", "512Mi", "4Gi"). Compared and summed exactly,
// as integer nano-units (BigInt), the way the API server's resource.Quantity is: with floats,
// "0.7" (0.7) and "700m" (700 * 1e-3 = 0.7000000000000001) differ, and the operator re-applied
// a LimitRange written as 0.7 cores on every reconcile because the API server stores "700m".
// Floats (parseQuantity) are for display and for comparing with JSON numbers only.

const DECIMAL_EXPONENT: Record<string, number> = { n: -9, u: -6, m: -3, '': 0, k: 3, M: 6, G: 9, T: 12, P: 15, E: 18 };
const BINARY_EXPONENT: Record<string, number> = { Ki: 10, Mi: 20, Gi: 30, Ti: 40, Pi: 50, Ei: 60 };

const QUANTITY = /^([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+)|(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))?$/;
/** Bounds the BigInt work a hostile "1e999999" could cause; far beyond any real quantity. */
const MAX_EXPONENT = 64;

/**
 * The quantity as an exact count of nano-units (1e-9 cores, 1e-9 bytes). Like the API server,
 * anything finer than a nano-unit is rounded up ("0.5n" is 1n). Throws on a malformed quantity.
 */
export function quantityNanos(quantity: string | number): bigint {
  const text = typeof quantity === 'number' ? numberText(quantity) : quantity.trim();
  const match = QUANTITY.exec(text);
  const [, sign = '', whole = '', fraction = '', exponent, suffix = ''] = match ?? [];
  if (!match || (whole === '' && fraction === '')) throw new Error(`invalid quantity "${quantity}"`);
  const decimal = (exponent !== undefined ? Number(exponent) : (DECIMAL_EXPONENT[suffix] ?? 0)) + 9 - fraction.length;
  if (Math.abs(decimal) > MAX_EXPONENT) throw new Error(`invalid quantity "${quantity}": exponent out of range`);
  let numerator = BigInt(whole + fraction || '0') * 2n ** BigInt(BINARY_EXPONENT[suffix] ?? 0);
  let denominator = 1n;
  if (decimal >= 0) numerator *= 10n ** BigInt(decimal);
  else denominator = 10n ** BigInt(-decimal);
  const nanos = (numerator + denominator - 1n) / denominator; // ceiling: rounds up like the API server
  return sign === '-' ? -nanos : nanos;
}

/** -1, 0 or 1 as a is less than, equal to or greater than b, compared exactly. */
export function compareQuantities(a: string | number, b: string | number): -1 | 0 | 1 {
  const x = quantityNanos(a);
  const y = quantityNanos(b);
  return x < y ? -1 : x > y ? 1 : 0;
}

/** Whether two strings are the same quantity ("0.7" and "700m"); false when either is not a quantity. */
export function sameQuantity(a: string, b: string): boolean {
  try {
    return compareQuantities(a, b) === 0;
  } catch {
    return false;
  }
}

/** Millicores (or milli-units), rounded up, as the API server's MilliValue(). */
export function milliValue(quantity: string | number): bigint {
  return ceilDiv(quantityNanos(quantity), 1_000_000n);
}

/** Whole bytes (or units), rounded up, as the API server's Value(). */
export function wholeValue(quantity: string | number): bigint {
  return ceilDiv(quantityNanos(quantity), 1_000_000_000n);
}

/** The value in base units (cores, bytes) as the nearest float; throws on a malformed quantity. */
export function parseQuantity(quantity: string | number): number {
  if (typeof quantity === 'number') return quantity;
  const nanos = quantityNanos(quantity);
  // Whole units stay exact up to 2^53 bytes; fractions are divided once, so "700m" is 0.7.
  return nanos % 1_000_000_000n === 0n ? Number(nanos / 1_000_000_000n) : Number(nanos) / 1e9;
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

function ceilDiv(n: bigint, d: bigint): bigint {
  const q = n / d;
  return n % d > 0n ? q + 1n : q;
}

/** A JSON number as quantity text: its shortest decimal form, which is what a client meant by it. */
function numberText(value: number): string {
  if (!Number.isFinite(value)) throw new Error(`invalid quantity ${value}`);
  return String(value);
}
