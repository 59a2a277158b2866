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

export type BoxdDelivery = 'InitContainer' | 'ImageVolume';

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
  /** The memory-store sidecar (docs/mounts.md); off by default. */
  memoryStores: MemoryStorePolicy;
  /**
   * How boxd reaches a box: InitContainer (default) copies it from the boxd image into an
   * emptyDir; ImageVolume mounts the boxd image itself, read-only (Kubernetes image volumes; the
   * nodes' runtime must mount them: containerd >= 2.1, CRI-O >= 1.31). No init container to run
   * and be noticed done: a cold box answers about a second sooner (docs/performance.md).
   */
  boxdDelivery: BoxdDelivery;
  /** Where boxes may run; e.g. a dedicated node pool. */
  nodeSelector?: Record<string, string>;
  tolerations?: V1Toleration[];
}

export interface EgressPolicy {
  /** Destinations boxes may reach (besides cluster DNS). */
  allowedCIDRs: string[];
  /**
   * Destinations they may not: the most specific entry of the two lists decides, so an allowed
   * /32 inside a denied range opens just that address. By default every private, shared,
   * link-local (cloud metadata) and loopback-like range, which covers the usual pod and service ranges.
   */
  deniedCIDRs: string[];
  /** Cluster DNS, reachable on port 53 (UDP and TCP) only, whatever the CIDR lists say. */
  dns: DnsPeers;
  /**
   * direct: boxes connect out themselves, bounded by the CIDR lists above. gateway: through the
   * egress gateway (docs/egress.md), which decides by domain and injects credentials; the box
   * NetworkPolicy allows only the gateway's pods and DNS (the CIDR lists do not apply). Default
   * direct: a gateway is a component to run (and a CA to trust), and pools made before it existed
   * must keep working unchanged.
   */
  mode: EgressMode;
  /** Gateway mode: the domains boxes may reach (patterns as gateway/policy's: name, *.name, *, IP). */
  domains: EgressDomains;
  /** Gateway mode: the gateway's pods, the only destination (besides DNS) the box NetworkPolicy allows. */
  gateway: GatewayPeers;
  /**
   * Gateway mode: a service of the platform's that the gateway asks for the headers to add to a
   * box's requests to the hosts listed, so secrets can stay in the platform's own vault
   * (docs/egress.md "Credential resolver"). Registered credentials of a box win over it.
   */
  credentialResolver?: CredentialResolver;
}

/** The CRD's defaults of spec.egress.credentialResolver. */
export const RESOLVER_DEFAULTS = { ttlSeconds: 300, timeoutSeconds: 5 } as const;

export interface CredentialResolver {
  /** http(s) URL the gateway POSTs {box_id, pool, host, port, tenant_id, session_id} to, signed. */
  url: string;
  /** Hosts it is asked about (patterns as domains.allow; exact names or *.name). Others never are. */
  hosts: string[];
  /** How long an answer is kept per (box, host) unless the answer says less. */
  ttlSeconds: number;
  /** How long the gateway waits for it; past that the connection is refused (502), never sent without. */
  timeoutSeconds: number;
}

/** Where the egress gateway's pods run and the port they proxy on (the chart's gateway Deployment). */
export interface GatewayPeers {
  namespace: string;
  podLabels: Record<string, string>;
  port: number;
  /** The gateway's Service in namespace: boxes' proxy is http://<service>.<namespace>.svc:<port>. */
  service: string;
  /** Instead of <service>.<namespace>.svc: a cluster domain of its own, or an address where there is no cluster DNS. */
  host?: string;
}

export type EgressMode = 'direct' | 'gateway';

export interface EgressDomains {
  /** Nothing is reachable through the gateway unless listed here; a box may narrow it, never widen it. */
  allow: string[];
  /** Refused whatever allows them (deny wins). */
  deny: string[];
  /** Hosts boxes may also reach over plain HTTP (they must be allowed too; credentials are never sent there). */
  plainHttp: string[];
}

export interface DnsPeers {
  /** Namespace and labels of the cluster DNS pods (kube-dns / CoreDNS). */
  namespace: string;
  podLabels: Record<string, string>;
  /** Node-local DNS caches and other DNS addresses outside the pod network (NodeLocal DNSCache: 169.254.20.10). */
  cidrs: string[];
}

