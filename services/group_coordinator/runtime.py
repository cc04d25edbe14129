"""The group coordinator's runtime: owned `__consumer_offsets` partitions,
membership timers, offsets, transactional offsets.

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
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from oncelog import records
from oncelog.errors import ErrorCode
from services.common import limits
from services.common.cluster import CONSUMER_OFFSETS_TOPIC, ClusterLayout
from services.common.coordinator_epoch import encode_epoch
from services.common.service_error import ServiceError, check_id_length
from services.common.store_client import RawRead, TxnWriter
from services.common.tasks import TaskGroup
from services.common.topic_counts import PartitionCounts
from services.group_coordinator.core import groups as gr
from services.group_coordinator.core.offsets_log import (
    BatchView,
    CommittedOffset,
    Entry,
    OffsetsPartitionState,
    encode_group,
    encode_group_tombstone,
    encode_offset,
    encode_offset_tombstone,
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
class OwnedPartition:
    partition: int
    state: OffsetsPartitionState = field(default_factory=OffsetsPartitionState)
    log_end_offset: int = 0
    loaded: bool = False
    fenced: bool = False
    my_epoch: int = -1
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # (group id, member id) -> when its session ends (ms, this process's
    # clock; not persisted: a new owner gives every member a full session).
    deadlines: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: frozenset[TP]


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    tp: TP
    offset: int
    metadata: str
    error: ServiceError | None = None


def _check_topic_names(where: str, topics: Iterable[str], code: ErrorCode, *,
                       allow_empty: bool = False) -> None:
    """Refuses a topic name longer than any topic's may be (no topic has it;
    it would be stored in the group's records, and an error naming it whole
    would not fit in a gRPC status), and, unless allowed, an empty one."""
    for topic in topics:
        if not topic and not allow_empty:
            raise ServiceError(code, f"{where} names a topic with an empty name")
        if len(topic) > limits.MAX_TOPIC_NAME_LENGTH:
            raise ServiceError(
                code,
                f"{where} names topic {topic[:32]!r}..., {len(topic)} characters long, over "
                f"the limit of {limits.MAX_TOPIC_NAME_LENGTH}",
            )


class GroupCoordinatorRuntime:
    def __init__(self, *, layout: ClusterLayout, node_id: int, store: OffsetsStore,
                 now_ms: Callable[[], int], config: GroupConfig,
                 on_rebalance: Callable[[str], None] | None = None) -> None:
        self._layout = layout
        self._node_id = node_id
        self._store = store
        self._now_ms = now_ms
        self.config = config
        self._on_rebalance = on_rebalance or (lambda _group_id: None)
        self.partitions = {
            p: OwnedPartition(p)
            for p in range(layout.consumer_offsets_partitions)
            if layout.group_coordinator_for_partition(p) == node_id
        }
        self._tasks = TaskGroup()
        self._stopping = False
        self._counts = PartitionCounts(store, now_ms, config.metadata_max_age_ms)

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        for owned in self.partitions.values():
            self._spawn(self._load_until_done(owned))
        self._spawn(self._every(self.config.session_check_interval_ms, self._expire_sessions))
        self._spawn(self._every(self.config.retention_check_interval_ms, self._apply_retention))

    async def stop(self) -> None:
        self._stopping = True
        await self._tasks.stop()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coro)

    async def _load_until_done(self, owned: OwnedPartition) -> None:
        backoff_s = 0.05
        while not self._stopping and not owned.loaded and not owned.fenced:
            try:
                async with owned.lock:
                    await self._load(owned)
            except ServiceError as exc:
                log.info("loading %s-%d: %s; retrying", CONSUMER_OFFSETS_TOPIC,
                         owned.partition, exc)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 1.0)
        if owned.loaded and not self._stopping:
            self._spawn(self._tail(owned))

    async def _load(self, owned: OwnedPartition) -> None:
        """Replays the partition from the start, then claims it with a higher
        coordinator epoch (a reload after an uncertain write keeps the epoch
        this process claimed, unless a newer owner exists: then it is fenced)."""
        owned.state = OffsetsPartitionState()
        owned.log_end_offset = 0
        await self._catch_up(owned, until_high_watermark=True)
        if owned.my_epoch >= 0:
            if owned.state.coordinator_epoch != owned.my_epoch:
                self._fence(owned)
                return
        else:
            record = encode_epoch(owned.state.coordinator_epoch + 1, self._node_id)
            try:
                base = await self._store.append(
                    CONSUMER_OFFSETS_TOPIC, owned.partition, [record],
                    expected_log_end_offset=owned.log_end_offset,
                )
            except ServiceError as exc:
                if exc.code is ErrorCode.LOG_END_OFFSET_MISMATCH:
                    raise ServiceError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                       "the log moved while loading") from exc
                raise
            self._replay_own(owned, base, [record], None)
            owned.my_epoch = owned.state.coordinator_epoch
        now = self._now_ms()
        owned.deadlines = {
            (g.group_id, m.member_id): now + m.session_timeout_ms
            for g in owned.state.groups.values() for m in g.members.values()
        }
        owned.loaded = True
        log.info("loaded %s-%d: coordinator epoch %d, %d groups", CONSUMER_OFFSETS_TOPIC,
                 owned.partition, owned.my_epoch, len(owned.state.known_groups()))

    def _fence(self, owned: OwnedPartition) -> None:
        log.warning("%s-%d: coordinator epoch %d superseded by %d; this coordinator is fenced",
                    CONSUMER_OFFSETS_TOPIC, owned.partition, owned.my_epoch,
                    owned.state.coordinator_epoch)
        owned.fenced = True
        owned.loaded = False

    def _unload(self, owned: OwnedPartition) -> None:
        owned.loaded = False
        self._spawn(self._load_until_done(owned))

    # ------------------------------------------------------------ log access

    def _apply_read(self, owned: OwnedPartition, read: RawRead) -> None:
        """Replays fetched batches not yet replayed, in order."""
        for raw in read.batches:
            header = records.read_header(raw)
            if header.next_offset <= owned.log_end_offset:
                continue  # ours, or already replayed
            control_type = -1
            rows: list[tuple[int, bytes | None, bytes | None]] = []
            if header.is_control:
                control_type, _coordinator_epoch = records.control_marker(raw)
            else:
                rows = [(r.offset, r.key, r.value) for r in records.iter_records(raw)]
            owned.state.replay(BatchView(
                base_offset=header.base_offset, next_offset=header.next_offset,
                producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                last_sequence=header.last_sequence, is_transactional=header.is_transactional,
                is_control=header.is_control, records=rows, control_type=control_type,
            ))
            owned.log_end_offset = header.next_offset
        owned.log_end_offset = max(owned.log_end_offset, read.next_offset)

    async def _catch_up(self, owned: OwnedPartition, *, until_high_watermark: bool) -> None:
        """Reads and replays from where memory ends up to the high watermark."""
        while True:
            read = await self._store.read_batches(
                CONSUMER_OFFSETS_TOPIC, owned.partition, owned.log_end_offset
            )
            before = owned.log_end_offset
            self._apply_read(owned, read)
            if (not until_high_watermark or owned.log_end_offset >= read.high_watermark
                    or owned.log_end_offset == before):
                return

    def _replay_own(self, owned: OwnedPartition, base_offset: int, entries: Sequence[Entry],
                    producer: TxnWriter | None) -> None:
        owned.state.replay(BatchView(
            base_offset=base_offset, next_offset=base_offset + len(entries),
            producer_id=producer.producer_id if producer else records.NO_PRODUCER_ID,
            producer_epoch=producer.producer_epoch if producer else records.NO_PRODUCER_EPOCH,
            last_sequence=(records.next_sequence(producer.base_sequence, len(entries) - 1)
                           if producer else records.NO_SEQUENCE),
            is_transactional=producer is not None, is_control=False,
            records=[(base_offset + i, k, v) for i, (k, v) in enumerate(entries)],
        ))
        owned.log_end_offset = base_offset + len(entries)

    async def _persist(self, owned: OwnedPartition, entries: Sequence[Entry], *,
                       producer: TxnWriter | None = None) -> None:
        """Appends records and replays them; the caller holds owned.lock.
        `producer` (transactional offsets) is rebuilt by `make_producer` after
        a catch-up, since a marker read then may change the next sequence."""
        for _attempt in range(20):
            try:
                base = await self._store.append(
                    CONSUMER_OFFSETS_TOPIC, owned.partition, entries,
                    expected_log_end_offset=owned.log_end_offset, now_ms=self._now_ms(),
                    producer=producer,
                )
            except ServiceError as exc:
                if exc.code is ErrorCode.LOG_END_OFFSET_MISMATCH:
                    # A marker (or a newer owner) moved the log: read it and retry.
                    await self._catch_up_or_unload(owned)
                    if producer is not None:
                        producer = replace(producer, base_sequence=owned.state.next_sequence_for(
                            producer.producer_id, producer.producer_epoch))
                    continue
                if producer is not None and exc.code in _TXN_REFUSALS:
                    raise
                if exc.code is ErrorCode.MESSAGE_TOO_LARGE:
                    # The store refused the batch whole and wrote nothing:
                    # memory is still the log's state (no reload), and the
                    # same request can never fit (not retriable). The caller
                    # says which part of the request is too large.
                    raise ServiceError(
                        ErrorCode.MESSAGE_TOO_LARGE,
                        f"{len(entries)} record(s) do not fit one batch of "
                        f"{CONSUMER_OFFSETS_TOPIC}, nothing was written: {exc.message}",
                    ) from exc
                # Unknown outcome: memory may be behind the log. Reload.
                self._unload(owned)
                raise ServiceError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"{CONSUMER_OFFSETS_TOPIC}-{owned.partition} write failed: {exc.message}",
                ) from exc
            self._replay_own(owned, base, entries, producer)
            return
        raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                           f"{CONSUMER_OFFSETS_TOPIC}-{owned.partition}: the log kept moving")

    async def _catch_up_or_unload(self, owned: OwnedPartition) -> None:
        try:
            await self._catch_up(owned, until_high_watermark=True)
        except ServiceError as exc:
            self._unload(owned)
            raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                               f"catching up {CONSUMER_OFFSETS_TOPIC}-{owned.partition}: "
                               f"{exc.message}") from exc
        if owned.state.coordinator_epoch != owned.my_epoch:
            self._fence(owned)
            raise ServiceError(ErrorCode.NOT_COORDINATOR,
                               f"{CONSUMER_OFFSETS_TOPIC}-{owned.partition} has a newer owner")

    async def _tail(self, owned: OwnedPartition) -> None:
        """Follows the partition for markers written by transaction coordinators."""
        backoff_s = 0.05
        while not self._stopping and owned.loaded and not owned.fenced:
            try:
                read = await self._store.read_batches(
                    CONSUMER_OFFSETS_TOPIC, owned.partition, owned.log_end_offset,
                    max_wait_ms=self.config.tail_wait_ms,
                )
                backoff_s = 0.05
            except ServiceError as exc:
                log.debug("tailing %s-%d: %s", CONSUMER_OFFSETS_TOPIC, owned.partition, exc)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 1.0)
                continue
            async with owned.lock:
                if owned.loaded and not owned.fenced:
                    self._apply_read(owned, read)
                    if owned.state.coordinator_epoch != owned.my_epoch:
                        self._fence(owned)

    # ------------------------------------------------------------- plumbing

    def owned_for(self, group_id: str) -> OwnedPartition:
        if not group_id:
            raise ServiceError(ErrorCode.INVALID_GROUP_ID, "group_id must not be empty")
        # Every group request comes here first; the id is in every record of
        # the group (see limits.MAX_ID_LENGTH).
        check_id_length("group_id", group_id, ErrorCode.INVALID_GROUP_ID)
        partition = self._layout.consumer_offsets_partition(group_id)
        owned = self.partitions.get(partition)
        if owned is None or owned.fenced:
            raise ServiceError(
                ErrorCode.NOT_COORDINATOR,
                f"group {group_id!r} belongs to {CONSUMER_OFFSETS_TOPIC}-{partition}, which "
                f"group coordinator {self._node_id} does not own",
            )
        self._check_loaded(owned)
        return owned

    def _check_loaded(self, owned: OwnedPartition) -> None:
        if not owned.loaded:
            raise ServiceError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"{CONSUMER_OFFSETS_TOPIC}-{owned.partition} is loading",
            )

    def _heartbeat_interval_ms(self, session_timeout_ms: int) -> int:
        return max(100, min(self.config.max_heartbeat_interval_ms, session_timeout_ms // 3))

    async def _persist_group(self, owned: OwnedPartition, before: gr.Group | None,
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
        _check_topic_names("subscribed_topics", topics, ErrorCode.INVALID_TOPIC_EXCEPTION,
                           allow_empty=True)
        current = owned.state.groups.get(group_id)
        wanted = set(topics) | (current.subscribed_topics if current else set())
        counts = await self._counts.get(wanted)
        async with owned.lock:
            self._check_loaded(owned)
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
                                   self._heartbeat_interval_ms(member.session_timeout_ms),
                                   member.assignment)

    async def _expire_sessions(self) -> None:
        now = self._now_ms()
        for owned in self.partitions.values():
            if not owned.loaded or owned.fenced:
                continue
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
        while not self._stopping:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await step()
            except ServiceError as exc:
                log.info("%s: %s", step.__name__, exc)

    # --------------------------------------------------------------- offsets

    async def _validate_offsets(self, group_id: str,
                                partitions: Sequence[tuple[TP, int, str]]) -> None:
        """Bad input fails the whole request, naming what was wrong."""
        if not partitions:
            raise ServiceError(ErrorCode.INVALID_REQUEST, "the commit names no partition")
        # No topic has such a name: unknown, as below, but named clearly.
        _check_topic_names(f"group {group_id!r}: the commit", (tp[0] for tp, _, _ in partitions),
                           ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        seen: set[TP] = set()
        for tp, offset, metadata in partitions:
            where = f"group {group_id!r}, {tp[0]}-{tp[1]}"
            if tp in seen:
                raise ServiceError(ErrorCode.INVALID_REQUEST, f"{where} appears twice")
            seen.add(tp)
            if offset < 0:
                raise ServiceError(ErrorCode.INVALID_REQUEST,
                                   f"{where}: offset {offset} is negative")
            metadata_bytes = len(metadata.encode())
            if metadata_bytes > self.config.max_offset_metadata_bytes:
                raise ServiceError(
                    ErrorCode.OFFSET_METADATA_TOO_LARGE,
                    f"{where}: metadata is {metadata_bytes} bytes, over the "
                    f"{self.config.max_offset_metadata_bytes}-byte limit",
                )
        counts = await self._counts.get(tp[0] for tp in seen)
        unknown = sorted(tp for tp in seen if not 0 <= tp[1] < counts.get(tp[0], 0))
        if unknown:
            raise ServiceError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"group {group_id!r}: no such partition(s): "
                + ", ".join(f"{t}-{p}" for t, p in unknown),
            )

    @staticmethod
    def _raise_not_owned(refused: Mapping[TP, ServiceError]) -> None:
        if refused:
            first = refused[min(refused)]
            raise ServiceError(
                first.code,
                first.message if len(refused) == 1 else
                f"{first.message} (and {len(refused) - 1} more partition(s))",
            )

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
            self._check_loaded(owned)
            self._raise_not_owned(gr.check_commit_member(
                owned.state.groups.get(group_id), group_id=group_id, member_id=member_id,
                generation_id=generation_id, partitions=[tp for tp, _, _ in partitions],
            ))
            writer = None
            if txn is not None:
                transactional_id, producer_id, producer_epoch = txn
                writer = TxnWriter(
                    transactional_id=transactional_id, producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    base_sequence=owned.state.next_sequence_for(producer_id, producer_epoch),
                )
            now = self._now_ms()
            try:
                await self._persist(owned, [encode_offset(group_id, tp, offset, metadata, now)
                                            for tp, offset, metadata in partitions],
                                    producer=writer)
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
        owned = self.owned_for(group_id)
        committed = owned.state.offsets.get(group_id, {})
        wanted = sorted(committed) if not partitions else list(partitions)
        if not partitions and require_stable:
            wanted = sorted(set(wanted) | {
                tp for by_group in owned.state.pending.values()
                for tp in by_group.get(group_id, {})
            })
        out = []
        for tp in wanted:
            if require_stable and owned.state.has_pending(group_id, tp):
                out.append(FetchedOffset(tp, -1, "", ServiceError(
                    ErrorCode.UNSTABLE_OFFSET_COMMIT,
                    f"group {group_id!r}, {tp[0]}-{tp[1]}: a transactional offset commit is "
                    "pending; retry",
                )))
                continue
            value: CommittedOffset | None = committed.get(tp)
            out.append(FetchedOffset(tp, value.offset if value else -1,
                                     value.metadata if value else ""))
        return out

    # ----------------------------------------------------------------- admin

    def list_groups(self) -> list[tuple[str, str]]:
        out = []
        for owned in self.partitions.values():
            if not owned.loaded or owned.fenced:
                continue
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
            self._check_loaded(owned)
            group = owned.state.groups.get(group_id)
            if group is not None and group.members:
                raise ServiceError(
                    ErrorCode.NON_EMPTY_GROUP,
                    f"group {group_id!r} has {len(group.members)} member(s); only an empty "
                    "group can be deleted",
                )
            if group is None and group_id not in owned.state.known_groups():
                raise ServiceError(ErrorCode.GROUP_ID_NOT_FOUND,
                                   f"group {group_id!r} does not exist")
            await self._persist(owned, self._removal_records(owned, group_id))

    @staticmethod
    def _removal_records(owned: OwnedPartition, group_id: str) -> list[Entry]:
        entries = [encode_offset_tombstone(group_id, tp)
                   for tp in sorted(owned.state.offsets.get(group_id, {}))]
        if group_id in owned.state.groups:
            entries.append(encode_group_tombstone(group_id))
        return entries

    async def _apply_retention(self) -> None:
        """Removes offsets of deleted topics and expired empty groups."""
        now = self._now_ms()
        for owned in self.partitions.values():
            if not owned.loaded or owned.fenced:
                continue
            topics = {tp[0] for offs in owned.state.offsets.values() for tp in offs}
            counts = await self._counts.get(topics)
            async with owned.lock:
                if not owned.loaded:
                    continue
                entries: list[Entry] = []
                for group_id in sorted(owned.state.known_groups()):
                    group = owned.state.groups.get(group_id)
                    committed = owned.state.offsets.get(group_id, {})
                    newest_ms = max((c.commit_ms for c in committed.values()), default=0)
                    if ((group is None or not group.members)
                            and now - newest_ms > self.config.offsets_retention_ms):
                        log.info("group %r expired (empty, no commit for %d ms)", group_id,
                                 now - newest_ms)
                        entries.extend(self._removal_records(owned, group_id))
                        continue
                    entries.extend(
                        encode_offset_tombstone(group_id, tp) for tp in sorted(committed)
                        if not 0 <= tp[1] < counts.get(tp[0], 0)
                    )
                if entries:
                    await self._persist(owned, entries)

    # --------------------------------------------------------------- metrics

    def snapshot(self) -> list[tuple[gr.Group | None, str, dict[TP, CommittedOffset], int]]:
        """(group, group id, committed offsets, pending count) per known group."""
        out = []
        for owned in self.partitions.values():
            if not owned.loaded or owned.fenced:
                continue
            for group_id in owned.state.known_groups():
                pending = sum(len(by_group.get(group_id, {}))
                              for by_group in owned.state.pending.values())
                out.append((owned.state.groups.get(group_id), group_id,
                            dict(owned.state.offsets.get(group_id, {})), pending))
        return out
