#!/usr/bin/env bash
# A throwaway second real node for the cold-start bench: containerd v2.2.9 (image volumes, which
# the real node's containerd 1.6.20 cannot mount) and a second kubelet, joined to the running
# local cluster beside the real node, touching none of its processes (test/cluster/real-node/
# NOTES.md finding 17).
#
#   bench/cold-node.sh up     (root; the local cluster and its real node up, test/cluster/build.sh done)
#   bench/cold-node.sh down
#
# `up` builds containerd + containerd-shim-runc-v2 v2.2.9 from the Go module (once; cached in
# ${SANDBOX_BRIDGE_CACHE:-~/.cache/sandbox-bridge}/containerd-v2.2.9/), starts them with their own
# socket, root, state and runc root, imports the pause, box and boxd images with
# test/cluster/real-node/images.sh (its cached tarballs), and starts the kubelet of
# test/cluster/build.sh as node `cold-proto` (label and NoSchedule taint
# sandbox-bridge.io/cold-proto, so only pods that select and tolerate it land there), on its own
# IP (a bridge device of its own, as the real node's), port, root dir and cgroup root, with
# Calico's CNI plugin on a pod subnet of its own. No felix, no kube-proxy, no API server
# forwarder: its pods may only answer connections (one mangle rule), never start one, and
# nothing but the host may connect to them. It waits for Ready and prints the bench's env
# (also kept in .cluster/cold-node/bench.env):
#
#   BENCH_COLD_N=10 BENCH_COLD_NODE_KEY=sandbox-bridge.io/cold-proto \
#     BENCH_COLD_LOGS=.cluster/cold-node/logs \
#     flock /tmp/sandbox-bridge-bench.lock node_modules/.bin/node dist/bench/cold-start.js
#
# KUBELET_FEATURE_GATES (e.g. EventedPLEG=true) is passed to the kubelet as --feature-gates; an
# `up` with other gates than the running kubelet's restarts the kubelet alone.
# COLD_NODE_SUBNET overrides the pod subnet (default 10.251.<real node's third octet + 1>.0/24).
#
# `down` removes all of it: processes, containers, mounts, pod network namespaces and
# interfaces, the bridge, its iptables chains, cgroups, shim sockets, /var/log/containers links,
# the Node (and its Lease and CSINode) and .cluster/cold-node/. Safe to run twice. The build
# cache stays.
set -Eeuo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=../test/cluster/versions.env
. "$root/test/cluster/versions.env"
# The real node's names (its id, subnet, images, kubelet binary, CA); this node's are derived
# from them so that they never collide.
# shellcheck source=../test/cluster/real-node/real-node.env
. "$root/test/cluster/real-node/real-node.env"

