"""The test harness's own servers when a port they picked is taken first.

Goal: free_port's race (a port free when picked, taken by another process
before the server binds it) does not fail the tests that start a store
process through StoreProcess, a Prometheus through PrometheusServer or the
zombie test's replacement coordinator: a first start moves to a fresh port
and serves there; a store restart keeps its address (what was stored and
told to clients names it) and fails, naming the port, while another process
holds it.

Method: the test holds a listening socket on the port the server was given.
Real store and Prometheus processes; no assertion depends on timing.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from oncelog.testing import LocalCluster, free_port
from tests.integration import test_coordinator_zombie
from tests.integration.test_local_cluster_ports import held_port
from tests.integration.test_store_grpc import StoreProcess
from tests.support.prometheus import PrometheusServer


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_store_whose_port_is_taken_starts_on_a_fresh_one(tmp_path: Path) -> None:
    with held_port() as taken:
        store = StoreProcess(tmp_path / "data", taken)
        try:
            store.start()
            assert store.port != taken
            assert _serving(store.address)
            # A restart keeps the address it served on.
            moved = store.port
            store.stop()
            store.start()
            assert store.port == moved
            assert _serving(store.address)
        finally:
            store.stop()


def test_a_restarted_store_keeps_its_port_and_names_it_when_taken(tmp_path: Path) -> None:
    store = StoreProcess(tmp_path / "data", free_port())
    try:
        store.start()
        port = store.port
        store.stop()
        with held_port(port), pytest.raises(
            Exception, match=f"cannot listen for gRPC on 127.0.0.1:{port}"
        ):
            store.start()
        assert store.port == port
    finally:
        store.stop()


def test_prometheus_whose_port_is_taken_starts_on_a_fresh_one(tmp_path: Path) -> None:
    with held_port() as taken:
        prometheus = PrometheusServer(tmp_path / "prometheus", {})
        prometheus.port = taken
        with prometheus:
            assert prometheus.port != taken
            assert prometheus.url == f"http://127.0.0.1:{prometheus.port}"
            assert prometheus.query("vector(1)")[0]["value"][1] == "1"


def test_the_replacement_coordinator_whose_port_is_taken_starts_on_a_fresh_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with LocalCluster(tmp_path, group_coordinators=0) as cluster, held_port() as taken:
        real_free_port = free_port
        picks = itertools.count()
        monkeypatch.setattr(test_coordinator_zombie, "free_port",
                            lambda: taken if next(picks) == 0 else real_free_port())
        cluster.pause("coordinator", 0)
        try:
            with test_coordinator_zombie._replacement(cluster) as address:
                assert address != f"127.0.0.1:{taken}"
                assert _serving(address)
        finally:
            cluster.resume("coordinator", 0)
