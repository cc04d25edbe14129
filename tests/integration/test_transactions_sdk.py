"""Transactions through the SDK against real processes.

Goal: what a user of Kafka's transactions relies on holds end to end —
a committed transaction is visible to read_committed consumers and an aborted
one never is (read_uncommitted sees both, neither sees control records); an
open transaction holds read_committed consumers below its first offset,
hiding later committed records of other producers until it ends; with
producers interleaved on one partition, read_committed returns exactly the
committed records at their original offsets; a second producer with the same
transactional id fences the first (its open transaction is aborted and its
next send and commit fail); a transaction the coordinator times out never
becomes visible and its producer is fenced; and the admin tools find a
hanging transaction (one no coordinator knows), abort it with a marker, and
the last stable offset moves on.

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
from oncelog._batching import RecordFuture
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


def send_or_error(producer: Producer, topic: str, value: bytes, partition: int
                  ) -> BaseException | None:
    """The error a send reports, whether send() raises it or its future does."""
    try:
        fut: RecordFuture = producer.send(topic, value=value, partition=partition)
    except errors.OncelogError as exc:
        return exc
    return fut.exception(timeout=60)


def test_committed_is_visible_aborted_is_not(cluster: LocalCluster, topic: str) -> None:
    with Producer(bootstrap=cluster.bootstrap, transactional_id=tid()) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        t1 = [b"t1-%d" % i for i in range(60)]
        for i, v in enumerate(t1):
            producer.send(topic, value=v, partition=i % PARTITIONS)
        producer.commit_transaction()
        producer.begin_transaction()
        t2 = [b"t2-%d" % i for i in range(60)]
        for i, v in enumerate(t2):
            producer.send(topic, value=v, partition=i % PARTITIONS)
        producer.flush()
        producer.abort_transaction()
    committed = read_all(cluster.bootstrap, topic, PARTITIONS, isolation_level="read_committed")
    assert values(committed) == sorted(t1)
    everything = read_all(cluster.bootstrap, topic, PARTITIONS)
    assert values(everything) == sorted(t1 + t2)
    # Each partition's log: T1's 20 records, its COMMIT marker (offset 20),
    # T2's 20 records, its ABORT marker (41). No reader saw a marker's offset.
    for p in range(PARTITIONS):
        tp = TopicPartition(topic, p)
        assert end_offsets(cluster.bootstrap, tp, "read_uncommitted") == 42
        assert end_offsets(cluster.bootstrap, tp, "read_committed") == 42
        assert sorted(r.offset for r in everything if r.partition == p) == [
            *range(20), *range(21, 41)]
        assert sorted(r.offset for r in committed if r.partition == p) == list(range(20))


def test_an_open_transaction_holds_read_committed_below_it(cluster: LocalCluster,
                                                           topic: str) -> None:
    tp = TopicPartition(topic, 0)
    with Producer(bootstrap=cluster.bootstrap, transactional_id=tid()) as slow, \
            Producer(bootstrap=cluster.bootstrap, transactional_id=tid()) as fast:
        slow.init_transactions()
        fast.init_transactions()
        slow.begin_transaction()
        first = slow.send(topic, value=b"slow", partition=0).result(timeout=60)
        fast.begin_transaction()
        later = [fast.send(topic, value=b"fast-%d" % i, partition=0) for i in range(5)]
        fast.commit_transaction()
        assert all(f.result().offset > first.offset for f in later)

        # The open transaction holds the last stable offset at its first offset:
        # the committed records after it stay invisible.
        assert end_offsets(cluster.bootstrap, tp, "read_committed") == first.offset
        with Consumer(bootstrap=cluster.bootstrap) as consumer:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            seen = []
            for _ in range(4):
                seen.extend(consumer.poll(timeout=0.25))
            assert seen == []
            assert consumer.position(tp) == 0
            slow.commit_transaction()

            def all_visible() -> bool:
                seen.extend(consumer.poll(timeout=0.5))
                return len(seen) >= 6

            wait_until("the records behind the transaction became visible", all_visible)
        assert [r.value for r in seen] == [b"slow"] + [b"fast-%d" % i for i in range(5)]


def test_interleaved_producers_commit_and_abort_on_one_partition(cluster: LocalCluster,
                                                                topic: str) -> None:
    with Producer(bootstrap=cluster.bootstrap, transactional_id=tid()) as aborter, \
            Producer(bootstrap=cluster.bootstrap, transactional_id=tid()) as committer:
        aborter.init_transactions()
        committer.init_transactions()
        aborter.begin_transaction()
        committer.begin_transaction()
        kept: dict[int, bytes] = {}
        for i in range(10):
            aborter.send(topic, value=b"drop-%d" % i, partition=1).result(timeout=60)
            meta = committer.send(topic, value=b"keep-%d" % i, partition=1).result(timeout=60)
            kept[meta.offset] = b"keep-%d" % i
        aborter.abort_transaction()
        committer.commit_transaction()
    committed = [r for r in read_all(cluster.bootstrap, topic, PARTITIONS,
                                     isolation_level="read_committed") if r.partition == 1]
    assert {r.offset: r.value for r in committed} == kept
    everything = [r for r in read_all(cluster.bootstrap, topic, PARTITIONS)
                  if r.partition == 1]
    assert len(everything) == 20


def test_a_second_instance_fences_the_first(cluster: LocalCluster, topic: str) -> None:
    transactional_id = tid()
    zombie = Producer(bootstrap=cluster.bootstrap, transactional_id=transactional_id)
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        for i in range(10):
            zombie.send(topic, value=b"zombie-%d" % i, partition=i % PARTITIONS)
        zombie.flush()
        with Producer(bootstrap=cluster.bootstrap,
                      transactional_id=transactional_id) as successor:
            successor.init_transactions()  # aborts the zombie's open transaction
            assert successor.producer_epoch > zombie.producer_epoch
            exc = send_or_error(zombie, topic, b"zombie-late", 0)
            assert isinstance(exc, errors.ProducerFencedError | errors.InvalidProducerEpochError)
            with pytest.raises((errors.ProducerFencedError, errors.InvalidProducerEpochError)):
                zombie.commit_transaction()
            successor.begin_transaction()
            successor.send(topic, value=b"successor", partition=0)
            successor.commit_transaction()
    finally:
        zombie.close()
    committed = read_all(cluster.bootstrap, topic, PARTITIONS, isolation_level="read_committed")
    assert values(committed) == [b"successor"]


def test_a_timed_out_transaction_is_aborted_and_its_producer_fenced(tmp_path: Path,
                                                                    topic_name: str) -> None:
    with LocalCluster(tmp_path / "cluster", group_coordinators=0, extra_args={
        "coordinator": ["--transaction-check-interval-ms", "100"],
    }) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(topic_name, partitions=PARTITIONS)
            transactional_id = tid()
            with Producer(bootstrap=cluster.bootstrap, transactional_id=transactional_id,
                          transaction_timeout_ms=2000) as producer:
                producer.init_transactions()
                producer.begin_transaction()
                for i in range(10):
                    producer.send(topic_name, value=b"late-%d" % i, partition=i % PARTITIONS)
                producer.flush()
                wait_until("the coordinator aborted the transaction", lambda: admin
                           .describe_transaction(transactional_id).state == "CompleteAbort")
                exc = send_or_error(producer, topic_name, b"later", 0)
                assert isinstance(exc, errors.ProducerFencedError
                                  | errors.InvalidProducerEpochError)
                with pytest.raises((errors.ProducerFencedError,
                                    errors.InvalidProducerEpochError)):
                    producer.commit_transaction()
        committed = read_all(cluster.bootstrap, topic_name, PARTITIONS,
                             isolation_level="read_committed")
        assert committed == []
        assert len(read_all(cluster.bootstrap, topic_name, PARTITIONS)) == 10


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
