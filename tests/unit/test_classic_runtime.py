"""Classic groups in the group coordinator's runtime, against an in-memory
partition store.

Goal: what the runtime adds to the core's rules (core/classic.py):
* parked JoinGroup and SyncGroup calls are answered when a later request or
  a deadline completes their step, and only once the step's record is
  durable;
* the group's record (Kafka's GroupMetadata) is in `__consumer_offsets`
  after the leader's SyncGroup, and a coordinator started on the same log
  has the Stable group back — members, generation, leader, assignments —
  with a session running for each member;
* a parked call of a coordinator that stops is answered NOT_COORDINATOR;
* a group id is of one type at a time, and a classic group's offset
  commits are checked against its generation and members;
* an assignment too large for one record is refused, and the other
  members' parked SyncGroups learn it (the group rebalances).

Method: GroupCoordinatorRuntime instances over the in-memory log of
test_group_runtime.py (real record batches, conditional appends), a clock
the test moves, and a timer tick every few milliseconds of real time so the
runtime's deadline loop runs; waits are bounded polls (failure guards).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import pytest

from oncelog import records
from oncelog.errors import ErrorCode
from services.common.kernel import durable
from services.common.kernel.errors import ServiceError
from services.common.rpc.store_client import TxnWriter
from services.group_coordinator.core import classic as cl
from services.group_coordinator.runtime import GroupConfig, GroupCoordinatorRuntime
from tests.unit.test_group_runtime import LAYOUT, MemoryOffsetsStore

GROUP = "cg"
DELAY_MS = 50
PROTOCOLS = [cl.Protocol("range", b"meta")]


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def __call__(self) -> int:
        return self.now_ms


def runtime(store: MemoryOffsetsStore, clock: Clock) -> GroupCoordinatorRuntime:
    return GroupCoordinatorRuntime(
        layout=LAYOUT, node_id=0, store=store, now_ms=clock,
        config=GroupConfig(tail_wait_ms=10, session_check_interval_ms=5,
                           initial_rebalance_delay_ms=DELAY_MS),
    )


async def loaded(rt: GroupCoordinatorRuntime) -> GroupCoordinatorRuntime:
    await rt.start()
    await until(lambda: all(p.loaded for p in rt.partitions.values()), "loaded")
    return rt


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


def join(rt: GroupCoordinatorRuntime, member_id: str = "", *, instance_id: str = "",
         client_id: str = "c") -> Awaitable[cl.JoinReply]:
    return rt.join_group(
        group_id=GROUP, member_id=member_id, instance_id=instance_id, protocol_type="consumer",
        protocols=PROTOCOLS, session_timeout_ms=10_000, rebalance_timeout_ms=20_000,
        reason="", client_id=client_id, client_host="/127.0.0.1",
        require_known_member_id=False)


def sync(rt: GroupCoordinatorRuntime, member_id: str, generation_id: int,
         assignments: Sequence[tuple[str, bytes]] = ()) -> Awaitable[cl.SyncReply]:
    return rt.sync_group(group_id=GROUP, member_id=member_id, instance_id="",
                         generation_id=generation_id, protocol_type="consumer",
                         protocol_name="range", assignments=assignments)


def group_records(store: MemoryOffsetsStore) -> list[dict[str, Any] | None]:
    """The group's records in the log, decoded, in order."""
    out: list[dict[str, Any] | None] = []
    for batch in store.batches:
        if records.read_header(batch).is_control:
            continue
        for record in records.iter_records(batch):
            if record.key == b"G" + GROUP.encode():
                out.append(None if record.value is None else durable.decode(
                    record.value, expected_version=1))
    return out


async def two_members(rt: GroupCoordinatorRuntime, clock: Clock
                      ) -> tuple[cl.JoinReply, cl.JoinReply]:
    first = asyncio.ensure_future(join(rt, client_id="a"))
    await asyncio.sleep(0.02)
    second = asyncio.ensure_future(join(rt, client_id="b"))
    await asyncio.sleep(0.02)
    assert not first.done() and not second.done(), "parked during the initial delay"
    both = asyncio.gather(first, second)
    await passing_time(clock, both)
    a, b = await both
    return a, b


