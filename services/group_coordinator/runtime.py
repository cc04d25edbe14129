"""The group coordinator's runtime: owned `__consumer_offsets` partitions,
membership timers, offsets, transactional offsets.

The machinery it shares with the transaction coordinator — owning
partitions, loading them by replay, claiming the coordinator epoch, fencing,
conditional append then replay, catching up, reload after an uncertain write
— is services/common/coordinator_runtime.py; this module is what only groups
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
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from oncelog.wire import records
from oncelog.wire.errors import ErrorCode

from ..common.cluster import CONSUMER_OFFSETS_TOPIC, ClusterLayout
from ..common.coordinator_runtime import (
    CoordinatorRuntime,
    LogBatch,
    LogEntry,
    LogRead,
    OwnedPartition,
    WriteRefused,
)
from ..common.service_error import ServiceError, check_id_length
from ..common.store_client import RawRead, TxnWriter
from ..common.topic_counts import PartitionCounts
from .core import groups as gr
from .core import offsets as offs
from .core.offsets import FetchedOffset
from .core.offsets_log import (
    BatchView,
    CommittedOffset,
    Entry,
    OffsetsPartitionState,
    encode_group,
    encode_offset,
)

log = logging.getLogger(__name__)

TP = tuple[str, int]

# Store answers to a transactional offsets batch that refuse it for good:
# nothing was written, and retrying the same request cannot succeed.
_TXN_REFUSALS = {
    ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_TXN_STATE,
    ErrorCode.TRANSACTION_ABORTABLE, ErrorCode.INVALID_PRODUCER_ID_MAPPING,
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.INVALID_REQUEST,
    ErrorCode.INVALID_RECORD,
}


class OffsetsStore(Protocol):
    """What the runtime needs of the partition store (services.common.store_client)."""

    async def append(self, topic: str, partition: int,
                     entries: Sequence[tuple[bytes | None, bytes | None]], *,
                     expected_log_end_offset: int | None = None, now_ms: int | None = None,
                     producer: TxnWriter | None = None) -> int: ...

    async def read_batches(self, topic: str, partition: int, from_offset: int, *,
                           max_wait_ms: int = 0, max_bytes: int = 8 << 20) -> RawRead: ...

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfig:
    min_session_timeout_ms: int = 1000
    max_session_timeout_ms: int = 300_000
    # The heartbeat interval handed to members: a third of their session
    # timeout, at most this.
    max_heartbeat_interval_ms: int = 3000
    # An empty group with no commit for this long is removed (Kafka: 7 days).
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    retention_check_interval_ms: int = 60_000
    session_check_interval_ms: int = 200
    # Partition counts of subscribed topics are re-read at most this often.
    metadata_max_age_ms: int = 2000
    max_offset_metadata_bytes: int = 4096
    tail_wait_ms: int = 1000


@dataclass
class GroupPartition(OwnedPartition[OffsetsPartitionState]):
    """An owned `__consumer_offsets` partition, with its members' session
    deadlines."""

    # (group id, member id) -> when its session ends (ms, this process's
    # clock; not persisted: a new owner gives every member a full session).
    deadlines: dict[tuple[str, str], int] = field(default_factory=dict)


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
                 on_rebalance: Callable[[str], None] | None = None) -> None:
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
                        if layout.group_coordinator_for_partition(p) == node_id),
            log=_OffsetsLog(store, now_ms),
            new_partition=lambda p: GroupPartition(p, OffsetsPartitionState()),
            new_shard=OffsetsPartitionState, replay=OffsetsPartitionState.replay,
            # The transaction coordinators write markers here: a moved log end
            # is caught up, and a tail task per partition long-polls the store
            # for them.
            others_write=True, tail_wait_ms=config.tail_wait_ms,
            on_loaded=self._start_sessions,
        )
        self.partitions = self._runtime.partitions
        self._counts = PartitionCounts(store, now_ms, config.metadata_max_age_ms)

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._runtime.start()
        self._runtime.spawn(
            self._every(self.config.session_check_interval_ms, self._expire_sessions))
        self._runtime.spawn(
            self._every(self.config.retention_check_interval_ms, self._apply_retention))

    async def stop(self) -> None:
        await self._runtime.stop()

    def _start_sessions(self, owned: GroupPartition) -> None:
        """A new owner gives every member a full session (deadlines are this
        process's clock, not persisted)."""
        now = self._now_ms()
        owned.deadlines = {
            (g.group_id, m.member_id): now + m.session_timeout_ms
            for g in owned.state.groups.values() for m in g.members.values()
        }
        log.info("%s-%d: %d groups", CONSUMER_OFFSETS_TOPIC, owned.partition,
                 len(owned.state.known_groups()))

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
        current = owned.state.groups.get(group_id)
        wanted = set(topics) | (current.subscribed_topics if current else set())
        counts = await self._counts.get(wanted)
        async with owned.lock:
            self._runtime.check_loaded(owned)
            before = owned.state.groups.get(group_id)
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
                if group is None:
                    continue
                counts = await self._counts.get(group.subscribed_topics)
                async with owned.lock:
                    if not owned.loaded:
                        break
                    before = owned.state.groups.get(group_id)
                    if before is None:
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

    # --------------------------------------------------------------- offsets

    async def _validate_offsets(self, group_id: str,
                                partitions: Sequence[tuple[TP, int, str]]) -> None:
        """Bad input fails the whole request, naming what was wrong."""
        seen = offs.check_offsets(group_id, partitions,
                                  max_metadata_bytes=self.config.max_offset_metadata_bytes)
        offs.check_known(group_id, seen, await self._counts.get(tp[0] for tp in seen))

    async def commit_offsets(self, *, group_id: str, member_id: str, generation_id: int,
                             partitions: Sequence[tuple[TP, int, str]]) -> None:
        await self._commit(group_id=group_id, member_id=member_id,
                           generation_id=generation_id, partitions=partitions, txn=None)

    async def txn_commit_offsets(self, *, transactional_id: str, group_id: str,
                                 producer_id: int, producer_epoch: int, member_id: str,
                                 generation_id: int,
                                 partitions: Sequence[tuple[TP, int, str]]) -> None:
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
        await self._commit(group_id=group_id, member_id=member_id,
                           generation_id=generation_id, partitions=partitions,
                           txn=(transactional_id, producer_id, producer_epoch))

    async def _commit(self, *, group_id: str, member_id: str, generation_id: int,
                      partitions: Sequence[tuple[TP, int, str]],
                      txn: tuple[str, int, int] | None) -> None:
        """OffsetCommit, or TxnOffsetCommit when `txn` = (transactional id,
        producer id, epoch): the offsets then go in a transactional batch of
        that producer and stay pending until its marker."""
        owned = self.owned_for(group_id)
        check_id_length("member_id", member_id)
        await self._validate_offsets(group_id, partitions)
        async with owned.lock:
            self._runtime.check_loaded(owned)
            offs.raise_first_refusal(gr.check_commit_member(
                owned.state.groups.get(group_id), group_id=group_id, member_id=member_id,
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

    def list_groups(self) -> list[tuple[str, str]]:
        out = []
        for owned in self._runtime.serving():
            for group_id in sorted(owned.state.known_groups()):
                group = owned.state.groups.get(group_id)
                out.append((group_id, (group.state if group else gr.GroupState.EMPTY).value))
        return out

    def describe_group(self, group_id: str) -> tuple[gr.Group, int]:
        owned = self.owned_for(group_id)
        group = owned.state.groups.get(group_id)
        if group is None and group_id not in owned.state.known_groups():
            raise ServiceError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id!r} does not exist")
        return group or gr.empty_group(group_id), owned.state.coordinator_epoch

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

    def snapshot(self) -> list[tuple[gr.Group | None, str, dict[TP, CommittedOffset], int]]:
        """(group, group id, committed offsets, pending count) per known group."""
        out = []
        for owned in self._runtime.serving():
            for group_id in owned.state.known_groups():
                pending = sum(len(by_group.get(group_id, {}))
                              for by_group in owned.state.pending.values())
                out.append((owned.state.groups.get(group_id), group_id,
                            dict(owned.state.offsets.get(group_id, {})), pending))
        return out
