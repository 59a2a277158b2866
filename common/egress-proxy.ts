// What a box of a gateway-mode pool is given to reach the egress gateway (docs/egress.md), in one
// place for the bridge (cold boxes, wakes), the operator (warm boxes, the pool CA) and the tests:
//   - its proxy credential, derived like boxd's token but under the egress key the gateway holds
//     (never boxd's key): bound to the pod (namespace, name, nonce), so a warm pod has it from its
//     start and a woken box's new pod gets a new one. The gateway checks it together with the
//     pod IP it comes from (gateway/identity).
//   - the names of the pool CA's Secret (the gateway signs with it) and ConfigMap (what boxes
//     trust), and where the box finds the CA and the bundle boxd builds from it.
import { createHmac } from 'node:crypto';
import type { GatewayPeers } from './pool.js';

/** Data key of a box's Secret (its record, or a warm pod's own) holding its proxy credential. */
export const EGRESS_PROXY_KEY = 'egress-proxy';

/** Name of the pool CA's Secret (tls.crt, tls.key: the signer) and ConfigMap (ca.crt: every CA boxes trust), in the pool's namespace. */
export const EGRESS_CA_NAME = 'sandbox-bridge-egress-ca';
/** app.kubernetes.io/component of both. */
export const EGRESS_CA_COMPONENT = 'egress-ca';
/** The ConfigMap's key: PEM certificates, one or more (two while a rotation runs). */
export const EGRESS_CA_CONFIGMAP_KEY = 'ca.crt';

/** Where the box container finds the pool's CA certificates (the ConfigMap, read-only). */
export const EGRESS_CA_DIR = '/opt/sandbox-bridge/egress-ca';
export const EGRESS_CA_FILE = `${EGRESS_CA_DIR}/${EGRESS_CA_CONFIGMAP_KEY}`;
/** Where boxd writes the bundle boxes trust: the image's system bundle, then the pool's CA. */
export const CA_BUNDLE_DIR = '/opt/sandbox-bridge/egress';
export const CA_BUNDLE_FILE = `${CA_BUNDLE_DIR}/ca-bundle.pem`;
/** boxd's environment: where the pool CA is and where the bundle goes (boxd/cabundle). */
export const BOXD_CA_ENV = { source: 'BOXD_EGRESS_CA', bundle: 'BOXD_CA_BUNDLE' } as const;

/** Variables tools read a CA bundle from; each points at CA_BUNDLE_FILE. */
export const CA_BUNDLE_VARIABLES = ['SSL_CERT_FILE', 'NODE_EXTRA_CA_CERTS', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'GIT_SSL_CAINFO'] as const;
/** Proxy variables, both cases (curl reads only the lower-case http_proxy). */
export const PROXY_VARIABLES = ['HTTP_PROXY', 'HTTPS_PROXY', 'http_proxy', 'https_proxy'] as const;
export const NO_PROXY_VARIABLES = ['NO_PROXY', 'no_proxy'] as const;
/** What boxes reach directly: their own loopback (a server a command started in the box). */
export const NO_PROXY = 'localhost,127.0.0.1,::1';

/**
 * The proxy credential of one box pod:
 *   base64url-unpadded(HMAC-SHA256(key, "sandbox-bridge egress v2\n" + namespace + "/" + pod + "/" + nonce))
 * base64url so it sits in a proxy URL unescaped. gateway/identity computes the same.
 */
export function egressProxyCredential(key: string | Buffer, namespace: string, pod: string, nonce: string): string {
  return createHmac('sha256', key).update(`sandbox-bridge egress v2\n${namespace}/${pod}/${nonce}`).digest('base64url');
}

/** The host:port boxes send their proxy requests to. */
export function gatewayAddress(gateway: Pick<GatewayPeers, 'service' | 'namespace' | 'port' | 'host'>): string {
  const host = gateway.host ?? `${gateway.service}.${gateway.namespace}.svc`;
  return `${host.includes(':') ? `[${host}]` : host}:${gateway.port}`;
}
