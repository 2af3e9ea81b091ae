{{/*
What `dupguard check-config` would refuse, refused at render time instead: in sidecar
mode a refused configuration is a crash-looping container in every scheduler pod, and a scheduler
rollout that stalls. Each problem starts with the value to change, then check-config's own words
(detector/config/; tests/deploy/test_deploy_render_checks.py keeps the two in step). All problems
are reported at once, as check-config does. A few refusals are the chart's own (named "chart:").
*/}}

{{/* Python's repr of a short string, as check-config quotes values. */}}
{{- define "dupguard.repr" -}}
{{- if and (contains "'" .) (not (contains "\"" .)) }}{{ printf "%q" . }}{{ else }}'{{ . | replace "'" "\\'" }}'{{ end }}
{{- end }}

{{/* One choice setting (detector/settings.py choice): dict path env value allowed. */}}
{{- define "dupguard.checkChoice" -}}
{{- $value := toString .value }}
{{- if and $value (not (has ($value | trim | lower) .allowed)) }}
{{- $shown := include "dupguard.repr" $value }}
{{- printf "%s: %s: invalid value %s: %s is not one of %s" .path .env $shown $shown (join ", " .allowed) }}
{{- end }}
{{- end }}

{{/* One URL setting (detector/settings.py url): dict path env value secret. */}}
{{- define "dupguard.checkUrl" -}}
{{- $value := toString .value }}
{{- $why := "" }}
{{- if not $value }}
{{- else if not (or (hasPrefix "http://" $value) (hasPrefix "https://" $value)) }}
{{- $why = "must start with http:// or https://" }}
{{- else }}
{{- $netloc := regexReplaceAll "^https?://([^/?#]*).*$" $value "${1}" | splitList "@" | last }}
{{- $port := "" }}
{{- $host := $netloc }}
{{- if hasPrefix "[" $netloc }}
{{- $host = regexReplaceAll "^\\[([^\\]]*)\\].*$" $netloc "${1}" }}
{{- $port = regexReplaceAll "^\\[[^\\]]*\\]:?" $netloc "" }}
{{- if not (regexMatch "^\\[[^\\]]*\\](:.*)?$" $netloc) }}{{ $why = "has an invalid host or port" }}{{ end }}
{{- else if contains ":" $netloc }}
{{- $host = regexReplaceAll ":[^:]*$" $netloc "" }}
{{- $port = regexReplaceAll "^.*:" $netloc "" }}
{{- end }}
{{- if $why }}
{{- else if and $port (or (not (regexMatch "^[0-9]+$" $port)) (gt (atoi $port) 65535)) }}
{{- $why = "has an invalid host or port" }}
{{- else if not $host }}
{{- $why = "has no host" }}
{{- end }}
{{- end }}
{{- if and $why .secret }}
{{- /* check-config hides a secret's value and why; the chart adds why, never the value. */}}
{{- printf "%s: %s: invalid value (%s)" .path .env $why }}
{{- else if $why }}
{{- $shown := include "dupguard.repr" $value }}
{{- printf "%s: %s: invalid value %s: %s" .path .env $shown $why }}
{{- end }}
{{- end }}

