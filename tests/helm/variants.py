"""The values the chart is checked with: the defaults and variations that
take every branch of the templates at least once."""

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

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "one-store": {"partitionStore": {"replicas": 1}},
    "three-of-each": {
        "partitionStore": {"replicas": 3},
        "coordinator": {"replicas": 3},
        "groupCoordinator": {"replicas": 3},
    },
    "metrics-on": METRICS_ON,
    "metrics-off": METRICS_OFF,
    "no-group-coordinator-no-persistence": {
        "groupCoordinator": {"enabled": False},
        "partitionStore": {"persistence": {"enabled": False}},
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
        **METRICS_ON,
    },
}
