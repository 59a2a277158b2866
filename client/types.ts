// Request and response types of the bridge API, derived from the bridge's own zod schemas
// (bridge/schemas.ts), so client and server cannot drift apart.
//
// Every import here is `import type`: the compiler erases it, so zod and the bridge never enter the
// client's runtime module graph and edge bundles stay free of them. (The emitted .d.ts files still
// refer to bridge/schemas and zod for types; both ship with this package.) Requests use z.input
// (fields with server defaults are optional), responses z.output (what the bridge sends).
import type { z } from 'zod';
import type * as S from '../bridge/schemas.js';
import type { openApiDocument } from '../bridge/openapi.js';

export type CreateBoxRequest = z.input<typeof S.CreateBoxRequest>;
export type ExecRequest = z.input<typeof S.ExecRequest>;
export type SetEnvRequest = z.input<typeof S.SetEnvRequest>;
export type StartProcessRequest = z.input<typeof S.StartProcessRequest>;
export type CreateSnapshotRequest = z.input<typeof S.CreateSnapshotRequest>;
export type ProcessSignal = (typeof S.SIGNALS)[number];
/** GET /sandboxes query parameters, as the bridge names them. */
export type SandboxesQuery = z.input<typeof S.SandboxesQuery>;

export type Health = z.output<typeof S.Health>;
export type ClusterInfo = z.output<typeof S.ClusterInfo>;
export type NodeList = z.output<typeof S.NodeList>;
export type SandboxList = z.output<typeof S.SandboxList>;
export type ClusterCapacity = z.output<typeof S.ClusterCapacity>;
export type PodMetricsList = z.output<typeof S.PodMetricsList>;
export type BoxCreated = z.output<typeof S.BoxCreated>;
export type BoxStatus = z.output<typeof S.BoxStatus>;
export type BoxDeleted = z.output<typeof S.BoxDeleted>;
export type Snapshot = z.output<typeof S.Snapshot>;
export type SnapshotList = z.output<typeof S.SnapshotList>;
export type SnapshotDeleted = z.output<typeof S.SnapshotDeleted>;
export type Restored = z.output<typeof S.Restored>;
export type ExecResult = z.output<typeof S.ExecResult>;
export type FileRead = z.output<typeof S.FileRead>;
export type FileWritten = z.output<typeof S.FileWritten>;
export type EnvUpdated = z.output<typeof S.EnvUpdated>;
export type ProcessInfo = z.output<typeof S.ProcessInfo>;
export type ProcessList = z.output<typeof S.ProcessList>;
export type StdinWritten = z.output<typeof S.StdinWritten>;
export type FileList = z.output<typeof S.FileList>;
export type FileDeleted = z.output<typeof S.FileDeleted>;
export type ArchiveWritten = z.output<typeof S.ArchiveWritten>;
/** One line of a streamed exec (`execStream`) or of process output (`processOutput`). */
export type OutputEvent = z.output<typeof S.OutputLine>;
/** One line of a file watch (`watchFiles`): ready, create/write/remove/rename/chmod, overflow, end. */
export type WatchEvent = z.output<typeof S.WatchEvent>;
/** GET /boxes/:id/metrics: the box's use now (and with since, its history). */
export type BoxMetrics = z.output<typeof S.BoxMetrics>;
export type ErrorBody = z.output<typeof S.ErrorBody>;
/** Error types the bridge reports in `{"error": {"type", "message"}}`. */
export type BridgeErrorType = ErrorBody['error']['type'];
export type OpenApiDocument = ReturnType<typeof openApiDocument>;

// ---- egress (docs/api.md "Egress") ----
/** GET/PATCH /boxes/:id/egress: what the box may reach, and the hosts it has credentials for. */
export type BoxEgress = z.output<typeof S.BoxEgress>;
export type SetBoxEgressRequest = z.input<typeof S.SetBoxEgressRequest>;
/** PUT /boxes/:id/egress/credentials: host -> header name -> value (write-only). */
export type EgressCredentials = z.input<typeof S.SetEgressCredentialsRequest>;
export type EgressCredentialsSet = z.output<typeof S.EgressCredentialsSet>;

// ---- issue 21 routes (docs/platform.md) ----
/** PUT /boxes/:id/context: what the box's snapshots are labelled with, and who its outbound calls are for. */
export type BackupContext = z.input<typeof S.BackupContext>;
export type OutboundContext = z.input<typeof S.OutboundContext>;
export type SetContextRequest = z.input<typeof S.SetContextRequest>;
export type BoxContext = z.output<typeof S.ContextSet>;
export type KeepAlive = z.output<typeof S.KeepaliveResult>;
/** GET /snapshots filters (at least one). */
export type SnapshotFilter = Omit<z.input<typeof S.SnapshotsQuery>, 'limit'>;
export type MountOutputsRequest = z.input<typeof S.MountOutputsRequest>;
export type OutputsMount = z.output<typeof S.OutputsMounted>;
export type SessionOutputs = z.output<typeof S.SessionOutputList>;

export type MountMemoryRequest = z.input<typeof S.MountMemoryRequest>;
export type MemoryMount = z.output<typeof S.MemoryMounted>;
export type MemorySynced = z.output<typeof S.MemorySynced>;

// ---- ports and preview links (docs/ports.md) ----
export type CreatePreviewRequest = z.input<typeof S.CreatePreviewRequest>;
/** POST /boxes/:id/ports/:port/preview: a link a browser opens without the bridge token, until expires_at. */
export type PreviewLink = z.output<typeof S.PreviewCreated>;
export type PreviewsRevoked = z.output<typeof S.PreviewsRevoked>;
