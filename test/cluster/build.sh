#!/usr/bin/env bash
# Builds the local cluster's binaries from Go modules (no release downloads are reachable here),
# caches each piece by version outside the repo, and links them into .cluster/bin/.
# A second run finds everything cached and only refreshes the links.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
cache=${SANDBOX_BRIDGE_CACHE:-$HOME/.cache/sandbox-bridge}
bin="$root/.cluster/bin"
mkdir -p "$cache" "$bin"
find "$bin" -xtype l -delete # links left dangling by an older version
# -mod=mod lets `go get` write the throwaway module's go.sum; the toolchain may be switched to
# whatever a module asks for (fetched from the Go module proxy).
export GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

log() { printf '[cluster:build] %s\n' "$*" >&2; }

# gobuild NAME VERSION MODULE PKG... : builds the main packages PKG... of MODULE@VERSION into
# $cache/NAME-VERSION/bin through a throwaway module, so that the target's own replace
# directives do not get in the way. Extra go.mod lines come through REPLACES, extra linker flags
# through LDFLAGS, build tags through TAGS. STUB_MODULES names modules the target requires but
# never imports (and the proxy does not serve): each is replaced with an empty local module.
gobuild() {
  local name=$1 version=$2 module=$3; shift 3
  local dir="$cache/$name-$version"
  if [ -f "$dir/.done" ]; then
    log "$name $version: cached in $dir"
  else
    log "$name $version: building $* (first time only; this takes a few minutes)"
    rm -rf "$dir" && mkdir -p "$dir/src" "$dir/bin"
    (
      cd "$dir/src"
      printf 'module sandbox-bridge.local/build/%s\n\ngo 1.25.0\n' "$name" > go.mod
      [ -n "${REPLACES:-}" ] && printf '%s\n' "$REPLACES" >> go.mod
      for m in ${STUB_MODULES:-}; do
        mkdir -p "stub/$m" && printf 'module %s\n\ngo 1.21\n' "$m" > "stub/$m/go.mod"
        printf 'replace %s => ./stub/%s\n' "$m" "$m" >> go.mod
      done
      go get "$module@$version"
      # One invocation for all binaries: packages they share compile once, in parallel.
      CGO_ENABLED=0 go build -trimpath -tags="${TAGS:-}" -ldflags="-s -w ${LDFLAGS:-}" -o "$dir/bin/" "$@"
    ) 2>&1 | { grep -v '^go: downloading' >&2 || true; }
    touch "$dir/.done"
  fi
  ln -sf "$dir"/bin/* "$bin/"
}

# Release builds stamp the version through the linker; without it the binaries report
# v0.0.0-master, which kwokctl and clients use to pick flags and check skew.
component_version() { # VERSION [PACKAGE]
  local v=$1 pkg=${2:-k8s.io/component-base/version} major minor
  major=${v#v}; major=${major%%.*}; minor=${v#v*.}; minor=${minor%%.*}
  printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean' \
    "$pkg" "$v" "$pkg" "$major" "$pkg" "$minor" "$pkg"
}

# k8s.io/kubernetes requires each staging module at v0.0.0 and replaces it with a local path,
# which only works inside its own repo. Replace each with the published v0.X.Y of this release,
# taking the list from the module's own go.mod.
k8s_replaces() {
  local gomod minor
  gomod=$(cd "$cache" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  minor=v0.${KUBERNETES_VERSION#v1.}
  printf 'replace (\n'
  awk '$2 == "v0.0.0" && $1 ~ /^k8s.io\// { print $1 }' "$gomod" | sort -u |
    while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$minor"; done
  printf ')\n'
}

LDFLAGS=$(component_version "$KUBERNETES_VERSION") \
REPLACES=$( [ -f "$cache/kubernetes-$KUBERNETES_VERSION/.done" ] || k8s_replaces ) \
gobuild kubernetes "$KUBERNETES_VERSION" k8s.io/kubernetes \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kubectl
# kube-proxy (the real node's Services, real-node/up.sh): same module and version, cached apart so
# that adding it did not rebuild the pieces above (the Go build cache shares their packages).
LDFLAGS=$(component_version "$KUBERNETES_VERSION") \
REPLACES=$( [ -f "$cache/kube-proxy-$KUBERNETES_VERSION/.done" ] || k8s_replaces ) \
gobuild kube-proxy "$KUBERNETES_VERSION" k8s.io/kubernetes k8s.io/kubernetes/cmd/kube-proxy

# etcd's main package is the module root go.etcd.io/etcd/server/v3, so go names it "server".
LDFLAGS='' REPLACES='' gobuild etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3
rm -f "$bin/server"
ln -sf "$cache/etcd-$ETCD_VERSION/bin/server" "$bin/etcd"

LDFLAGS='' REPLACES='' gobuild kwok "$KWOK_VERSION" sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
LDFLAGS="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" REPLACES='' \
  gobuild helm "$HELM_VERSION" helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm
# metrics-server reports client-go's version variables.
LDFLAGS=$(component_version "$METRICS_SERVER_VERSION" k8s.io/client-go/pkg/version) REPLACES='' \
  gobuild metrics-server "$METRICS_SERVER_VERSION" sigs.k8s.io/metrics-server sigs.k8s.io/metrics-server/cmd/metrics-server

# gVisor: runsc and the containerd shim (package gvisor.dev/gvisor/shim, so go names it "shim").
LDFLAGS="-X gvisor.dev/gvisor/runsc/version.version=$GVISOR_VERSION" REPLACES='' \
  gobuild gvisor "$GVISOR_VERSION" gvisor.dev/gvisor gvisor.dev/gvisor/runsc gvisor.dev/gvisor/shim
rm -f "$bin/shim"
ln -sf "$cache/gvisor-$GVISOR_VERSION/bin/shim" "$bin/containerd-shim-runsc-v1"

# containerd for the real node: the daemon, its runc shim and ctr (images.sh imports with it).
# Without cgo, so without the snapshotters that need it (btrfs, devmapper, zfs: unused here).
TAGS=no_btrfs,no_devmapper,no_zfs LDFLAGS="-X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION#v}" REPLACES='' \
  gobuild containerd "$CONTAINERD_VERSION" github.com/containerd/containerd/v2 \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr

# Calico: felix (calico-felix) and the CNI plugin (calico). Calico's go.mod replaces its api
# and lib modules with directories of its own repo and pins the Kubernetes libraries, so the
# throwaway module does the same with published versions. These pseudo-versions are not in
# the checksum database (it only knows canonical ones, which the proxy does not serve), so
# GONOSUMDB lets the proxy's copy be used for them alone.
calico_replaces() {
  printf 'replace (\n'
  printf '\tgithub.com/projectcalico/api => github.com/projectcalico/api %s\n' "$CALICO_API_VERSION"
  printf '\tgithub.com/projectcalico/calico/lib/std => github.com/projectcalico/calico/lib/std %s\n' "$CALICO_VERSION"
  printf '\tgopkg.in/natefinch/lumberjack.v2 => gopkg.in/natefinch/lumberjack.v2 v2.0.0\n'
  for m in api apiextensions-apiserver apimachinery apiserver client-go component-base; do
    printf '\tk8s.io/%s => k8s.io/%s %s\n' "$m" "$m" "$CALICO_K8S_VERSION"
  done
  printf ')\n'
}
GONOSUMDB=github.com/projectcalico LDFLAGS='' REPLACES=$(calico_replaces) \
STUB_MODULES=github.com/projectcalico/calico/lib/httpmachinery \
  gobuild calico "$CALICO_VERSION" github.com/projectcalico/calico \
  github.com/projectcalico/calico/felix/cmd/calico-felix github.com/projectcalico/calico/cni-plugin/cmd/calico
# Felix reads its policy model from Calico's CRDs; real-node/up.sh applies these copies.
calico_dir="$cache/calico-$CALICO_VERSION"
if [ ! -d "$calico_dir/crds" ]; then
  src=$(cd "$calico_dir/src" && GONOSUMDB=github.com/projectcalico go list -m -f '{{.Dir}}' github.com/projectcalico/calico)
  cp -r "$src/libcalico-go/config/crd" "$calico_dir/crds.tmp" && chmod -R u+w "$calico_dir/crds.tmp" && mv "$calico_dir/crds.tmp" "$calico_dir/crds"
fi

# versitygw: the S3-compatible object store (posix backend) that holds snapshots (object-store/up.sh).
LDFLAGS='' REPLACES='' gobuild versitygw "$VERSITYGW_VERSION" github.com/versity/versitygw github.com/versity/versitygw/cmd/versitygw

log "binaries ready in $bin: $(ls "$bin" | tr '\n' ' ')"