/**
 * Warm boxes: pods of the pool's default shape, started ahead and answering, that a create of
 * that shape claims instead of waiting for a new pod.
 */
export interface WarmPolicy {
  /** Ready warm boxes to keep; 0 turns warm boxes off. With `max` above it, the minimum. */
  count: number;
  /** When above `count`: keep as many as were claimed in the last `windowSeconds`, up to this. */
  max?: number;
  /** The window of recent claims that sizes the pool between count and max. */
  windowSeconds: number;
  /** While warm boxes are replaced (a template change), at least this many stay ready (default: count). */
  minAvailable?: number;
  /** Runtime class of the warm boxes (must be allowed); a create names it to be served warm. */
  runtimeClassName?: string;
  /**
   * More shapes to keep warm besides the default one (count above), each with its own count (and
   * max, sized by that shape's recent demand). A create of another shape with the same image and
   * runtime class claims one and has it resized in place (docs/warm-pool.md "Shapes").
   */
  shapes?: WarmShapePolicy[];
}

/** One entry of spec.warm.shapes: fields left out take the pool's defaults (box.defaultImage, defaultCpu, defaultMemory, warm.runtimeClassName). */
export interface WarmShapePolicy {
  image?: string;
  /** Cores, a Kubernetes quantity ("500m"), within box.maxCpu. */
  cpu?: string;
  /** Bytes, a Kubernetes quantity ("1Gi"), within box.maxMemory. */
  memory?: string;
  runtimeClassName?: string;
  count: number;
  max?: number;
}

/**
 * Where the bridge and operator pods run: the only peers a box admits, and only to boxd's port
 * (the operator's idle sleep fences boxd and streams the workspace, docs/lifecycle.md).
 */
export interface BridgePeers {
  namespace: string;
  podLabels: Record<string, string>;
  operatorPodLabels: Record<string, string>;
}

/** Snapshots of boxes in the object store (docs/snapshots.md). */
export interface SnapshotPolicy {
  /** How long a snapshot is kept; the operator deletes it then. A request may ask for less, never more. */
  retentionSeconds: number;
  /** Take a final snapshot before every box delete (a request overrides with ?snapshot=true|false). */
  onDelete: boolean;
  /**
   * The most a snapshot may hold (data bytes: sparse holes not counted, a hard-linked file once),
   * a Kubernetes quantity; unset: the box's workspaceSizeLimit. boxd refuses a larger workspace
   * before a byte moves (an idle box then stays awake), and a restore accepts what a snapshot
   * taken under it holds.
   */
  maxBytes?: string;
  /** The most entries (files, directories, links) a snapshot may hold, and a restore write. */
  maxEntries: number;
}

/**
 * Memory stores (docs/mounts.md): a sidecar in every box pod of the pool (boxd's mounts mode)
 * fills /mnt/memory, which the box mounts read-only, from the object store. Off by default: it
 * costs every box of the pool a container, its memory and a little start time, whether a store
 * is ever mounted or not. Takes effect for pods made after the change (warm pods are replaced).
 */
export interface MemoryStorePolicy {
  enabled: boolean;
  /** emptyDir size limit of each of the two memory volumes (read-only stores; read-write stores). */
  sizeLimit: string;
}

/** Idle sleep (docs/snapshots.md "Idle sleep"): needs an object store. */
export interface IdlePolicy {
  /**
   * A box with no bridge call for this long (and no background process younger than the
   * 30-minute keepalive cap) is snapshotted and its pod deleted; the next call wakes it. 0: never.
   */
  sleepAfterSeconds: number;
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
  bridge: BridgePeers;
  snapshots: SnapshotPolicy;
  warm: WarmPolicy;
  idle: IdlePolicy;
}

