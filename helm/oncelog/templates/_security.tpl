{{/*
Security: TLS from Secrets, authenticated principals, the authorizer and the
initial ACLs (docs/helm.md, "Security"; docs/security.md for the model).

Every setting reaches the services as the ONCELOG_* variable of its flag
(server_base.py: --tls-cert-file is ONCELOG_TLS_CERT_FILE), in the cluster
ConfigMap, so a change rolls every pod. The certificate files are not part
of any checksum: Kubernetes rewrites a mounted Secret in place when it
changes and the services re-read the files (--tls-reload-interval-ms), so
cert-manager's renewals need no restart.
*/}}

{{/* Where each component's TLS Secret (tls.crt, tls.key, ca.crt) is mounted. */}}
{{- define "oncelog.tlsDir" -}}/etc/oncelog/tls{{- end }}
{{/* Where the initial-ACL Job mounts the admin client certificate. */}}
{{- define "oncelog.adminTlsDir" -}}/etc/oncelog/admin-tls{{- end }}
{{/* Where the bearer-token issuers (issuers.json and the keys) are mounted. */}}
{{- define "oncelog.oauthDir" -}}/etc/oncelog/oauth{{- end }}
{{/* Where the TLS health probe's script is mounted. */}}
{{- define "oncelog.probeDir" -}}/etc/oncelog/probe{{- end }}
{{- define "oncelog.probeScript" -}}grpc_health_probe.py{{- end }}

