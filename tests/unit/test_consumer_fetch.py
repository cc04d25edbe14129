"""The consumer's fetch loop against an in-process store.

Goal: poll() hands out records in offset order from the position on,
skipping records of a first batch that starts before it; moves past batches
the store filtered out (aborted transactions, control batches) using
next_fetch_offset, also when nothing at all is returned; keeps what it did not
hand out for the next poll (max_poll_records); fetches the next records
ahead while some are still buffered, at most about two fetches' worth, and
leaves the errors of such a fetch to the fetch from the position; drops an
answer for a partition whose position moved by seek() meanwhile; survives a
failing fetch; refuses corrupt batches.

Method: tests/support/inprocess_cluster.InProcessCluster, the real store (and
coordinators) in this process: data appended through the store's produce
path, aborted transactions made by a real transactional producer, fetch
failures and corrupted replies injected by its fault layer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from oncelog import Consumer, ConsumerRecord, Producer, TopicPartition, errors
from oncelog import records as codec
from oncelog.v1 import errors_pb2, partition_store_pb2
from tests.support.inprocess_cluster import InProcessCluster

TP = TopicPartition("t", 0)


@pytest.fixture
def store() -> Iterator[InProcessCluster]:
    with InProcessCluster() as s:
        s.create_topic("t", 1)
        yield s


def batch(*values: bytes) -> bytes:
    return codec.encode_batch([(None, v, None, 100 + i) for i, v in enumerate(values)])


def drain(consumer: Consumer, *, polls: int = 400) -> list[ConsumerRecord]:
    """Polls until the position reaches the end of the log (bounded)."""
    out: list[ConsumerRecord] = []
    end = consumer.end_offsets([TP])[TP]
    for _ in range(polls):
        out.extend(consumer.poll(timeout=0.05))
        if consumer.position(TP) >= end:
            break
    return out


def consumer_for(store: InProcessCluster, **kwargs: int | str) -> Consumer:
    consumer = Consumer(bootstrap=store.address, fetch_max_wait_ms=50, **kwargs)  # type: ignore[arg-type]
    consumer.assign([TP])
    return consumer


def test_aborted_and_control_batches_are_skipped(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address, transactional_id="aborter",
                  linger_ms=60_000) as aborter:
        aborter.init_transactions()

        def aborted(*values: bytes) -> None:
            """One batch of `values` in a transaction that aborts (then its marker)."""
            aborter.begin_transaction()
            for value in values:
                aborter.send("t", value=value, partition=0)
            aborter.flush()
            aborter.abort_transaction()
            store.settle()  # the marker is in the log before what comes next

        store.append_raw("t", 0, batch(b"a", b"b", b"c"))  # 0..2
        aborted(b"aborted1", b"aborted2")                  # 3..4, ABORT marker 5
        store.append_raw("t", 0, batch(b"d", b"e"))        # 6..7
        aborted(b"aborted3")                               # 8, ABORT marker 9
    assert [h.base_offset for h in store.headers("t", 0) if h.is_control] == [5, 9]
    with consumer_for(store) as consumer:
        got = drain(consumer)
        assert [(r.offset, r.value) for r in got] == [
            (0, b"a"), (1, b"b"), (2, b"c"), (6, b"d"), (7, b"e"),
        ]
        # Past the trailing aborted batch and its marker too, though no
        # record came from them.
        assert consumer.position(TP) == 10


def test_a_first_batch_starting_before_the_position_is_trimmed(store: InProcessCluster) -> None:
    store.append_raw("t", 0, batch(b"a", b"b", b"c", b"d"))
    with consumer_for(store) as consumer:
        consumer.seek(TP, 2)
        assert [r.value for r in drain(consumer)] == [b"c", b"d"]


def test_records_not_handed_out_wait_for_the_next_poll(store: InProcessCluster) -> None:
    for i in range(5):
        store.append_raw("t", 0, batch(*[b"%d" % (i * 4 + j) for j in range(4)]))
    with consumer_for(store, max_poll_records=3) as consumer:
        sizes: list[int] = []
        values: list[bytes | None] = []
        while len(values) < 20:
            got = consumer.poll(timeout=5)
            assert got, "records were fetched and must come out"
            sizes.append(len(got))
            values.extend(r.value for r in got)
            assert consumer.position(TP) == got[-1].offset + 1
    assert all(size <= 3 for size in sizes)
    assert values == [b"%d" % i for i in range(20)]


def test_small_fetch_sizes_still_make_progress(store: InProcessCluster) -> None:
    for i in range(10):
        store.append_raw("t", 0, batch(b"x" * 500, b"%d" % i))
    with consumer_for(store, max_partition_fetch_bytes=1, fetch_max_bytes=1) as consumer:
        got = drain(consumer, polls=100)
    assert [r.value for r in got if r.value != b"x" * 500] == [b"%d" % i for i in range(10)]


# Fetching ahead: one record of RECORD_BYTES per batch, and fetches of
# FETCH_BYTES, so that one answer holds a few batches (five, with their
# headers).
RECORD_BYTES = 1000
FETCH_BYTES = 5500


def append_numbered(store: InProcessCluster, count: int) -> None:
    """`count` batches of one RECORD_BYTES record each, the value ending
    in the record's offset."""
    for i in range(count):
        store.append_raw("t", 0, batch(b"%0*d" % (RECORD_BYTES, i)))


