import type * as k8s from '@kubernetes/client-node';
import type { CacheEvent, ResilientInformer } from '../common/informer.js';
import { ScopedCache } from './scoped-cache.js';

/** Just the reads and handler registration of a ResilientInformer, over fixed objects. */
function fakeInformer(objects: k8s.KubernetesObject[], handlers: Array<[CacheEvent, unknown]>): ResilientInformer<k8s.KubernetesObject> {
  return {
    get: (name: string, namespace?: string) =>
      objects.find((o) => o.metadata?.name === name && (namespace === undefined || o.metadata?.namespace === namespace)),
    list: (namespace?: string) => objects.filter((o) => namespace === undefined || o.metadata?.namespace === namespace),
    on: (event: CacheEvent, handler: unknown) => handlers.push([event, handler]),
  } as unknown as ResilientInformer<k8s.KubernetesObject>;
}

const pod = (namespace: string, name: string) => ({ metadata: { namespace, name } });

test('per namespace: one watch each; reads go to the namespace asked for; others read as empty', () => {
  const made: Array<string | undefined> = [];
  const handlers: Array<[CacheEvent, unknown]> = [];
  const cache = new ScopedCache((ns) => {
    made.push(ns);
    return fakeInformer(ns === 'a' ? [pod('a', 'p1')] : [pod('b', 'p2')], handlers);
  }, ['a', 'b']);
  expect(made).toEqual(['a', 'b']);
  expect(cache.informers).toHaveLength(2);
  expect(cache.get('p1', 'a')).toEqual(pod('a', 'p1'));
  expect(cache.get('p1', 'b')).toBeUndefined();
  expect(cache.get('p2')).toEqual(pod('b', 'p2'));
  expect(cache.list('b')).toEqual([pod('b', 'p2')]);
  expect(cache.list('elsewhere')).toEqual([]);
  expect(cache.list()).toEqual([pod('a', 'p1'), pod('b', 'p2')]);
  cache.on('add', () => undefined);
  expect(handlers.map(([e]) => e)).toEqual(['add', 'add']);
});

test('every namespace: one cluster-wide watch', () => {
  const made: Array<string | undefined> = [];
  const cache = new ScopedCache((ns) => {
    made.push(ns);
    return fakeInformer([pod('a', 'p1'), pod('b', 'p2')], []);
  }, undefined);
  expect(made).toEqual([undefined]);
  expect(cache.list('b')).toEqual([pod('b', 'p2')]);
  expect(cache.get('p1', 'a')).toEqual(pod('a', 'p1'));
});
