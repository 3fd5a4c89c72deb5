{{/* The objects' name: the release name when it already says derender-worker. */}}
{{- define "derender-worker.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "derender-worker.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/component: worker
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "derender-worker.labels" -}}
{{ include "derender-worker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* SASL mechanisms that authenticate with a username and password. */}}
{{- define "derender-worker.passwordSasl" -}}
{{- $m := .Values.security.saslMechanism | default "" | upper -}}
{{- if not (has $m (list "OAUTHBEARER" "AWS_MSK_IAM")) -}}true{{- end -}}
{{- end -}}

{{- define "derender-worker.maxReplicas" -}}
{{- .Values.keda.maxReplicaCount | default .Values.kafka.partitions -}}
{{- end -}}