def one_at_a_time(store: InProcessCluster, **kwargs: int | str) -> Consumer:
    """A consumer handing out one record per poll, fetching FETCH_BYTES."""
    return consumer_for(store, max_poll_records=1, max_partition_fetch_bytes=FETCH_BYTES,
                        **kwargs)


def poll_slowly(consumer: Consumer, count: int) -> Iterator[list[ConsumerRecord]]:
    """Each poll's records until `count` came out, pausing after each poll
    so that a fetch it sent reaches the store and is answered."""
    seen = 0
    while seen < count:
        got = consumer.poll(timeout=5)
        assert got, "records were fetched and must come out"
        time.sleep(0.02)
        seen += len(got)
        yield got


def fetch_offsets(store: InProcessCluster) -> list[int]:
    return [p.fetch_offset for request in store.calls_named("Fetch")
            for p in request.partitions]


def test_the_next_records_are_fetched_ahead_while_some_are_buffered(
        store: InProcessCluster) -> None:
    append_numbered(store, 30)
    with one_at_a_time(store) as consumer:
        values: list[bytes | None] = []
        ahead_seen = False
        for got in poll_slowly(consumer, 30):
            values.extend(r.value for r in got)
            # A fetch that starts past the position was sent while records
            # before it were still buffered.
            ahead_seen = ahead_seen or max(fetch_offsets(store)) > consumer.position(TP)
    assert values == [b"%0*d" % (RECORD_BYTES, i) for i in range(30)]
    assert ahead_seen, fetch_offsets(store)


def test_fetching_ahead_stops_at_about_two_fetches_worth(store: InProcessCluster) -> None:
    append_numbered(store, 60)
    with one_at_a_time(store) as consumer:
        for _ in poll_slowly(consumer, 10):
            pass
        position = consumer.position(TP)
    # Buffered at most: what is left of one answer (under FETCH_BYTES) plus
    # the answer fetched ahead (a batch may take it over FETCH_BYTES).
    furthest_records = 2 * FETCH_BYTES // RECORD_BYTES + 1
    assert position == 10
    assert max(fetch_offsets(store)) <= position + furthest_records, fetch_offsets(store)


def test_an_error_of_a_fetch_ahead_is_left_to_the_fetch_from_the_position(
        store: InProcessCluster) -> None:
    # An out-of-range answer to a fetch ahead must not reset the position
    # (auto_offset_reset="none" would raise): the buffered records are
    # handed out, and the fetch is sent again after a backoff.
    append_numbered(store, 12)
    refused: list[int] = []

    def refuse_ahead(reply: partition_store_pb2.FetchResponse
                     ) -> partition_store_pb2.FetchResponse:
        if not refused and store.fetch_calls >= 2:
            refused.append(store.fetch_calls)
            for result in reply.results:
                del result.batches[:]
                result.error.code = errors_pb2.OFFSET_OUT_OF_RANGE
                result.error.message = "injected"
        return reply

    store.fetch_reply = refuse_ahead
    with one_at_a_time(store, auto_offset_reset="none", retry_backoff_ms=10) as consumer:
        consumer.seek(TP, 0)
        # One record at a time, slowly: the answer to the fetch ahead (the
        # second fetch) arrives while records are still buffered.
        values = [r.value for got in poll_slowly(consumer, 12) for r in got]
    assert refused == [2]
    assert values == [b"%0*d" % (RECORD_BYTES, i) for i in range(12)]


