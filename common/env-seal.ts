// Sealing a box's env for a snapshot: AES-256-GCM under a key from a Secret
// (SNAPSHOT_ENCRYPTION_KEY[_FILE]), bound to the snapshot id (additional authenticated data), so
// the object store only ever holds ciphertext and a sealed env cannot be moved to another
// snapshot. Several keys may be configured, one per line: the first seals, all open, so a key
// is rotated by putting the new one first and dropping the old one once its snapshots expired.
// docs/snapshots.md has the decision and its trade-offs.
import { createCipheriv, createDecipheriv, createHash, hkdfSync, randomBytes } from 'node:crypto';
import { BridgeError } from './errors.js';
import type { SealedEnv } from './snapshots.js';

interface Key {
  kid: string;
  bytes: Buffer;
}

export class EnvSealer {
  private readonly keys: Key[];

  /** keys: secrets of at least 32 characters; the first one seals. */
  constructor(keys: readonly string[]) {
    if (keys.length === 0) throw new Error('EnvSealer needs at least one key');
    this.keys = keys.map((secret) => {
      // A fixed-purpose derivation, so the configured secret is never used as a cipher key directly.
      const bytes = Buffer.from(hkdfSync('sha256', secret, '', 'sandbox-bridge snapshot env v1', 32));
      return { kid: createHash('sha256').update(bytes).digest('hex').slice(0, 16), bytes };
    });
  }

  seal(env: Record<string, string>, snapshotId: string): SealedEnv {
    const key = this.keys[0]!;
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', key.bytes, iv);
    cipher.setAAD(Buffer.from(snapshotId, 'utf8'));
    const data = Buffer.concat([cipher.update(JSON.stringify(env), 'utf8'), cipher.final()]);
    return { alg: 'A256GCM', kid: key.kid, iv: iv.toString('base64'), tag: cipher.getAuthTag().toString('base64'), data: data.toString('base64') };
  }

  open(sealed: SealedEnv, snapshotId: string): Record<string, string> {
    const key = this.keys.find((k) => k.kid === sealed.kid);
    if (!key || sealed.alg !== 'A256GCM') {
      throw new BridgeError('internal_error', `snapshot ${snapshotId}: its env was sealed with a key this bridge does not have (SNAPSHOT_ENCRYPTION_KEY)`);
    }
    try {
      const decipher = createDecipheriv('aes-256-gcm', key.bytes, Buffer.from(sealed.iv, 'base64'));
      decipher.setAAD(Buffer.from(snapshotId, 'utf8'));
      decipher.setAuthTag(Buffer.from(sealed.tag, 'base64'));
      const plain = Buffer.concat([decipher.update(Buffer.from(sealed.data, 'base64')), decipher.final()]);
      return JSON.parse(plain.toString('utf8')) as Record<string, string>;
    } catch {
      throw new BridgeError('internal_error', `snapshot ${snapshotId}: its env does not authenticate (altered, or moved from another snapshot)`);
    }
  }
}
