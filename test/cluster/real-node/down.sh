#!/usr/bin/env bash
# Removes the real node: stops its kubelet, containers and containerd, unmounts what they left,
# deletes the bridge, pod interfaces, test hosts, iptables chains, cgroups and /etc/hosts line of
# this checkout (instance id in real-node.env), felix's chains and ipsets when no other checkout's
# felix runs, the Node object (if the cluster is still up) and .cluster/real-node/.
# Leaves the image cache alone. Safe to run twice, and a no-op when there is nothing to remove.
#
#   test/cluster/real-node/down.sh
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
# shellcheck source=real-node.env
. "$here/real-node.env"

log() { printf '[real-node:down] %s\n' "$*" >&2; }
d=$REAL_NODE_DIR

if [ "$(id -u)" != 0 ]; then
  [ -d "$d" ] || exit 0
  log "ERROR: $d exists but only root can remove the real node (processes, mounts, bridge $BRIDGE)"
  exit 1
fi

stop() { # NAME [group] : TERM, then KILL after 20s, the process whose pid up.sh recorded (with
         # `group`, its whole process group: up.sh started it with setsid)
  local pidfile=$d/run/$1.pid pid target
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  target=$pid
  [ "${2:-}" = group ] && target=-$pid
  # Only the program the pid file names: a stale file's number may belong to another process now
  # (another checkout's kubelet, anything).
  if kill -0 "$pid" 2>/dev/null && grep -qa -- "$1" "/proc/$pid/cmdline" 2>/dev/null; then
    log "stopping $1 (pid $pid)"
    kill -- "$target" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 -- "$target" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

stop kubelet
stop kube-proxy
# The API server forwarder and the process it forked for each connection.
stop socat group
# felix goes first: with the pods gone it would only rewrite rules that are about to be removed.
stop felix

# The shims' sockets are in /run/containerd/s whatever containerd's state dir, named by a hash of
# containerd's address, the namespace and the shim's id; a killed shim leaves its socket behind.
# Named now, from the live shims and the task bundles, before deleting tasks removes the bundles.
shim_sockets=$({
  for pid in $(pgrep -f "containerd-shim-run(c-v2|sc-v1) .*-address $CONTAINERD_SOCK" || true); do
    { tr '\0' ' ' < "/proc/$pid/cmdline"; echo; } 2>/dev/null | sed -n 's/.* -namespace \([^ ]*\) -id \([^ ]*\) .*/\1\/\2/p'
  done
  if [ -d "$d/containerd/state/io.containerd.runtime.v2.task" ]; then
    (cd "$d/containerd/state/io.containerd.runtime.v2.task" && find . -mindepth 2 -maxdepth 2 -type d | sed 's#^\./##')
  fi
} | sort -u | while read -r m; do printf '%s' "$CONTAINERD_SOCK/$m" | sha256sum | cut -d' ' -f1; done)

# Containers outlive containerd (their shims are separate processes), so remove them through CRI
# first: that also releases their CNI addresses and veths.
if [ -S "$CONTAINERD_SOCK" ] && [ -f "$d/run/containerd.pid" ] && kill -0 "$(cat "$d/run/containerd.pid")" 2>/dev/null; then
  # Bounded: a wedged shim must not hang the teardown (what is left is killed further down).
  ctr=(timeout 15 ctr --address "$CONTAINERD_SOCK" -n k8s.io)
  if command -v crictl >/dev/null; then
    crictl -r "unix://$CONTAINERD_SOCK" rmp -af >/dev/null 2>&1 || true
  fi
  for task in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
    "${ctr[@]}" tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
  done
  sleep 1
  for task in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
    "${ctr[@]}" tasks delete -f "$task" >/dev/null 2>&1 || true
  done
  for c in $("${ctr[@]}" containers ls -q 2>/dev/null); do
    "${ctr[@]}" containers delete "$c" >/dev/null 2>&1 || true
  done
fi
stop containerd

# Shims whose containerd was ours (runc, and gVisor's runsc): they carry its socket address on
# their command line. gVisor's sandbox and gofer processes live in the pods' cgroups (below).
for pid in $(pgrep -f "containerd-shim-run(c-v2|sc-v1) .*-address $CONTAINERD_SOCK" || true); do
  log "killing leftover shim $pid"
  kill -9 "$pid" 2>/dev/null || true
done
# Any container process still in this node's cgroups (its own cgroup root) goes too.
for h in /sys/fs/cgroup/*/"$CGROUP_ROOT" /sys/fs/cgroup/"$CGROUP_ROOT"; do
  [ -d "$h" ] || continue
  find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | while read -r pid; do
    kill -9 "$pid" 2>/dev/null || true
  done
done

# Mounts (overlay rootfs, shm, netns, emptyDirs, projected volumes) under the state dir, deepest first.
if [ -d "$d" ]; then
  awk -v d="$d/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
fi
# Pod network namespaces are pinned under containerd's state dir (unmounted above); an older
# node's (containerd 1.6) were pinned under /run/netns (cni-<uuid>).
for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do
  # Only namespaces holding an address of our pod subnet are ours.
  if ip -n "$ns" -4 addr show eth0 2>/dev/null | grep -q "inet ${POD_SUBNET%.*}\."; then
    ip netns delete "$ns" 2>/dev/null || true
  fi
done

# The cgroup root and everything the kubelet made under it (kubepods, burstable, pod<uid>, ...),
# leaves first; a cgroup whose last process is still exiting can take a moment to go.
for _ in 1 2 3 4 5; do
  left=false
  for h in /sys/fs/cgroup/*/"$CGROUP_ROOT" /sys/fs/cgroup/"$CGROUP_ROOT"; do
    [ -d "$h" ] || continue
    find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ -d "$h" ] && left=true
  done
  $left || break
  sleep 0.5
