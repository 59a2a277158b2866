#!/usr/bin/env bash
# Starts the local test cluster on loopback: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, metrics-server and the kwok controller with N simulated nodes, then one real
# node (kubelet + containerd + runc, real-node/up.sh) where the machine allows it.
# Idempotent: a cluster that is already up is reused (and scaled to N nodes), so is the real node.
#
#   test/cluster/up.sh [--nodes N] [--no-real-node]
#
# --no-real-node (or SANDBOX_BRIDGE_NO_REAL_NODE=1) skips the real node. If the real node cannot
# start (not root, packages missing, kubelet fails), the reason is printed and kept in
# .cluster/real-node.unavailable, and the cluster comes up without it.
# Writes .cluster/kubeconfig. Everything it starts lives under .cluster/ and stops with down.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
nodes=3
real_node=true
[ "${SANDBOX_BRIDGE_NO_REAL_NODE:-}" = 1 ] && real_node=false
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --nodes=*) nodes=${1#*=}; shift ;;
    --no-real-node) real_node=false; shift ;;
    --real-node) real_node=true; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "up.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

log() { printf '[cluster:up] %s\n' "$*" >&2; }
start=$(date +%s)

bash "$here/build.sh"

# shellcheck source=env.sh
. "$here/env.sh"

mkdir -p "$CLUSTER_DIR"
sed "s#@ROOT@#$root#g; s#@CLUSTER_NAME@#$CLUSTER_NAME#g" "$here/kwok.yaml" > "$CLUSTER_DIR/kwok.yaml"

if kubectl get --raw /readyz >/dev/null 2>&1; then
  log "cluster $CLUSTER_NAME is already up; reusing it"
else
  log "starting cluster $CLUSTER_NAME (control plane from $CLUSTER_DIR/bin)"
  # A half-created cluster from an earlier, interrupted run would make create fail, and a real
  # node left from it would be attached to the old API server.
  if [ -d "$CLUSTER_DIR/real-node" ]; then bash "$here/real-node/down.sh" || true; fi
  kwokctl delete cluster --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
  mkdir -p "$CLUSTER_DIR/exec" "$CLUSTER_DIR/logs"
  chmod 1777 "$CLUSTER_DIR/exec"
  # kwok serves this file as the container log of every simulated pod; it must be in the CRI
  # log format (timestamp, stream, tag, text), as a kubelet's would be.
  printf '%s stdout F simulated container log line 1\n%s stdout F simulated container log line 2\n' \
    2026-01-01T00:00:00.000000000Z 2026-01-01T00:00:01.000000000Z > "$CLUSTER_DIR/logs/simulated.log"
  kwokctl create cluster \
    --name "$CLUSTER_NAME" \
    --runtime binary \
    --kubeconfig "$KUBECONFIG" \
    --config "$CLUSTER_DIR/kwok.yaml" \
    --etcd-binary "$CLUSTER_DIR/bin/etcd" \
    --kube-apiserver-binary "$CLUSTER_DIR/bin/kube-apiserver" \
    --kube-controller-manager-binary "$CLUSTER_DIR/bin/kube-controller-manager" \
    --kube-scheduler-binary "$CLUSTER_DIR/bin/kube-scheduler" \
    --kwok-controller-binary "$CLUSTER_DIR/bin/kwok" \
    --enable metrics-server \
    --metrics-server-binary "$CLUSTER_DIR/bin/metrics-server" \
    --disable-qps-limits \
    --quiet-pull \
    --wait 60s >&2
fi

# kwokctl does not notice a metrics-server that exits at start (a bad flag, say).
kubectl wait --for=condition=Available apiservice/v1beta1.metrics.k8s.io --timeout=60s >/dev/null || {
  log "metrics-server is not serving; see $CLUSTER_DIR/kwok/clusters/$CLUSTER_NAME/logs/metrics-server.log"
  exit 1
}

log "scaling simulated nodes to $nodes"
kwokctl scale node --name "$CLUSTER_NAME" --config "$CLUSTER_DIR/kwok.yaml" --replicas "$nodes" >&2
kubectl wait --for=condition=Ready node -l type=kwok --timeout=120s >/dev/null

# The real node needs the control plane; a failure leaves the cluster usable without it.
unavailable=$CLUSTER_DIR/real-node.unavailable
if $real_node; then
  rc=0
  bash "$here/real-node/up.sh" || rc=$?
  if [ "$rc" = 0 ]; then
    rm -rf "$unavailable" "$CLUSTER_DIR/real-node.logs"
  else
    [ -s "$unavailable" ] || echo "real-node/up.sh failed (exit $rc) without saying why" > "$unavailable"
    # Leave nothing half-started behind (processes, bridge, iptables); keep the reason and logs.
    rm -rf "$CLUSTER_DIR/real-node.logs"
    [ -d "$CLUSTER_DIR/real-node/logs" ] && cp -r "$CLUSTER_DIR/real-node/logs" "$CLUSTER_DIR/real-node.logs"
    if [ "$(id -u)" = 0 ]; then bash "$here/real-node/down.sh" >/dev/null 2>&1 || true; fi
    log "WARNING: continuing WITHOUT the real node: $(head -1 "$unavailable")"
    log "         tests that need it will be skipped; details above, in $unavailable and $CLUSTER_DIR/real-node.logs/"
  fi
else
  log "real node skipped (--no-real-node / SANDBOX_BRIDGE_NO_REAL_NODE=1)"
  kubectl get node -l sandbox-bridge.io/real-node=true --no-headers 2>/dev/null | grep -q . ||
    echo "the cluster was started with --no-real-node (or SANDBOX_BRIDGE_NO_REAL_NODE=1)" > "$unavailable"
fi

log "ready in $(( $(date +%s) - start ))s: $(kubectl get nodes --no-headers | wc -l) nodes"
cat >&2 <<MSG

  export KUBECONFIG=$KUBECONFIG
  export PATH=$CLUSTER_DIR/bin:\$PATH
  kubectl get nodes

  Stop it with: npm run cluster:down
MSG
