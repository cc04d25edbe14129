"""LocalCluster when a port it picked is taken before its process binds it.

Goal: free_port's race (a port free when picked, taken by another process
before the service binds it) does not fail a cluster start. A process whose
metrics port is taken gets a fresh one and starts again alone; a process
whose gRPC port is taken gets a fresh address, and every process that was
started with the old layout starts again with the new one, so no running
process names the taken port and a transaction (store -> coordinator
verification, coordinator -> store markers) commits and reads back. The
retries are bounded and, when they run out, the error names the port and
nothing is left running. A restarted process keeps its address: while
another process holds that port, restart fails naming it; once the port is
free, the process comes back on the same address. A gRPC server of someone
else's that holds the port and answers health checks as SERVING is not taken
for our process being ready. A cluster given a data dir serves at the same
addresses (gRPC, metrics, token and Kafka listeners) at its next run of that
data dir, as the README promises; a kept port that another process holds by
then gets a fresh pick.

Method: the test holds a listening socket on a port and monkeypatches
free_port so that LocalCluster's n-th pick returns that port. Real service
processes, real SDK round trips; what each running process was told is read
from its /proc/PID/cmdline. No assertion depends on timing.
"""

from __future__ import annotations

import itertools
import socket
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from oncelog import Admin, Producer
from oncelog.testing import LocalCluster, PortTakenError
from oncelog_local import cluster as local_cluster
from oncelog_local import ports as local_ports
from tests.support.reading import read_all

# LocalCluster picks ports in layout order, gRPC address then metrics port:
# partition_store 0, then coordinator 0 (no group coordinator here).
STORE_METRICS_PICK = 1
COORDINATOR_GRPC_PICK = 2


@contextmanager
def held_port(port: int = 0) -> Iterator[int]:
    """A loopback port held by a listening socket of this test (SO_REUSEADDR,
    as a server binds, so a port in TIME_WAIT can be held too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield int(sock.getsockname()[1])


@contextmanager
def impostor_port() -> Iterator[int]:
    """A loopback port held by a gRPC server of this test that answers every
    health check with SERVING, as another cluster's service would."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2),
                         options=[("grpc.so_reuseport", 0)])
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(grace=None)


def hand_out(monkeypatch: pytest.MonkeyPatch, taken: dict[int, int]) -> None:
    """free_port returns taken[n] on its n-th call, a really free port otherwise."""
    real_free_port = local_ports.free_port
    picks = itertools.count()

    def free_port() -> int:
        return taken.get(next(picks)) or real_free_port()

    # LocalCluster's port book picks its ports (oncelog_local.ports).
    monkeypatch.setattr(local_ports, "free_port", free_port)


@contextmanager
def cluster_with_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       pick: int) -> Iterator[tuple[LocalCluster, int]]:
    """A started cluster (one store, one coordinator) whose `pick`-th port was
    held by another socket when its process first bound it; yields it and
    that port."""
    with held_port() as port:
        hand_out(monkeypatch, {pick: port})
        with LocalCluster(tmp_path, group_coordinators=0,
                          transaction_state_partitions=1) as cluster:
            yield cluster, port


def command_lines(cluster: LocalCluster) -> dict[str, str]:
    """What each running process was started with, as the kernel has it."""
    out = {}
    for procs in cluster.processes.values():
        for proc in procs:
            assert proc.alive(), f"{proc.kind} {proc.node_id} is not running"
            raw = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            out[f"{proc.kind} {proc.node_id}"] = raw.replace(b"\0", b" ").decode()
    return out


def transaction_round_trip(cluster: LocalCluster, topic: str, transactional_id: str) -> None:
    values = [b"%s-%d" % (transactional_id.encode(), i) for i in range(10)]
    with Producer(bootstrap=cluster.bootstrap, transactional_id=transactional_id) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for value in values:
            producer.send(topic, value=value, partition=0)
        producer.commit_transaction()
    got = read_all(cluster.bootstrap, topic, 1, isolation_level="read_committed")
    assert [r.value for r in got if (r.value or b"").startswith(transactional_id.encode())] \
        == values


def test_a_taken_grpc_port_moves_the_process_and_the_layout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with cluster_with_taken(tmp_path, monkeypatch, COORDINATOR_GRPC_PICK) as (cluster, port):
        moved_to = cluster.address("coordinator")
        assert moved_to != f"127.0.0.1:{port}"
        for name, cmdline in command_lines(cluster).items():
            assert f":{port}" not in cmdline, f"{name} still names the taken port"
            assert moved_to in cmdline, f"{name} was not told the coordinator's new address"
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic("moved", partitions=1)
        transaction_round_trip(cluster, "moved", "tx-before")

        # A restart keeps the address; a port taken meanwhile is an error.
        cluster.kill("coordinator")
        kept = int(moved_to.rsplit(":", 1)[1])
        with held_port(kept), pytest.raises(PortTakenError, match=f"port {kept}") as err:
            cluster.restart("coordinator")
        assert err.value.taken.port == kept
        cluster.restart("coordinator")
        assert cluster.address("coordinator") == moved_to
        transaction_round_trip(cluster, "moved", "tx-after")