export interface SandboxPoolStatus {
  observedGeneration?: number;
  conditions?: V1Condition[];
  activeBoxes?: number;
  totalBoxesCreated?: number;
  /** Warm boxes ready to claim, and how many the operator keeps now. */
  warmReady?: number;
  warmDesired?: number;
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
 * and Python, what agents most often run. Pin a digest or a mirror in production (docs/operator.md).
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
    memoryStores: { enabled: false, sizeLimit: '256Mi' },
    boxdDelivery: 'InitContainer',
  },
  allowedImages: [],
  allowedRuntimeClassNames: [],
  allowedServiceAccountNames: [],
  egress: {
    allowedCIDRs: ['0.0.0.0/0'],
    deniedCIDRs: [
      // RFC 1918 (also where most clusters put pods and services), shared address space (RFC 6598),
      // link-local (cloud metadata at 169.254.169.254), loopback and "this network".
      '10.0.0.0/8',
      '172.16.0.0/12',
      '192.168.0.0/16',
      '100.64.0.0/10',
      '169.254.0.0/16',
      '127.0.0.0/8',
      '0.0.0.0/8',
      // The same for IPv6, in effect once a pool allows ::/0: unique local, link-local, loopback and
      // unspecified. (IPv4-mapped ::ffff:a.b.c.d leaves the box as IPv4, so the ranges above apply.)
      'fc00::/7',
      'fe80::/10',
      '::1/128',
      '::/128',
    ],
    dns: { namespace: 'kube-system', podLabels: { 'k8s-app': 'kube-dns' }, cidrs: ['169.254.20.10/32'] },
    mode: 'direct',
    domains: { allow: [], deny: [], plainHttp: [] },
    gateway: {
      namespace: 'sandbox-bridge',
      podLabels: { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/component': 'egress-gateway' },
      port: 3128,
      service: 'sandbox-bridge-egress-gateway',
    },
  },
  bridge: {
    namespace: 'sandbox-bridge',
    podLabels: { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/component': 'bridge' },
    operatorPodLabels: { 'app.kubernetes.io/name': 'sandbox-bridge', 'app.kubernetes.io/component': 'operator' },
  },
  // The agent platform's default backup retention (7 days).
  snapshots: { retentionSeconds: 7 * 24 * 3600, onDelete: false, maxEntries: 1_000_000 },
  warm: { count: 0, windowSeconds: 60 },
  // The agent platform's sleepAfter (5 minutes).
  idle: { sleepAfterSeconds: 300 },
};

/** A spec with every field the CRD defaults filled in. */
export type PoolSpecInput = Partial<Omit<SandboxPoolSpec, 'egress' | 'bridge' | 'snapshots' | 'warm' | 'idle' | 'box'>> & {
  namespace: string;
  egress?: Partial<Omit<EgressPolicy, 'dns' | 'domains' | 'gateway' | 'credentialResolver'>> & {
    dns?: Partial<DnsPeers>;
    domains?: Partial<EgressDomains>;
    gateway?: Partial<GatewayPeers>;
    credentialResolver?: Pick<CredentialResolver, 'url' | 'hosts'> & Partial<CredentialResolver>;
  };
  bridge?: Partial<BridgePeers>;
  snapshots?: Partial<SnapshotPolicy>;
  warm?: Partial<WarmPolicy>;
  idle?: Partial<IdlePolicy>;
  box?: Partial<Omit<BoxPolicy, 'memoryStores'>> & { memoryStores?: Partial<MemoryStorePolicy> };
};

export function withDefaults(spec: PoolSpecInput): SandboxPoolSpec {
  const { credentialResolver, ...egress } = spec.egress ?? {};
  return {
    ...POOL_DEFAULTS,
    ...spec,
    box: { ...POOL_DEFAULTS.box, ...spec.box, memoryStores: { ...POOL_DEFAULTS.box.memoryStores, ...spec.box?.memoryStores } },
    egress: {
      ...POOL_DEFAULTS.egress,
      ...egress,
      dns: { ...POOL_DEFAULTS.egress.dns, ...egress.dns },
      domains: { ...POOL_DEFAULTS.egress.domains, ...egress.domains },
      gateway: { ...POOL_DEFAULTS.egress.gateway, ...egress.gateway },
      ...(credentialResolver ? { credentialResolver: { ...RESOLVER_DEFAULTS, ...credentialResolver } } : {}),
    },
    bridge: { ...POOL_DEFAULTS.bridge, ...spec.bridge },
    snapshots: { ...POOL_DEFAULTS.snapshots, ...spec.snapshots },
    warm: { ...POOL_DEFAULTS.warm, ...spec.warm },
    idle: { ...POOL_DEFAULTS.idle, ...spec.idle },
  };
}
