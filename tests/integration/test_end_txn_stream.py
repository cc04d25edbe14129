"""EndTxnStream against a real coordinator, raw and through the SDK's producer.

Goal: a commit over the stream keeps unary EndTxn's semantics, and the
producer's commit survives each way the stream can fail. Raw: each request
is answered under its own request_id, and one that fails as a whole (no
transactional id) is answered in the stream while the commit after it on
the same stream succeeds. SDK: a paused coordinator makes
commit_transaction(timeout) give up with KafkaTimeoutError within its
timeout (each attempt's request times out, its stream is dropped), and
calling it again after the coordinator resumes commits the transaction
once; a coordinator that serves no EndTxnStream (UNIMPLEMENTED, an older
version behind a proxy) gets unary EndTxn calls. A lost EndTxn answer on
the stream is tests/integration/test_lost_replies_txn.py's case.

Method: LocalCluster processes on loopback (one store, one coordinator, no
group coordinator), the generated stubs for the raw stream, the gRPC proxies
of tests/support/grpc_proxy.py for the coordinator without the stream, and
read_committed reads of what was committed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from oncelog import Admin, Producer
from oncelog.errors import KafkaTimeoutError
from oncelog.testing import LocalCluster
from oncelog.v1 import coordinator_pb2 as co
from oncelog.v1 import coordinator_pb2_grpc as co_grpc
from oncelog.v1 import records_pb2
from oncelog.wire.errors import ErrorCode
from tests.support.grpc_proxy import END_TXN, DropPolicy, ProxyMesh
from tests.support.polling import retrying, wait_until
from tests.support.reading import read_all

# How much longer than its timeout commit_transaction(timeout) may take to
# give up: one attempt's request timeout, plus a loaded machine's slack.
GIVE_UP_SLACK_S = 3.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("end-txn"), group_coordinators=0) as c:
        yield c


_ids = iter(range(1_000_000))


def new_topic(cluster: LocalCluster) -> str:
    name = f"end-txn-{next(_ids)}"
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=1)
    return name


def committed_values(cluster: LocalCluster, topic: str) -> list[bytes | None]:
    return [r.value for r in read_all(cluster.bootstrap, topic, 1,
                                      isolation_level="read_committed")]


def test_each_request_is_answered_by_id_and_a_bad_one_fails_alone(
        cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    transactional_id = f"raw-{topic}"
    with grpc.insecure_channel(cluster.address("coordinator")) as channel:
        stub = co_grpc.TransactionCoordinatorStub(channel)
        # A coordinator still loading its __transaction_state partition right
        # after start answers COORDINATOR_LOAD_IN_PROGRESS: retriable, retried.
        init = retrying(lambda: stub.InitProducerId(co.InitProducerIdRequest(
            transactional_id=transactional_id, transaction_timeout_ms=60_000), timeout=30))
        stub.AddPartitionsToTxn(co.AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=init.producer_id,
            producer_epoch=init.producer_epoch,
            partitions=[records_pb2.TopicPartition(topic=topic, partition=0)]), timeout=30)
        requests = [
            co.EndTxnRequest(request_id=21, commit=True),  # no transactional id
            co.EndTxnRequest(request_id=22, transactional_id=transactional_id,
                             producer_id=init.producer_id,
                             producer_epoch=init.producer_epoch, commit=True),
        ]
        answers = {a.request_id: a for a in stub.EndTxnStream(iter(requests), timeout=30)}

        def described() -> str:
            [txn] = stub.DescribeTransactions(co.DescribeTransactionsRequest(
                transactional_ids=[transactional_id]), timeout=30).transactions
            return txn.state

        wait_until("the transaction completes", lambda: described() == "CompleteCommit")
    assert sorted(answers) == [21, 22]
    assert ErrorCode.from_wire(answers[21].error.code) is ErrorCode.INVALID_REQUEST
    assert "transactional_id" in answers[21].error.message
    assert answers[22].error.code == 0
    # Transaction version 2: the answer carries the next transaction's epoch.
    assert (answers[22].producer_id, answers[22].producer_epoch) == (
        init.producer_id, init.producer_epoch + 1)


def test_a_paused_coordinator_times_the_commit_out_and_a_retry_commits_once(
        cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    with Producer(bootstrap=cluster.bootstrap, transactional_id=f"paused-{topic}",
                  linger_ms=0, request_timeout_ms=500) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, value=b"held", partition=0).result(timeout=30)
        cluster.pause("coordinator", 0)
        try:
            started_s = time.monotonic()
            with pytest.raises(KafkaTimeoutError):
                producer.commit_transaction(timeout=2)
            assert time.monotonic() - started_s < 2 + GIVE_UP_SLACK_S
        finally:
            cluster.resume("coordinator", 0)
        # The outcome was unknown; the same call again commits it.
        producer.commit_transaction(timeout=30)
        producer.begin_transaction()
        producer.send(topic, value=b"after", partition=0)
        producer.commit_transaction(timeout=30)
    assert committed_values(cluster, topic) == [b"held", b"after"]


def test_a_coordinator_without_the_stream_gets_unary_end_txn(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    with ProxyMesh.in_front_of(cluster, DropPolicy(refuse_streams=True)) as mesh, \
            Producer(bootstrap=mesh.bootstrap, transactional_id=f"unary-{topic}",
                     linger_ms=0) as producer:
        producer.init_transactions()
        for value in (b"one", b"two", b"three"):
            producer.begin_transaction()
            producer.send(topic, value=value, partition=0)
            producer.commit_transaction(timeout=30)
        # Every stream was refused, so these are unary EndTxn calls.
        assert mesh.policy.calls[END_TXN] == 3
    assert committed_values(cluster, topic) == [b"one", b"two", b"three"]
