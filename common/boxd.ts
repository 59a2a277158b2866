// boxd, the in-box agent: what bridge and operator both need to know about it (where it
// listens, where the box pod gets it from, and the per-box credential). The wire protocol
// itself is spoken only by common/boxd-client.ts and bridge/boxd/frames.ts (contract: boxd/PROTOCOL.md).
import { createHmac, randomBytes } from 'node:crypto';

/** The one port boxd listens on in every box. The box NetworkPolicy admits only bridge pods to it. */
export const BOXD_PORT = 7771;

/** Where the box container finds boxd (an emptyDir the init container fills). */
export const BOXD_BIN_DIR = '/opt/sandbox-bridge/bin';
export const BOXD_BINARY = `${BOXD_BIN_DIR}/boxd`;
/** Where the box's Secret is mounted (only the keys below): the credential and the env copy. */
export const BOXD_SECRET_DIR = '/opt/sandbox-bridge/secret';

/** Keys of a box's Secret. */
export const BOX_SECRET_KEYS = {
  /** boxd's credential (derived, see boxdToken). */
  token: 'token',
  /** The box's env as one JSON object: boxd loads it at start; the bridge keeps it current. */
  env: 'env',
} as const;

/** Pod annotation: the boxd protocol version a box was created with; boxes without it predate boxd. */
export const BOXD_VERSION_ANNOTATION = 'sandbox-bridge.io/boxd';
export const BOXD_PROTOCOL_VERSION = 'v1';
/** Pod annotation: the random value the pod's credential is derived from (not a secret itself). */
export const BOXD_NONCE_ANNOTATION = 'sandbox-bridge.io/boxd-nonce';

/** A fresh nonce for a new box pod. */
export function newNonce(): string {
  return randomBytes(16).toString('hex');
}

/**
 * The credential of one box pod: HMAC-SHA256 of its identity under a key only bridge and
 * operator hold. Any replica derives it without an API call. The nonce is chosen before the pod
 * exists, so the Secret carrying the credential can be made first (the kubelet then never waits
 * for it); every pod gets a new one, so a box recreated under the same name never accepts the
 * old one's token.
 */
export function boxdToken(key: string | Buffer, namespace: string, pod: string, nonce: string): string {
  return createHmac('sha256', key).update(`boxd-token:v1:${namespace}/${pod}/${nonce}`).digest('hex');
}
