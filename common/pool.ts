// The SandboxPool custom resource (sandbox-bridge.io/v1alpha1, cluster-scoped): the one
// declarative policy both programs read. POOL_DEFAULTS below is the one definition of the pool's
// defaults: the CRD (charts/sandbox-bridge/crds/, which defaults and validates these fields at
// the API server) and the chart's values (which seed the default pool) must say the same, and
// common/pool.test.ts fails when they do not. withDefaults() applies them to an object from
// elsewhere (config seeding, tests).
import type { V1Condition, V1Toleration } from '@kubernetes/client-node';
import { API_GROUP } from './labels.js';

export const POOL_GROUP = API_GROUP;
export const POOL_VERSION = 'v1alpha1';
export const POOL_PLURAL = 'sandboxpools';
export const POOL_KIND = 'SandboxPool';
export const POOL_API_VERSION = `${POOL_GROUP}/${POOL_VERSION}`;

export type PodSecurityLevel = 'restricted' | 'baseline' | 'privileged';

export interface BoxPolicy {
  /** Image used when a create request names none. */
  defaultImage: string;
  /** Cores, as a Kubernetes quantity string ("1", "500m"). */
  defaultCpu: string;
  maxCpu: string;
  /** Bytes, as a Kubernetes quantity string ("512Mi"). */
  defaultMemory: string;
  maxMemory: string;
  /** emptyDir size limits for /workspace and /tmp. */
  workspaceSizeLimit: string;
  tmpSizeLimit: string;
  /** Where boxes may run; e.g. a dedicated node pool. */
  nodeSelector?: Record<string, string>;
  tolerations?: V1Toleration[];
}

export interface EgressPolicy {
  /** Destinations boxes may reach (besides cluster DNS). */
  allowedCIDRs: string[];
  /** Carved out of allowedCIDRs; by default cloud metadata and link-local. */
  deniedCIDRs: string[];
}

export interface SandboxPoolSpec {
  /** The sandbox namespace the pool's boxes live in. */
  namespace: string;
  podSecurityLevel: PodSecurityLevel;
  /** Global cap on boxes (enforced atomically by a ResourceQuota on pods). */
  maxBoxes: number;
  maxBoxesPerSession: number;
  maxExecsPerBox: number;
  defaultTtlSeconds: number;
  /** Optional namespace-wide totals for the ResourceQuota. */
  quota?: { cpu?: string; memory?: string };
  box: BoxPolicy;
  /** Images a create request may name besides box.defaultImage. */
  allowedImages: string[];
  allowedRuntimeClassNames: string[];
  allowedServiceAccountNames: string[];
  egress: EgressPolicy;
}

export interface SandboxPoolStatus {
  observedGeneration?: number;
  conditions?: V1Condition[];
  activeBoxes?: number;
  totalBoxesCreated?: number;
  /**
   * Written by the operator: the newest box creation already counted into totalBoxesCreated
   * (creationTimestamp, second resolution, and the UIDs counted within that second), so a
   * restarted or new leader continues the count without counting a box twice.
   */
  boxCountWatermark?: { creationTimestamp: string; uids: string[] };
}

export interface SandboxPool {
  apiVersion: typeof POOL_API_VERSION;
  kind: typeof POOL_KIND;
  metadata: { name: string; generation?: number; resourceVersion?: string; uid?: string; creationTimestamp?: Date | string };
  spec: SandboxPoolSpec;
  status?: SandboxPoolStatus;
}

/**
 * A published runtime base image, fully qualified (registry, repository, tag) so that no node's
 * short-name or mirror setting resolves it to something else: Debian slim with sh and coreutils,
 * and Python, what agents most often run. Pin a digest or a mirror in production (README).
 */
export const DEFAULT_BOX_IMAGE = 'docker.io/library/python:3.13-slim-bookworm';

export const POOL_DEFAULTS: Omit<SandboxPoolSpec, 'namespace'> = {
  podSecurityLevel: 'restricted',
  maxBoxes: 50,
  maxBoxesPerSession: 3,
  maxExecsPerBox: 5,
  defaultTtlSeconds: 3600,
  box: {
    defaultImage: DEFAULT_BOX_IMAGE,
    defaultCpu: '1',
    maxCpu: '4',
    defaultMemory: '512Mi',
    maxMemory: '4Gi',
    workspaceSizeLimit: '1Gi',
    tmpSizeLimit: '256Mi',
  },
  allowedImages: [],
  allowedRuntimeClassNames: [],
  allowedServiceAccountNames: [],
  egress: {
    allowedCIDRs: ['0.0.0.0/0'],
    deniedCIDRs: ['169.254.169.254/32', '169.254.0.0/16'],
  },
};

/** A spec with every field the CRD defaults filled in. */
export function withDefaults(spec: Partial<SandboxPoolSpec> & { namespace: string }): SandboxPoolSpec {
  return {
    ...POOL_DEFAULTS,
    ...spec,
    box: { ...POOL_DEFAULTS.box, ...spec.box },
    egress: { ...POOL_DEFAULTS.egress, ...spec.egress },
  };
}
