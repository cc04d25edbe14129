{{/*
The StatefulSet of one component; call with (dict "root" $ "key" ...).

Every component is a StatefulSet, stateful or not: the ordinal is the
process's node id and the pod's DNS name under the headless Service is its
advertised address, so the layout is fixed by the values alone. The
coordinators have no volume and are started in parallel: any pod can be
deleted at any moment and its replacement (same ordinal, same name) takes
its partitions back by replaying the internal topic.
*/}}
{{- define "oncelog.statefulset" -}}
{{- $root := .root }}
{{- $values := get $root.Values .key }}
{{- $c := include "oncelog.component" . | fromYaml }}
{{- $name := include "oncelog.componentName" . }}
{{- $persistent := and $c.stateful $values.persistence.enabled }}
{{- $security := $root.Values.security }}
{{- $tls := $security.tls.enabled }}
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "oncelog.componentLabels" . | nindent 4 }}
spec:
  replicas: {{ $values.replicas }}
  serviceName: {{ include "oncelog.headlessName" . }}
  podManagementPolicy: {{ $values.podManagementPolicy }}
  {{- with $values.updateStrategy }}
  updateStrategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $persistent }}
  persistentVolumeClaimRetentionPolicy:
    {{- toYaml $values.persistence.retentionPolicy | nindent 4 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "oncelog.componentSelectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "oncelog.componentLabels" . | nindent 8 }}
        {{- with $values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        {{- /* A changed layout or setting rolls the pods that read it. */}}
        checksum/cluster-config: {{ include "oncelog.clusterEnvChecksum" $root }}
        checksum/component-config: {{ include "oncelog.componentEnvChecksum" . }}
        {{- if $security.oauth.enabled }}
        {{- /* The issuers are read at start-up. */}}
        checksum/oauth-issuers: {{ include "oncelog.oauthIssuersJson" $root | sha256sum }}
        {{- end }}
        {{- with $values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "oncelog.serviceAccountName" $root }}
      automountServiceAccountToken: {{ $root.Values.serviceAccount.automountServiceAccountToken }}
      terminationGracePeriodSeconds: {{ $values.terminationGracePeriodSeconds }}
      {{- with $root.Values.image.pullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      {{- with $values.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      {{- if $values.affinity }}
      affinity:
        {{- toYaml $values.affinity | nindent 8 }}
      {{- else if eq $values.podAntiAffinity "soft" }}
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "oncelog.componentSelectorLabels" . | nindent 20 }}
      {{- else if eq $values.podAntiAffinity "hard" }}
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - topologyKey: kubernetes.io/hostname
              labelSelector:
                matchLabels:
                  {{- include "oncelog.componentSelectorLabels" . | nindent 18 }}
      {{- end }}
      {{- with $values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $values.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ $c.name }}
          image: {{ include "oncelog.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: [{{ $root.Values.image.python | quote }}, "-m", {{ $c.module | quote }}]
          env:
            {{- /*
            The node id is the StatefulSet ordinal, which Kubernetes puts in
            the pod-index label; the process finds its own entry of the
            layout (its advertised address) by that index.
            */}}
            - name: ONCELOG_NODE_ID
              valueFrom:
                fieldRef:
                  fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
            {{- if $tls }}
            {{- /* The TLS probe verifies the server under the pod's DNS name. */}}
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            {{- end }}
            {{- with $values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          envFrom:
            - configMapRef:
                name: {{ include "oncelog.fullname" $root }}-cluster
            - configMapRef:
                name: {{ $name }}-config
          ports:
            - name: grpc
              containerPort: {{ $root.Values.ports.grpc }}
              protocol: TCP
            {{- if $security.oauth.enabled }}
            - name: token
              containerPort: {{ $root.Values.ports.token }}
              protocol: TCP
            {{- end }}
            {{- if include "oncelog.kafkaListener" . }}
            - name: kafka
              containerPort: {{ $root.Values.ports.kafka }}
              protocol: TCP
            {{- end }}
            {{- if $root.Values.metrics.enabled }}
            - name: metrics
              containerPort: {{ $root.Values.ports.metrics }}
              protocol: TCP
            {{- end }}
          {{- /*
          Plain text: Kubernetes' grpc probe, which takes a port number, not a
          port name, so it is given the number of the container port named
          "grpc". With TLS: that probe cannot be used (the kubelet dials gRPC
          probes in plain text, without TLS settings), so an exec probe runs
          files/grpc_health_probe.py with the image's Python, which dials
          loopback with the pod's own certificate and verifies the server
          under the pod's DNS name. Either way the empty service name asks
          for the server's overall health; a store's readiness asks whether
          it is in sync (the component's readinessService).
          */}}
          {{- $headless := include "oncelog.headlessName" . }}
          {{- $loopback := ternary "::1" "127.0.0.1" (contains ":" $root.Values.listenHost) }}
          {{- $tlsDir := include "oncelog.tlsDir" $root }}
          {{- range $probe := list "startup" "readiness" "liveness" }}
          {{- $p := get $values.probes $probe }}
          {{- $service := ternary ($c.readinessService | default "") "" (eq $probe "readiness") }}
          {{- if $p.enabled }}
          {{ $probe }}Probe:
            {{- if $tls }}
            exec:
              command:
                - {{ $root.Values.image.python | quote }}
                - {{ printf "%s/%s" (include "oncelog.probeDir" $root) (include "oncelog.probeScript" $root) | quote }}
                - --host
                - {{ $loopback | quote }}
                - --port
                - {{ $root.Values.ports.grpc | quote }}
                - --server-name-suffix
                - {{ printf ".%s.%s.svc.%s" $headless $root.Release.Namespace $root.Values.clusterDomain | quote }}
                - --ca-file
                - {{ printf "%s/ca.crt" $tlsDir | quote }}
                - --cert-file
                - {{ printf "%s/tls.crt" $tlsDir | quote }}
                - --key-file
                - {{ printf "%s/tls.key" $tlsDir | quote }}
                - --timeout-s
                - {{ max 1 (sub (int $p.timeoutSeconds) 1) | quote }}
                {{- with $service }}
                - --service
                - {{ . | quote }}
                {{- end }}
            {{- else }}
            grpc:
              port: {{ $root.Values.ports.grpc }}
              service: {{ $service | quote }}
            {{- end }}
            initialDelaySeconds: {{ $p.initialDelaySeconds }}
            periodSeconds: {{ $p.periodSeconds }}
            timeoutSeconds: {{ $p.timeoutSeconds }}
            failureThreshold: {{ $p.failureThreshold }}
            successThreshold: {{ $p.successThreshold }}
          {{- end }}
          {{- end }}
          {{- with $values.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            {{- toYaml $root.Values.containerSecurityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- if $c.stateful }}
            - name: data
              mountPath: {{ $values.persistence.mountPath }}
            {{- end }}
            {{- if $tls }}
            - name: tls
              mountPath: {{ include "oncelog.tlsDir" $root }}
              readOnly: true
            - name: probe
              mountPath: {{ include "oncelog.probeDir" $root }}
              readOnly: true
            {{- end }}
            {{- if $security.oauth.enabled }}
            - name: oauth
              mountPath: {{ include "oncelog.oauthDir" $root }}
              readOnly: true
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: {{ $root.Values.tmpSizeLimit }}
        {{- if $tls }}
        {{- /*
        The whole Secret is mounted (never with subPath), so Kubernetes
        replaces the files in place when cert-manager renews them and the
        process picks them up without a restart.
        */}}
        - name: tls
          {{- include "oncelog.certificateVolume" (dict "root" $root "secret" (include "oncelog.tlsSecretName" .)) | nindent 10 }}
        - name: probe
          configMap:
            name: {{ include "oncelog.fullname" $root }}-probe
            defaultMode: 292
        {{- end }}
        {{- if $security.oauth.enabled }}
        - name: oauth
          {{- include "oncelog.oauthVolume" $root | nindent 10 }}
        {{- end }}
        {{- if and $c.stateful (not $persistent) }}
        - name: data
          emptyDir: {}
        {{- end }}
  {{- if $persistent }}
  volumeClaimTemplates:
    - apiVersion: v1
      kind: PersistentVolumeClaim
      metadata:
        name: data
        labels:
          {{- include "oncelog.componentSelectorLabels" . | nindent 10 }}
        {{- with $values.persistence.annotations }}
        annotations:
          {{- toYaml . | nindent 10 }}
        {{- end }}
      spec:
        accessModes:
          {{- toYaml $values.persistence.accessModes | nindent 10 }}
        {{- with $values.persistence.storageClass }}
        storageClassName: {{ if eq . "-" }}""{{ else }}{{ . }}{{ end }}
        {{- end }}
        resources:
          requests:
            storage: {{ $values.persistence.size }}
  {{- end }}
{{- end }}
