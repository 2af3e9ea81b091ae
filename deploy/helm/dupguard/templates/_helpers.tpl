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

{{/* The non-secret settings of the ConfigMap, keyed by environment variable name (JSON). */}}
{{- define "dupguard.settings" -}}
{{- $settings := dict
  "DUPGUARD_POLL_INTERVAL" (toString .Values.pollInterval)
  "DUPGUARD_LOG_LEVEL" .Values.log.level
  "DUPGUARD_LOG_FORMAT" .Values.log.format
  "DUPGUARD_LEDGER" .Values.ledger
  "DUPGUARD_REMEDIATION" .Values.remediation.mode
  "DUPGUARD_REMEDIATION_BACKEND" .Values.remediation.backend
  "DUPGUARD_REMEDIATE_STARTED" (toString .Values.remediation.remediateStarted)
}}
{{- /* Tells the sidecar which configuration it loaded (compared with DUPGUARD_CONFIG_EXPECTED). */}}
{{- $_ := set $settings "DUPGUARD_CONFIG_SOURCE" (printf "configmap/%s" (include "dupguard.fullname" .)) }}
{{- with .Values.database.lockMode }}{{ $_ := set $settings "DUPGUARD_LOCK_MODE" . }}{{ end }}
{{- if include "dupguard.apiSource" . }}
{{- $_ := set $settings "DUPGUARD_SOURCE" "api" }}
{{- /* The database source's 5ms would be 200 API requests a second: the api source has its own. */}}
{{- $_ := unset $settings "DUPGUARD_POLL_INTERVAL" }}
{{- with .Values.api.pollInterval }}{{ $_ := set $settings "DUPGUARD_POLL_INTERVAL" (toString .) }}{{ end }}
{{- if .Values.api.stateVolume.enabled }}
{{- $_ := set $settings "DUPGUARD_STATE_FILE" "/var/lib/dupguard/state.json" }}
{{- end }}
{{- end }}
{{- with .Values.clusterName }}{{ $_ := set $settings "DUPGUARD_CLUSTER_NAME" . }}{{ end }}
{{- with .Values.dags }}{{ $_ := set $settings "DUPGUARD_DAGS" . }}{{ end }}
{{- with .Values.excludeDags }}{{ $_ := set $settings "DUPGUARD_EXCLUDE_DAGS" . }}{{ end }}
{{- with .Values.airflow.apiUrl }}{{ $_ := set $settings "DUPGUARD_AIRFLOW_API_URL" . }}{{ end }}
{{- with .Values.airflow.uiUrl }}{{ $_ := set $settings "DUPGUARD_AIRFLOW_UI_URL" . }}{{ end }}
{{- with .Values.slack.channel }}{{ $_ := set $settings "DUPGUARD_SLACK_CHANNEL" . }}{{ end }}
{{- if .Values.airflow.caBundle.configMap }}
{{- $_ := set $settings "DUPGUARD_AIRFLOW_CA_BUNDLE" (printf "%s/%s" (include "dupguard.caBundleDir" .) .Values.airflow.caBundle.key) }}
{{- end }}
{{- /* Every other setting, by its environment variable name (the schema lists them, from SETTINGS). */}}
{{- range $env, $value := .Values.config | default dict }}
{{- $text := include "dupguard.settingText" $value }}
{{- if $text }}{{ $_ := set $settings $env $text }}{{ end }}
{{- end }}
{{- toJson $settings }}
{{- end }}

{{/* Where the container finds airflow.caBundle's ConfigMap (both modes mount it there). */}}
{{- define "dupguard.caBundleDir" -}}
/etc/dupguard/ca
{{- end }}

{{/*
One `config` value as the setting's text: a list joined by commas (dupguard reads a comma-separated
list), a whole number without the exponent Helm's float64 would print, true/false; "" when unset.
*/}}
{{- define "dupguard.settingText" -}}
{{- if kindIs "slice" . }}{{ join "," . }}
{{- else if kindIs "float64" . }}{{ if eq . (float64 (int64 .)) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "invalid" . }}
{{- else }}{{ toString . }}
{{- end }}
{{- end }}

{{/* Settings read with one secretKeyRef each (airflow.tokenSecret and secretKeyRefs): env name -> {name, key}. */}}
{{- define "dupguard.secretRefs" -}}
{{- $refs := dict }}
{{- with .Values.airflow.tokenSecret.name }}
{{- $_ := set $refs "DUPGUARD_AIRFLOW_TOKEN" (dict "name" . "key" $.Values.airflow.tokenSecret.key) }}
{{- end }}
{{- range $env, $ref := .Values.secretKeyRefs }}
{{- $_ := set $refs $env (dict "name" $ref.name "key" $ref.key) }}
{{- end }}
{{- toJson $refs }}
{{- end }}

{{/* The env entries of those secretKeyRefs (a YAML list, sorted by name). */}}
{{- define "dupguard.secretRefEnv" -}}
{{- range $env, $ref := include "dupguard.secretRefs" . | fromJson }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.name }}
      key: {{ $ref.key }}
{{- end }}
{{- end }}

{{/* The Airflow scheduler pods (official chart labels for sidecar.airflowRelease), for selectors. */}}
{{- define "dupguard.schedulerPodLabels" -}}
{{- $labels := dict "tier" "airflow" "component" "scheduler" "release" .Values.sidecar.airflowRelease }}
{{- toYaml (merge (deepCopy .Values.sidecar.schedulerPodLabels) $labels) }}
{{- end }}

{{/*
A digest of everything the dupguard container reads at start (settings, the chart's secret values,
the Secret keys it is pointed at): a pod annotation, so a change of any of them rolls the pods.
*/}}
{{- define "dupguard.settingsChecksum" -}}
{{- list (include "dupguard.settings" .) (include "dupguard.secretData" .) (include "dupguard.secretRefs" .) .Values.existingSecret | toJson | sha256sum }}
{{- end }}

{{/* The NOTES' lines of standalone mode (both sources): where to look, every command with -n. */}}
{{- define "dupguard.notesStandalone" -}}
{{- $name := include "dupguard.fullname" . -}}
Metrics: http://{{ $name }}.{{ .Release.Namespace }}:{{ .Values.service.port }}/metrics
Remediation: {{ .Values.remediation.mode }}.

  kubectl -n {{ .Release.Namespace }} rollout status deployment/{{ $name }}
  kubectl -n {{ .Release.Namespace }} logs deployment/{{ $name }}
  kubectl -n {{ .Release.Namespace }} exec deployment/{{ $name }} -- dupguard doctor
{{- end }}
