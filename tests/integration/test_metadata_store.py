"""The metadata store port: one contract, two adapters.

Goal: MemoryMetadataStore (tests, simulation) and EtcdMetadataStore (real
etcd) keep the same semantics, so what passes against one holds for the
other: reads say their revision; a commit is all or nothing, guarded by mod
revisions (two writers that read the same revision: exactly one wins; mod
revision 0 means "absent"); keys of a lease vanish, in one revision, when it
expires or is revoked, and keep-alive keeps them; a watch delivers puts and
deletes in revision order, whole revisions per list, and ends on close.

Method: every contract test is one async function run against both adapters
(a parametrised fixture): the memory store on an injected clock, and a real
one-member etcd started by oncelog_local.etcd on 127.0.0.1 for the module (each
test works under its own key prefix). Time passes by moving the fake clock,
or by sleeping against etcd, whose lease expiry is checked every ~500 ms (so
waits there allow for that slack). A few tests at the end pin what only one
side has: the memory store's test hooks and history bound, and the pure
helpers of the etcd adapter (status mapping, ranges, endpoints).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from oncelog_local.etcd import EtcdCluster
from services.common.metadata.etcd import (
    EtcdFailure,
    EtcdMetadataStore,
    classify_status,
    parse_endpoints,
    prefix_range_end,
)
from services.common.metadata.store import (
    METADATA_TXN_OPS_MAX,
    Compare,
    LeaseNotFound,
    MemoryMetadataStore,
    MetadataStore,
    MetadataUnavailable,
    Put,
    Versioned,
    WatchCompacted,
    WatchEvent,
)

TIMEOUT_MS = 3000
_prefixes = itertools.count()


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class Backend:
    """One adapter, opened inside the test's event loop."""

    name: str
    new_client: Callable[[], MetadataStore]
    # Lets ms of the store's time pass: the fake clock, or a real sleep.
    let_time_pass: Callable[[int], Awaitable[None]]
    # How long past its TTL a lease may still hold its keys.
    lease_slack_ms: int
    prefix: str = field(default_factory=lambda: f"test-{next(_prefixes)}/")
    clients: list[MetadataStore] = field(default_factory=list)

    def client(self) -> MetadataStore:
        store = self.new_client()
        self.clients.append(store)
        return store

    def key(self, name: str) -> str:
        return self.prefix + name

    async def wait_until(self, condition: Callable[[], Awaitable[bool]], limit_ms: int) -> bool:
        """Whether condition became true within limit_ms of store time."""
        waited_ms = 0
        while not await condition():
            if waited_ms >= limit_ms:
                return False
            await self.let_time_pass(50)
            waited_ms += 50
        return True


BackendFactory = Callable[[], Backend]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path_factory.mktemp("etcd"), members=1) as cluster:
        yield cluster


@pytest.fixture(params=["memory", "etcd"])
def backend(request: pytest.FixtureRequest) -> BackendFactory:
    if request.param == "memory":
        def open_memory() -> Backend:
            clock = Clock()
            shared = MemoryMetadataStore(clock_ms=clock)

            async def let_time_pass(ms: int) -> None:
                clock.now_ms += ms
                await asyncio.sleep(0)

            return Backend("memory", shared.another_client, let_time_pass, lease_slack_ms=0)

        return open_memory
    cluster: EtcdCluster = request.getfixturevalue("etcd")

    def open_etcd() -> Backend:
        async def let_time_pass(ms: int) -> None:
            await asyncio.sleep(ms / 1000)

        return Backend("etcd", lambda: EtcdMetadataStore(cluster.endpoints, timeout_ms=TIMEOUT_MS),
                       let_time_pass, lease_slack_ms=1500)

    return open_etcd


def run(factory: BackendFactory, test: Callable[[Backend], Awaitable[None]]) -> None:
    async def main() -> None:
        backend = factory()
        try:
            await asyncio.wait_for(test(backend), 30)
        finally:
            for store in backend.clients:
                await store.close()

    asyncio.run(main())


async def _revision(store: MetadataStore) -> int:
    return (await store.get_prefix("no-such-prefix/"))[1]


# ------------------------------------------------------------ reads, revisions