async def passing_time(clock: Clock, awaited: asyncio.Future[Any]) -> None:
    """Moves the clock a delay at a time until `awaited` is done (the
    initial rebalance is extended once per delay while members arrive)."""
    for _ in range(400):
        if awaited.done():
            return
        clock.now_ms += DELAY_MS
        await asyncio.sleep(0.01)
    raise AssertionError("never answered")


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def test_join_sync_persist_and_replay_after_a_restart() -> None:
    async def scenario() -> None:
        store, clock = MemoryOffsetsStore(), Clock()
        rt = await loaded(runtime(store, clock))
        a, b = await two_members(rt, clock)
        assert a.error is None and b.error is None and a.leader == b.leader == a.member_id
        assert [m.member_id for m in a.members] == [a.member_id, b.member_id]
        assert group_records(store) == [], "nothing is written before the assignment"
        follower = asyncio.ensure_future(sync(rt, b.member_id, b.generation_id))
        await asyncio.sleep(0.02)
        assert not follower.done(), "parked until the leader's assignment"
        leader = await sync(rt, a.member_id, a.generation_id,
                            [(a.member_id, b"for-a"), (b.member_id, b"for-b")])
        assert leader.assignment == b"for-a"
        assert (await asyncio.wait_for(follower, 5)).assignment == b"for-b"
        [record] = group_records(store)
        assert record is not None and record["type"] == "classic"
        assert record["generation"] == a.generation_id and record["leader"] == a.member_id
        await rt.stop()

        again = await loaded(runtime(store, clock))
        group, _epoch = again.describe_group(GROUP)
        assert isinstance(group, cl.ClassicGroup)
        assert group.state is cl.ClassicGroupState.STABLE
        assert (group.generation_id, group.leader_id) == (a.generation_id, a.member_id)
        assert {m: x.assignment for m, x in group.members.items()} == {
            a.member_id: b"for-a", b.member_id: b"for-b"}
        assert all(m.deadline_ms == clock.now_ms + 10_000 for m in group.members.values())
        beat = await again.classic_heartbeat(group_id=GROUP, member_id=b.member_id,
                                             instance_id="", generation_id=b.generation_id)
        assert beat.error is None
        assert (await sync(again, b.member_id, b.generation_id)).assignment == b"for-b"
        # The members' sessions run on the new coordinator: silent, both go,
        # and the emptied group is written.
        clock.now_ms += 20_000
        await until(lambda: not again.describe_group(GROUP)[0].members,  # type: ignore[union-attr]
                    "sessions expired")
        assert group_records(store)[-1]["members"] == []  # type: ignore[index]
        await again.stop()

    run(scenario)


def test_a_parked_join_is_answered_not_coordinator_when_the_coordinator_stops() -> None:
    async def scenario() -> None:
        store, clock = MemoryOffsetsStore(), Clock()
        rt = await loaded(runtime(store, clock))
        parked = asyncio.ensure_future(join(rt))
        await asyncio.sleep(0.02)
        assert not parked.done()
        await rt.stop()
        with pytest.raises(ServiceError) as info:
            await asyncio.wait_for(parked, 5)
        assert info.value.code is ErrorCode.NOT_COORDINATOR

    run(scenario)


