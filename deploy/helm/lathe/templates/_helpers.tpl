{{- define "lathe.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lathe.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "lathe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lathe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "lathe.labels" -}}
{{ include "lathe.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "lathe.apiKeysSecret" -}}
{{- default (printf "%s-api-keys" (include "lathe.fullname" .)) .Values.apiKeys.existingSecret -}}
{{- end -}}

{{- define "lathe.natsName" -}}
{{- printf "%s-nats" (include "lathe.fullname" .) | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{/* The chart's own NATS cluster runs when replication is on and no natsUrl is given. */}}
{{- define "lathe.natsBundled" -}}
{{- if and .Values.replication.enabled (not .Values.replication.natsUrl) -}}true{{- end -}}
{{- end -}}

{{/* replication.nats_url: the given URL, or every server of the chart's NATS by its stable name. */}}
{{- define "lathe.natsUrl" -}}
{{- if .Values.replication.natsUrl -}}
{{- .Values.replication.natsUrl -}}
{{- else -}}
{{- $name := include "lathe.natsName" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.replication.nats.replicas) -}}
{{- $urls = append $urls (printf "nats://%s-%d.%s-headless:4222" $name $i $name) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}
{{- end -}}

{{- define "lathe.natsSelectorLabels" -}}
app.kubernetes.io/name: nats
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: nats
{{- end -}}

{{- define "lathe.natsLabels" -}}
{{ include "lathe.natsSelectorLabels" . }}
app.kubernetes.io/part-of: {{ include "lathe.name" . }}
app.kubernetes.io/version: {{ .Values.replication.nats.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* nats.conf of the chart's NATS cluster (the same file as deploy/k8s/nats/nats.conf). */}}
{{- define "lathe.natsConf" -}}
{{- $name := include "lathe.natsName" . -}}
{{- $nats := .Values.replication.nats -}}
# Unique and stable per pod (JetStream's Raft peers are named by it): the StatefulSet pod name.
server_name: $POD_NAME
port: 4222
http_port: 8222
pid_file: /var/run/nats/nats.pid
# Document versions carry their text and a vector per sentence; Lathe splits larger ones into
# parts (replication.max_message_bytes, 0 = this value).
max_payload: {{ $nats.maxPayload }}
# preStop (nats-server --signal ldm): no new clients, the connected ones moved over 30 s.
lame_duck_grace_period: 10s
lame_duck_duration: 30s

jetstream {
  # The pod's PersistentVolumeClaim; NATS writes under jetstream/.
  store_dir: /data
  max_file_store: {{ $nats.persistence.maxFileStore }}
  # The write log is a file stream.
  max_memory_store: 0
}
{{- if gt (int $nats.replicas) 1 }}

cluster {
  name: {{ $name }}
  port: 6222
  # Clients keep the stable names they were given, not pod IPs.
  no_advertise: true
  routes: [
{{- range $i := until (int $nats.replicas) }}
    nats://{{ $name }}-{{ $i }}.{{ $name }}-headless:6222
{{- end }}
  ]
}
{{- end }}
{{- end -}}

{{/* The backup and restore Jobs: the Service's address, the API key, the CA (values.yaml, backup). */}}
{{- define "lathe.backupEnv" -}}
- name: LATHE_ADDR
  value: "{{ ternary "https" "http" .Values.tls.enabled }}://{{ include "lathe.fullname" . }}:{{ .Values.service.port }}"
{{- if .Values.backup.apiKeySecret.name }}
- name: LATHE_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.backup.apiKeySecret.name }}
      key: {{ .Values.backup.apiKeySecret.key }}
{{- end }}
{{- if .Values.backup.caSecret }}
- name: LATHE_CA_CERT
  value: /etc/lathe/ca/ca.crt
{{- end }}
{{- end -}}

{{- define "lathe.backupMounts" -}}
- name: backups
  mountPath: /backups
{{- if .Values.backup.caSecret }}
- name: ca
  mountPath: /etc/lathe/ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "lathe.backupVolumes" -}}
- name: backups
  persistentVolumeClaim:
    claimName: {{ include "lathe.fullname" . }}-backups
{{- if .Values.backup.caSecret }}
- name: ca
  secret:
    secretName: {{ .Values.backup.caSecret }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end -}}

{{/* Labels of the backup (or restore) objects: the chart's, with their own component. */}}
{{- define "lathe.backupLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "lathe.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $.Chart.Name $.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The pods' ServiceAccount (values.yaml, serviceAccount). */}}
{{- define "lathe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lathe.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* PromQL matchers for this release's series (values.yaml, metrics.prometheusRule.selector). */}}
{{- define "lathe.metricsSelector" -}}
{{- $default := printf "job=\"%s-metrics\",namespace=\"%s\"" (include "lathe.fullname" .) .Release.Namespace -}}
{{- default $default .Values.metrics.prometheusRule.selector -}}
{{- end -}}

{{- define "lathe.requireMetrics" -}}
{{- if not .Values.metrics.enabled -}}
{{- fail (printf "%s needs metrics.enabled: without it the pods serve no metrics" .What) -}}
{{- end -}}
{{- end -}}
