#!/usr/bin/env bash
# Adds one real node to the running local cluster: a kubelet on containerd (CRI) + runc + Calico's
# CNI plugin on this machine, so pods that select and tolerate it run in real containers; felix
# (NetworkPolicy), kube-proxy (ClusterIP Services) and a forwarder to the API server (in-cluster
# config) beside it.
#
#   test/cluster/real-node/up.sh            (needs root, and a running cluster from test/cluster/up.sh;
#                                            test/cluster/up.sh runs this itself unless --no-real-node)
#
# Pods land there only with
#   nodeSelector: {sandbox-bridge.io/real-node: "true"}
#   tolerations:  [{key: sandbox-bridge.io/real-node, operator: Exists, effect: NoSchedule}]
# and imagePullPolicy IfNotPresent/Never (images come from images.sh; no registry is reachable).
# Everything lives under .cluster/real-node/ plus, named with this checkout's instance id
# (real-node.env), the bridge sbx-<id>, the iptables chains SBX-RN-<id>* and the cgroup
# sandbox-bridge-<id>; down.sh removes them all. Idempotent: running processes are reused.
# On failure the reason is printed and written to .cluster/real-node.unavailable (the tests
# print it when they skip).
set -Eeuo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
# shellcheck source=../versions.env
. "$here/../versions.env"
# shellcheck source=real-node.env
. "$here/real-node.env"

log() { printf '[real-node:up] %s\n' "$*" >&2; }
die() {
  trap - ERR
  log "ERROR: $*"
  { mkdir -p "$CLUSTER_DIR" && printf '%s\n' "$*" > "$REAL_NODE_UNAVAILABLE"; } 2>/dev/null || true
  exit 1
}
trap 'die "unexpected failure at real-node/up.sh line $LINENO: $BASH_COMMAND"' ERR
# PIDFILE (<name>.pid): alive and still the program it names. A pid file left by an earlier boot
# or session can hold a number the kernel has since given to another process.
running() {
  local pid
  [ -f "$1" ] && pid=$(cat "$1") && kill -0 "$pid" 2>/dev/null && grep -qa -- "$(basename "$1" .pid)" "/proc/$pid/cmdline" 2>/dev/null
}
start=$(date +%s)

[ "$(id -u)" = 0 ] || die "must run as root (containerd, runc, the pod bridge, iptables and cgroups need it); running as uid $(id -u)"
[ -d /sys/fs/cgroup/memory ] || [ -f /sys/fs/cgroup/cgroup.controllers ] || die "no cgroup filesystem at /sys/fs/cgroup"

d=$REAL_NODE_DIR
mkdir -p "$d"/{containerd/root,containerd/state,containerd/opt,runc,runsc/root,runsc/logs,cni/net.d,cni/ipam,kubelet/root,kubelet/pki,pod-logs,logs,run}

# --- packages ------------------------------------------------------------------------------------
# .ci/run installs these up front; a developer machine gets them here on first use.
static_busybox() { [ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 && ! ldd /bin/busybox >/dev/null 2>&1; }
missing=()
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || missing+=(containernetworking-plugins)
static_busybox || missing+=(busybox-static)
command -v iptables >/dev/null || missing+=(iptables)
command -v ip >/dev/null || missing+=(iproute2)
command -v pgrep >/dev/null || missing+=(procps)
command -v openssl >/dev/null || missing+=(openssl)
command -v jq >/dev/null || missing+=(jq)
command -v curl >/dev/null || missing+=(curl)
command -v ipset >/dev/null || missing+=(ipset)
command -v conntrack >/dev/null || missing+=(conntrack)
command -v gcc >/dev/null || missing+=(gcc)
command -v socat >/dev/null || missing+=(socat)
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get to install them"
  log "installing ${missing[*]}"
  apt-get update -qq >"$d/logs/apt.log" 2>&1 || die "apt-get update failed (see $d/logs/apt.log); missing packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >>"$d/logs/apt.log" 2>&1 ||
    die "could not install ${missing[*]}: $(tail -3 "$d/logs/apt.log" | tr '\n' ' ')"
fi

# --- the cluster ---------------------------------------------------------------------------------
# Checked before anything starts, so a cluster the node cannot join costs nothing to clean up.
[ -x "$KUBELET_BIN" ] || die "kubelet not built yet: $KUBELET_BIN (run test/cluster/build.sh)"
kubectl get --raw /readyz >/dev/null 2>&1 || die "cluster not reachable with $KUBECONFIG (run test/cluster/up.sh)"
[ -f "$KWOK_PKI/ca.crt" ] || die "cluster CA not found at $KWOK_PKI/ca.crt"
server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
if running "$d/run/kubelet.pid" && [ "$(cat "$d/kubelet/server" 2>/dev/null)" != "$server" ]; then
  die "the real node's kubelet is attached to another cluster ($(cat "$d/kubelet/server" 2>/dev/null)); run down.sh first"
fi
apiserver_args=""
for pid in $(pgrep -x kube-apiserver || true); do  # the one serving our kubeconfig's port
  args=$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null || true)
  grep -qx -- "--secure-port=${server##*:}" <<<"$args" && apiserver_args=$args
