"""Batching and record futures, without any network.

Goal: records gather into batches by size and linger as configured; a record
larger than batch_size gets a batch of its own; keyless records stick to one
partition until its batch closes; flush and close make everything sendable;
queued batches expire at their delivery deadline; send() is told to hand
over to the sender thread when a batch closes while the sender has made no
pass for a while and the stores are running out of its requests, and waits
for one pass at most as long as asked; a partition with more closed batches
waiting for the sender than allowed (a backlog) makes send() wait until the
sender has taken them down, at most as long as allowed; and the cheap record
futures behave like any concurrent.futures.Future (result, exception,
callbacks, wait, as_completed, asyncio) although they are completed a batch
at a time.

Method: a RecordAccumulator with an injected clock and a seeded sticky
partitioner, driven by hand; batches are finished directly as the sender
thread would finish them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading

import pytest

from oncelog import errors
from oncelog._batching import (
    BATCH_OVERHEAD_BYTES,
    ProducerBatch,
    RecordAccumulator,
    RecordFuture,
    failed_future,
    record_size_bytes,
)
from oncelog._partitioner import StickyPartitioner
from oncelog.records import iter_records, read_header
from oncelog.types import RecordMetadata


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def __call__(self) -> int:
        return self.now_ms


def make_acc(
    clock: Clock, *, batch_size: int = 1_000, linger_ms: int = 5, delivery_ms: int = 10_000
) -> RecordAccumulator:
    return RecordAccumulator(
        batch_size_bytes=batch_size, linger_ms=linger_ms, delivery_timeout_ms=delivery_ms,
        buffer_memory_bytes=1 << 30, sticky=StickyPartitioner(random.Random(0)),
        clock_ms=clock,
    )


def append(
    acc: RecordAccumulator, value: bytes, *, partition: int | None = 0, partitions: int = 1,
    max_message_bytes: int = 1 << 20, ts: int = 7,
) -> RecordFuture:
    size = record_size_bytes(None, value, None)
    with acc.lock:
        return acc.append("t", partition, partitions, None, value, None, ts, size,
                          max_message_bytes)


def test_batches_close_at_batch_size() -> None:
    clock = Clock()
    acc = make_acc(clock, batch_size=500)
    per_record = record_size_bytes(None, b"x" * 72, None)  # 100 bytes
    for _ in range(10):
        append(acc, b"x" * 72)
    # header (61) + 4 * 100 <= 500 < header + 5 * 100: four records per batch.
    assert per_record == 100
    ready, _ = acc.ready_partitions(clock.now_ms)
    assert ready == [("t", 0)]
    first = acc.pop(("t", 0), clock.now_ms, 1)
    second = acc.pop(("t", 0), clock.now_ms, 1)
    assert first is not None and second is not None
    assert (first.record_count, second.record_count) == (4, 4)
    assert first.size_bytes == BATCH_OVERHEAD_BYTES + 400
    # The third batch (2 records) is still open and waits for its linger.
    assert acc.pop(("t", 0), clock.now_ms, 1) is None
    clock.now_ms += 5
    third = acc.pop(("t", 0), clock.now_ms, 1)
    assert third is not None and third.record_count == 2


def test_linger_makes_an_open_batch_ready() -> None:
    clock = Clock()
    acc = make_acc(clock, linger_ms=20)
    append(acc, b"a")
    ready, next_ms = acc.ready_partitions(clock.now_ms)
    assert ready == [] and next_ms == 1_020
    clock.now_ms = 1_019
    assert acc.ready_partitions(clock.now_ms)[0] == []
    clock.now_ms = 1_020
    assert acc.ready_partitions(clock.now_ms)[0] == [("t", 0)]


def test_a_record_larger_than_batch_size_gets_its_own_batch() -> None:
    clock = Clock()
    acc = make_acc(clock, batch_size=200)
    append(acc, b"small")
    append(acc, b"L" * 1_000)
    append(acc, b"after")
    batches = [acc.pop(("t", 0), clock.now_ms + 10, 1) for _ in range(3)]
    assert [b.record_count for b in batches if b is not None] == [1, 1, 1]


def test_batch_size_is_capped_by_max_message_bytes() -> None:
    clock = Clock()
    acc = make_acc(clock, batch_size=1 << 20)
    for _ in range(3):
        append(acc, b"x" * 72, max_message_bytes=300)  # header (61) + 2 * 100 fits, 3 do not
    batch = acc.pop(("t", 0), clock.now_ms, 1)
    assert batch is not None and batch.record_count == 2


def test_keyless_records_stick_to_a_partition_until_its_batch_closes() -> None:
    clock = Clock()
    acc = make_acc(clock, batch_size=BATCH_OVERHEAD_BYTES + 300)
    futures = [append(acc, b"x" * 72, partition=None, partitions=8) for _ in range(9)]
    partitions = [f._batch.partition for f in futures]
    # Three records fill a batch; then the sticky partition moves on.
    assert len(set(partitions[:3])) == 1
    assert partitions[3] != partitions[0]
    assert len(set(partitions[3:6])) == 1


def test_linger_pop_moves_the_sticky_partition() -> None:
    clock = Clock()
    acc = make_acc(clock)
    first = append(acc, b"a", partition=None, partitions=4)._batch.partition
    clock.now_ms += 5
    batch = acc.pop(("t", first), clock.now_ms, 4)
    assert batch is not None
    assert append(acc, b"b", partition=None, partitions=4)._batch.partition != first


def test_flush_and_close_make_open_batches_ready() -> None:
    clock = Clock()
    acc = make_acc(clock, linger_ms=10_000)
    append(acc, b"a")
    assert acc.ready_partitions(clock.now_ms)[0] == []
    pending = acc.begin_flush()
    assert len(pending) == 1
    assert acc.ready_partitions(clock.now_ms)[0] == [("t", 0)]
    acc.end_flush()
    assert acc.ready_partitions(clock.now_ms)[0] == []
    acc.closing = True
    assert acc.pop(("t", 0), clock.now_ms, 1) is not None


def test_queued_batches_expire_at_their_delivery_deadline() -> None:
    clock = Clock()
    acc = make_acc(clock, batch_size=200, delivery_ms=100)
    append(acc, b"x" * 100)
    clock.now_ms += 50
    append(acc, b"y" * 100)
    assert acc.expire(clock.now_ms + 49) == []
    expired = acc.expire(clock.now_ms + 50)
    assert [b.created_ms for b in expired] == [1_000]
    assert [b.created_ms for b in acc.expire(clock.now_ms + 100)] == [1_050]
    assert acc.drain_all() == []


def test_buffered_bytes_are_released_when_batches_complete() -> None:
    clock = Clock()
    acc = make_acc(clock)
    append(acc, b"x" * 72)
    append(acc, b"x" * 72)
    assert acc.buffered_bytes == 200
    batch = acc.pop(("t", 0), clock.now_ms + 5, 1)
    assert batch is not None
    batch.finish(base_offset=0)
    acc.completed([batch])
    assert acc.buffered_bytes == 0
    assert acc.incomplete_count == 0


def test_encode_once_then_records_are_dropped() -> None:
    clock = Clock()
    acc = make_acc(clock)
    append(acc, b"a", ts=11)
    append(acc, b"b", ts=12)
    batch = acc.pop(("t", 0), clock.now_ms + 5, 1)
    assert batch is not None
    batch.encode(producer_id=9, producer_epoch=2, base_sequence=100)
    assert batch.values == [] and batch.data is not None
    header = read_header(batch.data)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 2, 100)
    assert [r.value for r in iter_records(batch.data)] == [b"a", b"b"]
    assert batch.last_sequence == 101
    with pytest.raises(RuntimeError):
        batch.encode(producer_id=9, producer_epoch=2, base_sequence=100)


def test_records_with_and_without_headers_share_a_batch() -> None:
    """A batch keeps its records as columns; headers get a column only once
    a record has some, and every record keeps its own."""
    clock = Clock()
    acc = make_acc(clock, batch_size=1 << 20)
    rows: list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...] | None]] = [
        (None, b"a", None), (b"k", b"b", None), (None, b"c", (("h", b"1"), ("n", None))),
        (b"k2", None, None), (None, b"e", (("x", b""),)),
    ]
    with acc.lock:
        for i, (key, value, headers) in enumerate(rows):
            acc.append("t", 0, 1, key, value, headers, 100 + i,
                       record_size_bytes(key, value, headers), 1 << 20)
    batch = acc.pop(("t", 0), clock.now_ms + 5, 1)
    assert batch is not None
    assert batch.headers == [None, None, rows[2][2], None, rows[4][2]]
    batch.encode(producer_id=1, producer_epoch=0, base_sequence=0)
    assert batch.data is not None
    assert [(r.key, r.value, r.headers or None, r.timestamp_ms)
            for r in iter_records(batch.data)] == [
        (key, value, headers, 100 + i) for i, (key, value, headers) in enumerate(rows)]


# ------------------------------------------------------------------ futures

def _batch_with_futures(n: int) -> tuple[ProducerBatch, list[RecordFuture]]:
    clock = Clock()
    acc = make_acc(clock, batch_size=1 << 20)
    futures = [append(acc, b"v%d" % i, ts=100 + i) for i in range(n)]
    batch = futures[0]._batch
    assert all(f._batch is batch for f in futures)
    return batch, futures


def test_futures_resolve_with_their_own_offsets_and_timestamps() -> None:
    batch, futures = _batch_with_futures(3)
    assert not any(f.done() for f in futures)
    assert all(f.running() for f in futures)
    batch.finish(base_offset=40)
    assert [f.result() for f in futures] == [
        RecordMetadata("t", 0, 40 + i, 100 + i) for i in range(3)
    ]
    assert all(f.done() and f.exception() is None for f in futures)


def test_futures_fail_with_their_own_exception_instance() -> None:
    batch, futures = _batch_with_futures(2)
    batch.finish(error=errors.KafkaTimeoutError("gone"))
    excs = [f.exception() for f in futures]
    assert all(isinstance(e, errors.KafkaTimeoutError) for e in excs)
    assert excs[0] is not excs[1]  # raising one shared instance would grow its traceback
    with pytest.raises(errors.KafkaTimeoutError, match="gone"):
        futures[0].result()
    assert futures[0].exception() is excs[0]


def test_cannot_be_cancelled_or_completed_by_callers() -> None:
    _batch, futures = _batch_with_futures(1)
    assert futures[0].cancel() is False
    assert futures[0].cancelled() is False
    with pytest.raises(RuntimeError):
        futures[0].set_result(RecordMetadata("t", 0, 0, 0))


def test_result_waits_and_times_out() -> None:
    batch, futures = _batch_with_futures(2)
    with pytest.raises(concurrent.futures.TimeoutError):
        futures[0].result(timeout=0.01)
    got: list[RecordMetadata] = []
    waiter = threading.Thread(target=lambda: got.append(futures[1].result(timeout=30)))
    waiter.start()
    batch.finish(base_offset=7)
    waiter.join(30)
    assert got == [RecordMetadata("t", 0, 8, 101)]


def test_callbacks_before_and_after_completion_run_once() -> None:
    batch, futures = _batch_with_futures(2)
    calls: list[int] = []
    futures[0].add_done_callback(lambda f: calls.append(f.result().offset))
    assert calls == []
    batch.finish(base_offset=3)
    assert calls == [3]
    futures[1].add_done_callback(lambda f: calls.append(f.result().offset))
    assert calls == [3, 4]


def test_a_failing_callback_does_not_stop_the_others() -> None:
    batch, futures = _batch_with_futures(1)
    calls: list[str] = []

    def bad(_f: object) -> None:
        raise ValueError("callback bug")

    futures[0].add_done_callback(bad)
    futures[0].add_done_callback(lambda _f: calls.append("ok"))
    batch.finish(base_offset=0)
    assert calls == ["ok"]


def test_concurrent_futures_wait_and_as_completed() -> None:
    batch, futures = _batch_with_futures(3)
    other_batch, other = _batch_with_futures(1)
    done, not_done = concurrent.futures.wait(futures, timeout=0.01)
    assert not done and len(not_done) == 3
    threading.Timer(0.05, lambda: batch.finish(base_offset=0)).start()
    done, not_done = concurrent.futures.wait(futures + other, return_when="FIRST_COMPLETED",
                                             timeout=30)
    assert done == set(futures) and not_done == set(other)
    threading.Timer(0.05, lambda: other_batch.finish(error=errors.KafkaTimeoutError("x"))).start()
    as_futures: list[concurrent.futures.Future[RecordMetadata]] = list(other)
    completed = list(concurrent.futures.as_completed(as_futures, timeout=30))
    assert completed == other


def test_asyncio_can_await_a_record_future() -> None:
    batch, futures = _batch_with_futures(1)

    async def main() -> RecordMetadata:
        asyncio.get_running_loop().call_later(0.01, lambda: batch.finish(base_offset=5))
        return await asyncio.wrap_future(futures[0])

    assert asyncio.run(main()) == RecordMetadata("t", 0, 5, 100)


def test_many_threads_waiting_while_the_batch_completes() -> None:
    """Stress the lazy Condition: waiters register while the batch finishes."""
    def wait(f: RecordFuture, results: list[int], lock: threading.Lock) -> None:
        offset = f.result(timeout=30).offset
        with lock:
            results.append(offset)

    for round_ in range(20):
        batch, futures = _batch_with_futures(50)
        results: list[int] = []
        lock = threading.Lock()
        threads = [threading.Thread(target=wait, args=(f, results, lock)) for f in futures]
        for t in threads[:25]:
            t.start()
        batch.finish(base_offset=round_)
        for t in threads[25:]:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(results) == list(range(round_, round_ + 50))


def test_failed_future_is_done_at_once() -> None:
    fut = failed_future("t", 3, errors.error_for(errors.ErrorCode.MESSAGE_TOO_LARGE, "big"))
    assert fut.done()
    with pytest.raises(errors.OncelogError, match="big") as info:
        fut.result()
    assert info.value.code is errors.ErrorCode.MESSAGE_TOO_LARGE


# ------------------------------------------------------- hand-over to the sender


def close_batch(acc: RecordAccumulator) -> None:
    """A 600-byte record to partition 0: with batch_size 1,000 it closes the
    batch the previous call opened, and opens one of its own."""
    append(acc, b"x" * 600)


def test_hand_over_is_due_when_a_batch_closes_long_after_the_last_sender_pass() -> None:
    clock = Clock()
    acc = make_acc(clock)
    acc.max_queued_batches = 1 << 30   # the starved-sender rule alone, no backlog
    assert acc.hand_over_lag_ms == 10
    close_batch(acc)   # opens the first batch
    clock.now_ms += 9
    close_batch(acc)   # closes it 9 ms after the sender's last pass: it keeps up
    assert not acc.hand_over_due
    clock.now_ms += 1
    close_batch(acc)   # 10 ms without a pass while batches close: it is starved
    assert acc.hand_over_due
    acc.hand_over_due = False
    with acc.lock:
        acc.sender_pass_done()
    clock.now_ms += 9
    close_batch(acc)   # a pass 9 ms ago
    assert not acc.hand_over_due


def test_no_hand_over_while_the_stores_have_enough_requests_to_work_on() -> None:
    """A starved sender costs nothing while its requests keep the stores
    busy; its work then waits for the application's next pause."""
    clock = Clock()
    acc = make_acc(clock)
    acc.max_queued_batches = 1 << 30   # the starved-sender rule alone, no backlog
    assert acc.hand_over_max_unanswered == 1
    close_batch(acc)
    acc.requests_unanswered = 2
    clock.now_ms += 20
    close_batch(acc)
    assert not acc.hand_over_due
    acc.requests_unanswered = 1   # one answer came: the stores are running dry
    close_batch(acc)
    assert acc.hand_over_due


