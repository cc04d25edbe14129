"""Transactions on a real partition store process, through raw gRPC stubs.

Goal: the wire contract of the store's side of transactions — transactional
Produce (with the request's transactional_id), WriteTxnMarkers (commit,
abort, identical retry, zombie coordinator, delayed marker), read_committed
Fetch filtered on the server (LSO, no markers, no aborted batches, a
next_fetch_offset past what was filtered), ListOffsets latest under
READ_COMMITTED, DescribeProducers (open transaction's start offset,
coordinator epoch) — survives SIGKILL with an open transaction; and the
verification of a producer's first transactional write with a real gRPC
TransactionCoordinator (verify_only): accepted when it says so, refused
with its code when it does not, retriable when it is away.

Method: `python -m services.partition_store` in a subprocess (the
StoreProcess helper of test_store_grpc.py). The first tests run it with
`--unsafe-skip-txn-verification`, so no coordinator is needed (this is also
how hanging transactions are made on purpose). The last one runs it without
the flag against a tiny fake TransactionCoordinator: a grpc server on
127.0.0.1:0 in this process, passed with `--coordinators`, that answers
AddPartitionsToTxn(verify_only) from a table and records the questions.
Batches are encoded with oncelog.records; no assertion depends on timing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from oncelog.errors import ErrorCode
from oncelog.records import encode_batch, iter_records, read_header
from oncelog.testing import free_port
from oncelog.v1 import coordinator_pb2, errors_pb2, partition_store_pb2_grpc, records_pb2
from oncelog.v1 import partition_store_pb2 as pb
from oncelog.wire.status import error_from_rpc, error_proto
from services.partition_store.server import build_parser
from tests.integration.test_store_grpc import StoreProcess, create_topic

NOW_MS = 1_700_000_000_000
COMMITTED = records_pb2.READ_COMMITTED
UNCOMMITTED = records_pb2.READ_UNCOMMITTED
Stub = partition_store_pb2_grpc.PartitionStoreStub


def _code(error: errors_pb2.Error) -> ErrorCode:
    return ErrorCode.from_wire(error.code)


def txn_batch(pid: int, epoch: int, seq: int, *values: str, txn: bool = True) -> bytes:
    return encode_batch(
        [(b"k", v.encode(), None, NOW_MS) for v in values],
        producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=txn,
    )


def produce(stub: Stub, topic: str, data: bytes, tid: str) -> pb.PartitionProduceResult:
    [result] = stub.Produce(pb.ProduceRequest(
        batches=[pb.PartitionBatch(topic=topic, partition=0, batch=data)], transactional_id=tid,
    )).results
    return result


def marker(stub: Stub, topic: str, pid: int, epoch: int, kind: int, *,
           coordinator_epoch: int = 0) -> pb.MarkerPartitionResult:
    [result] = stub.WriteTxnMarkers(pb.WriteTxnMarkersRequest(markers=[pb.TxnMarker(
        producer_id=pid, producer_epoch=epoch, type=kind,  # type: ignore[arg-type]
        coordinator_epoch=coordinator_epoch, transactional_id="tx",
        partitions=[records_pb2.TopicPartition(topic=topic, partition=0)],
    )])).results
    return result


def read(stub: Stub, topic: str, isolation: int) -> tuple[list[str], int, int]:
    """(values a consumer loop reads from 0, where it ended, fetches used)."""
    offset, fetches = 0, 0
    values: list[str] = []
    while True:
        [result] = stub.Fetch(pb.FetchRequest(
            partitions=[pb.FetchPartition(topic=topic, partition=0, fetch_offset=offset)],
            isolation_level=isolation,  # type: ignore[arg-type]
        )).results
        fetches += 1
        assert result.error.code == 0, result.error
        for data in result.batches:
            assert not read_header(data).is_control
            values.extend((r.value or b"").decode() for r in iter_records(data, min_offset=offset))
        if result.next_fetch_offset == offset:
            return values, offset, fetches
        offset = result.next_fetch_offset


def latest(stub: Stub, topic: str, isolation: int) -> int:
    [result] = stub.ListOffsets(pb.ListOffsetsRequest(
        partitions=[pb.ListOffsetsPartition(topic=topic, partition=0, timestamp_ms=-1)],
        isolation_level=isolation,  # type: ignore[arg-type]
    )).results
    assert result.error.code == 0, result.error
    return result.offset


def producers(stub: Stub, topic: str) -> dict[int, pb.ProducerStateView]:
    [result] = stub.DescribeProducers(pb.DescribeProducersRequest(
        partitions=[records_pb2.TopicPartition(topic=topic, partition=0)]
    )).results
    return {p.producer_id: p for p in result.producers}


@pytest.fixture
def unverified_store(tmp_path: Path) -> Iterator[StoreProcess]:
    store = StoreProcess(tmp_path / "data", free_port(), ("--unsafe-skip-txn-verification",))
    try:
        store.start()
        yield store
    finally:
        store.kill()


def test_skip_flag_is_documented_as_test_only() -> None:
    help_text = " ".join(build_parser().format_help().split())
    assert "--unsafe-skip-txn-verification" in help_text
    assert "TEST ONLY" in help_text
    assert build_parser().parse_args([]).unsafe_skip_txn_verification is False


def test_commit_abort_and_read_committed_over_grpc(unverified_store: StoreProcess) -> None:
    stub = unverified_store.stub
    create_topic(stub, "ledger", partitions=1)

    assert produce(stub, "ledger", txn_batch(100, 0, 0, "a1", "a2"), "tx-a").error.code == 0
    assert produce(stub, "ledger", txn_batch(200, 0, 0, "p1", txn=False), "").error.code == 0
    # The open transaction (from 0) holds the LSO: nothing is committed yet.
    assert read(stub, "ledger", COMMITTED)[:2] == ([], 0)
    assert read(stub, "ledger", UNCOMMITTED)[:2] == (["a1", "a2", "p1"], 3)
    assert (latest(stub, "ledger", COMMITTED), latest(stub, "ledger", UNCOMMITTED)) == (0, 3)
    view = producers(stub, "ledger")[100]
    assert (view.current_txn_start_offset, view.coordinator_epoch) == (0, -1)

    committed = marker(stub, "ledger", 100, 1, pb.COMMIT, coordinator_epoch=7)
    assert committed.error.code == 0 and committed.offset == 3
    view = producers(stub, "ledger")[100]
    assert (view.producer_epoch, view.current_txn_start_offset, view.coordinator_epoch) == (
        1, -1, 7
    )
    assert read(stub, "ledger", COMMITTED)[:2] == (["a1", "a2", "p1"], 4)

    # The next transaction (epoch 1, sequences from 0) aborts.
    assert produce(stub, "ledger", txn_batch(100, 1, 0, "b1"), "tx-a").error.code == 0
    assert produce(stub, "ledger", txn_batch(200, 0, 1, "p2", txn=False), "").error.code == 0
    aborted = marker(stub, "ledger", 100, 2, pb.ABORT, coordinator_epoch=7)
    assert aborted.error.code == 0 and aborted.offset == 6
    values, end, _ = read(stub, "ledger", COMMITTED)
    assert (values, end) == (["a1", "a2", "p1", "p2"], 7)
    assert read(stub, "ledger", UNCOMMITTED)[:2] == (["a1", "a2", "p1", "b1", "p2"], 7)
    assert latest(stub, "ledger", COMMITTED) == 7
    # Fetching at the aborted batch: nothing returned, next offset past it.
    [result] = stub.Fetch(pb.FetchRequest(
        partitions=[pb.FetchPartition(topic="ledger", partition=0, fetch_offset=4,
                                      max_bytes=1)],
        isolation_level=COMMITTED,
    )).results
    assert (list(result.batches), result.next_fetch_offset) == ([], 5)

    # Identical retry: the original offset, nothing written.
    retry = marker(stub, "ledger", 100, 2, pb.ABORT, coordinator_epoch=7)
    assert (retry.error.code, retry.offset) == (0, 6)
    # A zombie coordinator and a delayed marker of the committed transaction.
    zombie = marker(stub, "ledger", 100, 3, pb.ABORT, coordinator_epoch=6)
    assert _code(zombie.error) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    delayed = marker(stub, "ledger", 100, 1, pb.COMMIT, coordinator_epoch=7)
    assert _code(delayed.error) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert latest(stub, "ledger", UNCOMMITTED) == 7

    # Bad input: a transactional batch without the request's transactional id;
    # an unknown partition in a marker; a marker request without markers.
    bad = produce(stub, "ledger", txn_batch(300, 0, 0, "x"), "")
    assert _code(bad.error) == ErrorCode.INVALID_REQUEST
    assert "transactional_id" in bad.error.message
    assert _code(marker(stub, "nope", 100, 3, pb.COMMIT, coordinator_epoch=7).error) == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.WriteTxnMarkers(pb.WriteTxnMarkersRequest())
    assert ErrorCode.from_wire(error_from_rpc(err.value).code) == ErrorCode.INVALID_REQUEST
    assert latest(stub, "ledger", UNCOMMITTED) == 7


def test_open_transaction_survives_sigkill(unverified_store: StoreProcess) -> None:
    """A hanging transaction made on purpose (no coordinator knows it): it
    holds the LSO across a kill -9 until a marker ends it."""
    stub = unverified_store.stub
    create_topic(stub, "hang", partitions=1)
    assert produce(stub, "hang", txn_batch(7, 0, 0, "h1"), "tx-h").error.code == 0
    assert produce(stub, "hang", txn_batch(8, 0, 0, "q1", txn=False), "").error.code == 0
    assert produce(stub, "hang", txn_batch(9, 0, 0, "c1"), "tx-c").error.code == 0
    assert marker(stub, "hang", 9, 1, pb.ABORT).error.code == 0
    unverified_store.kill()
    unverified_store.start()
    stub = unverified_store.stub
    assert read(stub, "hang", COMMITTED)[:2] == ([], 0)
    assert latest(stub, "hang", UNCOMMITTED) == 4
    assert producers(stub, "hang")[7].current_txn_start_offset == 0
    assert produce(stub, "hang", txn_batch(7, 0, 1, "h2"), "tx-h").error.code == 0
    assert marker(stub, "hang", 7, 1, pb.COMMIT).error.code == 0
    assert read(stub, "hang", COMMITTED)[:2] == (["h1", "q1", "h2"], 6)


# --------------------------------------------------- a fake coordinator


@dataclass
class FakeCoordinator:
    """Answers AddPartitionsToTxn(verify_only) from `ongoing`:
    transactional id -> (producer id, epoch, partitions); the only method of
    TransactionCoordinator it serves (the others answer UNIMPLEMENTED)."""

    ongoing: dict[str, tuple[int, int, set[tuple[str, int]]]] = field(default_factory=dict)
    questions: list[coordinator_pb2.AddPartitionsToTxnRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_partitions_to_txn(
        self, request: coordinator_pb2.AddPartitionsToTxnRequest, context: grpc.ServicerContext,
    ) -> coordinator_pb2.AddPartitionsToTxnResponse:
        with self.lock:
            self.questions.append(request)
        txn = self.ongoing.get(request.transactional_id)
        results = []
        for tp in request.partitions:
            if txn is None or txn[0] != request.producer_id:
                error = error_proto(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                                    f"{request.transactional_id!r} is not producer "
                                    f"{request.producer_id}")
            elif txn[1] != request.producer_epoch:
                error = error_proto(ErrorCode.PRODUCER_FENCED, "stale epoch")
            elif (tp.topic, tp.partition) not in txn[2]:
                error = error_proto(ErrorCode.INVALID_TXN_STATE,
                                    f"{tp.topic}-{tp.partition} was never added")
            else:
                error = error_proto(ErrorCode.NONE)
            results.append(coordinator_pb2.AddPartitionsToTxnResult(partition=tp, error=error))
        return coordinator_pb2.AddPartitionsToTxnResponse(results=results)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler("oncelog.v1.TransactionCoordinator", {
            "AddPartitionsToTxn": grpc.unary_unary_rpc_method_handler(
                self.add_partitions_to_txn,
                request_deserializer=coordinator_pb2.AddPartitionsToTxnRequest.FromString,
                response_serializer=coordinator_pb2.AddPartitionsToTxnResponse.SerializeToString,
            ),
        })


def test_verification_with_a_real_coordinator(tmp_path: Path) -> None:
    fake = FakeCoordinator()
    fake.ongoing["tx-ok"] = (300, 0, {("ledger", 0)})
    fake.ongoing["tx-elsewhere"] = (301, 0, {("other", 0)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((fake.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    store = StoreProcess(tmp_path / "data", free_port(),
                         ("--coordinators", f"127.0.0.1:{port}"))
    try:
        store.start()
        stub = store.stub
        create_topic(stub, "ledger", partitions=1)

        ok = produce(stub, "ledger", txn_batch(300, 0, 0, "ok"), "tx-ok")
        assert ok.error.code == 0 and ok.base_offset == 0
        [question] = fake.questions
        assert question.verify_only
        assert (question.transactional_id, question.producer_id, question.producer_epoch) == (
            "tx-ok", 300, 0
        )
        assert [(p.topic, p.partition) for p in question.partitions] == [("ledger", 0)]
        # The transaction is open here now: its next batch is not verified again.
        assert produce(stub, "ledger", txn_batch(300, 0, 1, "ok2"), "tx-ok").error.code == 0
        assert len(fake.questions) == 1

        refused = produce(stub, "ledger", txn_batch(301, 0, 0, "no"), "tx-elsewhere")
        assert _code(refused.error) == ErrorCode.INVALID_TXN_STATE
        for fragment in ("producer 301", "epoch 0", "ledger-0", "'tx-elsewhere'",
                         "was never added"):
            assert fragment in refused.error.message
        unknown = produce(stub, "ledger", txn_batch(302, 0, 0, "no"), "tx-unknown")
        assert _code(unknown.error) == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        assert latest(stub, "ledger", UNCOMMITTED) == 2
        assert set(producers(stub, "ledger")) == {300}

        # The coordinator goes away: a retriable refusal, the log unchanged.
        server.stop(None).wait()
        away = produce(stub, "ledger", txn_batch(303, 0, 0, "later"), "tx-later")
        assert _code(away.error) == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert away.error.retriable
        assert latest(stub, "ledger", UNCOMMITTED) == 2
    finally:
        store.kill()
        server.stop(None)
