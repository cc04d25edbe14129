"""The SDK against real processes: admin, producer and consumer end to end.

Goal: what a user does first works as documented — create and describe
topics; produce keyed records and read them back in order per partition with
the offsets the futures reported; offsets queries; seek; a long poll that
returns when data arrives; errors at send time for oversized records and
unknown topics; delivery_timeout_ms when the store is down, and recovery once
it is back.

Method: a LocalCluster (one partition store, one coordinator, each its own
process) per module, one topic per test; the delivery-timeout test gets its own
cluster because it kills the store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog import Admin, Consumer, ConsumerRecord, NewTopic, Producer, TopicPartition, errors
from oncelog._partitioner import partition_for_key
from oncelog.testing import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # No group coordinator: this version of the SDK does not use one.
    with LocalCluster(tmp_path_factory.mktemp("sdk") / "cluster", group_coordinators=0) as c:
        yield c


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(bootstrap=cluster.bootstrap) as a:
        yield a


def read_until(consumer: Consumer, count: int, *, deadline_s: float = 60.0
               ) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    stop_at = time.monotonic() + deadline_s
    while len(out) < count and time.monotonic() < stop_at:
        out.extend(consumer.poll(timeout=0.5))
    return out


def test_admin_topics_lifecycle(admin: Admin, topic_name: str) -> None:
    admin.create_topic(topic_name, partitions=3, config={"retention.ms": "3600000"})
    assert admin.list_topics()[topic_name] == 3
    assert not any(name.startswith("__") for name in admin.list_topics())
    described = admin.describe_topic(topic_name)
    assert [p.partition for p in described.partitions] == [0, 1, 2]
    assert described.config["retention.ms"] == "3600000"
    assert all(p.earliest_offset == 0 and p.high_watermark == 0 for p in described.partitions)
    assert all(p.leader_address for p in described.partitions)
    with pytest.raises(errors.TopicAlreadyExistsError):
        admin.create_topic(topic_name, partitions=1)
    results = admin.create_topics(
        [NewTopic(topic_name + "-a", 1), NewTopic(topic_name, 1)], validate_only=True
    )
    assert results[topic_name + "-a"] is None
    assert isinstance(results[topic_name], errors.TopicAlreadyExistsError)
    assert topic_name + "-a" not in admin.list_topics()
    admin.delete_topic(topic_name)
    assert topic_name not in admin.list_topics()
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        admin.delete_topic(topic_name)
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        admin.describe_topic(topic_name)


def test_bad_topic_specs_are_refused(admin: Admin, topic_name: str) -> None:
    with pytest.raises(errors.OncelogError) as info:
        admin.create_topic(topic_name, partitions=0)
    assert info.value.code in (errors.ErrorCode.INVALID_PARTITIONS,
                               errors.ErrorCode.INVALID_REQUEST)
    with pytest.raises(errors.InvalidConfigError):
        admin.create_topic(topic_name, partitions=1, config={"retention.ms": "soon"})


def test_keyed_records_come_back_in_order_per_partition(
    cluster: LocalCluster, admin: Admin, topic_name: str
) -> None:
    partitions = 3
    admin.create_topic(topic_name, partitions=partitions)
    keys = [b"acct-%d" % (i % 50) for i in range(3000)]
    with Producer(bootstrap=cluster.bootstrap, linger_ms=2, batch_size=4096) as producer:
        futures = [
            producer.send(topic_name, value=b"%d" % i, key=key,
                          headers=[("n", b"%d" % i)] if i % 3 == 0 else None)
            for i, key in enumerate(keys)
        ]
        producer.flush()
    metas = [f.result(timeout=60) for f in futures]
    for key, meta in zip(keys, metas, strict=True):
        assert meta.partition == partition_for_key(key, partitions)

    tps = [TopicPartition(topic_name, p) for p in range(partitions)]
    with Consumer(bootstrap=cluster.bootstrap, max_poll_records=100) as consumer:
        consumer.assign(tps)
        got = read_until(consumer, len(keys))
    assert len(got) == len(keys)
    for p in range(partitions):
        mine = [r for r in got if r.partition == p]
        sent = [i for i, m in enumerate(metas) if m.partition == p]
        assert [int(r.value or b"-1") for r in mine] == sent
        assert [r.offset for r in mine] == [metas[i].offset for i in sent]
        assert [r.offset for r in mine] == list(range(len(sent)))
    by_value = {int(r.value or b"-1"): r for r in got}
    assert by_value[3].headers == (("n", b"3"),) and by_value[4].headers == ()
    assert by_value[7].key == keys[7]


def test_null_key_and_value_round_trip(cluster: LocalCluster, admin: Admin,
                                       topic_name: str) -> None:
    admin.create_topic(topic_name)
    with Producer(bootstrap=cluster.bootstrap) as producer:
        producer.send(topic_name, value=None, key=None, timestamp_ms=42)
        producer.send(topic_name, value=b"", key=b"")
    with Consumer(bootstrap=cluster.bootstrap) as consumer:
        consumer.assign([TopicPartition(topic_name, 0)])
        got = read_until(consumer, 2)
    assert [(r.key, r.value) for r in got] == [(None, None), (b"", b"")]
    assert got[0].timestamp_ms == 42


def test_offsets_seek_and_positions(cluster: LocalCluster, admin: Admin, topic_name: str) -> None:
    admin.create_topic(topic_name)
    tp = TopicPartition(topic_name, 0)
    with Producer(bootstrap=cluster.bootstrap) as producer:
        for i in range(20):
            producer.send(topic_name, value=b"%d" % i, timestamp_ms=1_000 + i * 10)
    for isolation in ("read_committed", "read_uncommitted"):
        with Consumer(bootstrap=cluster.bootstrap, isolation_level=isolation) as consumer:
            assert consumer.beginning_offsets([tp]) == {tp: 0}
            assert consumer.end_offsets([tp]) == {tp: 20}
    with Consumer(bootstrap=cluster.bootstrap, max_poll_records=5) as consumer:
        consumer.assign([tp])
        assert consumer.assignment() == {tp}
        assert consumer.position(tp) == 0  # auto_offset_reset="earliest"
        consumer.seek(tp, 12)
        got = read_until(consumer, 8)
        assert [int(r.value or b"-1") for r in got] == list(range(12, 20))
        assert consumer.position(tp) == 20
        consumer.seek_to_beginning()
        assert consumer.position(tp) == 0
        first = consumer.poll(timeout=30)
        assert [r.offset for r in first] == [0, 1, 2, 3, 4]  # max_poll_records
        consumer.seek_to_end([tp])
        assert consumer.position(tp) == 20
        assert consumer.poll(timeout=0.2) == []
        found = consumer.offsets_for_times({tp: 1_055})[tp]
        assert found is not None and (found.offset, found.timestamp_ms) == (6, 1_060)
        assert consumer.offsets_for_times({tp: 10_000}) == {tp: None}
        with pytest.raises(errors.IllegalStateError):
            consumer.seek(TopicPartition(topic_name, 1), 0)


def test_out_of_range_positions_follow_auto_offset_reset(
    cluster: LocalCluster, admin: Admin, topic_name: str
) -> None:
    admin.create_topic(topic_name)
    tp = TopicPartition(topic_name, 0)
    with Producer(bootstrap=cluster.bootstrap) as producer:
        for i in range(3):
            producer.send(topic_name, value=b"%d" % i)
    with Consumer(bootstrap=cluster.bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 100)
        with pytest.raises(errors.OffsetOutOfRangeError):
            for _ in range(60):
                consumer.poll(timeout=0.5)
    with Consumer(bootstrap=cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 100)
        assert [r.offset for r in read_until(consumer, 3)] == [0, 1, 2]
    with Consumer(bootstrap=cluster.bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        with pytest.raises(errors.OffsetOutOfRangeError, match="seek"):
            consumer.poll(timeout=0.1)


def test_long_poll_returns_when_data_arrives(cluster: LocalCluster, admin: Admin,
                                             topic_name: str) -> None:
    admin.create_topic(topic_name)
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap=cluster.bootstrap, fetch_max_wait_ms=5_000) as consumer, \
            Producer(bootstrap=cluster.bootstrap) as producer:
        consumer.assign([tp])
        consumer.seek_to_end()
        assert consumer.position(tp) == 0
        assert consumer.poll(timeout=0.2) == []  # a fetch is now waiting at the store

        def produce_later() -> None:
            time.sleep(0.3)
            producer.send(topic_name, value=b"hello").result(timeout=30)

        writer = threading.Thread(target=produce_later)
        writer.start()
        got = consumer.poll(timeout=60)
        writer.join()
    assert [r.value for r in got] == [b"hello"]


def test_send_time_errors(cluster: LocalCluster, admin: Admin, topic_name: str) -> None:
    admin.create_topic(topic_name, config={"max.message.bytes": "1000"})
    # send() waits up to max_block_ms for an unknown topic or partition to
    # appear in the metadata (Kafka's waitOnMetadata), then fails the record.
    with Producer(bootstrap=cluster.bootstrap, max_block_ms=300) as producer:
        too_big = producer.send(topic_name, value=b"x" * 2_000)
        assert too_big.done()
        with pytest.raises(errors.MessageTooLargeError, match="max.message.bytes=1000"):
            too_big.result()
        assert producer.send(topic_name, value=b"x" * 500).result(timeout=30).offset == 0
        unknown = producer.send(topic_name + "-missing", value=b"a")
        with pytest.raises(errors.UnknownTopicOrPartitionError, match="does not exist"):
            unknown.result(timeout=30)
        with pytest.raises(errors.UnknownTopicOrPartitionError, match="no partition 5"):
            producer.send(topic_name, value=b"a", partition=5).result(timeout=30)


def test_consumer_of_an_unknown_topic_is_told(cluster: LocalCluster) -> None:
    with Consumer(bootstrap=cluster.bootstrap) as consumer:
        consumer.assign([TopicPartition("no-such-topic", 0)])
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            consumer.poll(timeout=5)
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            consumer.partitions_for_topic("no-such-topic")


def test_delivery_timeout_with_the_store_down_then_recovery(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, group_coordinators=0) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic("t")
        with Producer(bootstrap=cluster.bootstrap, delivery_timeout_ms=2_000,
                      request_timeout_ms=1_000) as producer:
            first = producer.send("t", value=b"before").result(timeout=30)
            assert first.offset == 0
            cluster.kill("partition_store", 0)
            doomed = [producer.send("t", value=b"lost-%d" % i) for i in range(10)]
            for fut in doomed:
                exc = fut.exception(timeout=60)
                assert isinstance(exc, errors.KafkaTimeoutError), exc
            cluster.restart("partition_store", 0)
            # The same producer goes on (under a new epoch: its sequence broke).
            after = producer.send("t", value=b"after").result(timeout=60)
        with Consumer(bootstrap=cluster.bootstrap) as consumer:
            consumer.assign([TopicPartition("t", 0)])
            ends = consumer.end_offsets([TopicPartition("t", 0)])
            got = read_until(consumer, ends[TopicPartition("t", 0)])
    values = [r.value for r in got]
    assert values[0] == b"before" and values[-1] == b"after"
    assert after.offset == len(values) - 1
    # Timed-out records were never acknowledged; none may appear twice.
    assert len(values) == len(set(values))
