"""The catalog of one store node: its topics, its local partitions and their
replication states.

* Owns the topic records (`records`), the local PartitionRuntime of every
  partition placed here (`partitions`), every partition's state from the
  metadata store (replicated clusters), and the partitions being rewritten.
* Loads the catalog at start, creates the internal topics (controller only),
  takes CreateTopics/DeleteTopics/CreatePartitions (node
  `layout.controller_node_id`; other nodes forward them there), learns
  topics by asking the controller (ListTopics) on a miss and periodically,
  keeps a copy on disk, opens the new partitions of grown topics, deletes
  the data of topics that disappeared. Placement is
  `layout.store_for(topic, partition)`, or the metadata store's.
* Resolves a request's partition (`resolve`, `resolve_leader`) for every
  other job, with the errors a client acts on (NOT_LEADER_OR_FOLLOWER,
  FENCED_LEADER_EPOCH, NOT_ENOUGH_REPLICAS...).
* Hands each local partition its state, and notes the replica news the
  leader side needs: the fetch sessions to wake, the led partitions whose
  followers may be behind (the ISR check's work).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence

from oncelog.wire.errors import ErrorCode

from ..common.kernel.errors import ServiceError
from ..common.kernel.invariants import invariant
from ..common.metadata.cluster import INTERNAL_PREFIX
from .api import ControllerLink, NewPartitions, TopicLookup, TopicOutcome, TopicSpec
from .core.codec import CorruptValueError, decode_offset, encode_offset
from .core.outcomes import Rejection
from .core.replicas import PartitionState, check_leader_epoch, initial_state
from .core.topics import (
    INTERNAL_TOPIC_CONFIG,
    TopicRecord,
    decode_topic_record,
    encode_topic_record,
    grow_topic,
    validate_new_topic,
    validate_topic_name,
)
from .log.loader import recover_partition
from .log.partition import PartitionRuntime, ReplicaNews
from .replication.sessions import FetchSessions, PartitionKey
from .shared import StoreShared
from .storage import keys
from .storage.port import WriteGroup

log = logging.getLogger("oncelog.partition_store")

# A non-controller node asks the controller for the whole catalog at most this
# often when answering "every topic" (Metadata/ListTopics with no names).
CATALOG_CACHE_MS = 1_000
# How long DeleteTopics waits for other store nodes to drop the topic.
PEER_NOTIFY_WAIT_MS = 2_000


class Catalog:
    """Topics, local partitions and their states (see the module docstring)."""

    def __init__(self, shared: StoreShared, *, controller: ControllerLink | None,
                 sessions: FetchSessions) -> None:
        self._shared = shared
        self._hooks = shared.hooks
        self.config = shared.config
        self.layout = shared.layout
        self._store = shared.store
        self._writer = shared.writer
        self._clock_ms = shared.clock_ms
        self._controller = controller
        self._sessions = sessions
        self.records: dict[str, TopicRecord] = {}
        self.partitions: dict[tuple[str, int], PartitionRuntime] = {}
        # Replicated clusters: every partition's state from the metadata
        # store (None: single copies, see partition_state).
        self._states: Mapping[tuple[str, int], PartitionState] | None = (
            {} if self.config.replicated else None)
        # Partitions taken out of service while their stored log is rewritten
        # (truncate_replica, reset_replica): not reopened from disk meanwhile.
        self.rewriting: set[tuple[str, int]] = set()
        # Led partitions where an in-sync follower may lack part of the log:
        # the only ones the ISR's lag check looks at (an idle partition whose
        # followers have everything is never looked at).
        self._followers_behind: dict[PartitionKey, None] = {}
        self._next_topic_id = 1
        self._refresh: asyncio.Future[None] | None = None
        self.last_refresh_ms: int | None = None

    def load(self, now_ms: int) -> None:
        """Reads the catalog kept on disk and recovers every local
        partition (newest good snapshot + replay)."""
        for key, value in self._store.scan(keys.CATALOG_START, keys.CATALOG_END):
            try:
                record = decode_topic_record(value)
            except CorruptValueError as exc:
                # Not guessing: a topic we cannot read stays unavailable here
                # until the controller's catalog (or an operator) replaces it.
                log.error("catalog entry %r unreadable: %s", keys.catalog_key_name(key), exc)
                continue
            self.records[record.name] = record
            self._next_topic_id = max(self._next_topic_id, record.topic_id + 1)
        counter = self._store.get(keys.TOPIC_ID_COUNTER)
        if counter is not None:
            self._next_topic_id = max(
                self._next_topic_id, decode_offset(counter, what="topic id counter")
            )
        for record in self.records.values():
            self._open_local_partitions(record, now_ms)

    def _link(self) -> ControllerLink:
        controller = self._controller
        invariant(controller is not None, "a non-controller node without a ControllerLink")
        return controller  # type: ignore[return-value]  # checked just above


    def _open_local_partitions(self, record: TopicRecord, now_ms: int) -> None:
        for p in range(record.partitions):
            if self.config.node_id in self.partition_state(record.name, p).replicas:
                self.open_partition(record, p, now_ms)

    def open_partition(self, record: TopicRecord, p: int, now_ms: int) -> PartitionRuntime:
        part = recover_partition(
            record, p, self._store, now_ms=now_ms,
            producer_id_expiration_ms=self.config.producer_id_expiration_ms,
            replicated=self.config.replicated,
        )
        self.partitions[(record.name, p)] = part
        if self.config.replicated:
            part.on_replica_news = self._on_replica_news
        self._set_state(part, self.partition_state(record.name, p), record, now_ms)
        return part

    def reopen_all(self, refused: ServiceError, now_ms: int) -> None:
        """Rebuilds every partition's memory from what is on disk (storage
        was reopened after a full disk); appends still waiting for their
        acknowledgement fail with `refused`. The fetch sessions go too: as
        leader, what a rebuilt replica knew of its followers (their log
        ends) is gone, and an idle follower lists a partition in its session
        only when its log end moves. Kept, a follower outside the ISR would
        never prove again that it has caught up, and a partition below
        min.insync.replicas, taking no appends, would stay there. A new
        session lists every partition with the follower's log end."""
        self._sessions.close_all()
        for (name, p), part in list(self.partitions.items()):
            del self.partitions[(name, p)]
            part.close()
            part.fail_acks(refused)
            record = self.records.get(name)
            if record is not None:
                self.open_partition(record, p, now_ms)

    def _on_replica_news(self, part: PartitionRuntime, news: ReplicaNews,
                         durable_before: int) -> None:
        """A local partition appended, moved its HW or changed state: wake
        the fetch sessions that copy it, and keep the set of led partitions
        the ISR check has to look at."""
        key = (part.topic.name, part.partition)
        leads = not part.closed and part.is_leader
        if news is ReplicaNews.APPENDED and leads:
            part.note_appended(durable_before, self._clock_ms())
        if leads and news is not ReplicaNews.HIGH_WATERMARK and len(part.state.isr) > 1:
            self._followers_behind[key] = None
        self._sessions.notify(key, urgent=news is not ReplicaNews.HIGH_WATERMARK)

    def take_followers_behind(self) -> list[PartitionRuntime]:
        """The led partitions where an in-sync follower may be behind
        (the ISR check's work); a partition whose followers have caught up
        leaves the set until its next append or change of leadership."""
        found = []
        for key in list(self._followers_behind):
            part = self.partitions.get(key)
            if part is None or part.closed or not part.is_leader or not part.followers_behind():
                del self._followers_behind[key]
                continue
            found.append(part)
        return found

    def _set_state(self, part: PartitionRuntime, state: PartitionState, record: TopicRecord,
                   now_ms: int) -> None:
        group = part.set_state(state, node_id=self.config.node_id,
                               min_insync_replicas=record.config.min_insync_replicas,
                               now_ms=now_ms)
        if group is not None and group.ops:
            self._writer.submit(group)
        if self.config.replicated:
            self._recheck_rejoin(part)
        self._tell_leadership(part)

    def _tell_leadership(self, part: PartitionRuntime) -> None:
        """Internal topics only: their partitions' leaders are where the
        coordinators that follow leadership run (StoreHooks.on_leadership)."""
        if self._hooks.on_leadership is not None and part.topic.name.startswith(
                INTERNAL_PREFIX):
            self._hooks.on_leadership(part.topic.name, part.partition,
                                      not part.closed and part.is_leader,
                                      part.state.leader_epoch)

    def _recheck_rejoin(self, part: PartitionRuntime) -> None:
        """As leader, on a new state (or a metadata change that may have
        left this state and come back, _apply_states): a follower outside
        the ISR whose fetch session holds the partition is checked for
        rejoining at its next request. It may have caught up while this replica still counted
        it in sync (a restarted store leaves the ISRs in the metadata store
        before its leaders learn it), and, idle, it lists the partition no
        more. Only a request proves the follower is still there: a dead
        store's session must never bring it back."""
        if self._hooks.on_isr_expand is None or part.closed or not part.is_leader:
            return
        key = (part.topic.name, part.partition)
        for replica in part.state.replicas:
            if replica not in part.state.isr:
                self._sessions.check_rejoin(replica, key)

    def _drop_replica(self, part: PartitionRuntime) -> None:
        """This store no longer holds the partition (its replicas moved):
        forgets it and deletes its data."""
        del self.partitions[(part.topic.name, part.partition)]
        part.close()
        self._tell_leadership(part)
        part.fail_acks(ServiceError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"{part.topic_partition} moved away from store node {self.config.node_id}"))
        tid, p = part.topic.topic_id, part.partition
        group = WriteGroup()
        for kind in keys.PARTITION_KINDS:
            prefix = keys.partition_prefix(kind, tid, p)
            group.delete_range(prefix, keys.next_prefix(prefix))
        self._writer.submit(group)
        log.info("%s: no longer a replica here (moved); its data is deleted",
                 part.topic_partition)

    async def alter_reassignments(
        self, moves: Mapping[tuple[str, int], Sequence[int]],
    ) -> dict[tuple[str, int], ServiceError | None]:
        if self._hooks.reassigner is None:
            error = ServiceError(
                ErrorCode.INVALID_REQUEST,
                "moving replicas needs a replicated cluster (stores started with "
                "--etcd-endpoints); this one keeps one copy of each partition where the "
                "layout puts it")
            return {key: error for key in moves}
        outcomes = await self._hooks.reassigner(moves)
        await self.refresh_catalog()
        return outcomes

    def apply_learned_states(self) -> None:
        """Applies the partition states the link holds now, without reading
        the catalog (states learned from other stores while the metadata
        store is out of reach: replication/fetcher.py)."""
        states = self._link().partition_states()
        if states is not None:
            self._states = states
        self._apply_states(self._clock_ms())
        if self._hooks.on_states_applied is not None:
            self._hooks.on_states_applied()

    def partition_states(self) -> dict[tuple[str, int], PartitionState]:
        """Every partition state this store holds (a copy; empty without a
        metadata store)."""
        return dict(self._states or {})

    def partition_state(self, topic: str, partition: int) -> PartitionState:
        """Replicas, leader, leader epoch and ISR of a partition: from the
        metadata store, or the single copy on layout.store_for. A partition
        the metadata store does not list (yet) has no replica here."""
        if self._states is None:
            return initial_state((self.layout.store_for(topic, partition),))
        state = self._states.get((topic, partition))
        return state if state is not None else PartitionState((-1,), -1, 0, (-1,))

    def _apply_states(self, now_ms: int) -> None:
        """Hands each local partition its current state (leader changes,
        ISR changes); opens partitions newly placed here."""
        if self._states is None:
            return
        for (name, p), state in self._states.items():
            record = self.records.get(name)
            if record is None or p >= record.partitions:
                continue
            part = self.partitions.get((name, p))
            if part is None:
                if self.config.node_id in state.replicas and (name, p) not in self.rewriting:
                    self.open_partition(record, p, now_ms)
                continue
            if self.config.node_id not in state.replicas:
                self._drop_replica(part)
                continue
            if part.state != state:
                self._set_state(part, state, record, now_ms)
            elif self.config.replicated:
                # The metadata moved, not this partition's state as last
                # applied, yet it may have left it and come back between
                # two reads: an ISR grown by this leader and shrunk again by
                # another writer (a restarted follower fencing itself), or a
                # rejoin refused while the follower's lease had ended. The
                # follower, caught up and idle, lists the partition no more
                # and would never ask again: check it at its next request.
                self._recheck_rejoin(part)

    def _drop_topic(self, record: TopicRecord, group: WriteGroup) -> None:
        """Forgets a topic here and queues the deletion of its data."""
        self.records.pop(record.name, None)
        for p in range(record.partitions):
            part = self.partitions.pop((record.name, p), None)
            if part is not None:
                part.close()
        group.delete(keys.catalog_key(record.name))
        for start, end in keys.topic_ranges(record.topic_id):
            group.delete_range(start, end)

    async def create_internal_topics(self) -> None:
        now_ms = self._clock_ms()
        group = WriteGroup()
        for name, partitions in self.layout.internal_topics().items():
            existing = self.records.get(name)
            if existing is not None:
                if existing.partitions != partitions:
                    log.warning(
                        "internal topic %s has %d partitions; the layout asks for %d "
                        "(keeping %d: changing it would move keys between partitions)",
                        name, existing.partitions, partitions, existing.partitions,
                    )
                continue
            record = self._new_topic_record(name, partitions, dict(INTERNAL_TOPIC_CONFIG), True)
            self._add_topic(record, group, now_ms)
            log.info("created internal topic %s (%d partitions)", name, partitions)
        if group.ops:
            await self._writer.submit(group)

    def _new_topic_record(
        self, name: str, partitions: int, overrides: dict[str, str], internal: bool
    ) -> TopicRecord:
        record = TopicRecord.build(
            name=name, topic_id=self._next_topic_id, partitions=partitions,
            overrides=overrides, internal=internal,
        )
        self._next_topic_id += 1
        return record

    def _add_topic(self, record: TopicRecord, group: WriteGroup, now_ms: int) -> None:
        invariant(record.name not in self.records, lambda: f"topic {record.name} added twice")
        self.records[record.name] = record
        group.put(keys.catalog_key(record.name), encode_topic_record(record))
        if self.config.is_controller:
            group.put(keys.TOPIC_ID_COUNTER, encode_offset(self._next_topic_id))
        self._open_local_partitions(record, now_ms)

    async def create_topics(
        self, specs: Sequence[TopicSpec], *, validate_only: bool
    ) -> list[TopicOutcome]:
        if not self.config.is_controller:
            return await self._forward_create(specs, validate_only=validate_only)
        self._shared.check_accepting()
        counts: dict[str, int] = {}
        for spec in specs:
            counts[spec.name] = counts.get(spec.name, 0) + 1
        now_ms = self._clock_ms()
        group = WriteGroup()
        outcomes = []
        for spec in specs:
            if counts[spec.name] > 1:
                outcomes.append(TopicOutcome(spec.name, ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"topic {spec.name!r} appears {counts[spec.name]} times in one request",
                )))
                continue
            checked = validate_new_topic(spec.name, spec.partitions, spec.config)
            if isinstance(checked, Rejection):
                outcomes.append(
                    TopicOutcome(spec.name, ServiceError(checked.code, checked.message))
                )
                continue
            if spec.replication_factor > 1:
                outcomes.append(TopicOutcome(spec.name, ServiceError(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"topic {spec.name!r}: replication factor {spec.replication_factor} needs "
                    "a replicated cluster (partition stores started with --etcd-endpoints; "
                    "on one machine `oncelog cluster up --replicated` or "
                    "LocalCluster(etcd_members=1)); this one keeps one copy of each partition",
                )))
                continue
            existing = self.records.get(spec.name)
            if existing is not None:
                outcomes.append(TopicOutcome(spec.name, ServiceError(
                    ErrorCode.TOPIC_ALREADY_EXISTS,
                    f"topic {spec.name!r} already exists (topic id {existing.topic_id}, "
                    f"{existing.partitions} partitions)",
                ), existing.topic_id))
                continue
            if validate_only:
                outcomes.append(TopicOutcome(spec.name))
                continue
            # Applied to memory now, like an append: a concurrent request for
            # the same name sees it; the reply waits for durability below.
            record = self._new_topic_record(spec.name, spec.partitions, dict(spec.config), False)
            self._add_topic(record, group, now_ms)
            outcomes.append(TopicOutcome(spec.name, None, record.topic_id))
            log.info(
                "created topic %s (id %d, %d partitions, config %s)",
                record.name, record.topic_id, record.partitions, dict(record.config_overrides),
            )
        if group.ops:
            await self._writer.submit(group)
        return outcomes

    async def delete_topics(self, names: Sequence[str]) -> list[TopicOutcome]:
        if not self.config.is_controller:
            return await self._forward_delete(names)
        self._shared.check_accepting()
        counts: dict[str, int] = {}
        for name in names:
            counts[name] = counts.get(name, 0) + 1
        group = WriteGroup()
        outcomes = []
        for name in names:
            record = self.records.get(name)
            if counts[name] > 1:
                error = ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"topic {name!r} appears {counts[name]} times in one request",
                )
            elif record is None:
                error = ServiceError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                )
            elif record.internal:
                error = ServiceError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"topic {name!r} is internal and cannot be deleted",
                )
            else:
                self._drop_topic(record, group)
                outcomes.append(TopicOutcome(name, None, record.topic_id))
                log.info("deleted topic %s (id %d)", name, record.topic_id)
                continue
            outcomes.append(TopicOutcome(name, error))
        if group.ops:
            await self._writer.submit(group)
            await self._notify_peers()
        return outcomes

    async def create_partitions(
        self, specs: Sequence[NewPartitions], *, validate_only: bool
    ) -> list[TopicOutcome]:
        """Grows topics (Kafka's CreatePartitions), each on its own: a topic
        that is refused does not stop the others. The new partitions open
        on their stores at once and existing ones keep their records."""
        if not self.config.is_controller:
            return await self._forward_create_partitions(specs, validate_only=validate_only)
        self._shared.check_accepting()
        counts: dict[str, int] = {}
        for spec in specs:
            counts[spec.name] = counts.get(spec.name, 0) + 1
        now_ms = self._clock_ms()
        group = WriteGroup()
        outcomes = []
        for spec in specs:
            record = self.records.get(spec.name)
            topic_id, before = (record.topic_id, record.partitions) if record else (0, 0)
            if counts[spec.name] > 1:
                outcomes.append(TopicOutcome(spec.name, ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"topic {spec.name!r} appears {counts[spec.name]} times in one request",
                ), topic_id))
                continue
            after = grow_topic(spec.name, record, spec.count)
            if isinstance(after, Rejection):
                outcomes.append(TopicOutcome(
                    spec.name, ServiceError(after.code, after.message), topic_id))
                continue
            if not validate_only:
                # Applied to memory now, as create_topics does: a concurrent
                # request sees the new count; the reply waits for durability.
                self._update_topic(after, group, now_ms)
                log.info("topic %s (id %d) grew from %d to %d partitions", spec.name,
                         topic_id, before, after.partitions)
            outcomes.append(TopicOutcome(spec.name, None, topic_id))
        if group.ops:
            await self._writer.submit(group)
            # The new partitions live on other stores too: they open them
            # when they learn the count, before this answer when reachable.
            await self._notify_peers()
        return outcomes

    def _update_topic(self, record: TopicRecord, group: WriteGroup, now_ms: int) -> None:
        """Takes a newer catalog record of a known topic (the same topic id:
        more partitions, or another configuration): the open partitions get
        it, and new partitions placed here open (empty)."""
        self.records[record.name] = record
        group.put(keys.catalog_key(record.name), encode_topic_record(record))
        for p in range(record.partitions):
            part = self.partitions.get((record.name, p))
            if part is not None:
                part.topic = record
            elif (self.config.node_id in self.partition_state(record.name, p).replicas
                  and (record.name, p) not in self.rewriting):
                self.open_partition(record, p, now_ms)

    async def _forward_create_partitions(
        self, specs: Sequence[NewPartitions], *, validate_only: bool
    ) -> list[TopicOutcome]:
        try:
            outcomes = await self._link().create_partitions(specs, validate_only=validate_only)
        except ServiceError as exc:
            return [TopicOutcome(s.name, exc) for s in specs]
        if not validate_only:
            # So that this store's Metadata answers the new count at once.
            # Quietly: the topics grew, and a refresh that fails now must
            # not turn that answer into an error (the next one catches up).
            await self.refresh_quietly()
        return outcomes

    async def _notify_peers(self) -> None:
        """Tells the other store nodes to refresh their catalog, waiting up to
        PEER_NOTIFY_WAIT_MS so that reachable peers have dropped a deleted
        topic when DeleteTopics answers (opened a grown topic's new
        partitions when CreatePartitions answers); slow ones finish in the
        background (and every node also refreshes on a miss and periodically)."""
        if self._controller is None:
            return
        tasks = []
        for node_id in range(len(self.layout.stores)):
            if node_id != self.config.node_id:
                task = asyncio.get_running_loop().create_task(
                    self._controller.notify_catalog_changed(node_id)
                )
                self._shared.background.add(task)
                task.add_done_callback(self._shared.background.discard)
                tasks.append(task)
        if tasks:
            await asyncio.wait(tasks, timeout=PEER_NOTIFY_WAIT_MS / 1000)

    async def _forward_create(
        self, specs: Sequence[TopicSpec], *, validate_only: bool
    ) -> list[TopicOutcome]:
        try:
            outcomes = await self._link().create_topics(specs, validate_only=validate_only)
        except ServiceError as exc:
            return [TopicOutcome(s.name, exc) for s in specs]
        if not validate_only:
            await self.refresh_catalog()
        return outcomes

    async def _forward_delete(self, names: Sequence[str]) -> list[TopicOutcome]:
        try:
            outcomes = await self._link().delete_topics(names)
        except ServiceError as exc:
            return [TopicOutcome(n, exc) for n in names]
        await self.refresh_catalog()
        return outcomes

    async def refresh_catalog(self) -> None:
        """Non-controller nodes: replace the cached catalog by the
        controller's, deleting local data of topics that are gone or were
        re-created under a new id. One refresh at a time; concurrent callers
        share it. Raises ServiceError when the controller is unreachable."""
        if self.config.is_controller:
            return
        if self._refresh is not None:
            await asyncio.shield(self._refresh)
            return
        self._refresh = asyncio.get_running_loop().create_future()
        try:
            records = await self._link().list_topics()
            await self._apply_catalog(records)
            self.last_refresh_ms = self._clock_ms()
            self._refresh.set_result(None)
        except BaseException as exc:
            self._refresh.set_exception(exc)
            self._refresh.exception()  # retrieved: callers re-raise it themselves
            raise
        finally:
            self._refresh = None

    async def refresh_quietly(self) -> None:
        try:
            await self.refresh_catalog()
        except ServiceError as exc:
            log.warning("catalog refresh from the controller failed: %s", exc.message)

    async def _apply_catalog(self, records: Iterable[TopicRecord]) -> None:
        if self._shared.closing:
            return
        states = self._link().partition_states()
        if states is not None:
            self._states = states
        fresh = {r.name: r for r in records}
        now_ms = self._clock_ms()
        group = WriteGroup()
        for name, record in list(self.records.items()):
            if name not in fresh or fresh[name].topic_id != record.topic_id:
                log.info("topic %s (id %d) is gone; deleting its local data", name, record.topic_id)
                self._drop_topic(record, group)
        for name, record in fresh.items():
            current = self.records.get(name)
            if current is None:
                self._add_topic(record, group, now_ms)
            elif current != record:
                # Same topic id, new configuration or partition count
                # (CreatePartitions): the same steps as on the catalog's owner.
                self._update_topic(record, group, now_ms)
        self._apply_states(now_ms)
        if group.ops:
            await self._writer.submit(group)
        if self._hooks.on_states_applied is not None:
            self._hooks.on_states_applied()

    @property
    def catalog_node_id(self) -> int:
        """The store that takes CreateTopics/DeleteTopics/CreatePartitions:
        node 0 with single copies; on a replicated cluster any store (this
        one) does."""
        return self.config.node_id if self.config.replicated else self.layout.controller_node_id

    async def ensure_known(self, names: Iterable[str],
                            partitions: Iterable[tuple[str, int]] = ()) -> None:
        """On a non-controller node, asks the controller once when a topic is
        not in the cached catalog, or (`partitions`) has fewer partitions
        than a request names: the topic may have grown since (a node that
        missed the controller's nudge would otherwise refuse a new partition
        until its next periodic refresh). Returns without awaiting anything
        when all are known, so callers keep their synchronous ordering."""
        if self.config.is_controller:
            return
        catalog = self.records
        if all(name in catalog for name in names) and all(
                t not in catalog or p < catalog[t].partitions for t, p in partitions):
            return
        await self.refresh_quietly()

    async def _ensure_fresh_listing(self) -> None:
        # Replicated: the replica fetcher manager reads the metadata store every
        # 100 ms, and a listing must not wait on it (it may be unreachable).
        if self.config.is_controller or self.config.replicated:
            return
        now_ms = self._clock_ms()
        if self.last_refresh_ms is None or now_ms - self.last_refresh_ms >= CATALOG_CACHE_MS:
            await self.refresh_quietly()

    def topics(self, *, include_internal: bool) -> list[TopicRecord]:
        return [
            r for name, r in sorted(self.records.items()) if include_internal or not r.internal
        ]

    async def list_topics(self, *, include_internal: bool) -> list[TopicRecord]:
        await self._ensure_fresh_listing()
        return self.topics(include_internal=include_internal)

    async def metadata(self, names: Sequence[str], *, include_internal: bool) -> list[TopicLookup]:
        if not names:
            await self._ensure_fresh_listing()
            return [TopicLookup(r.name, r) for r in self.topics(include_internal=include_internal)]
        await self.ensure_known(names)
        lookups = []
        for name in names:
            record = self.records.get(name)
            if record is not None:
                lookups.append(TopicLookup(name, record))
                continue
            bad = validate_topic_name(name, allow_internal=True)
            error = (
                ServiceError(bad.code, bad.message) if bad is not None
                else ServiceError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                )
            )
            lookups.append(TopicLookup(name, None, error))
        return lookups

    def check_not_internal(self, topic: str) -> None:
        """Only the coordinators append to internal topics: they replay every
        record there, and one they cannot read (say, a user's record sent to
        __consumer_offsets by mistake) would stop them loading the partition."""
        record = self.records.get(topic)
        if record is not None and record.internal:
            raise ServiceError(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"topic {topic!r} is internal: only the coordinators write to it",
            )

    def resolve(self, topic: str, partition: int) -> PartitionRuntime:
        record = self.records.get(topic)
        if record is None:
            raise ServiceError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} does not exist"
            )
        if not 0 <= partition < record.partitions:
            raise ServiceError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} has partitions 0..{record.partitions - 1}; "
                f"partition {partition} does not exist",
            )
        part = self.partitions.get((topic, partition))
        if part is None:
            raise self.not_leader(topic, partition)
        return part

    def not_leader(self, topic: str, partition: int) -> ServiceError:
        state = self.partition_state(topic, partition)
        address = self._hooks.store_addresses().get(state.leader)
        where = (
            f"led by store node {state.leader} ({address}) at leader epoch "
            f"{state.leader_epoch}" if address is not None else "without a leader right now"
        )
        return ServiceError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"partition {topic}-{partition} is {where}, not by store node "
            f"{self.config.node_id}; refresh metadata and retry",
        )

    def resolve_leader(self, topic: str, partition: int,
                        leader_epoch: int | None = None) -> PartitionRuntime:
        """The partition, when this node leads it at the epoch the sender
        knows (None: any)."""
        part = self.resolve(topic, partition)
        if not part.is_leader:
            raise self.not_leader(topic, partition)
        stale = check_leader_epoch(known=leader_epoch, current=part.state.leader_epoch)
        if stale == "fenced":
            raise ServiceError(
                ErrorCode.FENCED_LEADER_EPOCH,
                f"{topic}-{partition}: the request names leader epoch {leader_epoch}, but the "
                f"partition is at epoch {part.state.leader_epoch}; refresh metadata and retry",
            )
        if stale == "unknown":
            raise ServiceError(
                ErrorCode.UNKNOWN_LEADER_EPOCH,
                f"{topic}-{partition}: the request names leader epoch {leader_epoch}, newer "
                f"than this replica's {part.state.leader_epoch}; retry",
            )
        return part

    def check_enough_replicas(self, part: PartitionRuntime) -> None:
        if len(part.state.isr) < part.min_insync_replicas:
            raise ServiceError(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"{part.topic_partition}: only {len(part.state.isr)} replicas "
                f"{list(part.state.isr)} are in sync, min.insync.replicas is "
                f"{part.min_insync_replicas}; nothing was written, retry",
            )