done
$left && log "WARNING: could not remove all of /sys/fs/cgroup/*/$CGROUP_ROOT"

# The shim sockets named above; the directories go only if empty, in case another containerd
# uses them.
for m in $shim_sockets; do rm -f "/run/containerd/s/$m"; done
rmdir /run/containerd/s /run/containerd/fifo /run/containerd/runc/k8s.io /run/containerd/runc /run/containerd 2>/dev/null || true

if ip link show "$BRIDGE" >/dev/null 2>&1; then
  log "deleting bridge $BRIDGE"
  ip link delete "$BRIDGE" || true
fi
# Pod interfaces of this node left without their pod, and test hosts a test did not remove.
for link in $(ip -o link show 2>/dev/null | awk -F': ' -v p="$IFACE_PREFIX" 'index($2, p) == 1 {sub(/@.*/, "", $2); print $2}'); do
  ip link delete "$link" 2>/dev/null || true
done
for ns in $(ip netns list 2>/dev/null | awk -v p="sbxth-$REAL_NODE_ID-" 'index($1, p) == 1 {print $1}'); do
  ip netns delete "$ns" 2>/dev/null || true
done
# The harness (mangle), and the filter chain of earlier, bridged versions.
for c in "$CHAIN" "$HOSTS_CHAIN" "$CHAIN_IN" "$CHAIN_SVC"; do remove_chain mangle "$c"; done
remove_chain filter "$CHAIN"

# kube-proxy's chains (KUBE-SERVICES, KUBE-SVC-*, ...; one kube-proxy per machine), once no other
# checkout's kube-proxy holds the lock: kube-proxy --cleanup removes exactly its own.
lock_pid='' lock_root=''
[ -f "$KUBE_PROXY_LOCK" ] && read -r lock_pid lock_root < "$KUBE_PROXY_LOCK" || true
if [ -z "${lock_pid:-}" ] || [ "${lock_root:-}" = "$root" ] || ! kill -0 "$lock_pid" 2>/dev/null; then
  rm -f "$KUBE_PROXY_LOCK"
  if [ -x "$CLUSTER_DIR/bin/kube-proxy" ] && iptables -t nat -S KUBE-SERVICES >/dev/null 2>&1; then
    log "removing kube-proxy's iptables rules (kube-proxy --cleanup)"
    if ! cleanup_output=$("$CLUSTER_DIR/bin/kube-proxy" --cleanup 2>&1); then
      log "WARNING: kube-proxy --cleanup reported errors: $(grep -v '^\s*$' <<<"$cleanup_output" | tail -2 | tr '\n' ' ')"
    fi
  fi
fi

# felix's own chains (cali-*) and ipsets, once no felix runs on this machine (one per machine).
lock_pid='' lock_root=''
[ -f "$FELIX_LOCK" ] && read -r lock_pid lock_root < "$FELIX_LOCK" || true
if [ -z "${lock_pid:-}" ] || [ "${lock_root:-}" = "$root" ] || ! kill -0 "$lock_pid" 2>/dev/null; then
  rm -f "$FELIX_LOCK"
  for table in raw mangle nat filter; do
    # Felix's rules in the built-in chains jump to cali-* chains or carry a "cali:" comment.
    iptables -t "$table" -S 2>/dev/null | awk '$1 == "-A" && $2 !~ /^cali-/ && (/ -[jg] cali-/ || /--comment "?cali:/)' | sed 's/^-A/-D/' |
      while read -r rule; do eval "iptables -t $table $rule" 2>/dev/null || true; done
    chains=$(iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^cali-/ {print $2}')
    for c in $chains; do iptables -t "$table" -F "$c" 2>/dev/null || true; done
    for c in $chains; do iptables -t "$table" -X "$c" 2>/dev/null || true; done
  done
  if command -v ipset >/dev/null; then
    for set in $(ipset list -n 2>/dev/null | grep '^cali'); do ipset destroy "$set" 2>/dev/null || true; done
  fi
fi
sed -i "/$HOSTS_MARKER\$/d" /etc/hosts

# The kubelet's own iptables chains (KUBE-FIREWALL guards 127.0.0.0/8; the canaries and the hint
# are for kube-proxy), unless another kubelet on this machine still uses them.
if ! pgrep -x kubelet >/dev/null; then
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for chain in INPUT OUTPUT; do
      while "$ipt" -C "$chain" -j KUBE-FIREWALL 2>/dev/null; do "$ipt" -D "$chain" -j KUBE-FIREWALL; done
    done
    for t_c in filter/KUBE-FIREWALL filter/KUBE-KUBELET-CANARY nat/KUBE-KUBELET-CANARY \
               mangle/KUBE-KUBELET-CANARY mangle/KUBE-IPTABLES-HINT; do
      "$ipt" -t "${t_c%/*}" -F "${t_c#*/}" 2>/dev/null && "$ipt" -t "${t_c%/*}" -X "${t_c#*/}" 2>/dev/null || true
    done
  done
fi

if [ -f "$KUBECONFIG" ] && kubectl get --raw /readyz >/dev/null 2>&1; then
  kubectl delete node "$REAL_NODE_NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
fi

rm -rf "$d" "$GVISOR_UNAVAILABLE" "$NETPOL_UNAVAILABLE" "$SERVICES_UNAVAILABLE" "$IN_CLUSTER_API_UNAVAILABLE"
log "real node removed"
