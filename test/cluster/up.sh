#!/usr/bin/env bash
# Starts the local test cluster on loopback: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, metrics-server and the kwok controller with N simulated nodes, the S3-compatible
# object store (versitygw, object-store/up.sh), then one real node (kubelet + containerd + runc,
# real-node/up.sh) where the machine allows it.
# Idempotent: a cluster that is already up is checked, repaired if a component died, and reused
# (scaled to N nodes); so is the real node.
#
#   test/cluster/up.sh [--nodes N] [--no-real-node]
#
# --no-real-node (or SANDBOX_BRIDGE_NO_REAL_NODE=1) skips the real node. If the real node cannot
# start (not root, packages missing, kubelet fails), the reason is printed and kept in
# .cluster/real-node.unavailable, and the cluster comes up without it.
# Writes .cluster/kubeconfig. Everything it starts lives under .cluster/ (and $EXEC_DIR) and
# stops with down.sh.
#
# It either brings the whole control plane up or says why and leaves nothing behind: each
# component must be running and serving (API server ready, metrics API available, simulated nodes
# Ready). A component that dies is restarted (kwokctl start cluster restarts only dead ones; this
# is what metrics-server needs when it started before the API server listened, panicked and
# stayed dead). A cluster that still fails is deleted and created again, at most 3 times.
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
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "up.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

log() { printf '[cluster:up] %s\n' "$*" >&2; }
start=$(date +%s)

bash "$here/build.sh"

# shellcheck source=env.sh
. "$here/env.sh"
mkdir -p "$CLUSTER_DIR"
cluster_workdir=$KWOK_WORKDIR/clusters/$CLUSTER_NAME

