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

{{/* JetStream names, as noetl_stream/subjects.py builds them */}}
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
NATS connection env of one identity: (dict "root" $ "role" "controller" "secret" "<name>")
NOETL_NATS_URL is assembled by the kubelet from the two variables before it ($(VAR) expansion).
*/}}
{{- define "noetl-stream.natsEnv" -}}
{{- $root := .root }}
{{- $auth := $root.Values.nats.auth }}
{{- if $auth.enabled }}
{{- $u := urlParse $root.Values.nats.url }}
- name: NOETL_NATS_USER
  value: {{ (get $auth .role).user | quote }}
- name: NOETL_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .role }}
- name: NOETL_NATS_URL
  value: {{ printf "%s://$(NOETL_NATS_USER):$(NOETL_NATS_PASSWORD)@%s" $u.scheme $u.host | quote }}
{{- else }}
- name: NOETL_NATS_URL
  value: {{ $root.Values.nats.url | quote }}
{{- end }}
# The root filesystem is read-only: libraries that keep files under $HOME use the /tmp emptyDir.
- name: HOME
  value: /tmp
{{- if $root.Values.nats.tls.caSecret }}
- name: SSL_CERT_FILE
  value: /etc/noetl/nats-ca/{{ $root.Values.nats.tls.caKey }}
{{- end }}
{{- end }}

{{/* Pod pieces -------------------------------------------------------------------------------- */}}

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
    command: [noetl-probe]
  {{- toYaml $p.liveness | nindent 2 }}
{{- end }}

{{- define "noetl-stream.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.nats.tls.caSecret }}
- name: nats-ca
  mountPath: /etc/noetl/nats-ca
  readOnly: true
{{- end }}
{{- end }}

{{- define "noetl-stream.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmp.sizeLimit }}
{{- if .Values.nats.tls.caSecret }}
- name: nats-ca
  secret:
    secretName: {{ .Values.nats.tls.caSecret }}
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
