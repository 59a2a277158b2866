// GET /sandboxes serialization and its caching: pure logic over a hand-filled box list.
import type * as k8s from '@kubernetes/client-node';
import type { BoxReader } from '../kube/box-cache.js';
import { ClusterService, type ClusterServiceDeps } from './cluster.js';

function pod(name: string, created: string, phase = 'Running'): k8s.V1Pod {
  return {
    metadata: { name, namespace: 'sandboxes', creationTimestamp: new Date(created), labels: {}, annotations: {} },
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
