"""What replication asks of this store's local logs (docs/replication.md).

* As leader: the followers' fetches, unsessioned (replica_fetch) or in a
  fetch session (replica_fetch_session, replication/sessions.py), which move the
  HW and may bring a follower back into the ISR; OffsetsForLeaderEpoch.
* As follower: appending the leader's batches at their offsets
  (append_replicated), truncating a divergent tail (truncate_replica) and
  starting over at the leader's log start (reset_replica).

The replica fetcher manager (replication/fetcher.py) drives the follower side; this module
owns no state of its own beyond the leader's fetch sessions it is given.
Partitions come from the catalog (catalog.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import read_header

from ...common.kernel import limits
from ...common.kernel.errors import ServiceError
from .. import metrics
from ..api import EpochEndOutcome, ReplicaFetchItem, ReplicaFetchOutcome
from ..catalog import Catalog
from ..core.codec import decode_offset, encode_partition_meta
from ..log.partition import PartitionRuntime
from ..log.reads import read_replica
from ..reads import DEFAULT_PARTITION_FETCH_MAX_BYTES
from ..shared import StoreShared, durable_callback
from ..storage import keys
from ..storage.port import CorruptionError, WriteGroup
from .sessions import FetchSession, FetchSessions, PartitionKey, SessionEntry

log = logging.getLogger("oncelog.partition_store")


class ReplicaServing:
    """Serves followers as leader, and writes as follower (see the module docstring)."""

    def __init__(self, shared: StoreShared, catalog: Catalog, *,
                 sessions: FetchSessions) -> None:
        self._shared = shared
        self._hooks = shared.hooks
        self.config = shared.config
        self._store = shared.store
        self._writer = shared.writer
        self._clock_ms = shared.clock_ms
        self._catalog = catalog
        self._sessions = sessions

    async def replica_fetch(
        self, replica_id: int, items: Sequence[ReplicaFetchItem], *, max_wait_ms: int,
    ) -> list[ReplicaFetchOutcome]:
        """As leader: what a follower copies next. The fetch offset tells
        how far the follower has copied (which moves the HW and may bring it
        back into the ISR); the answer holds stored batches from there, as
        they are, up to this replica's durable end. Long-polls up to
        max_wait_ms while there is nothing new."""
        await self._catalog.ensure_known({item.topic for item in items})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(max_wait_ms, 0), limits.MAX_FETCH_WAIT_MS) / 1000
        first = True
        while True:
            now_ms = self._clock_ms()
            outcomes: list[ReplicaFetchOutcome] = []
            parts: list[PartitionRuntime] = []
            ready = False
            for item in items:
                resolved: PartitionRuntime | None = None
                try:
                    part = resolved = self._catalog.resolve_leader(item.topic, item.partition,
                                                           item.current_leader_epoch)
                    if replica_id not in part.state.replicas:
                        raise ServiceError(
                            ErrorCode.NOT_LEADER_OR_FOLLOWER,
                            f"{part.topic_partition}: store node {replica_id} is not one of "
                            f"its replicas {list(part.state.replicas)}",
                        )
                    log_state = part.log
                    if not log_state.log_start_offset <= item.fetch_offset <= (
                            log_state.log_end_offset):
                        raise ServiceError(
                            ErrorCode.OFFSET_OUT_OF_RANGE,
                            f"{part.topic_partition}: replica fetch offset {item.fetch_offset} "
                            f"is outside the leader's log [{log_state.log_start_offset}, "
                            f"{log_state.log_end_offset})",
                        )
                    if first:
                        part.record_follower_fetch(replica_id, item.fetch_offset, now_ms)
                        self._maybe_expand_isr(part, replica_id, item.fetch_offset)
                    try:
                        batches, _next = read_replica(
                            part, item.fetch_offset,
                            max_bytes=item.max_bytes or DEFAULT_PARTITION_FETCH_MAX_BYTES,
                        )
                    except CorruptionError as damage:
                        raise self._shared.report_damage(damage) from damage
                except ServiceError as exc:
                    # The leader's bounds tell a follower out of range whether
                    # to truncate (it is ahead) or start over (it is behind
                    # the log start).
                    outcomes.append(ReplicaFetchOutcome(
                        item.topic, item.partition, exc,
                        log_start_offset=resolved.log.log_start_offset if resolved else -1,
                        log_end_offset=resolved.log.log_end_offset if resolved else -1,
                    ))
                    ready = True
                    continue
                parts.append(part)
                ready = ready or bool(batches)
                outcomes.append(ReplicaFetchOutcome(
                    item.topic, item.partition, None,
                    high_watermark=part.log.high_watermark,
                    log_start_offset=part.log.log_start_offset,
                    log_end_offset=part.log.log_end_offset,
                    batches=tuple(batches),
                ))
            first = False
            remaining_s = deadline - loop.time()
            if ready or remaining_s <= 0 or self._shared.closing:
                return outcomes
            waiter: asyncio.Future[None] = loop.create_future()
            for part in parts:
                part.add_durable_waiter(waiter)
            try:
                await asyncio.wait_for(waiter, remaining_s)
            except TimeoutError:
                pass
            finally:
                for part in parts:
                    part.remove_durable_waiter(waiter)

    async def replica_fetch_session(
        self, replica_id: int, items: Sequence[ReplicaFetchItem], *, session_id: int,
        session_epoch: int, forgotten: Sequence[PartitionKey] = (), max_wait_ms: int,
    ) -> tuple[int, list[ReplicaFetchOutcome]]:
        """As leader, a follower store's fetch of every partition it
        follows here, in its fetch session (replication/sessions.py): epoch 1
        opens the session and lists them all; later epochs list only the
        partitions whose fetch offset or leader epoch changed (`forgotten`:
        those it stopped following). The answer holds only partitions with
        news: batches, an error (the partition leaves the session), or a HW
        the follower has not been sent (HW moves alone do not end the
        long-poll: they ride with the next answer). Long-polls up to
        max_wait_ms, woken by the partitions' appends, not by polling them.
        Returns (session id, outcomes); session id 0: no session (epoch 0,
        answered as `replica_fetch`), or the session is unknown and the
        follower must open a new one."""
        if session_epoch <= 0:
            return 0, await self.replica_fetch(replica_id, items, max_wait_ms=max_wait_ms)
        await self._catalog.ensure_known({item.topic for item in items})
        if session_epoch == 1:
            session = self._sessions.open(replica_id)
        else:
            found = self._sessions.take(replica_id, session_id, session_epoch)
            if found is None:
                return 0, []
            session = found
        for key in forgotten:
            self._sessions.forget(session, key)
        now_ms = self._clock_ms()
        outcomes: dict[PartitionKey, ReplicaFetchOutcome] = {}
        # What the follower did not confirm copying is sent again; what
        # appended since the last answer is new.
        check = dict.fromkeys(session.answered)
        session.answered.clear()
        for key in session.take_ready():
            check[key] = None
        for item in items:
            key = (item.topic, item.partition)
            entry = SessionEntry(item.fetch_offset, item.current_leader_epoch,
                                 item.max_bytes or DEFAULT_PARTITION_FETCH_MAX_BYTES)
            self._sessions.put(session, key, entry)
            try:
                part = self._session_partition(replica_id, key, entry)
            except ServiceError as exc:
                outcomes[key] = self._session_error(session, key, exc)
                continue
            part.record_follower_fetch(replica_id, item.fetch_offset, now_ms)
            self._maybe_expand_isr(part, replica_id, item.fetch_offset)
            # Its HW is news to the follower until sent once.
            session.hw_moved[key] = None
            check[key] = None
        for key in session.take_rejoin_checks():
            stored = session.entries.get(key)
            led = self.led_partition(*key)
            # Unlisted: the follower's log end is still what the session holds.
            if stored is not None and led is not None and (
                    stored.leader_epoch == led.state.leader_epoch) and (
                    led.follower_end_offsets.get(replica_id) == stored.fetch_offset):
                self._maybe_expand_isr(led, replica_id, stored.fetch_offset)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(max_wait_ms, 0), limits.MAX_FETCH_WAIT_MS) / 1000
        while True:
            for key in check:
                stored = session.entries.get(key)
                if key in outcomes or stored is None:
                    continue
                outcome = self._session_read(session, key, stored)
                if outcome is not None:
                    outcomes[key] = outcome
            remaining_s = deadline - loop.time()
            if outcomes or remaining_s <= 0 or self._shared.closing or not self._sessions.is_open(
                    session):
                break
            waiter: asyncio.Future[None] = loop.create_future()
            session.waiter = waiter
            try:
                await asyncio.wait_for(waiter, remaining_s)
            except TimeoutError:
                pass
            finally:
                session.waiter = None
            check = dict.fromkeys(session.take_ready())
        for key in list(session.hw_moved):
            stored = session.entries.get(key)
            led = self._catalog.partitions.get(key)
            if key in outcomes or stored is None or led is None:
                continue
            if not led.closed and led.is_leader and (
                    led.log.high_watermark > stored.sent_high_watermark):
                outcomes[key] = ReplicaFetchOutcome(
                    key[0], key[1], None, high_watermark=led.log.high_watermark,
                    log_start_offset=led.log.log_start_offset,
                    log_end_offset=led.log.log_end_offset)
        session.hw_moved.clear()
        for key, outcome in outcomes.items():
            stored = session.entries.get(key)
            if stored is not None and outcome.error is None:
                stored.sent_high_watermark = outcome.high_watermark
                if outcome.batches:
                    session.answered[key] = None
        return session.session_id, list(outcomes.values())

    def _session_partition(self, replica_id: int, key: PartitionKey,
                           entry: SessionEntry) -> PartitionRuntime:
        """The led partition a session entry fetches, checked as a fetch
        is (leader epoch, replica, offset within the log)."""
        part = self._catalog.resolve_leader(key[0], key[1], entry.leader_epoch)
        if replica_id not in part.state.replicas:
            raise ServiceError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{part.topic_partition}: store node {replica_id} is not one of "
                f"its replicas {list(part.state.replicas)}",
            )
        log_state = part.log
        if not log_state.log_start_offset <= entry.fetch_offset <= log_state.log_end_offset:
            raise ServiceError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"{part.topic_partition}: replica fetch offset {entry.fetch_offset} "
                f"is outside the leader's log [{log_state.log_start_offset}, "
                f"{log_state.log_end_offset})",
            )
        return part

    def _session_read(self, session: FetchSession, key: PartitionKey,
                      entry: SessionEntry) -> ReplicaFetchOutcome | None:
        """A session entry's batches from its fetch offset (None: nothing
        new), or its error."""
        try:
            part = self._session_partition(session.replica_id, key, entry)
        except ServiceError as exc:
            return self._session_error(session, key, exc)
        if entry.fetch_offset >= part.log.durable_end_offset:
            return None
        try:
            batches, _next = read_replica(part, entry.fetch_offset, max_bytes=entry.max_bytes)
        except CorruptionError as damage:
            # Never sent: the follower is told STORAGE_ERROR, as an
            # unsessioned fetch is (replica_fetch).
            return self._session_error(session, key, self._shared.report_damage(damage))
        if not batches:
            return None
        return ReplicaFetchOutcome(
            key[0], key[1], None, high_watermark=part.log.high_watermark,
            log_start_offset=part.log.log_start_offset,
            log_end_offset=part.log.log_end_offset, batches=tuple(batches))

    def _session_error(self, session: FetchSession, key: PartitionKey,
                       error: ServiceError) -> ReplicaFetchOutcome:
        """A refused partition leaves the session (the follower lists it
        again once it has dealt with the error), with the leader's bounds: a
        follower out of range learns from them whether to truncate or to
        start over."""
        self._sessions.forget(session, key)
        part = self._catalog.partitions.get(key)
        return ReplicaFetchOutcome(
            key[0], key[1], error,
            log_start_offset=part.log.log_start_offset if part is not None else -1,
            log_end_offset=part.log.log_end_offset if part is not None else -1,
        )

    def _maybe_expand_isr(self, part: PartitionRuntime, replica_id: int,
                          fetch_offset: int) -> None:
        """A follower outside the ISR rejoins once it has everything the
        ISR has (the HW) and everything of the current leader epoch (Kafka's
        rule); the change goes through the metadata store."""
        if replica_id in part.state.isr or self._hooks.on_isr_expand is None:
            return
        if self.may_rejoin_isr(part, replica_id):
            self._hooks.on_isr_expand(part, replica_id)

    @staticmethod
    def may_rejoin_isr(part: PartitionRuntime, replica_id: int) -> bool:
        """As leader: whether a follower holds all the ISR holds (the HW)
        and all of the current leader epoch, as it last said. Checked when
        it asks and again when the change is made: the HW may have passed
        it meanwhile, and an ISR member must never lack a committed record."""
        fetch_offset = part.follower_end_offsets.get(replica_id, -1)
        epoch_start = part.epochs.start_offset_of(part.state.leader_epoch)
        return fetch_offset >= part.log.high_watermark and (
            epoch_start is None or fetch_offset >= epoch_start)

    def offsets_for_leader_epoch(
        self, queries: Sequence[tuple[str, int, int, int]],
    ) -> list[EpochEndOutcome]:
        """(topic, partition, epoch, current leader epoch or -1) -> where
        that epoch ends in this leader's log (Kafka's OffsetsForLeaderEpoch)."""
        outcomes = []
        for topic, partition, epoch, current in queries:
            try:
                part = self._catalog.resolve_leader(
                    topic, partition, current if current >= 0 else None)
            except ServiceError as exc:
                outcomes.append(EpochEndOutcome(topic, partition, exc))
                continue
            found_epoch, end_offset = part.epochs.end_offset_for(epoch, part.log.log_end_offset)
            outcomes.append(EpochEndOutcome(topic, partition, None, found_epoch, end_offset))
        return outcomes

    def led_partition(self, topic: str, partition: int) -> PartitionRuntime | None:
        """The local replica when this node leads it (None otherwise)."""
        part = self._catalog.partitions.get((topic, partition))
        if part is None or part.closed or not part.is_leader:
            return None
        return part

    def follower_partition(self, topic: str, partition: int) -> PartitionRuntime | None:
        """The local replica when this node follows it (None otherwise)."""
        part = self._catalog.partitions.get((topic, partition))
        if part is None or part.closed or part.is_leader or not part.state.online:
            return None
        return part

    def append_replicated(
        self, part: PartitionRuntime, batches: Sequence[bytes], *, leader_high_watermark: int,
    ) -> asyncio.Future[None] | None:
        """As follower: appends the leader's batches at their offsets and
        queues their writes; returns the future of the last one's durability
        (None when there were none). Takes the leader's HW.

        Goes on while the store drains (begin_shutdown): the store is still
        in the ISR of the partitions it follows until its lease ends, so the
        leaders count it for their high watermarks, and a follower that
        stopped copying would hold their acknowledgements — and every
        request here that waits on one of them, a transaction's
        verification say — until the drain's grace ran out."""
        if self._shared.closed:
            raise ServiceError(
                ErrorCode.SHUTTING_DOWN,
                f"store node {self.config.node_id} is shutting down; retry later",
            )
        self._writer.check_healthy()
        now_ms = self._clock_ms()
        last: asyncio.Future[None] | None = None
        for stored in batches:
            result = part.append_replicated(stored, now_ms=now_ms)
            last = self._writer.submit(
                result.group,
                on_durable=durable_callback(part, result.base_offset, result.next_offset),
            )
            self._shared.maybe_snapshot(part, now_ms)
        part.leader_high_watermark = max(part.leader_high_watermark, leader_high_watermark)
        part.update_high_watermark()
        return last

    async def truncate_replica(self, part: PartitionRuntime, offset: int) -> PartitionRuntime:
        """As follower: removes every batch at or after `offset` (a tail the
        new leader does not have; a batch that `offset` falls inside goes
        whole, as in Kafka, since two divergent logs need not share batch
        boundaries) and rebuilds the partition's memory from what stays, by
        the same recovery as a restart. Returns the new runtime of the
        partition. Raises NOT_LEADER_OR_FOLLOWER when the partition is no
        longer this replica's to truncate (it leads now, or was reopened)."""
        self._check_follower(part)
        tid, p = part.topic.topic_id, part.partition
        if offset >= part.log.log_end_offset:
            # Nothing to cut from the log; epochs this replica began at its
            # log end and never wrote go (Kafka truncates the cache so too).
            if part.epochs.truncate_from_end(offset):
                group = WriteGroup()
                part.add_epoch_writes(group)
                await self._writer.submit(group)
            return part
        containing = self._store.seek_for_prev(keys.log_key(tid, p, offset),
                                               keys.partition_prefix(keys.LOG, tid, p))
        if containing is not None:
            header = read_header(containing[1])
            if header.base_offset < offset < header.next_offset:
                offset = header.base_offset

        def deletes() -> WriteGroup:
            end_key = keys.log_key_end(tid, p)
            removed_bytes = sum(
                len(v) for _k, v in self._store.scan(keys.log_key(tid, p, offset), end_key))
            group = WriteGroup()
            group.delete_range(keys.log_key(tid, p, offset), end_key)
            group.delete_range(keys.aborted_txn_key(tid, p, offset),
                               keys.next_prefix(keys.partition_prefix(keys.ABORTED_TXN, tid, p)))
            group.delete_range(keys.snapshot_key(tid, p, offset + 1),
                               keys.next_prefix(keys.partition_prefix(keys.SNAPSHOT, tid, p)))
            time_prefix = keys.partition_prefix(keys.TIME_INDEX, tid, p)
            for key, value in self._store.scan(time_prefix, keys.next_prefix(time_prefix)):
                if decode_offset(value, what=f"{part.topic_partition} time index") >= offset:
                    group.delete(key)
            if part.epochs.truncate_from_end(offset):
                part.add_epoch_writes(group)
            group.put(keys.meta_key(tid, p), encode_partition_meta(
                part.log.log_start_offset, part.log.size_bytes - removed_bytes))
            return group

        log.warning("%s: truncating the log from %d to %d (a tail the leader at epoch %d does "
                    "not have)", part.topic_partition, part.log.log_end_offset, offset,
                    part.state.leader_epoch)
        metrics.TRUNCATIONS.labels(part.topic.name).inc()
        return await self._rewrite_replica(part, deletes)

    async def reset_replica(
        self, part: PartitionRuntime, log_start_offset: int
    ) -> PartitionRuntime:
        """As follower: drops everything this replica holds of the partition
        and starts it empty at `log_start_offset` (the leader's log start:
        what came before is gone everywhere)."""
        self._check_follower(part)
        tid, p = part.topic.topic_id, part.partition

        def deletes() -> WriteGroup:
            group = WriteGroup()
            for kind in keys.PARTITION_KINDS:
                prefix = keys.partition_prefix(kind, tid, p)
                group.delete_range(prefix, keys.next_prefix(prefix))
            group.put(keys.meta_key(tid, p), encode_partition_meta(log_start_offset, 0))
            return group

        log.warning("%s: starting this replica over at the leader's log start offset %d",
                    part.topic_partition, log_start_offset)
        return await self._rewrite_replica(part, deletes)

    def _check_follower(self, part: PartitionRuntime) -> None:
        key = (part.topic.name, part.partition)
        if self._catalog.partitions.get(key) is not part or part.closed or part.is_leader:
            raise ServiceError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{part.topic_partition} is no longer followed by this replica as it was "
                "(it leads now, or was reopened)")

    async def _rewrite_replica(
        self, part: PartitionRuntime, deletes: Callable[[], WriteGroup],
    ) -> PartitionRuntime:
        """Takes the partition out of service at once (before any await:
        nothing may be appended to it meanwhile, not even if it is made
        leader), waits for its pending writes, applies `deletes()` (built
        then, from what is on disk) and reopens it from disk with its
        current state: as leader too, if it was elected meanwhile."""
        key = (part.topic.name, part.partition)
        self._check_follower(part)
        del self._catalog.partitions[key]
        self._catalog.rewriting.add(key)
        part.close()
        part.fail_acks(ServiceError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{part.topic_partition} was truncated here"))

        async def rewrite() -> PartitionRuntime:
            try:
                await self._writer.drain()
                await self._writer.submit(deletes())
            finally:
                self._catalog.rewriting.discard(key)
            record = self._catalog.records.get(part.topic.name)
            if record is None or record.topic_id != part.topic.topic_id:
                raise ServiceError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                   f"{part.topic_partition} was deleted meanwhile")
            return self._catalog.open_partition(record, part.partition, self._clock_ms())

        # Shielded: a follower stopped halfway (a leader change cancels it)
        # must not leave the partition out of service, or reopened from disk
        # before the deletion has landed.
        return await asyncio.shield(asyncio.ensure_future(rewrite()))
