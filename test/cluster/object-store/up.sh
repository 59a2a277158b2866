#!/usr/bin/env bash
# Starts the local cluster's S3-compatible object store: versitygw (built by ../build.sh) serving
# a POSIX directory, on loopback only, with a bucket for snapshots. The bridge and operator on
# the host reach it; boxes never do.
#
#   test/cluster/object-store/up.sh       (test/cluster/up.sh runs it; idempotent)
#
# Everything lives in .cluster/object-store/: data/ (the buckets), the pid file, the log, and
# env, the settings tests and `npm run dev` pass to the bridge and operator:
#   OBJECT_STORE_ENDPOINT, OBJECT_STORE_BUCKET, OBJECT_STORE_REGION, OBJECT_STORE_FORCE_PATH_STYLE,
#   OBJECT_STORE_ACCESS_KEY_ID, OBJECT_STORE_SECRET_ACCESS_KEY (random per checkout, mode 0600).
# The port is per checkout (the 8th port of the checkout's block, after the control plane's
# seven; another free one if it is taken). down.sh stops it and removes the directory.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
# shellcheck source=../env.sh
. "$here/../env.sh"

log() { printf '[object-store:up] %s\n' "$*" >&2; }
d=$CLUSTER_DIR/object-store
mkdir -p "$d/data"
chmod 0700 "$d"
bucket=sandbox-bridge-snapshots
region=us-east-1
bin=$CLUSTER_DIR/bin/versitygw
[ -x "$bin" ] || { log "ERROR: $bin is missing; run test/cluster/build.sh"; exit 1; }

running() { [ -f "$d/pid" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null && grep -q versitygw "/proc/$(cat "$d/pid")/cmdline" 2>/dev/null; }
port_free() { ! ss -Htln "sport = :$1" 2>/dev/null | grep -q .; }

if [ ! -s "$d/credentials" ]; then
  umask 077
  printf '%s %s\n' "$(openssl rand -hex 10)" "$(openssl rand -hex 20)" > "$d/credentials"
fi
read -r access secret < "$d/credentials"

if running; then
  port=$(cat "$d/port")
  log "versitygw is already running (pid $(cat "$d/pid"), port $port)"
else
  port=$((20000 + (16#$CHECKOUT_ID % 1200) * 8 + 7))
  if ! port_free "$port"; then
    for port in $(seq 29600 29999); do port_free "$port" && break; done
  fi
  # versitygw keeps object metadata in extended attributes; on a file system without user
  # xattrs it keeps them in a sidecar directory instead.
  meta=()
  if command -v python3 >/dev/null && ! python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.sandbox-bridge-probe", b"1")' "$d/data" 2>/dev/null; then
    mkdir -p "$d/meta"
    meta=(--sidecar "$d/meta")
  fi
  # The credentials go through the environment, never the command line (ps shows that).
  ROOT_ACCESS_KEY_ID=$access ROOT_SECRET_ACCESS_KEY=$secret setsid "$bin" \
    --port "127.0.0.1:$port" --region "$region" --health /health --quiet \
    posix "${meta[@]}" "$d/data" >> "$d/versitygw.log" 2>&1 < /dev/null &
  echo $! > "$d/pid"
  echo "$port" > "$d/port"
  for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "http://127.0.0.1:$port/health" 2>/dev/null && break
    running || { log "ERROR: versitygw exited at start; its log:"; tail -n 20 "$d/versitygw.log" >&2; exit 1; }
    sleep 0.1
  done
  curl -fsS -o /dev/null "http://127.0.0.1:$port/health" || { log "ERROR: versitygw does not answer on port $port"; exit 1; }
  log "versitygw listening on 127.0.0.1:$port (data in $d/data)"
fi

# The bucket, through the S3 API itself (curl signs with SigV4); 409 = it exists already.
empty_sha=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
status=$(curl -sS -o "$d/create-bucket.out" -w '%{http_code}' -X PUT -H "x-amz-content-sha256: $empty_sha" \
  --aws-sigv4 "aws:amz:$region:s3" --user "$access:$secret" "http://127.0.0.1:$port/$bucket")
case "$status" in
  200|409) ;;
  *) log "ERROR: creating bucket $bucket answered $status: $(cat "$d/create-bucket.out")"; exit 1 ;;
esac
rm -f "$d/create-bucket.out"

umask 077
cat > "$d/env" <<ENV
OBJECT_STORE_ENDPOINT=http://127.0.0.1:$port
OBJECT_STORE_BUCKET=$bucket
OBJECT_STORE_REGION=$region
OBJECT_STORE_FORCE_PATH_STYLE=true
OBJECT_STORE_ACCESS_KEY_ID=$access
OBJECT_STORE_SECRET_ACCESS_KEY=$secret
ENV
