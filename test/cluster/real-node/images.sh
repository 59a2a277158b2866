#!/usr/bin/env bash
# Builds the real node's container images without docker or a registry (none is reachable here)
# and imports them into the real node's containerd (namespace k8s.io, where the CRI plugin looks).
#
#   test/cluster/real-node/images.sh [--build-only] [--only NAME] [--address SOCKET]
#
# --only NAME builds (when its inputs changed) and imports that image alone: pause, box, boxd,
# egress-gateway or box-tools. A test that needs the gateway as gateway/ is now runs
# `images.sh --only egress-gateway` (about a second when nothing changed).
#
# Images (hand-made OCI image layouts, one uncompressed layer each):
#   registry.k8s.io/pause:3.10.1   Kubernetes' pause.c compiled statically; containerd's sandbox_image
#   sandbox-bridge.local/box:dev   busybox-static (sh + every applet), /workspace, /tmp, user 65534
#                                  (a registry host we own by convention: .local never resolves to
#                                  a public registry, unlike the unqualified "sandbox-bridge/box",
#                                  which CRI reads as docker.io/sandbox-bridge/box, a name we do not own)
#   sandbox-bridge.local/boxd:dev  scratch with only the static /boxd (boxd/build.sh), user 65534;
#                                  box pods' init container runs `/boxd install` from it
#   sandbox-bridge.local/egress-gateway:dev
#                                  scratch with only the static /egress-gateway (gateway/build.sh),
#                                  user 65534 (the Dockerfile's egress-gateway target)
#   sandbox-bridge.local/box-tools:dev
#                                  the box image plus Debian's curl with its shared libraries and the
#                                  host's CA bundle at /etc/ssl/certs/ca-certificates.crt; same user,
#                                  working directory and command as box:dev
# Tarballs are cached under ~/.cache/sandbox-bridge/images/ by a hash of their inputs, so a rerun
# only re-imports (and skips that too when containerd already has the same digest). Runs take a
# lock, so tests and up.sh may start it at the same time.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
# shellcheck source=../versions.env
. "$here/../versions.env"
# shellcheck source=real-node.env
. "$here/real-node.env"

build_only=false
only=""
address=$CONTAINERD_SOCK
while [ $# -gt 0 ]; do
  case "$1" in
    --build-only) build_only=true; shift ;;
    --only) only=$2; shift 2 ;;
    --address) address=$2; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "images.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$only" in ""|pause|box|boxd|egress-gateway|box-tools) ;; *) echo "images.sh: --only: no image $only" >&2; exit 2 ;; esac
want() { [ -z "$only" ] || [ "$only" = "$1" ]; }

log() { printf '[real-node:images] %s\n' "$*" >&2; }
cache=${SANDBOX_BRIDGE_CACHE:-$HOME/.cache/sandbox-bridge}/images
mkdir -p "$cache"
# One run at a time: two runs writing one cached tarball, or importing at once, would race.
exec 9>>"$cache/.lock"
flock 9

