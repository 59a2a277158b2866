{{/* Names and labels shared by every template. */}}

{{- define "sandbox-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; cluster-scoped objects use it so two releases never collide. */}}
{{- define "sandbox-bridge.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sandbox-bridge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sandbox-bridge.labels" -}}
helm.sh/chart: {{ include "sandbox-bridge.chart" . }}
app.kubernetes.io/name: {{ include "sandbox-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandbox-bridge
{{- end }}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "bridge"). */}}
{{- define "sandbox-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandbox-bridge.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "sandbox-bridge.componentLabels" -}}
{{ include "sandbox-bridge.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "sandbox-bridge.bridgeName" -}}
{{- printf "%s-bridge" (include "sandbox-bridge.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sandbox-bridge.operatorName" -}}
{{- printf "%s-operator" (include "sandbox-bridge.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sandbox-bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sandbox-bridge.bridgeName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sandbox-bridge.operatorServiceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "sandbox-bridge.operatorName" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sandbox-bridge.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "sandbox-bridge.boxdImage" -}}
{{- $tag := default .Chart.AppVersion .Values.boxd.image.tag }}
{{- if .Values.boxd.image.digest }}
{{- printf "%s@%s" .Values.boxd.image.repository .Values.boxd.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.boxd.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The Secret holding the boxd key: existingSecret, or the chart's own. */}}
{{- define "sandbox-bridge.boxdKeySecretName" -}}
{{- default (printf "%s-boxd-key" (include "sandbox-bridge.fullname" .)) .Values.boxd.existingSecret }}
{{- end }}

{{/* The Secret holding the tokens: the chart's own, or existingSecret. Fails with a clear
     message when none is set, so a release can never come up without a token. */}}
{{- define "sandbox-bridge.tokenSecretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else if or .Values.secret.token .Values.secret.tokens }}
{{- printf "%s-token" (include "sandbox-bridge.fullname" .) }}
{{- else }}
{{- fail "sandbox-bridge: a bearer token is required. Set secret.token (--set secret.token=$(openssl rand -hex 32)), secret.tokens (named tokens with scopes) or secret.existingSecret (the name of a Secret you created with key secret.tokenKey, default \"token\", and/or secret.tokensKey, default \"tokens.json\")." }}
{{- end }}
{{- end }}

{{- define "sandbox-bridge.trustProxy" -}}
{{- if .Values.trustProxy }}
{{- .Values.trustProxy }}
{{- else if .Values.ingress.enabled }}
{{- "1" }}
{{- else }}
{{- "false" }}
{{- end }}
{{- end }}

{{/* True when the cluster serves the prometheus-operator API (or `helm template --api-versions` says so). */}}
{{- define "sandbox-bridge.hasMonitoring" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/* The namespaces SandboxPools may use, comma-separated: rbac.targetNamespace first, then
     rbac.extraPoolNamespaces (with namespaced RBAC the operator has a Role in each and watches
     only these). `splitList ","` turns it back into a list. */}}
{{- define "sandbox-bridge.poolNamespaces" -}}
{{- prepend .Values.rbac.extraPoolNamespaces .Values.rbac.targetNamespace | uniq | join "," }}
{{- end }}

{{/* The Secret holding the snapshot env seal key: the chart's own, or objectStore.encryptionKey.existingSecret. */}}
{{- define "sandbox-bridge.snapshotKeySecretName" -}}
{{- default (printf "%s-snapshot-key" (include "sandbox-bridge.fullname" .)) .Values.objectStore.encryptionKey.existingSecret }}
{{- end }}

{{/* OBJECT_STORE_* settings, the same for the bridge and the operator. */}}
{{- define "sandbox-bridge.objectStoreEnv" -}}
{{- with .Values.objectStore }}
{{- if .bucket }}
- name: OBJECT_STORE_BUCKET
  value: {{ .bucket | quote }}
- name: OBJECT_STORE_ENDPOINT
  value: {{ .endpoint | quote }}
- name: OBJECT_STORE_REGION
  value: {{ .region | quote }}
- name: OBJECT_STORE_PREFIX
  value: {{ .prefix | quote }}
- name: OBJECT_STORE_FORCE_PATH_STYLE
  value: {{ .forcePathStyle | quote }}
{{- if .existingSecret }}
- name: OBJECT_STORE_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .accessKeyIdKey }}
- name: OBJECT_STORE_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .secretAccessKeyKey }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Egress gateway (egress-gateway-*.yaml, rbac-egress-gateway.yaml). */}}
{{- define "sandbox-bridge.egressGatewayName" -}}
{{- printf "%s-egress-gateway" (include "sandbox-bridge.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sandbox-bridge.egressGatewayServiceAccountName" -}}
{{- if .Values.egressGateway.serviceAccount.create }}
{{- default (include "sandbox-bridge.egressGatewayName" .) .Values.egressGateway.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.egressGateway.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sandbox-bridge.egressGatewayImage" -}}
{{- $image := .Values.egressGateway.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* The Secret holding the egress key file (proxy credentials): existingSecret, or the chart's own. */}}
{{- define "sandbox-bridge.egressKeySecretName" -}}
{{- default (printf "%s-egress-key" (include "sandbox-bridge.fullname" .)) .Values.egressGateway.existingSecret }}
{{- end }}

{{/* The Secret holding the key the gateway signs credential resolver calls with. */}}
{{- define "sandbox-bridge.egressResolverKeySecretName" -}}
{{- default (printf "%s-egress-resolver-key" (include "sandbox-bridge.fullname" .)) .Values.egressGateway.resolverKey.existingSecret }}
{{- end }}

{{/* Where the gateway, the bridge and the operator read the egress key file (EGRESS_KEY_FILE, -key-file). */}}
{{- define "sandbox-bridge.egressKeyFile" -}}
/var/run/secrets/sandbox-bridge-egress/key
{{- end }}

{{/* The egress key as a volume (one file, `key`), the same in every pod that mounts it. */}}
{{- define "sandbox-bridge.egressKeyVolume" -}}
- name: egress-key
  secret:
    secretName: {{ include "sandbox-bridge.egressKeySecretName" . }}
    defaultMode: 0440
    items:
      - key: {{ if .Values.egressGateway.existingSecret }}{{ .Values.egressGateway.secretKey }}{{ else }}key{{ end }}
        path: key
{{- end }}

{{- define "sandbox-bridge.egressKeyMount" -}}
- name: egress-key
  mountPath: /var/run/secrets/sandbox-bridge-egress
  readOnly: true
{{- end }}

{{/* A `helm upgrade` that changes egressGateway.key rolls the gateway, the bridge and the
     operator (each reads the key file at start). Empty for a generated key (it never changes)
     and for existingSecret (rotate it, then restart them: docs/chart.md). */}}
{{- define "sandbox-bridge.egressKeyChecksum" -}}
{{- if and .Values.egressGateway.enabled .Values.egressGateway.key (not .Values.egressGateway.existingSecret) }}
{{- include (print .Template.BasePath "/egress-key-secret.yaml") . | sha256sum }}
{{- end }}
{{- end }}

{{/* The Secret holding the key preview links are signed with: existingSecret, or the chart's own. */}}
{{- define "sandbox-bridge.previewKeySecretName" -}}
{{- default (printf "%s-preview-key" (include "sandbox-bridge.fullname" .)) .Values.ports.preview.existingSecret }}
{{- end }}
