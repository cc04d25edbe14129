"""Each row of the producer's error table does what its class says, against a real cluster.

Goal: `oncelog.errors.PRODUCER_ERROR_CLASSES` (KIP-1050's classes, printed in
docs/sdk.md) is not only a table: for every error code, a store answering a
transactional record's Produce with that code makes the producer behave as
the code's class promises:

* retriable — the record is retried and acknowledged once the store answers
  normally; the transaction commits with both records;
* abortable — the record's future fails with the code's exception; commit
  raises TransactionAbortableError naming the record; nothing is visible;
  abort_transaction() lets the same producer commit its next transaction;
* application-recoverable — the producer is finished (every call raises the
  code's ApplicationRecoverableError); a new producer with the same
  transactional id recovers and commits;
* fatal — the producer is finished with the code's FatalError, which is not
  application-recoverable.

DUPLICATE_SEQUENCE_NUMBER is the one code a Produce answer turns into
success (the batch was written before): that row checks the acknowledgement.

Method: one LocalCluster; the producer reaches it through a gRPC proxy mesh
(tests/support/grpc_proxy.py) whose `answer` hook replies to the Produce of
the row's record with the row's error code — always, or for a retriable code
only the first two times — while every other call goes to the real processes.
What is visible is read back with a read_committed consumer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from oncelog import Admin, Producer, errors
from oncelog import records as codec
from oncelog.errors import ErrorCode, ProducerErrorClass
from oncelog.testing import LocalCluster
from oncelog.v1 import errors_pb2
from oncelog.v1 import partition_store_pb2 as ps
from tests.support.grpc_proxy import PRODUCE, DropPolicy, ProxyMesh
from tests.support.reading import read_all

_ids = itertools.count()
POISON = b"row-record"
RETRIABLE_REFUSALS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("error-rows") / "cluster",
                      group_coordinators=0) as c:
        yield c


@pytest.fixture(scope="module")
def mesh(cluster: LocalCluster) -> Iterator[ProxyMesh]:
    with ProxyMesh.in_front_of(cluster, DropPolicy()) as m:
        yield m


def _carries_poison(batch: bytes) -> bool:
    return any(r.value == POISON for r in codec.iter_records(batch))


def refuse_poison(code: ErrorCode, times: int | None) -> Callable[[str, bytes], bytes | None]:
    """An answer hook: Produce requests carrying the row's record are answered
    with `code` for that record (`times` times, None: always)."""
    refused = itertools.count()

    def answer(method: str, request: bytes) -> bytes | None:
        if method != PRODUCE:
            return None
        produce = ps.ProduceRequest.FromString(request)
        poisoned = [b for b in produce.batches if _carries_poison(b.batch)]
        if not poisoned or (times is not None and next(refused) >= times):
            return None
        if len(poisoned) != len(produce.batches):
            raise AssertionError("the row's record shares a request with others")
        return ps.ProduceResponse(results=[
            ps.PartitionProduceResult(
                topic=b.topic, partition=b.partition, base_offset=-1,
                error=errors_pb2.Error(code=errors_pb2.ErrorCode.Value(code.name),
                                      message=f"{code.name} (injected)"),
            )
            for b in poisoned
        ]).SerializeToString()

    return answer


def _committed_values(cluster: LocalCluster, topic: str) -> list[bytes]:
    return sorted(r.value or b"" for r in read_all(cluster.bootstrap, topic, 1,
                                                   isolation_level="read_committed"))


ROWS = sorted(errors.PRODUCER_ERROR_CLASSES.items(), key=lambda row: row[0].name)


@pytest.mark.parametrize(("code", "cls"), ROWS, ids=[code.name for code, _ in ROWS])
def test_a_row_behaves_as_its_class(cluster: LocalCluster, mesh: ProxyMesh,
                                    code: ErrorCode, cls: ProducerErrorClass) -> None:
    topic = f"rows-{next(_ids)}"
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
    tid = f"row-{code.name.lower()}-{next(_ids)}"
    retriable = cls is ProducerErrorClass.RETRIABLE
    mesh.policy.answer = refuse_poison(code, RETRIABLE_REFUSALS if retriable else None)
    try:
        producer = Producer(bootstrap=mesh.bootstrap, transactional_id=tid, linger_ms=0,
                            retry_backoff_ms=10, retry_backoff_max_ms=50,
                            delivery_timeout_ms=20_000)
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, value=b"good", partition=0).result(timeout=30)
        poisoned = producer.send(topic, value=POISON, partition=0)
        failure = poisoned.exception(timeout=30)
        if code is ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
            # A Produce answer that says "written before, offset forgotten":
            # acknowledged (offset -1), as in Kafka, not an error.
            assert failure is None and poisoned.result().offset == -1
            producer.commit_transaction(timeout=30)
            producer.close()
            return
        if retriable:
            assert failure is None, failure
            producer.commit_transaction(timeout=30)
            producer.close()
            assert _committed_values(cluster, topic) == [b"good", POISON]
            return
        assert isinstance(failure, errors.OncelogError) and failure.code is code, failure
        if cls is ProducerErrorClass.ABORTABLE:
            assert producer.transaction_state == "abortable_error"
            with pytest.raises(errors.TransactionAbortableError,
                               match=f"record for {topic}-0"):
                producer.commit_transaction(timeout=30)
            producer.abort_transaction(timeout=30)
            producer.begin_transaction()
            producer.send(topic, value=b"next", partition=0)
            producer.commit_transaction(timeout=30)
            producer.close()
            assert _committed_values(cluster, topic) == [b"next"]
            return
        # The producer is finished, with the code's own error.
        assert producer.transaction_state == "fatal_error"
        with pytest.raises(errors.FatalError) as ended:
            producer.commit_transaction(timeout=30)
        assert ended.value.code is code
        recoverable = cls is ProducerErrorClass.APPLICATION_RECOVERABLE
        assert isinstance(ended.value, errors.ApplicationRecoverableError) == recoverable
        producer.close()
    finally:
        mesh.policy.answer = None
    assert _committed_values(cluster, topic) == []
    if recoverable:
        # What the class promises: a new producer with the same id goes on.
        with Producer(bootstrap=cluster.bootstrap, transactional_id=tid) as again:
            again.init_transactions()
            again.begin_transaction()
            again.send(topic, value=b"recovered", partition=0)
            again.commit_transaction(timeout=30)
        assert _committed_values(cluster, topic) == [b"recovered"]
