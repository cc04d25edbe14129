"""Admin's transaction tools against the real coordinators and store.

Goal: list/describe/abort reach the right coordinator and translate its
answers; describe_producers shows each producer's open transaction; a
transaction open on a store that no coordinator knows (or open longer than
the maximum timeout) is found by find_hanging_transactions, a healthy open
one is not, and abort_hanging_transaction ends it with an ABORT marker whose
producer epoch is one above the producer's and whose coordinator epoch is the
one the store last saw, after which the last stable offset moves on.

Method: tests/support/inprocess_cluster.InProcessCluster (the real store and
coordinators in this process); the hanging transaction is a raw
transactional Produce with a producer id the coordinator never handed out,
accepted because the store runs with --unsafe-skip-txn-verification (which
skips the check only for requests that do not ask the store to add their
partitions: the SDK's producers are still verified).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from oncelog import Admin, Producer, TopicPartition, errors
from oncelog import records as codec
from oncelog.v1 import partition_store_pb2, partition_store_pb2_grpc
from tests.support.inprocess_cluster import InProcessCluster

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
ROGUE_PID = 777


@pytest.fixture
def store() -> Iterator[InProcessCluster]:
    with InProcessCluster(group_coordinator=False, unsafe_skip_txn_verification=True) as s:
        s.create_topic("t", 2)
        yield s


def rogue_transactional_write(store: InProcessCluster, partition: int, *, epoch: int = 3) -> None:
    """A transactional batch no coordinator knows about."""
    batch = codec.encode_batch([(None, b"rogue", None, int(time.time() * 1000))],
                               producer_id=ROGUE_PID, producer_epoch=epoch, base_sequence=0,
                               transactional=True)
    with grpc.insecure_channel(store.address) as channel:
        resp = partition_store_pb2_grpc.PartitionStoreStub(channel).Produce(
            partition_store_pb2.ProduceRequest(
                batches=[partition_store_pb2.PartitionBatch(topic="t", partition=partition,
                                                            batch=batch)],
                transactional_id="nobody"),
            timeout=10)
    assert resp.results[0].error.code == 0


def test_list_describe_and_abort(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address, transactional_id="copier-0") as producer, \
            Admin(bootstrap=store.address) as admin:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", value=b"x", partition=1).result(timeout=30)
        [listing] = admin.list_transactions()
        assert (listing.transactional_id, listing.state) == ("copier-0", "Ongoing")
        assert listing.producer_id == producer.producer_id
        assert admin.list_transactions(states=["CompleteCommit"]) == []
        d = admin.describe_transaction("copier-0")
        assert d.state == "Ongoing" and d.partitions == (TP1,)
        assert (d.producer_id, d.producer_epoch) == (producer.producer_id,
                                                     producer.producer_epoch)
        assert d.transaction_timeout_ms == 60_000 and d.transaction_start_time_ms > 0
        with pytest.raises(errors.TransactionalIdNotFoundError):
            admin.describe_transaction("nope")

        aborted = admin.abort_transaction("copier-0")
        assert aborted.producer_epoch == producer.producer_epoch + 1
        with pytest.raises(errors.ProducerFencedError):
            producer.commit_transaction()
        with pytest.raises(errors.InvalidTxnStateError):
            admin.abort_transaction("copier-0")
    assert store.committed_values("t", 1) == []


def test_describe_producers_shows_open_transactions(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address, transactional_id="a") as producer, \
            Admin(bootstrap=store.address) as admin:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", value=b"x", partition=0).result(timeout=30)
        [state] = admin.describe_producers(TP0)
        assert state.producer_id == producer.producer_id
        assert state.current_txn_start_offset == 0
        producer.commit_transaction()
        store.settle()  # the marker is written after EndTxn's answer
        [state] = admin.describe_producers(TP0)
        assert state.current_txn_start_offset is None
        assert admin.describe_producers(TP1) == []


def test_hanging_transactions_are_found_and_aborted(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address, transactional_id="healthy") as producer, \
            Admin(bootstrap=store.address) as admin:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", value=b"healthy", partition=0).result(timeout=30)
        rogue_transactional_write(store, 1)
        assert store.last_stable_offset("t", 1) == 0

        [hanging] = admin.find_hanging_transactions()
        assert (hanging.topic_partition, hanging.producer_id) == (TP1, ROGUE_PID)
        assert hanging.current_txn_start_offset == 0
        assert "no coordinator" in hanging.reason
        assert admin.find_hanging_transactions(topics=["t"]) == [hanging]

        admin.abort_hanging_transaction(TP1, ROGUE_PID)
        [marker] = [r for r in store.calls_named("WriteTxnMarkers")
                    if r.markers[0].producer_id == ROGUE_PID]
        m = marker.markers[0]
        assert (m.producer_id, m.producer_epoch, m.coordinator_epoch, m.type) == (
            ROGUE_PID, 4, -1, partition_store_pb2.ABORT)
        assert store.last_stable_offset("t", 1) == 2  # past the data and the marker
        assert admin.find_hanging_transactions() == []
        with pytest.raises(errors.InvalidTxnStateError, match="no open transaction"):
            admin.abort_hanging_transaction(TP1, ROGUE_PID)

        # Open longer than the maximum timeout: hanging although its coordinator
        # knows it (the coordinator should have aborted it long ago).
        time.sleep(0.05)
        [old] = admin.find_hanging_transactions(max_transaction_timeout_ms=10)
        assert (old.topic_partition, old.producer_id) == (TP0, producer.producer_id)
        assert "longer than max_transaction_timeout_ms" in old.reason
        producer.commit_transaction()
    assert store.committed_values("t", 0) == [b"healthy"]
    assert store.committed_values("t", 1) == []
