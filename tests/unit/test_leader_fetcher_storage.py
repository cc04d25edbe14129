"""A follower's fetcher while its storage is not writable.

Goal: a store whose writes fail (a full disk, a failed write) must not
fetch as a follower until its memory is rebuilt from disk: a fetch tells
the leader the replica holds everything below its log end, which a failed
write left ahead of the disk. With one fetcher per leader store
(replication.LeaderFetcher) the pause must hold for every partition the
fetcher copies, the truncation step included, and once storage is back the
fetcher opens a new fetch session that lists every partition at the log
end it has then (the leader learns them afresh).

Method: a LeaderFetcher over stand-ins for the replica fetcher manager, the store
runtime and the leader link, which count the requests made. The storage is
marked not writable, the fetcher runs for many fetch waits, and no request
may reach the leader; storage comes back, and the next fetch must open a
session (epoch 1) listing both partitions at their current log ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from services.partition_store.api import ReplicaFetchItem, ReplicaFetchOutcome
from services.partition_store.replication.fetcher import LeaderFetcher, ReplicaFetcherManager

LEADER = 1
EPOCH = 3
FETCH_WAIT_MS = 20


@dataclass
class _Log:
    log_end_offset: int


@dataclass
class _State:
    leader_epoch: int


@dataclass
class _Part:
    topic_partition: str
    log: _Log
    state: _State = field(default_factory=lambda: _State(EPOCH))


@dataclass
class _Runtime:
    parts: dict[tuple[str, int], _Part]
    storage_writable: bool = True

    def follower_partition(self, topic: str, partition: int) -> _Part | None:
        return self.parts.get((topic, partition))


@dataclass
class _Leaders:
    fetches: list[tuple[int, int, list[tuple[str, int, int]]]] = field(default_factory=list)

    async def replica_fetch(
        self, leader: int, replica_id: int, items: Sequence[ReplicaFetchItem], *,
        max_wait_ms: int, session_id: int = 0, session_epoch: int = 0,
        forgotten: Sequence[tuple[str, int]] = (),
    ) -> tuple[int, list[ReplicaFetchOutcome]]:
        del leader, replica_id, forgotten
        self.fetches.append((session_id, session_epoch,
                             sorted((i.topic, i.partition, i.fetch_offset) for i in items)))
        await asyncio.sleep(max_wait_ms / 1000)
        return 7, []


@dataclass
class _Manager:
    _runtime: _Runtime
    _leaders: _Leaders
    _node_id: int = 2
    _fetch_wait_ms: int = FETCH_WAIT_MS
    truncations: list[str] = field(default_factory=list)

    async def _truncate_to_leader(self, part: _Part, leader: int, epoch: int) -> None:
        del leader, epoch
        self.truncations.append(part.topic_partition)


async def _until(condition: Callable[[], bool]) -> None:
    """Waits (on the loop) until the fetcher got there; a bound on the
    wait only keeps a broken fetcher from hanging the test."""
    for _ in range(2_000):
        if condition():
            return
        await asyncio.sleep(FETCH_WAIT_MS / 1000 / 4)
    raise AssertionError("the fetcher never got there")


def _fixture() -> tuple[_Manager, _Runtime, _Leaders]:
    runtime = _Runtime({("a", 0): _Part("a-0", _Log(10)), ("b", 1): _Part("b-1", _Log(20))})
    leaders = _Leaders()
    return _Manager(runtime, leaders), runtime, leaders


def test_no_partition_is_truncated_or_fetched_while_storage_is_not_writable() -> None:
    async def scenario() -> None:
        manager, runtime, leaders = _fixture()
        runtime.storage_writable = False
        fetcher = LeaderFetcher(cast(ReplicaFetcherManager, manager), LEADER)
        fetcher.follow({("a", 0): EPOCH, ("b", 1): EPOCH})
        await asyncio.sleep(20 * FETCH_WAIT_MS / 1000)
        assert manager.truncations == []
        assert leaders.fetches == []
        fetcher.stop()

    asyncio.run(scenario())


def test_a_failed_write_ends_the_session_and_the_next_one_lists_every_partition() -> None:
    async def scenario() -> None:
        manager, runtime, leaders = _fixture()
        fetcher = LeaderFetcher(cast(ReplicaFetcherManager, manager), LEADER)
        fetcher.follow({("a", 0): EPOCH, ("b", 1): EPOCH})
        await _until(lambda: len(leaders.fetches) >= 2)
        assert sorted(manager.truncations) == ["a-0", "b-1"]
        assert leaders.fetches[-1][0] == 7  # in its session
        # A write fails; memory is rebuilt from disk, behind the old log end.
        # No request starts once the flag is down (the fetcher checks it
        # before each one).
        runtime.storage_writable = False
        during = len(leaders.fetches)
        await asyncio.sleep(20 * FETCH_WAIT_MS / 1000)
        assert len(leaders.fetches) == during
        runtime.parts[("a", 0)].log.log_end_offset = 8
        runtime.storage_writable = True
        await _until(lambda: len(leaders.fetches) > during)
        reopened = leaders.fetches[during]
        assert reopened[:2] == (0, 1), reopened
        assert reopened[2] == [("a", 0, 8), ("b", 1, 20)]
        fetcher.stop()

    asyncio.run(scenario())
