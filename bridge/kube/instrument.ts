// Every Kubernetes API call of the bridge goes through call(): it is timed, its failures are
// counted by status, and its errors become the API's error types.
import type { BridgeMetrics } from '../metrics.js';
import { apiStatusCode, toBridgeError, type KubeCall } from '../../common/kube.js';

export type { KubeCall };

export function instrumentedCall(metrics: Pick<BridgeMetrics, 'kubeDuration' | 'kubeErrors'>): KubeCall {
  return async (operation, fn) => {
    const end = metrics.kubeDuration.startTimer({ operation });
    try {
      return await fn();
    } catch (err) {
      metrics.kubeErrors.inc({ operation, code: String(apiStatusCode(err) ?? 0) });
      throw toBridgeError(err, operation);
    } finally {
      end();
    }
  };
}
