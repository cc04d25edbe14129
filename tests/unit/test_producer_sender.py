"""The producer's sender against an in-process store with scripted faults.

Goal: whatever the store answers — lost replies, NOT_LEADER, a permanent
error in the middle of a pipeline, nothing at all — every record the
producer reports as written is in the log exactly once, in send order per
partition; records reported failed are not duplicated; the futures carry the
offsets the records really have; delivery_timeout_ms and close() bound the
wait; send() refuses bad input at once.

Method: tests/support/inprocess_cluster.InProcessCluster (the real partition
store, transaction coordinator and group coordinator in this process, on
in-memory storage) with a FaultPlan per test in front of the store; the log
is read back through the store's own fetch and compared with what was sent.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from oncelog import Producer, errors
from oncelog._batching import RecordFuture
from oncelog._partitioner import partition_for_key
from oncelog.errors import ErrorCode
from oncelog.records import HEADER_SIZE_BYTES
from tests.support.inprocess_cluster import (
    DROP_REPLY,
    UNREACHABLE,
    BatchView,
    InProcessCluster,
)


@pytest.fixture
def store() -> Iterator[InProcessCluster]:
    with InProcessCluster() as s:
        s.create_topic("t", 2)
        yield s


def values(store: InProcessCluster, partition: int, topic: str = "t") -> list[bytes | None]:
    return [r.value for r in store.records(topic, partition)]


def check_exactly_once(store: InProcessCluster, sent: dict[int, list[bytes]],
                       futures: dict[int, list[RecordFuture]], *, topic: str = "t") -> None:
    for partition, expected in sent.items():
        assert values(store, partition, topic) == expected
        offsets = [f.result(timeout=30).offset for f in futures[partition]]
        assert offsets == list(range(len(expected)))


def produce(producer: Producer, *, partitions: int, per_partition: int, topic: str = "t"
            ) -> tuple[dict[int, list[bytes]], dict[int, list[RecordFuture]]]:
    sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    futures: dict[int, list[RecordFuture]] = {p: [] for p in range(partitions)}
    for i in range(per_partition):
        for p in range(partitions):
            value = b"%d:%d" % (p, i)
            sent[p].append(value)
            futures[p].append(producer.send(topic, value=value, partition=p))
    producer.flush(timeout=60)
    return sent, futures


def test_plain_produce_assigns_offsets_in_order(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address, linger_ms=1, batch_size=512) as producer:
        sent, futures = produce(producer, partitions=2, per_partition=300)
        producer_id = producer.producer_id
    check_exactly_once(store, sent, futures)
    headers = store.headers("t", 0)
    assert len(headers) > 5  # many batches, several in flight
    assert producer_id >= 0
    assert all(h.producer_id == producer_id and h.producer_epoch == 0 for h in headers)


def test_lost_replies_are_retried_with_the_same_sequences(store: InProcessCluster) -> None:
    lost = {3, 4, 9, 15}

    def plan(view: BatchView) -> str | None:
        return DROP_REPLY if view.call_number in lost else None

    store.fault = plan
    with Producer(bootstrap=store.address, linger_ms=1, batch_size=512,
                  retry_backoff_ms=10) as producer:
        sent, futures = produce(producer, partitions=2, per_partition=400)
    check_exactly_once(store, sent, futures)


def test_not_leader_and_storage_errors_are_retried_in_order(store: InProcessCluster) -> None:
    def plan(view: BatchView) -> ErrorCode | None:
        if view.call_number % 7 == 3:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if view.call_number % 11 == 5:
            return ErrorCode.STORAGE_ERROR
        return None

    store.fault = plan
    with Producer(bootstrap=store.address, linger_ms=1, batch_size=512,
                  retry_backoff_ms=5) as producer:
        sent, futures = produce(producer, partitions=2, per_partition=400)
    check_exactly_once(store, sent, futures)


def test_requests_that_overtake_each_other_do_not_break_order(store: InProcessCluster
                                                              ) -> None:
    """Pipelined requests held back a little at random reach the store out of
    order: later batches then get OUT_OF_ORDER and are retried after their
    predecessors."""
    rng = random.Random(7)

    def hold_back(view: BatchView) -> None:
        time.sleep(rng.random() * 0.004)

    store.create_topic("r", 3)
    store.fault = hold_back
    with Producer(bootstrap=store.address, linger_ms=0, batch_size=256,
                  retry_backoff_ms=5) as producer:
        sent, futures = produce(producer, partitions=3, per_partition=300, topic="r")
    check_exactly_once(store, sent, futures, topic="r")
    # Some batches were refused out of order and sent again.
    stored = sum(len(store.headers("r", p)) for p in range(3))
    assert sum(len(r.batches) for r in store.calls_named("Produce")) > stored


def test_a_permanent_failure_mid_pipeline_fails_only_its_batch(store: InProcessCluster) -> None:
    failed_once = threading.Event()

    def plan(view: BatchView) -> ErrorCode | None:
        # The fourth batch of partition 0 is refused once, for good.
        if view.partition == 0 and view.base_sequence > 0 and not failed_once.is_set() \
                and view.call_number >= 4:
            failed_once.set()
            return ErrorCode.CORRUPT_MESSAGE
        return None

    store.fault = plan
    with Producer(bootstrap=store.address, linger_ms=1, batch_size=300,
                  retry_backoff_ms=5) as producer:
        sent, futures = produce(producer, partitions=1, per_partition=300)
    outcomes = [f.exception(timeout=30) for f in futures[0]]
    failed = [i for i, e in enumerate(outcomes) if e is not None]
    assert failed, "the fault plan must have failed a batch"
    assert all(isinstance(outcomes[i], errors.CorruptRecordError) for i in failed)
    # The failed records form one contiguous batch.
    assert failed == list(range(failed[0], failed[-1] + 1))
    expected = [v for i, v in enumerate(sent[0]) if i not in set(failed)]
    assert values(store, 0) == expected
    # Records after the failed batch were renumbered under a higher epoch.
    epochs = [h.producer_epoch for h in store.headers("t", 0)]
    assert epochs == sorted(epochs) and epochs[-1] >= 1
    first_new = next(h for h in store.headers("t", 0) if h.producer_epoch == epochs[-1])
    assert first_new.base_sequence == 0
    offsets = [f.result().offset for i, f in enumerate(futures[0]) if i not in set(failed)]
    assert offsets == list(range(len(expected)))


def test_delivery_timeout_fails_records_when_the_store_is_unreachable(store: InProcessCluster
                                                                      ) -> None:
    store.fault = lambda view: UNREACHABLE
    with Producer(bootstrap=store.address, linger_ms=1, delivery_timeout_ms=1_500,
                  request_timeout_ms=500, retry_backoff_ms=20) as producer:
        futures = [producer.send("t", value=b"x%d" % i, partition=0) for i in range(20)]
        for f in futures:
            exc = f.exception(timeout=30)
            assert isinstance(exc, errors.KafkaTimeoutError)
            assert "may have been written" in exc.message
        assert values(store, 0) == []
        # The producer goes on once the store answers again.
        store.fault = None
        assert producer.send("t", value=b"after", partition=0).result(timeout=30).offset == 0
    assert values(store, 0) == [b"after"]
    assert store.headers("t", 0)[0].producer_epoch >= 1


def _unused_address() -> str:
    """A loopback address where nothing listens (a connection is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_partition_backing_off_is_retried_at_once_at_its_new_leader(
        store: InProcessCluster) -> None:
    """A failover as the producer sees it (Kafka's KIP-951): the metadata
    it holds names a leader that is gone (nothing listens at its address
    any more), so the attempt fails and the partition backs off for a
    minute; the metadata asked for meanwhile names the store that leads
    now. The record must be acknowledged there without waiting out the
    minute, long before the earliest the backoff alone (48 s, with its
    jitter) would let it be retried."""
    backoff_ms = 60_000
    with Producer(bootstrap=store.address, linger_ms=1, retry_backoff_ms=backoff_ms,
                  retry_backoff_max_ms=backoff_ms, delivery_timeout_ms=5 * backoff_ms
                  ) as producer:
        # Metadata and a producer id, from the store as it is.
        assert producer.send("t", value=b"before", partition=0).result(timeout=30).offset == 0
        # The producer's metadata as it was before the failover: t-0 led by
        # a store that has died since.
        client = producer._client
        held = client.cached_metadata
        assert held is not None
        gone = max(held.stores) + 1
        info = held.topics["t"]
        client._metadata = dataclasses.replace(
            held, stores={**held.stores, gone: _unused_address()},
            topics={**held.topics, "t": dataclasses.replace(
                info, leaders=(gone, *info.leaders[1:]))})
        after = producer.send("t", value=b"after", partition=0)
        assert after.result(timeout=backoff_ms / 1000 / 2).offset == 1
    assert values(store, 0) == [b"before", b"after"]


def test_producer_id_is_retried_while_the_coordinator_is_unavailable(
        store: InProcessCluster) -> None:
    answered = itertools.count(1)

    def loading(name: str, _request: object) -> ErrorCode | None:
        if name == "InitProducerId" and next(answered) <= 3:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return None

    store.coordinator_fault = loading
    with Producer(bootstrap=store.address, retry_backoff_ms=10) as producer:
        assert producer.send("t", value=b"a").result(timeout=30).offset == 0
        assert producer.producer_id >= 0
    assert len(store.calls_named("InitProducerId")) == 4


def test_no_coordinator_is_fatal_for_an_idempotent_producer() -> None:
    with InProcessCluster(coordinator=False, group_coordinator=False) as s:
        s.create_topic("t", 1)
        with Producer(bootstrap=s.address) as producer:
            exc = producer.send("t", value=b"a").exception(timeout=30)
            assert isinstance(exc, errors.CoordinatorNotAvailableError)
            assert "enable_idempotence=False" in exc.message
        with Producer(bootstrap=s.address, enable_idempotence=False) as producer:
            assert producer.send("t", value=b"b").result(timeout=30).offset == 0
        header = s.headers("t", 0)[0]
        assert (header.producer_id, header.base_sequence) == (-1, -1)


def test_send_refuses_what_cannot_be_written(store: InProcessCluster) -> None:
    store.create_topic("small", 1, {"max.message.bytes": "200"})
    # max_block_ms bounds the wait for an unknown topic or partition.
    with Producer(bootstrap=store.address, max_block_ms=300) as producer:
        too_big = producer.send("small", value=b"x" * 200)
        assert too_big.done()
        with pytest.raises(errors.MessageTooLargeError, match="max.message.bytes=200"):
            too_big.result()
        # The header, 28 bytes of record fields and the value: exactly 200.
        fits = b"x" * (200 - HEADER_SIZE_BYTES - 28)
        assert producer.send("small", value=fits).result(timeout=30).offset == 0
        with pytest.raises(errors.UnknownTopicOrPartitionError, match="nope"):
            producer.send("nope", value=b"a").result(timeout=30)
        with pytest.raises(errors.UnknownTopicOrPartitionError, match="no partition 2"):
            producer.send("t", value=b"a", partition=2).result(timeout=30)
        with pytest.raises(TypeError, match="bytes"):
            producer.send("t", value="text")
        with pytest.raises(TypeError, match="header"):
            producer.send("t", value=b"a", headers=[("k",)])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="timestamp_ms"):
            producer.send("t", value=b"a", timestamp_ms=-5)
    with pytest.raises(errors.IllegalStateError):
        producer.send("t", value=b"late")


