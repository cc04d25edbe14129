"""The producer's batching: record futures, batches, and the accumulator.

The hot path is `Producer.send` -> `RecordAccumulator.append`: it appends one
tuple to the partition's open batch and creates one future. Everything else
happens once per batch, in the sender thread: encoding (once, when the batch is
first sent), and completion, which resolves every future of the batch at once.

A batch is its records' future: it holds the outcome (state, base offset,
error), the one Condition its waiters wait on, and the callbacks and
`concurrent.futures.wait` waiters registered by its records. `RecordFuture`
is a real `concurrent.futures.Future` (the API promises one) that holds only
its batch, its index and its timestamp: a stock Future builds a Condition
(an RLock and a deque) when created and takes it again to complete, ~2.7 us
per record, as much as the rest of the producer's per-record work together.
A record future reads its state and result from its batch, builds its
RecordMetadata when asked, and waits on its batch's Condition; completing a
batch is one assignment, one notify, and whatever callbacks its records'
callers asked for.

The module is compiled by mypyc in the compiled wheel
(build_support/oncelog_build.py): its classes are then native, with no
`__dict__` and only the attributes declared here.
"""

from __future__ import annotations

import bisect
import copy
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import _base as _futures_base
from typing import Any, Protocol

from oncelog._partitioner import StickyPartitioner
from oncelog.types import RecordMetadata
from oncelog.wire import records as codec
from oncelog.wire.compression import Codec

log = logging.getLogger("oncelog.producer")

RUNNING = _futures_base.RUNNING
FINISHED = _futures_base.FINISHED

# The most bytes a record takes beyond its key, value and headers (records.py's
# varints): length <= 4 (a record is under 2^27 bytes: batches are at most
# 16 MiB), attributes 1, timestamp delta <= 10 (any int64), offset delta <= 4,
# key and value lengths <= 4 each, header count 1. The producer counts this
# bound, not the exact size: the timestamp and offset deltas are known only
# once the batch is encoded. Typical records take 9 of these bytes.
RECORD_OVERHEAD_BYTES = 28
# The same for each header beyond its key and value: two lengths of <= 4
# bytes (a header count of 64 or more takes 2-4 bytes where 1 is counted:
# each header's own 8 covers that many times over).
HEADER_OVERHEAD_BYTES = 8
BATCH_OVERHEAD_BYTES = codec.HEADER_SIZE_BYTES

Headers = Sequence[codec.Header]

# A callback or a `concurrent.futures.wait` waiter, as a batch runs it when
# it finishes.
BatchListener = Callable[["ProducerBatch"], None]


def record_size_bytes(
    key: bytes | None, value: bytes | None, headers: Sequence[codec.Header] | None
) -> int:
    """An upper bound of the encoded size of one record (its compressed size
    is not known before the batch is encoded: the bound is uncompressed, as
    Kafka's producer counts batch.size)."""
    size = RECORD_OVERHEAD_BYTES
    if key is not None:
        size += len(key)
    if value is not None:
        size += len(value)
    if headers:
        for hkey, hvalue in headers:
            size += HEADER_OVERHEAD_BYTES + len(hkey.encode()) + (
                0 if hvalue is None else len(hvalue))
    return size


