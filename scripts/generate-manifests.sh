#!/usr/bin/env bash
# Renders the Helm chart into plain YAML for `kubectl apply -k` users:
#
#   scripts/generate-manifests.sh [OUT_DIR]      (default: manifests/)
#
# Fixed choices (edit the output with a kustomize overlay, not here):
#   release "sandbox-bridge" in namespace "sandbox-bridge"; sandbox namespace "sandbox";
#   secret.existingSecret=sandbox-bridge-token, boxd.existingSecret=sandbox-bridge-boxd-key and the
#   egress gateway's egressGateway.existingSecret=sandbox-bridge-egress-key and
#   egressGateway.resolverKey.existingSecret=sandbox-bridge-egress-resolver-key, so no secret is
#   committed: create the Secrets yourself (docs/chart.md: "Install with kubectl apply -k").
# The ServiceMonitor and PrometheusRule go to OUT_DIR/monitoring (needs prometheus-operator).
# test/integration/chart-manifests.test.ts regenerates into a temp dir and diffs, so the
# committed manifests never drift from the chart.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/manifests}
chart=$root/charts/sandbox-bridge
helm=${HELM:-}
if [ -z "$helm" ]; then
  if [ -x "$root/.cluster/bin/helm" ]; then helm=$root/.cluster/bin/helm; else helm=helm; fi
fi

release=sandbox-bridge
namespace=sandbox-bridge
# Rendering does not depend on the cluster version; this only satisfies Chart.yaml's kubeVersion
# (a helm built without version ldflags assumes v1.20).
kube_version=1.30.0
header="# Generated from charts/sandbox-bridge by scripts/generate-manifests.sh. Do not edit; rerun the script."

render() {
  "$helm" template "$release" "$chart" --namespace "$namespace" --kube-version "$kube_version" \
    --set secret.existingSecret=sandbox-bridge-token --set boxd.existingSecret=sandbox-bridge-boxd-key \
    --set egressGateway.existingSecret=sandbox-bridge-egress-key \
    --set egressGateway.resolverKey.existingSecret=sandbox-bridge-egress-resolver-key "$@"
}

mkdir -p "$out/crds" "$out/monitoring"

{
  echo "$header"
  cat <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: $namespace
  labels:
    app.kubernetes.io/name: sandbox-bridge
    app.kubernetes.io/part-of: sandbox-bridge
YAML
} > "$out/namespace.yaml"

{ echo "$header"; cat "$chart/crds/sandboxpools.sandbox-bridge.io.yaml"; } > "$out/crds/sandboxpools.sandbox-bridge.io.yaml"

{ echo "$header"; render --skip-crds; } > "$out/sandbox-bridge.yaml"

monitoring=$(render --skip-crds \
  --api-versions monitoring.coreos.com/v1/ServiceMonitor --api-versions monitoring.coreos.com/v1/PrometheusRule \
  --show-only templates/servicemonitor.yaml --show-only templates/prometheusrule.yaml)
{ echo "$header"; echo "$monitoring"; } > "$out/monitoring/monitoring.yaml"

cat > "$out/crds/kustomization.yaml" <<YAML
$header
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - sandboxpools.sandbox-bridge.io.yaml
YAML

# No kustomize `namespace:` here: the objects already name theirs, and some must stay where
# they are (the bridge's Role in the sandbox namespace, the operator's event Role in default).
cat > "$out/kustomization.yaml" <<YAML
$header
# Apply the CRD first (a SandboxPool cannot be created until its CRD is established):
#   kubectl apply -k manifests/crds
#   kubectl wait --for condition=established crd/sandboxpools.sandbox-bridge.io
#   kubectl create namespace sandbox-bridge
#   kubectl create secret generic sandbox-bridge-token -n sandbox-bridge --from-literal=token="\$(openssl rand -hex 32)"
#   kubectl create secret generic sandbox-bridge-boxd-key -n sandbox-bridge --from-literal=key="\$(openssl rand -hex 32)"
#   kubectl create secret generic sandbox-bridge-egress-key -n sandbox-bridge --from-literal=key="\$(openssl rand -hex 32)"
#   kubectl create secret generic sandbox-bridge-egress-resolver-key -n sandbox-bridge --from-literal=key="\$(openssl rand -hex 32)"
#   kubectl apply -k manifests
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - crds
  - namespace.yaml
  - sandbox-bridge.yaml
YAML

cat > "$out/monitoring/kustomization.yaml" <<YAML
$header
# Optional, for clusters running prometheus-operator: kubectl apply -k manifests/monitoring
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - monitoring.yaml
YAML

echo "wrote $out" >&2
