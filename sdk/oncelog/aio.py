"""asyncio clients with aiokafka's names: `AIOProducer`, `AIOConsumer`, `AIOAdmin`.

    async with AIOProducer(bootstrap=..., transactional_id="t-0") as producer:
        await producer.init_transactions()
        async with producer.transaction():            # commit, or abort on an exception
            await producer.send_and_wait("payments", value=b"...")
    async with AIOConsumer("payments", bootstrap=..., group_id="g") as consumer:
        async for record in consumer:
            ...

Each wraps the threaded client (`Producer`, `Consumer`, `Admin`), which owns
all of the protocol: batching, sequencing, retries, transactions, group
membership. So the semantics are the threaded client's, word for word
(docs/sdk.md), and so are the keyword options, which are passed through
unchanged (`bootstrap=`, not aiokafka's `bootstrap_servers=`; serializers
included). What this module adds is the bridge: every call that may block
runs on a worker thread of the client's own — one thread per producer and
per consumer, so the calls run one at a time in the order they were made
(a consumer is used by one thread; records keep their send() order) — and
the event loop only awaits futures. `send()` returns an asyncio future
bridged from the record's future with asyncio.wrap_future. Admin calls may
run concurrently (Admin is thread-safe) and go to asyncio.to_thread.

Cancelling an await never corrupts a client: a call that has not started
yet is dropped; one already running on the worker thread (a blocking call
cannot be interrupted) runs to its end and the client is in the state that
call leaves. Cancelling `send_and_wait()` while it waits for the
acknowledgement leaves the record queued (a record cannot be taken back, as
in Kafka). Records a cancelled getone(), getmany() or getmany_columns()
fetched are not lost: the consumer seeks back to them before its next call.

aiokafka names supported:

* AIOProducer (aiokafka's AIOKafkaProducer): `start()`, `stop()`,
  `async with`, `send()` (→ a future of RecordMetadata), `send_and_wait()`,
  `flush()`, `begin_transaction()`, `commit_transaction()`,
  `abort_transaction()`, `transaction()` (async context manager),
  `send_offsets_to_transaction()`; plus `init_transactions()`,
  `send_many()` (→ one future of every record's RecordMetadata; aiokafka
  has no such call), `transaction_state`, `producer_id`, `producer_epoch`.
* AIOConsumer (AIOKafkaConsumer): `AIOConsumer(*topics, ...)`, `start()`,
  `stop()`, `async with`, `async for`, `getone(*partitions)`,
  `getmany(*partitions, timeout_ms=0, max_records=None)` (→ {TopicPartition:
  [ConsumerRecord]}), `getmany_columns(...)` (the same by the column: →
  [PartitionRecords], as Consumer.poll_columns; aiokafka has no such call),
  `subscribe(topics)`, `subscription()`, `unsubscribe()`,
  `assign(partitions)`, `assignment()`, `seek(tp, offset)`,
  `seek_to_beginning(*partitions)`, `seek_to_end(*partitions)`,
  `seek_to_committed(*partitions)`, `position(tp)`, `committed(tp)`,
  `commit(offsets=None)`, `beginning_offsets()`, `end_offsets()`,
  `offsets_for_times()`, `partitions_for_topic()` (a coroutine here); plus
  `group_metadata()`.
* AIOAdmin: every `Admin` method, as a coroutine of the same name and
  parameters (aiokafka's admin client has other names), `close()`, `async with`.

Where they differ from aiokafka:

* As in aiokafka, a client is used between `start()` and `stop()` (or
  inside `async with`); a coroutine called before start() or after stop()
  raises IllegalStateError saying so.
* A transactional AIOProducer calls `await init_transactions()` once after
  start() (aiokafka does it inside start()); `begin_transaction()` is a
  coroutine.
* `send_offsets_to_transaction(offsets, group_metadata)` takes
  `consumer.group_metadata()`, not a group id: the group coordinator accepts
  transactional offsets only from the member that owns the partitions.
* `send(topic, value, key, *, partition, headers, timestamp_ms)`: the
  options after the key are keyword-only.
* `commit()` takes {TopicPartition: offset} (no metadata strings).
* `subscribe()` takes topic names only: no pattern, no rebalance listener
  (the threaded consumer's on_assign/on_revoke callbacks would run on the
  worker thread, where an application cannot await).
* `subscribe()`, `unsubscribe()`, `assign()` and `seek()` are plain methods,
  as in aiokafka: they are queued for the worker thread, and an error the
  threaded consumer raises for one of them is raised by the next call that
  is awaited. `assignment()` and `subscription()` answer at once, from what
  the consumer had after its last call (and the queued changes).
* Not built: `pause()`/`resume()`, `highwater()`, `last_stable_offset()`,
  `send_batch()`/`create_batch()`, two-phase commit (use the threaded
  Producer).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

from oncelog._batching import SentRecords
from oncelog.admin import Admin
from oncelog.consumer import Consumer
from oncelog.producer import Producer
from oncelog.types import (
    AclBinding,
    AclFilter,
    ConsumerRecord,
    GroupDescription,
    GroupListing,
    GroupMetadata,
    GroupOffset,
    HangingTransaction,
    NewTopic,
    OffsetAndTimestamp,
    PartitionRecords,
    ProducerState,
    RecordMetadata,
    ThrottleTime,
    TopicDescription,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from oncelog.wire import errors
from oncelog.wire.errors import OncelogError
from oncelog.wire.records import Header

log = logging.getLogger("oncelog.aio")

T = TypeVar("T")
# What one poll hands out: ConsumerRecords, or PartitionRecords by the column.
_Out = TypeVar("_Out", ConsumerRecord, PartitionRecords)

# getone() and getmany() wait in polls of at most this long each, so that a
# cancelled or stopped consumer's worker thread is free again within it.
POLL_CHUNK_S = 0.5


class _Worker:
    """One thread that runs a client's blocking calls, one at a time, in the
    order they were submitted."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        return self._executor.submit(fn)

    async def run(self, fn: Callable[[], T]) -> T:
        """fn() on the worker thread. Cancelling the await before fn started
        drops it; once started it runs to its end and its result is dropped."""
        return await asyncio.wrap_future(self._executor.submit(fn))

    def shutdown(self) -> None:
        # A call still running ends by itself; nothing waits for it here.
        self._executor.shutdown(wait=False)


