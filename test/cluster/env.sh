# Sourced by the cluster scripts: where the local cluster lives and how to reach it.
# shellcheck shell=bash
root=${root:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
export CLUSTER_NAME=${CLUSTER_NAME:-sandbox-bridge}
export CLUSTER_DIR="$root/.cluster"
export KWOK_WORKDIR="$CLUSTER_DIR/kwok"
export KUBECONFIG="$CLUSTER_DIR/kubeconfig"
export PATH="$CLUSTER_DIR/bin:$PATH"
# Per-checkout id (6 hex digits of a hash of the checkout path), for what lives outside it.
CHECKOUT_ID=$(printf '%s' "$root" | sha256sum | cut -c1-6)
# kwok runs pods/exec of simulated pods on this host as nobody, in this directory. Not inside the
# checkout: a checkout under a directory only root may enter (root's 0700 home, a mktemp -d) would
# make every simulated exec fail with "fork/exec /usr/bin/sh: permission denied". up.sh creates it
# (1777, like /tmp), down.sh removes it.
export EXEC_DIR=/tmp/sandbox-bridge-exec-$CHECKOUT_ID
