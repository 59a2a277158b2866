// A box's egress policy and credentials (docs/api.md "Egress", docs/egress.md "Where the policy
// lives"): kept on the box's record, where the egress gateway reads them. Every call here works on
// the record alone, so none wakes a sleeping box (a sleeping box makes no connection; its record
// keeps the policy for its wake). Credentials are write-only: no answer, log line or error message
// carries a value. Free of Express types.
import type * as k8s from '@kubernetes/client-node';
import {
  EGRESS_CREDENTIALS_KEY,
  allowAnnotation,
  boxAllowOf,
  checkBoxAllow,
  checkCredentials,
  credentialHostsOf,
  requireGatewayMode,
} from '../../common/box-egress.js';
import type { BoxRecords } from '../../common/box-records.js';
import { BridgeError } from '../../common/errors.js';
import { LABELS, SECRET_COMPONENTS, boxRecordName } from '../../common/labels.js';
import type { KubeCall } from '../kube/instrument.js';
import type { PolicySource } from '../kube/policy.js';
import type { BoxService } from './boxes.js';

const MAX_ATTEMPTS = 5;

export interface EgressServiceDeps {
  core: k8s.CoreV1Api;
  call: KubeCall;
  namespace: string;
  policy: PolicySource;
  boxes: Pick<BoxService, 'locate'>;
  records: Pick<BoxRecords, 'read' | 'annotate'>;
  now?: () => Date;
}

export interface BoxEgress {
  box_id: string;
  mode: string;
  /** The box's own list, or null: the pool's applies. */
  box_allow: string[] | null;
  /** What the box may reach: the box's list when it has one (each entry within the pool's), else the pool's. */
  allow: string[];
  deny: string[];
  plain_http: string[];
  /** Hosts with registered credentials; never the values. */
  credential_hosts: string[];
}

export class EgressService {
  constructor(private readonly deps: EgressServiceDeps) {}

  async get(boxId: string): Promise<BoxEgress> {
    await this.deps.boxes.locate(boxId);
    return this.view(boxId, await this.ownRecord(boxId));
  }

  /** Sets (or with null, drops) the box's allow list; each entry must be within the pool's. */
  async setAllow(boxId: string, allow: string[] | null): Promise<BoxEgress> {
    const spec = this.deps.policy.current();
    if (allow === null) requireGatewayMode(spec.egress, this.deps.policy.poolName);
    else checkBoxAllow(allow, spec.egress, this.deps.policy.poolName);
    await this.deps.boxes.locate(boxId);
    const record = await this.deps.records.annotate(boxId, allowAnnotation(allow));
    return this.view(boxId, record);
  }

  /**
   * Replaces the box's credentials ({} removes them all): a compare-and-swap on the record's
   * data, so a concurrent write of its env is never lost. Answers with the hosts only.
   */
  async setCredentials(boxId: string, credentials: Record<string, Record<string, string>>) {
    requireGatewayMode(this.deps.policy.current().egress, this.deps.policy.poolName);
    const checked = checkCredentials(credentials);
    await this.deps.boxes.locate(boxId);
    const value = Buffer.from(JSON.stringify(checked), 'utf8').toString('base64');
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      const record = await this.ownRecord(boxId);
      try {
        const written = await this.deps.call('update box record', () =>
          this.deps.core.replaceNamespacedSecret({
            name: boxRecordName(boxId),
            namespace: this.deps.namespace,
            body: { ...record, data: { ...record.data, [EGRESS_CREDENTIALS_KEY]: value } },
          }),
        );
        return { box_id: boxId, credential_hosts: credentialHostsOf(written), updated_at: (this.deps.now?.() ?? new Date()).toISOString() };
      } catch (err) {
        if (err instanceof BridgeError && err.type === 'conflict') continue; // a concurrent change: read again
        if (err instanceof BridgeError && err.type === 'not_found') throw new BridgeError('not_found', `box ${boxId} not found`);
        throw err;
      }
    }
    throw new BridgeError('cluster_unavailable', `could not update box ${boxId}: too many concurrent updates; retry`, { headers: { 'Retry-After': '1' } });
  }

  private async ownRecord(boxId: string): Promise<k8s.V1Secret> {
    const record = await this.deps.records.read(boxId);
    if (!record || record.metadata?.deletionTimestamp || record.metadata?.labels?.[LABELS.component] !== SECRET_COMPONENTS.record) {
      throw new BridgeError('not_found', `box ${boxId} not found`);
    }
    return record;
  }

  private view(boxId: string, record: k8s.V1Secret): BoxEgress {
    const { egress } = this.deps.policy.current();
    const own = boxAllowOf(record);
    return {
      box_id: boxId,
      mode: egress.mode,
      box_allow: own,
      allow: own ?? egress.domains.allow,
      deny: egress.domains.deny,
      plain_http: egress.domains.plainHttp,
      credential_hosts: credentialHostsOf(record),
    };
  }
}