done
api_port=${server##*:}
# The Service IP ranges (ServiceCIDR objects, made from the API server's
# --service-cluster-ip-range; its default is 10.0.0.0/24): IPv4 ones, as the pod network is.
service_cidrs=$(kubectl get servicecidrs -o jsonpath='{range .items[*]}{range .spec.cidrs[*]}{@}{"\n"}{end}{end}' 2>/dev/null | grep -v : || true)
if [ -z "$service_cidrs" ]; then
  service_cidrs=$(sed -n 's/^--service-cluster-ip-range=//p' <<<"$apiserver_args" | tr ',' '\n' | grep -v : || true)
fi
service_cidrs=${service_cidrs:-10.0.0.0/24}

# kwokctl's binary runtime starts the kwok controller with --manage-all-nodes=true: it would take
# the real node over (heartbeats, and daemonEndpoints pointing at kwok's own port, so exec and
# logs go to kwok and fail with "connection refused"), and fake the status of its pods.
kwok_cluster_dir=$(dirname "$KWOK_PKI")
for pid in $(pgrep -x kwok-controller || true); do
  args=$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null || true)
  if grep -q -- "--kubeconfig=$kwok_cluster_dir/" <<<"$args" && grep -qx -- '--manage-all-nodes=true' <<<"$args"; then
    die "the kwok controller of this cluster manages all nodes (--manage-all-nodes=true), so it would hijack $REAL_NODE_NAME; the cluster was created from an older test/cluster/kwok.yaml: recreate it with test/cluster/down.sh && test/cluster/up.sh"
  fi
done

# --- network -------------------------------------------------------------------------------------
# Pods are routed, not bridged: Calico's CNI plugin gives each pod a veth ($IFACE_PREFIX<hash>),
# a /32 route to it and a link-local next hop (169.254.1.1) that the host answers ARP for, so
# felix can apply each pod's NetworkPolicy on its own interface. The bridge device $BRIDGE has
# no ports: it only holds the node IP (the kubelet refuses loopback node IPs, and dummy devices
# are not available here). Forwarding is enabled per pod interface by the plugin, never
# machine-wide (net.ipv4.ip_forward stays as it is).
clash=$(ip -o -4 addr show | awk -v br="$BRIDGE" -v net="${POD_SUBNET%.*}." '$2 != br && index($4, net) == 1 {print $2}')
[ -z "$clash" ] || die "pod subnet $POD_SUBNET is already in use on interface $clash; pick another with REAL_NODE_SUBNET=10.251.N.0/24"
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge || die "cannot create bridge $BRIDGE (ip link add type bridge failed)"
fi
# (No `ip | grep -q`: grep leaving early kills ip with SIGPIPE, which pipefail reports as a failure.)
[[ "$(ip -o -4 addr show dev "$BRIDGE")" == *" $NODE_IP/"* ]] || ip addr add "$NODE_IP/${POD_SUBNET#*/}" dev "$BRIDGE"
ip link set "$BRIDGE" up

# The harness, in the mangle table so that it runs before every filter rule (felix's included)
# and nothing can accept a packet past it: of what pods start, only traffic to other pods
# passes, to the API server's forwarder on the node IP, to Service IPs that kube-proxy turns
# into one of those, and whatever a test registers in $HOSTS_CHAIN (its test hosts, a port on
# the node); everything else (the host, other checkouts' pods, anything off this machine) is
# dropped. New connections into pods from anywhere but pods and the host itself are dropped too.
# NetworkPolicy (felix) then decides among what passes.
# Service IPs: mangle PREROUTING runs before kube-proxy's DNAT (nat PREROUTING), so $CHAIN lets
# them pass and $CHAIN_SVC (mangle INPUT/FORWARD, after the DNAT) checks the destination they
# became: a pod or the API server's forwarder, else $HOSTS_CHAIN. A Service IP nobody DNATs
# (no such Service, no kube-proxy) or one DNATed elsewhere (a selector-less Service's made-up
# endpoint) is dropped there, so Service IPs never lead a packet off this machine.
remove_chain filter "$CHAIN" # the bridged harness of earlier versions
for c in "$CHAIN" "$HOSTS_CHAIN" "$CHAIN_IN" "$CHAIN_SVC"; do iptables -t mangle -N "$c" 2>/dev/null || true; done
# $HOSTS_CHAIN keeps what running tests registered (a rerun must not cut them off); it only
# needs its final DROP (tests insert `-d <address> -j RETURN` rules above it).
iptables -t mangle -C "$HOSTS_CHAIN" -j DROP 2>/dev/null || iptables -t mangle -A "$HOSTS_CHAIN" -j DROP
# The post-DNAT check is hooked before $CHAIN lets Service IPs pass (an empty chain returns).
for c in $service_cidrs; do
  for hook in INPUT FORWARD; do
    iptables -t mangle -C "$hook" -i "$IFACE_PREFIX+" -m conntrack --ctstate NEW --ctorigdst "$c" -j "$CHAIN_SVC" 2>/dev/null ||
      iptables -t mangle -I "$hook" 1 -i "$IFACE_PREFIX+" -m conntrack --ctstate NEW --ctorigdst "$c" -j "$CHAIN_SVC"
  done
