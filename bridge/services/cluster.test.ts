// GET /sandboxes: filter, pages, serialization and caching; pure logic over a hand-filled box list.
import type * as k8s from '@kubernetes/client-node';
import { BridgeError } from '../../common/errors.js';
import { ANNOTATIONS } from '../../common/labels.js';
import type { BoxReader } from '../kube/box-cache.js';
import { SandboxList } from '../schemas.js';
import { ClusterService, type ClusterServiceDeps } from './cluster.js';

function pod(name: string, created: string, phase = 'Running', session = 'session-1'): k8s.V1Pod {
  return {
    metadata: { name, namespace: 'sandboxes', creationTimestamp: new Date(created), labels: {}, annotations: { [ANNOTATIONS.sessionId]: session } },
    spec: { nodeName: 'node-1', containers: [{ name: 'box', image: 'box:1', resources: { limits: { cpu: '1', memory: '512Mi' } } }] },
    status: { phase },
  };
}

function setup(pods: k8s.V1Pod[]) {
  let version = 0;
  let nowMs = Date.parse('2026-01-01T00:01:00.200Z');
  let listCalls = 0;
  const cache = {
    list: () => {
      listCalls++;
      return pods;
    },
    version: () => version,
  } as unknown as BoxReader;
  const service = new ClusterService({ cache, namespace: 'sandboxes', now: () => new Date(nowMs) } as unknown as ClusterServiceDeps);
  return {
    service,
    list: () => JSON.parse(service.sandboxesJson()) as { sandboxes: Array<{ name: string; age_seconds: number; status: string }>; total: number },
    change: () => version++,
    page: (query: Parameters<ClusterService['listSandboxes']>[0]) => service.listSandboxes(query),
    advance: (ms: number) => (nowMs += ms),
    listCalls: () => listCalls,
  };
}

describe('ClusterService.sandboxesJson', () => {
  it('lists boxes oldest first, then by name, with whole-second ages', () => {
    const t = setup([pod('b', '2026-01-01T00:00:30Z'), pod('c', '2026-01-01T00:00:00Z'), pod('a', '2026-01-01T00:00:30Z')]);
    const list = t.list();
    expect(list.total).toBe(3);
    expect(list.sandboxes.map((s) => [s.name, s.age_seconds])).toEqual([
      ['c', 60],
      ['a', 30],
      ['b', 30],
    ]);
  });

  it('reuses the document within a second while the cache is unchanged', () => {
    const t = setup([pod('a', '2026-01-01T00:00:00Z')]);
    const first = t.service.sandboxesJson();
    t.advance(500);
    expect(t.service.sandboxesJson()).toBe(first);
    expect(t.listCalls()).toBe(1);
  });

  it('advances ages each second without re-reading the cache', () => {
    const t = setup([pod('a', '2026-01-01T00:00:00Z')]);
    expect(t.list().sandboxes[0]!.age_seconds).toBe(60);
    t.advance(1000);
    expect(t.list().sandboxes[0]!.age_seconds).toBe(61);
    expect(t.listCalls()).toBe(1);
  });

  it('rebuilds at once when the cache changes', () => {
    const pods = [pod('a', '2026-01-01T00:00:00Z')];
    const t = setup(pods);
    t.list();
    pods.push(pod('b', '2026-01-01T00:00:10Z', 'Pending'));
    pods[0] = pod('a', '2026-01-01T00:00:00Z', 'Failed');
    t.change();
    const list = t.list();
    expect(list.sandboxes.map((s) => [s.name, s.status])).toEqual([
      ['a', 'Terminated'],
      ['b', 'Pending'],
    ]);
  });
});

describe('ClusterService.listSandboxes', () => {
  const pods = () =>
    Array.from({ length: 10 }, (_, i) =>
      pod(`box-${i}`, `2026-01-01T00:00:${String(i).padStart(2, '0')}Z`, i % 3 === 0 ? 'Pending' : 'Running', i % 2 ? 'odd' : 'even'),
    );

  it('answers in the shape of the response schema, with no continue token when everything fits', () => {
    const t = setup(pods());
    for (const body of [t.page({}), t.page({ limit: 3 }), t.page({ status: 'Pending', session_id: 'even' })]) {
      expect(SandboxList.parse(body)).toEqual(body); // no missing and no unknown fields
    }
    expect(t.page({})).not.toHaveProperty('continue');
  });

  it('serializes to exactly JSON.stringify of the objects', () => {
    const t = setup(pods());
    for (const query of [{}, { limit: 3 }, { session_id: 'odd', status: 'Running' as const }, { session_id: 'x"\\y' }]) {
      expect(t.service.sandboxesJson(query)).toBe(JSON.stringify(t.page(query)));
    }
  });

  it('filters by session and status; total counts every match', () => {
    const t = setup(pods());
    const odd = t.page({ session_id: 'odd' });
    expect(odd.sandboxes.map((s) => s.name)).toEqual(['box-1', 'box-3', 'box-5', 'box-7', 'box-9']);
    expect(odd.total).toBe(5);
    expect(t.page({ session_id: 'even', status: 'Pending' }).sandboxes.map((s) => s.name)).toEqual(['box-0', 'box-6']);
    expect(t.page({ session_id: 'nobody' })).toEqual({ sandboxes: [], total: 0, namespace: 'sandboxes' });
  });

  it('pages through in a stable order; boxes created or deleted between pages neither repeat nor shift', () => {
    const list = pods();
    const t = setup(list);
    const first = t.page({ limit: 4 });
    expect(first.sandboxes.map((s) => s.name)).toEqual(['box-0', 'box-1', 'box-2', 'box-3']);
    expect(first.total).toBe(10);
    // Between pages: the next box is deleted, an old one goes, a new one arrives.
    list.splice(4, 1);
    list.splice(0, 1);
    list.push(pod('box-new', '2026-01-01T00:00:30Z'));
    t.change();
    const second = t.page({ limit: 4, continue: first.continue });
    expect(second.sandboxes.map((s) => s.name)).toEqual(['box-5', 'box-6', 'box-7', 'box-8']);
    const third = t.page({ limit: 4, continue: second.continue });
    expect(third.sandboxes.map((s) => s.name)).toEqual(['box-9', 'box-new']);
    expect(third.continue).toBeUndefined();
  });

  it('pages of a filtered list carry on within the filter', () => {
    const t = setup(pods());
    const first = t.page({ session_id: 'even', limit: 2 });
    const rest = t.page({ session_id: 'even', limit: 10, continue: first.continue });
    expect([...first.sandboxes, ...rest.sandboxes].map((s) => s.name)).toEqual(['box-0', 'box-2', 'box-4', 'box-6', 'box-8']);
  });

  it('refuses a continue token that is not one, or belongs to another filter', () => {
    const t = setup(pods());
    const token = t.page({ limit: 2 }).continue!;
    const error = (query: Parameters<ClusterService['listSandboxes']>[0]) => {
      try {
        t.page(query);
      } catch (err) {
        return err instanceof BridgeError ? [err.type, err.message] : err;
      }
      return undefined;
    };
    expect(error({ continue: 'garbage' })).toEqual(['invalid_request', expect.stringContaining('not a continue token')]);
    expect(error({ continue: token, status: 'Running' })).toEqual(['invalid_request', expect.stringContaining('another session_id or status filter')]);
  });
});
