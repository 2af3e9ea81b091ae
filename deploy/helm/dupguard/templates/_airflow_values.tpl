{{/*
The values that add the dupguard sidecar to the official Apache Airflow chart, made from this chart's
values so that nothing in them is edited by hand: the image, the Secrets and keys the container
reads, the ConfigMap it reads, and a checksum of the settings (a change rolls the schedulers).
The {{ }} left in the output are for the Airflow chart: it passes these lists through `tpl`.
*/}}
{{- define "dupguard.airflowValues" -}}
{{- $name := include "dupguard.fullname" . -}}
{{- $secretName := include "dupguard.secretName" . -}}
# dupguard as a sidecar of the Airflow schedulers: values for the official Apache Airflow chart,
# rendered by the dupguard chart {{ .Chart.Version }} (release {{ .Release.Name }}) from its values. Do not edit: change
# the dupguard values and render again (docs/how-to/deploy-kubernetes.md, "Sidecar mode").
#
#   helm -n {{ .Release.Namespace }} upgrade {{ .Values.sidecar.airflowRelease }} apache-airflow/airflow --reuse-values -f this-file.yaml
#
# Helm replaces lists: if your Airflow values already set scheduler.extraContainers or
# scheduler.extraVolumes, merge instead (python deploy/helm/merge_values.py mine.yaml this-file.yaml).
scheduler:
  labels:
    # Which dupguard ConfigMap/Secret the sidecar reads (visible on the pods).
    dupguard-config: {{ $name }}
  podAnnotations:
    # A digest of dupguard's settings: a change of them changes the pod template, so the
    # schedulers roll and their sidecars read the new settings.
    checksum/dupguard-config: {{ include "dupguard.settingsChecksum" . }}
    {{- if .Values.metrics.prometheusAnnotations }}
    # Prometheus scrapes dupguard's /metrics on the scheduler pods.
    {{- include "dupguard.prometheusAnnotations" . | nindent 4 }}
    {{- end }}
  extraContainers:
    - name: dupguard
      image: {{ include "dupguard.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - run
      env:
        {{- if not (hasKey .Values.secretKeyRefs "DUPGUARD_DATABASE_URL") }}
        # The metadata DB URL from the Airflow chart's own Secret (its helper airflow_metadata_secret:
        # data.metadataSecretName or "<fullname>-metadata"), key "connection": Airflow's own user.
        # secretKeyRefs.DUPGUARD_DATABASE_URL gives dupguard a role of its own instead.
        - name: DUPGUARD_DATABASE_URL
          valueFrom:
            secretKeyRef:
              name: '{{ `{{ template "airflow_metadata_secret" . }}` }}'
              key: connection
        {{- end }}
        # With pgbouncer.enabled that URL goes through PgBouncer (pool_mode = transaction), where a
        # session advisory lock does not hold: the leader then takes a transaction-scoped lock.
        # Otherwise "auto" (a session lock only on a connection verified direct). dupguard needs
        # PostgreSQL: a MySQL metadata DB fails the render.
        - name: DUPGUARD_LOCK_MODE
          value: >-
            {{ `{{ if eq .Values.data.metadataConnection.protocol "mysql" }}{{ fail` }} `dupguard reads a
            PostgreSQL metadata database; data.metadataConnection.protocol is mysql` {{ `}}{{ end }}{{ ternary` }}
            "transaction" "auto" .Values.pgbouncer.enabled {{ `}}` }}
        - name: DUPGUARD_HTTP_PORT
          value: {{ .Values.http.port | quote }}
        # The ConfigMap this sidecar expects; a mismatch or absence is logged and exported as a metric.
        - name: DUPGUARD_CONFIG_EXPECTED
          value: configmap/{{ $name }}
        {{- with include "dupguard.secretRefEnv" . }}
        # Settings from the Secret keys named in secretKeyRefs / airflow.tokenSecret.
        {{- . | nindent 8 }}
        {{- end }}
        {{- with .Values.extraEnv }}
        # extraEnv of the dupguard values.
        {{- toYaml . | nindent 8 }}
        {{- end }}
      envFrom:
        # optional: a scheduler pod never waits for dupguard's own objects; without them
        # dupguard runs on defaults (dry-run) and says so (config_missing, a metric).
        - configMapRef:
            name: {{ $name }}
            optional: true
        {{- if .Values.existingSecret }}
        - secretRef:
            name: {{ .Values.existingSecret }}
        {{- else }}
        - secretRef:
            name: {{ $name }}
            optional: true
        {{- end }}
      ports:
        - name: dupguard-http
          containerPort: {{ .Values.http.port }}
          protocol: TCP
      # Liveness only. A readiness probe on a sidecar would mark the whole scheduler pod NotReady
      # whenever dupguard is, and the scheduler container itself has none. /livez never depends on
      # the database.
      livenessProbe:
        httpGet:
          path: /livez
          port: dupguard-http
        initialDelaySeconds: 10
        periodSeconds: 20
        timeoutSeconds: 5
        failureThreshold: 3
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: dupguard-tmp
          mountPath: /tmp
        {{- if .Values.airflow.caBundle.configMap }}
        - name: dupguard-airflow-ca
          mountPath: {{ include "dupguard.caBundleDir" . }}
          readOnly: true
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  extraVolumes:
    - name: dupguard-tmp
      emptyDir:
        medium: Memory
        sizeLimit: 16Mi
    {{- with .Values.airflow.caBundle.configMap }}
    - name: dupguard-airflow-ca
      configMap:
        name: {{ . }}
    {{- end }}
    {{- with .Values.extraVolumes }}
    # extraVolumes of the dupguard values: they join the scheduler pod's volumes.
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