done
# The other chains are replaced in one transaction, so a rerun never leaves a moment without them.
{
  echo '*mangle'
  echo ":$CHAIN - [0:0]"
  echo "-A $CHAIN -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN"
  echo "-A $CHAIN -d $NODE_IP/32 -p tcp --dport $api_port -j RETURN"
  echo "-A $CHAIN -d $NODE_IP/32 -g $HOSTS_CHAIN"
  echo "-A $CHAIN -d $POD_SUBNET -j RETURN"
  for c in $service_cidrs; do echo "-A $CHAIN -d $c -j RETURN"; done
  echo "-A $CHAIN -g $HOSTS_CHAIN"
  echo ":$CHAIN_SVC - [0:0]"
  echo "-A $CHAIN_SVC -d $POD_SUBNET -j RETURN"
  echo "-A $CHAIN_SVC -d $NODE_IP/32 -p tcp --dport $api_port -j RETURN"
  echo "-A $CHAIN_SVC -g $HOSTS_CHAIN"
  echo ":$CHAIN_IN - [0:0]"
  echo "-A $CHAIN_IN ! -s $POD_SUBNET -m conntrack --ctstate NEW -j DROP"
  echo COMMIT
} | iptables-restore -w --noflush
# Matched by interface (every pod packet enters on its own veth), not by source address: the
# host talks to its own node IP over loopback with that address as source.
iptables -t mangle -C PREROUTING -i "$IFACE_PREFIX+" -j "$CHAIN" 2>/dev/null || iptables -t mangle -I PREROUTING 1 -i "$IFACE_PREFIX+" -j "$CHAIN"
iptables -t mangle -C FORWARD -o "$IFACE_PREFIX+" -j "$CHAIN_IN" 2>/dev/null || iptables -t mangle -I FORWARD 1 -o "$IFACE_PREFIX+" -j "$CHAIN_IN"

# The API server for pods: it listens on loopback only, and advertises the node IP
# (test/cluster/kwok.yaml), so the `kubernetes` Service leads to $NODE_IP:<its port>, where this
# forwarder passes connections on to it, bytes unchanged (TLS end to end). One process per
# connection (fork), all in the forwarder's process group, which down.sh stops.
forwarder="$NODE_IP:$api_port"
if running "$d/run/socat.pid" && [ "$(cat "$d/run/socat.target" 2>/dev/null)" = "$forwarder" ]; then
  log "API server forwarder already running on $forwarder (pid $(cat "$d/run/socat.pid"))"
else
  if running "$d/run/socat.pid"; then kill -- "-$(cat "$d/run/socat.pid")" 2>/dev/null || true; sleep 0.5; fi
  log "starting the API server forwarder on $forwarder (socat, to 127.0.0.1:$api_port)"
  setsid socat "TCP-LISTEN:$api_port,bind=$NODE_IP,reuseaddr,fork,backlog=128" "TCP:127.0.0.1:$api_port" \
    >>"$d/logs/socat.log" 2>&1 < /dev/null &
  echo $! > "$d/run/socat.pid"
  echo "$forwarder" > "$d/run/socat.target"
  for _ in $(seq 1 20); do [ -n "$(ss -Htln "src $NODE_IP and sport = :$api_port")" ] && break; sleep 0.25; done
  [ -n "$(ss -Htln "src $NODE_IP and sport = :$api_port")" ] || die "the API server forwarder did not listen on $forwarder: $(tail -3 "$d/logs/socat.log")"
fi

# CNI: Calico's plugin with host-local addresses; its directory holds only what this node uses.
mkdir -p "$d/cni/bin"
ln -sf "$CLUSTER_DIR/bin/calico" "$d/cni/bin/calico"
for p in host-local loopback; do ln -sf "/usr/lib/cni/$p" "$d/cni/bin/$p"; done
rm -f "$d/cni/net.d/10-sbx-real-node.conflist"
cat > "$d/cni/net.d/10-sbx-real-node.conflist" <<EOF
{
  "cniVersion": "0.3.1",
  "name": "sbx-real-node-$REAL_NODE_ID",
  "plugins": [
    {
      "type": "calico",
      "datastore_type": "kubernetes",
      "nodename": "$REAL_NODE_NAME",
      "nodename_file_optional": true,
      "kubernetes": {"kubeconfig": "$KUBECONFIG"},
      "policy": {"type": "k8s"},
      "mtu": 1500,
      "log_level": "info",
      "log_file_path": "$d/logs/cni.log",
      "ipam": {
        "type": "host-local",
        "dataDir": "$d/cni/ipam",
        "ranges": [[{"subnet": "$POD_SUBNET", "rangeStart": "${POD_SUBNET%.*}.10", "rangeEnd": "${POD_SUBNET%.*}.250"}]]
      }
    }
  ]
}
EOF
# What the tests need to know about this network (test/support/test-hosts.ts).
jq -n --arg id "$REAL_NODE_ID" --arg podSubnet "$POD_SUBNET" --arg nodeIP "$NODE_IP" --arg hostsChain "$HOSTS_CHAIN" \
  --arg svcChain "$CHAIN_SVC" --arg ifacePrefix "$IFACE_PREFIX" --argjson octet "$TEST_HOST_OCTET" \
  --arg serviceCIDRs "$service_cidrs" --argjson apiServerPort "$api_port" \
  '{$id, $podSubnet, $nodeIP, $hostsChain, $svcChain, $ifacePrefix, $octet,
    serviceCIDRs: ($serviceCIDRs | split("\n") | map(select(. != ""))), apiForwarder: {address: $nodeIP, port: $apiServerPort}}' \
  > "$d/network.json"

# Calico's resources, which its CNI plugin and felix read: the CRDs (copied by build.sh from the
# Calico module), ClusterInformation (the plugin refuses to work until datastoreReady) and the
# tiers Kubernetes NetworkPolicies are placed in, as calico-node would create them.
calico_crds="$SANDBOX_CACHE/calico-${CALICO_VERSION}/crds"
[ -d "$calico_crds" ] || die "Calico CRDs not found at $calico_crds (run test/cluster/build.sh)"
kubectl apply --server-side --force-conflicts -f "$calico_crds" >"$d/logs/calico-crds.log" 2>&1 ||
  die "applying Calico's CRDs failed: $(tail -3 "$d/logs/calico-crds.log" | tr '\n' ' ')"
