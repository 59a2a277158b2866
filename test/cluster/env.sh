# Sourced by the cluster scripts: where the local cluster lives and how to reach it.
# shellcheck shell=bash
root=${root:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
export CLUSTER_NAME=${CLUSTER_NAME:-sandbox-bridge}
export CLUSTER_DIR="$root/.cluster"
export KWOK_WORKDIR="$CLUSTER_DIR/kwok"
export KUBECONFIG="$CLUSTER_DIR/kubeconfig"
export PATH="$CLUSTER_DIR/bin:$PATH"
