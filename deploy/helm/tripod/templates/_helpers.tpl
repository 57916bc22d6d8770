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

{{/* The workers' image: with gpu.enabled one built with the CUDA backend, which the chart
cannot know about unless told (the default image's workers refuse --backend cuda). */}}
{{- define "tripod.workerImage" -}}
{{- if .Values.gpu.enabled -}}
{{- if not .Values.gpu.image.repository -}}
{{- fail "gpu.enabled needs gpu.image.repository: an image built with the CUDA backend (deploy/Containerfile with --build-arg CUDA=ON, docs/deploy.md); the default image is a CPU build whose workers refuse --backend cuda" -}}
{{- end -}}
{{- printf "%s:%s" .Values.gpu.image.repository (.Values.gpu.image.tag | default .Chart.AppVersion) -}}
{{- else -}}
{{- include "tripod.image" . -}}
{{- end -}}
{{- end -}}

{{/* The worker roles this release runs (replicas, or an autoscaler), as JSON. */}}
{{- define "tripod.workerRoles" -}}
{{- $roles := list -}}
{{- range $role := list "prefill" "decode" "draft" -}}
{{- $w := index $.Values $role -}}
{{- if or (gt (int $w.replicas) 0) $w.autoscaling.enabled -}}
{{- $roles = append $roles $role -}}
{{- end -}}
{{- end -}}
{{- toJson $roles -}}
{{- end -}}

{{/* The data of a Secret already in the cluster, as JSON (base64 values), so that an upgrade
keeps the keys and certificates the chart generated; "{}" under `helm template` and lint, where
lookup sees no cluster. The argument: (list root name). */}}
{{- define "tripod.existingSecretData" -}}
{{- $root := index . 0 -}}
{{- $found := lookup "v1" "Secret" $root.Release.Namespace (index . 1) -}}
{{- dig "data" dict $found | toJson -}}
{{- end -}}

{{/* Whether the API takes keys: given, in an existing Secret, or generated (required). */}}
{{- define "tripod.apiKeysOn" -}}
{{- $a := .Values.apiKeys -}}
{{- if or $a.existingSecret $a.keys $a.required }}true{{ end -}}
{{- end -}}

{{/* What --model says: a catalogue name, or the file in the volume. */}}
{{- define "tripod.modelPath" -}}
{{- .Values.model.name | default (printf "/models/%s" .Values.model.file) -}}
{{- end -}}

{{/* Whether draft.model is a catalogue name (a path has a '/' or a .gguf ending). */}}
{{- define "tripod.draftIsName" -}}
{{- $d := .Values.draft.model -}}
{{- if and $d (not (contains "/" $d)) (not (hasSuffix ".gguf" $d)) }}true{{ end -}}
{{- end -}}

{{/* The environment that lets processes find catalogue names in the volume. */}}
{{- define "tripod.modelsEnv" -}}
{{- if or .Values.model.name (include "tripod.draftIsName" .) }}
- name: TRIPOD_MODELS_DIR
  value: /models
{{- end }}
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

{{/* The init container that fetches the model into the volume when it is missing: catalogue
names (the model's, a catalogue draft's) placed in /models, else the bundled model. */}}
{{- define "tripod.fetchModel" -}}
{{- if .Values.model.fetch }}
{{- $names := list }}
{{- if .Values.model.name }}
{{- $names = append $names .Values.model.name }}
{{- if include "tripod.draftIsName" . }}
{{- $names = append $names .Values.draft.model }}
{{- end }}
{{- end }}
initContainers:
  - name: fetch-model
    image: {{ include "tripod.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    {{- if $names }}
    command: {{ concat (list "/opt/tripod/scripts/fetch_model") $names (list "--into" "/models") | toJson }}
    {{- else }}
    command: ["/opt/tripod/scripts/fetch_model", "/models"]
    {{- end }}
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
{{- define "tripod.grpcTlsPrefix" -}}
{{- .Values.grpcTls.secretPrefix | default (printf "%s-tls" (include "tripod.fullname" .)) -}}
{{- end -}}
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
    secretName: {{ include "tripod.grpcTlsPrefix" $root }}-{{ index . 1 }}
{{- end }}
{{- end -}}

{{- define "tripod.scrapeAnnotations" -}}
{{- if not .root.Values.metrics.serviceMonitor.enabled }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}