def _first_offsets(records: Sequence[ConsumerRecord] | Sequence[PartitionRecords],
                   ) -> dict[TopicPartition, int]:
    """The first offset of each partition among a poll's records."""
    first: dict[TopicPartition, int] = {}
    for r in records:
        offset = r.offsets[0] if isinstance(r, PartitionRecords) else r.offset
        tp = TopicPartition(r.topic, r.partition)
        first[tp] = min(first.get(tp, offset), offset)
    return first


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Marks a future's exception as seen: its awaiter was cancelled, and
    asyncio would log the exception as never retrieved."""
    if not future.cancelled():
        future.exception()


class AIOProducer:
    """An asyncio Producer (aiokafka's AIOKafkaProducer names). Takes the
    threaded Producer's keyword options, serializers included."""

    def __init__(self, **options: Any) -> None:
        self._producer = Producer(**options)
        self._worker = _Worker("oncelog-aio-producer")
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Starts using the producer. The threaded producer connects on its
        first call, so there is nothing to wait for; a transactional producer
        calls init_transactions() next."""
        if self._stopped:
            raise errors.IllegalStateError("start() on a stopped AIOProducer")
        self._started = True

    @property
    def produce_throttle_time(self) -> ThrottleTime:
        """The threaded producer's (the stores' throttle times, summed)."""
        return self._producer.produce_throttle_time

    async def stop(self) -> None:
        """Delivers what is queued and closes (an open transaction is
        aborted first, as Producer.close() does)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            await self._worker.run(self._producer.close)
        finally:
            self._worker.shutdown()

    async def __aenter__(self) -> AIOProducer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    def _check(self, method: str) -> None:
        if self._stopped:
            raise errors.IllegalStateError(f"{method}() on a stopped AIOProducer")
        if not self._started:
            raise errors.IllegalStateError(
                f"{method}() before start(): await producer.start() first, or use "
                "`async with AIOProducer(...)`"
            )

    async def _run(self, method: str, fn: Callable[[], T]) -> T:
        self._check(method)
        return await self._worker.run(fn)

    # ------------------------------------------------------------ sending

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        *,
        partition: int | None = None,
        headers: Sequence[Header] | Mapping[str, bytes | None] | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queues a record (Producer.send on the worker thread) and returns
        an asyncio future of its RecordMetadata: `await (await
        producer.send(...))`. What Producer.send raises, this raises (bad
        arguments, errors.SerializationError); what fails its future fails
        this one."""
        record_future = await self._run("send", functools.partial(
            self._producer.send, topic, value, key, partition, headers, timestamp_ms))
        # A RecordFuture cannot be cancelled, so cancelling this asyncio
        # future (or an await of it) never reaches the producer.
        return asyncio.wrap_future(record_future)

    async def send_many(
        self,
        topic: str,
        values: Sequence[Any],
        keys: Sequence[Any] | None = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[SentRecords]:
        """Producer.send_many on the worker thread: queues the records and
        returns an asyncio future of their metadata, in the order given
        (`await (await producer.send_many(...))`)."""
        many_future = await self._run("send_many", functools.partial(
            self._producer.send_many, topic, values, keys, partition, timestamp_ms))
        return asyncio.wrap_future(many_future)

    async def send_and_wait(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        *,
        partition: int | None = None,
        headers: Sequence[Header] | Mapping[str, bytes | None] | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        """send(), then waits for the acknowledgement. Cancelled while it
        waits, the record stays queued and is delivered (or fails) as any
        other."""
        delivery = await self.send(topic, value, key, partition=partition, headers=headers,
                                   timestamp_ms=timestamp_ms)
        return await delivery

    async def flush(self, timeout: float | None = None) -> None:
        """Waits until every record sent before it is acknowledged or failed."""
        await self._run("flush", functools.partial(self._producer.flush, timeout))

    # ------------------------------------------------------------ transactions

    async def init_transactions(self, timeout: float | None = None) -> None:
        await self._run("init_transactions",
                        functools.partial(self._producer.init_transactions, timeout))

    async def begin_transaction(self) -> None:
        await self._run("begin_transaction", self._producer.begin_transaction)

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int],
        group_metadata: GroupMetadata,
        timeout: float | None = None,
    ) -> None:
        """Producer.send_offsets_to_transaction: `group_metadata` is the
        consumer's (AIOConsumer.group_metadata())."""
        await self._run("send_offsets_to_transaction", functools.partial(
            self._producer.send_offsets_to_transaction, offsets, group_metadata, timeout))

    async def commit_transaction(self, timeout: float | None = None) -> None:
        await self._run("commit_transaction",
                        functools.partial(self._producer.commit_transaction, timeout))

    async def abort_transaction(self, timeout: float | None = None) -> None:
        await self._run("abort_transaction",
                        functools.partial(self._producer.abort_transaction, timeout))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """`async with producer.transaction():` begins a transaction, commits
        it when the block ends, and aborts it when the block raises (the
        exception goes on). A producer that is finished (fenced, fatal) is
        not asked to abort."""
        await self.begin_transaction()
        try:
            yield
        except (Exception, asyncio.CancelledError):
            if self.transaction_state != "fatal_error":
                try:
                    await self.abort_transaction()
                except OncelogError as abort_failure:
                    log.warning("aborting the transaction after an error failed: %s",
                                abort_failure)
            raise
        await self.commit_transaction()

    @property
    def transaction_state(self) -> str | None:
        return self._producer.transaction_state

    @property
    def producer_id(self) -> int:
        return self._producer.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._producer.producer_epoch