def test_another_servers_health_answer_is_not_our_process_ready(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with impostor_port() as port:
        hand_out(monkeypatch, {COORDINATOR_GRPC_PICK: port})
        with LocalCluster(tmp_path, group_coordinators=0,
                          transaction_state_partitions=1) as cluster:
            # Our coordinator could not bind; it was moved, not believed ready.
            assert cluster.address("coordinator") != f"127.0.0.1:{port}"
            with Admin(bootstrap=cluster.bootstrap) as admin:
                admin.create_topic("impostor", partitions=1)
            transaction_round_trip(cluster, "impostor", "tx-impostor")


def test_a_taken_metrics_port_restarts_only_its_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with cluster_with_taken(tmp_path, monkeypatch, STORE_METRICS_PICK) as (cluster, port):
        url = cluster.metrics_url("partition_store")
        assert f":{port}/" not in url
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert b"oncelog_" in resp.read()
        assert f"--metrics-port {port} " not in command_lines(cluster)["partition_store 0"]
        # The coordinator's layout did not change, so it was started once.
        coordinator_log = cluster.processes["coordinator"][0].log_path.read_text()
        assert coordinator_log.count(" serving on ") == 1, coordinator_log
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic("plain", partitions=1)
        with Producer(bootstrap=cluster.bootstrap) as producer:
            producer.send("plain", value=b"hello", partition=0).result(timeout=30)
        assert [r.value for r in read_all(cluster.bootstrap, "plain", 1)] == [b"hello"]


def test_the_retries_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_cluster, "START_PORT_RETRIES", 1)
    with held_port() as first, held_port() as second:
        # The store's address, then its fresh address after the first failure
        # (pick 1 is its metrics port).
        hand_out(monkeypatch, {0: first, 2: second})
        # JSON logs: the service's one-line reason must be found there too.
        cluster = LocalCluster(tmp_path, coordinators=0, group_coordinators=0,
                               env={"ONCELOG_LOG_FORMAT": "json"}, start=False)
        with pytest.raises(RuntimeError, match="gave up after 1 fresh ports") as err:
            cluster.start()
        assert f"holds port {second}" in str(err.value)
        assert cluster.address("partition_store") == f"127.0.0.1:{second}"
        assert not cluster.processes["partition_store"][0].alive()


def _addresses(cluster: LocalCluster) -> dict[tuple[str, int], tuple[str, int, int, int]]:
    return {(p.kind, p.node_id): (p.address, p.metrics_port, p.token_port, p.kafka_port)
            for procs in cluster.processes.values() for p in procs}


def test_a_data_dir_keeps_its_addresses_across_runs(tmp_path: Path) -> None:
    data_dir = tmp_path / "kept"
    with LocalCluster(data_dir, kafka_listener=True) as first:
        layout = _addresses(first)
        with Admin(bootstrap=first.bootstrap) as admin:
            admin.create_topic("kept", partitions=1)
        with Producer(bootstrap=first.bootstrap) as producer:
            producer.send("kept", value=b"first run").result()
    with LocalCluster(data_dir, kafka_listener=True) as second:
        assert _addresses(second) == layout
        assert second.bootstrap == first.bootstrap
        assert second.kafka_bootstrap == first.kafka_bootstrap
        assert [r.value for r in read_all(second.bootstrap, "kept", 1)] == [b"first run"]


def test_a_kept_port_held_by_another_process_is_picked_again(tmp_path: Path) -> None:
    data_dir = tmp_path / "moved"
    with LocalCluster(data_dir, group_coordinators=0) as first:
        layout = _addresses(first)
    store_port = int(layout[("partition_store", 0)][0].rsplit(":", 1)[1])
    with held_port(store_port), LocalCluster(data_dir, group_coordinators=0) as second:
        moved = _addresses(second)
        assert moved[("partition_store", 0)][0] != f"127.0.0.1:{store_port}"
        # The others keep theirs.
        assert moved[("coordinator", 0)] == layout[("coordinator", 0)]
        with Admin(bootstrap=second.bootstrap) as admin:
            admin.create_topic("moved", partitions=1)
