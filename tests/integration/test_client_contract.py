"""The client contract, held by the threaded client and the asyncio client alike.

Goal: what a user of Kafka's transactions and consumer groups relies on
holds end to end, through `Producer`/`Consumer` and through
`oncelog.aio.AIOProducer`/`AIOConsumer`: a committed transaction is visible
to read_committed consumers and an aborted one never is (read_uncommitted
sees both, neither sees control records); an open transaction holds
read_committed consumers below its first offset, hiding later committed
records of other producers until it ends; with producers interleaved on one
partition, read_committed returns exactly the committed records at their
original offsets; a second producer with the same transactional id fences
the first (its open transaction is aborted and its next send and commit
fail); a transaction the coordinator times out never becomes visible and
its producer is fenced; a read-process-write copier (group consumer +
transactional producer with send_offsets_to_transaction) writes every
input record exactly once for read_committed readers although some of its
transactions abort and the consumer rewinds with seek_to_committed(); and a
transactional offset is invisible while its transaction is open
(OffsetFetch(require_stable) answers "unstable", committed() waits) and is
the committed offset right after the commit.

Method: one LocalCluster (one store, one transaction coordinator, one group
coordinator) per placement of the transaction coordinator: a process of its
own, and inside the store's process (`coordinators_in_stores`), where its
calls to the store and the store's to it take no gRPC; a topic per test. Each test body is written
once against a small driver with the threaded client's method names and
runs twice, parametrized by `client_kind`: "threaded" hands out `Producer`
and `Consumer` themselves; "aio" hands out `AIOProducer`/`AIOConsumer`
living on an event loop in a thread of the test's own, every call made on
that loop and awaited there, adapting only what aiokafka names differently
(poll → getmany, committed takes one partition, the producer's delivery is
an asyncio future). What a test reads back to check goes through the
client under test as well. `make_clients` is imported by
test_serializers.py. Waits are bounded loops on observable state, never
timed assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

import pytest

from oncelog import (
    Admin,
    Consumer,
    ConsumerRecord,
    GroupMetadata,
    Producer,
    RecordMetadata,
    TopicPartition,
    errors,
)
from oncelog._client import ClusterClient
from oncelog._group import GroupClient
from oncelog.aio import AIOConsumer, AIOProducer
from oncelog.testing import LocalCluster
from tests.support.polling import wait_until
from tests.support.reading import wait_for_markers

T = TypeVar("T")
PARTITIONS = 3
WAIT_S = 30.0
# A guard on every call the aio driver makes: a hung call fails the test.
CALL_TIMEOUT_S = 120.0
CLIENT_KINDS = ("threaded", "aio")
# Where the transaction coordinator runs: a process of its own, or in the
# partition store's (docs/coordinator.md, "The coordinator in a store").
COORDINATOR_PLACEMENTS = ("process", "in-store")
_ids = itertools.count()


# ------------------------------------------------------------------ the driver


class Delivery(Protocol):
    """A sent record's outcome (a RecordFuture, or the aio send's future)."""

    def result(self, timeout: float | None = None) -> RecordMetadata: ...

    def exception(self, timeout: float | None = None) -> BaseException | None: ...


class ProducerDriver(Protocol):
    @property
    def producer_epoch(self) -> int: ...

    def send(self, topic: str, value: Any = None, key: Any = None,
             partition: int | None = None) -> Delivery: ...

    def flush(self) -> None: ...

    def init_transactions(self) -> None: ...

    def begin_transaction(self) -> None: ...

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int],
                                    group_metadata: GroupMetadata) -> None: ...

    def commit_transaction(self) -> None: ...

    def abort_transaction(self) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> ProducerDriver: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


class ConsumerDriver(Protocol):
    def subscribe(self, topics: list[str]) -> None: ...

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def assignment(self) -> set[TopicPartition]: ...

    def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]: ...

    def seek(self, partition: TopicPartition, offset: int) -> None: ...

    def position(self, partition: TopicPartition) -> int: ...

    def committed(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int | None]: ...

    def seek_to_committed(self) -> dict[TopicPartition, int | None]: ...

    def group_metadata(self) -> GroupMetadata: ...

    def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...

    def close(self) -> None: ...

    def __enter__(self) -> ConsumerDriver: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


class Clients(Protocol):
    kind: str
    bootstrap: str

    def producer(self, **options: Any) -> ProducerDriver: ...

    def consumer(self, **options: Any) -> ConsumerDriver: ...


class ThreadedClients:
    """The threaded client as it is: Producer and Consumer are the driver."""

    kind = "threaded"

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def producer(self, **options: Any) -> ProducerDriver:
        return Producer(bootstrap=self.bootstrap, **options)

    def consumer(self, **options: Any) -> ConsumerDriver:
        return Consumer(bootstrap=self.bootstrap, **options)


class _LoopThread:
    """An event loop running in a thread of its own; the test's thread hands
    it coroutines and waits for their results."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-event-loop",
                                        daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = CALL_TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        """A plain method of an aio client, called on the loop's thread."""

        async def on_loop() -> T:
            return fn()

        return self.run(on_loop())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        self.loop.close()


