#!/usr/bin/env bash
# Stops the local object store (up.sh) and removes its data and credentials.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
# shellcheck source=../env.sh
. "$here/../env.sh"
d=$CLUSTER_DIR/object-store
if [ -f "$d/pid" ]; then
  pid=$(cat "$d/pid")
  # Only our own process: the pid file could be stale and the number reused by something else.
  if kill -0 "$pid" 2>/dev/null && grep -q versitygw "/proc/$pid/cmdline" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
fi
rm -rf "$d"
