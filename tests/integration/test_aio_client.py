"""What only the asyncio client has: its bridge to the threaded client.

Goal: the event loop is never blocked — while a consumer waits for records
on its worker thread, the same loop produces the record it waits for and
runs admin calls; cancelling `send_and_wait()` while it waits for the
acknowledgement leaves the producer whole (the record is still delivered
and its transaction commits); a cancelled `getone()` loses no record, also
when its poll had already fetched one; `async for` reads records in order
and ends when the consumer is stopped; `getmany()` groups records by
partition and honours `max_records` and a partition filter, and
`getmany_columns()` hands out the same by the column (a cancelled one loses
no record; a consumer with deserializers refuses it); the plain
methods (`seek`, `assign`) take effect in order with the awaited calls, and
an error the threaded consumer raises for one of them comes out of the next
awaited call; `producer.transaction()` commits, or aborts when its block
raises; `send_many()` resolves to each record's metadata in order; calls
before start() or after stop() are refused with a clear error; and AIOAdmin
has every Admin method as a coroutine with the same parameters. (The
transaction, group and read_committed guarantees are
test_client_contract.py's, run against both clients.)

Method: one LocalCluster (one store, one transaction coordinator, one group
coordinator) for the module, a topic per test; each test is a coroutine run
with asyncio.run (no pytest plugin), bounded by asyncio.wait_for so a hang
fails the test. Where a test needs the worker thread to finish a call
before the loop sees a cancellation, it blocks the loop on purpose; the
assertions hold whichever way that race goes.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from oncelog import Admin, ConsumerRecord, TopicPartition, errors
from oncelog.aio import AIOAdmin, AIOConsumer, AIOProducer
from oncelog.testing import LocalCluster
from tests.support.reading import wait_for_markers

T = TypeVar("T")
GUARD_S = 60.0
# How long a hook on a worker thread waits for the event loop before it
# gives up (a guard: a free loop answers at once).
PROBE_S = 20.0
_ids = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("aio") / "cluster",
                      consumer_offsets_partitions=2) as c:
        yield c


def new_topic(cluster: LocalCluster, partitions: int = 1) -> str:
    name = f"aio-{next(_ids)}"
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=partitions)
    return name


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, GUARD_S))


async def produce(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    async with AIOProducer(bootstrap=bootstrap) as producer:
        for value in values:
            await producer.send(topic, value=value, partition=partition)
        await producer.flush()


async def read_committed(bootstrap: str, topic: str, partitions: int = 1
                         ) -> list[ConsumerRecord]:
    """Every committed record, once the markers of every decided transaction
    have landed (wait_for_markers)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: list[ConsumerRecord] = []
    await asyncio.to_thread(wait_for_markers, bootstrap)
    deadline = time.monotonic() + 60
    async with AIOConsumer(bootstrap=bootstrap) as consumer:
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            while await consumer.position(tp) < ends[tp]:
                assert time.monotonic() < deadline, f"{topic} not read to {ends}"
                for records in (await consumer.getmany(tp, timeout_ms=200)).values():
                    out += records
    return out