# Fixed timestamps, ordering and numeric owners make the layer (and so every digest) reproducible.
tar_layer() { # ROOTFS OUT
  tar --sort=name --mtime=@0 --numeric-owner --format=gnu -C "$1" -cf "$2" .
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

# make_image OUT ROOTFS CONFIG_JSON NAME... : writes an OCI image layout tarball for ROOTFS with
# the given image "config" object, naming it NAME... via the annotations `ctr import` reads.
make_image() {
  local out=$1 rootfs=$2 config=$3; shift 3
  local dir; dir=$(mktemp -d)
  mkdir -p "$dir/blobs/sha256"
  tar_layer "$rootfs" "$dir/layer.tar"
  local layer_sha layer_size
  layer_sha=$(sha "$dir/layer.tar"); layer_size=$(size "$dir/layer.tar")
  mv "$dir/layer.tar" "$dir/blobs/sha256/$layer_sha"

  jq -cn --argjson config "$config" --arg diff "sha256:$layer_sha" '{
      architecture: "amd64", os: "linux", created: "1970-01-01T00:00:00Z",
      config: $config,
      rootfs: {type: "layers", diff_ids: [$diff]},
      history: [{created: "1970-01-01T00:00:00Z", created_by: "test/cluster/real-node/images.sh"}]
    }' > "$dir/config.json"
  local config_sha config_size
  config_sha=$(sha "$dir/config.json"); config_size=$(size "$dir/config.json")
  mv "$dir/config.json" "$dir/blobs/sha256/$config_sha"

  jq -cn --arg c "sha256:$config_sha" --argjson cs "$config_size" \
         --arg l "sha256:$layer_sha" --argjson ls "$layer_size" '{
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $c, size: $cs},
      layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $l, size: $ls}]
    }' > "$dir/manifest.json"
  local manifest_sha manifest_size
  manifest_sha=$(sha "$dir/manifest.json"); manifest_size=$(size "$dir/manifest.json")
  mv "$dir/manifest.json" "$dir/blobs/sha256/$manifest_sha"

  # One index entry per name: containerd's importer names an image after io.containerd.image.name.
  printf '%s\n' "$@" | jq -cR --arg m "sha256:$manifest_sha" --argjson ms "$manifest_size" '{
      mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $m, size: $ms,
      platform: {architecture: "amd64", os: "linux"},
      annotations: {"io.containerd.image.name": ., "org.opencontainers.image.ref.name": (. | sub(".*:"; ""))}
    }' | jq -cs '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: .}' \
    > "$dir/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$dir/oci-layout"

  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$dir" -cf "$out.tmp" oci-layout index.json blobs
  mv "$out.tmp" "$out"
  rm -rf "$dir"
  log "built $out (manifest sha256:$manifest_sha)"
}

# --- pause ---------------------------------------------------------------------------------------
if want pause; then
  pause_src=$(go env GOMODCACHE)/k8s.io/kubernetes@$KUBERNETES_VERSION/build/pause/linux/pause.c
  if [ ! -f "$pause_src" ]; then
    log "fetching k8s.io/kubernetes@$KUBERNETES_VERSION into the Go module cache for pause.c"
    (cd "$cache" && GOFLAGS=-mod=mod go mod download "k8s.io/kubernetes@$KUBERNETES_VERSION")
  fi
  pause_key=$( { cat "$pause_src"; gcc --version | head -1; sed -n '/^# --- pause/,/^# --- box /p' "$0"; \
    declare -f make_image tar_layer; echo "$PAUSE_IMAGE"; } | sha256sum | cut -c1-16)
  pause_tar=$cache/pause-$pause_key.tar
  if [ ! -f "$pause_tar" ]; then
    work=$(mktemp -d)
    mkdir -p "$work/rootfs"
    # Same flags as build/pause/Makefile; -static because the image holds nothing else.
    gcc -Os -Wall -Werror -static -DVERSION="v${PAUSE_IMAGE##*:}-sandbox-bridge" \
      -o "$work/rootfs/pause" "$pause_src"
    strip "$work/rootfs/pause"
    make_image "$pause_tar" "$work/rootfs" \
      '{"User":"65535:65535","Entrypoint":["/pause"]}' "$PAUSE_IMAGE"
    rm -rf "$work"
  else
    log "pause image cached: $pause_tar"
  fi
fi

# --- box -----------------------------------------------------------------------------------------
busybox=/bin/busybox
# Debian's busybox-static puts a static busybox at /bin/busybox; the dynamic "busybox" package
# would not run in an image without libc (ldd fails on a static binary).
if ! "$busybox" --list >/dev/null 2>&1 || ldd "$busybox" >/dev/null 2>&1; then
  log "ERROR: $busybox is not a static busybox: install the busybox-static package"
  exit 1
