{{/* Names, labels and the gateway config shared by the templates. */}}

{{- define "oip-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "oip-gateway.fullname" -}}
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

{{- define "oip-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "oip-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "oip-gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "oip-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: gateway
app.kubernetes.io/part-of: oip-gateway
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The headless Service through which replicas find each other (peers.enabled). */}}
{{- define "oip-gateway.peersName" -}}
{{- printf "%s-peers" (include "oip-gateway.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "oip-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "oip-gateway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "oip-gateway.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Where the chart mounts things in the container. */}}
{{- define "oip-gateway.configDir" -}}/etc/oip-gateway{{- end }}
{{- define "oip-gateway.configPath" -}}/etc/oip-gateway/config.yaml{{- end }}
{{- define "oip-gateway.tlsDir" -}}/etc/oip-gateway/tls{{- end }}

{{/* "true" when the values give neither backends nor routes: the chart's placeholder backend. */}}
{{- define "oip-gateway.placeholder" -}}
{{- and (empty .Values.config.backends) (empty .Values.config.routes) }}
{{- end }}

{{/*
The gateway's config file: .Values.config less the chart's own `reload` key, plus the keys
the chart owns (listen, drain_s, workers; with peers.enabled listen.peers and, unless
config.peers is given, peers). Cross-key problems values.schema.json cannot express fail
here, each naming the value (`helm lint` only logs a template's fail).
*/}}
{{- define "oip-gateway.config" -}}
{{- $cfg := omit .Values.config "reload" }}
{{- if eq (include "oip-gateway.placeholder" .) "true" }}
{{- $triton := dict "protocol" "grpc" "endpoints" (list (dict "dns" (printf "triton-headless.%s.svc.cluster.local:8001" .Release.Namespace))) }}
{{- $_ := set $cfg "backends" (dict "triton" $triton) }}
{{- $_ := set $cfg "routes" (list (dict "model" "*" "backend" "triton")) }}
{{- else if empty .Values.config.backends }}
{{- fail "config.backends: required with config.routes (named sets of endpoints, docs/config.md)" }}
{{- else if empty .Values.config.routes }}
{{- fail "config.routes: required with config.backends (a list of {model, backend[, version]}, docs/config.md)" }}
{{- end }}
{{- $listen := dict "http" "0.0.0.0:8000" "grpc" "0.0.0.0:8001" "metrics" "0.0.0.0:8002" }}
{{- if .Values.tls.enabled }}
{{- if not .Values.tls.secretName }}
{{- fail "tls.secretName: required when tls.enabled is true (a Secret of type kubernetes.io/tls)" }}
{{- end }}
{{- $tls := dict "cert" (printf "%s/tls.crt" (include "oip-gateway.tlsDir" .)) "key" (printf "%s/tls.key" (include "oip-gateway.tlsDir" .)) }}
{{- if .Values.tls.clientCA }}
{{- $_ := set $tls "client_ca" (printf "%s/ca.crt" (include "oip-gateway.tlsDir" .)) }}
{{- end }}
{{- $_ := set $listen "tls" $tls }}
{{- else if .Values.tls.clientCA }}
{{- fail "tls.clientCA: needs tls.enabled (client certificates are part of the listeners' TLS)" }}
{{- end }}
{{- /* peers: the replicas of a placement backend coordinate through the headless Service */}}
{{- if .Values.peers.enabled }}
{{- $_ := set $listen "peers" (printf "0.0.0.0:%d" (int .Values.peers.port)) }}
{{- if empty .Values.config.peers }}
{{- $_ := set $cfg "peers" (list (dict "dns" (printf "%s.%s.svc.cluster.local:%d" (include "oip-gateway.peersName" .) .Release.Namespace (int .Values.peers.port)))) }}
{{- end }}
{{- else if hasKey .Values.config "peers" }}
{{- fail "config.peers: needs peers.enabled (the chart then opens listen.peers on every pod and renders the headless Service)" }}
{{- else }}
{{- $several := or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) }}
{{- range $name, $b := $cfg.backends }}
{{- if and $several (hasKey $b "placement") }}
{{- fail (printf "config.backends.%s.placement: needs peers.enabled when more than one pod may run (autoscaling.enabled, or replicaCount > 1): each pod would otherwise decide alone and an endpoint could go over its capacity (docs/placement.md)" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- $_ := set $cfg "listen" $listen }}
{{- $_ := set $cfg "drain_s" .Values.drainSeconds }}
{{- $_ := set $cfg "workers" .Values.workers }}
{{- /* routes[i].backend, each split side and a mirror must name a backend */}}
{{- range $i, $r := $cfg.routes }}
{{- $named := list }}
{{- if hasKey $r "backend" }}{{ $named = append $named (dict "where" "backend" "name" $r.backend) }}{{ end }}
{{- range $j, $side := ($r.split | default list) }}{{ $named = append $named (dict "where" (printf "split[%d].backend" $j) "name" $side.backend) }}{{ end }}
{{- if $r.mirror }}{{ $named = append $named (dict "where" "mirror.backend" "name" $r.mirror.backend) }}{{ end }}
{{- range $named }}
{{- if not (hasKey $cfg.backends (toString .name)) }}
{{- fail (printf "config.routes[%d].%s: no backend named %q (config.backends has: %s)" $i .where (toString .name) (keys $cfg.backends | sortAlpha | join ", ")) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* check_headers {env: VAR}: the variable must be set in the pod, or the gateway refuses the config */}}
{{- $envNames := list }}
{{- range .Values.extraEnv }}{{ $envNames = append $envNames .name }}{{ end }}
{{- range $name, $b := $cfg.backends }}
{{- range $header, $spec := ($b.check_headers | default dict) }}
{{- if and (hasKey $spec "env") (not (has $spec.env $envNames)) (not $.Values.extraEnvFrom) }}
{{- fail (printf "config.backends.%s.check_headers.%s: environment variable %s is not set by extraEnv (add it, e.g. from a Secret with valueFrom.secretKeyRef)" $name $header $spec.env) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* auth.keys[].key {env: VAR}: the same (an API key from a Secret through extraEnv) */}}
{{- range $i, $k := (($cfg.auth | default dict).keys | default list) }}
{{- if and (kindIs "map" $k.key) (hasKey $k.key "env") (not (has $k.key.env $envNames)) (not $.Values.extraEnvFrom) }}
{{- fail (printf "config.auth.keys[%d].key: environment variable %s is not set by extraEnv (add it, e.g. from a Secret with valueFrom.secretKeyRef)" $i $k.key.env) }}
{{- end }}
{{- end }}
{{- if and (gt (float64 .Values.drainSeconds) 0.0) (lt (float64 .Values.drainSeconds) (float64 .Values.readinessProbe.periodSeconds)) }}
{{- fail (printf "drainSeconds: %v is shorter than readinessProbe.periodSeconds (%v); the pod would stop before a probe saw it draining" .Values.drainSeconds .Values.readinessProbe.periodSeconds) }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
The part of the config a reload cannot change (docs/config.md "Hot reload": listen, workers and
max_message_bytes need a restart), and `peers`, which goes with listen.peers. With
config.reload=watch its checksum in the pod template rolls the pods when it changes; everything
else reloads in place.
*/}}
{{- define "oip-gateway.restartConfig" -}}
{{- $cfg := include "oip-gateway.config" . | fromYaml }}
{{- pick $cfg "listen" "workers" "max_message_bytes" "peers" | toYaml }}
{{- end }}

{{/* Seconds between SIGTERM (after preStop) and SIGKILL that the gateway can use up. */}}
{{- define "oip-gateway.terminationGracePeriodSeconds" -}}
{{- add (int (ceil .Values.preStopSleepSeconds)) (int (ceil .Values.drainSeconds)) (int .Values.shutdownGraceSeconds) }}
{{- end }}

{{/* The probes' handler: HTTP(S) on the HTTP port, or a TCP connect under mutual TLS. */}}
{{- define "oip-gateway.probeHandler" -}}
{{- $root := index . 0 }}
{{- $path := index . 1 }}
{{- if and $root.Values.tls.enabled $root.Values.tls.clientCA }}
tcpSocket:
  port: http
{{- else }}
httpGet:
  path: {{ $path }}
  port: http
  scheme: {{ ternary "HTTPS" "HTTP" (and $root.Values.tls.enabled true) }}
{{- end }}
{{- end }}
