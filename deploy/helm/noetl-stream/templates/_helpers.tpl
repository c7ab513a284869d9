{{/* Names -------------------------------------------------------------------------------------- */}}

{{- define "noetl-stream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "noetl-stream.fullname" -}}
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

{{- define "noetl-stream.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Deployment (and autoscaler, PDB) name of a pool: (dict "root" $ "pool" "gpu") */}}
{{/*
A component's name: the full name cut so that "<name>-<suffix>" stays within `max` characters (63, the
limit of a Service name; 52 for a CronJob, whose Jobs add 11).
Usage: include "noetl-stream.componentName" (dict "root" $ "suffix" "controller")
*/}}
{{- define "noetl-stream.componentName" -}}
{{- $max := .max | default 63 -}}
{{- $base := include "noetl-stream.fullname" .root | trunc (int (sub $max (add1 (len .suffix)))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base .suffix -}}
{{- end }}

{{- define "noetl-stream.workerName" -}}
{{- printf "%s-worker-%s" (include "noetl-stream.fullname" .root) .pool | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "noetl-stream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "noetl-stream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "noetl-stream.labels" -}}
helm.sh/chart: {{ include "noetl-stream.chart" . }}
{{ include "noetl-stream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: noetl-stream
{{- end }}

{{- define "noetl-stream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "noetl-stream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "noetl-stream.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* JetStream names, as noetl_stream/protocol/subjects.py builds them */}}
{{- define "noetl-stream.commandsStream" -}}
{{- printf "%s_COMMANDS" (upper .Values.prefix) }}
{{- end }}

{{- define "noetl-stream.poolNames" -}}
{{- range .Values.pools }}{{ .name }} {{ end }}
{{- end }}

{{/*
A pool's settings: workerDefaults overridden by the pool's entry. Returns YAML. `pdb` and `autoscaling`
merge key by key (a pool may set only autoscaling.keda.enabled); a pool's resources, nodeSelector,
affinity, tolerations and topologySpreadConstraints replace the defaults' as a whole (merged, a pool's
memory request could meet the defaults' lower limit, or its nodeSelector keep the defaults' labels).
*/}}
{{- define "noetl-stream.pool" -}}
{{- $entry := .pool }}
{{- $pool := mergeOverwrite (deepCopy .root.Values.workerDefaults) (deepCopy $entry) }}
{{- range $key := list "resources" "nodeSelector" "affinity" "tolerations" "topologySpreadConstraints" }}
{{- if hasKey $entry $key }}
{{- $_ := set $pool $key (deepCopy (get $entry $key)) }}
{{- end }}
{{- end }}
{{- toYaml $pool }}
{{- end }}

{{/* Secrets ------------------------------------------------------------------------------------ */}}

{{- define "noetl-stream.natsSecretName" -}}
{{- default (printf "%s-nats" (include "noetl-stream.fullname" .)) .Values.nats.auth.existingSecret }}
{{- end }}

{{- define "noetl-stream.keychainSecretName" -}}
{{- default (printf "%s-keychain" (include "noetl-stream.fullname" .)) .Values.keychain.existingSecret }}
{{- end }}

{{- define "noetl-stream.keychainEnabled" -}}
{{- if or .Values.keychain.existingSecret .Values.keychain.key }}true{{ end }}
{{- end }}

{{/* A number as text without an exponent: 2592000, not 2.592e+06 (YAML numbers arrive as floats). */}}
{{- define "noetl-stream.number" -}}
{{- if eq (float64 .) (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/*
Settings every component shares (the ConfigMap, and the provisioning Job's env). The partition count
and lease TTL matter to `provision` only: a running installation keeps the ones its events stream and
leases bucket have, and controllers read them from the server.
*/}}
{{- define "noetl-stream.settings" -}}
NOETL_PREFIX: {{ .Values.prefix | quote }}
NOETL_REPLICAS: {{ include "noetl-stream.number" .Values.jetstream.replicas | quote }}
NOETL_STORAGE: {{ .Values.jetstream.storage | quote }}
NOETL_EVENTS_MAX_AGE_S: {{ include "noetl-stream.number" .Values.jetstream.eventsMaxAgeSeconds | quote }}
NOETL_COMMAND_ACK_WAIT_S: {{ include "noetl-stream.number" .Values.jetstream.commandAckWaitSeconds | quote }}
NOETL_COMMAND_MAX_DELIVER: {{ include "noetl-stream.number" .Values.jetstream.commandMaxDeliver | quote }}
NOETL_PARTITIONS: {{ include "noetl-stream.number" .Values.jetstream.partitions | quote }}
NOETL_LEASE_TTL_S: {{ include "noetl-stream.number" .Values.jetstream.leaseTtlSeconds | quote }}
{{- end }}

{{/*
nats.url (one URL or several comma-separated) with `userinfo` in every URL:
(dict "url" "nats://a:4222,nats://b:4222" "userinfo" "user:password")
*/}}
{{- define "noetl-stream.natsUrls" -}}
{{- $out := list }}
{{- range splitList "," .url }}
{{- $u := urlParse (trim .) }}
{{- $out = append $out (printf "%s://%s@%s" $u.scheme $.userinfo $u.host) }}
{{- end }}
{{- join "," $out }}
{{- end }}

{{/*
NATS connection env of one identity: (dict "root" $ "role" "controller" "secret" "<name>")
NOETL_NATS_URL is assembled by the kubelet from the two variables before it ($(VAR) expansion), with the
credentials in each URL of a comma-separated list.
*/}}
{{- define "noetl-stream.natsEnv" -}}
{{- $root := .root }}
{{- $nats := $root.Values.nats }}
{{- $auth := $nats.auth }}
{{- if $auth.enabled }}
- name: NOETL_NATS_USER
  value: {{ (get $auth .role).user | quote }}
- name: NOETL_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .role }}
- name: NOETL_NATS_URL
  value: {{ include "noetl-stream.natsUrls" (dict "url" $nats.url "userinfo" "$(NOETL_NATS_USER):$(NOETL_NATS_PASSWORD)") | quote }}
{{- else }}
- name: NOETL_NATS_URL
  value: {{ $nats.url | quote }}
{{- end }}
{{- if $nats.credsSecret }}
- name: NOETL_NATS_CREDS
  value: /etc/noetl/nats-creds/{{ .role }}.creds
{{- end }}
{{- if $nats.tls.caSecret }}
# The CA of the NATS servers, for the NATS connection only (the process's other TLS connections keep
# the system's CAs).
- name: NOETL_NATS_CA
  value: /etc/noetl/nats-ca/{{ $nats.tls.caKey }}
{{- end }}
# The root filesystem is read-only: libraries that keep files under $HOME use the /tmp emptyDir.
- name: HOME
  value: /tmp
{{- end }}

{{/* The chart's own env of each container (extraEnv follows it: "noetl-stream.env"). */}}
{{- define "noetl-stream.controllerEnv" -}}
{{ include "noetl-stream.natsEnv" (dict "root" . "role" "controller" "secret" (include "noetl-stream.natsSecretName" .)) }}
# Its id in the partition leases: unique among live controllers, the same after a container restart in
# the same pod (which then takes its partitions back at once).
- name: NOETL_CONTROLLER_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- with .Values.controller.api.tokensSecret }}
- name: NOETL_API_TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.controller.api.tokensKey }}
{{- end }}
{{- with .Values.controller.api.readTokensSecret }}
- name: NOETL_API_READ_TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.controller.api.readTokensKey }}
{{- end }}
{{- end }}

{{- define "noetl-stream.workerEnv" -}}
{{ include "noetl-stream.natsEnv" (dict "root" . "role" "worker" "secret" (include "noetl-stream.natsSecretName" .)) }}
{{- if include "noetl-stream.keychainEnabled" . }}
- name: NOETL_KEYCHAIN_KEY_FILE
  value: /etc/noetl/keychain/key
{{- end }}
{{- end }}

{{/* The provisioning Job gets the settings as env (a hook runs before the ConfigMap exists). */}}
{{- define "noetl-stream.provisionEnv" -}}
{{- range $k, $v := include "noetl-stream.settings" .root | fromYaml }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{ include "noetl-stream.natsEnv" (dict "root" .root "role" "admin" "secret" .secret) }}
{{- end }}

{{/*
Where an env name the chart sets comes from, for the message refusing it in extraEnv.
*/}}
{{- define "noetl-stream.envSources" -}}
NOETL_NATS_URL: nats.url and nats.auth
NOETL_NATS_USER: nats.auth
NOETL_NATS_PASSWORD: nats.auth
NOETL_NATS_CREDS: nats.credsSecret
NOETL_NATS_CA: nats.tls.caSecret
HOME: the chart (/tmp, the writable emptyDir)
NOETL_CONTROLLER_ID: the chart (the pod name)
NOETL_API_TOKENS: controller.api.tokensSecret
NOETL_API_READ_TOKENS: controller.api.readTokensSecret
NOETL_KEYCHAIN_KEY_FILE: keychain.existingSecret or keychain.key
{{- range $k, $_ := include "noetl-stream.settings" . | fromYaml }}
{{ $k }}: prefix and jetstream.*
{{- end }}
{{- end }}

{{/*
A container's env: the chart's own variables (`env`, YAML text) followed by extraEnv. Fails when extraEnv
names a variable the chart sets in this container (in `env`, or in the ConfigMap the container reads
with `envFrom` when `envFrom` is true), or one name twice: Kubernetes would keep one of them silently.
(dict "root" $ "container" "controller" "env" "<YAML list>" "envFrom" true)
*/}}
{{- define "noetl-stream.env" -}}
{{- $root := .root }}
{{- $own := .env | fromYamlArray }}
{{- $set := dict }}
{{- range $own }}{{ $_ := set $set .name true }}{{ end }}
{{- if .envFrom }}
{{- range $k, $_ := include "noetl-stream.settings" $root | fromYaml }}{{ $_ := set $set $k true }}{{ end }}
{{- end }}
{{- $sources := include "noetl-stream.envSources" $root | fromYaml }}
{{- $extra := dict }}
{{- range $root.Values.extraEnv }}
{{- $name := .name | default "" }}
{{- if hasKey $set $name }}
{{- fail (printf "extraEnv sets %s, which the chart sets itself in the %s container (from %s): remove it from extraEnv and use that value" $name $.container (get $sources $name | default "the chart's values")) }}
{{- end }}
{{- if hasKey $extra $name }}
{{- fail (printf "extraEnv lists %s twice" $name) }}
{{- end }}
{{- $_ := set $extra $name true }}
{{- end }}
{{- toYaml (concat $own $root.Values.extraEnv) }}
{{- end }}

{{/* Pod pieces -------------------------------------------------------------------------------- */}}

{{/*
Startup and readiness: connected to NATS. Liveness: connected, or NATS unreachable from the pod (an
outage is not this process's fault: restarting would only kill its running tasks).
*/}}
{{- define "noetl-stream.probes" -}}
{{- $p := .Values.probes }}
startupProbe:
  exec:
    command: [noetl-probe]
  {{- toYaml $p.startup | nindent 2 }}
readinessProbe:
  exec:
    command: [noetl-probe]
  {{- toYaml $p.readiness | nindent 2 }}
livenessProbe:
  exec:
    command: [noetl-probe, --liveness]
  {{- toYaml $p.liveness | nindent 2 }}
{{- end }}

{{/* Volumes of one identity's pod: (dict "root" $ "role" "controller") */}}
{{- define "noetl-stream.volumeMounts" -}}
{{- $nats := .root.Values.nats }}
- name: tmp
  mountPath: /tmp
{{- if $nats.tls.caSecret }}
- name: nats-ca
  mountPath: /etc/noetl/nats-ca
  readOnly: true
{{- end }}
{{- if $nats.credsSecret }}
- name: nats-creds
  mountPath: /etc/noetl/nats-creds
  readOnly: true
{{- end }}
{{- end }}

{{- define "noetl-stream.volumes" -}}
{{- $nats := .root.Values.nats }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .root.Values.tmp.sizeLimit }}
{{- if $nats.tls.caSecret }}
- name: nats-ca
  secret:
    secretName: {{ $nats.tls.caSecret }}
{{- end }}
{{- if $nats.credsSecret }}
# Only this identity's .creds file (a worker pod never holds the controller's or the admin's).
- name: nats-creds
  secret:
    secretName: {{ $nats.credsSecret }}
    defaultMode: 0440
    items:
      - key: {{ .role }}
        path: {{ .role }}.creds
{{- end }}
{{- end }}

{{- define "noetl-stream.podMeta" -}}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}

