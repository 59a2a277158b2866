// The operator's cache of one kind of object: one watch across every namespace, or, when it may
// only use some namespaces (namespaced RBAC), one watch per namespace, since a Role grants
// nothing beyond its own namespace.
import type * as k8s from '@kubernetes/client-node';
import type { CacheEvent, ResilientInformer } from '../common/informer.js';
import type { Lister } from './pool-reconciler.js';

export class ScopedCache<T extends k8s.KubernetesObject> implements Lister<T> {
  readonly informers: Array<ResilientInformer<T>>;
  private readonly all: ResilientInformer<T> | undefined;
  private readonly byNamespace = new Map<string, ResilientInformer<T>>();

  /** `make(ns)` builds the watch of one namespace, `make()` the cluster-wide one. */
  constructor(make: (namespace?: string) => ResilientInformer<T>, namespaces: readonly string[] | undefined) {
    if (namespaces) {
      for (const ns of namespaces) this.byNamespace.set(ns, make(ns));
      this.informers = [...this.byNamespace.values()];
    } else {
      this.all = make();
      this.informers = [this.all];
    }
  }

  on(event: CacheEvent, handler: (obj: T) => void): void {
    for (const i of this.informers) i.on(event, handler);
  }

  get(name: string, namespace?: string): T | undefined {
    if (this.all) return this.all.get(name, namespace);
    if (namespace !== undefined) return this.byNamespace.get(namespace)?.get(name, namespace);
    for (const i of this.informers) {
      const found = i.get(name);
      if (found) return found;
    }
    return undefined;
  }

  list(namespace?: string): readonly T[] {
    if (this.all) return this.all.list(namespace);
    if (namespace !== undefined) return this.byNamespace.get(namespace)?.list(namespace) ?? [];
    return this.informers.flatMap((i) => i.list());
  }
}