kubectl wait --for condition=established --timeout=60s crd/clusterinformations.crd.projectcalico.org crd/tiers.crd.projectcalico.org >/dev/null
kubectl apply --server-side --force-conflicts -f - >/dev/null <<EOF
apiVersion: crd.projectcalico.org/v1
kind: ClusterInformation
metadata: {name: default}
spec: {datastoreReady: true, clusterType: "k8s,kdd", calicoVersion: "v3.31.0"}
---
apiVersion: crd.projectcalico.org/v1
kind: Tier
metadata: {name: default}
spec: {order: 1000000, defaultAction: Deny}
---
apiVersion: crd.projectcalico.org/v1
kind: Tier
metadata: {name: adminnetworkpolicy}
spec: {order: 1000, defaultAction: Pass}
---
apiVersion: crd.projectcalico.org/v1
kind: Tier
metadata: {name: baselineadminnetworkpolicy}
spec: {order: 10000000, defaultAction: Pass}
EOF

# --- containerd ----------------------------------------------------------------------------------
# containerd built by test/cluster/build.sh (versions.env: image volumes need 2.1 or later).
CONTAINERD_BIN=$CLUSTER_DIR/bin
[ -x "$CONTAINERD_BIN/containerd" ] && [ -x "$CONTAINERD_BIN/containerd-shim-runc-v2" ] && [ -x "$CONTAINERD_BIN/ctr" ] ||
  die "containerd not built in $CONTAINERD_BIN (run test/cluster/build.sh)"
# Config version 3, everything it writes under $d: own root, state, sockets (grpc and ttrpc) and
# runc root, so it never meets another containerd on the machine; pod network namespaces pinned
# under its state dir; no NRI socket, no CDI, no tracing.
cat > "$d/containerd/config.toml" <<EOF
version = 3
root = "$d/containerd/root"
state = "$d/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"

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
  # This machine withholds CAP_SYS_RESOURCE even from root, so runc cannot give the pause
  # container its -998 oom_score_adj ("can't get final child's PID from pipe: EOF"); clamp
  # scores at containerd's own instead.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "$CONTAINERD_BIN/containerd-shim-runc-v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$d/runc"
        SystemdCgroup = false
    # gVisor (RuntimeClass gvisor): containerd finds containerd-shim-runsc-v1 on its PATH
    # (.cluster/bin); the shim reads runsc's settings from ConfigPath.
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$d/runsc/config.toml"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$d/cni/bin"]
    conf_dir = "$d/cni/net.d"
    max_conf_num = 1
EOF

# runsc's state and logs live under the node's directory; systrap (the default platform) needs
# neither KVM nor ptrace.
cat > "$d/runsc/config.toml" <<EOF
binary_name = "$CLUSTER_DIR/bin/runsc"
root = "$d/runsc/root"
log_path = "$d/runsc/logs/%ID%/shim.log"
log_level = "info"
[runsc_config]
  platform = "systrap"
  debug-log = "$d/runsc/logs/%ID%/runsc.%COMMAND%.log"
EOF

if running "$d/run/containerd.pid"; then
  log "containerd already running (pid $(cat "$d/run/containerd.pid"))"
else
  log "starting containerd ($("$CONTAINERD_BIN/containerd" --version | awk '{print $3}'))"
  rm -f "$CONTAINERD_SOCK" "$CONTAINERD_SOCK.ttrpc"
  # setsid: the daemons must outlive this script and the shell that ran it.
  # Calico's CNI plugin names pod interfaces with the prefix in FELIX_INTERFACEPREFIX, and CNI
  # plugins inherit containerd's environment.
  FELIX_INTERFACEPREFIX=$IFACE_PREFIX setsid "$CONTAINERD_BIN/containerd" --config "$d/containerd/config.toml" >>"$d/logs/containerd.log" 2>&1 < /dev/null &
  echo $! > "$d/run/containerd.pid"
fi
for _ in $(seq 1 60); do
  ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1 && break
  running "$d/run/containerd.pid" || die "containerd exited; see $d/logs/containerd.log"
  sleep 0.5
done
ctr --address "$CONTAINERD_SOCK" version >/dev/null || die "containerd did not come up; see $d/logs/containerd.log"

{ bash "$here/images.sh" --address "$CONTAINERD_SOCK" 2>&1 1>&3 | tee "$d/logs/images.log" >&2; } 3>&1 ||
  die "building or importing the images failed: $(tail -3 "$d/logs/images.log" | tr '\n' ' ')"

# --- kubelet credentials -------------------------------------------------------------------------
# The kubelet gets its own client cert (system:node:<name>, so the Node authorizer and
# NodeRestriction treat it like any node) and a serving cert for the node IP, both signed by
# the kwokctl cluster CA, so that API server and metrics-server clients using that CA verify.
pki=$d/kubelet/pki
issue() { # NAME SUBJECT EXT
  local name=$1 subj=$2 ext=$3
  [ -f "$pki/$name.crt" ] && openssl x509 -noout -checkend 3600 -in "$pki/$name.crt" >/dev/null &&
    openssl verify -CAfile "$KWOK_PKI/ca.crt" "$pki/$name.crt" >/dev/null 2>&1 && return
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  printf '%s\n' "$ext" > "$pki/$name.ext"
  if [ -f "$KWOK_PKI/ca.key" ]; then
    openssl x509 -req -in "$pki/$name.csr" -CA "$KWOK_PKI/ca.crt" -CAkey "$KWOK_PKI/ca.key" \
      -CAcreateserial -CAserial "$pki/ca.srl" -days 365 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  else
    die "no $KWOK_PKI/ca.key to sign the kubelet's certificates with"
  fi
}
issue client "/O=system:nodes/CN=system:node:$REAL_NODE_NAME" \
  "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature,keyEncipherment"