{{/*
topologySpreadConstraints with the component's own pod labels as the labelSelector of every entry that
names none: (dict "constraints" list "labels" "<selector labels YAML>"). A hand-written selector such as
{app.kubernetes.io/component: controller} would also count other releases' pods in the namespace.
*/}}
{{- define "noetl-stream.topologySpread" -}}
{{- $out := list }}
{{- range .constraints }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" ($.labels | fromYaml)) }}
{{- end }}
{{- $out = append $out $c }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
Where the provisioning Job and the prune CronJob run: on the controllers' nodes (controller.nodeSelector,
.tolerations and the nodeAffinity of .affinity; not its pod (anti-)affinity, which names controllers).
*/}}
{{- define "noetl-stream.jobScheduling" -}}
{{- $c := .Values.controller }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($c.affinity | default dict).nodeAffinity }}
affinity:
  nodeAffinity:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- end }}

{{/* terminationGracePeriodSeconds from `--grace` and the extra drain time: (dict "grace" g "extra" e) */}}
{{- define "noetl-stream.terminationGrace" -}}
{{- add (int (ceil .grace)) (int .extra) }}
{{- end }}

{{/*
The container port name of worker process i (0-based) of a pod: metrics, metrics-2, metrics-3, ...
*/}}
{{- define "noetl-stream.metricsPort" -}}
{{- if eq (int .) 0 }}metrics{{ else }}{{ printf "metrics-%d" (add (int .) 1) }}{{ end }}
{{- end }}