def test_wait_for_sender_returns_after_the_next_pass_and_clears_the_flag() -> None:
    acc = make_acc(Clock())
    acc.hand_over_due = True
    passes: list[int] = []

    def sender() -> None:
        with acc.lock:
            # Runs once the waiting thread has released the lock in wait().
            acc.sender_pass_done()
            passes.append(acc.sender_passes)

    with acc.lock:
        assert acc.sender_wanted
        threading.Thread(target=sender).start()
        acc.wait_for_sender(max_pass_wait_s=60)
        assert acc.sender_passes == 1 and passes == [1]
        assert not acc.hand_over_due and not acc.sender_wanted
    assert acc.hand_overs == 1


def test_wait_for_sender_gives_up_after_its_limit() -> None:
    """A sender stuck in a blocking call must not stall send() for good."""
    acc = make_acc(Clock())
    acc.hand_over_due = True
    with acc.lock:
        acc.wait_for_sender(max_pass_wait_s=0.01)
    assert acc.sender_passes == 0 and not acc.hand_over_due


# ------------------------------------------------------------------ backlog


def test_a_partition_with_more_closed_batches_than_allowed_is_a_backlog() -> None:
    """Closed batches the sender has not taken are records waiting: beyond
    max_queued_batches of them in one partition, send() is told to wait."""
    clock = Clock()
    acc = make_acc(clock)
    assert acc.max_queued_batches == 1
    close_batch(acc)
    close_batch(acc)   # one closed batch waits: allowed
    assert acc.backlogged is None
    with acc.lock:
        acc.sender_pass_done()   # a pass that took nothing (its window is full)
    close_batch(acc)   # a second one waits
    assert acc.backlogged is not None and acc.sender_wanted
    assert not acc.hand_over_due   # a backlog, not a starved sender


