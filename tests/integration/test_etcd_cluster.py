"""etcd as a cluster: members die, come back, vanish; the client copes.

Goal: with three etcd members, EtcdMetadataStore keeps writing when one
member dies (the leader, the hardest case), a restarted or wiped member
rejoins and serves the current data, a watch carries on across the death
of its member, or its member stopping (SIGSTOP), without losing or
repeating an event, and when every member is down or stopped a call raises
MetadataUnavailable naming the endpoints within its timeout. A data dir
starts again on the same ports with its data. LocalCluster(etcd_members=1)
runs etcd next to the services, gives them its endpoints, and kills,
restarts and wipes it as kind "etcd".

Method: real etcd processes from oncelog_local.etcd on 127.0.0.1 (each test
starts and stops its own). Writes are guarded increments of one counter,
each carrying a unique token, and follow the port's rule for an ambiguous
failure (re-read, then decide): so at the end the counter must equal the
number of increments that are known to have landed, exactly. Timeouts are
checked as bounds (the call returns within timeout + slack), not measured as
benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

import grpc
import pytest
from aetcd import rpc as etcd_rpc  # type: ignore[import-untyped]

from oncelog.testing import LocalCluster
from oncelog_local.etcd import EtcdCluster
from services.common.metadata.etcd import EtcdMetadataStore
from services.common.metadata.store import (
    Compare,
    MetadataStore,
    MetadataUnavailable,
    Put,
    Versioned,
    WatchEvent,
)

TIMEOUT_MS = 2000
# What a bounded call may take beyond its timeout (scheduling, a last attempt
# that was already under way).
SLACK_S = 0.5


def _leader(etcd: EtcdCluster) -> int:
    """The index of the member that leads (asked of each running member)."""
    for member in etcd.members:
        if not member.alive():
            continue
        with grpc.insecure_channel(member.endpoint) as channel:
            status = etcd_rpc.MaintenanceStub(channel).Status(etcd_rpc.StatusRequest(),
                                                              timeout=1)
        if status.leader == status.header.member_id:
            return member.index
    raise AssertionError("no running etcd member says it leads")


class Counter:
    """Guarded increments of one key, each with a unique token; an ambiguous
    failure is settled by reading the key back (the port's rule)."""

    def __init__(self, store: MetadataStore, key: str) -> None:
        self.store = store
        self.key = key
        self.landed = 0
        self.failures = 0

    async def increment(self, deadline_s: float = 15.0) -> None:
        """One increment that is known to have landed, retrying until it has."""
        give_up = time.monotonic() + deadline_s
        while True:
            current = await self.read()
            count = int(current.value.split(":")[0]) if current else 0
            mine = f"{count + 1}:{uuid.uuid4().hex}"
            try:
                if await self.store.commit(
                        [Compare(self.key, current.mod_revision if current else 0)],
                        [Put(self.key, mine)], []):
                    self.landed += 1
                    return
            except MetadataUnavailable as exc:
                self.failures += 1
                after = await self.read()
                if exc.maybe_applied and after is not None and after.value == mine:
                    self.landed += 1
                    return
            assert time.monotonic() < give_up, f"no increment landed in {deadline_s}s"

    async def read(self, deadline_s: float = 15.0) -> Versioned | None:
        give_up = time.monotonic() + deadline_s
        while True:
            try:
                return await self.store.get(self.key)
            except MetadataUnavailable:
                self.failures += 1
                if time.monotonic() > give_up:
                    raise

    async def value(self) -> int:
        current = await self.read()
        return int(current.value.split(":")[0]) if current else 0


async def _watch_until(store: MetadataStore, start_revision: int, key: str, count: int,
                       into: list[WatchEvent]) -> None:
    stream = store.watch_prefix(key, start_revision=start_revision)
    async with contextlib.aclosing(stream):
        async for batch in stream:
            into.extend(batch)
            if any(e.value and int(e.value.split(":")[0]) >= count for e in batch):
                return


def test_three_members_survive_a_member_and_take_it_back(tmp_path: Path) -> None:
    with EtcdCluster(tmp_path / "etcd", members=3) as etcd:

        async def main() -> None:
            store = EtcdMetadataStore(etcd.endpoints, timeout_ms=TIMEOUT_MS)
            counter = Counter(store, "counter")
            events: list[WatchEvent] = []
            try:
                for _ in range(5):
                    await counter.increment()
                watch = asyncio.create_task(_watch_until(store, 1, "counter", 20, events))

                # The leader dies: writes go on once another member leads.
                leader = _leader(etcd)
                etcd.kill(leader)
                started = time.monotonic()
                await counter.increment()
                first_write_after_kill_s = time.monotonic() - started
                for _ in range(4):
                    await counter.increment()

                # It comes back with its data dir and serves the current data,
                # also alone: a read through it alone is linearizable.
                etcd.restart(leader)
                alone = EtcdMetadataStore([etcd.endpoints[leader]], timeout_ms=TIMEOUT_MS)
                try:
                    assert await Counter(alone, "counter").value() == await counter.value()
                finally:
                    await alone.close()
                # It counts for the quorum again: another member dies, writes go on.
                other = (leader + 1) % 3
                etcd.kill(other)
                for _ in range(5):
                    await counter.increment()
                etcd.restart(other)
                for _ in range(5):
                    await counter.increment()

                await asyncio.wait_for(watch, 15)
                assert counter.landed == 20 and await counter.value() == 20
                # The watch saw every increment once, in order, across the kills.
                counts = [int(e.value.split(":")[0]) for e in events if e.value]
                assert counts == list(range(1, 21))
                assert first_write_after_kill_s < 10, first_write_after_kill_s
                print(f"first write after the leader died: {first_write_after_kill_s:.2f}s "
                      f"({counter.failures} failed calls in all)")
            finally:
                await store.close()

        asyncio.run(main())


def test_a_watch_on_a_stopped_member_moves_to_another(tmp_path: Path) -> None:
    """SIGSTOP keeps the member's connections open: only keepalive pings
    notice it (after ~15 s, services/common/metadata/etcd.py)."""
    with EtcdCluster(tmp_path / "etcd", members=3) as etcd:

        async def main() -> None:
            writer = EtcdMetadataStore(etcd.endpoints, timeout_ms=TIMEOUT_MS)
            # The watch starts at the first endpoint: member 0.
            watcher = EtcdMetadataStore(etcd.endpoints, timeout_ms=TIMEOUT_MS)
            counter = Counter(writer, "counter")
            events: list[WatchEvent] = []
            try:
                await counter.increment()
                watch = asyncio.create_task(_watch_until(watcher, 1, "counter", 5, events))
                await asyncio.sleep(0.3)
                etcd.pause(0)
                writer._current = 1  # start the writer elsewhere: its calls are not the point
                for _ in range(4):
                    await counter.increment()
                await asyncio.wait_for(watch, 30)
                assert [int(e.value.split(":")[0]) for e in events if e.value] == [1, 2, 3, 4, 5]
            finally:
                etcd.resume(0)
                await writer.close()
                await watcher.close()

        asyncio.run(main())


def test_a_wiped_member_rejoins_empty_and_catches_up(tmp_path: Path) -> None:
    with EtcdCluster(tmp_path / "etcd", members=3) as etcd:

        async def main() -> None:
            store = EtcdMetadataStore(etcd.endpoints, timeout_ms=TIMEOUT_MS)
            try:
                assert await store.commit([], [Put(f"topic/{i}", "{}") for i in range(50)], [])
                # The leader, killed and wiped at once: the others must
                # elect a new leader before they can replace it (wipe waits).
                lost = _leader(etcd)
                etcd.kill(lost)
                running = next(i for i in range(3) if i != lost)
                with pytest.raises(RuntimeError, match="running"):
                    etcd.wipe(running)
                etcd.wipe(lost)
                assert not (etcd.members[lost].data_dir / "member").exists()
                etcd.restart(lost)
                alone = EtcdMetadataStore([etcd.endpoints[lost]], timeout_ms=TIMEOUT_MS)
                try:
                    entries, _ = await alone.get_prefix("topic/")
                    assert len(entries) == 50
                finally:
                    await alone.close()
            finally:
                await store.close()

        asyncio.run(main())


def test_a_data_dir_starts_again_on_the_same_ports(tmp_path: Path) -> None:
    async def write(endpoints: tuple[str, ...]) -> None:
        store = EtcdMetadataStore(endpoints, timeout_ms=TIMEOUT_MS)
        try:
            assert await store.commit([Compare("k", 0)], [Put("k", "v")], [])
        finally:
            await store.close()

    async def read(endpoints: tuple[str, ...]) -> Versioned | None:
        store = EtcdMetadataStore(endpoints, timeout_ms=TIMEOUT_MS)
        try:
            return await store.get("k")
        finally:
            await store.close()

    with EtcdCluster(tmp_path / "etcd", members=3) as first:
        asyncio.run(write(first.endpoints))
    with EtcdCluster(tmp_path / "etcd", members=3) as again:
        assert again.endpoints == first.endpoints
        current = asyncio.run(read(again.endpoints))
        assert current is not None and current.value == "v"
    with pytest.raises(ValueError, match="holds an etcd cluster of 3 members"):
        EtcdCluster(tmp_path / "etcd", members=1)
    with pytest.raises(RuntimeError, match="etcd-server.*scripts/setup.sh"):
        EtcdCluster(tmp_path / "other", etcd_binary="no-such-etcd-binary")


def test_all_members_down_or_stopped_is_unavailable_within_the_timeout(
        tmp_path: Path) -> None:
    with EtcdCluster(tmp_path / "etcd", members=3) as etcd:

        async def main() -> None:
            store = EtcdMetadataStore(etcd.endpoints, timeout_ms=1000)
            try:
                assert await store.commit([], [Put("k", "v")], [])
                # Stopped (SIGSTOP): connections stay open, nothing answers.
                for i in range(3):
                    etcd.pause(i)
                for call in (store.get("k"), store.commit([], [Put("k", "w")], [])):
                    started = time.monotonic()
                    with pytest.raises(MetadataUnavailable) as stopped:
                        await call
                    assert time.monotonic() - started < 1.0 + SLACK_S
                    assert all(e in str(stopped.value) for e in etcd.endpoints)
                for i in range(3):
                    etcd.resume(i)
                assert await Counter(store, "k").read() is not None  # serves again

                # Dead: connections refused.
                for i in range(3):
                    etcd.kill(i)
                started = time.monotonic()
                with pytest.raises(MetadataUnavailable) as dead:
                    await store.commit([], [Put("k", "x")], [])
                assert time.monotonic() - started < 1.0 + SLACK_S
                assert all(e in str(dead.value) for e in etcd.endpoints)
                assert dead.value.endpoints == etcd.endpoints
                # Nothing could be sent, so nothing was applied.
                assert not dead.value.maybe_applied
            finally:
                await store.close()

        asyncio.run(main())


def test_local_cluster_with_etcd(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", etcd_members=1) as cluster:
        (endpoint,) = cluster.etcd_endpoints
        assert cluster.alive("etcd", 0)
        # Every service gets the endpoints in its environment.
        store_pid = cluster.processes["partition_store"][0].pid
        environ = Path(f"/proc/{store_pid}/environ").read_bytes().split(b"\0")
        assert f"ONCELOG_ETCD_ENDPOINTS={endpoint}".encode() in environ

        async def write(key: str) -> None:
            store = EtcdMetadataStore([endpoint], timeout_ms=TIMEOUT_MS)
            try:
                assert await store.commit([], [Put(key, "v")], [])
            finally:
                await store.close()

        async def keys() -> list[str]:
            # The services may keep metadata of their own in this etcd.
            store = EtcdMetadataStore([endpoint], timeout_ms=TIMEOUT_MS)
            try:
                return list((await store.get_prefix("test/"))[0])
            finally:
                await store.close()

        asyncio.run(write("test/a"))
        cluster.kill("etcd", 0)
        assert not cluster.alive("etcd", 0)
        cluster.restart("etcd", 0)
        assert cluster.address("etcd", 0) == endpoint
        assert asyncio.run(keys()) == ["test/a"]

        with pytest.raises(RuntimeError, match="running"):
            cluster.wipe("etcd", 0)
        with pytest.raises(RuntimeError, match="running"):
            cluster.wipe("partition_store", 0)
        cluster.terminate("etcd", 0)
        cluster.wipe("etcd", 0)
        cluster.restart("etcd", 0)
        assert asyncio.run(keys()) == []
        with pytest.raises(ValueError, match="etcd member 1 does not exist"):
            cluster.kill("etcd", 1)

    # Without etcd_members there is no etcd, as before.
    assert LocalCluster(tmp_path / "plain", start=False).etcd_endpoints == ()
    with pytest.raises(ValueError, match="no etcd"):
        LocalCluster(tmp_path / "plain", start=False).kill("etcd", 0)