class _PollCall:
    """One poll on the worker thread, and whether its awaiter gave up."""

    __slots__ = ("abandoned", "records")

    def __init__(self) -> None:
        self.abandoned = False
        # Set once the poll returned, unless its awaiter gave up first.
        self.records: Sequence[ConsumerRecord] | Sequence[PartitionRecords] | None = None


class AIOConsumer:
    """An asyncio Consumer (aiokafka's AIOKafkaConsumer names):
    `AIOConsumer(*topics, bootstrap=..., group_id=..., ...)` subscribes to
    `topics` on start(). Takes the threaded Consumer's keyword options,
    deserializers included."""

    def __init__(self, *topics: str, **options: Any) -> None:
        for topic in topics:
            if not isinstance(topic, str) or not topic:
                raise ValueError(f"topic names must be non-empty str, got {topic!r}")
        self._consumer = Consumer(**options)
        self._topics = list(dict.fromkeys(topics))
        self._worker = _Worker("oncelog-aio-consumer")
        # Guards what the worker thread and the event loop both touch: the
        # rewinds, the deferred error, the queued changes and the views.
        self._lock = threading.Lock()
        # The first offset of each partition in the records polled for an
        # awaiter that was cancelled: the next call on the worker thread
        # seeks back to them first.
        self._rewinds: list[dict[TopicPartition, int]] = []
        # The error of a queued plain method (seek, assign, ...), raised by
        # the next call that is awaited.
        self._deferred: BaseException | None = None
        self._queued_changes = 0
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._subscription: frozenset[str] = frozenset()
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Subscribes to the topics given to the constructor, if any (the
        group is joined by the first getone()/getmany())."""
        if self._stopped:
            raise errors.IllegalStateError("start() on a stopped AIOConsumer")
        if self._started:
            return
        self._started = True
        if self._topics:
            topics = list(self._topics)
            with self._lock:
                self._subscription = frozenset(topics)
            await self._run("start", lambda: self._consumer.subscribe(topics))

    @property
    def fetch_throttle_time(self) -> ThrottleTime:
        """The threaded consumer's (the stores' throttle times, summed)."""
        return self._consumer.fetch_throttle_time

    async def stop(self) -> None:
        """Leaves the group (auto-commit, if on, first) and closes, after the
        calls queued before it. An `async for` over the consumer ends."""
        if self._stopped:
            return
        self._stopped = True

        def close() -> None:
            with self._lock:
                rewinds, self._rewinds = self._rewinds, []
                self._deferred = None
            try:
                # Before an auto-commit on close: what was never handed out
                # is not committed.
                self._apply_rewinds(rewinds)
            finally:
                self._consumer.close()

        try:
            await self._worker.run(close)
        finally:
            self._worker.shutdown()

    async def __aenter__(self) -> AIOConsumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    def __aiter__(self) -> AIOConsumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        record = await self._next_record(None)
        if record is None:
            raise StopAsyncIteration
        return record

    # ------------------------------------------------------------ the worker

    def _check(self, method: str) -> None:
        self._check_not_stopped(method)
        if not self._started:
            raise errors.IllegalStateError(
                f"{method}() before start(): await consumer.start() first, or use "
                "`async with AIOConsumer(...)`"
            )

    def _job(self, fn: Callable[[], T]) -> Callable[[], T]:
        """fn as a call on the worker thread: first the rewinds of cancelled
        polls and the error a queued change left, then fn, then the views."""

        def job() -> T:
            with self._lock:
                pending = self._take_pending()
            return self._run_job(pending, fn)

        return job

    def _take_pending(self) -> tuple[list[dict[TopicPartition, int]], BaseException | None]:
        """The rewinds and the deferred error a job must see first. Caller
        holds the lock."""
        rewinds, self._rewinds = self._rewinds, []
        deferred, self._deferred = self._deferred, None
        return rewinds, deferred

    def _run_job(self, pending: tuple[list[dict[TopicPartition, int]], BaseException | None],
                 fn: Callable[[], T]) -> T:
        rewinds, deferred = pending
        try:
            self._apply_rewinds(rewinds)
            if deferred is not None:
                raise deferred
            return fn()
        finally:
            self._publish()

    async def _run(self, method: str, fn: Callable[[], T]) -> T:
        self._check(method)
        return await self._worker.run(self._job(fn))

    def _check_not_stopped(self, method: str) -> None:
        if self._stopped:
            raise errors.IllegalStateError(f"{method}() on a stopped AIOConsumer")

    def _queue_change(self, change: Callable[[], None]) -> None:
        """A plain method's change (seek, assign, ...), queued for the worker
        thread; its error waits for the next awaited call."""

        def run_change() -> None:
            with self._lock:
                rewinds, self._rewinds = self._rewinds, []
            try:
                self._apply_rewinds(rewinds)
                change()
            except Exception as exc:
                with self._lock:
                    if self._deferred is None:
                        self._deferred = exc
            finally:
                with self._lock:
                    self._queued_changes -= 1
                self._publish()

        with self._lock:
            self._queued_changes += 1
        self._worker.submit(run_change)

    def _publish(self) -> None:
        """Worker thread: what assignment() and subscription() answer, unless
        changes are still queued (then they keep what those changes said)."""
        with self._lock:
            if self._queued_changes:
                return
            self._assignment = frozenset(self._consumer.assignment())
            self._subscription = frozenset(self._consumer.subscription())

    def _apply_rewinds(self, rewinds: list[dict[TopicPartition, int]]) -> None:
        """Worker thread: seeks each partition back to the first record a
        cancelled poll fetched for it, so that none of them is skipped."""
        first: dict[TopicPartition, int] = {}
        for offsets in rewinds:
            for tp, offset in offsets.items():
                first[tp] = min(first.get(tp, offset), offset)
        if not first:
            return
        assigned = self._consumer.assignment()
        for tp, offset in first.items():
            if tp in assigned:  # a partition revoked meanwhile has a new owner
                self._consumer.seek(tp, offset)

    async def _poll(self, method: str, fetch: Callable[[], list[_Out]]) -> list[_Out]:
        """One poll (`fetch`: the threaded consumer's) on the worker thread.
        If the awaiter is cancelled, the records that poll fetched are given
        back (see _apply_rewinds)."""
        self._check(method)
        call = _PollCall()

        def poll() -> list[_Out]:
            records = fetch()
            with self._lock:
                abandoned = call.abandoned
                if not abandoned:
                    call.records = records
            if abandoned:
                self._apply_rewinds([_first_offsets(records)])
                return []
            return records

        def job() -> list[_Out]:
            with self._lock:
                if call.abandoned:
                    # Never started: the rewinds and a deferred error wait
                    # for the next call, whose awaiter is there to get it.
                    return []
                pending = self._take_pending()
            return self._run_job(pending, poll)

        waiting = asyncio.wrap_future(self._worker.submit(job))
        try:
            # Shielded: a poll that started cannot be stopped, and its
            # records must reach _rewinds if nobody takes them.
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            waiting.add_done_callback(_retrieve)
            with self._lock:
                call.abandoned = True
                if call.records:
                    self._rewinds.append(_first_offsets(call.records))
            raise

    async def _next_record(self, partitions: frozenset[TopicPartition] | None
                           ) -> ConsumerRecord | None:
        """The next record, waiting as long as it takes; None once stopped."""
        while not self._stopped:
            records = await self._poll(
                "getone", lambda: self._consumer._poll(POLL_CHUNK_S, 1, partitions))
            if records:
                return records[0]
        return None

    # ------------------------------------------------------------ reading

    async def getone(self, *partitions: TopicPartition) -> ConsumerRecord:
        """The next record (of `partitions`, if given), waiting as long as
        it takes."""
        record = await self._next_record(_partition_set(partitions))
        if record is None:
            raise errors.IllegalStateError("getone() on a stopped AIOConsumer")
        return record

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0,
                      max_records: int | None = None
                      ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records (of `partitions`, if given; at most `max_records`, default
        max_poll_records) by partition, as soon as there are some, or {}
        after `timeout_ms`."""
        only = _partition_set(partitions)
        records = await self._poll_until(
            "getmany", timeout_ms, max_records,
            lambda timeout_s: self._consumer._poll(timeout_s, max_records, only))
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        for r in records:
            out.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
        return out

    async def getmany_columns(self, *partitions: TopicPartition, timeout_ms: int = 0,
                              max_records: int | None = None) -> list[PartitionRecords]:
        """getmany() by the column (Consumer.poll_columns): the same records,
        waiting and positions, as one PartitionRecords per partition that
        has records. Raises IllegalStateError for a consumer with a key or
        value deserializer."""
        only = _partition_set(partitions)
        return await self._poll_until(
            "getmany_columns", timeout_ms, max_records,
            lambda timeout_s: self._consumer._poll_columns(timeout_s, max_records, only))

    async def _poll_until(self, method: str, timeout_ms: int, max_records: int | None,
                          poll: Callable[[float], list[_Out]]) -> list[_Out]:
        """`poll(timeout_s)`'s records as soon as there are some, or [] after
        timeout_ms: polls of at most POLL_CHUNK_S each, so that stop() is
        never kept waiting for long."""
        if type(timeout_ms) is not int or timeout_ms < 0:
            raise ValueError(f"timeout_ms must be an int >= 0, got {timeout_ms!r}")
        if max_records is not None and (type(max_records) is not int or max_records < 1):
            raise ValueError(f"max_records must be an int >= 1 or None, got {max_records!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            left_s = deadline - loop.time()
            chunk_s = max(0.0, min(left_s, POLL_CHUNK_S))
            records = await self._poll(method, functools.partial(poll, chunk_s))
            if records or left_s <= POLL_CHUNK_S or self._stopped:
                return records

    # ------------------------------------------------------------ assignment

    def subscribe(self, topics: Iterable[str]) -> None:
        """Joins the group for these topics (Consumer.subscribe), at the
        next call on the worker thread."""
        self._check_not_stopped("subscribe")
        if isinstance(topics, str):
            raise TypeError(f"subscribe() takes a list of topic names, got the str {topics!r}")
        names = list(topics)
        with self._lock:
            self._subscription = frozenset(names)
        self._queue_change(lambda: self._consumer.subscribe(names))

    def unsubscribe(self) -> None:
        """Leaves the group (or drops the assignment), queued."""
        self._check_not_stopped("unsubscribe")
        with self._lock:
            self._subscription = frozenset()
            self._assignment = frozenset()
        self._queue_change(self._consumer.unsubscribe)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Reads exactly these partitions (Consumer.assign), queued."""
        self._check_not_stopped("assign")
        tps = list(partitions)
        for tp in tps:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"assign() takes TopicPartition values, got {tp!r}")
        with self._lock:
            self._assignment = frozenset(tps)
        self._queue_change(lambda: self._consumer.assign(tps))

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def subscription(self) -> set[str]:
        return set(self._subscription)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The next records of `partition` start at `offset` (queued, ahead
        of any later call)."""
        self._check_not_stopped("seek")
        if not isinstance(partition, TopicPartition):
            raise TypeError(f"seek() takes a TopicPartition, got {partition!r}")
        if type(offset) is not int or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        if partition not in self._assignment:
            raise errors.IllegalStateError(
                f"partition {partition.topic}-{partition.partition} is not assigned")
        self._queue_change(lambda: self._consumer.seek(partition, offset))

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        await self._run("seek_to_beginning", lambda: self._consumer.seek_to_beginning(
            list(partitions) or None))

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        await self._run("seek_to_end", lambda: self._consumer.seek_to_end(
            list(partitions) or None))

    async def seek_to_committed(self, *partitions: TopicPartition
                                ) -> dict[TopicPartition, int | None]:
        """Every assigned partition (or those given) back to the group's
        committed offset; returns those offsets (None: none)."""
        return await self._run("seek_to_committed", lambda: self._consumer.seek_to_committed(
            list(partitions) or None))

    # ------------------------------------------------------------ offsets

    async def position(self, partition: TopicPartition) -> int:
        return await self._run("position", lambda: self._consumer.position(partition))

    async def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed offset of one partition (None: none), as
        aiokafka has it; stable (waits while a transactional offset is
        pending)."""
        return await self._run("committed",
                               lambda: self._consumer.committed([partition])[partition])

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commits `offsets`, or the position of every partition (the records
        handed out so far)."""
        await self._run("commit", lambda: self._consumer.commit(offsets))

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]
                                ) -> dict[TopicPartition, int]:
        tps = list(partitions)
        return await self._run("beginning_offsets",
                               lambda: self._consumer.beginning_offsets(tps))

    async def end_offsets(self, partitions: Iterable[TopicPartition]
                          ) -> dict[TopicPartition, int]:
        tps = list(partitions)
        return await self._run("end_offsets", lambda: self._consumer.end_offsets(tps))

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]
                                ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        wanted = dict(timestamps)
        return await self._run("offsets_for_times",
                               lambda: self._consumer.offsets_for_times(wanted))

    async def partitions_for_topic(self, topic: str) -> set[int]:
        return await self._run("partitions_for_topic",
                               lambda: self._consumer.partitions_for_topic(topic))

    def group_metadata(self) -> GroupMetadata:
        """For AIOProducer.send_offsets_to_transaction (read under the
        consumer's lock, so answered at once)."""
        return self._consumer.group_metadata()


