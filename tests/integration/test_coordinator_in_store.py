"""A transaction coordinator that runs in a partition store's process.

Goal: with `--transaction-coordinator` (LocalCluster(coordinators_in_stores=
True)) the coordinator's calls to the store that runs it — appends to
`__transaction_state`, markers — and the store's verification of a
transaction's first write with it take no gRPC, while what they do is
unchanged; and killing that process (which takes both) loses nothing that
was committed and leaves no transaction open. The client contract itself
runs against this placement too (test_client_contract.py); the flag's
misuses are refused before the store starts, for this flag and for
`--group-coordinator` (whose calls test_group_coordinator_in_store.py
checks), and each kind's placement rule matches the layout's.
LocalCluster places one kind in the stores and the other in processes of
its own when asked (`coordinators_in_stores=("coordinator",)`), names the
store that runs a key's coordinator, and refuses names that are no
coordinator kind.

Method: LocalCluster with real processes; which calls crossed gRPC is read
from the services' RPC interceptor counters on the store's metrics port
(every message of a request stream counts); a transaction left open by a
kill -9 is ended by its successor's init_transactions.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from oncelog import Admin, Consumer, Producer, TopicPartition
from oncelog.testing import LocalCluster
from oncelog.wire.placement import (
    CONSUMER_OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    store_of_coordinator,
    store_of_group_coordinator,
)
from services.common.metadata.cluster import ClusterLayout
from services.partition_store.server import build_parser, coordinator_node, group_coordinator_node
from tests.support.reading import read_all
from tests.support.store_metrics import rpc_requests

PARTITIONS = 2
TRANSACTIONS = 20


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", coordinators_in_stores=True) as c:
        yield c


def committed_values(cluster: LocalCluster, topic: str) -> list[bytes]:
    return sorted(r.value or b"" for r in read_all(
        cluster.bootstrap, topic, PARTITIONS, isolation_level="read_committed"))


def test_the_coordinator_and_its_store_call_each_other_without_grpc(
        cluster: LocalCluster, topic_name: str) -> None:
    assert cluster.processes["coordinator"] == []
    with pytest.raises(ValueError, match="coordinator 0 is no process of its own: it runs in "
                                         "partition store 0"):
        cluster.kill("coordinator", 0)
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS)
    with Producer(bootstrap=cluster.bootstrap, transactional_id="in-store") as producer:
        producer.init_transactions()
        for i in range(TRANSACTIONS):
            producer.begin_transaction()
            producer.send(topic_name, value=b"v%d" % i, partition=i % PARTITIONS)
            if i % 5 == 4:
                producer.abort_transaction()
            else:
                producer.commit_transaction()
    committed = sorted(b"v%d" % i for i in range(TRANSACTIONS) if i % 5 != 4)
    assert committed_values(cluster, topic_name) == committed

    # The client's own calls crossed gRPC into the process (its commits at
    # least: every one is an EndTxn)...
    assert rpc_requests(cluster, "TransactionCoordinator", "EndTxnStream") >= len(committed)
    # ...as did its produce requests: one per transaction at most (an
    # aborted one may have sent nothing) ...
    assert len(committed) <= rpc_requests(cluster, "PartitionStore", "ProduceStream") \
        <= TRANSACTIONS
    # ...but not the coordinator's appends to `__transaction_state` (two or
    # three per transaction, which would break that bound), its markers, or
    # the store's verification of each transaction's first write.
    for service, method in (("TransactionCoordinator", "AddPartitionsToTxnStream"),
                            ("TransactionCoordinator", "AddPartitionsToTxn"),
                            ("PartitionStore", "WriteTxnMarkersStream"),
                            ("PartitionStore", "WriteTxnMarkers")):
        assert rpc_requests(cluster, service, method) == 0, (service, method)


def test_kill_9_of_the_store_takes_its_coordinator_and_loses_nothing_committed(
        cluster: LocalCluster, topic_name: str) -> None:
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS)
    first = Producer(bootstrap=cluster.bootstrap, transactional_id="survivor")
    try:
        first.init_transactions()
        first.begin_transaction()
        first.send(topic_name, value=b"committed", partition=0)
        first.commit_transaction()
        first.begin_transaction()
        for p in range(PARTITIONS):
            first.send(topic_name, value=b"open-%d" % p, partition=p).result(timeout=60)
        cluster.kill("partition_store", 0)
    finally:
        first.close(timeout=1)
    cluster.restart("partition_store", 0)

    # The successor's init ends the open transaction (aborted: it was never
    # decided) before its own begins.
    with Producer(bootstrap=cluster.bootstrap, transactional_id="survivor") as successor:
        successor.init_transactions()
        successor.begin_transaction()
        successor.send(topic_name, value=b"successor", partition=1)
        successor.commit_transaction()
    assert committed_values(cluster, topic_name) == [b"committed", b"successor"]
    with Consumer(bootstrap=cluster.bootstrap, isolation_level="read_committed") as consumer:
        tps = [TopicPartition(topic_name, p) for p in range(PARTITIONS)]
        stable = consumer.end_offsets(tps)
    with Consumer(bootstrap=cluster.bootstrap) as consumer:
        # Nothing holds the last stable offset back: it is the log's end.
        assert consumer.end_offsets(tps) == stable


def _store_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["--node-id", "1", "--data-dir", "/nonexistent", *flags])


@dataclass(frozen=True)
class Kind:
    """A kind of coordinator a store can run, as the tests below ask it."""

    flag: str
    noun: str
    # The layout's field that lists this kind's addresses.
    addresses: str
    node: Callable[[argparse.Namespace, ClusterLayout, str], int | None]
    place: Callable[[int, int], int]
    topic: str
    owner: Callable[[ClusterLayout, int], int]

    def layout(self, stores: Sequence[str], coordinators: Sequence[str]) -> ClusterLayout:
        return ClusterLayout(stores=tuple(stores), **{self.addresses: tuple(coordinators)},
                             transaction_state_partitions=8, consumer_offsets_partitions=8)


KINDS = [
    Kind("--transaction-coordinator", "coordinator", "coordinators", coordinator_node,
         store_of_coordinator,
         TRANSACTION_STATE_TOPIC, ClusterLayout.coordinator_for_partition),
    Kind("--group-coordinator", "group coordinator", "group_coordinators",
         group_coordinator_node,
         store_of_group_coordinator, CONSUMER_OFFSETS_TOPIC,
         ClusterLayout.group_coordinator_for_partition),
]


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.flag)
def test_the_flag_names_a_coordinator_served_at_the_stores_own_address(
        kind: Kind, capsys: pytest.CaptureFixture[str]) -> None:
    layout = kind.layout(("s0:1", "s1:1"), ("s1:1", "s0:1"))
    assert kind.node(_store_args(kind.flag, "0"), layout, "s1:1") == 0
    assert kind.node(_store_args(kind.flag, "auto"), layout, "s0:1") == 1
    assert kind.node(_store_args(), layout, "s1:1") is None
    with pytest.raises(ValueError, match=f"names 2 {kind.noun}s"):
        kind.node(_store_args(kind.flag, "2"), layout, "s1:1")
    with pytest.raises(ValueError, match=f"gives that {kind.noun} the address s0:1, and this "
                                         "store's is s1:1"):
        kind.node(_store_args(kind.flag, "1"), layout, "s1:1")
    with pytest.raises(ValueError, match=f"names no {kind.noun} at this store's address s2:1"):
        kind.node(_store_args(kind.flag, "auto"), layout, "s2:1")
    with pytest.raises(SystemExit):
        _store_args(kind.flag, "first")
    assert "'first' is neither a coordinator node id nor 'auto'" in capsys.readouterr().err


def test_the_coordinators_own_flags_reach_them_through_the_stores() -> None:
    args = _store_args("--transaction-coordinator", "0", "--group-coordinator", "0",
                       "--transaction-check-interval-ms", "300",
                       "--min-session-timeout-ms", "500",
                       "--retention-check-interval-ms", "7000")
    assert (args.transaction_check_interval_ms, args.min_session_timeout_ms,
            args.retention_check_interval_ms) == (300, 500, 7000)


@pytest.mark.parametrize("process", ["coordinator", "group_coordinator"])
def test_local_cluster_refuses_flags_for_coordinator_processes_it_does_not_start(
        process: str, tmp_path: Path) -> None:
    # Dropped silently, such flags would leave the coordinators unconfigured.
    with pytest.raises(ValueError, match=f"extra_args names '{process}'.*"
                       r"go in extra_args\['partition_store'\]"):
        LocalCluster(tmp_path, coordinators_in_stores=True, start=False,
                     extra_args={process: ["--min-session-timeout-ms", "500"]})
    LocalCluster(tmp_path, coordinators_in_stores=True, start=False,
                 extra_args={"partition_store": ["--min-session-timeout-ms", "500"]})


@pytest.mark.parametrize("hosted", ["coordinator", "group_coordinator"])
def test_one_kind_in_the_stores_and_the_other_as_processes(hosted: str, tmp_path: Path) -> None:
    other = "group_coordinator" if hosted == "coordinator" else "coordinator"
    cluster = LocalCluster(tmp_path, partition_stores=3, coordinators_in_stores=(hosted,),
                           start=False, extra_args={other: ["--min-session-timeout-ms", "500"]})
    assert cluster.processes[hosted] == [] and len(cluster.processes[other]) == 1
    stores = {cluster.store_running(hosted, f"id-{i}") for i in range(40)}
    assert stores == {0, 1, 2}  # one coordinator in every store
    with pytest.raises(ValueError, match=f"run as processes of their own .*{other!r}"):
        cluster.store_running(other, "id-0")
    with pytest.raises(ValueError, match=f"extra_args names '{hosted}'"):
        LocalCluster(tmp_path, coordinators_in_stores=(hosted,), start=False,
                     extra_args={hosted: ["--min-session-timeout-ms", "500"]})


@pytest.mark.parametrize(("value", "error"), [
    (("transaction_coordinator",), ValueError), (("partition_store",), ValueError),
    ("coordinator", TypeError)])
def test_coordinators_in_stores_names_only_coordinator_kinds(
        value: object, error: type[Exception], tmp_path: Path) -> None:
    with pytest.raises(error, match="coordinators_in_stores"):
        LocalCluster(tmp_path, coordinators_in_stores=value, start=False)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.flag)
def test_each_store_runs_the_coordinator_of_the_partitions_it_prefers_to_lead(
        kind: Kind) -> None:
    for stores in (1, 2, 3, 5):
        hosts = [kind.place(c, stores) for c in range(stores)]
        assert sorted(hosts) == list(range(stores))
        layout = kind.layout([f"s{i}:1" for i in range(stores)], [f"s{h}:1" for h in hosts])
        for partition in range(8):
            assert hosts[kind.owner(layout, partition)] == layout.store_for(kind.topic,
                                                                            partition)