issue serving "/CN=$REAL_NODE_NAME" \
  "extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature,keyEncipherment
subjectAltName=DNS:$REAL_NODE_NAME,IP:$NODE_IP,IP:127.0.0.1"
kubectl config --kubeconfig "$d/kubelet/kubeconfig" set-cluster local \
  --server "$server" --certificate-authority "$KWOK_PKI/ca.crt" --embed-certs >/dev/null
kubectl config --kubeconfig "$d/kubelet/kubeconfig" set-credentials kubelet \
  --client-certificate "$pki/client.crt" --client-key "$pki/client.key" --embed-certs >/dev/null
kubectl config --kubeconfig "$d/kubelet/kubeconfig" set-context local --cluster local --user kubelet >/dev/null
kubectl config --kubeconfig "$d/kubelet/kubeconfig" use-context local >/dev/null

# --- how the API server reaches the kubelet ------------------------------------------------------
# exec/logs/port-forward go API server -> kubelet. Two things depend on the API server's flags:
#  * It picks the node address by --kubelet-preferred-address-types, Hostname first by default;
#    the Hostname address is the node name, which no DNS here knows (and looking it up would
#    send a query off the machine). Unless InternalIP comes first, map the name in /etc/hosts.
#  * Without --kubelet-client-certificate it calls the kubelet anonymously; the kubelet then has
#    to allow anonymous requests. It listens only on the bridge address, which pods cannot
#    reach ($CHAIN), so only local processes can talk to it.
hosts_marker=$HOSTS_MARKER
if grep -q -- '--kubelet-preferred-address-types=InternalIP' <<<"$apiserver_args"; then
  sed -i "/$hosts_marker\$/d" /etc/hosts
else
  if ! grep -q "^$NODE_IP $REAL_NODE_NAME $hosts_marker\$" /etc/hosts; then
    log "API server prefers Hostname addresses: mapping $REAL_NODE_NAME to $NODE_IP in /etc/hosts"
    sed -i "/$hosts_marker\$/d" /etc/hosts
    printf '%s %s %s\n' "$NODE_IP" "$REAL_NODE_NAME" "$hosts_marker" >> /etc/hosts
  fi
fi
if grep -q -- '--kubelet-client-certificate=' <<<"$apiserver_args"; then
  anonymous=false authz_mode=Webhook
else
  log "API server has no --kubelet-client-certificate: kubelet API allows anonymous access (bound to $NODE_IP only)"
  anonymous=true authz_mode=AlwaysAllow
fi