def _partition_set(partitions: tuple[TopicPartition, ...]) -> frozenset[TopicPartition] | None:
    for tp in partitions:
        if not isinstance(tp, TopicPartition):
            raise TypeError(f"expected TopicPartition values, got {tp!r}")
    return frozenset(partitions) if partitions else None


class AIOAdmin:
    """An asyncio Admin: each of Admin's methods as a coroutine of the same
    name and parameters, run with asyncio.to_thread (Admin is thread-safe,
    so calls may overlap). Takes Admin's keyword options."""

    def __init__(self, **options: Any) -> None:
        self._admin = Admin(**options)
        self._closed = False

    async def start(self) -> None:
        """Nothing to wait for: the admin connects on its first call."""
        if self._closed:
            raise errors.IllegalStateError("start() on a closed AIOAdmin")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._admin.close)

    async def __aenter__(self) -> AIOAdmin:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def _call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._closed:
            raise errors.IllegalStateError(f"{method.__name__}() on a closed AIOAdmin")
        return await asyncio.to_thread(method, *args, **kwargs)

    # ------------------------------------------------------------ topics

    async def create_topic(self, name: str, partitions: int = 1,
                           config: Mapping[str, str] | None = None, *,
                           replication_factor: int = 0, exist_ok: bool = False) -> None:
        await self._call(self._admin.create_topic, name, partitions, config,
                         replication_factor=replication_factor, exist_ok=exist_ok)

    async def create_topics(self, topics: Iterable[NewTopic], *, validate_only: bool = False
                            ) -> dict[str, OncelogError | None]:
        return await self._call(self._admin.create_topics, list(topics),
                                validate_only=validate_only)

    async def create_partitions(self, new_partitions: Mapping[str, int], *,
                                validate_only: bool = False) -> None:
        await self._call(self._admin.create_partitions, dict(new_partitions),
                         validate_only=validate_only)

    async def alter_partition_reassignments(
            self, reassignments: Mapping[TopicPartition, Sequence[int]]
    ) -> dict[TopicPartition, OncelogError | None]:
        return await self._call(self._admin.alter_partition_reassignments, reassignments)

    async def list_partition_reassignments(self) -> dict[TopicPartition, tuple[int, ...]]:
        return await self._call(self._admin.list_partition_reassignments)

    async def delete_topic(self, name: str) -> None:
        await self._call(self._admin.delete_topic, name)

    async def delete_topics(self, names: Iterable[str]) -> dict[str, OncelogError | None]:
        return await self._call(self._admin.delete_topics, list(names))

    async def list_topics(self) -> dict[str, int]:
        return await self._call(self._admin.list_topics)

    async def describe_topic(self, name: str) -> TopicDescription:
        return await self._call(self._admin.describe_topic, name)

    # ------------------------------------------------------------ transactions

    async def list_transactions(self, states: Iterable[str] | None = None,
                                producer_ids: Iterable[int] | None = None
                                ) -> list[TransactionListing]:
        return await self._call(self._admin.list_transactions, states, producer_ids)

    async def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        return await self._call(self._admin.describe_transaction, transactional_id)

    async def abort_transaction(self, transactional_id: str) -> TransactionDescription:
        return await self._call(self._admin.abort_transaction, transactional_id)

    async def describe_producers(self, partition: TopicPartition) -> list[ProducerState]:
        return await self._call(self._admin.describe_producers, partition)

    async def find_hanging_transactions(
            self, *, max_transaction_timeout_ms: int = 900000,
            topics: Iterable[str] | None = None) -> list[HangingTransaction]:
        return await self._call(self._admin.find_hanging_transactions,
                                max_transaction_timeout_ms=max_transaction_timeout_ms,
                                topics=topics)

    async def abort_hanging_transaction(self, partition: TopicPartition,
                                        producer_id: int) -> None:
        await self._call(self._admin.abort_hanging_transaction, partition, producer_id)

    # ------------------------------------------------------------ groups

    async def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        return await self._call(self._admin.list_groups, states)

    async def describe_group(self, group_id: str) -> GroupDescription:
        return await self._call(self._admin.describe_group, group_id)

    async def list_group_offsets(self, group_id: str,
                                 partitions: Iterable[TopicPartition] | None = None
                                 ) -> dict[TopicPartition, GroupOffset]:
        return await self._call(self._admin.list_group_offsets, group_id, partitions)

    async def alter_group_offsets(self, group_id: str,
                                  offsets: Mapping[TopicPartition, int]) -> None:
        await self._call(self._admin.alter_group_offsets, group_id, offsets)

    async def reset_group_offsets(self, group_id: str,
                                  partitions: Iterable[TopicPartition] | None = None, *,
                                  to: str | None = None, offset: int | None = None,
                                  timestamp_ms: int | None = None, dry_run: bool = False
                                  ) -> dict[TopicPartition, int]:
        return await self._call(self._admin.reset_group_offsets, group_id, partitions,
                                to=to, offset=offset, timestamp_ms=timestamp_ms,
                                dry_run=dry_run)

    async def delete_group(self, group_id: str) -> None:
        await self._call(self._admin.delete_group, group_id)

    # ------------------------------------------------------------ ACLs

    async def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        await self._call(self._admin.create_acls, list(bindings))

    async def describe_acls(self, filter: AclFilter | AclBinding | None = None
                            ) -> list[AclBinding]:
        return await self._call(self._admin.describe_acls, filter)

    async def delete_acls(self, filters: Iterable[AclFilter | AclBinding]) -> list[AclBinding]:
        return await self._call(self._admin.delete_acls, list(filters))
