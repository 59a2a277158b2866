#!/usr/bin/env bash
# Builds the egress gateway as one static binary: gateway/build.sh OUTDIR  ->  OUTDIR/egress-gateway
# Version: $GATEWAY_VERSION, else "dev-" and a hash of the sources.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
cd "$here"
# The go command fetches the toolchain go.mod asks for when the installed one is older.
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto} CGO_ENABLED=0
version=${GATEWAY_VERSION:-dev-$(find . -type f \( -name '*.go' -o -name go.mod \) ! -name '*_test.go' -print0 |
  sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)}
go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=$version" -o "$out/egress-gateway" .
