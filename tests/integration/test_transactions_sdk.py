"""Transaction administration through the SDK against real processes.

Goal: the admin tools find a hanging transaction (one no coordinator
knows), abort it with a marker, and the last stable offset moves on; and
Admin.abort_transaction aborts an open transaction and fences its producer.
What a transactional producer and a read_committed consumer guarantee —
visibility of committed and aborted transactions, an open transaction
holding read_committed readers, interleaved producers, fencing by a second
instance or by the transaction timeout — is the client contract, tested
against the threaded and the asyncio client alike in
test_client_contract.py.

Method: LocalCluster (one partition store, one coordinator, no group
coordinator) with real processes; topics read back with
tests/support/reading.read_all; waits are bounded loops on observable state,
never timed assertions. The hanging transaction needs the store's test-only
--unsafe-skip-txn-verification and a raw transactional Produce.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from oncelog import Admin, Consumer, ConsumerRecord, Producer, TopicPartition, errors
from oncelog import records as codec
from oncelog.testing import LocalCluster
from oncelog.v1 import partition_store_pb2, partition_store_pb2_grpc
from tests.support.polling import wait_until
from tests.support.reading import read_all

PARTITIONS = 3
_ids = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("txn") / "cluster",
                      group_coordinators=0) as c:
        yield c


@pytest.fixture
def topic(cluster: LocalCluster, topic_name: str) -> str:
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS)
    return topic_name


def tid() -> str:
    return f"tx-{next(_ids)}"


def values(records: list[ConsumerRecord]) -> list[bytes]:
    return sorted(r.value or b"" for r in records)


def end_offsets(bootstrap: str, tp: TopicPartition, isolation_level: str) -> int:
    with Consumer(bootstrap=bootstrap, isolation_level=isolation_level) as c:
        return c.end_offsets([tp])[tp]


def _raw_transactional_produce(address: str, topic: str, partition: int, producer_id: int,
                               values_: list[bytes]) -> None:
    batch = codec.encode_batch(
        [(None, v, None, int(time.time() * 1000)) for v in values_],
        producer_id=producer_id, producer_epoch=0, base_sequence=0, transactional=True,
    )
    with grpc.insecure_channel(address) as channel:
        resp = partition_store_pb2_grpc.PartitionStoreStub(channel).Produce(
            partition_store_pb2.ProduceRequest(
                batches=[partition_store_pb2.PartitionBatch(topic=topic, partition=partition,
                                                            batch=batch)],
                transactional_id="never-initialized", timeout_ms=10_000),
            timeout=30)
    assert resp.results[0].error.code == 0, resp.results[0].error


def test_admin_finds_and_aborts_a_hanging_transaction(tmp_path: Path, topic_name: str) -> None:
    with LocalCluster(tmp_path / "cluster", group_coordinators=0, extra_args={
        "partition_store": ["--unsafe-skip-txn-verification"],
    }) as cluster, Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS)
        tp = TopicPartition(topic_name, 2)
        rogue_pid = 9_000_000  # never handed out by the coordinator
        _raw_transactional_produce(cluster.bootstrap, topic_name, 2, rogue_pid,
                                   [b"hung-1", b"hung-2"])
        # A healthy transaction, open at the same time, is not hanging.
        transactional_id = tid()
        with Producer(bootstrap=cluster.bootstrap, transactional_id=transactional_id) as good:
            good.init_transactions()
            good.begin_transaction()
            good.send(topic_name, value=b"good", partition=0).result(timeout=60)
            with Producer(bootstrap=cluster.bootstrap) as plain:
                plain.send(topic_name, value=b"after", partition=2).result(timeout=60)

            listed = {t.transactional_id: t for t in admin.list_transactions()}
            assert listed[transactional_id].state == "Ongoing"
            assert listed[transactional_id].producer_id == good.producer_id
            described = admin.describe_transaction(transactional_id)
            assert described.partitions == (TopicPartition(topic_name, 0),)
            assert described.producer_epoch == good.producer_epoch
            assert described.transaction_timeout_ms == 60_000

            [state] = [s for s in admin.describe_producers(tp) if s.producer_id == rogue_pid]
            assert state.current_txn_start_offset == 0
            assert end_offsets(cluster.bootstrap, tp, "read_committed") == 0

            [hanging] = admin.find_hanging_transactions()
            assert (hanging.topic_partition, hanging.producer_id) == (tp, rogue_pid)
            assert hanging.current_txn_start_offset == 0
            assert admin.find_hanging_transactions(topics=[topic_name]) == [hanging]

            admin.abort_hanging_transaction(tp, rogue_pid)
            # The last stable offset moved past the aborted data (and its marker).
            assert end_offsets(cluster.bootstrap, tp, "read_committed") == 4
            assert admin.find_hanging_transactions() == []
            [state] = [s for s in admin.describe_producers(tp) if s.producer_id == rogue_pid]
            assert state.current_txn_start_offset is None
            good.commit_transaction()
        committed = read_all(cluster.bootstrap, topic_name, PARTITIONS,
                             isolation_level="read_committed")
        assert values(committed) == [b"after", b"good"]


def test_admin_abort_transaction_fences_the_producer(cluster: LocalCluster, topic: str) -> None:
    transactional_id = tid()
    with Producer(bootstrap=cluster.bootstrap, transactional_id=transactional_id) as producer, \
            Admin(bootstrap=cluster.bootstrap) as admin:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, value=b"stuck", partition=0).result(timeout=60)
        aborted = admin.abort_transaction(transactional_id)
        assert aborted.producer_epoch > producer.producer_epoch
        with pytest.raises((errors.ProducerFencedError, errors.InvalidProducerEpochError)):
            producer.commit_transaction()
        wait_until("the abort completed", lambda: admin.describe_transaction(
            transactional_id).state == "CompleteAbort")
    assert read_all(cluster.bootstrap, topic, PARTITIONS, isolation_level="read_committed") == []