{{/* One duration that must be above zero (detector/settings.py positive_duration). */}}
{{- define "dupguard.checkDuration" -}}
{{- $value := toString .value }}
{{- $raw := $value | trim | lower }}
{{- $shown := include "dupguard.repr" $value }}
{{- $why := "" }}
{{- if not $value }}
{{- else if regexMatch "^-([0-9]+\\.?[0-9]*|\\.[0-9]+)(e[+-]?[0-9]+)?$" $raw }}
{{- $why = printf "%s is not a duration (it must be zero or more)" $shown }}
{{- else if and (regexMatch "^[+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)(e[+-]?[0-9]+)?$" $raw) (gt (float64 $raw) 0.0) }}
{{- /* durations.py: a bare number could mean ms or s (`--poll-interval 10`: 10 s or 10 ms?). */}}
{{- $bare := printf "%g" (float64 $raw) }}
{{- $why = printf "%s has no unit: write %sms or %ss (or another unit: m, h, d)" $shown $bare $bare }}
{{- else if regexMatch "^[+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)(e[+-]?[0-9]+)?$" $raw }}
{{- $why = printf "%s must be greater than zero" $shown }}
{{- else if not (regexMatch "^([0-9]+(\\.[0-9]+)?(ms|s|m|h|d|w))+$" $raw) }}
{{- $why = printf "%s is not a duration (examples: 500ms, 90s, 15m, 1h30m, 1d)" $shown }}
{{- else }}
{{- $seconds := 0.0 }}
{{- $units := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 "w" 604800.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h|d|w)" $raw -1 }}
{{- $unit := regexReplaceAll "^[0-9.]+" . "" }}
{{- $seconds = addf $seconds (mulf (float64 (trimSuffix $unit .)) (get $units $unit)) }}
{{- end }}
{{- if gt $seconds 3153600000.0 }}
{{- $why = printf "%s is too long a duration (at most 36500d)" $shown }}
{{- else if le $seconds 0.0 }}
{{- $why = printf "%s must be greater than zero" $shown }}
{{- end }}
{{- end }}
{{- with $why }}{{ printf "%s: %s: invalid value %s: %s" $.path $.env $shown . }}{{ end }}
{{- end }}

{{/* Exactly one way to authenticate to Airflow's API (detector/config/cross_checks.py api_auth_problems): dict who has maybe. */}}
{{- define "dupguard.checkAuth" -}}
{{- $has := .has }}
{{- $ways := or $has.DUPGUARD_AIRFLOW_TOKEN $has.DUPGUARD_AIRFLOW_TOKEN_COMMAND (and $has.DUPGUARD_AIRFLOW_USERNAME $has.DUPGUARD_AIRFLOW_PASSWORD) }}
{{- if not $ways }}
{{- if not .maybe }}
{{- printf "airflow.token, airflow.tokenSecret, airflow.tokenCommand, or airflow.username and airflow.password (or secretKeyRefs): %s needs DUPGUARD_AIRFLOW_TOKEN, DUPGUARD_AIRFLOW_TOKEN_COMMAND, or DUPGUARD_AIRFLOW_USERNAME and DUPGUARD_AIRFLOW_PASSWORD" .who }}
{{- end }}
{{- else if and $has.DUPGUARD_AIRFLOW_TOKEN_COMMAND (or $has.DUPGUARD_AIRFLOW_TOKEN $has.DUPGUARD_AIRFLOW_PASSWORD) }}
{{- $other := ternary "DUPGUARD_AIRFLOW_TOKEN" "DUPGUARD_AIRFLOW_PASSWORD" (not (not $has.DUPGUARD_AIRFLOW_TOKEN)) }}
{{- printf "airflow.tokenCommand and %s: set DUPGUARD_AIRFLOW_TOKEN_COMMAND or %s, not both (which one would dupguard use?)" (ternary "airflow.token(Secret)" "airflow.password" (eq $other "DUPGUARD_AIRFLOW_TOKEN")) $other }}
{{- end }}
{{- end }}

{{/* Every problem of these values, as a JSON list (empty: dupguard would start). */}}
{{- define "dupguard.problems" -}}
{{- $v := .Values }}
{{- $p := list }}
{{- $api := include "dupguard.apiSource" . }}
{{- $checks := list
  (include "dupguard.checkChoice" (dict "path" "ledger" "env" "DUPGUARD_LEDGER" "value" $v.ledger "allowed" (list "auto" "on" "off")))
  (include "dupguard.checkChoice" (dict "path" "log.level" "env" "DUPGUARD_LOG_LEVEL" "value" $v.log.level "allowed" (list "debug" "info" "warning" "error")))
  (include "dupguard.checkChoice" (dict "path" "log.format" "env" "DUPGUARD_LOG_FORMAT" "value" $v.log.format "allowed" (list "auto" "json" "console")))
  (include "dupguard.checkChoice" (dict "path" "remediation.mode" "env" "DUPGUARD_REMEDIATION" "value" $v.remediation.mode "allowed" (list "off" "dry-run" "fail" "skip")))
  (include "dupguard.checkChoice" (dict "path" "remediation.backend" "env" "DUPGUARD_REMEDIATION_BACKEND" "value" $v.remediation.backend "allowed" (list "auto" "api" "db")))
  (include "dupguard.checkChoice" (dict "path" "database.lockMode" "env" "DUPGUARD_LOCK_MODE" "value" $v.database.lockMode "allowed" (list "auto" "session" "transaction")))
  (include "dupguard.checkUrl" (dict "path" "airflow.apiUrl" "env" "DUPGUARD_AIRFLOW_API_URL" "value" $v.airflow.apiUrl))
  (include "dupguard.checkUrl" (dict "path" "airflow.uiUrl" "env" "DUPGUARD_AIRFLOW_UI_URL" "value" $v.airflow.uiUrl))
  (include "dupguard.checkUrl" (dict "path" "slack.webhookUrl" "env" "DUPGUARD_SLACK_WEBHOOK_URL" "value" $v.slack.webhookUrl "secret" true))
  (include "dupguard.checkUrl" (dict "path" "webhook.url" "env" "DUPGUARD_WEBHOOK_URL" "value" $v.webhook.url "secret" true))
  (include "dupguard.checkDuration" (dict "path" "pollInterval" "env" "DUPGUARD_POLL_INTERVAL" "value" $v.pollInterval))
  (include "dupguard.checkDuration" (dict "path" "api.pollInterval" "env" "DUPGUARD_POLL_INTERVAL" "value" $v.api.pollInterval))
}}
{{- if gt (int $v.http.port) 65535 }}
{{- $checks = append $checks (printf "http.port: DUPGUARD_HTTP_PORT: invalid value '%d': %d is not a TCP port" (int $v.http.port) (int $v.http.port)) }}
{{- end }}
{{- /* Which secret settings the chart knows to be set; existingSecret may hold any of them. */}}
{{- $refs := include "dupguard.secretRefs" . | fromJson }}
{{- $inline := include "dupguard.secretData" . | fromJson }}
{{- $has := dict }}
{{- range $env, $_ := merge (deepCopy $inline) $refs }}{{ $_ := set $has $env true }}{{ end }}
{{- $maybe := not (not $v.existingSecret) }}
{{- /* The api backend for sure: api, or auto with the API source (auto on the database picks at start). */}}
{{- $fail := and (has $v.remediation.mode (list "fail" "skip")) (or (eq $v.remediation.backend "api") (and (eq $v.remediation.backend "auto") $api)) }}
{{- if $api }}
{{- if and (not $v.airflow.apiUrl) (not $fail) }}
{{- $checks = append $checks "airflow.apiUrl: DUPGUARD_SOURCE=api needs DUPGUARD_AIRFLOW_API_URL" }}
{{- end }}
{{- if not $fail }}
{{- $checks = append $checks (include "dupguard.checkAuth" (dict "who" "DUPGUARD_SOURCE=api" "has" $has "maybe" $maybe)) }}
{{- end }}
{{- if eq $v.remediation.backend "db" }}
{{- $checks = append $checks "remediation.backend: DUPGUARD_REMEDIATION_BACKEND=db writes to the metadata database, which DUPGUARD_SOURCE=api does not use: use DUPGUARD_REMEDIATION_BACKEND=api" }}
{{- end }}
{{- end }}
{{- if $fail }}
{{- if not $v.airflow.apiUrl }}
{{- $checks = append $checks (printf "remediation.mode=%s, airflow.apiUrl: DUPGUARD_REMEDIATION=fail/skip with the api backend needs DUPGUARD_AIRFLOW_API_URL" $v.remediation.mode) }}
{{- end }}
{{- $checks = append $checks (include "dupguard.checkAuth" (dict "who" "the api backend" "has" $has "maybe" $maybe)) }}
{{- end }}
{{- if and $has.DUPGUARD_SLACK_BOT_TOKEN (not $v.slack.channel) }}
{{- $checks = append $checks "slack.channel: DUPGUARD_SLACK_BOT_TOKEN needs DUPGUARD_SLACK_CHANNEL" }}
{{- end }}
{{- /* The chart's own refusals: values it would otherwise ignore or have to choose between. */}}
{{- if and $api (ne $v.mode "standalone") }}
{{- $checks = append $checks "chart: source: api runs dupguard as its own Deployment: set mode: standalone (a sidecar would sit next to a database it may not read)" }}
{{- end }}
{{- if and (eq $v.mode "sidecar") $v.database.lockMode }}
{{- $checks = append $checks "chart: database.lockMode: in sidecar mode the Airflow values set DUPGUARD_LOCK_MODE from the Airflow chart's pgbouncer.enabled; leave it empty (docs/how-to/deploy-kubernetes.md, PgBouncer)" }}
{{- end }}
{{- if and $v.airflow.token $v.airflow.tokenSecret.name }}
{{- $checks = append $checks "chart: airflow.token and airflow.tokenSecret both set: keep one" }}
{{- end }}
{{- range $env, $_ := $v.secretKeyRefs }}
{{- if or (hasKey $inline $env) (and (eq $env "DUPGUARD_AIRFLOW_TOKEN") $v.airflow.tokenSecret.name) }}
{{- $checks = append $checks (printf "chart: secretKeyRefs.%s and the inline value (or airflow.tokenSecret) of the same setting both set: keep one" $env) }}
{{- end }}
{{- end }}
{{- range $env, $_ := $v.secretKeyRefs }}
{{- if hasKey ($v.config | default dict) $env }}
{{- $checks = append $checks (printf "chart: config.%s and secretKeyRefs.%s both set: keep one" $env $env) }}
{{- end }}
{{- end }}
{{- if and $api (hasKey $v.secretKeyRefs "DUPGUARD_DATABASE_URL") }}
{{- $checks = append $checks "chart: secretKeyRefs.DUPGUARD_DATABASE_URL: source: api reads no database; remove it" }}
{{- end }}
{{- if and $inline $v.existingSecret }}
{{- $checks = append $checks "chart: existingSecret is set: leave the inline secret values (database.lockDatabaseUrl, airflow.username/password/token/tokenCommand, slack.botToken/webhookUrl, webhook.url) empty and put them into that Secret (or use secretKeyRefs)" }}
{{- end }}
{{- range $checks }}{{ if . }}{{ $p = append $p . }}{{ end }}{{ end }}
{{- toJson $p }}
{{- end }}

{{/* Fails the render listing every problem; called once, by configmap.yaml. */}}
{{- define "dupguard.validate" -}}
{{- $problems := include "dupguard.problems" . | fromJsonArray }}
{{- if $problems }}
{{- fail (printf "dupguard would refuse to start (what `dupguard check-config` refuses; docs/how-to/deploy-kubernetes.md, \"What the render refuses\"):\n- %s" (join "\n- " $problems)) }}
{{- end }}
{{- end }}
