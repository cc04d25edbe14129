"""What every job of a store node shares: the configuration, the database,
the group-commit writer, the clock, the lifecycle flags (closing, closed),
the background tasks, and the hooks the server and the replica fetcher manager
plug in (StoreHooks).

StoreShared owns no partition and no topic (catalog.py does): it answers
the questions each job asks before and after it touches a partition: may a
write be taken now (check_accepting), is a snapshot due (maybe_snapshot),
are these appends durable yet (await_durable), and what to do with damaged
bytes (report_damage).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from oncelog.wire.errors import ErrorCode

from ..common.kernel.errors import ServiceError
from . import metrics
from .log.partition import PartitionRuntime
from .storage.port import CorruptionError, KeyValueStore
from .writer import GroupCommitWriter

if TYPE_CHECKING:
    from .runtime import StoreConfig

log = logging.getLogger("oncelog.partition_store")

DEFAULT_PRODUCE_TIMEOUT_MS = 30_000


class StoreHooks:
    """The callables the server and the replica fetcher manager plug into a store
    after building it (each job reads them when it needs them, so they may
    be set after the runtime is made)."""

    def __init__(self, config: StoreConfig) -> None:
        layout = config.layout
        # Called after each catalog/state refresh (the replica fetcher manager
        # starts and stops followers there).
        self.on_states_applied: Callable[[], None] | None = None
        # Called with damage found in stored data (the server records it and
        # stops the process: damage.py); None: only answered as an error.
        self.on_damage: Callable[[CorruptionError], None] | None = None
        # Called when a follower outside the ISR has caught up (the replica
        # manager adds it back through the metadata store).
        self.on_isr_expand: Callable[[PartitionRuntime, int], None] | None = None
        # Every store's address by node id: the layout's, or (replicated)
        # also those that joined later (the metadata link's).
        self.store_addresses: Callable[[], Mapping[int, str]] = (
            lambda: dict(enumerate(layout.stores)))
        # The same for the stores' token listeners (--token-listen); a store
        # missing here has none.
        self.token_store_addresses: Callable[[], Mapping[int, str]] = (
            lambda: dict(enumerate(layout.token_stores)))
        # The same for the stores' Kafka listeners (--kafka-listen).
        self.kafka_store_addresses: Callable[[], Mapping[int, str]] = (
            lambda: dict(enumerate(layout.kafka_stores)))
        # Called with (topic, partition, leads, leader epoch) when this store
        # starts or stops leading a partition of an internal topic, or leads
        # it at a new epoch: the coordinators in this store's process that
        # follow leadership take their state partitions over or let them go
        # (rpc/hosting.py).
        self.on_leadership: Callable[[str, int, bool, int], None] | None = None
        # Replicated clusters: the stores whose lease is alive, by node id
        # (the metadata link's); None: every store counts as alive.
        self.live_stores: Callable[[], Collection[int]] | None = None
        # Replicated clusters: starts replica moves (the metadata link's).
        self.reassigner: Callable[
            [Mapping[tuple[str, int], Sequence[int]]],
            Awaitable[dict[tuple[str, int], ServiceError | None]]] | None = None

    def live(self) -> Collection[int] | None:
        """The stores whose lease is alive (live_stores), or None where
        this store does not know (unreplicated: every store counts)."""
        return self.live_stores() if self.live_stores is not None else None


class StoreShared:
    def __init__(self, store: KeyValueStore, config: StoreConfig, *,
                 clock_ms: Callable[[], int], hooks: StoreHooks) -> None:
        self.config = config
        self.layout = config.layout
        self.store = store
        self.clock_ms = clock_ms
        self.hooks = hooks
        self.writer = GroupCommitWriter(store, fsync=config.fsync)
        # begin_shutdown sets closing (no new writes, long-polls answer);
        # close sets closed (not even replicated appends).
        self.closing = False
        self.closed = False
        self.closed_event = asyncio.Event()
        self.background: set[asyncio.Task[None]] = set()

    def check_accepting(self) -> None:
        if self.closing:
            raise ServiceError(
                ErrorCode.SHUTTING_DOWN,
                f"store node {self.config.node_id} is shutting down; retry later",
            )
        if self.writer.failure is not None:
            metrics.STORAGE_REFUSED_APPENDS.labels(
                "disk_full" if self.writer.disk_full else "storage_failed").inc()
        self.writer.check_healthy()

    def report_damage(self, error: CorruptionError) -> ServiceError:
        """Stored bytes failed a checksum: counted, logged, handed to
        `on_damage` (the server stops the process: damage.py), and answered
        as STORAGE_ERROR; the bytes themselves are never served."""
        metrics.CORRUPT_READS.inc()
        log.critical("store node %d: stored data is damaged: %s (file %s)", self.config.node_id,
                     error, error.path or "unknown")
        if self.hooks.on_damage is not None:
            self.hooks.on_damage(error)
        return ServiceError(
            ErrorCode.STORAGE_ERROR,
            f"store node {self.config.node_id}: stored data is damaged ({error}); it is not "
            f"served: retry (another replica, or this one rebuilt)")

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    def maybe_snapshot(self, part: PartitionRuntime, now_ms: int) -> None:
        if part.snapshot_due(
            now_ms=now_ms, every_batches=self.config.snapshot_interval_batches,
            every_ms=self.config.snapshot_interval_ms,
        ):
            group = part.build_snapshot(now_ms=now_ms)
            if group is not None:
                self.writer.submit(group)

    async def await_durable(
        self, waits: dict[int, asyncio.Future[None]], timeout_ms: int
    ) -> dict[int, ServiceError]:
        """Waits for the group commits of `waits` (index -> future) up to
        timeout_ms (0: the default); returns the failed ones' errors."""
        return await await_acks(waits, timeout_ms)


async def await_acks(
    waits: dict[int, asyncio.Future[None]], timeout_ms: int
) -> dict[int, ServiceError]:
    """StoreShared.await_durable's wait (a method there, so that the
    simulation can swap it for a store that answers too early)."""
    if not waits:
        return {}
    timeout_s = (timeout_ms or DEFAULT_PRODUCE_TIMEOUT_MS) / 1000
    shields = [asyncio.shield(f) for f in waits.values()]
    await asyncio.wait(shields, timeout=timeout_s)
    for shield in shields:
        if not shield.done():
            # The request stops waiting; the append goes on. Cancelled, the
            # shield is never handed the append's outcome: were the append
            # to fail later (leadership moved after the request timed out),
            # asyncio would log the failure as an exception nobody
            # retrieved, once for every timed-out append.
            shield.cancel()
        elif not shield.cancelled():
            # The outcomes are read below from the futures themselves; a
            # shield that failed (leadership moved while the append waited
            # for its acks) is read here so that asyncio does not log it as
            # an exception nobody retrieved. Read in place rather than by a
            # done callback, which would add a step to the event loop's
            # schedule (and move every simulation seed).
            shield.exception()
    errors: dict[int, ServiceError] = {}
    for index, future in waits.items():
        if not future.done():
            errors[index] = ServiceError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"was not durable within {timeout_s * 1000:.0f} ms",
            )
        elif future.exception() is not None:
            failure = future.exception()
            errors[index] = failure if isinstance(failure, ServiceError) else ServiceError(
                ErrorCode.STORAGE_ERROR, repr(failure)
            )
    return errors


def durable_callback(
    part: PartitionRuntime, base_offset: int, next_offset: int
) -> Callable[[], None]:
    def on_durable() -> None:
        part.on_durable(base_offset, next_offset)

    return on_durable
