"""The producer's facade: the API users call, over batching, pipelined
sends and idempotent retries.

`send()` appends the record to its partition's open batch (the record
accumulator, `_batching.py`) and returns a future at once. A background
sender thread (`_sender.py`) takes batches when they are full, when they
have waited `linger_ms`, or on `flush()`; gives each its sequence number
(idempotence); encodes it once; groups the batches by store node into one
Produce request per node, up to `max_in_flight` unacknowledged batches per
partition; and resolves each batch's futures when its answer comes. Retries
re-send the identical bytes, so the store's deduplication makes a retry after
a lost answer harmless. See docs/sdk.md for the guarantees and
`_sequencing.py` for the retry rules.

With a `transactional_id` the producer is transactional (docs/sdk.md,
"Transactions"): its transaction manager (`_txn_manager.py`) holds the
client-side state (`_transactions.TxnStateMachine`, one table) and runs
InitProducerId, TxnOffsetCommit and EndTxn on the user's thread (blocking,
with retries); the transactional methods here hand each call to it. The
sender thread sends transactional batches down the same batched, pipelined
path as idempotent ones, asking the store to add each partition to the
transaction before its first batch there (`add_partitions_to_txn`).

`key_serializer`/`value_serializer` (kafka-python's hooks; ready ones in
`oncelog.serializers`) turn what send() is given into bytes before anything
else happens; a serializer that fails is a record failed in send()
(errors.SerializationError, and inside a transaction a broken transaction).

With `transaction_two_phase_commit_enable` the producer can take part in an
outside two-phase commit (KIP-939; docs/sdk.md, "Two-phase commit"):
`prepare_transaction()` flushes and prepares the transaction and returns its
PreparedTxnState; the transaction then never times out and outlives this
producer, and `complete_transaction(state)` — from this producer, or from a
new one with the same transactional id after
`init_transactions(keep_prepared_txn=True)` — commits it if it is the one the
state names, else aborts it.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from oncelog._batching import (
    BATCH_OVERHEAD_BYTES,
    FINISHED,
    RECORD_OVERHEAD_BYTES,
    ManyRecordsFuture,
    ProducerBatch,
    RecordAccumulator,
    RecordFuture,
    SentRecords,
    failed_batch,
    failed_future,
    record_size_bytes,
)
from oncelog._client import (
    ClusterClient,
    TopicInfo,
    backoff_ms,
)
from oncelog._config import DEFAULT_CLIENT_ID
from oncelog._keywords import kafka_names
from oncelog._mypyc import mypyc_attr
from oncelog._partitioner import StickyPartitioner, partition_for_key
from oncelog._security import PLAINTEXT, TokenProvider
from oncelog._sender import Sender
from oncelog._transactions import (
    Op,
    ProducerTxnState,
    TxnStateMachine,
)
from oncelog._txn_manager import TransactionManager
from oncelog.config_def import PRODUCER, validate
from oncelog.errors import SerializationError
from oncelog.serializers import Serializer
from oncelog.types import GroupMetadata, PreparedTxnState, ThrottleTime, TopicPartition
from oncelog.wire import errors
from oncelog.wire.compression import Codec
from oncelog.wire.errors import ErrorCode, OncelogError
from oncelog.wire.records import Header

log = logging.getLogger("oncelog.producer")


# send() waiting for a topic asks Metadata again only with at least this much
# of max_block_ms left; with less, the last answer decides.
MIN_METADATA_REFRESH_MS = 50
# How long send() waits at most for a lagging sender thread's pass (a sender
# blocked in a call, such as InitProducerId, must not stall send() for long).
SENDER_HAND_OVER_MAX_S = 0.02
# How long send() waits at most for the sender to take a backlogged
# partition's closed batches (see RecordAccumulator.max_queued_batches), and
# never longer than max_block_ms.
BACKLOG_WAIT_MAX_MS = 100
_IN_TRANSACTION = ProducerTxnState.IN_TRANSACTION


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(
        f"{what} must be bytes (or None), got {type(value).__name__}; "
        f"encode it first, e.g. value.encode()"
    )


def _check_headers(headers: Sequence[Header] | Mapping[str, bytes | None]) -> tuple[Header, ...]:
    # Each item is checked here, so it is taken as whatever the caller
    # passed: typed as a Header, the compiled module (mypyc) would refuse a
    # malformed one with its own TypeError before these checks could name it.
    items: Iterable[Any] = headers.items() if isinstance(headers, Mapping) else headers
    out: list[Header] = []
    for item in items:
        try:
            hkey, hvalue = item
        except (TypeError, ValueError):
            raise TypeError(f"a header must be a (str, bytes | None) pair, got {item!r}") from None
        if not isinstance(hkey, str):
            raise TypeError(f"header key must be str, got {type(hkey).__name__}")
        if hvalue is not None and type(hvalue) is not bytes:
            hvalue = _as_bytes(hvalue, f"value of header {hkey!r}")
        out.append((hkey, hvalue))
    return tuple(out)


# Not `@kafka_names` on the class: mypyc compiles a class with any decorator
# but its own as a plain Python class (it fails on this one), and the
# compiled wheel's `send()` depends on a native one. A native class cannot
# be changed after it is made unless it allows interpreted subclasses, so
# it does, and kafka_names() wraps its __init__ after the class statement.
@mypyc_attr(allow_interpreted_subclasses=True)
class Producer:
    """Sends records to topics; idempotent by default, transactional with a
    `transactional_id`.

    Thread-safe: any number of threads may call send() concurrently. The
    transactional calls (init_transactions, begin_transaction,
    send_offsets_to_transaction, commit_transaction, abort_transaction) are
    meant for one thread at a time, as in Kafka.
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        transactional_id: str | None = None,
        enable_idempotence: bool | None = None,
        acks: str | int = "all",
        linger_ms: int = 5,
        batch_size: int = 16384,
        compression_type: str = "none",
        max_in_flight: int = 5,
        transaction_timeout_ms: int = 60_000,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        buffer_memory_bytes: int = 32 * 1024 * 1024,
        max_block_ms: int = 60_000,
        transaction_two_phase_commit_enable: bool = False,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
        security_protocol: str = PLAINTEXT,
        ssl_cafile: str | os.PathLike[str] | None = None,
        ssl_certfile: str | os.PathLike[str] | None = None,
        ssl_keyfile: str | os.PathLike[str] | None = None,
        sasl_mechanism: str | None = None,
        sasl_oauth_token_provider: TokenProvider | None = None,
        client_id: str = DEFAULT_CLIENT_ID,
    ) -> None:
        """Options as Kafka's producer has them (in Python spelling); each is
        checked here, and a wrong one is a ValueError naming it.

        `client_id` (Kafka's client.id): this producer's name in the
        stores' quotas, with its principal. A store that answers with a
        throttle time (its quota is exceeded) is sent nothing more until it
        has passed; `produce_throttle_time` sums what they answered.

        `security_protocol`, `ssl_*` and `sasl_*` (kafka-python's names):
        how to connect to a secured cluster (oncelog._security).

        `compression_type`: Kafka's names, "none" (the default), "gzip",
        "snappy", "lz4" or "zstd": the codec of every batch's records
        (oncelog.wire.compression); `batch_size` counts records before
        compression, as in Kafka.

        `enable_idempotence` defaults to True, except with `acks=1` (as in
        Kafka, where an unset enable.idempotence gives way to acks). `acks`:
        "all" (or -1, the default) or 1; see oncelog._config.acks_option.
        oncelog.config_def lists every option with its check.

        `key_serializer`/`value_serializer` (kafka-python's hooks): callables
        that turn the key and value given to send() into bytes, before
        anything else send() does; a None key or value is not passed to them
        (oncelog.serializers has ready ones)."""
        # Every option checked against the table (oncelog.config_def), and
        # what ties them together (idempotence, acks, the security settings).
        options = validate(PRODUCER, {
            "bootstrap": bootstrap, "transactional_id": transactional_id,
            "enable_idempotence": enable_idempotence, "acks": acks, "linger_ms": linger_ms,
            "batch_size": batch_size, "compression_type": compression_type,
            "max_in_flight": max_in_flight, "transaction_timeout_ms": transaction_timeout_ms,
            "delivery_timeout_ms": delivery_timeout_ms, "request_timeout_ms": request_timeout_ms,
            "retry_backoff_ms": retry_backoff_ms, "retry_backoff_max_ms": retry_backoff_max_ms,
            "buffer_memory_bytes": buffer_memory_bytes, "max_block_ms": max_block_ms,
            "transaction_two_phase_commit_enable": transaction_two_phase_commit_enable,
            "key_serializer": key_serializer, "value_serializer": value_serializer,
            "security_protocol": security_protocol, "ssl_cafile": ssl_cafile,
            "ssl_certfile": ssl_certfile, "ssl_keyfile": ssl_keyfile,
            "sasl_mechanism": sasl_mechanism,
            "sasl_oauth_token_provider": sasl_oauth_token_provider, "client_id": client_id,
        })
        self.acks = options["acks"]
        idempotent: bool = options["enable_idempotence"]
        compression = Codec[compression_type.upper()]
        self._client = ClusterClient(
            bootstrap, request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            security=options.security,
        )
        self._enable_idempotence = idempotent
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._buffer_memory_bytes = buffer_memory_bytes
        self._max_block_ms = max_block_ms
        self._accumulator = RecordAccumulator(
            batch_size_bytes=batch_size, linger_ms=linger_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            buffer_memory_bytes=buffer_memory_bytes,
            sticky=StickyPartitioner(random.Random()),
            clock_ms=_now_ms,
            backlog_wait_ms=min(max_block_ms, BACKLOG_WAIT_MAX_MS),
            compression=compression,
        )
        # topic -> (number of partitions, max.message.bytes), valid for one
        # metadata version.
        self._topics: dict[str, tuple[int, int]] = {}
        self._topics_version = -1
        self._closed = False
        self._close_lock = threading.Lock()
        # The transaction's state and calls (None without a transactional_id),
        # and its state machine, which send() reads once per record without
        # a call through the manager.
        self._txn: TransactionManager | None = None
        self._txn_machine: TxnStateMachine | None = None
        if transactional_id is not None:
            self._txn = TransactionManager(
                client=self._client, accumulator=self._accumulator,
                transactional_id=transactional_id,
                transaction_timeout_ms=transaction_timeout_ms,
                two_phase_commit=transaction_two_phase_commit_enable,
                max_block_ms=max_block_ms, flush=self.flush,
            )
            self._txn_machine = self._txn.machine
        self._sender = Sender(
            client=self._client, accumulator=self._accumulator,
            idempotent=idempotent, max_in_flight=max_in_flight,
            request_timeout_ms=request_timeout_ms, retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            transaction_timeout_ms=transaction_timeout_ms, clock_ms=_now_ms,
            txn=self._txn, client_id=options["client_id"],
        )
        if self._txn is not None:
            self._txn.attach(self._sender)
        self._sender.start()

    # ------------------------------------------------------------------ API

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        headers: Sequence[Header] | Mapping[str, bytes | None] | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordFuture:
        """Queues a record; returns a future of its RecordMetadata.

        `key` and `value` are bytes (or None), or whatever the producer's
        key_serializer/value_serializer take; a serializer that raises (or
        returns something other than bytes) makes send() raise
        errors.SerializationError, caused by the serializer's exception.

        Bad arguments raise TypeError/ValueError here; anything about the
        cluster fails the future instead: a topic (or partition) that is not
        in the cluster's metadata within max_block_ms, a record over the
        topic's max.message.bytes, buffer memory still full after
        max_block_ms, and delivery failures. Inside a transaction, any of
        these — a bad argument or a failed serializer too — breaks the
        transaction: the record is not in it, so commit_transaction() raises
        TransactionAbortableError naming it, and abort_transaction() lets the
        producer go on (as Kafka's producer does).
        """
        if self._key_serializer is not None or self._value_serializer is not None:
            key, value = self._serialize(topic, partition, key, value)
        try:
            return self._send(topic, value, key, partition, headers, timestamp_ms)
        except (TypeError, ValueError) as exc:
            self._break_transaction(topic, -1 if type(partition) is not int else partition,
                                    exc)
            raise

    def send_many(
        self,
        topic: str,
        values: Sequence[Any],
        keys: Sequence[Any] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> ManyRecordsFuture:
        """Queues many records of one topic in one call; returns one future
        of them all (confluent-kafka's produce_batch, with a future).

        The records are values[i] with keys[i] (keys None: no keys), without
        headers, all stamped `timestamp_ms` (None: now). `partition` None
        places each record as send() would (by its key, else the sticky
        partition). The future is done when every record is; its result is
        a sequence of their RecordMetadata in the order given; if any
        record failed, it raises the first failure (by that order).

        It does what send() does for each record, checked once for the
        call: bad arguments and a record over the topic's max.message.bytes
        queue nothing; a topic unknown after max_block_ms fails the future.
        It is the path for callers that already hold many records: it costs
        a fraction of send()'s per-record work and makes no future per
        record. Inside a transaction its records are part of it like sent
        ones, and any failure breaks the transaction."""
        if not isinstance(values, Sequence) or isinstance(values, bytes | str):
            raise TypeError(f"values must be a sequence of values, got {type(values).__name__}")
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"keys has {len(keys)} items and values {len(values)}")
        where = -1 if type(partition) is not int else partition
        try:
            return self._send_many(topic, values, keys, partition, timestamp_ms)
        except (TypeError, ValueError, SerializationError) as exc:
            self._break_transaction(topic, where, exc)
            raise

    def _send_many(self, topic: str, values: Sequence[Any], keys: Sequence[Any] | None,
                   partition: int | None, timestamp_ms: int | None) -> ManyRecordsFuture:
        if self._closed:
            raise errors.IllegalStateError("send_many() on a closed producer")
        if not values:
            raise ValueError("send_many() needs at least one record")
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        elif type(timestamp_ms) is not int or timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be a non-negative int, got {timestamp_ms!r}")
        if partition is not None and (type(partition) is not int or partition < 0):
            raise ValueError(f"partition must be an int >= 0 or None, got {partition!r}")
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, got {topic!r}")
        # Serialized and checked before anything is queued; as columns, with
        # no object made per record.
        record_keys: list[bytes | None] = []
        record_values: list[bytes | None] = []
        sizes: list[int] = []
        key_serializer, value_serializer = self._key_serializer, self._value_serializer
        for i, value in enumerate(values):
            key = None if keys is None else keys[i]
            if key_serializer is not None or value_serializer is not None:
                key, value = self._serialize(topic, partition, key, value)
            if value is not None and type(value) is not bytes:
                value = _as_bytes(value, "value")
            if key is not None and type(key) is not bytes:
                key = _as_bytes(key, "key")
            record_keys.append(key)
            record_values.append(value)
            sizes.append(RECORD_OVERHEAD_BYTES + (0 if key is None else len(key))
                         + (0 if value is None else len(value)))
        record_count = len(record_values)
        fatal = self._sender.fatal_error
        if fatal is not None and self._txn is None:
            return self._many_failed(topic, partition, record_count, timestamp_ms, fatal)
        if self._txn is not None:
            self._check_txn(Op.SEND)
        try:
            num_partitions, max_message_bytes = self._wait_for_topic(topic, partition)
        except OncelogError as exc:
            self._break_transaction(topic, -1 if partition is None else partition, exc)
            return self._many_failed(topic, partition, record_count, timestamp_ms, exc)
        largest = max(sizes)
        if largest + BATCH_OVERHEAD_BYTES > max_message_bytes:
            too_large = errors.error_for(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"a record is {largest + BATCH_OVERHEAD_BYTES} bytes encoded (as a batch of "
                f"one), over max.message.bytes={max_message_bytes} of topic {topic!r}; "
                "send_many() queued none of its records")
            self._break_transaction(topic, -1 if partition is None else partition, too_large)
            return self._many_failed(topic, partition, record_count, timestamp_ms,
                                     too_large)

        acc = self._accumulator
        place = acc.place
        spans: list[tuple[ProducerBatch, int, int]] = []
        last: ProducerBatch | None = None
        limit = self._buffer_memory_bytes
        with acc.lock:
            txn = self._txn_machine
            if txn is not None and txn.state is not _IN_TRANSACTION:
                txn.check(Op.SEND)
            # (`record_count` is never reassigned below: compiled, range()'s
            # bound is read again on every turn of the loop.)
            for i in range(record_count):
                key = record_keys[i]
                size = sizes[i]
                if acc.buffered_bytes + size > limit and acc.buffered_bytes:
                    blocked = self._wait_for_buffer(size)
                    if blocked is not None:
                        # Part of the call is queued: the rest fails, and so
                        # does the call's future (and its transaction).
                        self._break_transaction_locked(
                            topic, -1 if partition is None else partition, blocked)
                        spans.append((failed_batch(topic, partition, blocked), 0,
                                      record_count - sum(c for _, _, c in spans)))
                        break
                target = partition
                if target is None and key is not None:
                    target = partition_for_key(key, num_partitions)
                batch, index = place(topic, target, num_partitions, key, record_values[i], None,
                                     timestamp_ms, size, max_message_bytes)
                if batch is last:
                    b, first, count = spans[-1]
                    spans[-1] = (b, first, count + 1)
                    continue
                spans.append((batch, index, 1))
                last = batch
                if acc.sender_wanted and threading.current_thread() is not self._sender.thread:
                    # The batch before this one closed behind a backlog (or
                    # while the sender starved): let the sender take it
                    # before filling this one.
                    acc.wait_for_sender(SENDER_HAND_OVER_MAX_S)
            if acc.sender_wanted and threading.current_thread() is not self._sender.thread:
                acc.wait_for_sender(SENDER_HAND_OVER_MAX_S)
        return ManyRecordsFuture(SentRecords(topic, spans, timestamp_ms))

    @staticmethod
    def _many_failed(topic: str, partition: int | None, count: int, timestamp_ms: int,
                     error: BaseException) -> ManyRecordsFuture:
        batch = failed_batch(topic, partition, error)
        return ManyRecordsFuture(SentRecords(topic, [(batch, 0, count)], timestamp_ms))

    def _serialize(self, topic: str, partition: int | None, key: Any, value: Any
                   ) -> tuple[Any, Any]:
        """The key and value through their serializers (None passes by them:
        a None value is a tombstone). A serializer's failure is a record
        failed in send(): SerializationError, and a broken transaction."""
        which = "key"
        try:
            if key is not None and self._key_serializer is not None:
                key = self._key_serializer(key)
                if key is not None and not isinstance(key, bytes | bytearray | memoryview):
                    raise TypeError(f"key_serializer returned {type(key).__name__}, not bytes")
            which = "value"
            if value is not None and self._value_serializer is not None:
                value = self._value_serializer(value)
                if value is not None and not isinstance(value, bytes | bytearray | memoryview):
                    raise TypeError(
                        f"value_serializer returned {type(value).__name__}, not bytes")
        except Exception as exc:
            failure = SerializationError(
                f"the {which} of a record for topic {topic!r} could not be serialized: "
                f"{type(exc).__name__}: {exc}"
            )
            failure.__cause__ = exc
            self._break_transaction(topic, -1 if type(partition) is not int else partition,
                                    failure)
            raise failure from exc
        return key, value

    def _send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        headers: Sequence[Header] | Mapping[str, bytes | None] | None,
        timestamp_ms: int | None,
    ) -> RecordFuture:
        if self._closed:
            raise errors.IllegalStateError("send() on a closed producer")
        fatal = self._sender.fatal_error
        if fatal is not None and self._txn is None:
            return failed_future(topic, -1 if partition is None else partition, fatal)
        # The size is computed inline for the common case: this is the hot path.
        size = RECORD_OVERHEAD_BYTES
        if value is not None:
            if type(value) is not bytes:
                value = _as_bytes(value, "value")
            size += len(value)
        if key is not None:
            if type(key) is not bytes:
                key = _as_bytes(key, "key")
            size += len(key)
        header_tuple: tuple[Header, ...] | None = None
        if headers:
            header_tuple = _check_headers(headers)
            size = record_size_bytes(key, value, header_tuple)
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        elif type(timestamp_ms) is not int or timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be a non-negative int, got {timestamp_ms!r}")
        if partition is not None and type(partition) is not int:
            raise TypeError(f"partition must be an int or None, got {partition!r}")

        client = self._client
        # The private field, not the property: this runs once per record.
        if self._topics_version != client._metadata_version:
            self._topics.clear()
            self._topics_version = client._metadata_version
        info = self._topics.get(topic)
        if info is None or (partition is not None and not 0 <= partition < info[0]):
            if not isinstance(topic, str) or not topic:
                raise TypeError(f"topic must be a non-empty str, got {topic!r}")
            if partition is not None and partition < 0:
                raise ValueError(f"partition must be >= 0 or None, got {partition}")
            if self._txn is not None:
                # Refuse before a metadata lookup that may block.
                self._check_txn(Op.SEND)
            try:
                info = self._wait_for_topic(topic, partition)
            except OncelogError as exc:
                return self._refused(topic, partition, exc)
        num_partitions, max_message_bytes = info
        txn = self._txn_machine
        if txn is not None and txn.state is not _IN_TRANSACTION:
            # The state answers first: a record refused for its size in
            # `ready` would say "too large" where the caller's mistake is
            # "no transaction", and in abortable_error the transaction's own
            # failure is the one to report. (Checked again under the lock.)
            self._check_txn(Op.SEND)

        if partition is None and key is not None:
            partition = partition_for_key(key, num_partitions)
        if size + BATCH_OVERHEAD_BYTES > max_message_bytes:
            return self._refused(topic, partition, errors.error_for(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"record is {size + BATCH_OVERHEAD_BYTES} bytes encoded (as a batch of one), "
                f"over max.message.bytes={max_message_bytes} of topic {topic!r}",
            ))
        acc = self._accumulator
        # acquire/release costs half of a `with` block, which shows at 250k calls/s.
        acc.lock.acquire()
        try:
            # Under the lock: commit_transaction() moves the state on under it
            # too, so a record either joins the transaction before the commit's
            # flush or is refused.
            txn = self._txn_machine
            if txn is not None and txn.state is not _IN_TRANSACTION:
                txn.check(Op.SEND)
            if acc.buffered_bytes + size > self._buffer_memory_bytes and acc.buffered_bytes:
                blocked = self._wait_for_buffer(size)
                if blocked is not None:
                    self._break_transaction_locked(topic, -1 if partition is None else partition,
                                                   blocked)
                    return failed_future(topic, -1 if partition is None else partition, blocked)
            fut = acc.append(
                topic, partition, num_partitions, key, value, header_tuple, timestamp_ms,
                size, max_message_bytes,
            )
            if acc.sender_wanted and threading.current_thread() is not self._sender.thread:
                # Not from a callback on the sender thread: it would wait for itself.
                acc.wait_for_sender(SENDER_HAND_OVER_MAX_S)
            return fut
        finally:
            acc.lock.release()

    def _wait_for_topic(self, topic: str, partition: int | None) -> tuple[int, int]:
        """(partition count, max.message.bytes) of `topic` once the cluster's
        metadata has it (and `partition`, if given), asking again with backoff
        for up to max_block_ms: a topic created a moment ago may be missing
        from the metadata this producer holds (Kafka's waitOnMetadata).

        When max_block_ms runs out, the verdict rests on the last Metadata
        answer: the topic (or partition) is unknown. Only when no answer came
        at all is it a KafkaTimeoutError naming the addresses asked."""
        client = self._client
        deadline_s = time.monotonic() + self._max_block_ms / 1000
        md = client.cached_metadata
        attempt = 0
        refusal_asked = False
        while True:
            tinfo = None if md is None else md.topics.get(topic)
            if tinfo is not None and (partition is None or partition < tinfo.num_partitions):
                info = (tinfo.num_partitions, tinfo.max_message_bytes)
                if self._topics_version == client.metadata_version:
                    self._topics[topic] = info
                return info
            remaining_s = deadline_s - time.monotonic()
            if attempt and remaining_s <= 0:
                raise self._missing(topic, partition, tinfo)
            if attempt:
                time.sleep(min(remaining_s, backoff_ms(
                    attempt, base_ms=client.retry_backoff_ms, max_ms=client.retry_backoff_max_ms,
                ) / 1000))
            attempt += 1
            remaining_ms = int((deadline_s - time.monotonic()) * 1000)
            if md is not None and remaining_ms < MIN_METADATA_REFRESH_MS:
                # Too little time left for an answer: decide on the last one.
                raise self._missing(topic, partition, tinfo)
            try:
                md = client.refresh_metadata(timeout_ms=max(1, remaining_ms))
            except errors.KafkaTimeoutError:
                if md is None:
                    raise  # no answer at all: the cluster is unreachable
                raise self._missing(topic, partition, tinfo) from None
            if topic not in md.topics and not refusal_asked:
                # Left out of the listing: maybe not there yet, maybe not
                # ours to see. An ACL's refusal is final; do not wait it out.
                refusal_asked = True
                refusal = client.topic_refusal(
                    topic, timeout_ms=int((deadline_s - time.monotonic()) * 1000))
                if refusal is not None:
                    raise refusal
            if self._topics_version != client.metadata_version:
                self._topics.clear()
                self._topics_version = client.metadata_version

    def _missing(self, topic: str, partition: int | None,
                 tinfo: TopicInfo | None) -> OncelogError:
        """The error for a topic or partition the last Metadata answer lacked
        after waiting max_block_ms."""
        if tinfo is None:
            return errors.error_for(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} does not exist: not in the cluster's metadata "
                f"after max_block_ms={self._max_block_ms} ms (create it first, "
                f"e.g. Admin.create_topic({topic!r}, partitions=N))",
            )
        return errors.error_for(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"topic {topic!r} has partitions 0..{tinfo.num_partitions - 1}, "
            f"no partition {partition} (waited max_block_ms={self._max_block_ms} ms "
            "for it to appear)",
        )

    def _refused(self, topic: str, partition: int | None, exc: OncelogError) -> RecordFuture:
        """A record refused in send(): its future fails, and so does the
        transaction it was meant for."""
        where = -1 if partition is None else partition
        self._break_transaction(topic, where, exc)
        return failed_future(topic, where, exc)

    def _break_transaction(self, topic: str, partition: int, exc: BaseException) -> None:
        if self._txn is not None:
            self._txn.break_transaction(topic, partition, exc)

    def _break_transaction_locked(self, topic: str, partition: int, exc: BaseException) -> None:
        """Caller holds the accumulator lock (TransactionManager.break_transaction_locked)."""
        if self._txn is not None:
            self._txn.break_transaction_locked(topic, partition, exc)

    def _wait_for_buffer(self, size: int) -> BaseException | None:
        """Blocks (up to max_block_ms) until buffered records leave room for
        `size` more bytes. Caller holds the accumulator lock."""
        acc = self._accumulator
        deadline_s = time.monotonic() + self._max_block_ms / 1000
        while acc.buffered_bytes + size > self._buffer_memory_bytes and acc.buffered_bytes:
            if self._closed or self._sender.fatal_error is not None:
                return self._sender.fatal_error or errors.IllegalStateError("producer closed")
            txn = self._txn_machine
            if txn is not None and txn.state is not _IN_TRANSACTION:
                # The transaction ended (or broke) while we waited.
                return txn.refusal(Op.SEND) or errors.IllegalStateError(
                    f"the transaction ended while send() waited for buffer memory "
                    f"({txn.state.value})"
                )
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                return errors.KafkaTimeoutError(
                    f"buffer_memory_bytes={self._buffer_memory_bytes} stayed full for "
                    f"max_block_ms={self._max_block_ms}: records are not being delivered "
                    f"as fast as they are sent"
                )
            acc.changed.wait(remaining_s)
        return None

    def flush(self, timeout: float | None = None) -> None:
        """Sends every queued record now and waits until each one sent before
        this call is acknowledged or failed. `timeout` in seconds."""
        if threading.current_thread() is self._sender.thread:
            raise errors.IllegalStateError(
                "flush() from a future's callback would wait for itself"
            )
        acc = self._accumulator
        pending = deque(sorted(acc.begin_flush(), key=lambda b: b.created_ms))
        try:
            deadline_s = None if timeout is None else time.monotonic() + timeout
            with acc.lock:
                while pending:
                    if pending[0].state == FINISHED:
                        pending.popleft()
                        continue
                    wait_s = None
                    if deadline_s is not None:
                        wait_s = deadline_s - time.monotonic()
                        if wait_s <= 0:
                            raise errors.KafkaTimeoutError(
                                f"flush() timed out after {timeout} s with "
                                f"{len(pending)} batches not yet acknowledged"
                            )
                    acc.changed.wait(wait_s)
        finally:
            acc.end_flush()

    # ----------------------------------------------------------- transactions

    def init_transactions(self, timeout: float | None = None, *,
                          keep_prepared_txn: bool = False) -> None:
        """Gets the producer id and epoch of this transactional id from its
        coordinator, fencing any earlier producer with the same id: its open
        transaction is aborted (or a decided one completed) first.

        `keep_prepared_txn` (two-phase commit only): a transaction an earlier
        instance prepared is kept instead of aborted; the producer is then in
        `prepared_transaction` with `prepared_transaction_state` set, and ends
        it with complete_transaction(), commit_transaction() or
        abort_transaction(). An open transaction that was never prepared is
        aborted all the same.

        Blocks up to `timeout` seconds (default: max_block_ms); on
        KafkaTimeoutError, call it again to resume."""
        self._transactional("init_transactions").init_transactions(
            timeout, keep_prepared_txn=keep_prepared_txn)

    def begin_transaction(self) -> None:
        """Opens a transaction: records sent until commit_transaction() or
        abort_transaction() belong to it. Local: no request is sent."""
        self._transactional("begin_transaction").begin_transaction()

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int],
        group_metadata: GroupMetadata,
        timeout: float | None = None,
    ) -> None:
        """Makes the consumer offsets `offsets` (each the next offset to read)
        of `group_metadata`'s group part of the transaction: they become the
        group's committed offsets if and only if the transaction commits.

        TxnOffsetCommit hands the offsets to the group's coordinator, whose
        write of them adds the group's __consumer_offsets partition to the
        transaction (pending until the transaction's marker lands). No
        AddOffsetsToTxn goes first: as with Kafka's transaction version 2,
        the write adds its partition, which saves the commit a round trip."""
        self._transactional("send_offsets_to_transaction").send_offsets_to_transaction(
            offsets, group_metadata, timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Sends every record of the transaction, then commits it (EndTxn).

        If a record failed, raises a TransactionAbortableError (caused by the
        record's error): the transaction must be aborted with
        abort_transaction(). On KafkaTimeoutError the outcome is unknown: call
        commit_transaction() again, which retries the commit with the same
        producer id and epoch (a commit is never turned into an abort).
        Blocks up to `timeout` seconds (default: max_block_ms)."""
        self._transactional("commit_transaction").commit_transaction(timeout)

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """Two-phase commit, first phase: sends every record of the
        transaction and waits for each to be acknowledged (as
        commit_transaction() does), then prepares the transaction at its
        coordinator. Returns the PreparedTxnState that complete_transaction()
        needs to commit it — from this producer, or from another process with
        the same transactional id after init_transactions(keep_prepared_txn=
        True). From now on the transaction never times out, outlives this
        producer (close() leaves it prepared), and nothing more may be sent in
        it.

        If a record failed, raises a TransactionAbortableError: abort. On
        KafkaTimeoutError call prepare_transaction() again (or abort).
        Blocks up to `timeout` seconds (default: max_block_ms)."""
        return self._transactional("prepare_transaction").prepare_transaction(timeout)

    def complete_transaction(self, prepared_state: PreparedTxnState,
                             timeout: float | None = None) -> bool:
        """Two-phase commit, second phase: commits the prepared transaction if
        it is the one `prepared_state` names (same producer id and epoch),
        else aborts it (KIP-939's completeTransaction, decided at the
        coordinator). Returns True when `prepared_state`'s transaction is
        committed, False when the coordinator aborted the prepared transaction
        it had instead.

        Also allowed with nothing prepared (state `ready`): completing a
        prepared state again after it was completed — by this producer or by
        another process — answers how it ended and changes nothing, so a
        repeated commit is safe. A prepared state the coordinator has no
        record of raises InvalidTxnStateError. On KafkaTimeoutError the
        outcome is unknown: call complete_transaction() again with the same
        state. Blocks up to `timeout` seconds (default: max_block_ms)."""
        return self._transactional("complete_transaction").complete_transaction(
            prepared_state, timeout)

    @property
    def prepared_transaction_state(self) -> PreparedTxnState | None:
        """The prepared transaction this producer holds (state
        `prepared_transaction`), else None."""
        return None if self._txn is None else self._txn.prepared

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Aborts the transaction: records not yet sent are dropped (their
        futures fail with a TransactionAbortableError), records in flight are
        waited for, then EndTxn(abort). The producer goes on with the next
        epoch. Blocks up to `timeout` seconds (default: max_block_ms); on
        KafkaTimeoutError, call abort_transaction() again."""
        self._transactional("abort_transaction").abort_transaction(timeout)

    @property
    def transaction_state(self) -> ProducerTxnState | None:
        """The transactional state (a ProducerTxnState, a StrEnum: it equals
        its name, "ready", "in_transaction", ...), or None for a producer
        without transactions."""
        return None if self._txn_machine is None else self._txn_machine.state

    def _transactional(self, method: str) -> TransactionManager:
        if self._closed:
            raise errors.IllegalStateError(f"{method}() on a closed producer")
        if self._txn is None:
            raise errors.IllegalStateError(
                f"{method}() needs a transactional producer: pass transactional_id=... "
                f"to Producer()"
            )
        return self._txn

    def _check_txn(self, op: Op) -> None:
        if self._txn is not None:
            self._txn.check(op)

    # ------------------------------------------------------------------ close

    def close(self, timeout: float | None = None) -> None:
        """Delivers what is queued (waiting up to `timeout` seconds, None: as
        long as it takes), then stops the sender; records still undelivered at
        the timeout fail with KafkaTimeoutError. A transactional producer
        aborts its open transaction first (as Kafka's does); a commit whose
        outcome is unknown is left to the coordinator, and so is a prepared
        transaction (two-phase commit: another process may complete it)."""
        with self._close_lock:
            if self._closed:
                return
            txn = self._txn_machine
            if txn is not None and txn.state in (
                ProducerTxnState.IN_TRANSACTION, ProducerTxnState.ABORTABLE_ERROR,
                ProducerTxnState.ABORTING,
                ProducerTxnState.PREPARING,
            ):
                try:
                    self.abort_transaction(timeout)
                except OncelogError as exc:
                    log.warning("close(): aborting the open transaction of %r failed: %s",
                                txn.transactional_id, exc)
            self._closed = True
        try:
            self._sender.close(timeout)
        finally:
            if self._txn is not None:
                self._txn.close()
            self._client.close()

    @property
    def producer_id(self) -> int:
        """The producer id from the coordinator (-1 before the first send, or
        without idempotence)."""
        return self._sender.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._sender.producer_epoch

    @property
    def produce_throttle_time(self) -> ThrottleTime:
        """The throttle times the stores answered this producer's Produce
        requests with (Kafka's produce-throttle-time-avg/max)."""
        return self._sender.throttles.totals()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


kafka_names(Producer)
