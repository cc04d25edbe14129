"""The values the chart is checked with: the defaults and variations that
take every branch of the templates at least once (security included: plain
text, cert-manager, bearer tokens, initial ACLs, a shared Secret; the
stores' Kafka listener)."""

from __future__ import annotations

from typing import Any

METRICS_ON: dict[str, Any] = {
    "metrics": {
        "enabled": True,
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "dashboards": {"enabled": True, "annotations": {"grafana_folder": "oncelog"}},
    }
}
METRICS_OFF: dict[str, Any] = {"metrics": {"enabled": False}}

# cert-manager issues every certificate; bearer tokens besides certificates
# (so client certificates are requested, not required); initial ACLs of
# every resource type, pattern type and permission.
SECURED_WITH_EVERYTHING: dict[str, Any] = {
    "security": {
        "tls": {
            "clientAuth": "requested",
            "reloadIntervalMs": 30_000,
            "certManager": {
                "enabled": True,
                "issuerRef": {"name": "oncelog-ca", "kind": "Issuer"},
                "duration": "720h",
                "renewBefore": "240h",
                "privateKey": {"algorithm": "RSA", "size": 4096, "encoding": "PKCS8"},
                "extraDnsNames": ["oncelog.example.com"],
            },
        },
        "superUsers": ["User:oncelog-service", "User:ops"],
        "adminClient": {"commonName": "ops"},
        "aclRefreshIntervalMs": 500,
        "allowEveryoneIfNoAclFound": True,
        "oauth": {
            "enabled": True,
            "issuers": [
                {"issuer": "https://login.example.com/",
                 "configMap": {"name": "oidc-keys", "key": "login.pem"}},
                {"issuer": "https://ci.example.com/",
                 "secret": {"name": "ci-issuer", "key": "public.pem"}},
            ],
            "audience": "oncelog",
            "subClaim": "client_id",
            "leewaySeconds": 10,
        },
        "acls": [
            {"principal": "User:ledger", "resourceType": "topic", "resourceName": "payments",
             "patternType": "literal", "operation": "read", "permission": "allow", "host": "*"},
            {"principal": "User:ledger", "resourceType": "group", "resourceName": "ledger-",
             "patternType": "prefixed", "operation": "Read"},
            {"principal": "User:copier", "resourceType": "transactional_id",
             "resourceName": "copier-", "patternType": "prefixed", "operation": "write"},
            {"principal": "User:copier", "resourceType": "cluster",
             "operation": "idempotent_write"},
            {"principal": "User:*", "resourceType": "topic", "resourceName": "__",
             "patternType": "prefixed", "operation": "all", "permission": "deny",
             "host": "10.0.0.7"},
        ],
        "aclJob": {"backoffLimit": 3, "timeoutMs": 60_000,
                   "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}},
    },
    "networkPolicy": {
        "clientLabels": {"team": "payments", "oncelog.io/client": "true"},
        "clientNamespaces": ["apps", "batch"],
        "extraFrom": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
        "metricsFrom": [],
    },
}

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    # Plain text, no authorizer: the trial setup the release notes warn about.
    "plain-text": {"security": {"tls": {"enabled": False}, "authorizer": "none"},
                   "networkPolicy": {"enabled": False}},
    "secured-with-everything": SECURED_WITH_EVERYTHING,
    # TLS from one shared Secret and a CA bundle from a ConfigMap (a
    # trust-manager Bundle), authentication without authorization, IPv6.
    "shared-secret-no-authorizer": {
        "listenHost": "::",
        "security": {"tls": {"secretName": "oncelog-tls",
                             "ca": {"configMapName": "oncelog-ca-bundle", "key": "bundle.pem"},
                             "certManager": {"enabled": True,
                                             "issuerRef": {"name": "vault"}}},
                     "authorizer": "none"},
    },
    "one-store": {"partitionStore": {"replicas": 1}},
    # The stores' Kafka listener, secured as the gRPC port is (TLS).
    "kafka-listener": {"partitionStore": {"kafka": {"enabled": True}}},
    # ... and in plain text, on a port of its own choosing.
    "kafka-plain-text": {"security": {"tls": {"enabled": False}, "authorizer": "none"},
                         "ports": {"kafka": 19092},
                         "partitionStore": {"kafka": {"enabled": True}}},
    "three-of-each": {
        "partitionStore": {"replicas": 3},
        "coordinator": {"replicas": 3},
        "groupCoordinator": {"replicas": 3},
    },
    # The transaction coordinators in the stores' processes: no pods of their own.
    "coordinators-in-stores": {
        "partitionStore": {"replicas": 3},
        "coordinator": {"inStores": True, "config": {"producer-id-block-size": 5000}},
    },
    # Both kinds of coordinators in the stores' processes: the stores alone.
    "all-coordinators-in-stores": {
        "partitionStore": {"replicas": 3},
        "coordinator": {"inStores": True},
        "groupCoordinator": {"inStores": True, "config": {"min-session-timeout-ms": 500}},
    },
    "metrics-on": METRICS_ON,
    "metrics-off": METRICS_OFF,
    "no-group-coordinator-no-persistence": {
        "groupCoordinator": {"enabled": False},
        "partitionStore": {"persistence": {"enabled": False}},
    },
    # The stores use an etcd that exists already: the chart runs none.
    "external-etcd": {
        "etcd": {"external": {"endpoints": ["etcd-0.infra:2379", "etcd-1.infra:2379",
                                           "etcd-2.infra:2379"]}},
    },
    # A one-member etcd for a trial: no volume, no NetworkPolicy, no PDB.
    "trial-etcd": {
        "partitionStore": {"replicas": 1},
        "etcd": {"replicas": 1, "persistence": {"enabled": False},
                 "networkPolicy": {"enabled": False}, "pdb": {"enabled": False},
                 "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                     {"weight": 1, "preference": {"matchExpressions": [
                         {"key": "example.com/disk", "operator": "In", "values": ["ssd"]}]}}]}}},
    },
    # Every optional branch of the pod template at once.
    "everything-set": {
        "image": {
            "digest": "sha256:" + "ab" * 32,
            "pullPolicy": "Always",
            "pullSecrets": ["registry-credentials"],
        },
        "listenHost": "::",
        "commonLabels": {"team": "data"},
        "serviceAccount": {"create": False, "name": "oncelog-runner"},
        "service": {"type": "LoadBalancer", "annotations": {"example.com/lb": "internal"}},
        "partitionStore": {
            "podAntiAffinity": "hard",
            "config": {"fsync": True, "producer-id-expiration-ms": 86_400_000},
            "extraEnv": [{"name": "MALLOC_ARENA_MAX", "value": "2"}],
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "oncelog",
                             "effect": "NoSchedule"}],
            "topologySpreadConstraints": [{
                "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {
                    "matchLabels": {"app.kubernetes.io/component": "partition-store"},
                },
            }],
            "priorityClassName": "high-priority",
            "podAnnotations": {"example.com/owner": "data"},
            "podLabels": {"tier": "storage"},
            "pdb": {"maxUnavailable": "34%"},
            "kafka": {"enabled": True},
            "persistence": {
                "storageClass": "fast-ssd",
                "annotations": {"example.com/backup": "daily"},
                "retentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
            },
        },
        "coordinator": {
            "podAntiAffinity": "none",
            "probes": {"startup": {"enabled": False}},
            "pdb": {"enabled": False},
            "config": {"producer-id-block-size": 5000},
        },
        "groupCoordinator": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
            "updateStrategy": {"type": "OnDelete"},
            "podManagementPolicy": "OrderedReady",
            "config": {"offsets-retention-ms": 604_800_000},
        },
        "etcd": {
            "replicas": 5,
            "image": {"repository": "registry.k8s.io/etcd", "tag": "3.5.21-0",
                      "digest": "sha256:" + "cd" * 32, "pullPolicy": "Always"},
            "ports": {"client": 12379, "peer": 12380, "metrics": 12381},
            "autoCompactionRetention": "30m",
            "quotaBackendBytes": 4_294_967_296,
            "extraEnv": [{"name": "ETCD_SNAPSHOT_COUNT", "value": "10000"}],
            "resources": {"requests": {"cpu": "200m", "memory": "256Mi"},
                          "limits": {"memory": "1Gi"}},
            "probes": {"readiness": {"enabled": False}},
            "podAntiAffinity": "hard",
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "etcd",
                             "effect": "NoSchedule"}],
            "topologySpreadConstraints": [{
                "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "etcd"}},
            }],
            "priorityClassName": "high-priority",
            "podAnnotations": {"example.com/owner": "data"},
            "podLabels": {"tier": "metadata"},
            "pdb": {"maxUnavailable": 2},
            "persistence": {"storageClass": "-", "size": "2Gi",
                            "annotations": {"example.com/backup": "hourly"},
                            "retentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"}},
            "networkPolicy": {"metricsFrom": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "monitoring"}}}]},
        },
        **METRICS_ON,
    },
}
