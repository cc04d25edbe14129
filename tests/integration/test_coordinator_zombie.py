"""A paused and replaced transaction coordinator (a zombie) cannot verify a
fenced producer's first write, with real processes (issue 3).

Goal: the interleaving the simulation found, end to end: a coordinator that
was replaced while paused still answers the partition store's verification
question (AddPartitionsToTxn with verify_only) after it wakes. If it answered
from its stale memory, the old producer's first batch on a partition whose
store has meanwhile expired the producer would open a transaction there that
nobody ends (or that a later transaction's marker commits). It must refuse.

Method: a LocalCluster with one store (idle producers expire after 1 s,
retention runs every 100 ms) and one coordinator whose timer never runs, so
nothing it does on its own tells it that it lost the partition. A
transactional id opens a transaction on t-0 (raw AddPartitionsToTxn: nothing
written yet). The coordinator is SIGSTOPped; a replacement process for the
same node id (same layout, another listen address, as a supervisor would
start it) loads `__transaction_state` with a higher coordinator epoch and
aborts the transaction on its timeout: the ABORT marker lands on t-0, whose
store then forgets the idle producer. The zombie is resumed and the old
producer's first batch for t-0 arrives at the store, which asks the
coordinator at the layout's address: the zombie. Twice: as a client that
added the partition itself sends it (the store only verifies), and as the SDK
sends it (add_partitions_to_txn: the store asks the coordinator to add the
partition, which the zombie's memory says is already in the transaction, so
it writes nothing and must confirm its memory first). Waits poll real state with
generous deadlines (they fail the test instead of hanging it; nothing depends
on how fast anything is).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from oncelog import Admin, Consumer, TopicPartition
from oncelog.errors import ErrorCode
from oncelog.records import encode_batch
from oncelog.testing import LocalCluster, free_port
from oncelog.v1 import (
    coordinator_pb2,
    coordinator_pb2_grpc,
    partition_store_pb2,
    partition_store_pb2_grpc,
    records_pb2,
)
from oncelog.wire.process import grpc_port_taken
from oncelog.wire.status import error_from_rpc
from tests.support.reading import read_all

TOPIC = "t"
TID = "zombie-victim"
DEADLINE_S = 60.0
# Fresh ports the replacement coordinator tries when the picked one is taken.
PORT_ATTEMPTS = 5
T = TypeVar("T")


def _until(what: str, check: Callable[[], T | None]) -> T:
    give_up_at = time.monotonic() + DEADLINE_S
    while time.monotonic() < give_up_at:
        value = check()
        if value is not None:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not reached after {DEADLINE_S} s: {what}")


def _retrying(call: Callable[[], T]) -> T:
    """A coordinator call, retried while it answers a retriable error (still
    loading, say)."""
    def attempt() -> T | None:
        try:
            return call()
        except grpc.RpcError as exc:
            if ErrorCode.from_wire(error_from_rpc(exc).code).retriable:
                return None
            raise
    return _until("a coordinator call succeeds", attempt)


@contextmanager
def _replacement(cluster: LocalCluster) -> Iterator[str]:
    """A second coordinator process for node 0 on a new address, started
    while the first one is paused; yields its address once it serves there
    (on a fresh port when another process took the picked one first)."""
    old = cluster.processes["coordinator"][0]
    log_path = cluster.data_dir / "logs" / "coordinator-0-replacement.log"
    for attempt in range(1, PORT_ATTEMPTS + 1):
        address = f"127.0.0.1:{free_port()}"
        argv = [*old.argv, "--listen", address, "--metrics-port", "0",
                "--transaction-check-interval-ms", "100"]
        with open(log_path, "ab") as log_file:
            log_start = log_file.tell()
            process = subprocess.Popen(
                [sys.executable, "-m", "oncelog_local.child", str(os.getpid()), *argv],
                stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        if _serves(process, address, log_path, log_start):
            break
        process.wait()
        if attempt == PORT_ATTEMPTS:
            raise AssertionError(f"no free port for the replacement coordinator in "
                                 f"{PORT_ATTEMPTS} attempts")
    try:
        yield address
    finally:
        process.kill()
        process.wait()


def _serves(process: subprocess.Popen[bytes], address: str, log_path: Path,
            log_start: int) -> bool:
    """True once the process logs that it serves on `address`; False when it
    exits because another process holds that port."""
    def outcome() -> bool | None:
        with open(log_path, "rb") as log_file:
            log_file.seek(log_start)
            text = log_file.read().decode(errors="replace")
        if f"serving on {address}" in text:
            return True
        if process.poll() is not None:
            if grpc_port_taken(text, address):
                return False
            raise AssertionError(f"the replacement coordinator exited:\n{text}")
        return None
    return _until(f"the replacement coordinator serves on {address}", outcome)


@pytest.mark.parametrize("add_partitions_to_txn", [False, True],
                         ids=["verify_only", "add_partitions_to_txn"])
def test_a_replaced_coordinator_refuses_to_verify_after_waking(
        tmp_path: Path, add_partitions_to_txn: bool) -> None:
    with LocalCluster(
        tmp_path, partition_stores=1, coordinators=1, group_coordinators=0,
        transaction_state_partitions=1,
        extra_args={
            "partition_store": ["--producer-id-expiration-ms", "1000",
                                "--retention-check-interval-ms", "100"],
            "coordinator": ["--transaction-check-interval-ms", "3600000"],
        },
    ) as cluster, Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=1)
        with grpc.insecure_channel(cluster.address("coordinator", 0)) as channel:
            coordinator = coordinator_pb2_grpc.TransactionCoordinatorStub(channel)
            init = _retrying(lambda: coordinator.InitProducerId(
                coordinator_pb2.InitProducerIdRequest(
                    transactional_id=TID, transaction_timeout_ms=1000,
                    producer_id=-1, producer_epoch=-1),
                timeout=10))
            pid, epoch = init.producer_id, init.producer_epoch
            _retrying(lambda: coordinator.AddPartitionsToTxn(
                coordinator_pb2.AddPartitionsToTxnRequest(
                    transactional_id=TID, producer_id=pid, producer_epoch=epoch,
                    partitions=[records_pb2.TopicPartition(topic=TOPIC, partition=0)]),
                timeout=10))

        cluster.pause("coordinator", 0)
        with _replacement(cluster) as successor_address:
            # The replacement aborts the transaction on its timeout: the
            # ABORT marker (epoch + 1) creates the producer's entry on t-0 ...
            def marker_landed() -> bool | None:
                states = admin.describe_producers(TopicPartition(TOPIC, 0))
                return True if any(s.producer_id == pid and s.producer_epoch == epoch + 1
                                   for s in states) else None
            _until("the replacement's ABORT marker lands on t-0", marker_landed)
            # ... which the store forgets once the producer is idle.
            _until("the store expires the idle producer", lambda: True if not any(
                s.producer_id == pid
                for s in admin.describe_producers(TopicPartition(TOPIC, 0))) else None)
            with grpc.insecure_channel(successor_address) as channel:
                described = coordinator_pb2_grpc.TransactionCoordinatorStub(
                    channel).DescribeTransactions(
                        coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[TID]),
                        timeout=10).transactions[0]
            assert described.state == "CompleteAbort"

            cluster.resume("coordinator", 0)
            # The old instance's first batch for t-0 (its epoch, sequence 0).
            batch = encode_batch([(None, b"stale", None, int(time.time() * 1000))],
                                 producer_id=pid, producer_epoch=epoch, base_sequence=0,
                                 transactional=True)
            with grpc.insecure_channel(cluster.bootstrap) as channel:
                store = partition_store_pb2_grpc.PartitionStoreStub(channel)
                reply = store.Produce(partition_store_pb2.ProduceRequest(
                    batches=[partition_store_pb2.PartitionBatch(
                        topic=TOPIC, partition=0, batch=batch)],
                    transactional_id=TID, timeout_ms=10_000,
                    add_partitions_to_txn=add_partitions_to_txn), timeout=30)
            [result] = reply.results
            code = ErrorCode.from_wire(result.error.code)
            assert code is ErrorCode.NOT_COORDINATOR, (code, result.error.message)
            # Nothing was appended: the log holds the ABORT marker only, and
            # the store has no state (so no open transaction) for the producer.
            assert not any(s.producer_id == pid
                           for s in admin.describe_producers(TopicPartition(TOPIC, 0)))
            assert read_all(cluster.bootstrap, TOPIC, 1) == []
            with Consumer(bootstrap=cluster.bootstrap,
                          isolation_level="read_uncommitted") as consumer:
                assert consumer.end_offsets([TopicPartition(TOPIC, 0)]) == \
                    {TopicPartition(TOPIC, 0): 1}
