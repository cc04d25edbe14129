{{/*
The headless Service of one component: (dict "root" $ "key" ...). It gives
each pod its stable DNS name <statefulset>-<ordinal>.<service>, which is the
address the pod advertises. publishNotReadyAddresses lets the processes find
each other while they start (a starting coordinator reads its internal topic
from stores that may not be ready yet). The "oncelog.io/job" label names the
Prometheus job of the targets found through it (see servicemonitor.yaml).
*/}}
{{- define "oncelog.headlessService" -}}
{{- $root := .root }}
{{- $c := include "oncelog.component" . | fromYaml }}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "oncelog.headlessName" . }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "oncelog.componentLabels" . | nindent 4 }}
    oncelog.io/job: {{ $c.job }}
spec:
  type: ClusterIP
  clusterIP: None
  publishNotReadyAddresses: true
  selector:
    {{- include "oncelog.componentSelectorLabels" . | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $root.Values.ports.grpc }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    {{- if $root.Values.security.oauth.enabled }}
    - name: token
      port: {{ $root.Values.ports.token }}
      targetPort: token
      protocol: TCP
      appProtocol: grpc
    {{- end }}
    {{- if include "oncelog.kafkaListener" . }}
    {{- /* No appProtocol: Kafka's protocol has no standard name for it. */}}
    - name: kafka
      port: {{ $root.Values.ports.kafka }}
      targetPort: kafka
      protocol: TCP
    {{- end }}
    {{- if $root.Values.metrics.enabled }}
    - name: metrics
      port: {{ $root.Values.ports.metrics }}
      targetPort: metrics
      protocol: TCP
      appProtocol: http
    {{- end }}
{{- end }}

{{/* The PodDisruptionBudget of one component: (dict "root" $ "key" ...). */}}
{{- define "oncelog.pdb" -}}
{{- $root := .root }}
{{- $values := get $root.Values .key }}
{{- if $values.pdb.enabled }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "oncelog.componentName" . }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "oncelog.componentLabels" . | nindent 4 }}
spec:
  maxUnavailable: {{ $values.pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "oncelog.componentSelectorLabels" . | nindent 6 }}
{{- end }}
{{- end }}