def test_reads_say_their_revision(backend: BackendFactory) -> None:
    async def test(b: Backend) -> None:
        store = b.client()
        a, c, outside = b.key("a"), b.key("c"), b.prefix.rstrip("/") + "-outside"
        assert await store.get(a) is None
        assert await store.get_prefix(b.prefix) == ({}, await _revision(store))

        assert await store.commit([], [Put(c, "3"), Put(a, "1"), Put(outside, "x")], [])
        entries, revision = await store.get_prefix(b.prefix)
        # One transaction, one revision; sorted by key; nothing outside the prefix.
        assert entries == {a: Versioned("1", revision), c: Versioned("3", revision)}
        assert list(entries) == [a, c]
        assert await store.get(a) == Versioned("1", revision)

        assert await store.commit([], [Put(a, "2")], [])
        assert await store.get(a) == Versioned("2", revision + 1)
        assert await store.get(c) == Versioned("3", revision)
        # Deleting an absent key changes nothing: success, no new revision.
        assert await store.commit([], [], [b.key("absent")])
        assert await _revision(store) == revision + 1
        assert await store.commit([], [], [a, outside])
        assert await store.get(a) is None
        assert await store.get_prefix(b.prefix) == ({c: Versioned("3", revision)}, revision + 2)

    run(backend, test)


# ----------------------------------------------------------------- commits


def test_commit_is_all_or_nothing(backend: BackendFactory) -> None:
    async def test(b: Backend) -> None:
        store = b.client()
        leader, epoch, isr = b.key("leader"), b.key("epoch"), b.key("isr")
        assert await store.commit([], [Put(leader, "0"), Put(epoch, "1"), Put(isr, "0,1")], [])
        entries, revision = await store.get_prefix(b.prefix)

        # Compares hold: every put and delete, at one new revision.
        assert await store.commit(
            [Compare(leader, entries[leader].mod_revision),
             Compare(epoch, entries[epoch].mod_revision)],
            [Put(leader, "1"), Put(epoch, "2")], [isr])
        after, revision_after = await store.get_prefix(b.prefix)
        assert after == {leader: Versioned("1", revision + 1),
                         epoch: Versioned("2", revision + 1)}
        assert revision_after == revision + 1

        # One compare is stale (epoch changed above): nothing at all changes.
        assert not await store.commit(
            [Compare(leader, revision + 1), Compare(epoch, entries[epoch].mod_revision)],
            [Put(leader, "2"), Put(b.key("new"), "x")], [epoch])
        assert await store.get_prefix(b.prefix) == (after, revision_after)

    run(backend, test)


def test_two_writers_that_read_the_same_revision_exactly_one_wins(
        backend: BackendFactory) -> None:
    async def test(b: Backend) -> None:
        first, second = b.client(), b.client()
        key = b.key("controller-state")
        assert await first.commit([], [Put(key, "v0")], [])
        for round_ in range(5):
            read_by_first, read_by_second = await first.get(key), await second.get(key)
            assert read_by_first is not None and read_by_first == read_by_second
            wins = await asyncio.gather(
                first.commit([Compare(key, read_by_first.mod_revision)],
                             [Put(key, f"first-{round_}")], []),
                second.commit([Compare(key, read_by_second.mod_revision)],
                              [Put(key, f"second-{round_}")], []),
            )
            assert sorted(wins) == [False, True]
            winner = "first" if wins[0] else "second"
            now = await second.get(key)
            assert now is not None and now.value == f"{winner}-{round_}"
            assert now.mod_revision == read_by_first.mod_revision + 1

    run(backend, test)


def test_compare_with_revision_zero_means_absent(backend: BackendFactory) -> None:
    async def test(b: Backend) -> None:
        store = b.client()
        key = b.key("registration")
        assert await store.commit([Compare(key, 0)], [Put(key, "a")], [])
        assert not await store.commit([Compare(key, 0)], [Put(key, "b")], [])
        assert (await store.get(key)) == Versioned("a", await _revision(store))
        assert await store.commit([], [], [key])
        assert await store.commit([Compare(key, 0)], [Put(key, "c")], [])
        current = await store.get(key)
        assert current is not None and current.value == "c"
        # A nonzero revision on an absent key fails too.
        assert not await store.commit([Compare(b.key("absent"), current.mod_revision)],
                                      [Put(key, "d")], [])

    run(backend, test)


def test_invalid_transactions_are_refused_alike(backend: BackendFactory) -> None:
    async def test(b: Backend) -> None:
        store = b.client()
        key = b.key("k")
        too_many = [Put(b.key(f"k{i}"), "v") for i in range(METADATA_TXN_OPS_MAX + 1)]
        with pytest.raises(ValueError, match="at most"):
            await store.commit([], too_many, [])
        with pytest.raises(ValueError, match="written twice"):
            await store.commit([], [Put(key, "v")], [key])
        with pytest.raises(ValueError, match="non-empty"):
            await store.commit([], [Put("", "v")], [])
        with pytest.raises(ValueError, match="non-empty"):
            await store.get("")
        with pytest.raises(ValueError, match="ttl_s"):
            await store.grant_lease(0)
        # The most a transaction may hold is accepted.
        assert await store.commit([], too_many[:METADATA_TXN_OPS_MAX], [])
        assert await store.get(key) is None

    run(backend, test)


# ------------------------------------------------------------------- leases


