#!/usr/bin/env bash
# Stops the local test cluster and removes its state; leaves the build cache alone.
# The real node goes first (real-node/down.sh: its containers, mounts, bridge, iptables chain,
# cgroups, /etc/hosts line and processes), then the object store, then the control plane.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=env.sh
. "$here/env.sh"

bash "$here/real-node/down.sh" || echo "[cluster:down] WARNING: real-node/down.sh failed; see above" >&2
bash "$here/object-store/down.sh" || echo "[cluster:down] WARNING: object-store/down.sh failed; see above" >&2
if [ -x "$CLUSTER_DIR/bin/kwokctl" ]; then
  kwokctl delete cluster --name "$CLUSTER_NAME" >&2 || true
fi
rm -rf "$KWOK_WORKDIR" "$EXEC_DIR" "$CLUSTER_DIR/exec" "$CLUSTER_DIR/logs" "$CLUSTER_DIR/kwok.yaml" "$CLUSTER_DIR/kwok.yaml.sha256" "$KUBECONFIG" \
  "$CLUSTER_DIR/real-node.unavailable" "$CLUSTER_DIR/real-node.logs"
echo "[cluster:down] cluster $CLUSTER_NAME stopped" >&2