class _AioDelivery:
    def __init__(self, loop: _LoopThread, future: asyncio.Future[RecordMetadata]) -> None:
        self._loop = loop
        self._future = future

    def result(self, timeout: float | None = None) -> RecordMetadata:
        async def wait() -> RecordMetadata:
            return await self._future

        return self._loop.run(wait(), timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        async def wait() -> BaseException | None:
            try:
                await self._future
            except Exception as exc:
                return exc
            return None

        return self._loop.run(wait(), timeout)


class _AioProducerDriver:
    def __init__(self, loop: _LoopThread, options: dict[str, Any]) -> None:
        self._loop = loop

        async def start() -> AIOProducer:
            producer = AIOProducer(**options)
            await producer.start()
            return producer

        self.aio = loop.run(start())

    @property
    def producer_epoch(self) -> int:
        return self.aio.producer_epoch

    def send(self, topic: str, value: Any = None, key: Any = None,
             partition: int | None = None) -> Delivery:
        return _AioDelivery(self._loop, self._loop.run(
            self.aio.send(topic, value, key, partition=partition)))

    def flush(self) -> None:
        self._loop.run(self.aio.flush())

    def init_transactions(self) -> None:
        self._loop.run(self.aio.init_transactions())

    def begin_transaction(self) -> None:
        self._loop.run(self.aio.begin_transaction())

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int],
                                    group_metadata: GroupMetadata) -> None:
        self._loop.run(self.aio.send_offsets_to_transaction(offsets, group_metadata))

    def commit_transaction(self) -> None:
        self._loop.run(self.aio.commit_transaction())

    def abort_transaction(self) -> None:
        self._loop.run(self.aio.abort_transaction())

    def close(self) -> None:
        self._loop.run(self.aio.stop())

    def __enter__(self) -> ProducerDriver:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class _AioConsumerDriver:
    def __init__(self, loop: _LoopThread, options: dict[str, Any]) -> None:
        self._loop = loop

        async def start() -> AIOConsumer:
            consumer = AIOConsumer(**options)
            await consumer.start()
            return consumer

        self.aio = loop.run(start())

    def subscribe(self, topics: list[str]) -> None:
        self._loop.call(lambda: self.aio.subscribe(topics))

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._loop.call(lambda: self.aio.assign(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._loop.call(self.aio.assignment)

    def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        by_partition = self._loop.run(self.aio.getmany(timeout_ms=int(timeout * 1000)))
        return [r for records in by_partition.values() for r in records]

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._loop.call(lambda: self.aio.seek(partition, offset))

    def position(self, partition: TopicPartition) -> int:
        return self._loop.run(self.aio.position(partition))

    def committed(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        return {tp: self._loop.run(self.aio.committed(tp)) for tp in partitions}

    def seek_to_committed(self) -> dict[TopicPartition, int | None]:
        return self._loop.run(self.aio.seek_to_committed())

    def group_metadata(self) -> GroupMetadata:
        return self._loop.call(self.aio.group_metadata)

    def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return self._loop.run(self.aio.end_offsets(partitions))

    def close(self) -> None:
        self._loop.run(self.aio.stop())

    def __enter__(self) -> ConsumerDriver:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class AioClients:
    """AIOProducer and AIOConsumer behind the threaded client's names."""

    kind = "aio"

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._loop = _LoopThread()

    def producer(self, **options: Any) -> ProducerDriver:
        return _AioProducerDriver(self._loop, {"bootstrap": self.bootstrap, **options})

    def consumer(self, **options: Any) -> ConsumerDriver:
        return _AioConsumerDriver(self._loop, {"bootstrap": self.bootstrap, **options})

    def close(self) -> None:
        self._loop.close()


@contextlib.contextmanager
def make_clients(kind: str, bootstrap: str) -> Iterator[Clients]:
    if kind == "threaded":
        yield ThreadedClients(bootstrap)
        return
    aio = AioClients(bootstrap)
    try:
        yield aio
    finally:
        aio.close()


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module", params=COORDINATOR_PLACEMENTS)
def coordinators_in_stores(request: pytest.FixtureRequest) -> bool:
    """Whether the transaction coordinator runs in the store's process
    (--transaction-coordinator) or in its own."""
    return bool(request.param == "in-store")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            coordinators_in_stores: bool) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("contract") / "cluster",
                      consumer_offsets_partitions=2,
                      coordinators_in_stores=coordinators_in_stores) as c:
        yield c


@pytest.fixture(params=CLIENT_KINDS)
def client_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def clients(client_kind: str, cluster: LocalCluster) -> Iterator[Clients]:
    with make_clients(client_kind, cluster.bootstrap) as c:
        yield c


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(bootstrap=cluster.bootstrap) as a:
        yield a


@pytest.fixture
def topic(admin: Admin, topic_name: str) -> str:
    admin.create_topic(topic_name, partitions=PARTITIONS)
    return topic_name


def new_topic(admin: Admin, partitions: int) -> str:
    name = f"cc-{next(_ids)}"
    admin.create_topic(name, partitions=partitions)
    return name


def tid() -> str:
    return f"cc-tx-{next(_ids)}"


# ------------------------------------------------------------------ helpers


def read_all(clients: Clients, topic: str, partitions: int, *,
             isolation_level: str = "read_uncommitted") -> list[ConsumerRecord]:
    """Every record of the topic up to its end offsets (taken at the start),
    read with the client under test; read_committed once the markers of
    every decided transaction have landed (wait_for_markers)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: list[ConsumerRecord] = []
    if isolation_level == "read_committed":
        wait_for_markers(clients.bootstrap)
    with clients.consumer(isolation_level=isolation_level) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + WAIT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{topic} not read to {ends} in {WAIT_S} s"
            out.extend(consumer.poll(timeout=0.2))
    return out


def values(records: list[ConsumerRecord]) -> list[bytes]:
    return sorted(r.value or b"" for r in records)


def end_offset(clients: Clients, tp: TopicPartition, isolation_level: str) -> int:
    with clients.consumer(isolation_level=isolation_level) as c:
        return c.end_offsets([tp])[tp]


def send_or_error(producer: ProducerDriver, topic: str, value: bytes, partition: int
                  ) -> BaseException | None:
    """The error a send reports, whether send() raises it or its future does."""
    try:
        delivery = producer.send(topic, value=value, partition=partition)
    except errors.OncelogError as exc:
        return exc
    return delivery.exception(timeout=60)


def produce(clients: Clients, topic: str, values_by_partition: dict[int, list[bytes]]) -> None:
    with clients.producer() as producer:
        for p, vs in values_by_partition.items():
            for v in vs:
                producer.send(topic, value=v, partition=p)
        producer.flush()


# ------------------------------------------------------------------ transactions


def test_committed_is_visible_aborted_is_not(clients: Clients, topic: str) -> None:
    with clients.producer(transactional_id=tid()) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        t1 = [b"t1-%d" % i for i in range(60)]
        for i, v in enumerate(t1):
            producer.send(topic, value=v, partition=i % PARTITIONS)
        producer.commit_transaction()
        producer.begin_transaction()
        t2 = [b"t2-%d" % i for i in range(60)]
        for i, v in enumerate(t2):
            producer.send(topic, value=v, partition=i % PARTITIONS)
        producer.flush()
        producer.abort_transaction()
    committed = read_all(clients, topic, PARTITIONS, isolation_level="read_committed")
    assert values(committed) == sorted(t1)
    everything = read_all(clients, topic, PARTITIONS)
    assert values(everything) == sorted(t1 + t2)
    # Each partition's log: T1's 20 records, its COMMIT marker (offset 20),
    # T2's 20 records, its ABORT marker (41). No reader saw a marker's offset.
    for p in range(PARTITIONS):
        tp = TopicPartition(topic, p)
        assert end_offset(clients, tp, "read_uncommitted") == 42
        assert end_offset(clients, tp, "read_committed") == 42
        assert sorted(r.offset for r in everything if r.partition == p) == [
            *range(20), *range(21, 41)]
        assert sorted(r.offset for r in committed if r.partition == p) == list(range(20))


def test_an_open_transaction_holds_read_committed_below_it(clients: Clients,
                                                           topic: str) -> None:
    tp = TopicPartition(topic, 0)
    with clients.producer(transactional_id=tid()) as slow, \
            clients.producer(transactional_id=tid()) as fast:
        slow.init_transactions()
        fast.init_transactions()
        slow.begin_transaction()
        first = slow.send(topic, value=b"slow", partition=0).result(timeout=60)
        fast.begin_transaction()
        later = [fast.send(topic, value=b"fast-%d" % i, partition=0) for i in range(5)]
        fast.commit_transaction()
        assert all(f.result().offset > first.offset for f in later)

        # The open transaction holds the last stable offset at its first offset:
        # the committed records after it stay invisible.
        assert end_offset(clients, tp, "read_committed") == first.offset
        with clients.consumer() as consumer:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            seen: list[ConsumerRecord] = []
            for _ in range(4):
                seen.extend(consumer.poll(timeout=0.25))
            assert seen == []
            assert consumer.position(tp) == 0
            slow.commit_transaction()

            def all_visible() -> bool:
                seen.extend(consumer.poll(timeout=0.5))
                return len(seen) >= 6

            wait_until("the records behind the transaction became visible", all_visible)
        assert [r.value for r in seen] == [b"slow"] + [b"fast-%d" % i for i in range(5)]


def test_interleaved_producers_commit_and_abort_on_one_partition(clients: Clients,
                                                                topic: str) -> None:
    with clients.producer(transactional_id=tid()) as aborter, \
            clients.producer(transactional_id=tid()) as committer:
        aborter.init_transactions()
        committer.init_transactions()
        aborter.begin_transaction()
        committer.begin_transaction()
        kept: dict[int, bytes] = {}
        for i in range(10):
            aborter.send(topic, value=b"drop-%d" % i, partition=1).result(timeout=60)
            meta = committer.send(topic, value=b"keep-%d" % i, partition=1).result(timeout=60)
            kept[meta.offset] = b"keep-%d" % i
        aborter.abort_transaction()
        committer.commit_transaction()
    committed = [r for r in read_all(clients, topic, PARTITIONS,
                                     isolation_level="read_committed") if r.partition == 1]
    assert {r.offset: r.value for r in committed} == kept
    everything = [r for r in read_all(clients, topic, PARTITIONS) if r.partition == 1]
    assert len(everything) == 20


def test_a_second_instance_fences_the_first(clients: Clients, topic: str) -> None:
    transactional_id = tid()
    zombie = clients.producer(transactional_id=transactional_id)
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        for i in range(10):
            zombie.send(topic, value=b"zombie-%d" % i, partition=i % PARTITIONS)
        zombie.flush()
        with clients.producer(transactional_id=transactional_id) as successor:
            successor.init_transactions()  # aborts the zombie's open transaction
            assert successor.producer_epoch > zombie.producer_epoch
            exc = send_or_error(zombie, topic, b"zombie-late", 0)
            assert isinstance(exc, errors.ProducerFencedError | errors.InvalidProducerEpochError)
            with pytest.raises((errors.ProducerFencedError, errors.InvalidProducerEpochError)):
                zombie.commit_transaction()
            successor.begin_transaction()
            successor.send(topic, value=b"successor", partition=0)
            successor.commit_transaction()
    finally:
        zombie.close()
    committed = read_all(clients, topic, PARTITIONS, isolation_level="read_committed")
    assert values(committed) == [b"successor"]


def test_a_timed_out_transaction_is_aborted_and_its_producer_fenced(
        client_kind: str, coordinators_in_stores: bool, tmp_path: Path, topic_name: str) -> None:
    with LocalCluster(tmp_path / "cluster", group_coordinators=0, extra_args={
        "partition_store" if coordinators_in_stores else "coordinator":
            ["--transaction-check-interval-ms", "100"],
    }, coordinators_in_stores=coordinators_in_stores) as cluster, \
            make_clients(client_kind, cluster.bootstrap) as clients, \
            Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS)
        transactional_id = tid()
        with clients.producer(transactional_id=transactional_id,
                              transaction_timeout_ms=2000) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for i in range(10):
                producer.send(topic_name, value=b"late-%d" % i, partition=i % PARTITIONS)
            producer.flush()
            wait_until("the coordinator aborted the transaction", lambda: admin
                       .describe_transaction(transactional_id).state == "CompleteAbort")
            exc = send_or_error(producer, topic_name, b"later", 0)
            assert isinstance(exc, errors.ProducerFencedError | errors.InvalidProducerEpochError)
            with pytest.raises((errors.ProducerFencedError, errors.InvalidProducerEpochError)):
                producer.commit_transaction()
        assert read_all(clients, topic_name, PARTITIONS, isolation_level="read_committed") == []
        assert len(read_all(clients, topic_name, PARTITIONS)) == 10


# ------------------------------------------------------- read-process-write


def test_copier_is_exactly_once_across_an_aborted_transaction(
        clients: Clients, admin: Admin) -> None:
    source, sink = new_topic(admin, 2), new_topic(admin, 1)
    inputs = {p: [f"{p}-{i}".encode() for i in range(30)] for p in range(2)}
    produce(clients, source, inputs)
    group = f"copier-{source}"
    aborted = 0
    with clients.consumer(group_id=group, max_poll_records=7) as consumer, \
            clients.producer(transactional_id=f"copier-{source}") as producer:
        consumer.subscribe([source])
        producer.init_transactions()
        deadline = time.monotonic() + WAIT_S
        while True:
            committed = consumer.committed([TopicPartition(source, p) for p in range(2)])
            if all(offset == 30 for offset in committed.values()):
                break
            assert time.monotonic() < deadline, committed
            records = consumer.poll(timeout=0.2)
            if not records:
                continue
            producer.begin_transaction()
            for r in records:
                producer.send(sink, value=(r.value or b"").upper(), partition=0)
            producer.send_offsets_to_transaction(
                {tp: consumer.position(tp) for tp in consumer.assignment()},
                consumer.group_metadata(),
            )
            if aborted < 2:
                # A failure half-way: nothing of this transaction counts, and
                # the consumer goes back to what the group has committed.
                producer.abort_transaction()
                consumer.seek_to_committed()
                aborted += 1
            else:
                producer.commit_transaction()
    out = [r.value for r in read_all(clients, sink, 1, isolation_level="read_committed")]
    expected = sorted(v.upper() for vs in inputs.values() for v in vs)
    assert sorted(v or b"" for v in out) == expected, "every input exactly once"
    offsets = admin.list_group_offsets(group)
    assert {tp.partition: (o.offset, o.lag) for tp, o in offsets.items()} == {
        0: (30, 0), 1: (30, 0)}


def test_a_pending_transactional_offset_is_unstable_until_the_commit(
        clients: Clients, admin: Admin, cluster: LocalCluster) -> None:
    topic = new_topic(admin, 1)
    produce(clients, topic, {0: [b"a", b"b", b"c"]})
    tp = TopicPartition(topic, 0)
    group = f"stable-{topic}"
    admin.alter_group_offsets(group, {tp: 1})
    with clients.producer(transactional_id=f"stable-{topic}") as producer, \
            clients.consumer(group_id=group) as consumer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: 3}, GroupMetadata(group, -1, ""))
        # OffsetFetch as any client sends it.
        raw = GroupClient(ClusterClient(cluster.bootstrap), group)
        try:
            pending = raw.fetch_once([tp], require_stable=True, timeout_s=10)
            assert pending.unstable == {tp} and tp not in pending.offsets
            assert raw.fetch_once([tp], require_stable=False, timeout_s=10).offsets == {tp: 1}
            assert admin.list_group_offsets(group)[tp].offset == 1  # the last stable one
            answer: list[dict[TopicPartition, int | None]] = []
            waiter = threading.Thread(target=lambda: answer.append(consumer.committed([tp])))
            waiter.start()
            waiter.join(0.3)
            assert not answer, "committed() must wait while the offset is pending"
            producer.commit_transaction()
            waiter.join(WAIT_S)
            assert answer == [{tp: 3}]
            assert raw.fetch_once([tp], require_stable=True, timeout_s=10).offsets == {tp: 3}
        finally:
            raw.client.close()