{{/*
The TLS Secret of a component, (dict "root" $ "key" ...): its own entry of
security.tls.secretNames, else the shared security.tls.secretName, else
<statefulset>-tls (the name the chart's cert-manager Certificate writes).
*/}}
{{- define "oncelog.tlsSecretName" -}}
{{- $tls := .root.Values.security.tls }}
{{- $own := get ($tls.secretNames | default dict) .key }}
{{- if $own }}{{ $own }}
{{- else if $tls.secretName }}{{ $tls.secretName }}
{{- else }}{{ printf "%s-tls" (include "oncelog.componentName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The admin client certificate's Secret (the initial-ACL Job's identity). */}}
{{- define "oncelog.adminSecretName" -}}
{{- $admin := .Values.security.adminClient }}
{{- if $admin.secretName }}{{ $admin.secretName }}
{{- else }}{{ printf "%s-admin-tls" (include "oncelog.fullname" .) }}
{{- end }}
{{- end }}

{{/* The bootstrap address, <release>-oncelog.<namespace>.svc.<domain>:<grpc>. */}}
{{- define "oncelog.bootstrapAddress" -}}
{{- printf "%s.%s.svc.%s:%d" (include "oncelog.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.ports.grpc) }}
{{- end }}

{{/*
A projected volume of a certificate Secret: tls.crt and tls.key from it,
ca.crt from it too unless security.tls.ca names a ConfigMap or Secret that
holds the CA bundle (a trust-manager Bundle, say). Projected volumes are
updated in place like Secret volumes (no subPath anywhere), which is what
rotation needs. Mode 0440: the key is readable by the pods' group (fsGroup)
and nobody else. Call with (dict "root" $ "secret" NAME).
*/}}
{{- define "oncelog.certificateVolume" -}}
{{- $ca := .root.Values.security.tls.ca }}
projected:
  defaultMode: 288
  sources:
    - secret:
        name: {{ .secret }}
        items:
          - key: tls.crt
            path: tls.crt
          - key: tls.key
            path: tls.key
          {{- if not (or $ca.configMapName $ca.secretName) }}
          - key: ca.crt
            path: ca.crt
          {{- end }}
    {{- if $ca.configMapName }}
    - configMap:
        name: {{ $ca.configMapName }}
        items:
          - key: {{ $ca.key }}
            path: ca.crt
    {{- else if $ca.secretName }}
    - secret:
        name: {{ $ca.secretName }}
        items:
          - key: {{ $ca.key }}
            path: ca.crt
    {{- end }}
{{- end }}

{{/* The ConfigMap holding issuers.json for --oauth-issuers. */}}
{{- define "oncelog.oauthConfigMapName" -}}
{{- printf "%s-oauth-issuers" (include "oncelog.fullname" .) }}
{{- end }}

{{/* issuers.json: {"<issuer>": "<path of its public key>"}, as --oauth-issuers reads it. */}}
{{- define "oncelog.oauthIssuersJson" -}}
{{- $root := . }}
{{- $issuers := dict }}
{{- range $index, $issuer := .Values.security.oauth.issuers }}
{{- $_ := set $issuers $issuer.issuer (printf "%s/issuer-%d.pem" (include "oncelog.oauthDir" $root) $index) }}
{{- end }}
{{- toJson $issuers }}
{{- end }}

{{/* The projected volume of the issuers: issuers.json and each issuer's public key. */}}
{{- define "oncelog.oauthVolume" -}}
projected:
  defaultMode: 292
  sources:
    - configMap:
        name: {{ include "oncelog.oauthConfigMapName" . }}
        items:
          - key: issuers.json
            path: issuers.json
    {{- range $index, $issuer := .Values.security.oauth.issuers }}
    {{- if $issuer.configMap }}
    - configMap:
        name: {{ $issuer.configMap.name }}
        items:
          - key: {{ $issuer.configMap.key }}
            path: {{ printf "issuer-%d.pem" $index }}
    {{- else }}
    - secret:
        name: {{ $issuer.secret.name }}
        items:
          - key: {{ $issuer.secret.key }}
            path: {{ printf "issuer-%d.pem" $index }}
    {{- end }}
    {{- end }}
{{- end }}

{{/*
The security settings every process shares, as ONCELOG_* variables of the
cluster ConfigMap. Only what is configured is written, so an unset flag
keeps the service's default.
*/}}
{{- define "oncelog.securityEnv" -}}
{{- $sec := .Values.security }}
{{- $dir := include "oncelog.tlsDir" . }}
{{- if $sec.tls.enabled }}
ONCELOG_TLS_CERT_FILE: {{ printf "%s/tls.crt" $dir | quote }}
ONCELOG_TLS_KEY_FILE: {{ printf "%s/tls.key" $dir | quote }}
ONCELOG_TLS_CA_FILE: {{ printf "%s/ca.crt" $dir | quote }}
ONCELOG_TLS_CLIENT_AUTH: {{ $sec.tls.clientAuth | quote }}
ONCELOG_TLS_RELOAD_INTERVAL_MS: {{ include "oncelog.envValue" $sec.tls.reloadIntervalMs | quote }}
ONCELOG_SSL_PRINCIPAL_MAPPING_RULES: {{ $sec.principalMappingRules | quote }}
{{- end }}
ONCELOG_AUTHORIZER: {{ $sec.authorizer | quote }}
{{- if eq $sec.authorizer "acl" }}
ONCELOG_SUPER_USERS: {{ join ";" $sec.superUsers | quote }}
ONCELOG_ALLOW_EVERYONE_IF_NO_ACL_FOUND: {{ ternary "true" "false" $sec.allowEveryoneIfNoAclFound | quote }}
ONCELOG_ACL_REFRESH_INTERVAL_MS: {{ include "oncelog.envValue" $sec.aclRefreshIntervalMs | quote }}
{{- end }}
{{- if $sec.oauth.enabled }}
{{- /* The token listener: every process serves one; each is told all of them. */}}
{{- $port := int .Values.ports.token }}
ONCELOG_TOKEN_LISTEN: {{ printf "%s:%d" (include "oncelog.hostForPort" .Values.listenHost) $port | quote }}
ONCELOG_TOKEN_STORES: {{ include "oncelog.addresses" (dict "root" . "key" "partitionStore" "port" $port) | quote }}
ONCELOG_TOKEN_COORDINATORS: {{ include "oncelog.coordinatorAddresses" (dict "root" . "key" "coordinator" "port" $port) | quote }}
ONCELOG_TOKEN_GROUP_COORDINATORS: {{ include "oncelog.coordinatorAddresses" (dict "root" . "key" "groupCoordinator" "port" $port) | quote }}
ONCELOG_OAUTH_ISSUERS: {{ printf "%s/issuers.json" (include "oncelog.oauthDir" .) | quote }}
{{- with $sec.oauth.audience }}
ONCELOG_OAUTH_AUDIENCE: {{ . | quote }}
{{- end }}
ONCELOG_OAUTH_SUB_CLAIM: {{ $sec.oauth.subClaim | quote }}
ONCELOG_OAUTH_LEEWAY_S: {{ include "oncelog.envValue" $sec.oauth.leewaySeconds | quote }}
{{- end }}
{{- end }}

{{/*
Kafka's operations by resource type (AclEntry.supportedOperations, as
services/common/security/authorizer.py has them), keyed by the lower-case
name without separators, with Kafka's spelling, which `oncelog acls`
takes: "cluster_action", "ClusterAction" and "clusteraction" are all
ClusterAction.
*/}}
{{- define "oncelog.aclVocabulary" -}}
resourceTypes:
  topic: topic
  group: group
  transactionalid: transactional-id
  cluster: cluster
operations:
  all: All
  read: Read
  write: Write
  create: Create
  delete: Delete
  alter: Alter
  describe: Describe
  clusteraction: ClusterAction
  describeconfigs: DescribeConfigs
  alterconfigs: AlterConfigs
  idempotentwrite: IdempotentWrite
  twophasecommit: TwoPhaseCommit
allowed:
  topic: [All, Read, Write, Create, Delete, Alter, Describe, DescribeConfigs, AlterConfigs]
  group: [All, Read, Describe, Delete]
  transactional-id: [All, Write, Describe, TwoPhaseCommit]
  cluster: [All, Create, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, Alter, Describe]
{{- end }}

{{/* The key of a name in the vocabulary: lower case, no "_", "-" or spaces. */}}
{{- define "oncelog.aclKey" -}}
{{- . | toString | lower | replace "_" "" | replace "-" "" | replace " " "" }}
{{- end }}

{{/*
The arguments of `oncelog acls add` for one entry of security.acls, as a
YAML list; fails naming the entry when it cannot mean anything. Call with
(dict "acl" ENTRY "index" N). Kafka's vocabulary: --allow-principal or
--deny-principal, --allow-host/--deny-host when the host is not "*",
--operation, the resource (--topic NAME, --group NAME, --transactional-id
NAME, --cluster) and --resource-pattern-type.
*/}}
{{- define "oncelog.aclAddArgs" -}}
{{- $vocabulary := include "oncelog.aclVocabulary" . | fromYaml }}
{{- $acl := .acl }}
{{- $where := printf "security.acls[%d]" (int .index) }}
{{- $type := get $vocabulary.resourceTypes (include "oncelog.aclKey" $acl.resourceType) }}
{{- if not $type }}
{{- fail (printf "%s: unknown resourceType %q (topic, group, transactional_id or cluster)" $where (toString $acl.resourceType)) }}
{{- end }}
{{- $operation := get $vocabulary.operations (include "oncelog.aclKey" $acl.operation) }}
{{- if not $operation }}
{{- fail (printf "%s: unknown operation %q" $where (toString $acl.operation)) }}
{{- end }}
{{- if not (has $operation (get $vocabulary.allowed $type)) }}
{{- fail (printf "%s: %s is not an operation of the %s resource (it has %s)" $where $operation $type (join ", " (get $vocabulary.allowed $type))) }}
{{- end }}
{{- $permission := lower (default "allow" $acl.permission) }}
{{- $pattern := lower (default "literal" $acl.patternType) }}
{{- $host := default "*" $acl.host }}
{{- if eq $type "cluster" }}
{{- if and $acl.resourceName (ne $acl.resourceName "oncelog-cluster") }}
{{- fail (printf "%s: the cluster resource is named oncelog-cluster, not %q" $where $acl.resourceName) }}
{{- end }}
{{- if ne $pattern "literal" }}
{{- fail (printf "%s: the cluster resource is bound literally only" $where) }}
{{- end }}
{{- else if not $acl.resourceName }}
{{- fail (printf "%s: a %s ACL needs resourceName (%q with patternType literal is every %s)" $where $type "*" $type) }}
{{- end }}
- acls
- add
- {{ printf "--%s-principal" $permission }}
- {{ $acl.principal | quote }}
{{- if ne $host "*" }}
- {{ printf "--%s-host" $permission }}
- {{ $host | quote }}
{{- end }}
- --operation
- {{ $operation }}
- {{ printf "--%s" $type }}
{{- if ne $type "cluster" }}
- {{ $acl.resourceName | quote }}
{{- end }}
- --resource-pattern-type
- {{ $pattern }}
{{- end }}

{{/*
Settings that cannot work together fail the install with a message naming
them (the schema checks each value alone). Rendered by configmap.yaml.
*/}}
{{- define "oncelog.securityChecks" -}}
{{- $sec := .Values.security }}
{{- if and (eq $sec.authorizer "acl") (not $sec.tls.enabled) }}
{{- fail "security.authorizer=acl needs security.tls.enabled=true: principals come from client certificates and bearer tokens, which travel over TLS only. For plain text set security.authorizer=none too." }}
{{- end }}
{{- if and $sec.oauth.enabled (not $sec.tls.enabled) }}
{{- fail "security.oauth.enabled needs security.tls.enabled=true: bearer tokens travel over TLS only" }}
{{- end }}
{{- if eq (int .Values.ports.token) (int .Values.ports.grpc) }}
{{- fail "ports.token must differ from ports.grpc: the token listener is a second port" }}
{{- end }}
{{- if and $sec.oauth.enabled (not $sec.oauth.issuers) }}
{{- fail "security.oauth.enabled needs at least one entry in security.oauth.issuers" }}
{{- end }}
{{- if and (eq $sec.authorizer "acl") (not (has $sec.servicePrincipal $sec.superUsers)) }}
{{- fail (printf "security.superUsers must include security.servicePrincipal (%s): the services' calls to each other (markers, replication, internal topics, __acls itself) need it before any ACL can exist" $sec.servicePrincipal) }}
{{- end }}
{{- if and $sec.acls (ne $sec.authorizer "acl") }}
{{- fail "security.acls needs security.authorizer=acl: without an authorizer the cluster refuses ACL calls (SECURITY_DISABLED)" }}
{{- end }}
{{- if and $sec.tls.certManager.enabled (not $sec.tls.enabled) }}
{{- fail "security.tls.certManager.enabled needs security.tls.enabled=true" }}
{{- end }}
{{- if and $sec.tls.enabled $sec.tls.certManager.enabled (not $sec.tls.certManager.issuerRef.name) }}
{{- fail "security.tls.certManager.enabled needs security.tls.certManager.issuerRef.name: the cert-manager Issuer or ClusterIssuer that signs the certificates" }}
{{- end }}
{{- range $index, $acl := $sec.acls }}
{{- $_ := include "oncelog.aclAddArgs" (dict "acl" $acl "index" $index) }}
{{- end }}
{{- end }}