def test_lease_keys_vanish_when_it_expires(backend: BackendFactory) -> None:
    async def test(b: Backend) -> None:
        store = b.client()
        lease = await store.grant_lease(1)
        assert lease > 0
        held = [b.key("store-0"), b.key("store-0-addr")]
        assert await store.commit([Compare(held[0], 0)],
                                  [Put(key, "up", lease) for key in held], [])
        other = b.key("unleased")
        assert await store.commit([], [Put(other, "stays")], [])
        revision = await _revision(store)

        async def gone() -> bool:
            return await store.get(held[0]) is None

        assert await b.wait_until(gone, 1000 + b.lease_slack_ms)
        entries, revision_after = await store.get_prefix(b.prefix)
        assert list(entries) == [other]
        # All of the lease's keys went at one revision.
        assert revision_after == revision + 1
        assert not await store.keep_alive(lease)
        with pytest.raises(LeaseNotFound):
            await store.commit([], [Put(b.key("late"), "x", lease)], [])
        assert await store.get(b.key("late")) is None
        # A lease that is gone can be revoked again without error.
        await store.revoke(lease)

    run(backend, test)


def test_keep_alive_keeps_the_keys(backend: BackendFactory) -> None:
    async def test(b: Backend) -> None:
        store = b.client()
        lease = await store.grant_lease(1)
        key = b.key("controller")
        assert await store.commit([Compare(key, 0)], [Put(key, "node-0", lease)], [])
        for _ in range(10):  # 2.5 s: well past the TTL
            await b.let_time_pass(250)
            assert await store.keep_alive(lease)
        assert await store.get(key) is not None

        async def gone() -> bool:
            return await store.get(key) is None

        assert await b.wait_until(gone, 1000 + b.lease_slack_ms)

    run(backend, test)


def test_revoke_and_a_put_without_the_lease(backend: BackendFactory) -> None:
    async def test(b: Backend) -> None:
        store = b.client()
        lease = await store.grant_lease(30)
        kept, dropped = b.key("kept"), b.key("dropped")
        assert await store.commit([], [Put(kept, "a", lease), Put(dropped, "b", lease)], [])
        # A put replaces the key's lease (here: with none), as in etcd.
        assert await store.commit([], [Put(kept, "a2")], [])
        await store.revoke(lease)
        entries, _ = await store.get_prefix(b.prefix)
        assert list(entries) == [kept]
        assert not await store.keep_alive(lease)

    run(backend, test)


# -------------------------------------------------------------------- watch


async def _collect(store: MetadataStore, prefix: str, start_revision: int, until_key: str,
                   into: list[list[WatchEvent]]) -> None:
    """Watches until an event of until_key arrives."""
    stream = store.watch_prefix(prefix, start_revision=start_revision)
    async with contextlib.aclosing(stream):
        async for batch in stream:
            into.append(batch)
            if any(event.key == until_key for event in batch):
                return


def test_watch_sees_puts_and_deletes_in_order(backend: BackendFactory) -> None:
    async def test(b: Backend) -> None:
        writer, watcher = b.client(), b.client()
        a, c, leased, end = b.key("a"), b.key("c"), b.key("leased"), b.key("end")
        assert await writer.commit([], [Put(a, "0")], [])
        _, revision = await watcher.get_prefix(b.prefix)
        batches: list[list[WatchEvent]] = []
        task = asyncio.create_task(_collect(watcher, b.prefix, revision + 1, end, batches))
        lease = await writer.grant_lease(30)
        assert await writer.commit([], [Put(a, "1")], [])
        assert await writer.commit([], [Put(c, "2"), Put(leased, "3", lease)], [a])
        assert await writer.commit([], [Put(b.prefix.rstrip("/") + "-outside", "x")], [])
        await writer.revoke(lease)
        assert await writer.commit([], [Put(end, "")], [])
        await asyncio.wait_for(task, 10)
        r = revision
        expected = [
            [WatchEvent(a, "1", r + 1)],
            [WatchEvent(c, "2", r + 2), WatchEvent(leased, "3", r + 2), WatchEvent(a, None, r + 2)],
            [WatchEvent(leased, None, r + 4)],
            [WatchEvent(end, "", r + 5)],
        ]
        events = [event for batch in batches for event in batch]
        assert events == [event for batch in expected for event in batch]
        # Lists hold whole revisions.
        for batch in batches:
            for event in batch:
                revision_events = [e for e in events if e.mod_revision == event.mod_revision]
                assert all(e in batch for e in revision_events)

        # From a past revision: the same history again.
        replay: list[list[WatchEvent]] = []
        await asyncio.wait_for(_collect(watcher, b.prefix, revision + 1, end, replay), 10)
        assert [event for batch in replay for event in batch] == events

    run(backend, test)