fi
# box_rootfs DIR: the box image's files, made in DIR (a fresh directory; box-tools starts from them).
box_rootfs() {
  local r=$1 applet up
  # A directory that does not exist yet, never one of the host's (an empty $r would mean /).
  [ -n "$r" ] && mkdir "$r" || { log "ERROR: box_rootfs: $r must be a new directory"; exit 1; }
  mkdir -p "$r/bin" "$r/sbin" "$r/usr/bin" "$r/usr/sbin" "$r/etc" "$r/root" "$r/workspace" "$r/tmp" \
    "$r/proc" "$r/sys" "$r/dev" "$r/run" "$r/var/tmp" "$r/home/nobody"
  cp "$busybox" "$r/bin/busybox"
  # Every applet as a relative symlink at its usual path (bin/sh, usr/bin/timeout, ...).
  "$busybox" --list-full | while read -r applet; do
    case "$applet" in bin/busybox|linuxrc) continue ;; esac
    up=$(sed 's#[^/]*/#../#g; s#[^/]*$##' <<<"$applet")
    ln -sf "${up}bin/busybox" "$r/$applet"
  done
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/home/nobody:/bin/sh' > "$r/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' 'nobody:x:65534:' > "$r/etc/group"
  printf 'hosts: files dns\n' > "$r/etc/nsswitch.conf"
  # Boxes run as 65534 on an emptyDir /workspace, but the image's own dirs must work too.
  chown 65534:65534 "$r/workspace" "$r/home/nobody"
  chmod 0755 "$r/workspace"
  chmod 1777 "$r/tmp" "$r/var/tmp"
}
BOX_CONFIG='{
    "User": "65534:65534",
    "WorkingDir": "/workspace",
    "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/home/nobody"],
    "Cmd": ["/bin/sh"]
  }'
if want box; then
  box_key=$( { sha256sum "$busybox"; sed -n '/^# --- box /,/^# --- boxd/p' "$0"; \
    declare -f make_image tar_layer box_rootfs; echo "$BOX_IMAGES"; } | sha256sum | cut -c1-16)
  box_tar=$cache/box-$box_key.tar
  if [ ! -f "$box_tar" ]; then
    work=$(mktemp -d)
    box_rootfs "$work/rootfs"
    # shellcheck disable=SC2086
    make_image "$box_tar" "$work/rootfs" "$BOX_CONFIG" $BOX_IMAGES
    rm -rf "$work"
  else
    log "box image cached: $box_tar"
  fi
fi

# --- boxd ----------------------------------------------------------------------------------------
# Rebuilt when boxd's sources or the Go version change (tests do not go into the binary).
BOXD_IMAGE=${BOXD_IMAGE:-sandbox-bridge.local/boxd:dev}
if want boxd; then
  boxd_key=$( { (cd "$root/boxd" && find . -type f \( -name '*.go' -o -name go.mod -o -name build.sh \) \
    ! -name '*_test.go' -print0 | sort -z | xargs -0 sha256sum); go version; \
    sed -n '/^# --- boxd/,/^# --- egress-gateway/p' "$0"; declare -f make_image tar_layer; echo "$BOXD_IMAGE"; } |
    sha256sum | cut -c1-16)
  boxd_tar=$cache/boxd-$boxd_key.tar
  if [ ! -f "$boxd_tar" ]; then
    work=$(mktemp -d)
    "$root/boxd/build.sh" "$work/rootfs"
    make_image "$boxd_tar" "$work/rootfs" '{"User": "65534:65534", "Entrypoint": ["/boxd"]}' "$BOXD_IMAGE"
    rm -rf "$work"
  else
    log "boxd image cached: $boxd_tar"
  fi
fi

# --- egress-gateway ------------------------------------------------------------------------------
# Rebuilt whenever gateway/'s sources change (they may be changing while this runs): the key
# hashes every non-test Go file, go.mod, go.sum and build.sh. A build that fails keeps whatever
# image containerd already has and says why; it fails this script only with --only, so a gateway
# mid-change never keeps the real node from starting.
if want egress-gateway; then
  gateway_key=$( { (cd "$root/gateway" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum -o -name build.sh \) \
    ! -name '*_test.go' -print0 | sort -z | xargs -0 sha256sum); go version; \
    sed -n '/^# --- egress-gateway/,/^# --- box-tools/p' "$0"; declare -f make_image tar_layer; echo "$EGRESS_GATEWAY_IMAGE"; } |
    sha256sum | cut -c1-16)
  gateway_tar=$cache/egress-gateway-$gateway_key.tar
  if [ ! -f "$gateway_tar" ]; then
    work=$(mktemp -d)
    if gateway_error=$("$root/gateway/build.sh" "$work/rootfs" 2>&1); then
      make_image "$gateway_tar" "$work/rootfs" '{"User": "65534:65534", "Entrypoint": ["/egress-gateway"]}' "$EGRESS_GATEWAY_IMAGE"
    else
      log "WARNING: gateway/build.sh failed, so $EGRESS_GATEWAY_IMAGE was not rebuilt: $gateway_error"
      rm -rf "$work"
      [ -n "$only" ] && exit 1
      gateway_tar=""
    fi
    rm -rf "$work"
  else
    log "egress-gateway image cached: $gateway_tar"
  fi