class ProducerBatch:
    """Records bound for one partition, sent and retried as one encoded blob.

    Once it is first sent it has a producer id, epoch and base sequence baked
    into `data`, and a retry re-sends exactly these bytes. Only a sequence
    reset after a permanent failure (`restamp`) renumbers a batch, and only one
    known not to have been written.
    """

    __slots__ = (
        "topic", "partition", "keys", "values", "timestamps", "headers", "size_bytes",
        "limit_bytes", "created_ms",
        "deadline_ms", "record_count", "data", "producer_id", "producer_epoch",
        "base_sequence", "attempts", "in_flight", "maybe_landed", "needs_send", "acked",
        "sent_as_oldest",
        "unknown_topic_retried", "last_error", "state", "base_offset", "error",
        "condition", "listeners", "waiters", "transactional", "compression",
    )

    def __init__(
        self, topic: str, partition: int, *, created_ms: int, deadline_ms: int, limit_bytes: int,
        compression: Codec = Codec.NONE,
    ) -> None:
        self.topic = topic
        self.partition = partition
        # The records, as columns until the batch is encoded (then emptied):
        # appending a key, a value and a timestamp makes no object per record
        # that the garbage collector would have to visit, as a tuple per
        # record did (measured: ~0.15 us of the application's 0.85 us per
        # compiled send()). `headers` stays None until a record has some.
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []
        self.headers: list[Headers | None] | None = None
        self.size_bytes = BATCH_OVERHEAD_BYTES
        self.limit_bytes = limit_bytes
        self.created_ms = created_ms
        self.deadline_ms = deadline_ms
        self.record_count = 0
        self.data: bytes | None = None
        self.producer_id = codec.NO_PRODUCER_ID
        self.producer_epoch = codec.NO_PRODUCER_EPOCH
        self.base_sequence = codec.NO_SEQUENCE
        self.transactional = False
        self.compression = compression
        # Sending state, owned by the sender thread.
        self.attempts = 0
        self.in_flight = False
        # True once sent, until an answer says it was not written: a batch that
        # may be in the log is never renumbered (that could write it twice).
        self.maybe_landed = False
        self.needs_send = False
        # Written (acknowledged): it leaves its partition's window once every
        # batch before it is acknowledged too.
        self.acked = False
        # The latest attempt left as its partition's oldest unacknowledged batch.
        self.sent_as_oldest = False
        self.unknown_topic_retried = False
        self.last_error: BaseException | None = None
        # Outcome, read by the record futures.
        self.state = RUNNING
        self.base_offset = -1
        self.error: BaseException | None = None
        # The batch's future: what its records' waiters wait on (one
        # Condition per batch, never one per record), what runs when it
        # finishes (callbacks; send_many's countdown), and the waiters of
        # concurrent.futures.wait/as_completed, per record future. Guarded by
        # `condition`; the lists are dropped once the batch is finished.
        self.condition = threading.Condition()
        self.listeners: list[BatchListener] | None = None
        self.waiters: list[tuple[RecordFuture, _Waiter]] | None = None

    def __repr__(self) -> str:
        return (
            f"ProducerBatch({self.topic}-{self.partition}, records={self.record_count}, "
            f"seq={self.base_sequence}, epoch={self.producer_epoch}, state={self.state})"
        )

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == codec.NO_SEQUENCE:
            return codec.NO_SEQUENCE
        return codec.next_sequence(self.base_sequence, self.record_count - 1)

    def add(self, key: bytes | None, value: bytes | None, headers: Headers | None,
            timestamp_ms: int) -> int:
        """Appends one record (not counted against size_bytes: the
        accumulator does that); returns its index in the batch."""
        if self.data is not None:
            raise RuntimeError(f"{self!r} is already encoded")
        count = self.record_count
        self.keys.append(key)
        self.values.append(value)
        self.timestamps.append(timestamp_ms)
        if headers is not None or self.headers is not None:
            if self.headers is None:
                self.headers = [None] * count
            self.headers.append(headers)
        self.record_count = count + 1
        return count

    def encode(self, *, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        """Encodes the records once, under the given identity, and drops them."""
        if self.data is not None or self.state == FINISHED:
            raise RuntimeError(f"{self!r} is already encoded")
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.data = codec.encode_columns(
            self.keys, self.values, self.timestamps, self.headers,
            producer_id=producer_id, producer_epoch=producer_epoch,
            base_sequence=base_sequence, transactional=self.transactional,
            compression=self.compression,
        )
        self._drop_records()

    def _drop_records(self) -> None:
        self.keys = []
        self.values = []
        self.timestamps = []
        self.headers = None

    def restamp(self, *, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        """Gives an encoded batch a new identity (after a sequence reset)."""
        if self.data is None:
            raise RuntimeError(f"{self!r} is not encoded yet")
        self.data = restamp_batch(
            self.data, producer_id=producer_id, producer_epoch=producer_epoch,
            base_sequence=base_sequence,
        )
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence

    def finish(self, *, base_offset: int = -1, error: BaseException | None = None) -> None:
        """Completes every record future of the batch. Sender thread only."""
        self._drop_records()
        self.data = None
        with self.condition:
            self.base_offset = base_offset
            self.error = error
            self.state = FINISHED
            waiters = self.waiters
            listeners = self.listeners
            self.waiters = self.listeners = None
            if waiters:
                # Under the Condition, as a stock Future tells its waiters.
                for fut, waiter in waiters:
                    if error is None:
                        waiter.add_result(fut)
                    else:
                        waiter.add_exception(fut)
            self.condition.notify_all()
        if listeners:
            for listener in listeners:
                try:
                    listener(self)
                except Exception:
                    log.exception("exception calling a callback of %r", self)

    def add_listener(self, listener: BatchListener) -> bool:
        """Registers `listener` to run when the batch finishes; False (and
        not registered) when it already has."""
        with self.condition:
            if self.state == FINISHED:
                return False
            if self.listeners is None:
                self.listeners = [listener]
            else:
                self.listeners.append(listener)
            return True


_IDENTITY = struct.Struct(">qhi")  # producer_id, producer_epoch, base_sequence
_CRC = struct.Struct(">I")


def restamp_batch(
    data: bytes, *, producer_id: int, producer_epoch: int, base_sequence: int
) -> bytes:
    """The same encoded batch with a new producer id, epoch and base sequence
    (and its CRC recomputed: the CRC covers them)."""
    buf = bytearray(data)
    _IDENTITY.pack_into(buf, codec.PRODUCER_ID_POS, producer_id, producer_epoch, base_sequence)
    _CRC.pack_into(buf, codec.CRC_POS, codec.crc32c(memoryview(buf)[codec.CRC_START:]))
    return bytes(buf)


def _copy_error(err: BaseException) -> BaseException:
    """A fresh instance per future: raising one shared exception from many
    futures would grow its traceback on every raise."""
    try:
        dup = copy.copy(err)
    except Exception:  # an exception type that cannot be copied: share it
        return err
    dup.__cause__ = err.__cause__
    return dup


class _Waiter(Protocol):
    """What concurrent.futures.wait and as_completed register on a future."""

    def add_result(self, future: Future[Any]) -> None: ...

    def add_exception(self, future: Future[Any]) -> None: ...


class _BatchWaiters:
    """A record future's `_waiters` as stock Future code uses it (append
    and remove a waiter, under the future's `_condition`): kept in the
    batch's list, with the future they wait for."""

    __slots__ = ("_batch", "_future")

    def __init__(self, batch: ProducerBatch, future: RecordFuture) -> None:
        self._batch = batch
        self._future = future

    def append(self, waiter: _Waiter) -> None:
        batch = self._batch
        if batch.waiters is None:
            batch.waiters = []
        batch.waiters.append((self._future, waiter))

    def remove(self, waiter: _Waiter) -> None:
        waiters = self._batch.waiters
        if waiters is not None:
            waiters.remove((self._future, waiter))


def _run_callback(fn: Callable[[Future[RecordMetadata]], object],
                  future: RecordFuture) -> None:
    try:
        fn(future)
    except Exception:
        log.exception("exception calling callback for %r", future)


class RecordFuture(Future[RecordMetadata]):
    """The future of one record: state and result come from its batch.

    Never cancellable (the record is already queued, as in Kafka) and completed
    only by the producer; it is RUNNING from creation until it is done. Stock
    Future code (result() with a timeout, concurrent.futures.wait, asyncio's
    wrap_future) finds the batch's Condition and outcome through the
    properties below, which stand in for the attributes Future.__init__
    would have made.
    """

    _batch: ProducerBatch
    _index: int
    _timestamp_ms: int
    # This future's own copy of its batch's error, made when first asked for.
    _own_error: BaseException | None

    def __init__(self, batch: ProducerBatch, index: int, timestamp_ms: int) -> None:
        # Future.__init__ is skipped on purpose: it builds a Condition.
        self._batch = batch
        self._index = index
        self._timestamp_ms = timestamp_ms
        self._own_error = None

    # ---- what stock Future code reads

    @property
    def _state(self) -> str:  # type: ignore[override]
        return self._batch.state

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        return self._batch.condition

    @property
    def _waiters(self) -> _BatchWaiters:  # type: ignore[override]
        return _BatchWaiters(self._batch, self)

    @property
    def _result(self) -> RecordMetadata | None:  # type: ignore[override]
        batch = self._batch
        if batch.state != FINISHED or batch.error is not None:
            return None
        offset = batch.base_offset + self._index if batch.base_offset >= 0 else -1
        return RecordMetadata(batch.topic, batch.partition, offset, self._timestamp_ms)

    @property
    def _exception(self) -> BaseException | None:  # type: ignore[override]
        err = self._batch.error
        if err is None:
            return None
        mine = self._own_error
        if mine is None:
            mine = self._own_error = _copy_error(err)
        return mine

    # ---- fast paths that skip the Condition once the batch is done

    def done(self) -> bool:
        return self._batch.state == FINISHED

    def running(self) -> bool:
        return self._batch.state != FINISHED

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if self._batch.state == FINISHED:
            err = self._exception
            if err is not None:
                raise err
            result = self._result
            if result is None:  # pragma: no cover - FINISHED without error has a result
                raise RuntimeError("finished record future without a result")
            return result
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._batch.state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[Future[RecordMetadata]], object]) -> None:
        if not self._batch.add_listener(lambda _batch: _run_callback(fn, self)):
            _run_callback(fn, self)

    def set_result(self, result: RecordMetadata) -> None:
        raise RuntimeError("a record future is completed by its producer")

    def set_exception(self, exception: BaseException | None) -> None:
        raise RuntimeError("a record future is completed by its producer")

    def set_running_or_notify_cancel(self) -> bool:
        raise RuntimeError("a record future is completed by its producer")

    def __repr__(self) -> str:
        batch = self._batch
        return f"<RecordFuture {batch.topic}-{batch.partition} state={batch.state}>"