def test_watch_ends_when_the_store_closes(backend: BackendFactory) -> None:
    async def test(b: Backend) -> None:
        store = b.client()
        _, revision = await store.get_prefix(b.prefix)
        seen: list[list[WatchEvent]] = []

        async def consume() -> None:
            async for batch in store.watch_prefix(b.prefix, start_revision=revision + 1):
                seen.append(batch)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        await store.close()
        await asyncio.wait_for(task, 5)
        assert seen == []
        with pytest.raises(MetadataUnavailable, match="closed"):
            await store.get(b.key("x"))

    run(backend, test)


# --------------------------------------------------------- memory store only


def test_memory_store_hooks() -> None:
    async def test() -> None:
        clock = Clock()
        store = MemoryMetadataStore(clock_ms=clock)
        key = "k"
        lease = await store.grant_lease(5)
        assert await store.commit([], [Put(key, "v", lease)], [])
        # expire_leases() is what the simulation calls; the clock decides.
        clock.now_ms += 4999
        store.expire_leases()
        assert store.revision == 2
        clock.now_ms += 1
        store.expire_leases()
        assert store.revision == 3 and await store.get(key) is None

        # A commit whose reply is lost after it ran, and one that never ran.
        store.fail_next_commits = [True, False]
        with pytest.raises(MetadataUnavailable) as lost:
            await store.commit([Compare(key, 0)], [Put(key, "a")], [])
        assert lost.value.maybe_applied and await store.get(key) == Versioned("a", 4)
        with pytest.raises(MetadataUnavailable) as failed:
            await store.commit([], [Put(key, "b")], [])
        assert not failed.value.maybe_applied and store.revision == 4

        # A client cut off from the store; another one still works.
        other = store.another_client()
        store.set_available(False)
        with pytest.raises(MetadataUnavailable, match="memory"):
            await store.get(key)
        assert await other.get(key) == Versioned("a", 4)
        store.set_available(True)
        assert await store.get(key) == Versioned("a", 4)

    asyncio.run(test())


def test_memory_watch_from_a_compacted_revision() -> None:
    async def test() -> None:
        store = MemoryMetadataStore(clock_ms=Clock(), history_revisions_max=3)
        for i in range(5):
            assert await store.commit([], [Put("k", str(i))], [])
        # Revisions 2..6 were written; 4..6 are kept.
        with pytest.raises(WatchCompacted) as compacted:
            async for _ in store.watch_prefix("", start_revision=3):
                pass
        assert compacted.value.compact_revision == 4
        stream = store.watch_prefix("", start_revision=4)
        async with contextlib.aclosing(stream):
            batch = await anext(stream)
        assert [event.value for event in batch] == ["2", "3", "4"]

    asyncio.run(test())


# ------------------------------------------------------- etcd adapter helpers


@pytest.mark.parametrize(("code", "details", "failure"), [
    (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader", EtcdFailure.TRY_ANOTHER),
    (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out", EtcdFailure.TRY_ANOTHER),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", EtcdFailure.TRY_ANOTHER),
    (grpc.StatusCode.UNKNOWN, "context deadline exceeded", EtcdFailure.TRY_ANOTHER),
    (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: duplicate key given in txn request",
     EtcdFailure.INVALID),
    (grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found",
     EtcdFailure.LEASE_NOT_FOUND),
    (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted",
     EtcdFailure.COMPACTED),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded",
     EtcdFailure.REFUSED),
    (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token", EtcdFailure.REFUSED),
])
def test_etcd_status_mapping(code: grpc.StatusCode, details: str, failure: EtcdFailure) -> None:
    assert classify_status(code, details) is failure


def test_etcd_ranges_and_endpoints() -> None:
    assert prefix_range_end(b"a/") == b"a0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"\xff\xff") == b"\0"
    assert prefix_range_end(b"") == b"\0"
    assert parse_endpoints(" 127.0.0.1:2379, etcd-1.etcd:2379,") == (
        "127.0.0.1:2379", "etcd-1.etcd:2379")
    for bad in ("http://127.0.0.1:2379", "127.0.0.1", "host:0", ":2379"):
        with pytest.raises(ValueError, match="host:port"):
            parse_endpoints(bad)
    with pytest.raises(TypeError):
        EtcdMetadataStore("127.0.0.1:2379", timeout_ms=1000)


def test_etcd_all_unreachable_names_the_endpoints(tmp_path: Path) -> None:
    from oncelog.testing import free_port

    endpoints = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]

    async def test() -> None:
        store = EtcdMetadataStore(endpoints, timeout_ms=300)
        try:
            with pytest.raises(MetadataUnavailable) as unavailable:
                await store.get("k")
            assert all(endpoint in str(unavailable.value) for endpoint in endpoints)
            assert unavailable.value.endpoints == tuple(endpoints)
        finally:
            await store.close()

    asyncio.run(test())