def test_keys_pick_partitions_like_kafka_and_headers_travel(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address) as producer:
        futures = {
            key: producer.send("t", value=b"v", key=key, headers=[("h", b"1"), ("n", None)],
                               timestamp_ms=1234)
            for key in (b"a", b"b", b"c", b"d", b"e")
        }
        producer.flush()
    for key, fut in futures.items():
        meta = fut.result()
        assert meta.partition == partition_for_key(key, 2)
        assert meta.timestamp_ms == 1234
        record = store.records("t", meta.partition)[meta.offset]
        assert record.key == key
        assert record.headers == (("h", b"1"), ("n", None))


def test_keyless_records_fill_batches_on_one_partition(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address, linger_ms=10_000, batch_size=1_000) as producer:
        futures = [producer.send("t", value=b"x" * 72) for _ in range(27)]
        producer.flush()
    partitions = [f.result().partition for f in futures]
    # Nine 100-byte records per 1000-byte batch; the partition changes between batches.
    runs = [len(list(group)) for _p, group in itertools.groupby(partitions)]
    assert all(run % 9 == 0 for run in runs)


def test_flush_sends_without_waiting_for_linger(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address, linger_ms=600_000) as producer:
        fut = producer.send("t", value=b"a", partition=1)
        producer.flush(timeout=30)
        assert fut.done() and fut.result().offset == 0