class SentRecords(Sequence[RecordMetadata]):
    """What send_many() resolves to: each record's RecordMetadata, in the
    order the records were given, made when read."""

    def __init__(self, topic: str, spans: list[tuple[ProducerBatch, int, int]],
                 timestamps: list[int] | int) -> None:
        self._topic = topic
        # (batch, index of the span's first record in the batch, records)
        self._spans = spans
        self._timestamps = timestamps
        self._starts: list[int] = []
        total = 0
        for _batch, _first, count in spans:
            self._starts.append(total)
            total += count
        self._len = total

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> RecordMetadata:  # type: ignore[override]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(index)
        span = bisect.bisect_right(self._starts, index) - 1
        batch, first, _count = self._spans[span]
        offset = batch.base_offset + first + index - self._starts[span] \
            if batch.base_offset >= 0 else -1
        ts = self._timestamps if isinstance(self._timestamps, int) else self._timestamps[index]
        return RecordMetadata(self._topic, batch.partition, offset, ts)


class ManyRecordsFuture(Future[SentRecords]):
    """The future of a send_many() call: done when every batch holding its
    records is; its result is a SentRecords, or the first failure among its
    records (by their order). A stock Future, completed by the last batch to
    finish (each batch counts down once, in the sender thread)."""

    def __init__(self, records: SentRecords) -> None:
        super().__init__()
        self._records = records
        batches = list(dict.fromkeys(batch for batch, _, _ in records._spans))
        self._waiting = len(batches)
        self._lock = threading.Lock()
        self.set_running_or_notify_cancel()
        for batch in batches:
            if not batch.add_listener(self._batch_finished):
                self._batch_finished(batch)

    def _batch_finished(self, _batch: ProducerBatch) -> None:
        with self._lock:
            self._waiting -= 1
            if self._waiting:
                return
        for batch, _first, _count in self._records._spans:
            if batch.error is not None:
                self.set_exception(_copy_error(batch.error))
                return
        self.set_result(self._records)


