{{/*
Named templates shared by the chart's manifests: names, labels, the image, the Secret's name and the list of
shard gRPC URLs the gateways are given.
*/}}

{{/* The chart name, overridable with nameOverride. */}}
{{- define "ahp-relay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-qualified name every object is prefixed with (63 characters at most). */}}
{{- define "ahp-relay.fullname" -}}
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

{{/* chart-version label value. */}}
{{- define "ahp-relay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "ahp-relay.labels" -}}
helm.sh/chart: {{ include "ahp-relay.chart" . }}
{{ include "ahp-relay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels selectors match on (each object adds app.kubernetes.io/component). */}}
{{- define "ahp-relay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ahp-relay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The container image. */}}
{{- define "ahp-relay.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The runners' image (the Dockerfile's `runner` target). */}}
{{- define "ahp-relay.runnerImage" -}}
{{- printf "%s:%s" .Values.runner.image.repository (default .Chart.AppVersion .Values.runner.image.tag) }}
{{- end }}

{{/* The Secret holding jwt-secret, database-url and redis-url: existingSecret or the chart's own. */}}
{{- define "ahp-relay.secretName" -}}
{{- default (include "ahp-relay.fullname" .) .Values.existingSecret }}
{{- end }}

{{/* The shards' headless Service, which gives each shard pod a stable DNS name. */}}
{{- define "ahp-relay.shardServiceName" -}}
{{- printf "%s-shard" (include "ahp-relay.fullname" .) }}
{{- end }}

{{/* Comma-separated gRPC URLs of every shard pod, for the gateways' AHP_RELAY_SHARD_URL. */}}
{{- define "ahp-relay.shardUrls" -}}
{{- $service := include "ahp-relay.shardServiceName" . }}
{{- $urls := list }}
{{- range $i := until (int .Values.shard.replicas) }}
{{- $urls = append $urls (printf "%s://%s-%d.%s.%s.svc:%v" (include "ahp-relay.grpcScheme" $) $service $i $service $.Release.Namespace $.Values.shard.grpcPort) }}
{{- end }}
{{- join "," $urls }}
{{- end }}

{{/* The shards' gRPC scheme: https with internal TLS. */}}
{{- define "ahp-relay.grpcScheme" -}}
{{- if .Values.internalTls.secretName }}https{{ else }}http{{ end }}
{{- end }}
