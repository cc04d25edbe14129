"""A rolling restart of a replicated cluster under load, with every error
the clients met counted: shared by the default-run test
(tests/integration/test_rolling_restart.py) and the soak
(tests/chaos/test_rolling_restart_soak.py), so both load, restart and
check the same way.

The load, in threads of the test process:
* `InputWriter`: our SDK's idempotent producer writing numbered records to
  `in`;
* `TxnCopier`: our SDK's exactly-once copier — a read_committed consumer in
  a group reads `in`, and each polled batch goes to `out` in one
  transaction with the group's offsets (each output record names its input
  in a `src` header, as examples/copier.py's do, and its transaction in a
  `txn` header); one transaction in ABORT_EVERY is aborted on purpose;
* `OutputReader`: a read_committed consumer of `out`, reading along while
  the restarts run, as a downstream application would;
* `KafkaWriter`: librdkafka's idempotent producer (confluent-kafka) writing
  numbered values to `kin` through the stores' Kafka listeners.

The checks hold each client's view — what each producer was acknowledged,
each copier transaction's outcome — against what a reader finds, with the
network-partition soak's checker (tests/support/partitioned_clients.py,
`check_exactly_once`), and the copier's output against its input
(tests/support/copier.py, `verify_exactly_once`, the copier chaos test's).

Errors are counted where each client shows them: what our SDK met
(`sdk_errors_counted`: every typed error it made from a server's answer or
a failed call, retried or not), what reached the application (an
exception out of a call, a failed future), and what librdkafka reported
(its error callback and failed deliveries).

The restart (`RollingRestart`): each store in turn gets SIGTERM and is
started again once it exited; the next one waits until the restarted store
reports itself in sync (its oncelog.replication.InSync health status, what
the Helm chart's readiness probe asks) and every partition has all its
replicas in sync; then the transaction coordinator and the group
coordinator. For each store it measures how long its partitions took to get
new leaders in the gRPC and in the Kafka metadata of another store, and it
keeps the etcd revision before the SIGTERM, so that the partitions' history
can show how leadership moved (`uncontrolled_moves`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import confluent_kafka as ck
import grpc
from confluent_kafka.admin import AdminClient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from oncelog import (
    Admin,
    Consumer,
    ConsumerRecord,
    Producer,
    RecordMetadata,
    TopicPartition,
    errors,
)
from oncelog.testing import LocalCluster
from oncelog.wire import errors as wire_errors
from services.common.metadata.etcd import EtcdMetadataStore
from services.common.metadata.store import Put
from services.partition_store.core.replicas import PartitionState
from services.partition_store.replication.metadata_link import DEFAULT_ROOT
from services.partition_store.server import IN_SYNC_HEALTH_SERVICE
from tests.support.partitioned_clients import (
    ABORTED,
    COMMITTED,
    UNKNOWN,
    ClientLog,
    check_exactly_once,
)
from tests.support.reading import read_all, wait_for_markers

TOPIC_IN, TOPIC_OUT, TOPIC_KAFKA = "in", "out", "kin"
PARTITIONS = 3
GROUP = "copier"
KEYS = 40
# Every ABORT_EVERY-th copier transaction is aborted on purpose.
ABORT_EVERY = 10
# Failure guards (a hang becomes a failure), never expectations.
DEADLINE_S = 120.0
POLL_S = 0.02


# ------------------------------------------------------------------ errors


@dataclass
class ErrorTally:
    """Errors by (client, kind, name), from several threads."""

    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, client: str, kind: str, name: str) -> None:
        with self.lock:
            self.counts[(client, kind, name)] += 1

    def snapshot(self) -> dict[tuple[str, str, str], int]:
        with self.lock:
            return dict(self.counts)

    def table(self) -> str:
        rows = sorted(self.snapshot().items())
        return "\n".join(f"  {client:<12} {kind:<14} {name:<40} {n}"
                         for (client, kind, name), n in rows) or "  (none)"


# Codes whose kind is not retriable but which our idempotent producer
# retries in one case: an attempt that left while an older batch of its
# partition was unacknowledged reached the leader before that batch did
# (pipelined requests, a leader that learned it leads between the two), so
# the batch is known not written and is sent again after its predecessor
# (docs/sdk.md, "Idempotence and ordering"). For the oldest batch it is a
# real error, and fails the batch: the application would see that.
RETRIED_BEHIND_A_PREDECESSOR = frozenset({
    wire_errors.ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    wire_errors.ErrorCode.UNKNOWN_PRODUCER_ID,
})


@contextlib.contextmanager
def sdk_errors_counted(tally: ErrorTally) -> Iterator[None]:
    """Counts every typed error our SDK makes while the block runs, as
    client "sdk" by its code's kind (retriable, abortable, fatal,
    not_retriable; "retried" for RETRIED_BEHIND_A_PREDECESSOR) and name. The
    SDK turns every error a server answered and every failed call into its
    typed exception through `oncelog.wire.errors.error_for` (its modules
    look the function up at call time), so wrapping it sees each one,
    retried or raised."""
    original = wire_errors.error_for

    def counting(code: wire_errors.ErrorCode | int, message: str = "") -> errors.OncelogError:
        error = original(code, message)
        kind = ("retried" if error.code in RETRIED_BEHIND_A_PREDECESSOR
                else error.code.kind.value)
        tally.add("sdk", kind, error.code.name)
        return error

    wire_errors.error_for = counting
    try:
        yield
    finally:
        wire_errors.error_for = original


def application_error(tally: ErrorTally, client: str, exc: BaseException) -> None:
    """An error that reached the application (out of a call, or a future)."""
    if isinstance(exc, errors.OncelogError):
        kind = ("retriable" if isinstance(exc, errors.RetriableError) or exc.retriable
                else "abortable" if isinstance(exc, errors.TransactionAbortableError)
                else "fatal" if isinstance(exc, errors.FatalError) else "not_retriable")
    else:
        kind = "not_oncelog"
    tally.add(client, kind, type(exc).__name__)


# -------------------------------------------------------------------- load


class _Worker:
    """A thread that runs until stop(), keeping what failed it."""

    def __init__(self, name: str) -> None:
        self.stopping = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._guarded, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _guarded(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.failure = exc

    def run(self) -> None:
        raise NotImplementedError

    def stop(self, timeout_s: float = DEADLINE_S) -> None:
        self.stopping.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise AssertionError(f"{self._thread.name} did not stop within {timeout_s} s")
        if self.failure is not None:
            raise AssertionError(f"{self._thread.name} failed: {self.failure!r}") \
                from self.failure


class InputWriter(_Worker):
    """Our SDK's idempotent producer: `rate` records a second to `in`, value
    "<key>:<n>" with n counting up per key (so order per key can be checked
    downstream)."""

    def __init__(self, bootstrap: str, tally: ErrorTally, *, rate: int) -> None:
        super().__init__("input-writer")
        self.bootstrap = bootstrap
        self.tally = tally
        self.rate = rate
        self.futures: list[Future[RecordMetadata]] = []
        self.values: list[bytes] = []

    def run(self) -> None:
        per_key: Counter[str] = Counter()
        started = time.monotonic()
        with Producer(bootstrap=self.bootstrap, linger_ms=5,
                      delivery_timeout_ms=int(DEADLINE_S * 1000)) as producer:
            i = 0
            while not self.stopping.is_set():
                key = f"k{i % KEYS}"
                value = f"{key}:{per_key[key]}".encode()
                self.futures.append(producer.send(TOPIC_IN, key=key.encode(), value=value))
                self.values.append(value)
                per_key[key] += 1
                i += 1
                ahead_s = started + i / self.rate - time.monotonic()
                if ahead_s > 0:
                    time.sleep(ahead_s)
            producer.flush(timeout=DEADLINE_S)
        for future in self.futures:
            exc = future.exception()
            if exc is not None:
                application_error(self.tally, "input-writer", exc)

    def acknowledged(self) -> int:
        return sum(1 for f in list(self.futures) if f.done() and f.exception() is None)


class TxnCopier(_Worker):
    """Our SDK's exactly-once copier (the loop of examples/copier.py): a
    read_committed consumer in GROUP, each polled batch copied to `out` in
    one transaction with the group's offsets. A commit whose outcome is
    unknown is retried; any other failure aborts and rewinds to the
    committed offsets; a fatal one starts a new producer (it fences the
    old). Every ABORT_EVERY-th transaction is aborted on purpose after its
    records were sent, and its input copied again, so that `out` holds
    aborted records for the readers to skip. Every exception that reaches
    this loop is counted as client "copier".

    Each output record names its transaction in a `txn` header beside its
    input's `src`; `txns` keeps what the copier was told of each
    transaction in the form of tests/support/partitioned_clients.py's
    ClientLog (outcome, and each record's place once committed), for its
    check_exactly_once."""

    def __init__(self, bootstrap: str, tally: ErrorTally) -> None:
        super().__init__("copier")
        self.bootstrap = bootstrap
        self.tally = tally
        self.transactions = 0
        self.aborted = 0
        # txn -> (outcome, {output identity: (partition, offset) or None})
        self.txns: dict[str, tuple[str, dict[bytes, tuple[int, int] | None]]] = {}
        self._begun = 0
        # The open transaction: its name and its records' identities and
        # futures, so that a failure can be logged against it.
        self._open: tuple[str, list[tuple[bytes, Future[RecordMetadata]]]] | None = None
        # Set by the test once the input is complete: the copier stops when
        # the group's committed offsets reach these ends.
        self.final_ends: dict[TopicPartition, int] | None = None

    def client_log(self) -> ClientLog:
        return ClientLog(txns=dict(self.txns))

    def _producer(self) -> Producer:
        producer = Producer(bootstrap=self.bootstrap, transactional_id=f"{GROUP}-tx",
                            linger_ms=5)
        producer.init_transactions()
        return producer

    def _ended(self, outcome: str) -> None:
        """Logs the open transaction's outcome (COMMITTED only once every
        record's place is known)."""
        if self._open is None:
            return
        txn, sent = self._open
        self._open = None
        self.txns[txn] = (outcome, {
            identity: ((future.result().partition, future.result().offset)
                       if outcome == COMMITTED else None)
            for identity, future in sent})

    def _rewind(self, consumer: Consumer) -> None:
        """Back to the group's committed offsets (retried: the group
        coordinator may be restarting)."""
        give_up_at = time.monotonic() + DEADLINE_S
        while True:
            try:
                consumer.seek_to_committed()
                return
            except errors.RetriableError as exc:
                application_error(self.tally, "copier", exc)
                if time.monotonic() > give_up_at:
                    raise
                time.sleep(0.1)

    def run(self) -> None:
        consumer = Consumer(bootstrap=self.bootstrap, group_id=GROUP,
                            isolation_level="read_committed", auto_offset_reset="earliest",
                            enable_auto_commit=False, max_poll_records=200,
                            session_timeout_ms=10_000)
        consumer.subscribe([TOPIC_IN])
        producer = self._producer()
        try:
            while not self._done(consumer):
                try:
                    records = consumer.poll(timeout=0.2)
                except errors.OncelogError as exc:
                    application_error(self.tally, "copier", exc)
                    continue
                if not records:
                    continue
                try:
                    if not self._copy(producer, consumer, records):
                        self._rewind(consumer)
                except errors.FatalError as exc:
                    application_error(self.tally, "copier", exc)
                    # Whether a commit sent before the error took effect is
                    # not known; the new producer's init settles it.
                    self._ended(UNKNOWN)
                    producer.close(timeout=0)
                    producer = self._producer()
                    self._rewind(consumer)
                except errors.OncelogError as exc:
                    application_error(self.tally, "copier", exc)
                    producer.abort_transaction()
                    self._ended(ABORTED)
                    self.aborted += 1
                    self._rewind(consumer)
        finally:
            producer.close()
            consumer.close()

    def _done(self, consumer: Consumer) -> bool:
        if self.final_ends is None:
            return False
        try:
            committed = consumer.committed(set(self.final_ends), timeout=10)
        except errors.OncelogError as exc:
            application_error(self.tally, "copier", exc)
            return False
        return all(committed.get(tp) == end for tp, end in self.final_ends.items())

    def _copy(self, producer: Producer, consumer: Consumer,
              records: list[ConsumerRecord]) -> bool:
        """One transaction; False when it was aborted on purpose (the input
        is to be copied again)."""
        txn = f"t{self._begun}"
        self._begun += 1
        producer.begin_transaction()
        sent: list[tuple[bytes, Future[RecordMetadata]]] = []
        self._open = (txn, sent)
        for r in records:
            src = f"{r.topic}:{r.partition}:{r.offset}".encode()
            sent.append((output_identity(txn.encode(), src), producer.send(
                TOPIC_OUT, key=r.key, value=(r.value or b"").upper(),
                headers=[*(r.headers or ()), ("src", src), ("txn", txn.encode())])))
        if self._begun % ABORT_EVERY == 0:
            producer.abort_transaction()
            self._ended(ABORTED)
            self.aborted += 1
            return False
        offsets = {tp: consumer.position(tp)
                   for tp in {TopicPartition(r.topic, r.partition) for r in records}}
        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
        while True:
            try:
                producer.commit_transaction()
                break
            except errors.RetriableError as exc:
                # The outcome is unknown: committing again is the only safe
                # move (an abort could undo a commit that happened).
                application_error(self.tally, "copier", exc)
        self._ended(COMMITTED)
        self.transactions += 1
        return True


def output_identity(txn: bytes, src: bytes) -> bytes:
    """What names one output record for the checker: its transaction and
    the input record it copies (an input copied again after an abort is
    another record)."""
    return txn + b"|" + src


def _identity_of(record: ConsumerRecord) -> bytes:
    headers = dict(record.headers or ())
    return output_identity(headers.get("txn") or b"?", headers.get("src") or b"?")


class OutputReader(_Worker):
    """A read_committed consumer of `out` (no group) that reads from the
    start while the restarts run, as a downstream application would, and
    keeps (partition, offset, output identity) of every record it is
    given. Once `final_ends` is set it stops there. Its errors are counted
    as client "reader"; an offset out of range is not reset but raised
    (auto_offset_reset none), so a reader moved back or past records shows."""

    def __init__(self, bootstrap: str, tally: ErrorTally) -> None:
        super().__init__("output-reader")
        self.bootstrap = bootstrap
        self.tally = tally
        self.seen: list[tuple[int, int, bytes]] = []
        self.final_ends: dict[TopicPartition, int] | None = None

    def run(self) -> None:
        tps = [TopicPartition(TOPIC_OUT, p) for p in range(PARTITIONS)]
        with Consumer(bootstrap=self.bootstrap, isolation_level="read_committed",
                      auto_offset_reset="none") as consumer:
            consumer.assign(tps)
            consumer.seek_to_beginning(tps)
            while True:
                try:
                    ends = self.final_ends
                    if ends is not None and all(consumer.position(tp) >= ends[tp]
                                                for tp in tps):
                        return
                    records = consumer.poll(timeout=0.2)
                except errors.RetriableError as exc:
                    application_error(self.tally, "reader", exc)
                    continue
                self.seen.extend((r.partition, r.offset, _identity_of(r)) for r in records)


# librdkafka's own codes for a connection that broke (a broker that went
# away): it reconnects and sends again by itself, so they are retriable,
# though only errors from a request carry librdkafka's retriable flag.
# _ALL_BROKERS_DOWN is the same event when every connection it holds is
# down at once: it connects only to the brokers it needs, so a kill -9 of
# one store can take all of them (the soak's kill -9 rounds met it, with
# only one store away at a time), and it reconnects as after _TRANSPORT.
LIBRDKAFKA_TRANSIENT = frozenset({ck.KafkaError._TRANSPORT, ck.KafkaError._ALL_BROKERS_DOWN})


def _librdkafka_kind(error: ck.KafkaError) -> str:
    if error.fatal():
        return "fatal"
    if error.retriable() or error.code() in LIBRDKAFKA_TRANSIENT:
        return "retriable"
    return "other"


class KafkaWriter(_Worker):
    """librdkafka's idempotent producer (acks=all), `rate` numbered values a
    second to `kin` through the Kafka listeners. Its error callback and its
    failed deliveries are counted as client "librdkafka"."""

    def __init__(self, bootstrap: str, tally: ErrorTally, *, rate: int) -> None:
        super().__init__("kafka-writer")
        self.bootstrap = bootstrap
        self.tally = tally
        self.rate = rate
        self.sent = 0
        # value -> (partition, offset) of each delivered record
        self.delivered: dict[bytes, tuple[int, int]] = {}
        self.failed: dict[bytes, str] = {}

    def _on_error(self, error: ck.KafkaError) -> None:
        self.tally.add("librdkafka", _librdkafka_kind(error), error.name())

    def _on_delivery(self, error: ck.KafkaError | None, message: ck.Message) -> None:
        value = message.value() or b""
        if error is None:
            self.delivered[value] = (message.partition() or 0, message.offset() or 0)
        else:
            self.failed[value] = error.name()
            self.tally.add("librdkafka-app", _librdkafka_kind(error), error.name())

    def run(self) -> None:
        producer = ck.Producer({
            "bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "message.timeout.ms": int(DEADLINE_S * 1000),
            "error_cb": self._on_error,
        })
        started = time.monotonic()
        while not self.stopping.is_set():
            producer.produce(TOPIC_KAFKA, value=b"%d" % self.sent,
                             partition=self.sent % PARTITIONS, on_delivery=self._on_delivery)
            self.sent += 1
            producer.poll(0)
            ahead_s = started + self.sent / self.rate - time.monotonic()
            if ahead_s > 0:
                producer.poll(ahead_s)
        remaining = producer.flush(DEADLINE_S)
        if remaining:
            raise AssertionError(f"librdkafka still holds {remaining} undelivered records")


@dataclass
class Load:
    input: InputWriter
    copier: TxnCopier
    kafka: KafkaWriter
    reader: OutputReader
    # Ends the counting of our SDK's errors.
    counting: contextlib.ExitStack


def start_load(cluster: LocalCluster, tally: ErrorTally, *, rate: int = 200) -> Load:
    """Creates the topics (RF 3) and starts the three clients, counting their
    errors into `tally`; returns once each has made progress."""
    with Admin(bootstrap=cluster.bootstrap_servers) as admin:
        for topic in (TOPIC_IN, TOPIC_OUT, TOPIC_KAFKA):
            admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    cluster.wait_in_sync(timeout_s=DEADLINE_S)
    counting = contextlib.ExitStack()
    counting.enter_context(sdk_errors_counted(tally))
    load = Load(InputWriter(cluster.bootstrap_servers, tally, rate=rate),
                TxnCopier(cluster.bootstrap_servers, tally),
                KafkaWriter(cluster.kafka_bootstrap, tally, rate=rate),
                OutputReader(cluster.bootstrap_servers, tally), counting)
    for worker in (load.input, load.copier, load.kafka, load.reader):
        worker.start()
    _wait("every client made progress", lambda: load.input.acknowledged() > 0
          and load.copier.transactions > 0 and len(load.kafka.delivered) > 0
          and len(load.reader.seen) > 0)
    return load


def stop_load(load: Load) -> None:
    """Stops the producers (each waits for its last acknowledgements), then
    the copier once the group has committed the whole input, then the
    output's reader once it has read up to the output's end (every
    transaction decided, its markers written)."""
    try:
        load.input.stop()
        load.kafka.stop()
        load.copier.final_ends = _committed_ends(load.input.bootstrap, TOPIC_IN)
        load.copier.stop()
        wait_for_markers(load.input.bootstrap, DEADLINE_S)
        load.reader.final_ends = _committed_ends(load.input.bootstrap, TOPIC_OUT)
        load.reader.stop()
    finally:
        load.counting.close()


def _committed_ends(bootstrap: str, topic: str) -> dict[TopicPartition, int]:
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with Consumer(bootstrap=bootstrap, isolation_level="read_committed") as consumer:
        return consumer.end_offsets(tps, timeout=DEADLINE_S)


# ------------------------------------------------------------------ checks
#
# Each producer's and the copier's view is held against what a reader finds
# by check_exactly_once (tests/support/partitioned_clients.py, the network
# partition soak's checker): nothing acknowledged lost or moved, nothing
# written twice, no record no client wrote, no aborted transaction
# visible, none torn.


def check_input(bootstrap: str, writer: InputWriter) -> int:
    """Every record our idempotent producer got acknowledged is in `in`, at
    its offset, once; nothing else is."""
    acked: dict[bytes, tuple[int, int]] = {}
    failed: set[bytes] = set()
    for value, future in zip(writer.values, writer.futures, strict=True):
        if future.exception() is None:
            acked[value] = (future.result().partition, future.result().offset)
        else:
            failed.add(value)
    records = read_all(bootstrap, TOPIC_IN, PARTITIONS, deadline_s=DEADLINE_S)
    check_exactly_once(ClientLog(acked=acked, failed=failed),
                       [(r.partition, r.offset, r.value or b"") for r in records])
    return len(records)


def check_output(bootstrap: str, copier: TxnCopier, reader: OutputReader) -> int:
    """The copier's transactions against `out` read with read_committed at
    the end, and against what the reader was given while the restarts ran:
    every committed transaction whole at the offsets its producer was told,
    no aborted one's record (no aborted read), none of a transaction whose
    outcome its client did not learn unless all of it; and the reader was
    given exactly what is there at the end — a record it read that is not
    there now was read before its transaction was decided (an uncommitted
    read), one it missed or got twice means its position went wrong."""
    log = copier.client_log()
    final = [(r.partition, r.offset, _identity_of(r))
             for r in read_all(bootstrap, TOPIC_OUT, PARTITIONS,
                               isolation_level="read_committed", deadline_s=DEADLINE_S)]
    check_exactly_once(log, final)
    check_exactly_once(log, reader.seen)
    read_then = Counter(reader.seen)
    there_now = Counter(final)
    assert read_then == there_now, (
        f"the reader was given records not there at the end: "
        f"{list((read_then - there_now).elements())[:5]}; and not given: "
        f"{list((there_now - read_then).elements())[:5]}")
    return len(final)


def check_kafka_writes(bootstrap: str, writer: KafkaWriter) -> int:
    """Every value librdkafka had delivered is in `kin` once, at the offset it
    was told; nothing failed."""
    assert not writer.failed, f"librdkafka failed to deliver {len(writer.failed)} records: " \
                              f"{Counter(writer.failed.values())}"
    assert len(writer.delivered) == writer.sent, \
        f"librdkafka reported {len(writer.delivered)} of {writer.sent} records delivered"
    records = read_all(bootstrap, TOPIC_KAFKA, PARTITIONS, deadline_s=DEADLINE_S)
    check_exactly_once(ClientLog(acked=dict(writer.delivered)),
                       [(r.partition, r.offset, r.value or b"") for r in records])
    return len(records)


# ----------------------------------------------------------------- restarts


@dataclass(frozen=True, slots=True)
class StoreStop:
    """One store's stop (SIGTERM, or kill -9 to compare), measured from the
    moment the signal was sent."""

    node: int
    how: str
    # Partitions it led that had another in-sync replica (what moves).
    movable: tuple[tuple[str, int], ...]
    # Until another store's gRPC Metadata, then its Kafka Metadata, named
    # other leaders for all of them.
    moved_grpc_s: float
    moved_kafka_s: float
    # Until the process exited (the hand-over, the drain, the snapshots).
    exited_s: float
    # From its restart until it was in sync again.
    in_sync_s: float
    etcd_revision_before: int


def _etcd_revision(cluster: LocalCluster) -> int:
    async def read() -> int:
        store = EtcdMetadataStore(cluster.etcd_endpoints, timeout_ms=5_000)
        try:
            _entries, revision = await store.get_prefix(f"{DEFAULT_ROOT}/controller")
            return revision
        finally:
            await store.close()
    return asyncio.run(read())


def partition_history(cluster: LocalCluster, from_revision: int
                      ) -> list[tuple[int, tuple[str, int], PartitionState | None]]:
    """Every change of a partition's state in etcd from `from_revision` on,
    in order: (revision, (topic, partition), state or None when deleted). A
    mark written under a key of its own (outside the cluster's root, so no
    store reads it) ends the read."""
    prefix = f"{DEFAULT_ROOT}/partitions/"
    mark = f"{DEFAULT_ROOT}-test-mark"

    async def read() -> list[tuple[int, tuple[str, int], PartitionState | None]]:
        store = EtcdMetadataStore(cluster.etcd_endpoints, timeout_ms=5_000)
        out: list[tuple[int, tuple[str, int], PartitionState | None]] = []
        try:
            await store.commit((), [Put(mark, str(time.monotonic_ns()))], ())
            watch = store.watch_prefix(DEFAULT_ROOT, start_revision=from_revision)
            async with contextlib.aclosing(watch):
                async for events in watch:
                    for event in events:
                        if event.key == mark:
                            return out
                        if event.key.startswith(prefix):
                            topic, _, p = event.key[len(prefix):].rpartition("/")
                            state = (None if event.value is None
                                     else PartitionState.from_json(event.value))
                            out.append((event.mod_revision, (topic, int(p)), state))
        finally:
            await store.close()
        return out

    return asyncio.run(asyncio.wait_for(read(), DEADLINE_S))


def uncontrolled_moves(cluster: LocalCluster, stop: StoreStop) -> list[str]:
    """The partitions of `stop.movable` whose leadership did not move by a
    controlled shutdown: the first change of leader after the SIGTERM must
    keep the stopping store in the ISR (a move while it still lived and
    copied). An election after its lease ended drops it from the ISR in the
    same step."""
    first: dict[tuple[str, int], PartitionState | None] = {}
    for _revision, key, state in partition_history(cluster, stop.etcd_revision_before):
        if key in stop.movable and key not in first and (
                state is None or state.leader != stop.node):
            first[key] = state
    bad = []
    for key in stop.movable:
        state = first.get(key)
        if state is None or stop.node not in state.isr:
            bad.append(f"{key[0]}-{key[1]}: {state}")
    return bad


def _wait(what: str, check: Callable[[], bool], timeout_s: float = DEADLINE_S) -> None:
    give_up_at = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > give_up_at:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(POLL_S)


def _in_sync_health(cluster: LocalCluster, node: int) -> bool:
    with grpc.insecure_channel(cluster.address("partition_store", node)) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=IN_SYNC_HEALTH_SERVICE), timeout=2)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _kafka_leaders(cluster: LocalCluster, node: int) -> dict[tuple[str, int], int]:
    """Leaders by partition as store `node`'s Kafka listener tells them."""
    admin = AdminClient({"bootstrap.servers": cluster.processes["partition_store"][node]
                         .kafka_address})
    metadata = admin.list_topics(timeout=5)
    return {(str(t.topic), p.id): p.leader for t in metadata.topics.values()
            for p in t.partitions.values()}


