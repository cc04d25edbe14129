"""Transaction version 1 over gRPC, as the Kafka listener will drive it.

Goal: a producer initialized with transaction_version=1 runs two
transactions in a row on one producer id and epoch — EndTxn answers the
same ids both times, its sequence numbers go on from one transaction to the
next, each first write to the partition is verified by the store with the
coordinator — the first committed, the second aborted, and read_committed
returns exactly the first one's records. A transaction left open past its
timeout is aborted with an epoch bump, which fences the producer: its next
write and its EndTxn are refused as fenced. KIP-360: the producer recovers
with its own id and epoch, and a stranger's ids are fenced.

Method: a LocalCluster (one store, one coordinator, no group coordinator;
the coordinator checks timeouts every 100 ms), the generated stubs, batches
from oncelog.wire.records.encode_batch with the producer's id, epoch and
sequence, raw read_committed Fetch. Waits are bounded polls of what the
servers report (DescribeTransactions), never sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from oncelog import Admin
from oncelog.errors import ErrorCode
from oncelog.testing import LocalCluster
from oncelog.v1 import coordinator_pb2 as co
from oncelog.v1 import coordinator_pb2_grpc as co_grpc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.v1 import records_pb2
from oncelog.wire.records import encode_batch, iter_records, read_header
from oncelog.wire.status import error_from_rpc
from tests.support.polling import retrying, wait_until

TOPIC = "kafka-v1"
NOW_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("txn-v1"), group_coordinators=0,
                      extra_args={"coordinator": ["--transaction-check-interval-ms", "100"]},
                      ) as c, Admin(bootstrap=c.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=1)
        yield c


@pytest.fixture(scope="module")
def stubs(cluster: LocalCluster) -> Iterator[tuple[co_grpc.TransactionCoordinatorStub,
                                                   ps_grpc.PartitionStoreStub]]:
    with grpc.insecure_channel(cluster.address("coordinator")) as coordinator, \
            grpc.insecure_channel(cluster.address("partition_store")) as store:
        yield co_grpc.TransactionCoordinatorStub(coordinator), ps_grpc.PartitionStoreStub(store)


def _code(exc: grpc.RpcError) -> ErrorCode:
    return ErrorCode.from_wire(error_from_rpc(exc).code)


def _init(coordinator: co_grpc.TransactionCoordinatorStub, tid: str, timeout_ms: int,
          expected: tuple[int, int] | None = None) -> tuple[int, int]:
    request = co.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=timeout_ms,
                                       transaction_version=1)
    if expected is not None:
        request.producer_id, request.producer_epoch = expected
    reply = retrying(lambda: coordinator.InitProducerId(request, timeout=30))
    return reply.producer_id, reply.producer_epoch


def _add(coordinator: co_grpc.TransactionCoordinatorStub, tid: str, pid: int,
         epoch: int) -> None:
    retrying(lambda: coordinator.AddPartitionsToTxn(co.AddPartitionsToTxnRequest(
        transactional_id=tid, producer_id=pid, producer_epoch=epoch,
        partitions=[records_pb2.TopicPartition(topic=TOPIC, partition=0)]), timeout=30))


def _produce(store: ps_grpc.PartitionStoreStub, tid: str, pid: int, epoch: int, seq: int,
             *values: str) -> ps.PartitionProduceResult:
    batch = encode_batch([(None, v.encode(), None, NOW_MS) for v in values], producer_id=pid,
                         producer_epoch=epoch, base_sequence=seq, transactional=True)
    [result] = store.Produce(ps.ProduceRequest(
        batches=[ps.PartitionBatch(topic=TOPIC, partition=0, batch=batch)],
        transactional_id=tid, timeout_ms=10_000), timeout=30).results
    return result


def _end(coordinator: co_grpc.TransactionCoordinatorStub, tid: str, pid: int, epoch: int, *,
         commit: bool) -> tuple[int, int]:
    reply = retrying(lambda: coordinator.EndTxn(co.EndTxnRequest(
        transactional_id=tid, producer_id=pid, producer_epoch=epoch, commit=commit),
        timeout=30))
    return reply.producer_id, reply.producer_epoch


def _described(coordinator: co_grpc.TransactionCoordinatorStub,
               tid: str) -> co.TransactionDescription:
    [txn] = coordinator.DescribeTransactions(co.DescribeTransactionsRequest(
        transactional_ids=[tid]), timeout=30).transactions
    return txn


def _read_committed(store: ps_grpc.PartitionStoreStub) -> tuple[list[str], int, int]:
    """Every value read_committed returns from offset 0, where it ended, and
    the high watermark."""
    offset = 0
    values: list[str] = []
    while True:
        [result] = store.Fetch(ps.FetchRequest(
            partitions=[ps.FetchPartition(topic=TOPIC, partition=0, fetch_offset=offset)],
            isolation_level=records_pb2.READ_COMMITTED), timeout=30).results
        assert result.error.code == 0, result.error
        for data in result.batches:
            assert not read_header(data).is_control
            values.extend((r.value or b"").decode() for r in iter_records(data, min_offset=offset))
        if result.next_fetch_offset == offset:
            return values, offset, result.high_watermark
        offset = result.next_fetch_offset


def test_two_transactions_on_one_epoch_commit_then_abort(
        stubs: tuple[co_grpc.TransactionCoordinatorStub, ps_grpc.PartitionStoreStub]) -> None:
    coordinator, store = stubs
    tid = "kafka-app-a"
    pid, epoch = _init(coordinator, tid, 60_000)
    assert _described(coordinator, tid).transaction_version == 1

    _add(coordinator, tid, pid, epoch)
    first = _produce(store, tid, pid, epoch, 0, "a-1", "a-2")
    assert first.error.code == 0, first.error
    assert _end(coordinator, tid, pid, epoch, commit=True) == (pid, epoch)

    # The next transaction: same id and epoch, the sequence going on. The
    # add waits for the first transaction's marker; the store verifies the
    # first write again.
    _add(coordinator, tid, pid, epoch)
    second = _produce(store, tid, pid, epoch, 2, "b-1")
    assert second.error.code == 0, second.error
    assert _end(coordinator, tid, pid, epoch, commit=False) == (pid, epoch)

    wait_until("the abort completes",
               lambda: _described(coordinator, tid).state == "CompleteAbort")
    described = _described(coordinator, tid)
    assert (described.producer_id, described.producer_epoch) == (pid, epoch)
    values, end, high_watermark = _read_committed(store)
    assert [v for v in values if v[0] in "ab"] == ["a-1", "a-2"]
    assert end == high_watermark  # nothing left open
    # A retry of the abort succeeds with the same ids; a commit is refused.
    assert _end(coordinator, tid, pid, epoch, commit=False) == (pid, epoch)
    with pytest.raises(grpc.RpcError) as err:
        coordinator.EndTxn(co.EndTxnRequest(transactional_id=tid, producer_id=pid,
                                            producer_epoch=epoch, commit=True), timeout=30)
    assert _code(err.value) is ErrorCode.INVALID_TXN_STATE


def test_the_timeout_fences_the_producer_and_kip_360_recovers_only_its_own(
        stubs: tuple[co_grpc.TransactionCoordinatorStub, ps_grpc.PartitionStoreStub]) -> None:
    coordinator, store = stubs
    tid = "kafka-app-b"
    pid, epoch = _init(coordinator, tid, 1_000)
    _add(coordinator, tid, pid, epoch)
    written = _produce(store, tid, pid, epoch, 0, "late-1")
    assert written.error.code == 0, written.error

    def fenced_by_timeout() -> bool:
        txn = _described(coordinator, tid)
        return txn.state == "CompleteAbort" and txn.producer_epoch == epoch + 1

    wait_until("the coordinator aborts the transaction on its timeout", fenced_by_timeout)
    late = _produce(store, tid, pid, epoch, 1, "late-2")
    assert ErrorCode.from_wire(late.error.code) is ErrorCode.PRODUCER_FENCED
    with pytest.raises(grpc.RpcError) as err:
        coordinator.EndTxn(co.EndTxnRequest(transactional_id=tid, producer_id=pid,
                                            producer_epoch=epoch, commit=True), timeout=30)
    assert _code(err.value) is ErrorCode.PRODUCER_FENCED
    values, _end_offset, _hw = _read_committed(store)
    assert "late-1" not in values

    # KIP-360: a stranger naming old ids is fenced; the current ids recover.
    with pytest.raises(grpc.RpcError) as err:
        coordinator.InitProducerId(co.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=1_000, transaction_version=1,
            producer_id=pid, producer_epoch=epoch), timeout=30)
    assert _code(err.value) is ErrorCode.PRODUCER_FENCED
    assert _init(coordinator, tid, 60_000, expected=(pid, epoch + 1)) == (pid, epoch + 2)
    _add(coordinator, tid, pid, epoch + 2)
    again = _produce(store, tid, pid, epoch + 2, 0, "recovered")
    assert again.error.code == 0, again.error
    assert _end(coordinator, tid, pid, epoch + 2, commit=True) == (pid, epoch + 2)
    wait_until("the commit completes",
               lambda: _described(coordinator, tid).state == "CompleteCommit")
    assert "recovered" in _read_committed(store)[0]
