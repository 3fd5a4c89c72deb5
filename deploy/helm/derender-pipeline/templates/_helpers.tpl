{{/* The objects' name prefix: the release name (`derender` gives derender-gateway, ...). */}}
{{- define "pipeline.prefix" -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "pipeline.secret" -}}
{{- .Values.apiKeySecret | default (printf "%s-pipeline" (include "pipeline.prefix" .)) -}}
{{- end -}}

{{/* Selector labels of one component (gateway | ingest | pipeline): the same as deploy/kubernetes. */}}
{{- define "pipeline.selectorLabels" -}}
app.kubernetes.io/name: derender-worker
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "pipeline.labels" -}}
{{ include "pipeline.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "pipeline.podSecurity" -}}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "pipeline.spread" -}}
topologySpreadConstraints:
  {{- range list "topology.kubernetes.io/zone" "kubernetes.io/hostname" }}
  - maxSkew: 1
    topologyKey: {{ . }}
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "pipeline.selectorLabels" $ | nindent 8 }}
  {{- end }}
{{- end -}}

{{- define "pipeline.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  capabilities:
    drop: ["ALL"]
{{- end -}}

{{- define "pipeline.dnsEgress" -}}
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .Values.networkPolicy.dns.namespace }}
      podSelector:
        matchLabels:
          {{- toYaml .Values.networkPolicy.dns.podLabels | nindent 10 }}
  ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- end -}}

{{- define "pipeline.kafkaEgress" -}}
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .Values.networkPolicy.kafka.namespace }}
  ports:
    - port: {{ .Values.networkPolicy.kafka.port }}
      protocol: TCP
{{- end -}}
