"""The group coordinator's runtime: owned `__consumer_offsets` partitions,
membership timers, offsets, transactional offsets.

The machinery it shares with the transaction coordinator — owning
partitions, loading them by replay, claiming the coordinator epoch, fencing,
conditional append then replay, catching up, reload after an uncertain write
— is services/common/shards/runtime.py; this module is what only groups
have.

Every change is a record appended to the group's `__consumer_offsets`
partition with a conditional append on the log end offset this process has
replayed up to; only after the append is durable is the record replayed into
memory and the answer sent. The transaction coordinator also writes to these
partitions (COMMIT/ABORT markers of transactions that committed offsets), so
a conditional append can fail because a marker moved the log end: the runtime
then catches up — reads what it has not replayed, markers included — and
tries again. If what it read contains a newer coordinator-epoch record,
another process has taken the partition over and this one is fenced.

A tail task per partition long-polls the store for markers, so pending
transactional offsets materialize (or vanish) soon after their transaction
ends, without waiting for the next write.

Classic groups (core/classic.py) add parked calls: a JoinGroup waits for
its rebalance's join phase, a follower's SyncGroup for the leader's. The
core says which member each parked call belongs to and, in a later step,
what to answer it; the futures live here, beside the partition, and are
answered only after the step's record (if any) is durable and its group
installed. A partition that stops being served answers its parked calls
NOT_COORDINATOR (the members find the coordinator again and rejoin).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from oncelog.wire import records
from oncelog.wire.errors import ErrorCode

from ..common.kernel.errors import ServiceError, check_id_length
from ..common.kernel.invariants import invariant
from ..common.metadata.cluster import CONSUMER_OFFSETS_TOPIC, ClusterLayout
from ..common.metadata.topic_counts import PartitionCounts
from ..common.rpc.store_client import RawRead, TxnWriter
from ..common.shards.runtime import (
    CoordinatorRuntime,
    LogBatch,
    LogEntry,
    LogRead,
    OwnedPartition,
    WriteRefused,
)
from .config import GroupConfig
from .core import classic as cl
from .core import groups as gr
from .core import offsets as offs
from .core.offsets import FetchedOffset
from .core.offsets_log import (
    BatchView,
    CommittedOffset,
    Entry,
    OffsetsPartitionState,
    encode_classic_group,
    encode_group,
    encode_offset,
)

log = logging.getLogger(__name__)

TP = tuple[str, int]
R = TypeVar("R")

# Store answers to a transactional offsets batch that refuse it for good:
# nothing was written, and retrying the same request cannot succeed.
_TXN_REFUSALS = {
    ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_TXN_STATE,
    ErrorCode.TRANSACTION_ABORTABLE, ErrorCode.INVALID_PRODUCER_ID_MAPPING,
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.INVALID_REQUEST,
    ErrorCode.INVALID_RECORD,
}


class OffsetsStore(Protocol):
    """What the runtime needs of the partition store (services.common.rpc.store_client)."""

    async def append(self, topic: str, partition: int,
                     entries: Sequence[tuple[bytes | None, bytes | None]], *,
                     expected_log_end_offset: int | None = None, now_ms: int | None = None,
                     producer: TxnWriter | None = None) -> int: ...

    async def read_batches(self, topic: str, partition: int, from_offset: int, *,
                           max_wait_ms: int = 0, max_bytes: int = 8 << 20) -> RawRead: ...

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]: ...


@dataclass
class GroupPartition(OwnedPartition[OffsetsPartitionState]):
    """An owned `__consumer_offsets` partition, with its members' session
    deadlines."""

    # (group id, member id) -> when its session ends (ms, this process's
    # clock; not persisted: a new owner gives every member a full session).
    deadlines: dict[tuple[str, str], int] = field(default_factory=dict)
    # Classic groups' parked JoinGroup / SyncGroup calls, by (group id,
    # member id); the core knows which members have one (awaiting_*).
    join_waiters: dict[tuple[str, str], asyncio.Future[cl.JoinReply]] = field(
        default_factory=dict)
    sync_waiters: dict[tuple[str, str], asyncio.Future[cl.SyncReply]] = field(
        default_factory=dict)


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    state: str
    # "consumer" for a server-assigned group; a classic group's members'.
    protocol_type: str
    # cl.CONSUMER or cl.CLASSIC (a group with committed offsets alone too).
    group_type: str


def _listing(group_id: str, group: cl.AnyGroup | None) -> GroupListing:
    if isinstance(group, cl.ClassicGroup):
        return GroupListing(group_id, group.state.value, group.protocol_type, cl.CLASSIC)
    if isinstance(group, gr.Group):
        return GroupListing(group_id, group.state.value, cl.CONSUMER_PROTOCOL_TYPE, cl.CONSUMER)
    # Offsets alone (assign() consumers, transactional sinks): Kafka's
    # "simple" group, a classic group without protocol, Empty.
    return GroupListing(group_id, gr.GroupState.EMPTY.value, "", cl.CLASSIC)


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: frozenset[TP]


class _OffsetsLog:
    """The shared runtime's log port over the partition store: batches, read
    with control batches (the transaction coordinators' markers), replayed
    whole."""

    def __init__(self, store: OffsetsStore, now_ms: Callable[[], int]) -> None:
        self._store = store
        self._now_ms = now_ms

    async def read(self, partition: int, from_offset: int, *,
                   max_wait_ms: int = 0) -> LogRead[BatchView]:
        read = await self._store.read_batches(CONSUMER_OFFSETS_TOPIC, partition, from_offset,
                                              max_wait_ms=max_wait_ms)
        return LogRead([_batch_view(raw) for raw in read.batches], read.next_offset,
                       read.high_watermark)

    async def append(self, partition: int, entries: Sequence[LogEntry], *,
                     expected_log_end_offset: int,
                     writer: TxnWriter | None) -> LogBatch[BatchView]:
        try:
            base = await self._store.append(
                CONSUMER_OFFSETS_TOPIC, partition, entries,
                expected_log_end_offset=expected_log_end_offset, now_ms=self._now_ms(),
                producer=writer,
            )
        except ServiceError as exc:
            if writer is not None and exc.code in _TXN_REFUSALS:
                raise WriteRefused(exc) from exc
            if exc.code is ErrorCode.MESSAGE_TOO_LARGE:
                # The store refused the batch whole and wrote nothing:
                # memory is still the log's state (no reload), and the
                # same request can never fit (not retriable). The caller
                # says which part of the request is too large.
                raise WriteRefused(ServiceError(
                    ErrorCode.MESSAGE_TOO_LARGE,
                    f"{len(entries)} record(s) do not fit one batch of "
                    f"{CONSUMER_OFFSETS_TOPIC}, nothing was written: {exc.message}",
                )) from exc
            raise
        return LogBatch(base + len(entries), [BatchView(
            base_offset=base, next_offset=base + len(entries),
            producer_id=writer.producer_id if writer else records.NO_PRODUCER_ID,
            producer_epoch=writer.producer_epoch if writer else records.NO_PRODUCER_EPOCH,
            last_sequence=(records.next_sequence(writer.base_sequence, len(entries) - 1)
                           if writer else records.NO_SEQUENCE),
            is_transactional=writer is not None, is_control=False,
            records=[(base + i, k, v) for i, (k, v) in enumerate(entries)],
        )])

    async def log_end_offset(self, partition: int) -> int:
        # Not asked today: the group coordinator answers from memory without
        # confirming ownership (as Kafka's does). The store's high watermark.
        read = await self._store.read_batches(CONSUMER_OFFSETS_TOPIC, partition, 0, max_bytes=1)
        return read.high_watermark


def _batch_view(raw: bytes) -> LogBatch[BatchView]:
    header = records.read_header(raw)
    control_type = -1
    rows: list[tuple[int, bytes | None, bytes | None]] = []
    if header.is_control:
        control_type, _coordinator_epoch = records.control_marker(raw)
    else:
        rows = [(r.offset, r.key, r.value) for r in records.iter_records(raw)]
    return LogBatch(header.next_offset, [BatchView(
        base_offset=header.base_offset, next_offset=header.next_offset,
        producer_id=header.producer_id, producer_epoch=header.producer_epoch,
        last_sequence=header.last_sequence, is_transactional=header.is_transactional,
        is_control=header.is_control, records=rows, control_type=control_type,
    )])


class GroupCoordinatorRuntime:
    def __init__(self, *, layout: ClusterLayout, node_id: int, store: OffsetsStore,
                 now_ms: Callable[[], int], config: GroupConfig,
                 on_rebalance: Callable[[str], None] | None = None,
                 follow_leaders: bool = False) -> None:
        """`follow_leaders`: this coordinator runs in a store's process and
        owns the partitions that store leads (its `follow`), not the
        layout's."""
        self._layout = layout
        self._node_id = node_id
        self._now_ms = now_ms
        self.config = config
        self._on_rebalance = on_rebalance or (lambda _group_id: None)
        self._runtime: CoordinatorRuntime[
            GroupPartition, OffsetsPartitionState, BatchView, TxnWriter,
        ] = CoordinatorRuntime(
            topic=CONSUMER_OFFSETS_TOPIC, node_id=node_id, kind="group coordinator",
            partitions=(p for p in range(layout.consumer_offsets_partitions)
                        if follow_leaders or layout.group_coordinator_for_partition(p) == node_id),
            log=_OffsetsLog(store, now_ms),
            new_partition=lambda p: GroupPartition(p, OffsetsPartitionState()),
            new_shard=OffsetsPartitionState, replay=OffsetsPartitionState.replay,
            # The transaction coordinators write markers here: a moved log end
            # is caught up, and a tail task per partition long-polls the store
            # for them.
            others_write=True, tail_wait_ms=config.tail_wait_ms,
            on_loaded=self._start_sessions, on_unloaded=self._drop_parked_calls,
            follow_leaders=follow_leaders,
        )
        self.partitions = self._runtime.partitions
        self.follow = self._runtime.follow
        self._counts = PartitionCounts(store, now_ms, config.metadata_max_age_ms)

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._runtime.start()
        self._runtime.spawn(
            self._every(self.config.session_check_interval_ms, self._expire_sessions))
        self._runtime.spawn(
            self._every(self.config.session_check_interval_ms, self._classic_timers))
        self._runtime.spawn(
            self._every(self.config.retention_check_interval_ms, self._apply_retention))

    async def stop(self) -> None:
        await self._runtime.stop()
        for owned in self.partitions.values():
            self._drop_parked_calls(owned)

    def _start_sessions(self, owned: GroupPartition) -> None:
        """A new owner gives every member a full session (deadlines are this
        process's clock, not persisted)."""
        now = self._now_ms()
        owned.deadlines = {
            (g.group_id, m.member_id): now + m.session_timeout_ms
            for g in owned.state.groups.values() if isinstance(g, gr.Group)
            for m in g.members.values()
        }
        for g in list(owned.state.groups.values()):
            if isinstance(g, cl.ClassicGroup):
                owned.state.install_classic(cl.start_sessions(g, now_ms=now), persisted=False)
        log.info("%s-%d: %d groups", CONSUMER_OFFSETS_TOPIC, owned.partition,
                 len(owned.state.known_groups()))

    def _drop_parked_calls(self, owned: GroupPartition) -> None:
        """The partition's memory is gone (a reload, a newer owner, a stop):
        parked classic calls cannot be answered from it."""
        waiters: list[asyncio.Future[Any]] = [*owned.join_waiters.values(),
                                              *owned.sync_waiters.values()]
        owned.join_waiters.clear()
        owned.sync_waiters.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(ServiceError(
                    ErrorCode.NOT_COORDINATOR,
                    f"{CONSUMER_OFFSETS_TOPIC}-{owned.partition} is no longer served by group "
                    f"coordinator {self._node_id}; find the coordinator and join again",
                ))

    # ------------------------------------------------------------- plumbing

    def owned_for(self, group_id: str) -> GroupPartition:
        if not group_id:
            raise ServiceError(ErrorCode.INVALID_GROUP_ID, "group_id must not be empty")
        # Every group request comes here first; the id is in every record of
        # the group (see limits.MAX_ID_LENGTH).
        check_id_length("group_id", group_id, ErrorCode.INVALID_GROUP_ID)
        return self._runtime.owned(self._layout.consumer_offsets_partition(group_id),
                                   f"group {group_id!r}")

    async def _persist(self, owned: GroupPartition, entries: Sequence[Entry], *,
                       writer: Callable[[OffsetsPartitionState], TxnWriter] | None = None
                       ) -> None:
        """Appends records and replays them (the shared runtime); the caller
        holds owned.lock. `writer` (transactional offsets) is built from the
        partition's state, again after a catch-up, since a marker read then
        may change the next sequence."""
        await self._runtime.append(owned, entries, writer=writer)

    async def _persist_group(self, owned: GroupPartition, before: gr.Group | None,
                             after: gr.Group) -> None:
        if after == before:
            return
        await self._persist(owned, [encode_group(after)])
        if before is None or after.epoch != before.epoch:
            self._on_rebalance(after.group_id)
        now = self._now_ms()
        for key in [k for k in owned.deadlines if k[0] == after.group_id
                    and k[1] not in after.members]:
            del owned.deadlines[key]
        for m in after.members.values():
            owned.deadlines.setdefault((after.group_id, m.member_id), now + m.session_timeout_ms)

    # ------------------------------------------------------------ membership

    async def heartbeat(self, *, group_id: str, member_id: str, member_epoch: int,
                        instance_id: str, topics: Sequence[str], session_timeout_ms: int,
                        owned_partitions: Sequence[TP]) -> HeartbeatAnswer:
        owned = self.owned_for(group_id)
        # Before anything is looked up or stored: these go into the group's
        # record (and the topic names into the partition-count cache).
        check_id_length("member_id", member_id)
        check_id_length("group_instance_id", instance_id)
        # An empty name is left alone: subscribing to a topic that does not
        # exist (yet) is allowed, as in Kafka.
        offs.check_topic_names("subscribed_topics", topics, ErrorCode.INVALID_TOPIC_EXCEPTION,
                               allow_empty=True)
        current = cl.consumer_group_or_none(owned.state.groups.get(group_id), group_id)
        wanted = set(topics) | (current.subscribed_topics if current else set())
        counts = await self._counts.get(wanted)
        async with owned.lock:
            self._runtime.check_loaded(owned)
            # An empty classic group becomes a server-assigned one here.
            before = cl.consumer_group_or_none(owned.state.groups.get(group_id), group_id)
            result = gr.plan_heartbeat(
                before, group_id=group_id, member_id=member_id, member_epoch=member_epoch,
                instance_id=instance_id, topics=topics, session_timeout_ms=session_timeout_ms,
                owned_partitions=owned_partitions, new_member_id=uuid.uuid4().hex,
                partition_counts=counts,
                min_session_timeout_ms=self.config.min_session_timeout_ms,
                max_session_timeout_ms=self.config.max_session_timeout_ms,
            )
            try:
                await self._persist_group(owned, before, result.group)
            except ServiceError as exc:
                if exc.code is not ErrorCode.MESSAGE_TOO_LARGE:
                    raise
                raise ServiceError(exc.code, (
                    f"group {group_id!r}: the group's state after this heartbeat "
                    f"({len(result.group.members)} member(s), "
                    f"{len(result.group.subscribed_topics)} subscribed topics) is too large "
                    f"to store: {exc.message}"
                )) from exc
            member = result.group.members.get(result.member_id)
            if member is None:  # it left
                return HeartbeatAnswer(result.member_id, gr.LEAVE_EPOCH, 0, frozenset())
            if not member.left_temporarily:
                owned.deadlines[(group_id, member.member_id)] = (
                    self._now_ms() + member.session_timeout_ms)
            return HeartbeatAnswer(member.member_id, member.member_epoch,
                                   offs.heartbeat_interval_ms(
                                       member.session_timeout_ms,
                                       max_interval_ms=self.config.max_heartbeat_interval_ms),
                                   member.assignment)

    async def _expire_sessions(self) -> None:
        now = self._now_ms()
        for owned in self._runtime.serving():
            expired: dict[str, list[str]] = {}
            for (group_id, member_id), deadline in owned.deadlines.items():
                if deadline <= now:
                    expired.setdefault(group_id, []).append(member_id)
            for group_id, member_ids in expired.items():
                group = owned.state.groups.get(group_id)
                if not isinstance(group, gr.Group):
                    continue
                counts = await self._counts.get(group.subscribed_topics)
                async with owned.lock:
                    if not owned.loaded:
                        break
                    before = owned.state.groups.get(group_id)
                    if not isinstance(before, gr.Group):
                        continue
                    # Re-check under the lock: a heartbeat may have just arrived.
                    still = [m for m in member_ids
                             if owned.deadlines.get((group_id, m), now + 1) <= now]
                    after = gr.plan_remove_members(before, still, counts)
                    if still:
                        log.info("group %r: session of %s timed out; removed", group_id, still)
                    await self._persist_group(owned, before, after)

    async def _every(self, interval_ms: int,
                     step: Callable[[], Coroutine[Any, Any, None]]) -> None:
        while not self._runtime.stopping:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await step()
            except ServiceError as exc:
                log.info("%s: %s", step.__name__, exc)

    # ------------------------------------------------------- classic groups

    async def join_group(self, *, group_id: str, member_id: str, instance_id: str,
                         protocol_type: str, protocols: Sequence[cl.Protocol],
                         session_timeout_ms: int, rebalance_timeout_ms: int, reason: str,
                         client_id: str, client_host: str,
                         require_known_member_id: bool) -> cl.JoinReply:
        """JoinGroup of the classic protocol: a long poll, answered when the
        join phase the member takes part in completes (or at once)."""
        owned = self.owned_for(group_id)
        check_id_length("member_id", member_id)
        check_id_length("group_instance_id", instance_id)
        _check_protocols(protocol_type, protocols)
        async with owned.lock:
            self._runtime.check_loaded(owned)
            before = owned.state.groups.get(group_id)
            outcome = cl.plan_join(
                before, group_id=group_id, member_id=member_id, instance_id=instance_id,
                protocol_type=protocol_type, protocols=protocols,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms, client_id=client_id,
                client_host=client_host, require_known_member_id=require_known_member_id,
                new_member_suffix=str(uuid.uuid4()), now_ms=self._now_ms(),
                config=self.config.classic,
            )
            if outcome.reply is None or outcome.reply.error is None:
                log.debug("group %r: member %r joins (%s)", group_id,
                          outcome.member_id or member_id, reason or "no reason given")
            await self._apply_classic(owned, group_id, before, outcome)
            waiter = _park(owned.join_waiters, group_id, outcome, cl.JoinReply(
                member_id=outcome.member_id, error=_superseded(group_id, outcome.member_id,
                                                               "JoinGroup")))
        if waiter is None:
            invariant(outcome.reply is not None, "a JoinGroup neither answered nor parked")
            return outcome.reply  # type: ignore[return-value]
        return await _wait(owned.join_waiters, (group_id, outcome.member_id), waiter)

    async def sync_group(self, *, group_id: str, member_id: str, instance_id: str,
                         generation_id: int, protocol_type: str, protocol_name: str,
                         assignments: Sequence[tuple[str, bytes]]) -> cl.SyncReply:
        """SyncGroup: the leader's stores the assignment and answers every
        member's; a follower's waits for it (a long poll)."""
        owned = self.owned_for(group_id)
        check_id_length("member_id", member_id)
        check_id_length("group_instance_id", instance_id)
        for assigned, _ in assignments:
            check_id_length("assignments[].member_id", assigned)
        async with owned.lock:
            self._runtime.check_loaded(owned)
            before = owned.state.groups.get(group_id)
            outcome = cl.plan_sync(
                before, group_id=group_id, member_id=member_id, instance_id=instance_id,
                generation_id=generation_id, protocol_type=protocol_type,
                protocol_name=protocol_name, assignments=assignments, now_ms=self._now_ms(),
                config=self.config.classic,
            )
            try:
                await self._apply_classic(owned, group_id, before, outcome)
            except ServiceError as exc:
                if (outcome.persist and isinstance(before, cl.ClassicGroup)
                        and owned.loaded and not owned.fenced):
                    # Memory is still the log's (the store refused the
                    # write whole): the other members learn it too, and
                    # the group rebalances.
                    await self._apply_classic(owned, group_id, before, cl.plan_sync_write_failed(
                        before, exc, now_ms=self._now_ms(), config=self.config.classic))
                raise
            waiter = _park(owned.sync_waiters, group_id, outcome, cl.SyncReply(
                error=_superseded(group_id, outcome.member_id, "SyncGroup")))
        if waiter is None:
            invariant(outcome.reply is not None, "a SyncGroup neither answered nor parked")
            return outcome.reply  # type: ignore[return-value]
        return await _wait(owned.sync_waiters, (group_id, outcome.member_id), waiter)

    async def classic_heartbeat(self, *, group_id: str, member_id: str, instance_id: str,
                                generation_id: int) -> cl.HeartbeatReply:
        owned = self.owned_for(group_id)
        check_id_length("member_id", member_id)
        check_id_length("group_instance_id", instance_id)
        async with owned.lock:
            self._runtime.check_loaded(owned)
            before = owned.state.groups.get(group_id)
            outcome = cl.plan_heartbeat(before, group_id=group_id, member_id=member_id,
                                        instance_id=instance_id, generation_id=generation_id,
                                        now_ms=self._now_ms(), config=self.config.classic)
            await self._apply_classic(owned, group_id, before, outcome)
        invariant(outcome.reply is not None, "a heartbeat is always answered")
        return outcome.reply  # type: ignore[return-value]

    async def leave_group(self, *, group_id: str,
                          members: Sequence[cl.LeavingMember]) -> tuple[cl.LeaveResult, ...]:
        owned = self.owned_for(group_id)
        for leaving in members:
            check_id_length("members[].member_id", leaving.member_id)
            check_id_length("members[].group_instance_id", leaving.instance_id)
        async with owned.lock:
            self._runtime.check_loaded(owned)
            before = owned.state.groups.get(group_id)
            outcome = cl.plan_leave(before, group_id=group_id, members=members,
                                    now_ms=self._now_ms(), config=self.config.classic)
            for leaving, result in zip(members, outcome.reply or (), strict=True):
                if result.error is None:
                    log.debug("group %r: member %r (instance %r) leaves (%s)", group_id,
                              leaving.member_id, leaving.instance_id,
                              leaving.reason or "no reason given")
            await self._apply_classic(owned, group_id, before, outcome)
        invariant(outcome.reply is not None, "a LeaveGroup is always answered")
        return outcome.reply  # type: ignore[return-value]

    async def _apply_classic(self, owned: GroupPartition, group_id: str,
                             before: cl.AnyGroup | None, outcome: cl.Outcome[Any]) -> None:
        """Persist (if the step wrote its record), install, answer parked
        calls: in that order, so no answer reports what is not durable. The
        caller holds owned.lock."""
        after = outcome.group
        if after is None:
            invariant(not outcome.join_replies and not outcome.sync_replies,
                      lambda: f"group {group_id!r}: parked calls answered by a step that "
                              "changed nothing")
            return
        if outcome.persist:
            try:
                await self._persist(owned, [encode_classic_group(after)])
            except ServiceError as exc:
                if exc.code is not ErrorCode.MESSAGE_TOO_LARGE:
                    raise
                raise ServiceError(exc.code, (
                    f"group {group_id!r}: the group's record ({len(after.members)} member(s) "
                    f"with their metadata and assignments, "
                    f"{sum(len(m.assignment) for m in after.members.values())} bytes of "
                    f"assignments) is too large to store: {exc.message}"
                )) from exc
        owned.state.install_classic(after, persisted=outcome.persist)
        if after.generation_id != (before.generation_id if isinstance(before, cl.ClassicGroup)
                                   else 0):
            self._on_rebalance(group_id)
        for member_id, join_reply in outcome.join_replies.items():
            _answer(owned.join_waiters.pop((group_id, member_id), None), join_reply)
        for member_id, sync_reply in outcome.sync_replies.items():
            _answer(owned.sync_waiters.pop((group_id, member_id), None), sync_reply)

    async def _classic_timers(self) -> None:
        """Acts on classic groups' deadlines (join phases, SyncGroup waits,
        sessions), and answers the parked calls of partitions no longer
        served."""
        now = self._now_ms()
        for owned in list(self.partitions.values()):
            if not owned.loaded or owned.fenced:
                if owned.join_waiters or owned.sync_waiters:
                    self._drop_parked_calls(owned)
                continue
            due = [group_id for group_id, g in owned.state.groups.items()
                   if isinstance(g, cl.ClassicGroup)
                   and (deadline := g.next_deadline_ms()) is not None and deadline <= now]
            for group_id in due:
                async with owned.lock:
                    if not owned.loaded or owned.fenced:
                        break
                    group = owned.state.groups.get(group_id)
                    if not isinstance(group, cl.ClassicGroup):
                        continue
                    outcome = cl.plan_tick(group, now_ms=self._now_ms(),
                                           config=self.config.classic)
                    await self._apply_classic(owned, group_id, group, outcome)

    # --------------------------------------------------------------- offsets

    async def _validate_offsets(self, group_id: str,
                                partitions: Sequence[tuple[TP, int, str]]) -> None:
        """Bad input fails the whole request, naming what was wrong."""
        seen = offs.check_offsets(group_id, partitions,
                                  max_metadata_bytes=self.config.max_offset_metadata_bytes)
        offs.check_known(group_id, seen, await self._counts.get(tp[0] for tp in seen))

    async def commit_offsets(self, *, group_id: str, member_id: str, generation_id: int,
                             partitions: Sequence[tuple[TP, int, str]],
                             instance_id: str = "") -> None:
        await self._commit(group_id=group_id, member_id=member_id, instance_id=instance_id,
                           generation_id=generation_id, partitions=partitions, txn=None)

    async def txn_commit_offsets(self, *, transactional_id: str, group_id: str,
                                 producer_id: int, producer_epoch: int, member_id: str,
                                 generation_id: int,
                                 partitions: Sequence[tuple[TP, int, str]],
                                 instance_id: str = "") -> None:
        if not transactional_id:
            raise ServiceError(ErrorCode.INVALID_REQUEST,
                               "TxnOffsetCommit needs a transactional_id")
        check_id_length("transactional_id", transactional_id)
        if producer_id < 0:
            raise ServiceError(ErrorCode.INVALID_REQUEST,
                               f"TxnOffsetCommit producer_id is {producer_id}; it must be >= 0")
        if not 0 <= producer_epoch <= records.MAX_PRODUCER_EPOCH:
            # Checked here: the offsets go into a batch whose header holds
            # the epoch as an int16.
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"TxnOffsetCommit producer_epoch is {producer_epoch}; it must be "
                f"0..{records.MAX_PRODUCER_EPOCH}",
            )
        await self._commit(group_id=group_id, member_id=member_id, instance_id=instance_id,
                           generation_id=generation_id, partitions=partitions,
                           txn=(transactional_id, producer_id, producer_epoch))

    async def _commit(self, *, group_id: str, member_id: str, instance_id: str,
                      generation_id: int, partitions: Sequence[tuple[TP, int, str]],
                      txn: tuple[str, int, int] | None) -> None:
        """OffsetCommit, or TxnOffsetCommit when `txn` = (transactional id,
        producer id, epoch): the offsets then go in a transactional batch of
        that producer and stay pending until its marker. Who may commit
        depends on the group's type (offsets belong to the group id either
        way)."""
        owned = self.owned_for(group_id)
        check_id_length("member_id", member_id)
        check_id_length("group_instance_id", instance_id)
        await self._validate_offsets(group_id, partitions)
        async with owned.lock:
            self._runtime.check_loaded(owned)
            group = owned.state.groups.get(group_id)
            if isinstance(group, cl.ClassicGroup):
                cl.check_offset_commit(group, member_id=member_id, instance_id=instance_id,
                                       generation_id=generation_id,
                                       transactional=txn is not None)
            else:
                offs.raise_first_refusal(gr.check_commit_member(
                    group, group_id=group_id, member_id=member_id,
                    generation_id=generation_id, partitions=[tp for tp, _, _ in partitions],
                ))
            writer = None
            if txn is not None:
                transactional_id, producer_id, producer_epoch = txn

                def writer(state: OffsetsPartitionState) -> TxnWriter:
                    return TxnWriter(
                        transactional_id=transactional_id, producer_id=producer_id,
                        producer_epoch=producer_epoch,
                        base_sequence=state.next_sequence_for(producer_id, producer_epoch),
                        # The group's __consumer_offsets partition joins the
                        # transaction with this write, as a producer's data
                        # partitions join with theirs: the client sends no
                        # AddOffsetsToTxn (Kafka's transaction version 2).
                        add_partitions_to_txn=True,
                    )
            now = self._now_ms()
            try:
                await self._persist(owned, [encode_offset(group_id, tp, offset, metadata, now)
                                            for tp, offset, metadata in partitions],
                                    writer=writer)
            except ServiceError as exc:
                if exc.code is not ErrorCode.MESSAGE_TOO_LARGE:
                    raise
                # Kafka's code for exactly this (the commit does not fit the log).
                raise ServiceError(ErrorCode.INVALID_COMMIT_OFFSET_SIZE, (
                    f"group {group_id!r}: the commit of {len(partitions)} partitions' offsets "
                    "with their metadata is too large to store; commit fewer partitions at "
                    f"a time or shorter metadata: {exc.message}"
                )) from exc

    def fetch_offsets(self, *, group_id: str, partitions: Sequence[TP],
                      require_stable: bool) -> list[FetchedOffset]:
        return offs.fetch_offsets(self.owned_for(group_id).state, group_id=group_id,
                                  partitions=partitions, require_stable=require_stable)

    # ----------------------------------------------------------------- admin

    def list_groups(self) -> list[GroupListing]:
        out = []
        for owned in self._runtime.serving_whole("ListGroups"):
            for group_id in sorted(owned.state.known_groups()):
                out.append(_listing(group_id, owned.state.groups.get(group_id)))
        return out

    def describe_group(self, group_id: str) -> tuple[cl.AnyGroup | None, int]:
        """The group (None: it has committed offsets only) and the
        coordinator epoch; GROUP_ID_NOT_FOUND for a group with neither."""
        owned = self.owned_for(group_id)
        group = owned.state.groups.get(group_id)
        if group is None and group_id not in owned.state.known_groups():
            raise ServiceError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id!r} does not exist")
        return group, owned.state.coordinator_epoch

    async def delete_group(self, group_id: str) -> None:
        owned = self.owned_for(group_id)
        async with owned.lock:
            self._runtime.check_loaded(owned)
            await self._persist(owned, offs.plan_delete_group(owned.state, group_id))

    async def _apply_retention(self) -> None:
        """Removes offsets of deleted topics and expired empty groups."""
        now = self._now_ms()
        for owned in self._runtime.serving():
            topics = {tp[0] for offs in owned.state.offsets.values() for tp in offs}
            counts = await self._counts.get(topics)
            async with owned.lock:
                if not owned.loaded:
                    continue
                entries, expired = offs.plan_retention(
                    owned.state, now_ms=now, counts=counts,
                    retention_ms=self.config.offsets_retention_ms)
                for group_id, idle_ms in expired:
                    log.info("group %r expired (empty, no commit for %d ms)", group_id, idle_ms)
                if entries:
                    await self._persist(owned, entries)

    # --------------------------------------------------------------- metrics

    def snapshot(self) -> list[tuple[cl.AnyGroup | None, str, dict[TP, CommittedOffset], int]]:
        """(group, group id, committed offsets, pending count) per known group."""
        out = []
        for owned in self._runtime.serving():
            for group_id in owned.state.known_groups():
                pending = sum(len(by_group.get(group_id, {}))
                              for by_group in owned.state.pending.values())
                out.append((owned.state.groups.get(group_id), group_id,
                            dict(owned.state.offsets.get(group_id, {})), pending))
        return out


