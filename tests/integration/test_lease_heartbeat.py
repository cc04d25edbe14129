"""A store's etcd lease outlives a busy event loop, not a wedged one.

Goal: the lease that says a partition store is alive (and so keeps its
partitions) is kept alive from a thread of its own
(services/partition_store/replication/lease_heartbeat.py). An event loop that
runs late under load must not lose it; a loop that stops running for longer
than the heartbeat's limit must; and once the heartbeat stops, the lease
ends one TTL later, as a killed store's does.

Method: a real one-member etcd (oncelog_local.etcd), the project's own etcd
client, and leases of 2 s whose keys show whether they are still alive. The
test keeps its event loop from running by computing in it (holding the GIL
as an overloaded store does, not sleeping), for longer than a TTL. The
control: in the same stall, a lease that only the event loop would have kept
alive ends, so each test can tell a kept lease from a lost one. etcd checks
expiry about every 500 ms, so waits allow a TTL plus a second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from oncelog_local.etcd import EtcdCluster
from services.common.metadata.etcd import EtcdMetadataStore
from services.common.metadata.store import Put
from services.partition_store.replication.lease_heartbeat import LeaseHeartbeat

TTL_S = 2
INTERVAL_S = 0.5
TIMEOUT_MS = 3000
# Longer than a TTL plus etcd's expiry slack: a lease nobody keeps alive
# through it has ended by its end.
STALL_S = TTL_S + 2.0


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path_factory.mktemp("etcd"), members=1) as cluster:
        yield cluster


def busy_for(seconds: float) -> None:
    """Keeps the calling event loop from running callbacks, computing (the
    GIL is held except at the interpreter's switch interval)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(range(1000))


async def leased_key(client: EtcdMetadataStore, name: str) -> tuple[int, str]:
    lease = await client.grant_lease(TTL_S)
    assert await client.commit((), [Put(name, "alive", lease)], ())
    return lease, name


def test_a_busy_event_loop_keeps_its_lease(etcd: EtcdCluster) -> None:
    async def test() -> None:
        client = EtcdMetadataStore(etcd.endpoints, timeout_ms=TIMEOUT_MS)
        heartbeat = LeaseHeartbeat(etcd.endpoints, timeout_ms=TIMEOUT_MS,
                                   interval_s=INTERVAL_S, loop_stall_limit_s=3 * TTL_S)
        try:
            kept, kept_key = await leased_key(client, "busy/kept")
            _unkept, unkept_key = await leased_key(client, "busy/unkept")
            heartbeat.start(asyncio.get_running_loop())
            heartbeat.keep(kept)
            busy_for(STALL_S)
            assert await client.get(unkept_key) is None, "the control lease should have ended"
            assert await client.get(kept_key) is not None
            assert heartbeat.keeps(kept)
            assert heartbeat.keep_alives_sent >= 2
            assert heartbeat.beats_withheld == 0

            # Stopped, the heartbeat keeps nothing: the lease ends a TTL later.
            await heartbeat.stop()
            await asyncio.sleep(TTL_S + 1.5)
            assert await client.get(kept_key) is None
        finally:
            await heartbeat.stop()
            await client.close()

    asyncio.run(test())


def test_a_loop_stalled_past_the_limit_loses_its_lease(etcd: EtcdCluster) -> None:
    async def test() -> None:
        client = EtcdMetadataStore(etcd.endpoints, timeout_ms=TIMEOUT_MS)
        heartbeat = LeaseHeartbeat(etcd.endpoints, timeout_ms=TIMEOUT_MS,
                                   interval_s=INTERVAL_S, loop_stall_limit_s=1.0)
        try:
            lease, key = await leased_key(client, "wedged/kept")
            heartbeat.start(asyncio.get_running_loop())
            heartbeat.keep(lease)
            busy_for(STALL_S + 1.0)
            assert await client.get(key) is None
            assert heartbeat.beats_withheld >= 1
            # Its next keep-alive finds the lease ended and says so: the
            # store's loop then registers under a new one.
            await asyncio.sleep(3 * INTERVAL_S)
            assert not heartbeat.keeps(lease)
            # The loop runs again: a new lease handed over is kept again.
            lease, key = await leased_key(client, "wedged/new")
            heartbeat.keep(lease)
            await asyncio.sleep(STALL_S)
            assert await client.get(key) is not None
        finally:
            await heartbeat.stop()
            await client.close()

    asyncio.run(test())