def test_wait_for_sender_waits_until_the_backlog_is_taken() -> None:
    clock = Clock()
    acc = make_acc(clock)
    for _ in range(3):
        close_batch(acc)
    queue = acc.backlogged
    assert queue is not None and len(queue.ready) == 2
    taken: list[ProducerBatch] = []

    def sender() -> None:
        # A pass that takes nothing (the window is full), then one that takes
        # a batch once an answer came.
        with acc.lock:
            acc.sender_pass_done()
        batch = acc.pop(("t", 0), clock.now_ms, 1)
        assert batch is not None
        taken.append(batch)
        with acc.lock:
            acc.sender_pass_done()

    with acc.lock:
        threading.Thread(target=sender).start()
        acc.wait_for_sender(max_pass_wait_s=0)
        assert len(queue.ready) == 1 and len(taken) == 1
        assert not acc.sender_wanted


def test_a_backlog_the_sender_never_takes_stops_the_wait_at_its_limit() -> None:
    """A store that does not answer must not stall send() for long: buffer
    memory (and max_block_ms) bound what queues up after that."""
    clock = Clock()
    acc = make_acc(clock)
    acc.backlog_wait_ms = 20
    for _ in range(3):
        close_batch(acc)
    with acc.lock:
        acc.wait_for_sender(max_pass_wait_s=0)
    assert acc.backlogged is None and acc.hand_overs == 1


def test_no_backlog_wait_without_a_wait_allowed() -> None:
    """max_block_ms=0 (backlog_wait_ms 0): send() never waits for the sender
    because of a backlog."""
    clock = Clock()
    acc = make_acc(clock)
    acc.backlog_wait_ms = 0
    for _ in range(4):
        close_batch(acc)
    assert acc.backlogged is None
