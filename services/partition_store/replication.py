"""The replica manager of one store node (docs/replication.md): keeps the
node registered in the metadata store, applies what the metadata store says
(catalog, leaders, ISRs), runs one follower per partition this node follows,
and, as leader, moves followers out of and back into the ISR.

A follower (`_follow`) works for one leader epoch:
1. Truncation (KIP-101/KIP-279): it asks the leader where its own latest
   leader epoch ended there (OffsetsForLeaderEpoch) and cuts what it holds
   beyond that point: a tail a deposed leader appended and never got
   acknowledged. Asking again with an older epoch when the leader never had
   this one (core/leader_epochs.py decides).
2. Copying: it fetches from its log end offset, appends the leader's stored
   batches at the same offsets through the same replay as every append, waits
   until they are on its disk and fetches again; that next fetch tells the
   leader how far it has copied, which moves the high watermark.
A leader change (a new epoch) stops the follower; the next one starts over at
step 1. A leader answering "out of range" below its log start (this replica
came back empty, or retention went past it) makes the follower start over at
the leader's log start.

Every change of leader, epoch or ISR is a metadata-store transaction guarded
by the revision it was decided on (metadata_link.py), so a leader that was
paused past its lease cannot shrink the ISR to itself and acknowledge alone:
its write fails, it reads again and finds it leads no more.

A store cut off from the metadata store alone (a network partition; the
other stores and the clients still reach it) cannot read that it was
deposed. Once the metadata store has been out of its reach for a lease TTL
(its lease has ended, so the controller may have moved its partitions), it
asks the other stores for their partition states and takes every state of
a higher leader epoch than its own (`_learn_from_peers`): a state with a
higher epoch is a later one in the metadata store, so this is what reading
the metadata store later would give. It stops leading what it lost,
answers Metadata with the new leaders (clients that ask it go to them) and
follows. While the metadata store is out of every store's reach, no store
knows a newer epoch and nothing changes: leaders keep serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from oncelog.wire.errors import ErrorCode

from ..common.errors import ServiceError
from ..common.metadata_store import LeaseNotFound
from . import metrics
from .core.leader_epochs import AskAgain, Truncate, divergence_step
from .core.replicas import PartitionState, expand_isr, lagging_followers, shrink_isr
from .metadata_link import MetadataLink
from .partition import PartitionRuntime
from .runtime import (
    EpochEndOutcome,
    ReplicaFetchItem,
    ReplicaFetchOutcome,
    StoreRuntime,
)
from .storage.port import CorruptionError

log = logging.getLogger("oncelog.partition_store.replication")

DEFAULT_METADATA_SYNC_INTERVAL_MS = 100
DEFAULT_REPLICA_FETCH_WAIT_MS = 500
DEFAULT_REPLICA_FETCH_MAX_BYTES = 8 << 20
# A follower waits this long after a failed fetch before the next one.
FOLLOWER_BACKOFF_MS = 50
# How long a starting store waits for the metadata store before it gives up.
START_METADATA_WAIT_MS = 60_000
# "metadata store unreachable" is logged at most this often.
UNREACHABLE_LOG_INTERVAL_S = 10.0
# While the metadata store is out of reach past a lease TTL, the other
# stores are asked for their partition states at most this often.
PEER_STATES_INTERVAL_S = 1.0


class LeaderLink(Protocol):
    """How a follower reaches its leader (gRPC in production)."""

    async def replica_fetch(
        self, leader: int, replica_id: int, items: Sequence[ReplicaFetchItem], *,
        max_wait_ms: int,
    ) -> list[ReplicaFetchOutcome]: ...

    async def offsets_for_leader_epoch(
        self, leader: int, queries: Sequence[tuple[str, int, int, int]],
    ) -> list[EpochEndOutcome]: ...

    async def partition_states(self, node_id: int) -> Mapping[tuple[str, int], PartitionState]:
        """Every partition state the store `node_id` holds (from its last
        read of the metadata store)."""

    async def close(self) -> None: ...


class ReplicaManager:
    def __init__(
        self, runtime: StoreRuntime, link: MetadataLink, leaders: LeaderLink, *,
        address: str, listeners: Mapping[str, str] | None = None,
        sync_interval_ms: int = DEFAULT_METADATA_SYNC_INTERVAL_MS,
        fetch_wait_ms: int = DEFAULT_REPLICA_FETCH_WAIT_MS,
    ) -> None:
        self._runtime = runtime
        self._link = link
        self._leaders = leaders
        self._address = address
        # This store's other listeners (token, Kafka), registered beside its
        # address.
        self._listeners = dict(listeners or {})
        self._node_id = runtime.config.node_id
        self._sync_interval_s = sync_interval_ms / 1000
        self._fetch_wait_ms = fetch_wait_ms
        # (topic, partition) -> (leader epoch, its follower task)
        self._followers: dict[tuple[str, int], tuple[int, asyncio.Task[None]]] = {}
        # (topic, partition, replica) asking to rejoin the ISR, in the order
        # asked (a dict: which replica rejoins first must not depend on
        # string hashing, so a simulation seed replays the same anywhere).
        self._expand: dict[tuple[str, int, int], None] = {}
        self._task: asyncio.Task[None] | None = None
        self._last_keep_alive_s = 0.0
        self._last_synced_s = 0.0
        self._last_peer_states_s = 0.0
        self._last_unreachable_log_s = 0.0
        self._closing = False
        runtime.on_states_applied = self._reconcile
        runtime.on_isr_expand = self._request_expand

    async def start(self, *, metadata_wait_ms: int = START_METADATA_WAIT_MS) -> None:
        """Registers, fences this store's previous incarnation, creates the
        internal topics when absent, loads the catalog and states, then keeps
        them current in the background. While the metadata store cannot be
        reached it tries again, up to metadata_wait_ms (then raises: the
        store does not serve without knowing what it leads)."""
        deadline_s = self._now_s() + metadata_wait_ms / 1000
        while True:
            try:
                await self._link.keep_registered(self._address, self._listeners)
                self._last_keep_alive_s = self._now_s()
                fenced = await self._link.fence_restarted_self()
                if fenced:
                    log.info("store node %d left the ISR of %d partitions on start; it "
                             "rejoins each once it has caught up", self._node_id, fenced)
                await self._link.ensure_internal_topics()
                await self._runtime.refresh_catalog()
                self._last_synced_s = self._now_s()
                break
            except (ServiceError, LeaseNotFound) as exc:
                if self._now_s() >= deadline_s:
                    raise
                log.warning("store node %d: cannot start replication yet (%s); trying again",
                            self._node_id, getattr(exc, "message", exc))
                await asyncio.sleep(FOLLOWER_BACKOFF_MS * 10 / 1000)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="replication")

    async def close(self) -> None:
        self._closing = True
        tasks = [t for _e, t in self._followers.values()]
        if self._task is not None:
            tasks.append(self._task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._followers.clear()
        await self._leaders.close()

    # ------------------------------------------------------------ the loop

    async def _run(self) -> None:
        while not self._closing:
            try:
                await self.sync_once()
                self._last_synced_s = self._now_s()
            except ServiceError as exc:
                now = self._now_s()
                if now - self._last_unreachable_log_s >= UNREACHABLE_LOG_INTERVAL_S:
                    self._last_unreachable_log_s = now
                    log.warning("store node %d cannot sync with the metadata store (leaders "
                                "keep serving; no leader changes meanwhile): %s",
                                self._node_id, exc.message)
                if (now - self._last_synced_s >= self._link.lease_ttl_s
                        and now - self._last_peer_states_s >= PEER_STATES_INTERVAL_S):
                    self._last_peer_states_s = now
                    await self._learn_from_peers()
            except Exception:
                log.exception("replication sync failed")
            await asyncio.sleep(self._sync_interval_s)

    async def sync_once(self) -> None:
        """One round: keep the lease, read the metadata (which applies it and
        reconciles followers), act as controller if this node is, and move
        followers out of / into the ISRs this node leads."""
        now = self._now_s()
        if now - self._last_keep_alive_s >= self._link.lease_ttl_s / 3:
            try:
                await self._link.keep_registered(self._address, self._listeners)
            except LeaseNotFound:
                await self._link.keep_registered(self._address, self._listeners)
            self._last_keep_alive_s = now
        await self._runtime.refresh_catalog()
        try:
            changed = await self._link.run_controller_once()
        except LeaseNotFound:
            changed = 0
        if changed:
            await self._runtime.refresh_catalog()
        if await self._maintain_isr():
            await self._runtime.refresh_catalog()
        self._update_gauges()

    def _now_s(self) -> float:
        # The runtime's clock: the simulation drives it.
        return self._runtime.clock_ms() / 1000

    async def _learn_from_peers(self) -> int:
        """Takes the partition states of a higher leader epoch that other
        stores hold (the module docstring says why); returns how many."""
        view = self._link.view
        peers = sorted(n for n in self._link.store_addresses() if n != self._node_id)
        answers = await asyncio.gather(
            *(self._leaders.partition_states(n) for n in peers), return_exceptions=True)
        learned: list[str] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                if not isinstance(answer, ServiceError):
                    log.warning("asking a store for its partition states failed: %r", answer)
                continue
            for key, theirs in sorted(answer.items()):
                ours = view.states.get(key)
                # Only partitions it knows and still holds: topics and moves
                # wait for the metadata store.
                if (ours is None or theirs.leader_epoch <= ours.leader_epoch
                        or self._node_id not in theirs.replicas):
                    continue
                view.states[key] = theirs
                learned.append(f"{key[0]}-{key[1]} (leader {theirs.leader} at epoch "
                               f"{theirs.leader_epoch})")
        if learned:
            log.warning("store node %d cannot reach the metadata store; other stores know "
                        "newer leaders for %s", self._node_id, ", ".join(learned))
            self._runtime.apply_learned_states()
        return len(learned)

    # ------------------------------------------------------------ followers

    def _reconcile(self) -> None:
        """Starts a follower for each partition this node follows at an epoch
        it has no follower for, and stops the others."""
        if self._closing:
            return
        wanted: dict[tuple[str, int], int] = {}
        for part in self._runtime.partitions:
            if not part.closed and not part.is_leader and part.state.online:
                wanted[(part.topic.name, part.partition)] = part.state.leader_epoch
        for key, (epoch, task) in list(self._followers.items()):
            if wanted.get(key) != epoch or task.done():
                task.cancel()
                del self._followers[key]
        loop = asyncio.get_running_loop()
        for key, epoch in wanted.items():
            if key not in self._followers:
                task = loop.create_task(self._follow(key[0], key[1], epoch),
                                        name=f"follow-{key[0]}-{key[1]}")
                self._followers[key] = (epoch, task)

    async def _follow(self, topic: str, partition: int, epoch: int) -> None:
        truncated = False
        while not self._closing:
            part = self._runtime.follower_partition(topic, partition)
            if part is None or part.state.leader_epoch != epoch:
                return
            leader = part.state.leader
            if not self._runtime.storage_writable:
                # A fetch tells the leader this replica holds everything
                # below its log end, which a failed write left ahead of the
                # disk: no fetch until storage is back (memory rebuilt).
                await asyncio.sleep(FOLLOWER_BACKOFF_MS * 10 / 1000)
                continue
            try:
                if not truncated:
                    await self._truncate_to_leader(part, leader, epoch)
                    truncated = True
                    continue
                outcome = (await self._leaders.replica_fetch(
                    leader, self._node_id,
                    [ReplicaFetchItem(topic, partition, part.log.log_end_offset, epoch,
                                      DEFAULT_REPLICA_FETCH_MAX_BYTES)],
                    max_wait_ms=self._fetch_wait_ms,
                ))[0]
                # While the answer was on its way this replica may have been
                # made leader, or truncated and reopened: then it is not this
                # follower's to append to.
                if self._runtime.follower_partition(topic, partition) is not part or (
                        part.state.leader_epoch != epoch):
                    continue
                if outcome.error is not None:
                    truncated = await self._on_fetch_error(part, outcome)
                    continue
                written = self._runtime.append_replicated(
                    part, outcome.batches, leader_high_watermark=outcome.high_watermark)
                if written is not None:
                    await written
                metrics.REPLICA_LAG_OFFSETS.labels(topic, str(partition)).set(
                    max(0, outcome.log_end_offset - part.log.log_end_offset))
            except asyncio.CancelledError:
                raise
            except ServiceError as exc:
                log.debug("%s-%d: following store %d at epoch %d: %s", topic, partition,
                          leader, epoch, exc.message)
                await asyncio.sleep(FOLLOWER_BACKOFF_MS / 1000)
            except CorruptionError as exc:
                # Its own log, read to truncate or to replay: damaged.
                self._runtime.report_damage(exc)
                await asyncio.sleep(FOLLOWER_BACKOFF_MS / 1000)
            except Exception:
                log.exception("%s-%d: follower failed", topic, partition)
                await asyncio.sleep(FOLLOWER_BACKOFF_MS / 1000)

    async def _on_fetch_error(self, part: PartitionRuntime,
                              outcome: ReplicaFetchOutcome) -> bool:
        """Handles a refused fetch; returns whether truncation still holds
        (False: check against the leader again before fetching)."""
        error = outcome.error
        assert error is not None
        if error.code is ErrorCode.OFFSET_OUT_OF_RANGE:
            if outcome.log_start_offset >= 0 and part.log.log_end_offset < outcome.log_start_offset:
                await self._runtime.reset_replica(part, outcome.log_start_offset)
                return True
            return False
        log.debug("%s: replica fetch refused: %s", part.topic_partition, error.message)
        await asyncio.sleep(FOLLOWER_BACKOFF_MS / 1000)
        return True

    async def _truncate_to_leader(self, part: PartitionRuntime, leader: int,
                                  epoch: int) -> None:
        """Step 1 of following (see the module docstring)."""
        ask = part.epochs.latest_epoch
        if ask < 0:
            # No epoch recorded: nothing to compare; keep only what is known
            # to be committed (Kafka's fallback to the high watermark).
            if part.log.log_end_offset > part.log.high_watermark:
                await self._runtime.truncate_replica(part, part.log.high_watermark)
            return
        while True:
            answer = (await self._leaders.offsets_for_leader_epoch(
                leader, [(part.topic.name, part.partition, ask, epoch)]))[0]
            if answer.error is not None:
                raise answer.error
            step = divergence_step(
                asked_epoch=ask, leader_epoch=answer.leader_epoch,
                leader_end_offset=answer.end_offset, local=part.epochs,
                local_log_end_offset=part.log.log_end_offset,
                high_watermark=part.log.high_watermark,
            )
            if isinstance(step, AskAgain):
                ask = step.epoch
                continue
            assert isinstance(step, Truncate)
            # truncate_replica refuses when this replica leads by now or was
            # reopened while the answer came (NOT_LEADER_OR_FOLLOWER).
            if part.state.leader_epoch == epoch:
                await self._runtime.truncate_replica(part, step.offset)
            return

    # ------------------------------------------------------------------ ISR

    def _request_expand(self, part: PartitionRuntime, replica: int) -> None:
        self._expand[(part.topic.name, part.partition, replica)] = None

    async def _maintain_isr(self) -> bool:
        """As leader: drops followers that lag more than
        replica.lag.time.max.ms and adds back those that caught up. Returns
        whether anything changed."""
        view = self._link.view
        now_ms = self._runtime.clock_ms()
        changed = False
        expand, self._expand = self._expand, {}
        for part in self._runtime.partitions:
            if part.closed or not part.is_leader:
                continue
            key = (part.topic.name, part.partition)
            stored = view.states.get(key)
            if stored is None or stored != part.state:
                continue
            after = None
            lagging = lagging_followers(
                isr=part.state.isr, leader=self._node_id,
                last_caught_up_ms=part.last_caught_up_ms, now_ms=now_ms,
                lag_time_max_ms=self._runtime.config.replica_lag_time_max_ms,
            )
            if lagging:
                after = shrink_isr(part.state, lagging)
                counter = metrics.ISR_SHRINKS
            else:
                for topic, partition, replica in expand:
                    # A store whose lease ended (cut off from the metadata
                    # store, yet still fetching) stays out: the controller
                    # would drop it again at once (Kafka's controller too
                    # keeps fenced brokers out of ISRs, KIP-841).
                    if (topic, partition) == key and replica in view.live_stores:
                        after = expand_isr(part.state, replica)
                        counter = metrics.ISR_EXPANDS
                        if after is not None:
                            break
            if after is None:
                continue
            if await self._link.update_state(key[0], key[1], view.state_revisions[key], after):
                counter.labels(key[0]).inc()
                changed = True
                log.info("%s: ISR %s -> %s (leader %d, epoch %d)", part.topic_partition,
                         list(part.state.isr), list(after.isr), self._node_id,
                         after.leader_epoch)
        return changed

    def _update_gauges(self) -> None:
        led = [p for p in self._runtime.partitions if not p.closed and p.is_leader]
        metrics.LEADER_PARTITIONS.set(len(led))
        metrics.UNDER_REPLICATED_PARTITIONS.set(
            sum(1 for p in led if len(p.state.isr) < len(p.state.replicas)))
        metrics.UNDER_MIN_ISR_PARTITIONS.set(
            sum(1 for p in led if len(p.state.isr) < p.min_insync_replicas))
        view = self._link.view
        if view.controller == self._node_id:
            metrics.OFFLINE_PARTITIONS.set(sum(1 for s in view.states.values() if not s.online))
        else:
            metrics.OFFLINE_PARTITIONS.set(0)
