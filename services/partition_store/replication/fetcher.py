"""The follower side of replication on one store node (docs/replication.md),
Kafka's ReplicaFetcherManager (`ReplicaFetcherManager`): keeps the node
registered in the metadata store, applies what the metadata store says
(catalog, leaders, ISRs) when it changes, runs one fetcher per leader store
this node follows partitions of (`LeaderFetcher`), and, as leader, moves
followers out of and back into the ISR.

Each partition a fetcher copies works for one leader epoch:
1. Truncation (KIP-101/KIP-279): it asks the leader where its own latest
   leader epoch ended there (OffsetsForLeaderEpoch) and cuts what it holds
   beyond that point: a tail a deposed leader appended and never got
   acknowledged. Asking again with an older epoch when the leader never had
   this one (core/leader_epochs.py decides).
2. Copying: it fetches from its log end offset, appends the leader's stored
   batches at the same offsets through the same replay as every append, waits
   until they are on its disk and fetches again; that next fetch tells the
   leader how far it has copied, which moves the high watermark.
A leader change (a new epoch) takes the partition off its fetcher; the
fetcher of its new leader starts over at step 1. A leader answering "out of
range" below its log start (this replica came back empty, or retention went
past it) makes the follower start over at the leader's log start.

Every change of leader, epoch or ISR is a metadata-store transaction guarded
by the revision it was decided on (replication/metadata_link.py), so a leader that was
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
from dataclasses import dataclass
from typing import Protocol

from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ...common.kernel.invariants import invariant
from ...common.metadata.store import LeaseNotFound
from .. import metrics
from ..api import EpochEndOutcome, ReplicaFetchItem, ReplicaFetchOutcome
from ..core.leader_epochs import AskAgain, Truncate, divergence_step
from ..core.replicas import PartitionState, expand_isr, lagging_followers, shrink_isr
from ..log.partition import PartitionRuntime
from ..runtime import StoreRuntime
from ..storage.port import CorruptionError
from .metadata_link import MetadataLink
from .sessions import PartitionKey

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
        max_wait_ms: int, session_id: int = 0, session_epoch: int = 0,
        forgotten: Sequence[tuple[str, int]] = (),
    ) -> tuple[int, list[ReplicaFetchOutcome]]:
        """One ReplicaFetch (runtime.replica_fetch_session); returns the
        session id of the answer and its outcomes."""
        ...

    async def offsets_for_leader_epoch(
        self, leader: int, queries: Sequence[tuple[str, int, int, int]],
    ) -> list[EpochEndOutcome]: ...

    async def partition_states(self, node_id: int) -> Mapping[tuple[str, int], PartitionState]:
        """Every partition state the store `node_id` holds (from its last
        read of the metadata store)."""

    async def close(self) -> None: ...


class ReplicaFetcherManager:
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
        # leader store -> the fetcher copying every partition followed there
        self._fetchers: dict[int, LeaderFetcher] = {}
        # The metadata revision last applied (0: none yet): while the
        # metadata store's revision stays there, nothing needs reading again.
        self._applied_revision = 0
        # (topic, partition, replica) asking to rejoin the ISR, in the order
        # asked (a dict: which replica rejoins first must not depend on
        # string hashing, so a simulation seed replays the same anywhere).
        self._expand: dict[tuple[str, int, int], None] = {}
        self._task: asyncio.Task[None] | None = None
        self._keep_alive_task: asyncio.Task[None] | None = None
        self._last_synced_s = 0.0
        self._last_peer_states_s = 0.0
        self._last_unreachable_log_s = 0.0
        self._closing = False
        runtime.hooks.on_states_applied = self._reconcile
        runtime.hooks.on_isr_expand = self._request_expand

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
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="replication")
        self._keep_alive_task = loop.create_task(self._keep_alive(), name="store-lease")

    async def close(self) -> None:
        self._closing = True
        tasks = [f.stop() for f in self._fetchers.values()]
        for task in (self._task, self._keep_alive_task):
            if task is not None:
                task.cancel()
                tasks.append(task)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._fetchers.clear()
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
        """One round: read the metadata when it changed
        (which applies it and reconciles followers), act as controller if
        this node is, and move followers out of / into the ISR. A round in
        which nothing changed costs one small read of the metadata store's
        revision, whatever the number of partitions."""
        changed = await self._refresh_if_changed()
        try:
            decided = await self._link.run_controller_once()
        except LeaseNotFound:
            decided = 0
        if decided:
            changed = await self._refresh_if_changed() or changed
        if await self._maintain_isr():
            changed = await self._refresh_if_changed() or changed
        if changed:
            self._update_gauges()

    async def _refresh_if_changed(self) -> bool:
        """Reads and applies the metadata when its revision moved since the
        last time (the same revision is the same tree: a lease ending, a
        leader elected, an ISR changed all move it). Returns whether it did."""
        revision = await self._link.current_revision()
        if revision == self._applied_revision:
            return False
        await self._runtime.refresh_catalog()
        # What was applied is at least as new as `revision`: a change since
        # shows as another revision next time.
        self._applied_revision = revision
        return True

    async def _keep_alive(self) -> None:
        """Keeps the store's lease alive every TTL/3, in a task of its own:
        a long round of the sync loop (a controller deciding for a thousand
        partitions on a loaded machine) must not let the lease run out, or
        the store would be taken for dead."""
        while not self._closing:
            # The loop's own clock: a jump of the wall clock must not
            # stretch the wait past the lease.
            await asyncio.sleep(self._link.lease_ttl_s / 3)
            try:
                try:
                    await self._link.keep_registered(self._address, self._listeners)
                except LeaseNotFound:
                    await self._link.keep_registered(self._address, self._listeners)
            except ServiceError as exc:
                log.debug("store node %d: lease keep-alive: %s", self._node_id, exc.message)
                await asyncio.sleep(FOLLOWER_BACKOFF_MS / 1000)
            except Exception:
                log.exception("lease keep-alive failed")
                await asyncio.sleep(FOLLOWER_BACKOFF_MS / 1000)

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
        """Hands each leader's fetcher the partitions this node follows
        there (at their current leader epoch), starts fetchers for new
        sources and stops those left with nothing to copy. Runs when the
        metadata changed, never on a timer."""
        if self._closing:
            return
        wanted: dict[int, dict[PartitionKey, int]] = {}
        for part in self._runtime.partitions:
            if not part.closed and not part.is_leader and part.state.online:
                wanted.setdefault(part.state.leader, {})[
                    (part.topic.name, part.partition)] = part.state.leader_epoch
        for leader, fetcher in list(self._fetchers.items()):
            if leader not in wanted or fetcher.done():
                fetcher.stop()
                del self._fetchers[leader]
        for leader, partitions in wanted.items():
            if leader not in self._fetchers:
                self._fetchers[leader] = LeaderFetcher(self, leader)
            self._fetchers[leader].follow(partitions)

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
            # divergence_step answers AskAgain or Truncate: anything else is a bug.
            invariant(isinstance(step, Truncate),
                      f"{part.topic_partition}: divergence_step answered {step!r}")
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
        # Only partitions that may have a lagging follower, or a follower
        # asking to rejoin: an idle partition in sync is never looked at.
        check = {(p.topic.name, p.partition): p for p in self._runtime.take_followers_behind()}
        for topic, partition, _replica in expand:
            part = self._runtime.led_partition(topic, partition)
            if part is not None:
                check.setdefault((topic, partition), part)
        for key, part in check.items():
            if part.closed or not part.is_leader:
                continue
            part.expire_isr_additions(now_ms, self._runtime.config.replica_lag_time_max_ms)
            stored = view.states.get(key)
            if stored is None or stored != part.state:
                # The view is behind this replica's state. A follower that
                # asked is checked again at its next request once the state
                # is applied (Catalog._recheck_rejoin): never from an old
                # request, which may come from a store that has died since.
                continue
            after = None
            lagging = lagging_followers(
                isr=part.state.isr, leader=self._node_id,
                last_caught_up_ms=part.last_caught_up_ms, now_ms=now_ms,
                lag_time_max_ms=self._runtime.config.replica_lag_time_max_ms,
                follower_end_offsets=part.follower_end_offsets,
                leader_end_offset=part.log.durable_end_offset,
            )
            if lagging:
                after = shrink_isr(part.state, lagging)
                counter = metrics.ISR_SHRINKS
            else:
                for topic, partition, replica in expand:
                    # Still caught up now (the HW may have moved past it),
                    # and alive: a store whose lease ended (cut off from
                    # the metadata store, yet still fetching) stays out, as
                    # the controller would drop it again at once (Kafka's
                    # controller too keeps fenced brokers out of ISRs,
                    # KIP-841).
                    if ((topic, partition) == key and replica in view.live_stores
                            and self._runtime.may_rejoin_isr(part, replica)):
                        after = expand_isr(part.state, replica)
                        counter = metrics.ISR_EXPANDS
                        if after is not None:
                            break
            if after is None:
                continue
            added = set(after.isr) - set(part.state.isr)
            # Counted by the HW before the write is even sent: the write may
            # commit and the controller elect a new member before this
            # leader learns the outcome (a lost answer keeps them counted
            # until the next state, or expire_isr_additions).
            part.begin_isr_additions(added, now_ms)
            if not await self._link.update_state(key[0], key[1], view.state_revisions[key],
                                                 after):
                part.end_isr_additions(added)
            else:
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


@dataclass(slots=True)
class _Listed:
    """A partition as the leader's fetch session holds it: the replica
    object and the offset and epoch the leader was last told."""

    part: PartitionRuntime
    fetch_offset: int
    leader_epoch: int


class LeaderFetcher:
    """Copies every partition this store follows on one leader store, with
    one long-poll at a time in one fetch session (Kafka's fetcher per source
    broker, with KIP-227's sessions): a request lists only the partitions
    whose log end or leader epoch moved since the last one, and the leader
    answers only partitions with news. The work of a round trip is the
    partitions that moved, and partitions nobody writes cost nothing.

    Each partition first goes through the truncation step at its leader
    epoch (the module docstring), then is fetched. A partition added while a
    long-poll is parked ends that poll at once (a new leader's followers
    must not wait out another partition's poll), at the price of opening a
    new session."""

    def __init__(self, manager: ReplicaFetcherManager, leader: int) -> None:
        self._manager = manager
        self._runtime = manager._runtime
        self.leader = leader
        # Partitions to copy from this leader -> the leader epoch they are
        # followed at: those awaiting the truncation step, those fetched.
        self._to_truncate: dict[PartitionKey, int] = {}
        self._fetching: dict[PartitionKey, int] = {}
        # What the leader's session holds, and the fetched partitions whose
        # log end may have moved since it was told (listed next time).
        self._listed: dict[PartitionKey, _Listed] = {}
        self._moved: dict[PartitionKey, None] = {}
        # Refused partitions wait until then (loop time) before being listed.
        self._resting: dict[PartitionKey, float] = {}
        self._session_id = 0
        self._session_epoch = 0
        self._added = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"replica-fetcher-{leader}")

    def done(self) -> bool:
        return self._task.done()

    def stop(self) -> asyncio.Task[None]:
        self._task.cancel()
        return self._task

    def follow(self, partitions: Mapping[PartitionKey, int]) -> None:
        """The partitions to copy from this leader now, with their leader
        epochs; a new one (or one at a new epoch) starts at the truncation
        step."""
        for group in (self._to_truncate, self._fetching):
            for key, epoch in list(group.items()):
                if partitions.get(key) != epoch:
                    del group[key]
                    self._moved.pop(key, None)
                    self._resting.pop(key, None)
        added = False
        for key, epoch in partitions.items():
            if self._fetching.get(key) != epoch and self._to_truncate.get(key) != epoch:
                self._to_truncate[key] = epoch
                added = True
        if added:
            self._added.set()

    # ------------------------------------------------------------ the loop

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._runtime.storage_writable:
                # A fetch tells the leader this replica holds everything
                # below its log end, which a failed write left ahead of the
                # disk: no partition of this leader is truncated or fetched
                # until storage is back (memory rebuilt from disk). The
                # session goes too: the leader must learn every partition's
                # log end afresh, from the rebuilt replicas.
                self._forget_session()
                await asyncio.sleep(FOLLOWER_BACKOFF_MS * 10 / 1000)
                continue
            try:
                if self._to_truncate:
                    await self._truncate_all()
                wait_s = self._manager._fetch_wait_ms / 1000
                if self._to_truncate or self._resting:
                    # Something waits to be tried again soon: poll no longer.
                    wait_s = min(wait_s, FOLLOWER_BACKOFF_MS / 1000)
                if not self._fetching:
                    self._added.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._added.wait(), None if not self._to_truncate else wait_s)
                    continue
                self._added.clear()
                await self._fetch_once(loop.time(), wait_s)
            except asyncio.CancelledError:
                raise
            except ServiceError as exc:
                log.debug("fetching from store %d: %s", self.leader, exc.message)
                self._forget_session()
                await asyncio.sleep(FOLLOWER_BACKOFF_MS / 1000)
            except CorruptionError as exc:
                # Its own log, read to replay what the leader sent: damaged.
                self._runtime.report_damage(exc)
                self._forget_session()
                await asyncio.sleep(FOLLOWER_BACKOFF_MS / 1000)
            except Exception:
                log.exception("fetching from store %d failed", self.leader)
                self._forget_session()
                await asyncio.sleep(FOLLOWER_BACKOFF_MS / 1000)

    async def _truncate_all(self) -> None:
        """The truncation step of every partition awaiting it, side by
        side; a partition that fails it is tried again after a backoff."""
        pending = list(self._to_truncate.items())

        async def truncate(key: PartitionKey, epoch: int) -> bool:
            part = self._runtime.follower_partition(*key)
            if part is None or part.state.leader_epoch != epoch:
                return False
            try:
                await self._manager._truncate_to_leader(part, self.leader, epoch)
            except ServiceError as exc:
                log.debug("%s: truncation step against store %d at epoch %d: %s",
                          part.topic_partition, self.leader, epoch, exc.message)
                return False
            except CorruptionError as exc:
                # Its own log, read to truncate: damaged.
                self._runtime.report_damage(exc)
                return False
            return True

        results = await asyncio.gather(*(truncate(k, e) for k, e in pending))
        for (key, epoch), ok in zip(pending, results, strict=True):
            if ok and self._to_truncate.get(key) == epoch:
                del self._to_truncate[key]
                self._fetching[key] = epoch
                self._moved[key] = None

    def _forget_session(self) -> None:
        """The leader's session can no longer be trusted (an answer lost,
        a poll cut short): the next request opens a new one."""
        self._session_id = 0
        self._session_epoch = 0
        self._listed.clear()

    def _request(self, now_s: float) -> tuple[list[ReplicaFetchItem], list[PartitionKey]]:
        """The partitions to list (all in an opening, else those that moved)
        and those the session should forget."""
        if self._session_id == 0:
            self._listed.clear()
            candidates: list[PartitionKey] = list(self._fetching)
        else:
            candidates = [k for k in self._moved if k in self._fetching]
        forgotten = [k for k in self._listed if k not in self._fetching]
        for key in forgotten:
            del self._listed[key]
        items = []
        for key in candidates:
            until_s = self._resting.get(key)
            if until_s is not None:
                if until_s > now_s:
                    continue
                del self._resting[key]
            self._moved.pop(key, None)
            epoch = self._fetching[key]
            part = self._runtime.follower_partition(*key)
            if part is None or part.state.leader_epoch != epoch:
                continue  # the next reconcile moves it
            offset = part.log.log_end_offset
            listed = self._listed.get(key)
            if listed is not None and listed.part is part and (
                    listed.fetch_offset, listed.leader_epoch) == (offset, epoch):
                continue
            self._listed[key] = _Listed(part, offset, epoch)
            items.append(ReplicaFetchItem(key[0], key[1], offset, epoch,
                                          DEFAULT_REPLICA_FETCH_MAX_BYTES))
        return items, forgotten

    async def _fetch_once(self, now_s: float, wait_s: float) -> None:
        items, forgotten = self._request(now_s)
        if self._session_id == 0 and not items:
            # Nothing to open a session with yet (all resting).
            await asyncio.sleep(wait_s)
            return
        epoch = self._session_epoch + 1
        fetch = asyncio.ensure_future(self._manager._leaders.replica_fetch(
            self.leader, self._manager._node_id, items, max_wait_ms=int(wait_s * 1000),
            session_id=self._session_id, session_epoch=epoch, forgotten=forgotten))
        added = asyncio.ensure_future(self._added.wait())
        try:
            await asyncio.wait((fetch, added), return_when=asyncio.FIRST_COMPLETED)
        finally:
            added.cancel()
            if not fetch.done():
                fetch.cancel()
        if fetch.cancelled() or not fetch.done():
            # A partition was added: start it now, in a new session.
            self._forget_session()
            return
        session_id, outcomes = fetch.result()
        if session_id == 0:
            self._forget_session()
            return
        self._session_id, self._session_epoch = session_id, epoch
        await self._apply(outcomes)

    async def _apply(self, outcomes: Sequence[ReplicaFetchOutcome]) -> None:
        """Appends what the leader sent (each partition through the same
        replay as every append), handles refusals, and waits until the new
        batches are on disk: the next request reports them as copied."""
        written: list[tuple[PartitionKey, asyncio.Future[None]]] = []
        for outcome in outcomes:
            key = (outcome.topic, outcome.partition)
            listed = self._listed.get(key)
            epoch = self._fetching.get(key)
            part = self._runtime.follower_partition(*key)
            if epoch is None:
                continue
            if (listed is None or part is not listed.part or epoch != listed.leader_epoch
                    or part.state.leader_epoch != epoch):
                # The replica changed (it leads now, or was truncated and
                # reopened) while the answer came: not this answer's to
                # append to; list it afresh.
                self._moved[key] = None
                continue
            if outcome.error is not None:
                # The leader dropped it from the session.
                del self._listed[key]
                await self._refused(key, part, outcome, outcome.error)
                continue
            if outcome.batches and part.log.log_end_offset != listed.fetch_offset:
                self._moved[key] = None
                continue
            try:
                done = self._runtime.append_replicated(
                    part, outcome.batches, leader_high_watermark=outcome.high_watermark)
            except ServiceError as exc:
                log.debug("%s: replicated append: %s", part.topic_partition, exc.message)
                self._moved[key] = None
                continue
            if outcome.batches:
                self._moved[key] = None
                metrics.REPLICA_LAG_OFFSETS.labels(key[0], str(key[1])).set(
                    max(0, outcome.log_end_offset - part.log.log_end_offset))
            if done is not None:
                written.append((key, done))
        for key, done in written:
            try:
                await done
            except ServiceError as exc:
                log.debug("%s-%d: replicated write: %s", key[0], key[1], exc.message)

    async def _refused(self, key: PartitionKey, part: PartitionRuntime,
                       outcome: ReplicaFetchOutcome, error: ServiceError) -> None:
        """A partition the leader refused. Out of range below the leader's
        log start (this replica came back empty, or retention went past
        it): start over there. Out of range otherwise: check against the
        leader again (the truncation step). Anything else (an epoch the
        leader has not learned yet, say): list it again after a backoff."""
        if error.code is ErrorCode.OFFSET_OUT_OF_RANGE:
            if outcome.log_start_offset >= 0 and part.log.log_end_offset < (
                    outcome.log_start_offset):
                await self._runtime.reset_replica(part, outcome.log_start_offset)
                self._moved[key] = None
            else:
                epoch = self._fetching.pop(key)
                self._to_truncate[key] = epoch
            return
        log.debug("%s: replica fetch refused: %s", part.topic_partition, error.message)
        self._resting[key] = asyncio.get_running_loop().time() + FOLLOWER_BACKOFF_MS / 1000
        self._moved[key] = None