def failed_batch(topic: str, partition: int | None, error: BaseException) -> ProducerBatch:
    """A batch that never held records, already finished with `error`."""
    batch = ProducerBatch(topic, -1 if partition is None else partition, created_ms=0,
                          deadline_ms=0, limit_bytes=0)
    batch.finish(error=error)
    return batch


def failed_future(topic: str, partition: int, error: BaseException) -> RecordFuture:
    """A future that is already done with an error (refused at send time)."""
    return RecordFuture(failed_batch(topic, partition, error), 0, -1)


class _PartitionQueue:
    __slots__ = ("open", "ready")

    def __init__(self) -> None:
        self.open: ProducerBatch | None = None
        self.ready: deque[ProducerBatch] = deque()


class RecordAccumulator:
    """Per-partition queues of batches, shared by send() and the sender thread.

    One lock guards everything; `wakeup` (on that lock) tells the sender there
    is something new (a batch opened or closed, a flush, a completion);
    `changed` tells flush() and blocked send() calls that batches completed.
    Time is monotonic milliseconds: `now_ms` arguments on the sender side, the
    injected `clock_ms` when append() opens a batch.
    """

    def __init__(
        self,
        *,
        batch_size_bytes: int,
        linger_ms: int,
        delivery_timeout_ms: int,
        buffer_memory_bytes: int,
        sticky: StickyPartitioner,
        clock_ms: Callable[[], int],
        hand_over_lag_ms: int = 10,
        hand_over_max_unanswered: int = 1,
        max_queued_batches: int = 1,
        backlog_wait_ms: int = 100,
        compression: Codec = Codec.NONE,
    ) -> None:
        self.batch_size_bytes = batch_size_bytes
        # The codec of every batch this accumulator opens.
        self.compression = compression
        self.linger_ms = linger_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.buffer_memory_bytes = buffer_memory_bytes
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self.changed = threading.Condition(self.lock)
        self.woken = False
        # The sender thread counts its passes over the queues, notes when it
        # last finished one, and counts its requests not yet answered. A
        # batch that closes while the sender has not finished a pass for
        # hand_over_lag_ms, and the stores have at most
        # hand_over_max_unanswered of its requests left to work on, means a
        # starved sender is about to leave them idle: hand_over_due tells
        # send() to let it run (see wait_for_sender_pass). With more requests
        # outstanding the stores are busy anyway, and the sender's work is
        # better done while the application waits (in a commit or flush).
        # 10 ms is twice the GIL's switch interval: measured with 1 KiB
        # records, 5 ms took enough of the application's time to cost a
        # producer committing every 10 ms 14 % of its throughput, 10 ms
        # nothing, while a producer committing every 100 ms gains either way.
        self.hand_over_lag_ms = hand_over_lag_ms
        self.hand_over_max_unanswered = hand_over_max_unanswered
        self.requests_unanswered = 0
        self.sender_passes = 0
        self.sender_passed = threading.Condition(self.lock)
        self.last_sender_pass_ms = clock_ms()
        self.hand_over_due = False
        # The backlog: a partition whose closed batches wait for the sender
        # (its window of max_in_flight requests is full, or the sender has
        # not run) holds more than max_queued_batches of them. The records
        # in them wait; a send() loop that outruns the sender would
        # otherwise fill the whole buffer_memory_bytes with batches that
        # wait their turn, and every record's acknowledgement would wait
        # for all of them (measured with the compiled send(): ~0.5 s at
        # 32 MiB, against ~0.1 s while the sender kept up). `backlogged`
        # tells send() to wait, up to backlog_wait_ms, until the sender has
        # taken the queue down to max_queued_batches (wait_for_sender):
        # throughput is what the pipeline takes, and the queue stays short.
        self.max_queued_batches = max_queued_batches
        self.backlog_wait_ms = backlog_wait_ms
        self.backlogged: _PartitionQueue | None = None
        # How many times send() waited for the sender (tests, diagnostics).
        self.hand_overs = 0
        self._sticky = sticky
        self._clock_ms = clock_ms
        # topic -> its partitions' queues, by partition number.
        self._queues: dict[str, list[_PartitionQueue]] = {}
        # Every batch from its opening until it is finished (guarded by `lock`).
        self.incomplete: set[ProducerBatch] = set()
        self.buffered_bytes = 0
        self.flushes_in_progress = 0
        self.closing = False

    # ------------------------------------------------------------ send side

    def append(
        self,
        topic: str,
        partition: int | None,
        num_partitions: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None,
        timestamp_ms: int,
        size_bytes: int,
        max_message_bytes: int,
    ) -> RecordFuture:
        """Appends a record (partition None: the topic's sticky partition) and
        returns its future. Caller holds `lock`."""
        batch, index = self.place(topic, partition, num_partitions, key, value, headers,
                                  timestamp_ms, size_bytes, max_message_bytes)
        return RecordFuture(batch, index, timestamp_ms)

    def place(
        self,
        topic: str,
        partition: int | None,
        num_partitions: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None,
        timestamp_ms: int,
        size_bytes: int,
        max_message_bytes: int,
    ) -> tuple[ProducerBatch, int]:
        """append() without the future: the batch the record went into and
        its index there. Caller holds `lock`."""
        sticky = partition is None
        if partition is None:
            partition = self._sticky.partition(topic, num_partitions)
        queues = self._queues.get(topic)
        if queues is None or len(queues) < num_partitions:
            queues = self._topic_queues(topic, num_partitions)
        queue = queues[partition]
        batch = queue.open
        if batch is not None and batch.size_bytes + size_bytes > batch.limit_bytes:
            self._close_open(queue, num_partitions)
            batch = None
            if sticky:
                # The sticky partition's batch is full: the record goes to the
                # next sticky partition, not to a new batch of this one (KIP-480).
                partition = self._sticky.partition(topic, num_partitions)
                queue = queues[partition]
                batch = queue.open
                if batch is not None and batch.size_bytes + size_bytes > batch.limit_bytes:
                    self._close_open(queue, num_partitions)
                    batch = None
        if batch is None:
            now_ms = self._clock_ms()
            batch = ProducerBatch(
                topic, partition, created_ms=now_ms,
                deadline_ms=now_ms + self.delivery_timeout_ms,
                limit_bytes=min(self.batch_size_bytes, max_message_bytes),
                compression=self.compression,
            )
            queue.open = batch
            self.incomplete.add(batch)
            self._wake()
        # ProducerBatch.add, inlined: this runs once per record.
        count = batch.record_count
        batch.keys.append(key)
        batch.values.append(value)
        batch.timestamps.append(timestamp_ms)
        if headers is not None or batch.headers is not None:
            if batch.headers is None:
                batch.headers = [None] * count
            batch.headers.append(headers)
        batch.record_count = count + 1
        self.buffered_bytes += size_bytes
        size_bytes += batch.size_bytes
        batch.size_bytes = size_bytes
        if size_bytes >= batch.limit_bytes:
            self._close_open(queue, num_partitions)
        return batch, count

    def _topic_queues(self, topic: str, num_partitions: int) -> list[_PartitionQueue]:
        queues = self._queues.setdefault(topic, [])
        while len(queues) < num_partitions:
            queues.append(_PartitionQueue())
        return queues

    def _close_open(self, queue: _PartitionQueue, num_partitions: int) -> None:
        batch = queue.open
        if batch is None:
            return
        queue.open = None
        queue.ready.append(batch)
        self._sticky.on_batch_closed(batch.topic, batch.partition, num_partitions)
        if len(queue.ready) > self.max_queued_batches and self.backlog_wait_ms > 0:
            self.backlogged = queue
        elif (
            self.requests_unanswered <= self.hand_over_max_unanswered
            and self._clock_ms() - self.last_sender_pass_ms >= self.hand_over_lag_ms
        ):
            self.hand_over_due = True
        self._wake()

    def _wake(self) -> None:
        self.woken = True
        self.wakeup.notify()

    def wake(self) -> None:
        with self.lock:
            self._wake()

    def sender_pass_done(self) -> None:
        """The sender finished a pass (sender thread; caller holds `lock`)."""
        self.sender_passes += 1
        self.last_sender_pass_ms = self._clock_ms()
        self.sender_passed.notify_all()

    @property
    def sender_wanted(self) -> bool:
        """send() should let the sender run (wait_for_sender). Caller holds `lock`."""
        return self.hand_over_due or self.backlogged is not None

    def wait_for_sender(self, max_pass_wait_s: float) -> None:
        """Lets the sender thread run (caller holds `lock`; never the sender
        thread itself): with a backlog, until it has taken the backlogged
        queue down to max_queued_batches (at most backlog_wait_ms: a store
        that does not answer must not stall send() for long; buffer memory
        bounds the rest), else for one whole pass (at most max_pass_wait_s).

        A Python thread that never blocks keeps the GIL for the whole switch
        interval (5 ms) each time another thread asks for it, and the sender
        asks many times per request (locks, gRPC calls). A tight send() loop
        thus starved it: measured with 512 KiB batches, a batch that closed
        right after commit_transaction() left 20-45 ms later, and the store
        sat idle meanwhile. Waiting here (which releases the GIL) lets the
        sender take the closed batches and start their requests in one go.
        """
        self.hand_overs += 1
        backlogged = self.backlogged
        self.backlogged = None
        self.hand_over_due = False
        if backlogged is not None:
            deadline_s = time.monotonic() + self.backlog_wait_ms / 1000
            while len(backlogged.ready) > self.max_queued_batches:
                remaining_s = deadline_s - time.monotonic()
                if remaining_s <= 0:
                    return
                self.sender_passed.wait(remaining_s)
            return
        target = self.sender_passes + 1
        deadline_s = time.monotonic() + max_pass_wait_s
        while self.sender_passes < target:
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                return
            self.sender_passed.wait(remaining_s)

    def begin_flush(self) -> list[ProducerBatch]:
        """Makes every batch sendable now and returns the incomplete ones."""
        with self.lock:
            self.flushes_in_progress += 1
            self._wake()
            return list(self.incomplete)

    def end_flush(self) -> None:
        with self.lock:
            self.flushes_in_progress -= 1

    # ------------------------------------------------------------ sender side

    def _all_queues(self) -> Iterator[tuple[str, int, _PartitionQueue]]:
        for topic, queues in self._queues.items():
            for partition, queue in enumerate(queues):
                yield topic, partition, queue

    def ready_partitions(self, now_ms: int) -> tuple[list[tuple[str, int]], int | None]:
        """Partitions with a batch to send now, and when the next open batch's
        linger runs out (None: no open batch is waiting)."""
        ready: list[tuple[str, int]] = []
        next_ms: int | None = None
        with self.lock:
            send_open = self.flushes_in_progress > 0 or self.closing
            for topic, partition, queue in self._all_queues():
                if queue.ready:
                    ready.append((topic, partition))
                    continue
                batch = queue.open
                if batch is None:
                    continue
                due_ms = batch.created_ms + self.linger_ms
                if send_open or now_ms >= due_ms:
                    ready.append((topic, partition))
                elif next_ms is None or due_ms < next_ms:
                    next_ms = due_ms
        return ready, next_ms

    def pop(self, key: tuple[str, int], now_ms: int, num_partitions: int) -> ProducerBatch | None:
        """The partition's oldest batch if it may be sent now (closing the open
        batch if its linger is over or a flush asks for it)."""
        topic, partition = key
        with self.lock:
            queues = self._queues.get(topic)
            if queues is None or partition >= len(queues):
                return None
            queue = queues[partition]
            if queue.ready:
                return queue.ready.popleft()
            batch = queue.open
            if batch is None:
                return None
            if (
                self.flushes_in_progress > 0 or self.closing
                or now_ms >= batch.created_ms + self.linger_ms
            ):
                queue.open = None
                self._sticky.on_batch_closed(batch.topic, batch.partition, num_partitions)
                return batch
            return None

    def expire(self, now_ms: int) -> list[ProducerBatch]:
        """Removes and returns queued (never sent) batches past their delivery deadline."""
        expired: list[ProducerBatch] = []
        with self.lock:
            for _topic, _partition, queue in self._all_queues():
                while queue.ready and queue.ready[0].deadline_ms <= now_ms:
                    expired.append(queue.ready.popleft())
                if queue.open is not None and queue.open.deadline_ms <= now_ms and not queue.ready:
                    expired.append(queue.open)
                    queue.open = None
        return expired

    def drain_all(self) -> list[ProducerBatch]:
        """Removes and returns every queued batch (the producer is going away)."""
        out: list[ProducerBatch] = []
        with self.lock:
            for _topic, _partition, queue in self._all_queues():
                out.extend(queue.ready)
                queue.ready.clear()
                if queue.open is not None:
                    out.append(queue.open)
                    queue.open = None
        return out

    def completed(self, batches: Sequence[ProducerBatch]) -> None:
        """Releases the memory of finished batches and wakes flush() and send()
        calls waiting for them."""
        if not batches:
            return
        with self.lock:
            for batch in batches:
                if batch in self.incomplete:
                    self.incomplete.discard(batch)
                    self.buffered_bytes -= batch.size_bytes - BATCH_OVERHEAD_BYTES
            self.changed.notify_all()

    @property
    def incomplete_count(self) -> int:
        with self.lock:
            return len(self.incomplete)