def _check_protocols(protocol_type: str, protocols: Sequence[cl.Protocol]) -> None:
    """Names the group's record and its errors carry: bounded like ids.
    (Whether the member's protocols suit the group is the core's answer.)"""
    check_id_length("protocol_type", protocol_type)
    for protocol in protocols:
        check_id_length("protocols[].name", protocol.name)


def _superseded(group_id: str, member_id: str, call: str) -> ServiceError:
    return ServiceError(
        ErrorCode.REBALANCE_IN_PROGRESS,
        f"group {group_id!r}: a newer {call} of member {member_id!r} took this one's place",
    )


def _park(waiters: dict[tuple[str, str], asyncio.Future[R]], group_id: str,
          outcome: cl.Outcome[R], superseded: R) -> asyncio.Future[R] | None:
    """The caller's parked call, if the step parked it. A member has one
    parked call of a kind at a time: an older one (its client gave up on
    it) is answered `superseded`."""
    key = (group_id, outcome.member_id)
    if outcome.member_id:
        _answer(waiters.pop(key, None), superseded)
    if outcome.reply is not None:
        return None
    waiter: asyncio.Future[R] = asyncio.get_running_loop().create_future()
    waiters[key] = waiter
    return waiter


async def _wait(waiters: dict[tuple[str, str], asyncio.Future[R]], key: tuple[str, str],
                waiter: asyncio.Future[R]) -> R:
    try:
        return await waiter
    finally:
        # A caller that went away (deadline, cancel) leaves no waiter
        # behind; the core still counts its member as waiting, as Kafka's
        # does for a client that disconnected.
        if waiters.get(key) is waiter:
            del waiters[key]


def _answer(waiter: asyncio.Future[R] | None, reply: R) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(reply)
