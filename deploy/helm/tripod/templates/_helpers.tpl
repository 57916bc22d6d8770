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
{{- /* Probes on the HTTP port; the argument: a dict with "scheme" (HTTP or HTTPS). */ -}}
{{- define "tripod.probes" -}}
readinessProbe:
  httpGet:
    path: /health
    port: http
    scheme: {{ .scheme }}
  periodSeconds: 5
  failureThreshold: 2
livenessProbe:
  httpGet:
    path: /metrics
    port: http
    scheme: {{ .scheme }}
  initialDelaySeconds: 30
  periodSeconds: 10
  failureThreshold: 6
startupProbe:
  httpGet:
    path: /metrics
    port: http
    scheme: {{ .scheme }}
  periodSeconds: 5
  failureThreshold: 60
{{- end -}}

{{- /* gRPC mutual TLS for one role: the flags, the mount and the volume ((list root role)). */ -}}
{{- define "tripod.grpcTlsArgs" -}}
{{- if (index . 0).Values.grpcTls.enabled }}
- --tls_ca=/etc/tripod/tls/ca.crt
- --tls_cert=/etc/tripod/tls/tls.crt
- --tls_key=/etc/tripod/tls/tls.key
{{- end }}
{{- end -}}
{{- define "tripod.grpcTlsMount" -}}
{{- if .Values.grpcTls.enabled }}
- name: grpc-tls
  mountPath: /etc/tripod/tls
  readOnly: true
{{- end }}
{{- end -}}
{{- define "tripod.grpcTlsVolume" -}}
{{- $root := index . 0 -}}
{{- if $root.Values.grpcTls.enabled }}
- name: grpc-tls
  secret:
    secretName: {{ $root.Values.grpcTls.secretPrefix | default (printf "%s-tls" (include "tripod.fullname" $root)) }}-{{ index . 1 }}
{{- end }}
{{- end -}}

{{- define "tripod.scrapeAnnotations" -}}
{{- if not .root.Values.metrics.serviceMonitor.enabled }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}