CONTAINERD_VERSION=v2.2.9
COLD_BIN=$SANDBOX_CACHE/containerd-$CONTAINERD_VERSION
COLD_NAME=cold-proto
COLD_KEY=sandbox-bridge.io/cold-proto
d=$CLUSTER_DIR/cold-node
COLD_SOCK=$d/containerd/containerd.sock
COLD_SUBNET=${COLD_NODE_SUBNET:-10.251.$(( (16#${REAL_NODE_ID:0:2} + 1) % 256 )).0/24}
COLD_IP=${COLD_SUBNET%.*}.1
COLD_BRIDGE=sbxcp-$REAL_NODE_ID
# Pod interfaces: Calico's plugin names them <prefix><11 hex>; `p` is no hex digit, so no real
# node's prefix (c<3 hex>) is a prefix of this one, nor the other way round.
COLD_PREFIX=cp${REAL_NODE_ID:0:2}
COLD_CHAIN=SBX-CP-$REAL_NODE_ID
COLD_CHAIN_IN=SBX-CP-$REAL_NODE_ID-IN
COLD_CGROUP=sandbox-bridge-$REAL_NODE_ID-cold
KUBELET_PORT=10350
KUBELET_HEALTHZ_PORT=10348

log() { printf '[cold-node] %s\n' "$*" >&2; }
die() { trap - ERR; log "ERROR: $*"; exit 1; }
trap 'die "unexpected failure at bench/cold-node.sh line $LINENO: $BASH_COMMAND"' ERR
# PIDFILE: alive and still the program it names (a stale file's number may be another process now).
running() {
  local pid
  [ -f "$1" ] && pid=$(cat "$1") && kill -0 "$pid" 2>/dev/null && grep -qa -- "$(basename "$1" .pid)" "/proc/$pid/cmdline" 2>/dev/null
}
ready() { [ "$(kubectl get node "$COLD_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }

# --- up ------------------------------------------------------------------------------------------
build_containerd() {
  if [ -x "$COLD_BIN/containerd" ] && [ -x "$COLD_BIN/containerd-shim-runc-v2" ] &&
     [[ "$("$COLD_BIN/containerd" --version)" == *" ${CONTAINERD_VERSION#v}"* ]]; then
    return
  fi
  log "building containerd $CONTAINERD_VERSION from its Go module into $COLD_BIN (a few minutes of CPU on a cold Go cache)"
  mkdir -p "$COLD_BIN"
  (cd "$COLD_BIN" && GOBIN="$COLD_BIN" CGO_ENABLED=0 go install -tags no_btrfs,no_devmapper,no_zfs \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION") >"$d/logs/build.log" 2>&1 ||
    die "building containerd failed: $(tail -3 "$d/logs/build.log" | tr '\n' ' ')"
}

up() {
  local start server apiserver_args clash pid args anonymous authz_mode gates pki
  start=$(date +%s)
  [ "$(id -u)" = 0 ] || die "must run as root (containerd, runc, the pod network, iptables and cgroups need it)"
  [ -x "$KUBELET_BIN" ] || die "kubelet not built yet: $KUBELET_BIN (run test/cluster/build.sh)"
  [ -x "$CLUSTER_DIR/bin/calico" ] || die "Calico's CNI plugin not built: $CLUSTER_DIR/bin/calico (run test/cluster/build.sh)"
  kubectl get --raw /readyz >/dev/null 2>&1 || die "cluster not reachable with $KUBECONFIG (start it with npm run cluster:up)"
  kubectl get node "$REAL_NODE_NAME" >/dev/null 2>&1 || die "no node $REAL_NODE_NAME: this node borrows the real node's Calico resources (ClusterInformation) and images"
  [ -f "$KWOK_PKI/ca.key" ] || die "no cluster CA key at $KWOK_PKI/ca.key to sign the kubelet's certificates with"
  server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  apiserver_args=""
  for pid in $(pgrep -x kube-apiserver || true); do
    args=$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null || true)
    grep -qx -- "--secure-port=${server##*:}" <<<"$args" && apiserver_args=$args
  done
  # The API server must reach the kubelet by its InternalIP: a Hostname address would need an
  # /etc/hosts line, which this script never writes.
  grep -q -- '--kubelet-preferred-address-types=InternalIP' <<<"$apiserver_args" ||
    die "the API server does not prefer InternalIP addresses for kubelets (test/cluster/real-node/NOTES.md finding 5); not joining"
  for pid in $(pgrep -x kwok-controller || true); do
    args=$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null || true)
    if grep -q -- "--kubeconfig=$(dirname "$KWOK_PKI")/" <<<"$args" && grep -qx -- '--manage-all-nodes=true' <<<"$args"; then
      die "this cluster's kwok controller manages all nodes and would take $COLD_NAME over (NOTES.md finding 4)"
    fi
  done
  [ "$COLD_SUBNET" != "$POD_SUBNET" ] || die "the pod subnet $COLD_SUBNET is the real node's; set COLD_NODE_SUBNET"
  clash=$(ip -o -4 addr show | awk -v br="$COLD_BRIDGE" -v net="${COLD_SUBNET%.*}." '$2 != br && index($4, net) == 1 {print $2}')
  [ -z "$clash" ] || die "pod subnet $COLD_SUBNET is in use on interface $clash; pick another with COLD_NODE_SUBNET=10.251.N.0/24"

  mkdir -p "$d"/{containerd/root,containerd/state,containerd/opt,runc,cni/bin,cni/net.d,cni/ipam,kubelet/root,kubelet/pki,pod-logs,logs,run}
  build_containerd

  # Network: a bridge without ports that only holds the node IP (the kubelet refuses loopback
  # node IPs); pods are routed by Calico's plugin (veth, /32 route, proxy ARP, forwarding on the
  # pod's interface only).
  ip link show "$COLD_BRIDGE" >/dev/null 2>&1 || ip link add "$COLD_BRIDGE" type bridge
  [[ "$(ip -o -4 addr show dev "$COLD_BRIDGE")" == *" $COLD_IP/"* ]] || ip addr add "$COLD_IP/${COLD_SUBNET#*/}" dev "$COLD_BRIDGE"
  ip link set "$COLD_BRIDGE" up
  # Pods here may only answer: whatever they start (to the host, the real node's pods, anything
  # off this machine) is dropped before routing, and nothing is forwarded into them but replies
  # (the host, e.g. the bench's bridge, reaches them directly, through OUTPUT).
  {
    echo '*mangle'
    echo ":$COLD_CHAIN - [0:0]"
    echo "-A $COLD_CHAIN -m conntrack ! --ctstate ESTABLISHED,RELATED -j DROP"
    echo ":$COLD_CHAIN_IN - [0:0]"
    echo "-A $COLD_CHAIN_IN -m conntrack ! --ctstate ESTABLISHED,RELATED -j DROP"
    echo COMMIT
  } | iptables-restore -w --noflush
  iptables -t mangle -C PREROUTING -i "$COLD_PREFIX+" -j "$COLD_CHAIN" 2>/dev/null || iptables -t mangle -I PREROUTING 1 -i "$COLD_PREFIX+" -j "$COLD_CHAIN"
  iptables -t mangle -C FORWARD -o "$COLD_PREFIX+" -j "$COLD_CHAIN_IN" 2>/dev/null || iptables -t mangle -I FORWARD 1 -o "$COLD_PREFIX+" -j "$COLD_CHAIN_IN"

  # CNI: the real node's Calico plugin (Kubernetes datastore: it writes the pod's address onto
  # the pod as cni.projectcalico.org/podIP), host-local addresses from this node's subnet.
  ln -sf "$CLUSTER_DIR/bin/calico" "$d/cni/bin/calico"
  for p in host-local loopback; do ln -sf "/usr/lib/cni/$p" "$d/cni/bin/$p"; done
  cat > "$d/cni/net.d/10-sbx-cold-node.conflist" <<EOF
{
  "cniVersion": "0.3.1",
  "name": "sbx-cold-node-$REAL_NODE_ID",
  "plugins": [
    {
      "type": "calico",
      "datastore_type": "kubernetes",
      "nodename": "$COLD_NAME",
      "nodename_file_optional": true,
      "kubernetes": {"kubeconfig": "$KUBECONFIG"},
      "policy": {"type": "k8s"},
      "mtu": 1500,
      "log_level": "info",
      "log_file_path": "$d/logs/cni.log",
      "ipam": {
        "type": "host-local",
        "dataDir": "$d/cni/ipam",
        "ranges": [[{"subnet": "$COLD_SUBNET", "rangeStart": "${COLD_SUBNET%.*}.10", "rangeEnd": "${COLD_SUBNET%.*}.250"}]]
      }
    }
  ]
}
EOF

  # containerd 2.2.9, config version 3. Everything it writes is under $d: netns pinned under its
  # state dir, no NRI socket, no CDI, no tracing; runc is the machine's (the real node's).
  cat > "$d/containerd/config.toml" <<EOF
version = 3
root = "$d/containerd/root"
state = "$d/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$COLD_SOCK"
[ttrpc]
  address = "$COLD_SOCK.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$d/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  discard_unpacked_layers = false
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # Root here lacks CAP_SYS_RESOURCE (test/cluster/real-node/NOTES.md finding 2).
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "$COLD_BIN/containerd-shim-runc-v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$d/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$d/cni/bin"]
    conf_dir = "$d/cni/net.d"
    max_conf_num = 1
EOF
  if running "$d/run/containerd.pid"; then
    log "containerd already running (pid $(cat "$d/run/containerd.pid"))"
  else
    log "starting containerd $("$COLD_BIN/containerd" --version | awk '{print $3}') on $COLD_SOCK"
    rm -f "$COLD_SOCK" "$COLD_SOCK.ttrpc"
    # The plugin names pod interfaces after FELIX_INTERFACEPREFIX (CNI plugins inherit
    # containerd's environment); the shim is found first on PATH too.
    PATH="$COLD_BIN:$PATH" FELIX_INTERFACEPREFIX=$COLD_PREFIX setsid "$COLD_BIN/containerd" --config "$d/containerd/config.toml" \
      >>"$d/logs/containerd.log" 2>&1 < /dev/null &
    echo $! > "$d/run/containerd.pid"
  fi
  for _ in $(seq 1 60); do
    ctr --address "$COLD_SOCK" version >/dev/null 2>&1 && break
    running "$d/run/containerd.pid" || die "containerd exited; see $d/logs/containerd.log"
    sleep 0.5
  done
  ctr --address "$COLD_SOCK" version >/dev/null 2>&1 || die "containerd did not come up; see $d/logs/containerd.log"

  # Images: the real node's, from images.sh's cache (built only if their inputs changed).
  for image in pause box boxd; do
    bash "$root/test/cluster/real-node/images.sh" --only "$image" --address "$COLD_SOCK" >>"$d/logs/images.log" 2>&1 ||
      die "importing the $image image failed: $(tail -3 "$d/logs/images.log" | tr '\n' ' ')"
  done

  # Kubelet credentials: system:node:cold-proto (Node authorizer, NodeRestriction) and a serving
  # certificate for the node IP, both from the cluster CA.
  pki=$d/kubelet/pki
  issue() { # NAME SUBJECT EXT
    local name=$1
    [ -f "$pki/$name.crt" ] && openssl x509 -noout -checkend 3600 -in "$pki/$name.crt" >/dev/null &&
      openssl verify -CAfile "$KWOK_PKI/ca.crt" "$pki/$name.crt" >/dev/null 2>&1 && return
    openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$2" -out "$pki/$name.csr" 2>/dev/null
    printf '%s\n' "$3" > "$pki/$name.ext"
    openssl x509 -req -in "$pki/$name.csr" -CA "$KWOK_PKI/ca.crt" -CAkey "$KWOK_PKI/ca.key" \
      -CAcreateserial -CAserial "$pki/ca.srl" -days 30 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  }
  issue client "/O=system:nodes/CN=system:node:$COLD_NAME" "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature,keyEncipherment"
  issue serving "/CN=$COLD_NAME" "extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature,keyEncipherment
subjectAltName=DNS:$COLD_NAME,IP:$COLD_IP"
  kubectl config --kubeconfig "$d/kubelet/kubeconfig" set-cluster local --server "$server" --certificate-authority "$KWOK_PKI/ca.crt" --embed-certs >/dev/null
  kubectl config --kubeconfig "$d/kubelet/kubeconfig" set-credentials kubelet --client-certificate "$pki/client.crt" --client-key "$pki/client.key" --embed-certs >/dev/null
  kubectl config --kubeconfig "$d/kubelet/kubeconfig" set-context local --cluster local --user kubelet >/dev/null
  kubectl config --kubeconfig "$d/kubelet/kubeconfig" use-context local >/dev/null
  if grep -q -- '--kubelet-client-certificate=' <<<"$apiserver_args"; then
    anonymous=false authz_mode=Webhook
  else
    anonymous=true authz_mode=AlwaysAllow  # bound to $COLD_IP, which no pod may connect to
  fi

  # The kubelet's own cgroup root in every hierarchy (a fresh v1 cpuset needs its parent's cpus/mems).
  for h in /sys/fs/cgroup/*/; do
    mountpoint -q "$h" || continue
    mkdir -p "$h$COLD_CGROUP"
    if [ -f "${h}cpuset.cpus" ]; then
      [ -n "$(tr -d '\n' < "$h$COLD_CGROUP/cpuset.cpus")" ] || cat "${h}cpuset.cpus" > "$h$COLD_CGROUP/cpuset.cpus"
      [ -n "$(tr -d '\n' < "$h$COLD_CGROUP/cpuset.mems")" ] || cat "${h}cpuset.mems" > "$h$COLD_CGROUP/cpuset.mems"
    fi
  done
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then mkdir -p "/sys/fs/cgroup/$COLD_CGROUP"; fi

  printf 'nameserver 127.0.0.1\noptions ndots:1\n' > "$d/kubelet/resolv.conf"
  # As the real node's (test/cluster/real-node/up.sh), on its own address, port, directories and
  # cgroup root; protectKernelDefaults: the real kubelet has set the kernel tunables it wants,
  # this one only checks them (it never writes a sysctl).
  cat > "$d/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $COLD_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: $COLD_IP
healthzPort: $KUBELET_HEALTHZ_PORT
containerRuntimeEndpoint: unix://$COLD_SOCK
imageServiceEndpoint: unix://$COLD_SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: /$COLD_CGROUP
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
protectKernelDefaults: true
tlsCertFile: $pki/serving.crt
tlsPrivateKeyFile: $pki/serving.key
rotateCertificates: false
serverTLSBootstrap: false
authentication:
  anonymous: {enabled: $anonymous}
  webhook: {enabled: true}
  x509: {clientCAFile: $KWOK_PKI/ca.crt}
authorization:
  mode: $authz_mode
registerNode: true
registerWithTaints:
- {key: $COLD_KEY, value: "true", effect: NoSchedule}
resolvConf: $d/kubelet/resolv.conf
podLogsDir: $d/pod-logs
volumePluginDir: $d/kubelet/volume-plugins
staticPodPath: ""
maxPods: 30
podPidsLimit: 4096
serializeImagePulls: false
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
evictionPressureTransitionPeriod: 30s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 10s
syncFrequency: 10s
shutdownGracePeriod: 0s
logging: {format: text}
EOF

  gates=${KUBELET_FEATURE_GATES:-}
  if running "$d/run/kubelet.pid" && [ "$(cat "$d/run/kubelet.gates" 2>/dev/null)" != "$gates" ]; then
    log "restarting the kubelet: feature gates '$(cat "$d/run/kubelet.gates" 2>/dev/null)' -> '$gates'"
    stop kubelet
  fi
  if running "$d/run/kubelet.pid"; then
    log "kubelet already running (pid $(cat "$d/run/kubelet.pid"), feature gates '${gates}')"
  else
    log "starting kubelet ($("$KUBELET_BIN" --version)) as node $COLD_NAME on $COLD_IP:$KUBELET_PORT${gates:+, feature gates $gates}"
    setsid "$KUBELET_BIN" \
      --config "$d/kubelet/config.yaml" \
      --kubeconfig "$d/kubelet/kubeconfig" \
      --root-dir "$d/kubelet/root" \
      --cert-dir "$pki" \
      --hostname-override "$COLD_NAME" \
      --node-ip "$COLD_IP" \
      --node-labels "$COLD_KEY=true" \
      ${gates:+--feature-gates "$gates"} \
      --v 2 >>"$d/logs/kubelet.log" 2>&1 < /dev/null &
    echo $! > "$d/run/kubelet.pid"
    printf '%s' "$gates" > "$d/run/kubelet.gates"
  fi
  log "waiting for node $COLD_NAME to be Ready"
  for _ in $(seq 1 180); do
    running "$d/run/kubelet.pid" || die "kubelet exited: $(grep -v '^\s*$' "$d/logs/kubelet.log" | tail -3)"
    ready && break
    sleep 1
  done
  ready || die "node $COLD_NAME not Ready after 180 s; see $d/logs/kubelet.log"

  printf 'BENCH_COLD_NODE_KEY=%s\nBENCH_COLD_LOGS=%s\n' "$COLD_KEY" "$d/logs" > "$d/bench.env"
  log "node $COLD_NAME Ready ($(kubectl get node "$COLD_NAME" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}'), pods $COLD_SUBNET) in $(( $(date +%s) - start )) s; bench env ($d/bench.env):"
  cat "$d/bench.env"
}

# --- down ----------------------------------------------------------------------------------------
stop() { # NAME: TERM, then KILL after 20 s, the process up recorded (if it is still that program)
  local pidfile=$d/run/$1.pid pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null && grep -qa -- "$1" "/proc/$pid/cmdline" 2>/dev/null; then
    log "stopping $1 (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

down() {
  local ctr task c h pid m link left sockets
  if [ "$(id -u)" != 0 ]; then
    [ -d "$d" ] || exit 0
    die "$d exists but only root can remove the cold node"
  fi
  # The shims' sockets are in /run/containerd/s whatever the state dir, named by a hash of
  # containerd's address, the namespace and the shim's id (pkg/shim SocketAddress); a shim that
  # is killed leaves its socket behind. Named now, from the live shims and the task bundles,
  # before deleting tasks removes the bundles.
  sockets=$({
    for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $COLD_SOCK" || true); do
      { tr '\0' ' ' < "/proc/$pid/cmdline"; echo; } 2>/dev/null | sed -n 's/.* -namespace \([^ ]*\) -id \([^ ]*\) .*/\1\/\2/p'
    done
    if [ -d "$d/containerd/state/io.containerd.runtime.v2.task" ]; then
      (cd "$d/containerd/state/io.containerd.runtime.v2.task" && find . -mindepth 2 -maxdepth 2 -type d | sed 's#^\./##')
    fi
  } | sort -u | while read -r m; do printf '%s' "$COLD_SOCK/$m" | sha256sum | cut -d' ' -f1; done)
  stop kubelet
  # Containers outlive containerd (their shims are separate processes): kill and delete them
  # through containerd first.
  if [ -S "$COLD_SOCK" ] && running "$d/run/containerd.pid"; then
    ctr=(timeout 15 ctr --address "$COLD_SOCK" -n k8s.io)
    for task in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true; done
    sleep 1
    for task in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks delete -f "$task" >/dev/null 2>&1 || true; done
    for c in $("${ctr[@]}" containers ls -q 2>/dev/null); do "${ctr[@]}" containers delete "$c" >/dev/null 2>&1 || true; done
  fi
  stop containerd
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $COLD_SOCK" || true); do
    log "killing leftover shim $pid"
    kill -9 "$pid" 2>/dev/null || true
  done
  for h in /sys/fs/cgroup/*/"$COLD_CGROUP" /sys/fs/cgroup/"$COLD_CGROUP"; do
    [ -d "$h" ] || continue
    find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done
  done
  for m in $sockets; do rm -f "/run/containerd/s/$m"; done
  rmdir /run/containerd/s /run/containerd 2>/dev/null || true
  # Mounts (rootfs overlays, netns, shm, emptyDirs, image volumes), deepest first.
  if [ -d "$d" ]; then
    awk -v d="$d/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  fi
  for link in $(ip -o link show 2>/dev/null | awk -F': ' -v p="$COLD_PREFIX" 'index($2, p) == 1 {sub(/@.*/, "", $2); print $2}'); do
    ip link delete "$link" 2>/dev/null || true
  done
  if ip link show "$COLD_BRIDGE" >/dev/null 2>&1; then ip link delete "$COLD_BRIDGE"; fi
  remove_chain mangle "$COLD_CHAIN"
  remove_chain mangle "$COLD_CHAIN_IN"
  for _ in 1 2 3 4 5; do
    left=false
    for h in /sys/fs/cgroup/*/"$COLD_CGROUP" /sys/fs/cgroup/"$COLD_CGROUP"; do
      [ -d "$h" ] || continue
      find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true
      [ -d "$h" ] && left=true
    done
    $left || break
    sleep 0.5
  done
  $left && log "WARNING: could not remove all of /sys/fs/cgroup/*/$COLD_CGROUP"
  # The kubelet links every container's log into /var/log/containers (a fixed path).
  if [ -d /var/log/containers ]; then
    find /var/log/containers -maxdepth 1 -type l -lname "$d/*" -delete
  fi
  if kubectl get --raw /readyz >/dev/null 2>&1; then
    # Pods still bound to the node would wait for the pod GC; its Lease and CSINode would go
    # with the Node (owner references), but not at once.
    kubectl get pods -A --field-selector "spec.nodeName=$COLD_NAME" -o name 2>/dev/null | head -1 | grep -q . &&
      kubectl get pods -A --field-selector "spec.nodeName=$COLD_NAME" -o jsonpath='{range .items[*]}{.metadata.namespace} {.metadata.name}{"\n"}{end}' |
      while read -r ns pod; do kubectl delete pod -n "$ns" "$pod" --force --grace-period=0 >/dev/null 2>&1 || true; done
    kubectl delete node "$COLD_NAME" --ignore-not-found >/dev/null
    kubectl delete lease -n kube-node-lease "$COLD_NAME" --ignore-not-found >/dev/null
    kubectl delete csinode "$COLD_NAME" --ignore-not-found >/dev/null
  fi
  rm -rf "$d"
  log "cold node removed"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: bench/cold-node.sh up|down   (KUBELET_FEATURE_GATES=EventedPLEG=true bench/cold-node.sh up)" >&2; exit 2 ;;
esac
