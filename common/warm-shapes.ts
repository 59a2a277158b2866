// Warm shapes (docs/warm-pool.md "Shapes"): what a pool keeps warm, and which warm boxes a
// create may claim. A pool keeps warm boxes of its default shape (spec.warm.count, the single
// form) and of each entry of spec.warm.shapes; a create claims one of exactly its shape, else one
// of the same image and runtime class that it resizes in place (Kubernetes in-place pod resize).
// Pure: the operator plans with it, the bridge picks with it.
import { createHash } from 'node:crypto';
import { warmShape, type BoxShape } from './box-pod.js';
import type { SandboxPoolSpec } from './pool.js';
import { formatCpu, formatMemory, parseQuantity } from './quantity.js';

/** One shape the pool keeps warm: how many ready at least, and up to how many by recent demand. */
export interface WarmShape {
  /**
   * Which of the pool's warm shapes: "default" (warm.count's), or "shape-<i>" (warm.shapes[i]).
   * Warm pods carry it (ANNOTATIONS.warmShape), so an edit of a shape rolls its pods like any
   * template change, and box pods carry the one serving their shape (ANNOTATIONS.warmDemand).
   */
  id: string;
  /** A digest of what the shape runs on (image, cpu, memory, runtime class). */
  key: string;
  shape: BoxShape;
  count: number;
  max?: number | undefined;
}

/** The id of the pool's default warm shape (warm.count's); older warm pods without an id are of it. */
export const DEFAULT_SHAPE = 'default';

/** A digest of what a box runs on (no service account: warm boxes have none). */
export function shapeKey(shape: BoxShape): string {
  const id = [shape.image, formatCpu(shape.cpuCores), formatMemory(shape.memoryBytes), shape.runtimeClassName ?? ''].join('\n');
  return createHash('sha256').update(id).digest('hex').slice(0, 16);
}

export function sameShape(a: BoxShape, b: BoxShape): boolean {
  return shapeKey(a) === shapeKey(b);
}

/**
 * The shapes a pool keeps warm: the default shape when warm.count or warm.max asks for it, then
 * each of warm.shapes (fields left out take the pool's defaults). A shape listed twice is kept
 * once, the first time.
 */
export function warmShapes(spec: SandboxPoolSpec): WarmShape[] {
  const out: WarmShape[] = [];
  const add = (id: string, shape: BoxShape, count: number, max: number | undefined) => {
    const key = shapeKey(shape);
    if (out.some((w) => w.key === key) || !allowed(spec, shape)) return;
    out.push({ id, key, shape, count, ...(max !== undefined ? { max } : {}) });
  };
  const { warm } = spec;
  if (warm.count > 0 || (warm.max ?? 0) > 0) add(DEFAULT_SHAPE, warmShape(spec), warm.count, warm.max);
  for (const [i, s] of (warm.shapes ?? []).entries()) {
    add(
      `shape-${i}`,
      {
        image: s.image ?? spec.box.defaultImage,
        cpuCores: parseQuantity(s.cpu ?? spec.box.defaultCpu),
        memoryBytes: parseQuantity(s.memory ?? spec.box.defaultMemory),
        ...((s.runtimeClassName ?? warm.runtimeClassName) ? { runtimeClassName: s.runtimeClassName ?? warm.runtimeClassName } : {}),
      },
      s.count,
      s.max,
    );
  }
  return out;
}

/** A shape the pool lets a create ask for (its default image or allowlists, within its maxima): only such are kept warm. */
function allowed(spec: SandboxPoolSpec, shape: BoxShape): boolean {
  const image = shape.image === spec.box.defaultImage || spec.allowedImages.some((p) => (p.endsWith('*') ? shape.image.startsWith(p.slice(0, -1)) : p === shape.image));
  const runtime = !shape.runtimeClassName || spec.allowedRuntimeClassNames.includes(shape.runtimeClassName);
  return image && runtime && shape.cpuCores <= parseQuantity(spec.box.maxCpu) && shape.memoryBytes <= parseQuantity(spec.box.maxMemory);
}

/** A warm shape a create may claim from, and whether the claimed pod must be resized to the create's shape. */
export interface WarmChoice {
  warm: WarmShape;
  resize: boolean;
}

/**
 * Where a create of `want` is served warm, best first: the warm shape equal to it (no resize),
 * then the others of the same image and runtime class, resized in place: first those it shrinks
 * (always fits where the pod runs), least excess first, then those it grows, least growth first.
 * None for a create naming a service account (warm boxes have none).
 */
export function warmChoices(spec: SandboxPoolSpec, want: BoxShape): WarmChoice[] {
  if (want.serviceAccountName) return [];
  const shapes = warmShapes(spec);
  const exact = shapes.filter((w) => sameShape(w.shape, want)).map((warm) => ({ warm, resize: false }));
  const resizable = shapes.filter((w) => !sameShape(w.shape, want) && w.shape.image === want.image && (w.shape.runtimeClassName ?? '') === (want.runtimeClassName ?? ''));
  // Relative sizes, so a core and a GiB weigh alike whatever the pool's scale.
  const cost = (w: WarmShape) => {
    const cpu = (w.shape.cpuCores - want.cpuCores) / Math.max(want.cpuCores, 0.001);
    const memory = (w.shape.memoryBytes - want.memoryBytes) / Math.max(want.memoryBytes, 1);
    const grows = cpu < 0 || memory < 0;
    return { grows, by: grows ? Math.max(0, -cpu) + Math.max(0, -memory) : cpu + memory };
  };
  const ranked = resizable
    .map((warm) => ({ warm, c: cost(warm) }))
    .sort((a, b) => Number(a.c.grows) - Number(b.c.grows) || a.c.by - b.c.by)
    .map(({ warm }) => ({ warm, resize: true }));
  return [...exact, ...ranked];
}
