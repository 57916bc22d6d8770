{{/* Names, labels and the pieces every Deployment shares. */}}

{{- define "tripod.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tripod.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one role: include "tripod.selector" (list . "decode") */}}
{{- define "tripod.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "tripod.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "tripod.modelPath" -}}
{{- printf "/models/%s" .Values.model.file -}}
{{- end -}}

{{- define "tripod.modelVolume" -}}
- name: model
{{- if .Values.model.hostPath }}
  hostPath:
    path: {{ .Values.model.hostPath }}
    type: DirectoryOrCreate
{{- else }}
  persistentVolumeClaim:
    claimName: {{ .Values.model.persistentVolumeClaim.existingClaim | default (printf "%s-model" (include "tripod.fullname" .)) }}
{{- end }}
{{- end -}}

{{/* The init container that fetches the model into the volume when it is missing. */}}
{{- define "tripod.fetchModel" -}}
{{- if .Values.model.fetch }}
initContainers:
  - name: fetch-model
    image: {{ include "tripod.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: ["/opt/tripod/scripts/fetch_model", "/models"]
    volumeMounts:
      - name: model
        mountPath: /models
{{- end }}
{{- end -}}

{{/* Probes on the process's HTTP port: readiness on /health (503 while draining, so a
draining pod leaves the Service), liveness on /metrics (200 while the process lives). */}}
{{- define "tripod.probes" -}}
readinessProbe:
  httpGet:
    path: /health
    port: http
  periodSeconds: 5
  failureThreshold: 2
livenessProbe:
  httpGet:
    path: /metrics
    port: http
  initialDelaySeconds: 30
  periodSeconds: 10
  failureThreshold: 6
startupProbe:
  httpGet:
    path: /metrics
    port: http
  periodSeconds: 5
  failureThreshold: 60
{{- end -}}

{{- define "tripod.scrapeAnnotations" -}}
{{- if not .root.Values.metrics.serviceMonitor.enabled }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}