class RollingRestart:
    """SIGTERM and restart of every store, one at a time, then of the
    coordinators (the module docstring)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.stops: list[StoreStop] = []
        self.coordinator_restarts_s: dict[str, list[float]] = {}

    def store(self, node: int, *, kill: bool = False) -> StoreStop:
        """SIGTERM (kill: SIGKILL) of one store, its restart, and the wait
        until it is in sync again."""
        cluster = self.cluster
        states = cluster.partition_states()
        movable = tuple(sorted(key for key, s in states.items()
                               if s.leader == node and len(s.isr) > 1))
        observer = next(i for i in range(len(cluster.processes["partition_store"]))
                        if i != node)
        revision = _etcd_revision(cluster)
        moved: dict[str, float] = {}

        def watch_metadata(started: float) -> None:
            while len(moved) < 2 and time.monotonic() - started < DEADLINE_S:
                if "grpc" not in moved:
                    now = cluster.partition_states(stores=[observer], timeout_s=1.0)
                    if now and all(now[k].leader != node for k in movable):
                        moved["grpc"] = time.monotonic() - started
                if "kafka" not in moved:
                    with contextlib.suppress(ck.KafkaException):
                        leaders = _kafka_leaders(cluster, observer)
                        # Listing every topic, Kafka's Metadata leaves the
                        # internal ones out.
                        if all(leaders.get(k, node) != node for k in movable
                               if not k[0].startswith("__")):
                            moved["kafka"] = time.monotonic() - started
                time.sleep(POLL_S)

        started = time.monotonic()
        watcher = threading.Thread(target=watch_metadata, args=(started,), daemon=True)
        watcher.start()
        if kill:
            cluster.kill("partition_store", node)
        else:
            code = cluster.terminate("partition_store", node)
            assert code == 0, f"store {node} exited with {code}\n" \
                              f"{cluster.log_tail('partition_store', node)}"
        exited_s = time.monotonic() - started
        watcher.join(DEADLINE_S)
        assert set(moved) == {"grpc", "kafka"}, f"leaders never moved off store {node}: {moved}"
        restarted = time.monotonic()
        cluster.restart("partition_store", node)
        _wait(f"store {node} reports itself in sync", lambda: _in_sync_health(cluster, node))
        in_sync_s = time.monotonic() - restarted
        cluster.wait_in_sync(timeout_s=DEADLINE_S)
        stop = StoreStop(node, "kill -9" if kill else "SIGTERM", movable, moved["grpc"],
                         moved["kafka"], exited_s, in_sync_s, revision)
        self.stops.append(stop)
        return stop

    def coordinator(self, kind: str) -> None:
        started = time.monotonic()
        code = self.cluster.terminate(kind, 0)
        assert code == 0, f"{kind} exited with {code}\n{self.cluster.log_tail(kind)}"
        self.cluster.restart(kind, 0)
        self.coordinator_restarts_s.setdefault(kind, []).append(time.monotonic() - started)

    def round(self) -> None:
        for node in range(len(self.cluster.processes["partition_store"])):
            self.store(node)
        self.coordinator("coordinator")
        self.coordinator("group_coordinator")

    def summary(self) -> str:
        lines = [f"  store {s.node}, {s.how}: {len(s.movable)} leaderships moved in "
                 f"{s.moved_grpc_s:.2f} s (gRPC metadata) / {s.moved_kafka_s:.2f} s (Kafka "
                 f"metadata), exited after {s.exited_s:.2f} s, back in sync "
                 f"{s.in_sync_s:.2f} s after its restart" for s in self.stops]
        lines += [f"  {kind}: stopped and back in {', '.join(f'{t:.2f}' for t in times)} s"
                  for kind, times in self.coordinator_restarts_s.items()]
        return "\n".join(lines)
