#!/usr/bin/env bash
# Builds kubernetes-sigs/agent-sandbox's controller from its published Go module (through the Go
# module proxy, like test/cluster/build.sh builds the cluster's binaries), cached by version under
# ~/.cache/sandbox-bridge/agent-sandbox-<version>/, and copies the module's CRDs (k8s/crds/ of the
# module in the Go module cache) beside it. Nothing of it is kept in this repository.
#
#   bench/peers/agent-sandbox.sh    prints the cache directory (bin/agent-sandbox-controller, crds/)
#
# The version is pinned: the newest v1.0.x is what the brief asks for, but this machine's Go
# module proxy answers 403 for v1.0.0-v1.0.2 and for the version list itself; v0.5.6 (2026-08-20)
# is the newest it serves. AGENT_SANDBOX_VERSION overrides it.
set -euo pipefail

version=${AGENT_SANDBOX_VERSION:-v0.5.6}
module=sigs.k8s.io/agent-sandbox
cache=${SANDBOX_BRIDGE_CACHE:-$HOME/.cache/sandbox-bridge}
dir="$cache/agent-sandbox-$version"
export GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
log() { printf '[bench:peers] %s\n' "$*" >&2; }

if [ -f "$dir/.done" ]; then
  log "agent-sandbox $version: cached in $dir"
else
  log "agent-sandbox $version: building its controller from the Go module (first time only; a few minutes)"
  rm -rf "$dir" && mkdir -p "$dir/src" "$dir/bin"
  (
    cd "$dir/src"
    # A throwaway module, so the build takes the module's own requirements and nothing of ours.
    printf 'module sandbox-bridge.local/build/agent-sandbox\n\ngo 1.26.0\n' > go.mod
    go get "$module@$version"
    # The version stamp the release build sets (internal/version), so -version names it.
    CGO_ENABLED=0 go build -trimpath \
      -ldflags="-s -w -X $module/internal/version.gitVersion=$version" \
      -o "$dir/bin/" "$module/cmd/agent-sandbox-controller"
    src=$(go list -m -f '{{.Dir}}' "$module")
    cp -r "$src/k8s/crds" "$dir/crds.tmp" && chmod -R u+w "$dir/crds.tmp" && mv "$dir/crds.tmp" "$dir/crds"
  ) 2>&1 | { grep -v '^go: downloading' >&2 || true; }
  [ -x "$dir/bin/agent-sandbox-controller" ] && [ -d "$dir/crds" ] || { log "build failed"; exit 1; }
  touch "$dir/.done"
fi
printf '%s\n' "$dir"
