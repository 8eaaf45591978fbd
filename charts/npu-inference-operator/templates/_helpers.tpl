{{/* Names, labels and the small decisions several templates share. */}}

{{- define "npu-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-<chart>, or the release name alone when it already contains the chart name. */}}
{{- define "npu-operator.fullname" -}}
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

{{- define "npu-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of the operator's pods: also the Deployment's selector, so never change them. */}}
{{- define "npu-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "npu-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "npu-operator.labels" -}}
helm.sh/chart: {{ include "npu-operator.chart" . }}
{{ include "npu-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: npu-inference-operator
{{- end }}

{{/* Labels for objects that are not the operator itself (CRDs, monitoring). */}}
{{- define "npu-operator.commonLabels" -}}
helm.sh/chart: {{ include "npu-operator.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: npu-inference-operator
{{- end }}

{{- define "npu-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "npu-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "npu-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "npu-operator.runtimeImage" -}}
{{- printf "%s:%s" .Values.operator.runtimeImage.repository (default .Chart.AppVersion .Values.operator.runtimeImage.tag) }}
{{- end }}

{{/* true when the operator watches the whole cluster. Also checks the values that fit together. */}}
{{- define "npu-operator.clusterWide" -}}
{{- if eq .Values.watch.scope "cluster" }}
{{- if .Values.watch.namespaces }}
{{- fail "watch.namespaces is set but watch.scope is \"cluster\": set watch.scope to \"namespaced\" to watch only those namespaces, or empty watch.namespaces" }}
{{- end }}
{{- "true" }}
{{- end }}
{{- end }}

{{/* The watched namespaces with scope namespaced, as JSON (read with fromJsonArray). */}}
{{- define "npu-operator.watchNamespaces" -}}
{{- if .Values.watch.namespaces }}
{{- .Values.watch.namespaces | uniq | toJson }}
{{- else }}
{{- list .Release.Namespace | toJson }}
{{- end }}
{{- end }}

{{/* Values that cannot be checked by the schema alone. */}}
{{- define "npu-operator.checks" -}}
{{- if and .Values.operator.standalone (gt (int .Values.replicaCount) 1) }}
{{- fail "replicaCount > 1 needs kopf peering: set operator.standalone to false (replicas would otherwise handle the same resources at once)" }}
{{- end }}
{{- if eq (int .Values.operator.healthPort) (int .Values.operator.metricsPort) }}
{{- fail "operator.healthPort and operator.metricsPort must differ" }}
{{- end }}
{{- end }}

{{/* The helm.sh/resource-policy annotation for CRDs, when crds.keep. */}}
{{- define "npu-operator.crdAnnotations" -}}
{{- if .Values.crds.keep }}
helm.sh/resource-policy: keep
{{- end }}
{{- end }}