def test_seek_drops_what_was_fetched_ahead(store: InProcessCluster) -> None:
    append_numbered(store, 12)
    with one_at_a_time(store) as consumer:
        for _ in poll_slowly(consumer, 3):
            pass
        consumer.seek(TP, 1)
        offsets = [r.offset for r in drain(consumer)]
    assert offsets == list(range(1, 12))


def test_seek_discards_data_fetched_for_the_old_position(store: InProcessCluster) -> None:
    store.append_raw("t", 0, batch(*[b"%d" % i for i in range(10)]))
    with consumer_for(store, max_poll_records=2) as consumer:
        assert [r.offset for r in consumer.poll(timeout=5)] == [0, 1]
        consumer.seek(TP, 7)
        assert [r.offset for r in drain(consumer)] == [7, 8, 9]


def test_a_failed_fetch_is_retried_quietly(store: InProcessCluster) -> None:
    store.append_raw("t", 0, batch(b"a", b"b"))
    store.fetch_fault = lambda n: grpc.StatusCode.UNAVAILABLE if n <= 2 else None
    with consumer_for(store, retry_backoff_ms=10) as consumer:
        assert [r.value for r in drain(consumer)] == [b"a", b"b"]
    assert store.fetch_calls >= 3


def test_a_long_poll_waits_at_the_store(store: InProcessCluster) -> None:
    with consumer_for(store) as consumer:
        consumer.seek_to_end()
        assert consumer.poll(timeout=0.1) == []
        calls = store.fetch_calls
        store.append_raw("t", 0, batch(b"late"))
        assert [r.value for r in consumer.poll(timeout=30)] == [b"late"]
        assert store.fetch_calls >= calls


def test_each_fetch_starts_at_another_partition(store: InProcessCluster) -> None:
    # The store lets only the first partition with data go over what is
    # left of a fetch's max_bytes; a fixed order could starve the others.
    store.create_topic("r", 3)
    every = [TopicPartition("r", p) for p in range(3)]
    with Consumer(bootstrap=store.address, fetch_max_wait_ms=20) as consumer:
        consumer.assign(every)
        for tp in every:
            consumer.seek(tp, 0)
        for _ in range(6):
            consumer.poll(timeout=0.05)
    fetch_orders = [[(p.topic, p.partition) for p in request.partitions]
                    for request in store.calls_named("Fetch")]
    orders = [order for order in fetch_orders if len(order) == 3]
    assert len(orders) >= 3, fetch_orders
    assert all(sorted(order) == [("r", 0), ("r", 1), ("r", 2)] for order in orders)
    assert len({order[0] for order in orders}) == 3


def test_corrupt_batches_are_refused(store: InProcessCluster) -> None:
    store.append_raw("t", 0, batch(b"a"))

    def corrupt(reply: partition_store_pb2.FetchResponse) -> partition_store_pb2.FetchResponse:
        """Flips the last byte of every batch on its way to the consumer."""
        for result in reply.results:
            for i, data in enumerate(result.batches):
                result.batches[i] = data[:-1] + bytes([data[-1] ^ 0xFF])
        return reply

    store.fetch_reply = corrupt
    with consumer_for(store) as consumer, pytest.raises(errors.CorruptRecordError, match="CRC"):
        drain(consumer)


def test_poll_needs_an_assignment_and_an_open_consumer(store: InProcessCluster) -> None:
    consumer = Consumer(bootstrap=store.address)
    with pytest.raises(errors.IllegalStateError, match="assign"):
        consumer.poll(timeout=0)
    consumer.close()
    with pytest.raises(errors.IllegalStateError, match="closed"):
        consumer.assign([TP])


def test_option_checks() -> None:
    with pytest.raises(ValueError, match="isolation_level"):
        Consumer(bootstrap="127.0.0.1:1", isolation_level="serializable")
    with pytest.raises(ValueError, match="auto_offset_reset"):
        Consumer(bootstrap="127.0.0.1:1", auto_offset_reset="smallest")
    with pytest.raises(ValueError, match="auto_commit_interval_ms"):
        Consumer(bootstrap="127.0.0.1:1", group_id="g", enable_auto_commit=True,
                 auto_commit_interval_ms=0)
