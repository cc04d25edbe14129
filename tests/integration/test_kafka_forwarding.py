"""The Kafka listener's forwarding of the transaction APIs to the coordinator.

Goal: AddPartitionsToTxn and EndTxn, which the listener forwards to the
transaction coordinator over gRPC (services/kafka/rpc/forward.py), answer
as Kafka's broker would: the coordinator's own refusal with its code, a
coordinator that cannot be reached with COORDINATOR_NOT_AVAILABLE (Kafka's
clients look the coordinator up again and retry), and once it is back the
same transaction goes through.

Method: one store with its Kafka listener and one transaction coordinator,
raw Kafka requests over a socket (tests/support/kafka_wire.py: kio's
classes, not ours): InitProducerId, AddPartitionsToTxn, Produce and EndTxn
of a one-record transaction; the coordinator killed (kill -9) and started
again in between; then the record read back read_committed.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog import Admin, Consumer, TopicPartition
from oncelog.testing import LocalCluster
from tests.support.kafka_wire import KafkaSocket, batch, request_class
from tests.support.polling import wait_until

PRODUCE, INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, END_TXN = 0, 22, 24, 26
# Kafka's error numbers.
NONE = 0
COORDINATOR_NOT_AVAILABLE = 15
INVALID_PRODUCER_ID_MAPPING = 49
TOPIC = "forwarded"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data_dir: Path = tmp_path_factory.mktemp("kafka-forwarding")
    with LocalCluster(str(data_dir), kafka_listener=True) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=1)
        probe = KafkaSocket(cluster.kafka_bootstrap.split(",")[0])
        try:
            # Until then the coordinator answers COORDINATOR_LOAD_IN_PROGRESS.
            wait_until("the transaction coordinator loaded",
                       lambda: _init_code(probe, "probe") == NONE)
        finally:
            probe.close()
        yield cluster


@pytest.fixture
def kafka(cluster: LocalCluster) -> Iterator[KafkaSocket]:
    sock = KafkaSocket(cluster.kafka_bootstrap.split(",")[0])
    yield sock
    sock.close()


def _init_answer(sock: KafkaSocket, transactional_id: str) -> Any:
    return sock.request(request_class(INIT_PRODUCER_ID, 4)(
        transactional_id=transactional_id,
        transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1))


def _init_code(sock: KafkaSocket, transactional_id: str) -> int:
    return int(_init_answer(sock, transactional_id).error_code.value)


def _init(sock: KafkaSocket, transactional_id: str) -> tuple[int, int]:
    answer = _init_answer(sock, transactional_id)
    assert int(answer.error_code.value) == NONE
    return int(answer.producer_id), int(answer.producer_epoch)


def _add_partition(sock: KafkaSocket, transactional_id: str, producer_id: int,
                   producer_epoch: int) -> int:
    request = request_class(ADD_PARTITIONS_TO_TXN, 3)
    classes = sys.modules[request.__module__]
    answer = sock.request(request(
        v3_and_below_transactional_id=transactional_id,
        v3_and_below_producer_id=producer_id, v3_and_below_producer_epoch=producer_epoch,
        v3_and_below_topics=(classes.AddPartitionsToTxnTopic(name=TOPIC, partitions=(0,)),)))
    [topic] = answer.results_by_topic_v3_and_below
    [partition] = topic.results_by_partition
    return int(partition.partition_error_code.value)


def _end_txn(sock: KafkaSocket, transactional_id: str, producer_id: int,
             producer_epoch: int, *, commit: bool) -> int:
    answer = sock.request(request_class(END_TXN, 3)(
        transactional_id=transactional_id, producer_id=producer_id,
        producer_epoch=producer_epoch, committed=commit))
    return int(answer.error_code.value)


def _produce(sock: KafkaSocket, transactional_id: str, records: bytes) -> int:
    request = request_class(PRODUCE, 9)
    classes = sys.modules[request.__module__]
    answer: Any = sock.request(request(
        transactional_id=transactional_id, acks=-1, timeout=datetime.timedelta(seconds=10),
        topic_data=(classes.TopicProduceData(name=TOPIC, partition_data=(
            classes.PartitionProduceData(index=0, records=records),)),)))
    [topic] = answer.responses
    [partition] = topic.partition_responses
    return int(partition.error_code.value)


def test_the_coordinators_refusal_keeps_its_code(kafka: KafkaSocket) -> None:
    # A transactional id the coordinator has never seen: refused as a whole.
    assert _end_txn(kafka, "never-initialized", 4242, 0,
                    commit=True) == INVALID_PRODUCER_ID_MAPPING
    assert _add_partition(kafka, "never-initialized", 4242, 0) == INVALID_PRODUCER_ID_MAPPING


def test_an_unreachable_coordinator_is_coordinator_not_available_then_it_works_again(
        cluster: LocalCluster, kafka: KafkaSocket) -> None:
    tid = "forwarded-txn"
    producer_id, epoch = _init(kafka, tid)
    assert _add_partition(kafka, tid, producer_id, epoch) == NONE
    cluster.kill("coordinator", 0)
    try:
        # Both calls are answered with the code Kafka's clients retry on.
        assert _end_txn(kafka, tid, producer_id, epoch,
                        commit=True) == COORDINATOR_NOT_AVAILABLE
        assert _add_partition(kafka, tid, producer_id, epoch) == COORDINATOR_NOT_AVAILABLE
    finally:
        cluster.restart("coordinator", 0)
    # Back: the transaction goes on (the coordinator may need a moment to
    # load its partition; its answer until then is retriable).
    wait_until("AddPartitionsToTxn answered after the coordinator's restart",
               lambda: _add_partition(kafka, tid, producer_id, epoch) == NONE, deadline_s=30)
    records = batch([b"once"], producer_id=producer_id, producer_epoch=epoch,
                    base_sequence=0, transactional=True)
    assert _produce(kafka, tid, records) == NONE
    assert _end_txn(kafka, tid, producer_id, epoch, commit=True) == NONE
    with Consumer(bootstrap=cluster.bootstrap) as consumer:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        seen: list[bytes | None] = []

        def read() -> bool:
            seen.extend(r.value for r in consumer.poll(timeout=0.5))
            return bool(seen)

        wait_until("the committed record read back", read, deadline_s=30)
        assert seen == [b"once"]
