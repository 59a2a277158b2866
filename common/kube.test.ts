// sharedConnectionAuth: one connection pool per client, auth headers refreshed on a schedule.
import * as k8s from '@kubernetes/client-node';
import { AUTH_REFRESH_MS, sharedConnectionAuth } from './kube.js';

function fakeKubeConfig() {
  let calls = 0;
  const closed: number[] = [];
  const kc = {
    async applySecurityAuthentication(context: k8s.RequestContext) {
      const n = ++calls;
      context.setHeaderParam('Authorization', `Bearer token-${n}`);
      context.setDispatcher({ id: n, close: async () => void closed.push(n) } as unknown as ReturnType<k8s.RequestContext['getDispatcher']> & object);
    },
  };
  return { kc, calls: () => calls, closed };
}

const request = () => new k8s.RequestContext('https://api.example/api/v1/pods', k8s.HttpMethod.GET);

describe('sharedConnectionAuth', () => {
  it('reuses the headers and the first connection pool until the refresh interval passes', async () => {
    let now = 1_000_000;
    const { kc, calls, closed } = fakeKubeConfig();
    const auth = sharedConnectionAuth(kc, () => now);

    const first = request();
    await auth.applySecurityAuthentication(first);
    const second = request();
    await auth.applySecurityAuthentication(second);
    expect(calls()).toBe(1);
    expect(second.getHeaders()).toMatchObject({ Authorization: 'Bearer token-1' });
    expect(second.getDispatcher()).toBe(first.getDispatcher());

    now += AUTH_REFRESH_MS + 1;
    const later = request();
    await auth.applySecurityAuthentication(later);
    expect(calls()).toBe(2);
    expect(later.getHeaders()).toMatchObject({ Authorization: 'Bearer token-2' }); // a rotated token is picked up
    expect(later.getDispatcher()).toBe(first.getDispatcher()); // still the one pool
    expect(closed).toEqual([2]); // the Agent client-node made for the refresh is closed unused
  });
});
