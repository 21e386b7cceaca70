{{/* Names: the release's name when it contains the chart's (helm install prefixlb ...). */}}
{{- define "prefixlb.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "prefixlb.fullname" -}}
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

{{- define "prefixlb.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prefixlb.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "prefixlb.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "prefixlb.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "prefixlb.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end }}

{{/* The headless Service the replicas find each other by, and the Secret they share. */}}
{{- define "prefixlb.peersService" -}}
{{- printf "%s-peers" (include "prefixlb.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "prefixlb.peeringSecret" -}}
{{- .Values.peering.existingSecret | default (printf "%s-peering" (include "prefixlb.fullname" .)) }}
{{- end }}

{{/* The model servers' headless Service: the one named, or the one the chart creates. */}}
{{- define "prefixlb.modelServersService" -}}
{{- .Values.modelServers.service | default (printf "%s-model-servers" (include "prefixlb.fullname" .) | trunc 63 | trimSuffix "-") }}
{{- end }}

{{- define "prefixlb.discovers" -}}
{{- if or .Values.modelServers.service .Values.modelServers.podLabels .Values.simulator.enabled }}true{{ end }}
{{- end }}

{{/* The labels of the model-server pods the chart's headless Service selects. */}}
{{- define "prefixlb.modelServerPodLabels" -}}
{{- if .Values.simulator.enabled }}
{{- include "prefixlb.simulatorLabels" . }}
{{- else }}
{{- toYaml .Values.modelServers.podLabels }}
{{- end }}
{{- end }}

{{- define "prefixlb.simulatorLabels" -}}
app.kubernetes.io/name: {{ include "prefixlb.name" . }}-sim
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Paths inside the container. */}}
{{- define "prefixlb.configDir" -}}/etc/prefixlb{{- end }}
{{- define "prefixlb.secretDir" -}}/etc/prefixlb-peering{{- end }}

{{/*
The pod's terminationGracePeriodSeconds: the preStop sleep, then timeouts.shutdown_grace for
the streams in flight, then 5 s for the aborted ones to unwind and the peers to be told.
*/}}
{{- define "prefixlb.terminationGrace" -}}
{{- add (int .Values.preStopSleepSeconds) (int .Values.shutdownGraceSeconds) 5 }}
{{- end }}

{{/*
prefixlb's config file: .Values.config with the fields the chart owns set from its own keys.
Fails, naming the key to use instead, when config sets one of them.
*/}}
{{- define "prefixlb.config" -}}
{{- $v := .Values }}
{{- $cfg := deepCopy ($v.config | default dict) }}
{{- range $field, $key := dict "listen" "ports.http" "admin_listen" "ports.admin" "backends" "backends" "discovery" "modelServers" "peering" "peering" }}
{{- if hasKey $cfg $field }}
{{- fail (printf "config.%s is set by the chart: use the value %s instead" $field $key) }}
{{- end }}
{{- end }}
{{- $timeouts := deepCopy (get $cfg "timeouts" | default dict) }}
{{- if hasKey $timeouts "shutdown_grace" }}
{{- fail "config.timeouts.shutdown_grace is set by the chart: use the value shutdownGraceSeconds instead (the pod's termination grace period follows it)" }}
{{- end }}
{{- $_ := set $timeouts "shutdown_grace" (printf "%ds" (int $v.shutdownGraceSeconds)) }}
{{- $_ = set $cfg "timeouts" $timeouts }}
{{- $_ = set $cfg "listen" (printf "0.0.0.0:%d" (int $v.ports.http)) }}
{{- $_ = set $cfg "admin_listen" (printf "0.0.0.0:%d" (int $v.ports.admin)) }}
{{- if and (not (include "prefixlb.discovers" .)) (not $v.backends) }}
{{- fail "prefixlb needs its model servers: set modelServers.podLabels to their pods' labels (e.g. --set modelServers.podLabels.app=vllm), modelServers.service to their headless Service, or backends[].url" }}
{{- end }}
{{- if and $v.modelServers.service $v.modelServers.podLabels }}
{{- fail "modelServers: set podLabels (the chart creates the headless Service) or service (yours), not both" }}
{{- end }}
{{- if and $v.simulator.enabled (or $v.modelServers.service $v.modelServers.podLabels $v.backends) }}
{{- fail "simulator.enabled: prefixlb routes to the simulated model servers; leave modelServers and backends unset" }}
{{- end }}
{{- if $v.backends }}
{{- $_ = set $cfg "backends" $v.backends }}
{{- end }}
{{- if include "prefixlb.discovers" . }}
{{- $ms := $v.modelServers }}
{{- $ns := .Release.Namespace }}
{{- if $ms.service }}
{{- $ns = $ms.namespace | default .Release.Namespace }}
{{- else if $ms.namespace }}
{{- fail "modelServers.namespace: only with modelServers.service (the chart makes its headless Service for podLabels in the release's namespace)" }}
{{- end }}
{{- $dns := dict "name" (printf "%s.%s.svc.%s" (include "prefixlb.modelServersService" .) $ns $v.clusterDomain) "port" (int $ms.port) "scheme" $ms.scheme "interval" $ms.interval }}
{{- if $ms.kvCacheTokens }}
{{- $_ = set $dns "kv_cache_tokens" (int64 $ms.kvCacheTokens) }}
{{- end }}
{{- $_ = set $cfg "discovery" (dict "dns" $dns) }}
{{- end }}
{{- if $v.peering.enabled }}
{{- $p := dict "listen" (printf ":%d" (int $v.peering.port)) "dns" (printf "%s.%s.svc.%s" (include "prefixlb.peersService" .) .Release.Namespace $v.clusterDomain) "secret_file" (printf "%s/secret" (include "prefixlb.secretDir" .)) }}
{{- if $v.peering.settleWait }}
{{- $_ = set $p "settle_wait" $v.peering.settleWait }}
{{- end }}
{{- $_ = set $cfg "peering" $p }}
{{- end }}
{{- if $v.tracing.enabled }}
{{- $t := dict "enabled" true "sample_ratio" $v.tracing.sampleRatio }}
{{- if $v.tracing.endpoint }}
{{- $_ = set $t "endpoint" $v.tracing.endpoint }}
{{- end }}
{{- $_ = set $cfg "tracing" $t }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

