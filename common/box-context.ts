// The platform's contexts a box carries on its record (issue 21): the backup context (tenant,
// environment, session) every later snapshot of the box is labelled with, so the platform finds
// "the latest backup of (tenant, environment, session)"; and the outbound context (tenant,
// session) the egress gateway looks credentials up by. Each is one JSON annotation of the record
// (common/labels.ts); this module reads and writes them. Pure.
import type * as k8s from '@kubernetes/client-node';
import { ANNOTATIONS } from './labels.js';

export interface BackupContext {
  tenant_id: string;
  environment_id: string;
  session_id: string;
}

export interface OutboundContext {
  tenant_id: string;
  session_id: string;
}

/** The box's backup context, or null when none was set (or the annotation is garbled). */
export function backupContextOf(record: Pick<k8s.V1Secret, 'metadata'> | undefined): BackupContext | null {
  const v = parseAnnotation(record, ANNOTATIONS.backupContext);
  return v && isId(v.tenant_id) && isId(v.environment_id) && isId(v.session_id)
    ? { tenant_id: v.tenant_id, environment_id: v.environment_id, session_id: v.session_id }
    : null;
}

/** The box's outbound context, or null when none was set. */
export function outboundContextOf(record: Pick<k8s.V1Secret, 'metadata'> | undefined): OutboundContext | null {
  const v = parseAnnotation(record, ANNOTATIONS.outboundContext);
  return v && isId(v.tenant_id) && isId(v.session_id) ? { tenant_id: v.tenant_id, session_id: v.session_id } : null;
}

/** The record annotations that set the given contexts (absent ones are left as they are). */
export function contextAnnotations(c: { backup?: BackupContext | undefined; outbound?: OutboundContext | undefined }): Record<string, string> {
  return {
    ...(c.backup ? { [ANNOTATIONS.backupContext]: JSON.stringify({ tenant_id: c.backup.tenant_id, environment_id: c.backup.environment_id, session_id: c.backup.session_id }) } : {}),
    ...(c.outbound ? { [ANNOTATIONS.outboundContext]: JSON.stringify({ tenant_id: c.outbound.tenant_id, session_id: c.outbound.session_id }) } : {}),
  };
}

export function parseAnnotation(record: Pick<k8s.V1Secret, 'metadata'> | undefined, name: string): Record<string, unknown> | undefined {
  const raw = record?.metadata?.annotations?.[name];
  if (!raw) return undefined;
  try {
    const v = JSON.parse(raw) as unknown;
    return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

function isId(v: unknown): v is string {
  return typeof v === 'string' && v.length > 0;
}
