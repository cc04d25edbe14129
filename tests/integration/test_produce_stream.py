"""ProduceStream against real stores, raw and through the SDK's producer.

Goal: the stream keeps unary Produce's semantics and the producer survives
each way a stream can fail. Raw: every request is answered under its own
request_id; a request that fails as a whole is answered in the stream
(INVALID_REQUEST) and the requests after it on the same stream still
succeed; requests sent back to back are appended in the order they were
sent. SDK: a store that stops answering (paused) makes the request time out
at request_timeout_ms, the stream is dropped, and the record lands once
after the store resumes; a store that serves no ProduceStream
(UNIMPLEMENTED, an older version behind a proxy) gets unary Produce calls
and every record lands once; a store killed mid-stream ends the stream and
the records sent before and after the restart land once each.

Method: LocalCluster processes on loopback (one store, no group
coordinator), the generated stub for raw streams, the gRPC proxy of
tests/support/grpc_proxy.py for the store without streams. Nothing waits on
a clock to pass: the pause is lifted after the producer logged the timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from oncelog import Admin, Producer
from oncelog.testing import LocalCluster
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import encode_batch
from tests.support.grpc_proxy import PRODUCE, DropPolicy, LostReplyProxy
from tests.support.reading import read_all


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("stream"), group_coordinators=0) as c:
        yield c


_topic_ids = iter(range(1_000_000))


def new_topic(cluster: LocalCluster, partitions: int = 1) -> str:
    name = f"stream-{next(_topic_ids)}"
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=partitions)
    return name


def batch(value: bytes) -> bytes:
    return encode_batch([(None, value, None, int(time.time() * 1000))])


def request(request_id: int, topic: str, value: bytes) -> ps.ProduceRequest:
    return ps.ProduceRequest(request_id=request_id, timeout_ms=10_000, batches=[
        ps.PartitionBatch(topic=topic, partition=0, batch=batch(value))])


def test_each_request_is_answered_by_id_and_a_bad_one_fails_alone(
        cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    requests = [
        request(11, topic, b"first"),
        ps.ProduceRequest(request_id=12, timeout_ms=10_000),  # no batch: bad input
        request(13, topic, b"second"),
        ps.ProduceRequest(request_id=14, timeout_ms=10_000, batches=[
            ps.PartitionBatch(topic="no-such-topic", partition=0, batch=batch(b"x"))]),
    ]
    with grpc.insecure_channel(cluster.bootstrap) as channel:
        answers = {a.request_id: a for a in ps_grpc.PartitionStoreStub(channel)
                   .ProduceStream(iter(requests), timeout=30)}
    assert sorted(answers) == [11, 12, 13, 14]
    assert ErrorCode.from_wire(answers[12].error.code) is ErrorCode.INVALID_REQUEST
    assert "no batch" in answers[12].error.message
    assert not answers[12].results
    for ok in (11, 13):
        assert answers[ok].error.code == 0
        assert [r.error.code for r in answers[ok].results] == [0]
    assert sorted(answers[ok].results[0].base_offset for ok in (11, 13)) == [0, 1]
    [unknown] = answers[14].results
    assert ErrorCode.from_wire(unknown.error.code) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert [r.value for r in read_all(cluster.bootstrap, topic, 1)] == [b"first", b"second"]


def test_requests_sent_back_to_back_are_appended_in_order(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    count = 200
    requests = [request(i + 1, topic, b"%d" % i) for i in range(count)]
    with grpc.insecure_channel(cluster.bootstrap) as channel:
        answers = list(ps_grpc.PartitionStoreStub(channel)
                       .ProduceStream(iter(requests), timeout=60))
    offsets = {a.request_id: a.results[0].base_offset for a in answers}
    assert all(a.results[0].error.code == 0 for a in answers)
    assert [offsets[i + 1] for i in range(count)] == list(range(count))
    assert [r.value for r in read_all(cluster.bootstrap, topic, 1)] == [
        b"%d" % i for i in range(count)]


class _Seen(logging.Handler):
    """Sets `event` when a log line holds `text`."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def test_a_paused_store_times_the_request_out_and_the_record_lands_once(
        cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    seen = _Seen("no answer from")
    logger = logging.getLogger("oncelog.producer")
    level = logger.level
    logger.addHandler(seen)
    logger.setLevel(logging.DEBUG)
    try:
        with Producer(bootstrap=cluster.bootstrap, linger_ms=0, request_timeout_ms=500,
                      delivery_timeout_ms=60_000) as producer:
            producer.send(topic, value=b"before", partition=0).result(timeout=30)
            cluster.pause("partition_store", 0)
            try:
                future = producer.send(topic, value=b"held", partition=0)
                # The request's deadline passed and the producer said so.
                assert seen.event.wait(30), "the request never timed out"
                assert not future.done()
            finally:
                cluster.resume("partition_store", 0)
            assert future.result(timeout=30).offset == 1
            producer.send(topic, value=b"after", partition=0).result(timeout=30)
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
    assert [r.value for r in read_all(cluster.bootstrap, topic, 1)] == [
        b"before", b"held", b"after"]


def test_a_store_without_streams_gets_unary_produce(cluster: LocalCluster) -> None:
    topic = new_topic(cluster, partitions=2)
    with LostReplyProxy(cluster.bootstrap, DropPolicy(refuse_streams=True)) as proxy:
        with Producer(bootstrap=proxy.address, linger_ms=1) as producer:
            futures = [producer.send(topic, value=b"%d" % i, partition=i % 2)
                       for i in range(100)]
            producer.flush()
            assert all(f.result(timeout=30).offset >= 0 for f in futures)
        assert proxy.policy.calls[PRODUCE] >= 1
    values = sorted(int(r.value or b"") for r in read_all(cluster.bootstrap, topic, 2))
    assert values == list(range(100))


def test_a_store_killed_mid_stream_loses_and_duplicates_nothing(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    with LocalCluster(tmp_path_factory.mktemp("killed"), group_coordinators=0) as cluster:
        topic = new_topic(cluster, partitions=2)
        with Producer(bootstrap=cluster.bootstrap, linger_ms=1, request_timeout_ms=2_000,
                      delivery_timeout_ms=120_000) as producer:
            first = [producer.send(topic, value=b"%d" % i, partition=i % 2)
                     for i in range(500)]
            cluster.kill("partition_store", 0)
            cluster.restart("partition_store", 0)
            second = [producer.send(topic, value=b"%d" % i, partition=i % 2)
                      for i in range(500, 1000)]
            producer.flush()
            for future in first + second:
                future.result(timeout=60)
        values = sorted(int(r.value or b"")
                        for r in read_all(cluster.bootstrap, topic, 2))
    assert values == list(range(1000))