def test_a_group_id_has_one_type_at_a_time() -> None:
    async def scenario() -> None:
        store, clock = MemoryOffsetsStore(), Clock()
        rt = await loaded(runtime(store, clock))
        await two_members(rt, clock)
        with pytest.raises(ServiceError) as info:
            await rt.heartbeat(group_id=GROUP, member_id="", member_epoch=0, instance_id="",
                               topics=["in"], session_timeout_ms=10_000, owned_partitions=[])
        assert info.value.code is ErrorCode.GROUP_ID_NOT_FOUND
        consumer = await rt.heartbeat(group_id="server", member_id="", member_epoch=0,
                                      instance_id="", topics=["in"],
                                      session_timeout_ms=10_000, owned_partitions=[])
        refused = await rt.join_group(
            group_id="server", member_id="", instance_id="", protocol_type="consumer",
            protocols=PROTOCOLS, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
            reason="", client_id="c", client_host="h", require_known_member_id=False)
        assert refused.error is not None
        assert refused.error.code is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        # Once the consumer group is empty, a classic member may take the id.
        await rt.heartbeat(group_id="server", member_id=consumer.member_id, member_epoch=-1,
                           instance_id="", topics=[], session_timeout_ms=10_000,
                           owned_partitions=[])
        taken = asyncio.ensure_future(rt.join_group(
            group_id="server", member_id="", instance_id="", protocol_type="consumer",
            protocols=PROTOCOLS, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
            reason="", client_id="c", client_host="h", require_known_member_id=False))
        await passing_time(clock, taken)
        assert (await taken).error is None
        await rt.stop()

    run(scenario)


def test_offset_commits_of_a_classic_group_are_checked_against_its_generation() -> None:
    async def scenario() -> None:
        store, clock = MemoryOffsetsStore(), Clock()
        rt = await loaded(runtime(store, clock))
        a, b = await two_members(rt, clock)

        async def commit(member_id: str, generation_id: int, offset: int) -> ErrorCode:
            try:
                await rt.commit_offsets(group_id=GROUP, member_id=member_id,
                                        generation_id=generation_id,
                                        partitions=[(("in", 0), offset, "")])
            except ServiceError as exc:
                return exc.code
            return ErrorCode.NONE

        assert await commit(a.member_id, a.generation_id, 1) is ErrorCode.REBALANCE_IN_PROGRESS
        await sync(rt, a.member_id, a.generation_id)
        assert await commit(a.member_id, a.generation_id + 1, 2) is ErrorCode.ILLEGAL_GENERATION
        assert await commit("nobody", a.generation_id, 3) is ErrorCode.UNKNOWN_MEMBER_ID
        assert await commit("", -1, 4) is ErrorCode.UNKNOWN_MEMBER_ID
        assert await commit(b.member_id, b.generation_id, 5) is ErrorCode.NONE
        assert [f.offset for f in rt.fetch_offsets(group_id=GROUP, partitions=[("in", 0)],
                                                   require_stable=True)] == [5]
        await rt.stop()

    run(scenario)


class SmallRecordStore(MemoryOffsetsStore):
    """Refuses a batch over a size whole, as the partition store does with
    MESSAGE_TOO_LARGE."""

    async def append(self, topic: str, partition: int,
                     entries: Sequence[tuple[bytes | None, bytes | None]], *,
                     expected_log_end_offset: int | None = None, now_ms: int | None = None,
                     producer: TxnWriter | None = None) -> int:
        if sum(len(v or b"") for _k, v in entries) > 2_000:
            raise ServiceError(ErrorCode.MESSAGE_TOO_LARGE, "batch over 2000 bytes")
        return await super().append(topic, partition, entries,
                                    expected_log_end_offset=expected_log_end_offset,
                                    now_ms=now_ms, producer=producer)


def test_an_assignment_too_large_to_store_is_refused_and_the_group_rebalances() -> None:
    async def scenario() -> None:
        store, clock = SmallRecordStore(), Clock()
        rt = await loaded(runtime(store, clock))
        a, b = await two_members(rt, clock)
        follower = asyncio.ensure_future(sync(rt, b.member_id, b.generation_id))
        await asyncio.sleep(0.02)
        with pytest.raises(ServiceError) as info:
            await sync(rt, a.member_id, a.generation_id, [(b.member_id, b"x" * 5_000)])
        assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE
        assert f"{GROUP!r}" in info.value.message
        answered = await asyncio.wait_for(follower, 5)
        assert answered.error is not None
        assert answered.error.code is ErrorCode.UNKNOWN_SERVER_ERROR
        group, _ = rt.describe_group(GROUP)
        assert isinstance(group, cl.ClassicGroup)
        assert group.state is cl.ClassicGroupState.PREPARING_REBALANCE
        assert group_records(store) == []
        await rt.stop()

    run(scenario)