# --- cgroups -------------------------------------------------------------------------------------
# The kubelet's pods go under a cgroup root of this checkout's own (not the machine-wide
# /kubepods), so down.sh can kill and remove exactly what this node made. The kubelet requires
# the root to exist in every hierarchy; a fresh v1 cpuset cgroup has no cpus/mems until given
# its parent's.
for h in /sys/fs/cgroup/*/; do
  mountpoint -q "$h" || continue
  mkdir -p "$h$CGROUP_ROOT"
  if [ -f "${h}cpuset.cpus" ]; then
    [ "$(tr -d '\n' < "$h$CGROUP_ROOT/cpuset.cpus")" != "" ] || cat "${h}cpuset.cpus" > "$h$CGROUP_ROOT/cpuset.cpus"
    [ "$(tr -d '\n' < "$h$CGROUP_ROOT/cpuset.mems")" != "" ] || cat "${h}cpuset.mems" > "$h$CGROUP_ROOT/cpuset.mems"
  fi
done
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then mkdir -p "/sys/fs/cgroup/$CGROUP_ROOT"; fi  # pure cgroup v2

# --- kubelet -------------------------------------------------------------------------------------
# Pods resolve through this file (there is no cluster DNS); it names nothing they could reach.
printf 'nameserver 127.0.0.1\noptions ndots:1\n' > "$d/kubelet/resolv.conf"
cat > "$d/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: $NODE_IP
healthzPort: 10248
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
imageServiceEndpoint: unix://$CONTAINERD_SOCK
# No systemd here, and the machine has cgroup v1 hierarchies (hybrid): 1.35 refuses v1
# unless failCgroupV1 is false.
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: /$CGROUP_ROOT
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
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
- {key: $REAL_NODE_KEY, value: "true", effect: NoSchedule}
resolvConf: $d/kubelet/resolv.conf
podLogsDir: $d/pod-logs
volumePluginDir: $d/kubelet/volume-plugins
staticPodPath: ""
# Room for the bridge bench's load test (50 boxes) beside the tests' own.
maxPods: 110
# Boxes run untrusted commands: a fork bomb stops at the pod's pid limit.
podPidsLimit: 4096
serializeImagePulls: false
# A shared dev box: evict only when really out of resources, and never garbage-collect the
# locally built images (they cannot be pulled back).
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
evictionPressureTransitionPeriod: 30s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Quick status for tests.
nodeStatusUpdateFrequency: 10s
syncFrequency: 10s
shutdownGracePeriod: 0s
logging: {format: text}
EOF

if running "$d/run/kubelet.pid"; then
  log "kubelet already running (pid $(cat "$d/run/kubelet.pid")); restart it with down.sh + up.sh to apply changes"
else
  log "starting kubelet ($("$KUBELET_BIN" --version)) as node $REAL_NODE_NAME"
  setsid "$KUBELET_BIN" \
    --config "$d/kubelet/config.yaml" \
    --kubeconfig "$d/kubelet/kubeconfig" \
    --root-dir "$d/kubelet/root" \
    --cert-dir "$pki" \
    --hostname-override "$REAL_NODE_NAME" \
    --node-ip "$NODE_IP" \
    --node-labels "$REAL_NODE_KEY=true" \
    --v 2 >>"$d/logs/kubelet.log" 2>&1 < /dev/null &
  echo $! > "$d/run/kubelet.pid"
  echo "$server" > "$d/kubelet/server"
fi

log "waiting for node $REAL_NODE_NAME to be Ready"
for _ in $(seq 1 180); do
  running "$d/run/kubelet.pid" || die "kubelet exited: $(grep -v '^\s*$' "$d/logs/kubelet.log" | tail -1)
last lines of its log ($d/logs/kubelet.log, kept in .cluster/real-node.logs/ by test/cluster/up.sh):
$(tail -20 "$d/logs/kubelet.log")"
  [ "$(kubectl get node "$REAL_NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] && break
  sleep 1
done
[ "$(kubectl get node "$REAL_NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] ||
  die "node $REAL_NODE_NAME not Ready after 180s; see $d/logs/kubelet.log"
rm -f "$REAL_NODE_UNAVAILABLE"

# --- Services: kube-proxy ------------------------------------------------------------------------
# kube-proxy (iptables mode, built with the kubelet) makes ClusterIP Services work for this node's
# pods. clusterCIDR is the pod subnet, so pod -> Service -> pod is not SNATed (the backend sees
# the client pod's own IP); only what comes from outside it (the host) is masqueraded. It changes
# no sysctl: no conntrack sizing or timeouts (0 = leave as is), no route_localnet (NodePorts only
# on the node IP, never on loopback), no oom_score_adj (root here lacks CAP_SYS_RESOURCE).
# Its chains (KUBE-SERVICES, ...) come before felix's (felix appends) and only DNAT, SNAT and
# reject; NetworkPolicy is still decided by felix, on the DNATed destination. One per machine
# (fixed chain names): the first checkout holds $KUBE_PROXY_LOCK, others record why they have none.
lock_owner() { # LOCKFILE PROGRAM: the checkout holding the lock, if its process still runs
  local pid owner_root
  [ -f "$1" ] && read -r pid owner_root < "$1" || return 0
  if kill -0 "$pid" 2>/dev/null && grep -qa -- "$2" "/proc/$pid/cmdline" 2>/dev/null; then printf '%s\n' "$owner_root"; fi
}
proxy_owner=$(lock_owner "$KUBE_PROXY_LOCK" kube-proxy)
services_error=""
if running "$d/run/kube-proxy.pid"; then
  log "kube-proxy already running (pid $(cat "$d/run/kube-proxy.pid"))"
elif [ -n "$proxy_owner" ] && [ "$proxy_owner" != "$root" ]; then
  services_error="kube-proxy (one per machine: its iptables chains have fixed names) already runs for the checkout $proxy_owner; stop its cluster and run test/cluster/up.sh again"
elif [ ! -x "$CLUSTER_DIR/bin/kube-proxy" ]; then
  services_error="kube-proxy not built (run test/cluster/build.sh)"
else
  # Its own identity, as kubeadm gives it: system:kube-proxy, bound to system:node-proxier by
  # the API server's bootstrap RBAC.
  issue kube-proxy "/CN=system:kube-proxy" \
    "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature,keyEncipherment"
  mkdir -p "$d/kube-proxy"
  kubectl config --kubeconfig "$d/kube-proxy/kubeconfig" set-cluster local \
    --server "$server" --certificate-authority "$KWOK_PKI/ca.crt" --embed-certs >/dev/null
  kubectl config --kubeconfig "$d/kube-proxy/kubeconfig" set-credentials kube-proxy \
    --client-certificate "$pki/kube-proxy.crt" --client-key "$pki/kube-proxy.key" --embed-certs >/dev/null
  kubectl config --kubeconfig "$d/kube-proxy/kubeconfig" set-context local --cluster local --user kube-proxy >/dev/null
  kubectl config --kubeconfig "$d/kube-proxy/kubeconfig" use-context local >/dev/null
  cat > "$d/kube-proxy/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $d/kube-proxy/kubeconfig
mode: iptables
hostnameOverride: $REAL_NODE_NAME
# The pod subnet: traffic from it is "local", so pod -> Service -> pod keeps its source IP.
clusterCIDR: $POD_SUBNET
detectLocalMode: ClusterCIDR
bindAddress: $NODE_IP
healthzBindAddress: $NODE_IP:$KUBE_PROXY_HEALTH_PORT
metricsBindAddress: $NODE_IP:$KUBE_PROXY_METRICS_PORT
# NodePorts on the node IP only: never on this machine's other addresses, never on loopback.
nodePortAddresses: [$NODE_IP/32]
iptables:
  localhostNodePorts: false
  masqueradeAll: false
  syncPeriod: 30s
  minSyncPeriod: 1s
# Leave the machine's conntrack settings and this process's OOM score as they are.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
oomScoreAdj: 0
logging: {format: text}
EOF
  log "starting kube-proxy ($("$CLUSTER_DIR/bin/kube-proxy" --version), iptables mode, cluster CIDR $POD_SUBNET)"
  setsid "$CLUSTER_DIR/bin/kube-proxy" --config "$d/kube-proxy/config.yaml" >>"$d/logs/kube-proxy.log" 2>&1 < /dev/null &
  echo $! > "$d/run/kube-proxy.pid"
  printf '%s %s\n' "$(cat "$d/run/kube-proxy.pid")" "$root" > "$KUBE_PROXY_LOCK"
  for _ in $(seq 1 120); do
    curl -fsS "http://$NODE_IP:$KUBE_PROXY_HEALTH_PORT/healthz" >/dev/null 2>&1 && break
    running "$d/run/kube-proxy.pid" || break
    sleep 0.5
  done
  if ! curl -fsS "http://$NODE_IP:$KUBE_PROXY_HEALTH_PORT/healthz" >/dev/null 2>&1; then
    services_error="kube-proxy did not become healthy: $(grep -v '^\s*$' "$d/logs/kube-proxy.log" | tail -3 | tr '\n' ' ')"
    kill "$(cat "$d/run/kube-proxy.pid")" 2>/dev/null || true
    rm -f "$d/run/kube-proxy.pid" "$KUBE_PROXY_LOCK"
  fi
fi
if [ -n "$services_error" ]; then
  # Pods still run; Service IPs lead nowhere ($CHAIN_SVC drops them), and the tests that need
  # Services skip and say why.
  printf 'Services do not work on this real node: %s\n' "$services_error" > "$SERVICES_UNAVAILABLE"
  log "WARNING: $(cat "$SERVICES_UNAVAILABLE")"
else
  rm -f "$SERVICES_UNAVAILABLE"
  log "kube-proxy ready: ClusterIP Services work on $REAL_NODE_NAME (Service IPs $(echo $service_cidrs))"
fi

# In-cluster API access: checked the way a pod's client does it, from the host (kube-proxy DNATs
# the host's connections too): https://<kubernetes Service IP>:443, verifying the serving
# certificate for that IP with the cluster CA. What fails is recorded for the tests to print.
api_error=""
svc_ip=$(kubectl get service kubernetes -n default -o jsonpath='{.spec.clusterIP}')
advertised=$(kubectl get endpointslice kubernetes -n default -o jsonpath='{.endpoints[0].addresses[0]}:{.ports[0].port}' 2>/dev/null || true)
tls_cert=$(sed -n 's/^--tls-cert-file=//p' <<<"$apiserver_args")
if [ -n "$services_error" ]; then
  api_error="it needs Services: $services_error"
elif [ "$advertised" != "$forwarder" ]; then
  api_error="the kubernetes Service leads to $advertised, not to the forwarder on $forwarder: the API server does not advertise the node IP (--advertise-address), so the cluster was created from an older test/cluster/kwok.yaml; recreate it (npm run cluster:down && npm run cluster:up)"
elif [ -n "$tls_cert" ] && [[ "$(openssl x509 -noout -checkip "$svc_ip" -in "$tls_cert" 2>&1)" != *"does match"* ]]; then
  api_error="the API server's certificate ($tls_cert) is not valid for the kubernetes Service IP $svc_ip (kwokctl's kubeApiserverCertSANs, test/cluster/kwok.yaml; the cluster was created from an older one: recreate it)"
elif ! curl_error=$(curl -sS -o /dev/null --max-time 10 --cacert "$KWOK_PKI/ca.crt" "https://$svc_ip:443/readyz" 2>&1); then
  api_error="https://$svc_ip:443/readyz failed from the host: $curl_error"
fi
if [ -n "$api_error" ]; then
  printf 'Pods on this real node cannot reach the API server with in-cluster config: %s\n' "$api_error" > "$IN_CLUSTER_API_UNAVAILABLE"
  log "WARNING: $(cat "$IN_CLUSTER_API_UNAVAILABLE")"
else
  rm -f "$IN_CLUSTER_API_UNAVAILABLE"
  log "in-cluster API access: https://$svc_ip:443 -> $forwarder -> 127.0.0.1:$api_port, certificate valid for $svc_ip"
fi

# --- NetworkPolicy: felix ------------------------------------------------------------------------
# Calico's felix enforces NetworkPolicy on this node's pod interfaces (policy only: no BGP, no
# IPAM of its own, no encapsulation). Its rules come after the harness (append mode) and
# RETURN rather than ACCEPT what policy allows, so the harness always has the last word. It
# does not police traffic from the host to its own pods (kubelet probes, a bridge running on
# this machine), as in any Calico cluster. It never sends usage reports.
felix_owner() { # prints the checkout holding the machine's felix, if that felix still runs
  local pid root
  [ -f "$FELIX_LOCK" ] && read -r pid root < "$FELIX_LOCK" || return 0
  # A lock left by a felix that has since died (another session, a reboot) is no owner.
  if kill -0 "$pid" 2>/dev/null && grep -q calico-felix "/proc/$pid/cmdline" 2>/dev/null; then
    printf '%s\n' "$root"
  fi
}
owner=$(felix_owner)
if running "$d/run/felix.pid"; then
  log "felix already running (pid $(cat "$d/run/felix.pid"))"
elif [ -n "$owner" ] && [ "$owner" != "$root" ]; then
  printf 'NetworkPolicy is not enforced on this real node: the NetworkPolicy enforcer (Calico felix, one per machine: its iptables chains and ipsets have fixed names) already runs for the checkout %s; stop its cluster and run test/cluster/up.sh again\n' "$owner" > "$NETPOL_UNAVAILABLE"
  log "WARNING: $(cat "$NETPOL_UNAVAILABLE")"
else
  netpol_error=""
  if ! command -v ipset >/dev/null || ! command -v conntrack >/dev/null; then
    netpol_error="felix needs ipset and conntrack (Debian packages ipset, conntrack)"
  elif [ ! -x "$CLUSTER_DIR/bin/calico-felix" ]; then
    netpol_error="calico-felix not built (run test/cluster/build.sh)"
  else
    log "starting felix (Calico v3.31.0, NetworkPolicy only)"
    mkdir -p "$d/calico/status"
    FELIX_DATASTORETYPE=kubernetes KUBECONFIG="$KUBECONFIG" FELIX_FELIXHOSTNAME="$REAL_NODE_NAME" \
    FELIX_INTERFACEPREFIX="$IFACE_PREFIX" FELIX_USAGEREPORTINGENABLED=false FELIX_IPV6SUPPORT=false \
    FELIX_IPFORWARDING=Disabled FELIX_CHAININSERTMODE=append \
    FELIX_IPTABLESFILTERALLOWACTION=RETURN FELIX_IPTABLESMANGLEALLOWACTION=RETURN \
    FELIX_DEFAULTENDPOINTTOHOSTACTION=ACCEPT FELIX_IPTABLESBACKEND=nft FELIX_XDPENABLED=false \
    FELIX_ROUTESOURCE=WorkloadIPs FELIX_REMOVEEXTERNALROUTES=false \
    FELIX_ENDPOINTSTATUSPATHPREFIX="$d/calico/status" FELIX_DebugSkipCTLBCleanup=true \
    FELIX_LOGFILEPATH=none FELIX_LOGSEVERITYSYS=none FELIX_LOGSEVERITYSCREEN=INFO \
    FELIX_HEALTHENABLED=true FELIX_HEALTHHOST=127.0.0.1 FELIX_HEALTHPORT="$FELIX_HEALTH_PORT" \
      setsid "$CLUSTER_DIR/bin/calico-felix" >>"$d/logs/felix.log" 2>&1 < /dev/null &
    echo $! > "$d/run/felix.pid"
    printf '%s %s\n' "$(cat "$d/run/felix.pid")" "$root" > "$FELIX_LOCK"
    for _ in $(seq 1 120); do
      curl -fsS "http://127.0.0.1:$FELIX_HEALTH_PORT/readiness" >/dev/null 2>&1 && break
      running "$d/run/felix.pid" || break
      sleep 0.5
    done
    if ! curl -fsS "http://127.0.0.1:$FELIX_HEALTH_PORT/readiness" >/dev/null 2>&1; then
      netpol_error="felix did not become ready: $(grep -v '^\s*$' "$d/logs/felix.log" | tail -3 | tr '\n' ' ')"
      kill "$(cat "$d/run/felix.pid")" 2>/dev/null || true
      rm -f "$d/run/felix.pid" "$FELIX_LOCK"
    fi
  fi
  if [ -n "$netpol_error" ]; then
    # The node is still useful without enforcement; the NetworkPolicy tests skip and say why.
    printf 'NetworkPolicy is not enforced on this real node: %s\n' "$netpol_error" > "$NETPOL_UNAVAILABLE"
    log "WARNING: $(cat "$NETPOL_UNAVAILABLE")"
  else
    rm -f "$NETPOL_UNAVAILABLE"
    log "felix ready: NetworkPolicy is enforced on $REAL_NODE_NAME"
  fi
fi

# --- gVisor RuntimeClass -------------------------------------------------------------------------
# Created only when runsc can start a sandbox on this machine; otherwise the reason is kept in
# $GVISOR_UNAVAILABLE (the tests print it when they skip). Pods naming it land on this node.
if [ ! -x "$CLUSTER_DIR/bin/runsc" ] || [ ! -x "$CLUSTER_DIR/bin/containerd-shim-runsc-v1" ]; then
  gvisor_error="runsc or containerd-shim-runsc-v1 not built (run test/cluster/build.sh)"
elif ! gvisor_error=$("$CLUSTER_DIR/bin/runsc" --root "$d/runsc/check" --network=none --platform=systrap do /bin/true 2>&1); then
  gvisor_error="runsc cannot run a sandbox here: $(tail -3 <<<"$gvisor_error" | tr '\n' ' ')"
# The path pods take: containerd starting gVisor's shim, which starts runsc.
elif ! gvisor_error=$(timeout 60 ctr --address "$CONTAINERD_SOCK" -n k8s.io run --rm --runtime io.containerd.runsc.v1 \
    "${BOX_IMAGES%% *}" "sbx-gvisor-check-$$" /bin/true 2>&1); then
  gvisor_error="containerd cannot start a gVisor container here: $(tail -3 <<<"$gvisor_error" | tr '\n' ' ')"
  ctr --address "$CONTAINERD_SOCK" -n k8s.io containers delete "sbx-gvisor-check-$$" >/dev/null 2>&1 || true
else
  gvisor_error=""
fi
rm -rf "$d/runsc/check"
if [ -z "$gvisor_error" ]; then
  kubectl apply -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: $GVISOR_RUNTIME_CLASS
handler: runsc
scheduling:
  nodeSelector: {$REAL_NODE_KEY: "true"}
  tolerations: [{key: $REAL_NODE_KEY, operator: Exists, effect: NoSchedule}]
EOF
  rm -f "$GVISOR_UNAVAILABLE"
  log "RuntimeClass $GVISOR_RUNTIME_CLASS ready ($("$CLUSTER_DIR/bin/runsc" --version | head -1), platform systrap)"
else
  printf '%s\n' "$gvisor_error" > "$GVISOR_UNAVAILABLE"
  kubectl delete runtimeclass "$GVISOR_RUNTIME_CLASS" --ignore-not-found >/dev/null 2>&1 || true
  log "WARNING: no RuntimeClass $GVISOR_RUNTIME_CLASS: $gvisor_error"
fi

log "node $REAL_NODE_NAME Ready in $(( $(date +%s) - start ))s (logs: $d/logs/)"
