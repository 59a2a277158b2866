#!/usr/bin/env bash
# Starts the local test cluster on loopback: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, metrics-server and the kwok controller with N simulated nodes.
# Idempotent: a cluster that is already up is reused (and scaled to N nodes).
#
#   test/cluster/up.sh [--nodes N]
#
# Writes .cluster/kubeconfig. Everything it starts lives under .cluster/ and stops with down.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
nodes=3
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --nodes=*) nodes=${1#*=}; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "up.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

log() { printf '[cluster:up] %s\n' "$*" >&2; }
start=$(date +%s)

bash "$here/build.sh"

# shellcheck source=env.sh
. "$here/env.sh"

mkdir -p "$CLUSTER_DIR"
sed "s#@ROOT@#$root#g" "$here/kwok.yaml" > "$CLUSTER_DIR/kwok.yaml"

if kubectl get --raw /readyz >/dev/null 2>&1; then
  log "cluster $CLUSTER_NAME is already up; reusing it"
else
  log "starting cluster $CLUSTER_NAME (control plane from $CLUSTER_DIR/bin)"
  # A half-created cluster from an earlier, interrupted run would make create fail.
  kwokctl delete cluster --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
  mkdir -p "$CLUSTER_DIR/exec" "$CLUSTER_DIR/logs"
  chmod 1777 "$CLUSTER_DIR/exec"
  printf 'simulated container log line 1\nsimulated container log line 2\n' > "$CLUSTER_DIR/logs/simulated.log"
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

log "scaling simulated nodes to $nodes"
kwokctl scale node --name "$CLUSTER_NAME" --config "$CLUSTER_DIR/kwok.yaml" --replicas "$nodes" >&2
kubectl wait --for=condition=Ready node --all --timeout=120s >/dev/null

log "ready in $(( $(date +%s) - start ))s: $(kubectl get nodes --no-headers | wc -l) nodes"
cat >&2 <<MSG

  export KUBECONFIG=$KUBECONFIG
  export PATH=$CLUSTER_DIR/bin:\$PATH
  kubectl get nodes

  Stop it with: npm run cluster:down
MSG
