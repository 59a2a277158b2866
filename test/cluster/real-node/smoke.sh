#!/usr/bin/env bash
# Checks the real node end to end with kubectl: a restricted box pod in a namespace enforcing the
# restricted Pod Security level; exec (uid, workdir, files kept across execs), logs, a memory
# limit that OOM-kills, and resource metrics (kubelet summary API and, if present, metrics-server).
#
#   test/cluster/real-node/smoke.sh [--keep]      (--keep leaves the namespace for poking around)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
# shellcheck source=real-node.env
. "$here/real-node.env"

keep=false
[ "${1:-}" = --keep ] && keep=true
ns=real-node-smoke
fails=0
log() { printf '[real-node:smoke] %s\n' "$*" >&2; }
check() { # DESCRIPTION EXPECTED ACTUAL
  if [ "$2" = "$3" ]; then log "ok   $1"; else log "FAIL $1: expected [$2], got [$3]"; fails=$((fails + 1)); fi
}
$keep || trap 'kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true' EXIT

# A namespace still terminating from an earlier run would refuse new pods.
kubectl wait --for=delete "namespace/$ns" --timeout=120s >/dev/null 2>&1 || true
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label namespace "$ns" --overwrite >/dev/null \
  pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/enforce-version=latest

# box POD_NAME MEMORY_LIMIT COMMAND : a pod shaped like the bridge's boxes, pinned to the real node.
box() {
  kubectl apply -n "$ns" -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
spec:
  nodeSelector: {$REAL_NODE_KEY: "true"}
  tolerations: [{key: $REAL_NODE_KEY, operator: Exists, effect: NoSchedule}]
  automountServiceAccountToken: false
  enableServiceLinks: false
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  securityContext:
    runAsNonRoot: true
    runAsUser: 65534
    runAsGroup: 65534
    fsGroup: 65534
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: box
    image: sandbox-bridge.local/box:dev
    imagePullPolicy: Never
    command: ["sh", "-c", $3]
    workingDir: /workspace
    resources:
      requests: {cpu: 50m, memory: $2}
      limits: {cpu: 500m, memory: $2}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
    volumeMounts:
    - {name: workspace, mountPath: /workspace}
    - {name: tmp, mountPath: /tmp}
  volumes:
  - {name: workspace, emptyDir: {sizeLimit: 256Mi}}
  - {name: tmp, emptyDir: {sizeLimit: 64Mi}}
EOF
}

# The namespace's restricted level must be enforced: a root pod is refused at admission.
refused=$(kubectl run -n "$ns" smoke-root --image=sandbox-bridge.local/box:dev --restart=Never \
  --overrides='{"spec":{"securityContext":{"runAsUser":0}}}' -- sleep 1 2>&1 || true)
check "restricted Pod Security refuses a root pod" yes "$(grep -q 'violates PodSecurity "restricted' <<<"$refused" && echo yes || echo "no: $refused")"

box smoke-box 64Mi '"echo box started; exec sleep 3600"'
kubectl wait -n "$ns" --for=condition=Ready pod/smoke-box --timeout=120s >/dev/null
check "scheduled on $REAL_NODE_NAME" "$REAL_NODE_NAME" "$(kubectl get pod -n "$ns" smoke-box -o jsonpath='{.spec.nodeName}')"
check "exec id -u" 65534 "$(kubectl exec -n "$ns" smoke-box -- id -u)"
check "exec pwd" /workspace "$(kubectl exec -n "$ns" smoke-box -- pwd)"
kubectl exec -n "$ns" smoke-box -- sh -c 'echo persisted > /workspace/note.txt'
check "file survives between execs" persisted "$(kubectl exec -n "$ns" smoke-box -- cat /workspace/note.txt)"
check "stdin reaches exec" "aGVsbG8=" "$(printf hello | kubectl exec -i -n "$ns" smoke-box -- base64)"
check "exit code of exec" 3 "$(kubectl exec -n "$ns" smoke-box -- sh -c 'exit 3' >/dev/null 2>&1; echo $?)"
# busybox timeout exits 128+SIGTERM (143) where GNU timeout exits 124.
check "busybox timeout kills a command" 143 "$(kubectl exec -n "$ns" smoke-box -- sh -c 'timeout 1 sleep 10; echo $?')"
check "root filesystem is read-only" denied "$(kubectl exec -n "$ns" smoke-box -- sh -c 'touch /etc/x 2>/dev/null && echo allowed || echo denied')"
check "no capabilities" 0000000000000000 "$(kubectl exec -n "$ns" smoke-box -- sh -c 'grep CapEff /proc/self/status | cut -f2')"
check "no_new_privs" 1 "$(kubectl exec -n "$ns" smoke-box -- sh -c 'grep NoNewPrivs /proc/self/status | cut -f2')"
check "seccomp filter active" 2 "$(kubectl exec -n "$ns" smoke-box -- sh -c 'grep ^Seccomp: /proc/self/status | cut -f2')"
check "logs" "box started" "$(kubectl logs -n "$ns" smoke-box)"

# 200 MiB held in memory against a 64Mi limit (busybox tail buffers a line without newlines
# whole). In an exec the kernel kills the biggest process, the exec's own: exit 137. As the
# container's command, the pod reports OOMKilled.
check "200MiB in an exec under a 64Mi limit is killed" 137 \
  "$(kubectl exec -n "$ns" smoke-box -- sh -c 'head -c 209715200 /dev/zero | tail >/dev/null; echo $?')"
box smoke-oom 64Mi '"head -c 209715200 /dev/zero | tail >/dev/null; echo survived"'
for _ in $(seq 1 60); do
  reason=$(kubectl get pod -n "$ns" smoke-oom -o jsonpath='{.status.containerStatuses[0].state.terminated.reason}')
  [ -n "$reason" ] && break
  sleep 2
done
check "200MiB under a 64Mi limit is OOMKilled" OOMKilled "$reason"

# Resource metrics straight from the kubelet (summary API via the API server's node proxy).
cpu=$(kubectl get --raw "/api/v1/nodes/$REAL_NODE_NAME/proxy/stats/summary" |
  jq -r --arg ns "$ns" '.pods[] | select(.podRef.namespace == $ns and .podRef.name == "smoke-box") | .containers[0].memory.workingSetBytes')
check "kubelet summary API has the box's memory" yes "$([ "${cpu:-null}" != null ] && echo yes || echo "no ($cpu)")"
if kubectl get apiservice v1beta1.metrics.k8s.io >/dev/null 2>&1; then
  top=""
  for _ in $(seq 1 30); do
    top=$(kubectl top pod -n "$ns" smoke-box --no-headers 2>/dev/null || true)
    [ -n "$top" ] && break
    sleep 5
  done
  check "kubectl top pod works" yes "$([ -n "$top" ] && echo yes || echo no)"
  log "     $top"
fi

[ "$fails" = 0 ] && log "all checks passed" || { log "$fails check(s) failed"; exit 1; }
