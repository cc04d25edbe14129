"""A partition store process's metrics, as tests read them from its port."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from oncelog.testing import LocalCluster


def store_metric(cluster: LocalCluster, name: str, store: int = 0, **labels: str) -> float:
    """The first sample of `name` whose labels include `labels` (0 when the
    store has none)."""
    with urllib.request.urlopen(cluster.metrics_url("partition_store", store),
                                timeout=30) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return 0.0


def rpc_requests(cluster: LocalCluster, service: str, method: str, store: int = 0) -> float:
    """Requests of one method that crossed gRPC into a store's process
    (every message of a request stream counts; calls the process answers
    itself do not)."""
    return store_metric(cluster, "oncelog_rpc_requests_total", store,
                        service=service, method=method)
