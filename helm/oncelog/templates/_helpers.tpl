{{/*
Shared pieces of the oncelog chart. The three components (partition stores,
transaction coordinators, group coordinators) are rendered by the same
templates from the table in "oncelog.components", so a rule about pods,
probes or services is written once.
*/}}

{{- define "oncelog.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every resource name. Kept to 40 characters so that
"<prefix>-group-coordinator-headless" still fits a 63-character DNS label.
*/}}
{{- define "oncelog.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "oncelog.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The components. key: the values block; name: the resource-name suffix and
the app.kubernetes.io/component label; module: what `python -m` runs; job:
the Prometheus job label ("oncelog-" and the service: the alert rules select
jobs containing "oncelog"; docs/metrics.md);
stateful: whether the pods keep a data volume; etcdClient: whether the
process is given the etcd endpoints (the stores are etcd's only clients);
kafka: whether it can serve a Kafka listener (the stores only, when
partitionStore.kafka.enabled); readinessService: the health service name
the readiness probe asks for (empty: the process's overall status) — a
store is ready once it is back in every ISR (services/partition_store/
server.py IN_SYNC_HEALTH_SERVICE), so a rolling update waits for that
before it restarts the next one. inStores (the coordinators): what
<component>.inStores needs to run them in the stores' processes — the
crc32 of the internal topic whose partitions they own (placement:
"oncelog.coordinatorAddresses"), the store flag that runs one, and the
coordinator's own flags a store takes too.
*/}}
{{- define "oncelog.components" -}}
partitionStore:
  key: partitionStore
  name: partition-store
  module: oncelog_server.partition_store
  job: oncelog-partition-store
  stateful: true
  etcdClient: true
  kafka: true
  readinessService: oncelog.replication.InSync
coordinator:
  key: coordinator
  name: coordinator
  module: oncelog_server.coordinator
  job: oncelog-coordinator
  stateful: false
  inStores:
    # crc32("__transaction_state")
    topicHash: 1858335637
    storeFlag: transaction-coordinator
    # services/coordinator/config.py add_coordinator_arguments; the store's
    # --max-transaction-timeout-ms is one flag for both.
    flags:
      - producer-id-block-size
      - max-transaction-timeout-ms
      - transactional-id-expiration-ms
      - transaction-check-interval-ms
      - allow-two-phase-commit
groupCoordinator:
  key: groupCoordinator
  name: group-coordinator
  module: oncelog_server.group_coordinator
  job: oncelog-group-coordinator
  stateful: false
  inStores:
    # crc32("__consumer_offsets")
    topicHash: 2370100564
    storeFlag: group-coordinator
    # services/group_coordinator/config.py add_group_coordinator_arguments,
    # but retention-check-interval-ms: that flag is the store's own (how
    # often its retention runs), set by partitionStore.config for both.
    flags:
      - min-session-timeout-ms
      - max-session-timeout-ms
      - max-heartbeat-interval-ms
      - offsets-retention-ms
      - initial-rebalance-delay-ms
      - lag-refresh-interval-ms
{{- end }}

{{/* One component's table row; call with (dict "root" $ "key" "partitionStore"). */}}
{{- define "oncelog.component" -}}
{{- $all := include "oncelog.components" .root | fromYaml }}
{{- $row := get $all .key }}
{{- if not $row }}
{{- fail (printf "internal: unknown component %q" .key) }}
{{- end }}
{{- toYaml $row }}
{{- end }}

{{/*
Whether a component runs pods of its own; call with (dict "root" $ "key"
...). Off with <component>.enabled=false (the group coordinators), and
with <component>.inStores (the coordinators then run in the partition
stores' processes: "oncelog.coordinatorAddresses").
*/}}
{{- define "oncelog.componentEnabled" -}}
{{- $values := get .root.Values .key }}
{{- if and (hasKey $values "inStores") $values.inStores }}
{{- else if hasKey $values "enabled" }}{{ ternary "true" "" $values.enabled }}{{ else }}true{{ end }}
{{- end }}

{{/* StatefulSet name of a component: (dict "root" $ "key" ...). */}}
{{- define "oncelog.componentName" -}}
{{- $c := include "oncelog.component" . | fromYaml }}
{{- printf "%s-%s" (include "oncelog.fullname" .root) $c.name | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* Headless Service of a component: the pods' stable DNS names live under it. */}}
{{- define "oncelog.headlessName" -}}
{{- printf "%s-headless" (include "oncelog.componentName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "oncelog.selectorLabels" -}}
app.kubernetes.io/name: {{ include "oncelog.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "oncelog.labels" -}}
helm.sh/chart: {{ include "oncelog.chart" . }}
{{ include "oncelog.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: oncelog
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component's pods: (dict "root" $ "key" ...). */}}
{{- define "oncelog.componentSelectorLabels" -}}
{{- $c := include "oncelog.component" . | fromYaml }}
{{- include "oncelog.selectorLabels" .root }}
app.kubernetes.io/component: {{ $c.name }}
{{- end }}

{{- define "oncelog.componentLabels" -}}
{{- $c := include "oncelog.component" . | fromYaml }}
{{- include "oncelog.labels" .root }}
app.kubernetes.io/component: {{ $c.name }}
{{- end }}

{{- define "oncelog.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "oncelog.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "oncelog.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The advertised addresses of every pod of a component, by node id (= the
StatefulSet ordinal), comma-separated: the layout every process is given.
Empty when the component is disabled. Call with (dict "root" $ "key" ...),
and "port" for another port than ports.grpc (the token listeners').
*/}}
{{- define "oncelog.addresses" -}}
{{- $root := .root }}
{{- $addresses := list }}
{{- if include "oncelog.componentEnabled" . }}
{{- $values := get $root.Values .key }}
{{- $sts := include "oncelog.componentName" . }}
{{- $svc := include "oncelog.headlessName" . }}
{{- range $ordinal := until (int $values.replicas) }}
{{- $addresses = append $addresses (printf "%s-%d.%s.%s.svc.%s:%d" $sts $ordinal $svc $root.Release.Namespace $root.Values.clusterDomain (int (default $root.Values.ports.grpc $.port))) }}
{{- end }}
{{- end }}
{{- join "," $addresses }}
{{- end }}

{{/*
Whether a coordinator component runs in the stores: (dict "root" $ "key"
...). "true" or empty. <component>.inStores, for a component that runs at
all (the group coordinators: groupCoordinator.enabled).
*/}}
{{- define "oncelog.inStores" -}}
{{- $values := get .root.Values .key }}
{{- if and $values.inStores (or (not (hasKey $values "enabled")) $values.enabled) }}true{{ end }}
{{- end }}

{{/*
A coordinator component's addresses by node id, comma-separated
(--coordinators, --group-coordinators; --token-... with "port"
ports.token). Call with (dict "root" $ "key" ...) and an optional "port",
as "oncelog.addresses".

With <component>.inStores there is one coordinator per store, and entry c
is the address of store (crc32(topic) + c) % stores, topic being the
internal topic whose partitions the component owns (__transaction_state,
__consumer_offsets; "oncelog.components" has its crc32). That is
oncelog.wire.placement.store_of_coordinator (store_of_group_coordinator),
the rule LocalCluster uses: coordinator c owns the partitions p with
p % stores == c, and the stores' placement makes that store the preferred
leader of every one of them, so the coordinator's appends stay in its own
process. Each store runs the coordinator listed at its own address
(--transaction-coordinator auto, --group-coordinator auto).
*/}}
{{- define "oncelog.coordinatorAddresses" -}}
{{- if include "oncelog.inStores" . }}
{{- $hash := (include "oncelog.component" . | fromYaml).inStores.topicHash }}
{{- $stores := splitList "," (include "oncelog.addresses" (dict "root" .root "key" "partitionStore" "port" .port)) }}
{{- $count := len $stores }}
{{- $addresses := list }}
{{- range $c := until $count }}
{{- $addresses = append $addresses (index $stores (int (mod (add $hash $c) $count))) }}
{{- end }}
{{- join "," $addresses }}
{{- else }}
{{- include "oncelog.addresses" . }}
{{- end }}
{{- end }}

{{/*
A value as an environment variable's text. Helm reads numbers from YAML
and JSON as floats, and a float prints as 8.64e+07: whole numbers are
printed as integers so the services' int() parses them.
*/}}
{{- define "oncelog.envValue" -}}
{{- if kindIs "float64" . }}
{{- if eq (float64 (int64 .)) . }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/* The environment variable of a server flag: fsync -> ONCELOG_FSYNC. */}}
{{- define "oncelog.envName" -}}
{{- printf "ONCELOG_%s" (. | upper | replace "-" "_") }}
{{- end }}

{{/*
The cluster ConfigMap's data (also hashed into every pod's annotations): the
layout, the shared settings and the security settings.
*/}}
{{- define "oncelog.clusterEnv" -}}
ONCELOG_STORES: {{ include "oncelog.addresses" (dict "root" . "key" "partitionStore") | quote }}
ONCELOG_COORDINATORS: {{ include "oncelog.coordinatorAddresses" (dict "root" . "key" "coordinator") | quote }}
ONCELOG_GROUP_COORDINATORS: {{ include "oncelog.coordinatorAddresses" (dict "root" . "key" "groupCoordinator") | quote }}
ONCELOG_TRANSACTION_STATE_PARTITIONS: {{ include "oncelog.envValue" .Values.cluster.transactionStatePartitions | quote }}
ONCELOG_CONSUMER_OFFSETS_PARTITIONS: {{ include "oncelog.envValue" .Values.cluster.consumerOffsetsPartitions | quote }}
ONCELOG_LISTEN: {{ printf "%s:%d" (include "oncelog.hostForPort" .Values.listenHost) (int .Values.ports.grpc) | quote }}
ONCELOG_METRICS_PORT: {{ ternary (int .Values.ports.metrics) 0 .Values.metrics.enabled | toString | quote }}
ONCELOG_LOG_FORMAT: {{ .Values.logging.format | quote }}
ONCELOG_LOG_LEVEL: {{ .Values.logging.level | quote }}
{{- /* TLS, principals and the authorizer (_security.tpl). */}}
{{- include "oncelog.securityEnv" . }}
{{- end }}

{{/*
The checksum of the cluster ConfigMap that rolls every pod when it changes:
of everything but the store list. Stores join a running cluster: a new store
registers its address in etcd, and every running process learns it from
there (docs/replication.md, "Growing and moving"), so growing
partitionStore.replicas starts the new pods (with the longer list) and
restarts nothing; the others name the new stores from their next restart on.
Not so with coordinator.inStores or groupCoordinator.inStores: the store
count is then the coordinators' too, and the coordinator list (hashed)
changes with it, as it must.
*/}}
{{- define "oncelog.clusterEnvChecksum" -}}
{{- $env := include "oncelog.clusterEnv" . | fromYaml }}
{{- $_ := unset $env "ONCELOG_STORES" }}
{{- $_ := unset $env "ONCELOG_TOKEN_STORES" }}
{{- toYaml $env | sha256sum }}
{{- end }}

{{/*
The checksum of one component's ConfigMap that rolls its pods when it
changes: of everything but the stores' Kafka addresses, for the reason the
cluster checksum leaves out ONCELOG_STORES (a new store registers its Kafka
address in etcd too). Call with (dict "root" $ "key" ...).
*/}}
{{- define "oncelog.componentEnvChecksum" -}}
{{- /* By line, so that without a Kafka listener the text hashed is unchanged. */}}
{{- regexReplaceAll "(?m)^ONCELOG_KAFKA_STORES: .*$" (include "oncelog.componentEnv" .) "" | sha256sum }}
{{- end }}

{{/*
Whether a component's pods serve a Kafka listener: (dict "root" $ "key" ...).
"true" or empty.
*/}}
{{- define "oncelog.kafkaListener" -}}
{{- $c := include "oncelog.component" . | fromYaml }}
{{- if $c.kafka }}{{ ternary "true" "" (get .root.Values .key).kafka.enabled }}{{ end }}
{{- end }}

{{/* Kafka clients' bootstrap.servers: the bootstrap Service's kafka port. */}}
{{- define "oncelog.kafkaBootstrapAddress" -}}
{{- printf "%s.%s.svc.%s:%d" (include "oncelog.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.ports.kafka) }}
{{- end }}

{{/*
A Kafka listener on a port another listener of the store uses would keep
the store from starting (it exits when a port is taken): refused here,
naming both. Rendered by configmap.yaml.
*/}}
{{- define "oncelog.kafkaChecks" -}}
{{- if include "oncelog.kafkaListener" (dict "root" . "key" "partitionStore") }}
{{- $kafka := int .Values.ports.kafka }}
{{- $others := dict "ports.grpc" .Values.ports.grpc }}
{{- if .Values.metrics.enabled }}{{ $_ := set $others "ports.metrics" .Values.ports.metrics }}{{ end }}
{{- if .Values.security.oauth.enabled }}{{ $_ := set $others "ports.token" .Values.ports.token }}{{ end }}
{{- range $name, $port := $others }}
{{- if eq (int $port) $kafka }}
{{- fail (printf "ports.kafka (%d) must differ from %s: the stores serve both (partitionStore.kafka.enabled)" $kafka $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The stores' grace period must hold their shutdown: the hand-over of their
leaderships (controlled-shutdown-timeout-ms), the drain of running requests
(shutdown-grace-ms), then 10 s for the snapshots and the exit. Less, and the kubelet's SIGKILL cuts a rolling update's hand-over
short (the partitions then move only when the lease ends). Rendered by
configmap.yaml.
*/}}
{{- define "oncelog.shutdownChecks" -}}
{{- $store := .Values.partitionStore }}
{{- $handoverMs := int (dig "controlled-shutdown-timeout-ms" 10000 $store.config) }}
{{- $drainMs := int (dig "shutdown-grace-ms" 5000 $store.config) }}
{{- $marginS := 10 }}
{{- $neededS := add (div (add $handoverMs $drainMs 999) 1000) $marginS }}
{{- if lt (int $store.terminationGracePeriodSeconds) (int $neededS) }}
{{- fail (printf "partitionStore.terminationGracePeriodSeconds (%d) must be at least %d: the hand-over of leaderships (partitionStore.config.controlled-shutdown-timeout-ms, %d ms) and the drain (shutdown-grace-ms, %d ms), then %d s for the snapshots" (int $store.terminationGracePeriodSeconds) (int $neededS) $handoverMs $drainMs $marginS) }}
{{- end }}
{{- end }}

{{/* One component's ConfigMap data: (dict "root" $ "key" ...). */}}
{{- define "oncelog.componentEnv" -}}
{{- $values := get .root.Values .key }}
{{- $c := include "oncelog.component" . | fromYaml }}
{{- if $c.stateful }}{{/* the store's --data-dir: its volume */}}
ONCELOG_DATA_DIR: {{ $values.persistence.mountPath | quote }}
{{- end }}
{{- if $c.etcdClient }}{{/* --etcd-endpoints: replicated partitions */}}
ONCELOG_ETCD_ENDPOINTS: {{ include "oncelog.etcdEndpoints" .root | quote }}
{{- end }}
{{- if include "oncelog.kafkaListener" . }}
{{- /*
The Kafka listener: bound like the gRPC port, and every store's address by
node id, which Metadata names as brokers (each store advertises its own
entry, its DNS name).
*/}}
{{- $port := int .root.Values.ports.kafka }}
ONCELOG_KAFKA_LISTEN: {{ printf "%s:%d" (include "oncelog.hostForPort" .root.Values.listenHost) $port | quote }}
ONCELOG_KAFKA_STORES: {{ include "oncelog.addresses" (dict "root" .root "key" .key "port" $port) | quote }}
{{- end }}
{{- $config := $values.config | default dict }}
{{- if eq .key "partitionStore" }}
{{- /*
Each store runs the coordinators (of each kind with inStores) that their
lists give its own address ("oncelog.coordinatorAddresses"), with their
settings. A key partitionStore.config sets too keeps the store's value: the
store's setting is about its whole process, and max-transaction-timeout-ms
and retention-check-interval-ms are each one flag for the store and its
coordinator.
*/}}
{{- $config = deepCopy $config }}
{{- range $key := list "coordinator" "groupCoordinator" }}
{{- $ctx := dict "root" $.root "key" $key }}
{{- if include "oncelog.inStores" $ctx }}
{{- $hosted := (include "oncelog.component" $ctx | fromYaml).inStores }}
{{ include "oncelog.envName" $hosted.storeFlag }}: "auto"
{{- $coordinator := (get $.root.Values $key).config | default dict }}
{{- range $flag := $hosted.flags }}
{{- if and (hasKey $coordinator $flag) (not (hasKey $config $flag)) }}
{{- $_ := set $config $flag (get $coordinator $flag) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- range $flag, $value := $config }}
{{ include "oncelog.envName" $flag }}: {{ include "oncelog.envValue" $value | quote }}
{{- end }}
{{- end }}

{{/* An IPv6 host is bracketed in host:port. */}}
{{- define "oncelog.hostForPort" -}}
{{- if contains ":" . }}{{ printf "[%s]" . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/*
etcd, the stores' metadata store: the chart runs it unless
etcd.external.endpoints names an existing one. "true" or empty.
*/}}
{{- define "oncelog.etcdRuns" -}}
{{- if not .Values.etcd.external.endpoints }}true{{ end }}
{{- end }}

{{/* The etcd StatefulSet's name (also each member's name prefix). */}}
{{- define "oncelog.etcdName" -}}
{{- printf "%s-etcd" (include "oncelog.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* The headless Service of the etcd members: their stable DNS names. */}}
{{- define "oncelog.etcdHeadlessName" -}}
{{- printf "%s-headless" (include "oncelog.etcdName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "oncelog.etcdSelectorLabels" -}}
{{- include "oncelog.selectorLabels" . }}
app.kubernetes.io/component: etcd
{{- end }}

{{- define "oncelog.etcdLabels" -}}
{{- include "oncelog.labels" . }}
app.kubernetes.io/component: etcd
{{- end }}

{{/*
The DNS name of an etcd member: (dict "root" $ "member" NAME), NAME being
"<statefulset>-<ordinal>", or "$(ETCD_NAME)" inside a member's own
environment (Kubernetes expands it).
*/}}
{{- define "oncelog.etcdMemberHost" -}}
{{- $root := .root }}
{{- printf "%s.%s.%s.svc.%s" .member (include "oncelog.etcdHeadlessName" $root) $root.Release.Namespace $root.Values.clusterDomain }}
{{- end }}

{{/*
The etcd client endpoints the stores are given (--etcd-endpoints),
comma-separated host:port: the external ones, or every member of the
chart's etcd by its DNS name (an etcd client fails over between them).
*/}}
{{- define "oncelog.etcdEndpoints" -}}
{{- if include "oncelog.etcdRuns" . }}
{{- $root := . }}
{{- $endpoints := list }}
{{- range $ordinal := until (int .Values.etcd.replicas) }}
{{- $member := printf "%s-%d" (include "oncelog.etcdName" $root) $ordinal }}
{{- $endpoints = append $endpoints (printf "%s:%d" (include "oncelog.etcdMemberHost" (dict "root" $root "member" $member)) (int $root.Values.etcd.ports.client)) }}
{{- end }}
{{- join "," $endpoints }}
{{- else }}
{{- join "," .Values.etcd.external.endpoints }}
{{- end }}
{{- end }}

{{/* etcd's --initial-cluster: name=peer URL of every member. */}}
{{- define "oncelog.etcdInitialCluster" -}}
{{- $root := . }}
{{- $members := list }}
{{- range $ordinal := until (int .Values.etcd.replicas) }}
{{- $member := printf "%s-%d" (include "oncelog.etcdName" $root) $ordinal }}
{{- $members = append $members (printf "%s=http://%s:%d" $member (include "oncelog.etcdMemberHost" (dict "root" $root "member" $member)) (int $root.Values.etcd.ports.peer)) }}
{{- end }}
{{- join "," $members }}
{{- end }}

{{- define "oncelog.etcdImage" -}}
{{- $image := .Values.etcd.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository $image.tag }}
{{- end }}
{{- end }}