fi

# --- box-tools -----------------------------------------------------------------------------------
# The box image plus real TLS tools: Debian's curl with every shared library it loads (the whole
# closure ldd lists, at the same paths, with the dynamic loader), and the host's CA bundle as the
# image's system bundle at /etc/ssl/certs/ca-certificates.crt (where Debian's curl and OpenSSL
# look). Rebuilt when any of those files changes.
if want box-tools; then
  curl_bin=$(command -v curl) || { log "ERROR: no curl on this host (Debian package curl)"; exit 1; }
  ca_bundle=/etc/ssl/certs/ca-certificates.crt
  [ -s "$ca_bundle" ] || { log "ERROR: no $ca_bundle on this host (Debian package ca-certificates)"; exit 1; }
  curl_libs=$(ldd "$curl_bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
  [ -n "$curl_libs" ] || { log "ERROR: ldd $curl_bin lists no libraries"; exit 1; }
  tools_key=$( { sha256sum "$busybox" "$curl_bin" "$ca_bundle"; for f in $curl_libs; do printf '%s ' "$f"; sha256sum < "$f"; done; \
    sed -n '/^# --- box-tools/,/^# --- import/p' "$0"; declare -f make_image tar_layer box_rootfs; \
    echo "$BOX_CONFIG $BOX_TOOLS_IMAGE"; } | sha256sum | cut -c1-16)
  tools_tar=$cache/box-tools-$tools_key.tar
  if [ ! -f "$tools_tar" ]; then
    work=$(mktemp -d)
    box_rootfs "$work/rootfs"
    install -m 0755 "$curl_bin" "$work/rootfs/usr/bin/curl"
    for f in $curl_libs; do
      mkdir -p "$work/rootfs$(dirname "$f")"
      cp -L "$f" "$work/rootfs$f"
    done
    mkdir -p "$work/rootfs/etc/ssl/certs"
    install -m 0644 "$ca_bundle" "$work/rootfs/etc/ssl/certs/ca-certificates.crt"
    make_image "$tools_tar" "$work/rootfs" "$BOX_CONFIG" "$BOX_TOOLS_IMAGE"
    rm -rf "$work"
  else
    log "box-tools image cached: $tools_tar"
  fi
fi

# --- import --------------------------------------------------------------------------------------
if $build_only; then
  for t in "${pause_tar:-}" "${box_tar:-}" "${boxd_tar:-}" "${gateway_tar:-}" "${tools_tar:-}"; do
    if [ -n "$t" ]; then printf '%s\n' "$t"; fi
  done
  exit 0
fi
[ -S "$address" ] || { log "containerd socket $address not found (start it with up.sh, or pass --build-only)"; exit 1; }
ctr=(ctr --address "$address" -n k8s.io)
import() { # TARBALL NAME...
  local tarball=$1; shift
  local want have
  want=$(tar -xOf "$tarball" index.json | jq -r '.manifests[0].digest')
  for name in "$@"; do
    have=$("${ctr[@]}" images ls "name==$name" 2>/dev/null | awk 'NR==2{print $3}')
    if [ "$have" != "$want" ]; then
      log "importing $tarball ($*)"
      "${ctr[@]}" images import --all-platforms "$tarball" >&2
      return
    fi
  done
  log "already imported: $*"
}
if want pause; then import "$pause_tar" "$PAUSE_IMAGE"; fi
# shellcheck disable=SC2086
if want box; then import "$box_tar" $BOX_IMAGES; fi
if want boxd; then import "$boxd_tar" "$BOXD_IMAGE"; fi
if want egress-gateway && [ -n "$gateway_tar" ]; then import "$gateway_tar" "$EGRESS_GATEWAY_IMAGE"; fi
if want box-tools; then import "$tools_tar" "$BOX_TOOLS_IMAGE"; fi
