"""The cluster's metadata in the metadata store (etcd): the topic catalog, each
partition's replicas / leader / leader epoch / ISR, which stores are alive,
and which store is the controller (docs/replication.md).

Keys (values are JSON):

    <root>/topics/<name>            the catalog record (core/topics.py)
    <root>/next_topic_id            the next topic id to hand out
    <root>/partitions/<name>/<p>    PartitionState (core/replicas.py)
    <root>/stores/<node id>         {"address": ...}, held by the store's lease
    <root>/controller               {"node_id": ...}, held by the controller's lease
    <root>/shutting_down/<node id>  {"node_id": ...}, held by the store's lease: it
                                    is stopping and asks the controller to move
                                    its leaderships (controlled shutdown)

Every change is one metadata-store transaction that compares the revisions it
was decided on, so two writers (two controllers, a deposed leader shrinking
its ISR, two nodes creating the same topic) cannot both win: the loser reads
again and decides again. Nothing here is a consensus algorithm of our own.

`MetadataLink` is the store's ControllerLink when the cluster has a metadata
store: any store creates, grows and deletes topics itself (no forwarding),
every store reads the whole tree at once (`refresh`, one range read) and the
elected controller moves leadership away from stores whose lease ended, and
from stores that are stopping and asked for it (Kafka's controlled shutdown:
the request is a key held by the stopping store's lease, so it ends with
that store's life).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

from oncelog.wire.errors import ErrorCode
from oncelog.wire.placement import stable_hash

from ...common.kernel.errors import ServiceError
from ...common.metadata.cluster import ClusterLayout
from ...common.metadata.store import (
    METADATA_TXN_OPS_MAX,
    Compare,
    MetadataStore,
    MetadataUnavailable,
    Put,
    Versioned,
)
from .. import metrics
from ..api import NewPartitions, TopicOutcome, TopicSpec
from ..core.codec import CorruptValueError
from ..core.outcomes import Rejection
from ..core.replicas import (
    DEFAULT_LEADER_IMBALANCE_CHECK_INTERVAL_MS,
    DEFAULT_LEADER_IMBALANCE_PER_STORE_PCT,
    PREFERRED_LEADER_REJOIN_DELAY_MS,
    PREFERRED_LEADER_REJOIN_WINDOW_MS,
    PartitionState,
    ReplicaStateError,
    assign_replicas,
    begin_reassignment,
    default_replication_factor,
    elect_leader,
    fence_replica,
    finish_reassignment,
    initial_state,
    is_unclean,
    leaderships_to_hand_over,
    move_leader_off,
    plan_preferred_elections,
    replication_factor_of,
    shrink_isr,
)
from ..core.topics import (
    INTERNAL_TOPIC_CONFIG,
    TopicRecord,
    grow_topic,
    topic_record_from_json,
    topic_record_json,
    validate_new_topic,
)

if TYPE_CHECKING:
    from .lease_heartbeat import LeaseHeartbeat

log = logging.getLogger("oncelog.partition_store.metadata")

DEFAULT_ROOT = "/oncelog"
# A store's listeners besides its gRPC port, as its registration names them
# (`<kind>_address`): the token listener (--token-listen) and the Kafka
# listener (--kafka-listen).
TOKEN_LISTENER = "token"
KAFKA_LISTENER = "kafka"
LISTENER_KINDS = (TOKEN_LISTENER, KAFKA_LISTENER)
DEFAULT_LEASE_TTL_S = 3

TopicPartitionKey = tuple[str, int]
_T = TypeVar("_T")


@dataclass(slots=True)
class ClusterView:
    """One consistent read of the metadata tree."""

    revision: int = 0
    topics: dict[str, TopicRecord] = field(default_factory=dict)
    topic_revisions: dict[str, int] = field(default_factory=dict)
    states: dict[TopicPartitionKey, PartitionState] = field(default_factory=dict)
    state_revisions: dict[TopicPartitionKey, int] = field(default_factory=dict)
    # node id -> advertised address, for stores whose lease is alive.
    live_stores: dict[int, str] = field(default_factory=dict)
    # node id -> address of every store that has registered at least once
    # (a key without a lease).
    seen_stores: dict[int, str] = field(default_factory=dict)
    # The same two for the stores' other listeners, by kind ("token": the
    # token listener, "kafka": the Kafka listener), for those that have one.
    live_listeners: dict[str, dict[int, str]] = field(default_factory=dict)
    seen_listeners: dict[str, dict[int, str]] = field(default_factory=dict)
    controller: int | None = None
    # The controller key's mod revision (0: no controller), so the
    # controller can give the role up without deleting a successor's key.
    controller_revision: int = 0
    # Stores that are stopping and asked for their leaderships to be moved
    # (their keys live and die with their leases).
    shutting_down: set[int] = field(default_factory=set)
    next_topic_id: Versioned | None = None


class MetadataLink:
    def __init__(
        self, store: MetadataStore, *, layout: ClusterLayout, node_id: int,
        root: str = DEFAULT_ROOT, lease_ttl_s: int = DEFAULT_LEASE_TTL_S,
        unclean_leader_election: bool = False,
        leader_imbalance_check_interval_ms: int = DEFAULT_LEADER_IMBALANCE_CHECK_INTERVAL_MS,
        leader_imbalance_per_store_pct: int = DEFAULT_LEADER_IMBALANCE_PER_STORE_PCT,
        clock_ms: Callable[[], int],
        lease_heartbeat: LeaseHeartbeat | None = None,
    ) -> None:
        """`lease_heartbeat` (a real store's; replication/lease_heartbeat.py)
        keeps each lease this link is granted alive from a thread of its own,
        besides the keep-alive of `keep_registered`."""
        self.store = store
        self._heartbeat = lease_heartbeat
        self._layout = layout
        self._node_id = node_id
        self._root = root.rstrip("/")
        self.lease_ttl_s = lease_ttl_s
        self.unclean_leader_election = unclean_leader_election
        self._clock_ms = clock_ms
        self.view = ClusterView()
        self._lease: int | None = None
        self._controller_lease: int | None = None
        # Controller: when each store was first seen without a lease, so a
        # store that has not registered yet at start-up is given one TTL.
        self._missing_since_ms: dict[int, int] = {}
        self.leader_imbalance_check_interval_ms = leader_imbalance_check_interval_ms
        self.leader_imbalance_per_store_pct = leader_imbalance_per_store_pct
        # Controller: when leadership is next moved back to preferred
        # replicas (one interval after this store became controller).
        self._next_rebalance_ms: int | None = None
        # Set once this store has begun its controlled shutdown: it gives
        # the controller role up and never takes it again.
        self._stopping = False
        # Stores whose lease had ended and came back, and when (see
        # PREFERRED_LEADER_REJOIN_DELAY_MS); the next rejoin check.
        self._rejoined_at_ms: dict[int, int] = {}
        self._next_rejoin_check_ms = 0
        # Controller: the (revision, stores gone) of its last pass that found
        # nothing to do; the same again needs no look at every partition.
        self._quiet_pass: tuple[int, frozenset[int]] | None = None

    # ------------------------------------------------------------------ keys

    def _topic_key(self, name: str) -> str:
        return f"{self._root}/topics/{name}"

    def _state_key(self, topic: str, partition: int) -> str:
        return f"{self._root}/partitions/{topic}/{partition}"

    def _store_key(self, node_id: int) -> str:
        return f"{self._root}/stores/{node_id}"

    def _seen_key(self, node_id: int) -> str:
        return f"{self._root}/seen/{node_id}"

    def _shutting_down_key(self, node_id: int) -> str:
        return f"{self._root}/shutting_down/{node_id}"

    @property
    def _controller_key(self) -> str:
        return f"{self._root}/controller"

    @property
    def _counter_key(self) -> str:
        return f"{self._root}/next_topic_id"

    # ----------------------------------------------------------------- reads

    async def refresh(self) -> ClusterView:
        """Reads the whole tree (one range read) into `view`."""
        entries, revision = await self._call(self.store.get_prefix(self._root + "/"))
        view = ClusterView(revision=revision)
        topics_prefix = self._root + "/topics/"
        parts_prefix = self._root + "/partitions/"
        stores_prefix = self._root + "/stores/"
        seen_prefix = self._root + "/seen/"
        shutting_down_prefix = self._root + "/shutting_down/"
        for key, item in entries.items():
            try:
                if key.startswith(topics_prefix):
                    record = topic_record_from_json(item.value)
                    view.topics[record.name] = record
                    view.topic_revisions[record.name] = item.mod_revision
                elif key.startswith(parts_prefix):
                    topic, _, p = key[len(parts_prefix):].rpartition("/")
                    view.states[(topic, int(p))] = PartitionState.from_json(item.value)
                    view.state_revisions[(topic, int(p))] = item.mod_revision
                elif key.startswith(stores_prefix):
                    _registration(json.loads(item.value), int(key[len(stores_prefix):]),
                                  view.live_stores, view.live_listeners)
                elif key.startswith(seen_prefix):
                    _registration(json.loads(item.value), int(key[len(seen_prefix):]),
                                  view.seen_stores, view.seen_listeners)
                elif key.startswith(shutting_down_prefix):
                    view.shutting_down.add(int(key[len(shutting_down_prefix):]))
                elif key == self._controller_key:
                    view.controller = int(json.loads(item.value)["node_id"])
                    view.controller_revision = item.mod_revision
                elif key == self._counter_key:
                    view.next_topic_id = item
            except (CorruptValueError, ReplicaStateError, ValueError, KeyError,
                    TypeError) as exc:
                # Not guessing: an entry we cannot read stays out of the view.
                log.error("metadata entry %s unreadable: %s", key, exc)
        self.view = view
        return view

    async def current_revision(self) -> int:
        """The metadata store's revision now, from a read of one small key:
        while it equals a view's, the tree is that view (every change, a
        lease's end included, moves it), so the whole tree need not be read
        again."""
        _entries, revision = await self._call(self.store.get_prefix(self._controller_key))
        return revision

    async def _call(self, awaitable: Awaitable[_T]) -> _T:
        try:
            return await awaitable
        except MetadataUnavailable as exc:
            raise ServiceError(
                ErrorCode.LEADER_NOT_AVAILABLE, f"the metadata store is unreachable: {exc}"
            ) from exc

    # --------------------------------------------------- ControllerLink port

    async def list_topics(self) -> list[TopicRecord]:
        view = await self.refresh()
        return list(view.topics.values())

    async def create_topics(
        self, specs: Sequence[TopicSpec], *, validate_only: bool
    ) -> list[TopicOutcome]:
        return [await self._create_one(spec, validate_only=validate_only) for spec in specs]

    async def _create_one(
        self, spec: TopicSpec, *, validate_only: bool, internal: bool = False
    ) -> TopicOutcome:
        checked = validate_new_topic(spec.name, spec.partitions, spec.config,
                                     allow_internal=internal)
        if isinstance(checked, Rejection):
            return TopicOutcome(spec.name, ServiceError(checked.code, checked.message))
        stores = sorted(self.store_addresses())
        rf = spec.replication_factor or default_replication_factor(len(stores))
        if not 1 <= rf <= len(stores):
            return TopicOutcome(spec.name, ServiceError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"topic {spec.name!r}: replication factor {rf} needs 1..{len(stores)} "
                f"(the cluster has {len(stores)} stores)",
            ))
        # Two creators race on the topic key and the id counter: the loser
        # reads again and finds the topic there.
        while True:
            view = await self.refresh()
            existing = view.topics.get(spec.name)
            if existing is not None:
                return TopicOutcome(spec.name, ServiceError(
                    ErrorCode.TOPIC_ALREADY_EXISTS,
                    f"topic {spec.name!r} already exists (topic id {existing.topic_id}, "
                    f"{existing.partitions} partitions)",
                ), existing.topic_id)
            if validate_only:
                return TopicOutcome(spec.name)
            counter = view.next_topic_id
            topic_id = int(counter.value) if counter is not None else 1
            record = TopicRecord.build(
                name=spec.name, topic_id=topic_id, partitions=spec.partitions,
                overrides=dict(spec.config), internal=internal,
            )
            replicas = assign_replicas(
                first_store_index=stable_hash(spec.name), partitions=spec.partitions,
                stores=stores, replication_factor=rf,
            )
            puts = [
                Put(self._topic_key(spec.name), topic_record_json(record)),
                Put(self._counter_key, str(topic_id + 1)),
            ]
            puts += [
                Put(self._state_key(spec.name, p), initial_state(r).to_json())
                for p, r in enumerate(replicas)
            ]
            compares = [
                Compare(self._topic_key(spec.name), 0),
                Compare(self._counter_key, counter.mod_revision if counter else 0),
            ]
            if await self._call(self.store.commit(compares, puts, ())):
                log.info("created topic %s (id %d, %d partitions, replication factor %d)",
                         spec.name, topic_id, spec.partitions, rf)
                return TopicOutcome(spec.name, None, topic_id)

    async def delete_topics(self, names: Sequence[str]) -> list[TopicOutcome]:
        outcomes = []
        for name in names:
            view = await self.refresh()
            record = view.topics.get(name)
            if record is None:
                outcomes.append(TopicOutcome(name, ServiceError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")))
                continue
            if record.internal:
                outcomes.append(TopicOutcome(name, ServiceError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"topic {name!r} is internal and cannot be deleted")))
                continue
            deletes = [self._topic_key(name)] + [
                self._state_key(name, p) for p in range(record.partitions)
            ]
            compares = [Compare(self._topic_key(name), view.topic_revisions[name])]
            if await self._call(self.store.commit(compares, (), deletes)):
                log.info("deleted topic %s (id %d)", name, record.topic_id)
                outcomes.append(TopicOutcome(name, None, record.topic_id))
            else:
                outcomes.append(TopicOutcome(name, ServiceError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {name!r} changed while it was being deleted; try again")))
        return outcomes

    async def create_partitions(
        self, specs: Sequence[NewPartitions], *, validate_only: bool
    ) -> list[TopicOutcome]:
        counts: dict[str, int] = {}
        for spec in specs:
            counts[spec.name] = counts.get(spec.name, 0) + 1
        outcomes = []
        for spec in specs:
            if counts[spec.name] > 1:
                outcomes.append(TopicOutcome(spec.name, ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"topic {spec.name!r} appears {counts[spec.name]} times in one request")))
                continue
            outcomes.append(await self._grow_one(spec, validate_only=validate_only))
        return outcomes

    async def _grow_one(self, spec: NewPartitions, *, validate_only: bool) -> TopicOutcome:
        """One topic's new partitions: the catalog record with the new count
        and each new partition's state (placed as a new topic's partitions
        are, with the replication factor of the topic's partition 0), in one
        transaction guarded by the revision of the topic's record, so two
        concurrent requests (or a deletion) cannot both apply: the loser
        reads again and decides again.

        A transaction holds at most METADATA_TXN_OPS_MAX writes, so a topic
        that gains more partitions than fit grows in steps, each a whole
        growth of its own (the record's count and those partitions' states
        together): readers see a smaller count for a moment, never a count
        without its states. Should a step fail, the topic keeps the steps
        done so far and the same request sent again goes on from there."""
        grown_here = False
        while True:
            view = await self.refresh()
            record = view.topics.get(spec.name)
            after = grow_topic(spec.name, record, spec.count)
            topic_id = record.topic_id if record is not None else 0
            if isinstance(after, Rejection):
                if grown_here and record is not None and record.partitions == spec.count:
                    return TopicOutcome(spec.name, None, topic_id)  # its last step landed
                return TopicOutcome(spec.name, ServiceError(after.code, after.message), topic_id)
            first = view.states.get((spec.name, 0))
            if first is None:
                return TopicOutcome(spec.name, ServiceError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {spec.name!r} has no state for partition 0 in the metadata "
                    "store; it cannot grow until it has one"), topic_id)
            stores = sorted(self.store_addresses())
            rf = replication_factor_of(first)
            if rf > len(stores):
                return TopicOutcome(spec.name, ServiceError(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"topic {spec.name!r}: its replication factor {rf} needs {rf} stores, "
                    f"the cluster has {len(stores)}"), topic_id)
            if validate_only:
                return TopicOutcome(spec.name, None, topic_id)
            before = view.topics[spec.name].partitions
            # One write is the record's; the rest are partition states.
            step = replace(after, partitions=min(after.partitions,
                                                 before + METADATA_TXN_OPS_MAX - 1))
            replicas = assign_replicas(
                first_store_index=stable_hash(spec.name), partitions=step.partitions - before,
                stores=stores, replication_factor=rf, first_partition=before,
            )
            puts = [Put(self._topic_key(spec.name), topic_record_json(step))]
            puts += [
                Put(self._state_key(spec.name, p), initial_state(r).to_json())
                for p, r in enumerate(replicas, start=before)
            ]
            compares = [Compare(self._topic_key(spec.name), view.topic_revisions[spec.name])]
            if await self._call(self.store.commit(compares, puts, ())):
                grown_here = True
                log.info("topic %s (id %d) grew from %d to %d partitions (replication "
                         "factor %d)", spec.name, topic_id, before, step.partitions, rf)
                if step.partitions == spec.count:
                    return TopicOutcome(spec.name, None, topic_id)

    def partition_states(self) -> Mapping[TopicPartitionKey, PartitionState]:
        return self.view.states

    def store_addresses(self) -> dict[int, str]:
        """Every store the cluster has: the layout's, and those that joined
        later (registered in the metadata store), by node id."""
        known = dict(enumerate(self._layout.stores))
        known.update(self.view.seen_stores)
        known.update(self.view.live_stores)
        return known

    def token_store_addresses(self) -> dict[int, str]:
        """store_addresses for the stores' token listeners (--token-listen):
        those that have one."""
        return self._listener_addresses(TOKEN_LISTENER, self._layout.token_stores)

    def kafka_store_addresses(self) -> dict[int, str]:
        """store_addresses for the stores' Kafka listeners (--kafka-listen):
        those that have one."""
        return self._listener_addresses(KAFKA_LISTENER, self._layout.kafka_stores)

    def _listener_addresses(self, kind: str, configured: Sequence[str]) -> dict[int, str]:
        known = dict(enumerate(configured))
        known.update(self.view.seen_listeners.get(kind, {}))
        known.update(self.view.live_listeners.get(kind, {}))
        return known

    async def alter_reassignments(
        self, moves: Mapping[TopicPartitionKey, Sequence[int]],
    ) -> dict[TopicPartitionKey, ServiceError | None]:
        """Starts moving partitions to new replica lists (Kafka's
        AlterPartitionReassignments; a move already under way is redirected,
        so moving back to the old list undoes one). The controller finishes
        each move once the new replicas are in sync."""
        outcomes: dict[TopicPartitionKey, ServiceError | None] = {}
        for key, wanted in moves.items():
            while True:
                view = await self.refresh()
                state = view.states.get(key)
                if state is None:
                    outcomes[key] = ServiceError(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        f"partition {key[0]}-{key[1]} does not exist")
                    break
                known = self.store_addresses()
                target = tuple(wanted)
                bad = [r for r in target if r not in known]
                if not target or len(set(target)) != len(target) or bad:
                    outcomes[key] = ServiceError(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"{key[0]}-{key[1]}: replicas {list(target)} must be distinct known "
                        f"store node ids (known: {sorted(known)})")
                    break
                after = begin_reassignment(state, target)
                if await self.update_state(key[0], key[1], view.state_revisions[key], after):
                    log.info("%s-%d: moving replicas %s -> %s", key[0], key[1],
                             list(state.replicas), list(target))
                    outcomes[key] = None
                    break
        return outcomes

    async def notify_catalog_changed(self, node_id: int) -> None:
        """Nothing to do: every store reads the metadata store itself."""

    async def ensure_internal_topics(self) -> None:
        """Creates the layout's internal topics when absent (any store may;
        the first one wins, the others find them there)."""
        for name, partitions in self._layout.internal_topics().items():
            await self._create_one(
                TopicSpec(name, partitions, dict(INTERNAL_TOPIC_CONFIG)), validate_only=False,
                internal=True,
            )

    async def close(self) -> None:
        if self._heartbeat is not None:
            await self._heartbeat.stop()
        for lease in (self._controller_lease, self._lease):
            if lease is not None:
                with contextlib.suppress(MetadataUnavailable):
                    await self.store.revoke(lease)
        await self.store.close()

    # ---------------------------------------------------------- membership

    async def keep_registered(self, address: str,
                              listeners: Mapping[str, str] | None = None) -> None:
        """Registers this store (its address, and its other listeners' by
        kind: TOKEN_LISTENER, KAFKA_LISTENER) under a lease, or keeps the
        lease alive; a lease that ended (the store was paused past its TTL,
        or the metadata store lost it) is replaced by a new one."""
        if self._lease is not None and await self._lease_kept(self._lease):
            return
        self._lease = await self._call(self.store.grant_lease(self.lease_ttl_s))
        if self._heartbeat is not None:
            self._heartbeat.keep(self._lease)
        value = json.dumps({"address": address, **{
            f"{kind}_address": listener for kind, listener in (listeners or {}).items()
            if listener}})
        await self._call(self.store.commit(
            (), [Put(self._store_key(self._node_id), value, self._lease),
                 # Without a lease: that this store has ever been up, and
                 # where (run_controller_once, store_addresses).
                 Put(self._seen_key(self._node_id), value)], ()))
        log.info("store node %d registered (lease %d, TTL %d s)", self._node_id, self._lease,
                 self.lease_ttl_s)

    async def _lease_kept(self, lease: int) -> bool:
        """Whether `lease` is still alive: the heartbeat thread's word when
        there is one (it keeps the lease alive; a second call to etcd here
        would double the keep-alives), else one keep-alive from this loop."""
        if self._heartbeat is not None and self._heartbeat.running:
            return self._heartbeat.keeps(lease)
        return await self._call(self.store.keep_alive(lease))

    async def fence_restarted_self(self) -> int:
        """Run once at start, before this store acts on any state: a store
        that restarts (after a crash, or with an empty disk) is not the
        replica it was. It leaves every ISR it is in, and every partition it
        led gets a new leader epoch without a leader, so the controller
        elects a new one from the ISR (Kafka fences a restarted broker's old
        incarnation the same way). When it is the only in-sync replica it
        stays in the ISR: then it holds the only copy there is, and leads
        again at a new epoch. Returns the partitions changed."""
        changed = 0
        while True:
            view = await self.refresh()
            pending = [
                (key, state) for key, state in sorted(view.states.items())
                if self._node_id in state.isr
            ]
            if not pending:
                return changed
            retry = False
            fences = [(key, state, after) for key, state in pending
                      if (after := fence_replica(state, self._node_id)) is not None]
            # In transactions of up to METADATA_TXN_OPS_MAX partitions (a
            # store holding 1,000 replicas starts in a few writes); a batch
            # whose guard fails goes one partition at a time.
            for first in range(0, len(fences), METADATA_TXN_OPS_MAX):
                batch = fences[first:first + METADATA_TXN_OPS_MAX]
                if len(batch) > 1 and await self._call(self.store.commit(
                        [Compare(self._state_key(*key), view.state_revisions[key])
                         for key, _state, _after in batch],
                        [Put(self._state_key(*key), after.to_json())
                         for key, _state, after in batch], ())):
                    applied = batch
                else:
                    applied = []
                    for key, state, after in batch:
                        if await self.update_state(key[0], key[1], view.state_revisions[key],
                                                   after):
                            applied.append((key, state, after))
                        else:
                            retry = True
                for (topic, partition), state, after in applied:
                    changed += 1
                    if state.isr == (self._node_id,):
                        log.warning("%s-%d: store %d restarted as the only in-sync replica; "
                                    "it leads again at epoch %d with what it has on disk",
                                    topic, partition, self._node_id, after.leader_epoch)
            if not retry:
                return changed

    async def update_state(
        self, topic: str, partition: int, decided_on: int, state: PartitionState
    ) -> bool:
        """Writes a partition's new state if its key is still at revision
        `decided_on`; False when someone changed it first."""
        return await self._call(self.store.commit(
            [Compare(self._state_key(topic, partition), decided_on)],
            [Put(self._state_key(topic, partition), state.to_json())], ()))

    # -------------------------------------------------- controlled shutdown

    async def begin_controlled_shutdown(self) -> None:
        """This store's side of Kafka's controlled shutdown: it gives the
        controller role up if it holds it (a stopping controller would move
        the role mid-drain anyway, at its lease end, and its own leaderships
        are better moved by another store), and asks the controller to move
        every partition it leads by writing its `shutting_down` key under its
        lease — so the request ends with this incarnation, whether it stops
        or dies half-way. Idempotent: called again on every round of the
        wait, it writes only what is missing (a lease that was replaced took
        the key with it). Raises ServiceError when the metadata store is
        unreachable, LeaseNotFound when the lease has just ended."""
        self._stopping = True
        view = await self.refresh()
        # Guarded by the key's revision: a successor's key is never deleted.
        if view.controller == self._node_id and await self._call(self.store.commit(
                [Compare(self._controller_key, view.controller_revision)], (),
                [self._controller_key])):
            log.info("store node %d gives the controller role up: it is stopping",
                     self._node_id)
        if self._node_id not in view.shutting_down and self._lease is not None:
            await self._call(self.store.commit((), [Put(
                self._shutting_down_key(self._node_id),
                json.dumps({"node_id": self._node_id}), self._lease)], ()))
            log.info("store node %d asked the controller to move its leaderships",
                     self._node_id)

    def leaderships_to_hand_over(
            self, led: Mapping[TopicPartitionKey, PartitionState]) -> list[TopicPartitionKey]:
        """Of the partitions this store leads (`led`: as its runtime applied
        them), those that the controller can still move to another live
        in-sync replica, by the last metadata read."""
        view = self.view
        return leaderships_to_hand_over(led, self._node_id, live=view.live_stores,
                                        leaving=view.shutting_down)

    # ----------------------------------------------------------- controller

    def _rejoin_check_due(self, now_ms: int) -> bool:
        """Whether a store that came back is due an imbalance check: it has
        stayed up PREFERRED_LEADER_REJOIN_DELAY_MS, its window has not
        passed, and the last such check is that long ago."""
        for node, at in list(self._rejoined_at_ms.items()):
            if now_ms - at > PREFERRED_LEADER_REJOIN_WINDOW_MS:
                del self._rejoined_at_ms[node]
        due = any(now_ms - at >= PREFERRED_LEADER_REJOIN_DELAY_MS
                  for at in self._rejoined_at_ms.values())
        if not due or now_ms < self._next_rejoin_check_ms:
            return False
        self._next_rejoin_check_ms = now_ms + PREFERRED_LEADER_REJOIN_DELAY_MS
        return True

    async def run_controller_once(self) -> int:
        """One controller step: take the controller key if it is free (held
        by this store's lease), and if this store holds it, elect new leaders
        for partitions whose leader's lease ended and move leadership back to
        in-sync preferred replicas. Returns the number of partitions changed."""
        view = self.view
        if self._lease is None or self._stopping:
            return 0
        if view.controller is None:
            won = await self._call(self.store.commit(
                [Compare(self._controller_key, 0)],
                [Put(self._controller_key, json.dumps({"node_id": self._node_id}), self._lease)],
                ()))
            if won:
                log.info("store node %d is the controller", self._node_id)
                metrics.CONTROLLER_ELECTIONS.inc()
                self._missing_since_ms = {}
                self._next_rebalance_ms = None
            view = await self.refresh()
        if view.controller != self._node_id:
            return 0
        now_ms = self._clock_ms()
        live = set(view.live_stores)
        for node in self.store_addresses():
            if node in live:
                if self._missing_since_ms.pop(node, None) is not None and node in view.seen_stores:
                    self._rejoined_at_ms[node] = now_ms
            else:
                self._missing_since_ms.setdefault(node, now_ms)
                self._rejoined_at_ms.pop(node, None)
        # A store whose lease ended is gone now; one that has never
        # registered (a cluster starting) gets one lease TTL first, so the
        # partitions it was given at creation do not move before it is up.
        grace_ms = self.lease_ttl_s * 1000
        gone = {n for n, since in self._missing_since_ms.items()
                if n in view.seen_stores or now_ms - since >= grace_ms}
        # Stores that are stopping (controlled shutdown) lose their
        # leaderships and are given none back until they return.
        leaving = view.shutting_down & live
        rebalance: Mapping[TopicPartitionKey, PartitionState] = {}
        if self._next_rebalance_ms is None:
            self._next_rebalance_ms = now_ms + self.leader_imbalance_check_interval_ms
        elif now_ms >= self._next_rebalance_ms or self._rejoin_check_due(now_ms):
            if now_ms >= self._next_rebalance_ms:
                self._next_rebalance_ms = now_ms + self.leader_imbalance_check_interval_ms
            rebalance = plan_preferred_elections(
                view.states, live - leaving, imbalance_pct=self.leader_imbalance_per_store_pct)
        quiet_pass = (view.revision, frozenset(gone))
        if not rebalance and quiet_pass == self._quiet_pass:
            return 0
        decisions: list[tuple[TopicPartitionKey, PartitionState, PartitionState]] = []
        for key, state in sorted(view.states.items()):
            if state.online and state.leader not in gone:
                # A follower whose store is gone leaves the ISR now, as
                # Kafka's controller does on a broker failure: otherwise
                # every acks=all append waits replica.lag.time.max.ms for it.
                shrunk = shrink_isr(state, gone)
                after = (move_leader_off(shrunk or state, leaving, live) or shrunk
                         or finish_reassignment(state) or rebalance.get(key))
            else:
                after = elect_leader(state, live, unclean=self.unclean_leader_election)
            if after is not None:
                decisions.append((key, state, after))
        attempted = len(decisions)
        changed = 0
        # Many partitions change at once when a store goes (a third of them
        # with three stores): in transactions of up to METADATA_TXN_OPS_MAX
        # partitions, so that the failover of 1,000 partitions is a few
        # writes, not 1,000 in a row. A batch whose guard fails (someone
        # changed one of them first) is written one partition at a time.
        for first in range(0, len(decisions), METADATA_TXN_OPS_MAX):
            batch = decisions[first:first + METADATA_TXN_OPS_MAX]
            if len(batch) > 1 and await self._call(self.store.commit(
                    [Compare(self._state_key(*key), view.state_revisions[key])
                     for key, _state, _after in batch],
                    [Put(self._state_key(*key), after.to_json()) for key, _state, after in batch],
                    ())):
                applied = batch
            else:
                applied = [
                    (key, state, after) for key, state, after in batch
                    if await self.update_state(key[0], key[1], view.state_revisions[key], after)]
            for (topic, partition), state, after in applied:
                changed += 1
                _log_decision(topic, partition, state, after, gone, leaving)
        # Nothing to decide at this revision with these stores gone: the
        # next passes skip the partitions until one of the two moves.
        self._quiet_pass = quiet_pass if not attempted else None
        if changed:
            await self.refresh()
        return changed


def _log_decision(topic: str, partition: int, state: PartitionState, after: PartitionState,
                  gone: set[int], leaving: set[int]) -> None:
    """Logs (and counts) one change the controller made."""
    if after.replicas != state.replicas and after.target is None:
        log.info("%s-%d: replicas moved %s -> %s (leader %d, epoch %d)", topic,
                 partition, list(state.replicas), list(after.replicas),
                 after.leader, after.leader_epoch)
    elif after.leader == state.leader and after.leader_epoch == state.leader_epoch:
        metrics.ISR_SHRINKS.labels(topic).inc()
        log.info("%s-%d: ISR %s -> %s (stores gone: %s)", topic, partition,
                 list(state.isr), list(after.isr), sorted(gone & set(state.isr)))
    elif not after.online:
        log.error("%s-%d is offline: no in-sync replica is alive (ISR %s)",
                  topic, partition, list(after.isr))
    elif state.leader in leaving and after.leader != state.leader:
        metrics.LEADER_ELECTIONS.inc()
        log.info("%s-%d: leader %d -> %d at epoch %d: store %d is stopping "
                 "(controlled shutdown; ISR %s)", topic, partition, state.leader,
                 after.leader, after.leader_epoch, state.leader, list(after.isr))
    elif is_unclean(state, after):
        metrics.UNCLEAN_LEADER_ELECTIONS.inc()
        log.warning("%s-%d: UNCLEAN leader election of store %d (ISR was %s): "
                    "records only the old ISR had are lost", topic, partition,
                    after.leader, list(state.isr))
    else:
        metrics.LEADER_ELECTIONS.inc()
        log.info("%s-%d: leader %d -> %d at epoch %d (ISR %s)", topic, partition,
                 state.leader, after.leader, after.leader_epoch, list(after.isr))


async def sole_in_sync_replica_of(store: MetadataStore, *, root: str,
                                  node_id: int) -> list[str]:
    """The partitions ("topic-p") whose only in-sync replica is `node_id`:
    a store that finds its data damaged may start empty only when this is
    empty (damage.py). Raises MetadataUnavailable."""
    entries, _revision = await store.get_prefix(f"{root.rstrip('/')}/partitions/")
    prefix_length = len(root.rstrip("/")) + len("/partitions/")
    sole = []
    for key, item in entries.items():
        try:
            state = PartitionState.from_json(item.value)
        except ReplicaStateError:
            continue
        if state.isr == (node_id,):
            topic, _, partition = key[prefix_length:].rpartition("/")
            sole.append(f"{topic}-{partition}")
    return sole


def states_of(view: ClusterView, topic: str) -> Mapping[int, PartitionState]:
    return {p: s for (t, p), s in view.states.items() if t == topic}


def _registration(value: dict[str, str], node_id: int, addresses: dict[int, str],
                  listeners: dict[str, dict[int, str]]) -> None:
    """A store's registration value into the view's address maps."""
    addresses[node_id] = value["address"]
    for kind in LISTENER_KINDS:
        if value.get(f"{kind}_address"):
            listeners.setdefault(kind, {})[node_id] = value[f"{kind}_address"]
