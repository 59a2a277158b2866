#!/usr/bin/env bash
# Stops the local test cluster and removes its state; leaves the build cache alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=env.sh
. "$here/env.sh"

if [ -x "$CLUSTER_DIR/bin/kwokctl" ]; then
  kwokctl delete cluster --name "$CLUSTER_NAME" >&2 || true
fi
rm -rf "$KWOK_WORKDIR" "$CLUSTER_DIR/exec" "$CLUSTER_DIR/logs" "$CLUSTER_DIR/kwok.yaml" "$KUBECONFIG"
echo "[cluster:down] cluster $CLUSTER_NAME stopped" >&2