# kwokctl picks each port by scanning down from 32767 for a free one, so two checkouts creating
# their clusters at the same moment pick the same ports, and one of them loses a component to
# "address already in use". The first create uses a block of 8 ports of this checkout's own
# (from its id, in 20000-29599, below the ephemeral range) if they are free; later ones let
# kwokctl pick.
port_names=(APISERVER ETCD ETCD_PEER CONTROLLER_MANAGER SCHEDULER KWOK METRICS_SERVER)
port_free() { ! ss -Htln "sport = :$1" 2>/dev/null | grep -q .; }
render_config() { # CREATE_NUMBER
  local base=0 i sedargs=()
  if [ "$1" = 1 ] && command -v ss >/dev/null; then
    base=$((20000 + (16#$CHECKOUT_ID % 1200) * 8))
    for i in "${!port_names[@]}"; do port_free $((base + i)) || base=0; done
  fi
  for i in "${!port_names[@]}"; do
    sedargs+=(-e "s#@PORT_${port_names[$i]}@#$([ "$base" = 0 ] && echo 0 || echo $((base + i)))#g")
  done
  # The real node's IP (its subnet's .1, per checkout): the API server advertises it.
  local node_ip
  node_ip=$(KUBECONFIG=$KUBECONFIG bash -c '. "$1/real-node/real-node.env" && echo "$NODE_IP"' _ "$here")
  sed -e "s#@ROOT@#$root#g" -e "s#@CLUSTER_NAME@#$CLUSTER_NAME#g" -e "s#@EXEC_DIR@#$EXEC_DIR#g" -e "s#@NODE_IP@#$node_ip#g" "${sedargs[@]}" \
    "$here/kwok.yaml" > "$CLUSTER_DIR/kwok.yaml"
}

create_cluster() {
  # A half-created cluster from an earlier, interrupted run would make create fail, and a real
  # node left from it would be attached to the old API server.
  if [ -d "$CLUSTER_DIR/real-node" ]; then bash "$here/real-node/down.sh" || true; fi
  kwokctl delete cluster --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
  mkdir -p "$CLUSTER_DIR/logs"
  # Made afresh (never reusing what another user may have put at this path in /tmp).
  rm -rf "$EXEC_DIR" && mkdir -m 1777 "$EXEC_DIR"
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
  sha256sum < "$here/kwok.yaml" > "$CLUSTER_DIR/kwok.yaml.sha256"
}

# Components (kwokctl's names) whose process is not running.
dead_components() {
  local pidfile pid
  for pidfile in "$cluster_workdir"/pids/*.pid; do
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then basename "$pidfile" .pid; fi
  done
}

last_error() { # COMPONENT: the last error its log shows (JSON "err" field, or the last line)
  local line
  line=$(grep -i 'error\|panic' "$cluster_workdir/logs/$1.log" 2>/dev/null | tail -n1)
  printf '%s' "$line" | grep -o '"err":"[^"]*"' || printf '%s\n' "${line:0:300}"
}

# Restarts dead components (at most 3 rounds), then checks they stay up. Fails naming them.
repair_components() {
  local round dead
  for round in 1 2 3 4; do
    dead=$(dead_components | xargs)
    [ -z "$dead" ] && return 0
    [ "$round" = 4 ] && break
    for c in $dead; do
      log "$c is not running (restart $round/3); its last error: $(last_error "$c")"
    done
    kwokctl start cluster --name "$CLUSTER_NAME" >&2 || true
    sleep 5 # long enough for a component that cannot start (a port taken) to die again
  done
  problem="$dead kept dying (see $cluster_workdir/logs/)"
  return 1
}

# The whole control plane up and serving, repairing dead components on the way. Sets $problem.
control_plane_ready() {
  problem=""
  kubectl --request-timeout=10s get --raw /readyz >/dev/null 2>&1 || { problem="the API server is not ready"; return 1; }
  repair_components || return 1
  # metrics-server may be running but not serving yet, or die now: wait, repairing once more.
  if ! kubectl wait --for=condition=Available apiservice/v1beta1.metrics.k8s.io --timeout=60s >/dev/null 2>&1; then
    repair_components || return 1
    kubectl wait --for=condition=Available apiservice/v1beta1.metrics.k8s.io --timeout=60s >/dev/null 2>&1 || {
      problem="the metrics API (metrics-server) is not available; see $cluster_workdir/logs/metrics-server.log"
      return 1
    }
  fi
  log "scaling simulated nodes to $nodes"
  kwokctl scale node --name "$CLUSTER_NAME" --config "$CLUSTER_DIR/kwok.yaml" --replicas "$nodes" >&2 || {
    problem="kwokctl scale node failed"
    return 1
  }
  kubectl wait --for=condition=Ready node -l type=kwok --timeout=120s >/dev/null || {
    repair_components || return 1
    problem="simulated nodes did not become Ready (kwok controller: $cluster_workdir/logs/kwok-controller.log)"
    return 1
  }
}

created=false
creates=0
for attempt in 1 2 3; do
  if [ "$attempt" = 1 ] && kubectl --request-timeout=10s get --raw /readyz >/dev/null 2>&1; then
    log "cluster $CLUSTER_NAME is already up; checking and reusing it"
    [ -s "$CLUSTER_DIR/kwok.yaml" ] || render_config 1
    [ "$(cat "$CLUSTER_DIR/kwok.yaml.sha256" 2>/dev/null)" = "$(sha256sum < "$here/kwok.yaml")" ] ||
      log "WARNING: it was created from another test/cluster/kwok.yaml; npm run cluster:down && npm run cluster:up applies the current one"
  else
    log "starting cluster $CLUSTER_NAME (control plane from $CLUSTER_DIR/bin; attempt $attempt/3)"
    creates=$((creates + 1))
    render_config "$creates"
    created=true
    create_cluster || true
  fi
  control_plane_ready && break
  log "the control plane is not healthy: $problem"
  if [ "$attempt" = 3 ]; then
    if $created; then
      log "giving up after 3 attempts; removing what was started (test/cluster/down.sh)"
      bash "$here/down.sh" >/dev/null 2>&1 || true
    fi
    log "FAILED: $problem"
    exit 1
  fi
  log "deleting the cluster and creating it again"
  kwokctl delete cluster --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
done

# The object store for snapshots (object-store/up.sh): independent of the control plane, needed
# by the snapshot tests and `npm run dev`. A store that cannot start fails the whole start-up.
if ! bash "$here/object-store/up.sh"; then
  $created && { bash "$here/down.sh" >/dev/null 2>&1 || true; }
  log "FAILED: the object store did not start (test/cluster/object-store/up.sh, log in .cluster/object-store/)"
  exit 1
fi

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
