// The one builder of the Kubernetes Events sandbox-bridge records (the operator's pool and box
// events, the bridge's box events). Messages are capped: box-written text may reach them.
import type * as k8s from '@kubernetes/client-node';
import { randomBytes } from 'node:crypto';

export interface EventInput {
  involved: k8s.V1ObjectReference & { name: string; namespace?: string };
  type: 'Normal' | 'Warning';
  reason: string;
  message: string;
  component: string;
  instance: string;
  now: Date;
  /** Default: the involved object's name and a unique suffix. */
  name?: string;
  namespace?: string;
}

export const EVENT_MESSAGE_MAX = 1024;

export function buildEvent(e: EventInput): k8s.CoreV1Event {
  const namespace = e.namespace ?? e.involved.namespace ?? 'default';
  return {
    metadata: { name: e.name ?? `${e.involved.name}.${e.now.getTime().toString(16)}${randomBytes(4).toString('hex')}`, namespace },
    involvedObject: e.involved,
    type: e.type,
    reason: e.reason,
    message: e.message.slice(0, EVENT_MESSAGE_MAX),
    source: { component: e.component },
    reportingComponent: e.component,
    reportingInstance: e.instance,
    firstTimestamp: e.now,
    lastTimestamp: e.now,
    count: 1,
  };
}