def test_the_loop_runs_while_a_consumer_waits(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    tp = TopicPartition(topic, 0)

    async def scenario() -> None:
        async with AIOConsumer(bootstrap=cluster.bootstrap) as consumer, \
                AIOProducer(bootstrap=cluster.bootstrap) as producer, \
                AIOAdmin(bootstrap=cluster.bootstrap) as admin:
            consumer.assign([tp])
            waiting = asyncio.ensure_future(consumer.getmany(timeout_ms=30_000))
            # Both of these need the loop while getmany() waits.
            assert (await admin.describe_topic(topic)).name == topic
            assert not waiting.done(), "getmany() returned with nothing to read"
            meta = await producer.send_and_wait(topic, value=b"wake up", partition=0)
            got = await waiting
            assert [(r.offset, r.value) for r in got[tp]] == [(meta.offset, b"wake up")]

    run(scenario())


def test_the_loop_is_free_while_the_worker_thread_runs_a_call(cluster: LocalCluster) -> None:
    """A serializer and a deserializer run inside the producer's send() and
    the consumer's poll() on the worker threads; these ones only return once
    the event loop has run a coroutine for them, which it can do only if it
    is not waiting for that very call (a blocked loop makes them give up)."""
    topic = new_topic(cluster)
    tp = TopicPartition(topic, 0)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        probed: list[str] = []

        def needs_the_loop(what: str) -> Callable[[bytes], bytes]:
            def hook(data: bytes) -> bytes:
                async def probe() -> str:
                    return what

                probed.append(asyncio.run_coroutine_threadsafe(probe(), loop).result(PROBE_S))
                return data

            return hook

        async with AIOProducer(bootstrap=cluster.bootstrap,
                               value_serializer=needs_the_loop("send")) as producer, \
                AIOConsumer(bootstrap=cluster.bootstrap,
                            value_deserializer=needs_the_loop("poll")) as consumer:
            await producer.send_and_wait(topic, value=b"probe", partition=0)
            consumer.assign([tp])
            record = await consumer.getone()
        assert (record.value, probed) == (b"probe", ["send", "poll"])

    run(scenario())


def test_a_cancelled_send_and_wait_leaves_the_producer_whole(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)

    async def scenario() -> None:
        # A long linger keeps the record queued until the commit flushes it,
        # so the cancellation lands while send_and_wait waits for it.
        async with AIOProducer(bootstrap=cluster.bootstrap, transactional_id=f"t-{topic}",
                               linger_ms=60_000) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            waiter = asyncio.ensure_future(
                producer.send_and_wait(topic, value=b"cancelled-waiter", partition=0))
            accumulator = producer._producer._accumulator
            while not accumulator.buffered_bytes:
                assert not waiter.done(), waiter
                await asyncio.sleep(0.01)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await producer.commit_transaction()
            await producer.begin_transaction()
            delivery = await producer.send(topic, value=b"next", partition=0)
            await producer.commit_transaction()  # flushes the lingering record
            assert (await delivery).offset > 0
        records = await read_committed(cluster.bootstrap, topic)
        assert [r.value for r in records] == [b"cancelled-waiter", b"next"]

    run(scenario())


def test_a_cancelled_getone_loses_no_record(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    tp = TopicPartition(topic, 0)

    async def scenario() -> None:
        async with AIOConsumer(bootstrap=cluster.bootstrap) as consumer:
            consumer.assign([tp])
            # Cancelled while nothing is there to read.
            idle = asyncio.ensure_future(consumer.getone())
            await asyncio.sleep(0.1)
            idle.cancel()
            with pytest.raises(asyncio.CancelledError):
                await idle
            await produce(cluster.bootstrap, topic, [b"r-%d" % i for i in range(5)])
            first = await consumer.getone()
            assert first.offset == 0
            # Cancelled after its poll fetched record 1: the loop is blocked
            # on purpose until the worker thread has it.
            fetching = asyncio.ensure_future(consumer.getone())
            await asyncio.sleep(0)
            time.sleep(1.0)
            fetching.cancel()
            with pytest.raises(asyncio.CancelledError):
                await fetching
            rest = [await consumer.getone() for _ in range(4)]
            assert [r.offset for r in rest] == [1, 2, 3, 4]

    async def with_group() -> None:
        # commit() commits what was handed out, not what a cancelled poll fetched.
        group = f"g-{topic}"
        async with AIOConsumer(topic, bootstrap=cluster.bootstrap, group_id=group) as consumer:
            first = await consumer.getone()
            fetching = asyncio.ensure_future(consumer.getone())
            await asyncio.sleep(0)
            time.sleep(1.0)
            fetching.cancel()
            with pytest.raises(asyncio.CancelledError):
                await fetching
            await consumer.commit()
            assert await consumer.committed(tp) == first.offset + 1

    run(scenario())
    run(with_group())


def test_async_for_reads_in_order_and_ends_when_stopped(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)

    async def scenario() -> None:
        await produce(cluster.bootstrap, topic, [b"m-%d" % i for i in range(10)])
        consumer = AIOConsumer(topic, bootstrap=cluster.bootstrap, group_id=f"g-{topic}")
        await consumer.start()
        seen: list[ConsumerRecord] = []

        async def read() -> None:
            async for record in consumer:
                seen.append(record)

        reader = asyncio.ensure_future(read())
        while len(seen) < 10:
            assert not reader.done(), reader
            await asyncio.sleep(0.01)
        await consumer.stop()
        await reader  # the iteration ends instead of waiting for more
        assert [r.value for r in seen] == [b"m-%d" % i for i in range(10)]
        assert [r.offset for r in seen] == list(range(10))

    run(scenario())


def two_partitions(cluster: LocalCluster) -> tuple[str, TopicPartition, TopicPartition]:
    topic = new_topic(cluster, partitions=2)
    return topic, TopicPartition(topic, 0), TopicPartition(topic, 1)


async def fill_two_partitions(cluster: LocalCluster, topic: str) -> None:
    """Six records in each partition: a-0..a-5 in 0, b-0..b-5 in 1."""
    await produce(cluster.bootstrap, topic, [b"a-%d" % i for i in range(6)], partition=0)
    await produce(cluster.bootstrap, topic, [b"b-%d" % i for i in range(6)], partition=1)


def test_getmany_groups_by_partition_with_max_records_and_a_filter(
        cluster: LocalCluster) -> None:
    topic, t0, t1 = two_partitions(cluster)

    async def scenario() -> None:
        await fill_two_partitions(cluster, topic)
        async with AIOConsumer(bootstrap=cluster.bootstrap) as consumer:
            consumer.assign([t0, t1])
            only_t1: list[ConsumerRecord] = []
            while len(only_t1) < 6:
                got = await consumer.getmany(t1, timeout_ms=5_000, max_records=4)
                assert set(got) <= {t1} and sum(map(len, got.values())) <= 4, got
                only_t1 += got.get(t1, [])
            assert [r.value for r in only_t1] == [b"b-%d" % i for i in range(6)]
            assert await consumer.position(t0) == 0  # nothing of t0 handed out
            got = await consumer.getmany(timeout_ms=5_000, max_records=4)
            assert list(got) == [t0] and [r.offset for r in got[t0]] == [0, 1, 2, 3]
            with pytest.raises(ValueError, match="max_records"):
                await consumer.getmany(max_records=0)

    run(scenario())


def test_getmany_columns_hands_out_columns_and_a_cancelled_one_loses_none(
        cluster: LocalCluster) -> None:
    topic, t0, t1 = two_partitions(cluster)

    async def scenario() -> None:
        await fill_two_partitions(cluster, topic)
        async with AIOConsumer(bootstrap=cluster.bootstrap) as consumer:
            consumer.assign([t0, t1])
            only_t1: list[bytes | None] = []
            while len(only_t1) < 6:
                got = await consumer.getmany_columns(t1, timeout_ms=5_000, max_records=4)
                assert {(p.topic, p.partition) for p in got} <= {(topic, 1)}, got
                assert sum(len(p.offsets) for p in got) <= 4, got
                only_t1 += [value for part in got for value in part.values]
            assert only_t1 == [b"b-%d" % i for i in range(6)]
            assert await consumer.position(t0) == 0  # nothing of t0 handed out
            # Cancelled after its poll fetched records of t0: the loop is
            # blocked on purpose until the worker thread has them.
            fetching = asyncio.ensure_future(
                consumer.getmany_columns(timeout_ms=5_000, max_records=3))
            await asyncio.sleep(0)
            time.sleep(1.0)
            fetching.cancel()
            with pytest.raises(asyncio.CancelledError):
                await fetching
            offsets: list[int] = []
            while got := await consumer.getmany_columns(timeout_ms=2_000):
                offsets += [offset for part in got for offset in part.offsets]
            assert offsets == list(range(6))
            with pytest.raises(ValueError, match="max_records"):
                await consumer.getmany_columns(max_records=0)
        async with AIOConsumer(bootstrap=cluster.bootstrap,
                               value_deserializer=bytes.decode) as decoding:
            decoding.assign([t0])
            with pytest.raises(errors.IllegalStateError, match="deserializer"):
                await decoding.getmany_columns(timeout_ms=1_000)

    run(scenario())


def test_plain_methods_are_ordered_with_awaited_calls(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    tp = TopicPartition(topic, 0)

    async def scenario() -> None:
        await produce(cluster.bootstrap, topic, [b"s-%d" % i for i in range(6)])
        async with AIOConsumer(bootstrap=cluster.bootstrap, group_id=f"g-{topic}") as consumer:
            with pytest.raises(errors.IllegalStateError, match="not assigned"):
                consumer.seek(tp, 1)
            consumer.assign([tp])
            assert consumer.assignment() == {tp}
            consumer.seek(tp, 3)
            assert (await consumer.getone()).offset == 3
            consumer.seek(tp, 1)
            consumer.seek(tp, 4)
            assert await consumer.position(tp) == 4
            await consumer.commit()
            assert await consumer.committed(tp) == 4
            # The threaded consumer refuses subscribe() on assigned partitions;
            # the refusal comes out of the next awaited call.
            consumer.subscribe([topic])
            with pytest.raises(errors.IllegalStateError, match="subscribe"):
                await consumer.position(tp)
            assert await consumer.position(tp) == 4  # and only once

    run(scenario())


def test_the_transaction_context_commits_or_aborts(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)

    async def scenario() -> None:
        async with AIOProducer(bootstrap=cluster.bootstrap,
                               transactional_id=f"t-{topic}") as producer:
            await producer.init_transactions()
            async with producer.transaction():
                await producer.send(topic, value=b"kept", partition=0)
            assert producer.transaction_state == "ready"
            with pytest.raises(ValueError, match="changed my mind"):
                async with producer.transaction():
                    await producer.send_and_wait(topic, value=b"dropped", partition=0)
                    raise ValueError("changed my mind")
            assert producer.transaction_state == "ready"
            async with producer.transaction():
                await producer.send(topic, value=b"kept too", partition=0)
        assert [r.value for r in await read_committed(cluster.bootstrap, topic)] == [
            b"kept", b"kept too"]

    run(scenario())


def test_send_many_resolves_to_each_record_in_order(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    values = [b"%d" % i for i in range(50)]

    async def scenario() -> None:
        async with AIOProducer(bootstrap=cluster.bootstrap) as producer:
            sent = await (await producer.send_many(topic, values, partition=0))
        assert [m.offset for m in sent] == list(range(50))
        assert [r.value for r in await read_committed(cluster.bootstrap, topic)] == values

    run(scenario())


def test_calls_outside_start_and_stop_are_refused(cluster: LocalCluster) -> None:
    async def scenario() -> None:
        producer = AIOProducer(bootstrap=cluster.bootstrap)
        with pytest.raises(errors.IllegalStateError, match=r"before start\(\)"):
            await producer.send("anything", value=b"x")
        await producer.start()
        await producer.stop()
        with pytest.raises(errors.IllegalStateError, match="stopped"):
            await producer.send("anything", value=b"x")
        consumer = AIOConsumer(bootstrap=cluster.bootstrap)
        with pytest.raises(errors.IllegalStateError, match=r"before start\(\)"):
            await consumer.getmany()
        await consumer.start()
        await consumer.stop()
        with pytest.raises(errors.IllegalStateError, match="stopped"):
            await consumer.getone()
        with pytest.raises(errors.IllegalStateError, match="stopped"):
            consumer.seek(TopicPartition("anything", 0), 0)
        with pytest.raises(ValueError, match="topic names"):
            AIOConsumer("", bootstrap=cluster.bootstrap)

    run(scenario())


def test_aio_admin_has_every_admin_method(cluster: LocalCluster) -> None:
    public = [name for name, _ in inspect.getmembers(Admin, inspect.isfunction)
              if not name.startswith("_")]
    assert "describe_topic" in public
    for name in public:
        mirror = getattr(AIOAdmin, name, None)
        assert mirror is not None, f"AIOAdmin has no {name}()"
        assert inspect.iscoroutinefunction(mirror), f"AIOAdmin.{name} is not a coroutine"
        theirs = inspect.signature(getattr(Admin, name)).parameters.values()
        ours = inspect.signature(mirror).parameters.values()
        assert [(p.name, p.kind, p.default) for p in ours] == [
            (p.name, p.kind, p.default) for p in theirs], name

    topic = f"aio-admin-{next(_ids)}"

    async def scenario() -> None:
        async with AIOAdmin(bootstrap=cluster.bootstrap) as admin:
            await admin.create_topic(topic, partitions=2)
            await admin.create_topic(topic, partitions=2, exist_ok=True)
            assert (await admin.list_topics())[topic] == 2
            assert len((await admin.describe_topic(topic)).partitions) == 2
            with pytest.raises(errors.TopicAlreadyExistsError):
                await admin.create_topic(topic)
            await admin.delete_topic(topic)
            assert topic not in await admin.list_topics()
        with pytest.raises(errors.IllegalStateError, match="closed"):
            await admin.list_topics()

    run(scenario())