def test_close_with_timeout_fails_what_is_still_undelivered(store: InProcessCluster) -> None:
    store.fault = lambda view: UNREACHABLE
    producer = Producer(bootstrap=store.address, retry_backoff_ms=50)
    fut = producer.send("t", value=b"a", partition=0)
    producer.close(timeout=0.3)
    exc = fut.exception(timeout=30)
    assert isinstance(exc, errors.KafkaTimeoutError)
    assert "closed" in exc.message


def test_flush_from_a_callback_is_refused(store: InProcessCluster) -> None:
    seen: list[BaseException] = []
    with Producer(bootstrap=store.address) as producer:
        def callback(_f: object) -> None:
            try:
                producer.flush()
            except errors.IllegalStateError as exc:
                seen.append(exc)

        producer.send("t", value=b"a").add_done_callback(callback)
        producer.flush()
    assert len(seen) == 1


def test_send_hands_over_to_a_lagging_sender_but_never_from_its_own_thread(
        store: InProcessCluster) -> None:
    """The application thread waits for a sender pass when batches close
    while the sender is behind; a send() from a callback, on the sender
    thread itself, must not wait for its own pass (the accumulator counts
    the waits: its classes are native, and cannot be patched, in the
    compiled build)."""
    from_callback: list[RecordFuture] = []
    waits_in_callback: list[int] = []
    with Producer(bootstrap=store.address, batch_size=64, linger_ms=0) as producer:
        acc = producer._accumulator
        # Every record fills a batch of its own, and with no lag allowed and
        # no limit on requests outstanding every close finds the sender behind.
        acc.hand_over_lag_ms = 0
        acc.hand_over_max_unanswered = 1 << 30
        sent, futures = produce(producer, partitions=2, per_partition=200)
        check_exactly_once(store, sent, futures)
        assert acc.hand_overs > 0, "a tight send() loop never handed over to the sender"

        application_thread = threading.get_ident()

        def callback(_f: object) -> None:
            if threading.get_ident() == application_thread:
                # The record was acknowledged before the callback was added,
                # so it ran at once, here, where waiting is allowed: try again.
                return
            before = acc.hand_overs
            for i in range(50):
                from_callback.append(producer.send("t", value=b"cb%d" % i, partition=0))
            waits_in_callback.append(acc.hand_overs - before)

        for _attempt in range(50):
            producer.send("t", value=b"last", partition=1).add_done_callback(callback)
            producer.flush(timeout=60)
            if waits_in_callback:
                break
        producer.flush(timeout=60)
    assert waits_in_callback == [0], "no callback ran on the sender thread, or it waited"
    assert [f.result(timeout=30).offset for f in from_callback] == list(range(200, 250))


def test_option_checks() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        Producer(bootstrap="127.0.0.1:1", max_in_flight=6)
    with pytest.raises(ValueError, match="bootstrap"):
        Producer(bootstrap="nohostport")
