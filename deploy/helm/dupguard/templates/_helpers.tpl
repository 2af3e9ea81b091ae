{{/* Name of the chart, overridable. */}}
{{- define "dupguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name: the release name when it already contains the chart name, so that
`helm install dupguard ...` yields "dupguard", the name the sidecar overlay refers to.
*/}}
{{- define "dupguard.fullname" -}}
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

{{- define "dupguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dupguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dupguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dupguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: {{ .Values.mode }}
app.kubernetes.io/part-of: airflow
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "dupguard.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "dupguard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dupguard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "dupguard.standalone" -}}
{{- if and .Values.enabled (eq .Values.mode "standalone") }}true{{ end }}
{{- end }}

{{/* source api: dupguard reads Airflow's REST API only (no database Secret, one replica). */}}
{{- define "dupguard.apiSource" -}}
{{- if eq (default "database" .Values.source) "api" }}true{{ end }}
{{- end }}

{{/* Pods of the standalone Deployment: one for the api source (no shared lock to elect a leader). */}}
{{- define "dupguard.replicas" -}}
{{- if include "dupguard.apiSource" . }}1{{ else }}{{ .Values.replicas }}{{ end }}
{{- end }}

{{/* The secret values the chart stores itself, keyed by environment variable name. */}}
{{- define "dupguard.secretData" -}}
{{- $data := dict }}
{{- with .Values.database.lockDatabaseUrl }}{{ $_ := set $data "DUPGUARD_LOCK_DATABASE_URL" . }}{{ end }}
{{- with .Values.airflow.username }}{{ $_ := set $data "DUPGUARD_AIRFLOW_USERNAME" . }}{{ end }}
{{- with .Values.airflow.password }}{{ $_ := set $data "DUPGUARD_AIRFLOW_PASSWORD" . }}{{ end }}
{{- with .Values.airflow.token }}{{ $_ := set $data "DUPGUARD_AIRFLOW_TOKEN" . }}{{ end }}
{{- with .Values.airflow.tokenCommand }}{{ $_ := set $data "DUPGUARD_AIRFLOW_TOKEN_COMMAND" . }}{{ end }}
{{- with .Values.slack.botToken }}{{ $_ := set $data "DUPGUARD_SLACK_BOT_TOKEN" . }}{{ end }}
{{- with .Values.slack.webhookUrl }}{{ $_ := set $data "DUPGUARD_SLACK_WEBHOOK_URL" . }}{{ end }}
{{- with .Values.webhook.url }}{{ $_ := set $data "DUPGUARD_WEBHOOK_URL" . }}{{ end }}
{{- toJson $data }}
{{- end }}

{{/* Name of the Secret the container reads with envFrom, or "" when there is none. */}}
{{- define "dupguard.secretName" -}}
{{- if .Values.existingSecret }}
{{- .Values.existingSecret }}
{{- else if include "dupguard.secretData" . | fromJson }}
{{- include "dupguard.fullname" . }}
{{- end }}
{{- end }}

{{- define "dupguard.prometheusAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.http.port | quote }}
prometheus.io/path: /metrics
{{- end }}
