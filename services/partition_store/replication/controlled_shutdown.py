"""Kafka's controlled shutdown for one store (docs/replication.md,
"Controlled shutdown").

A store told to stop (SIGTERM) hands its leaderships over before it drains,
so that producers and consumers move to the new leaders at once instead of
waiting for its lease to end:

1. It gives the controller role up if it holds it, and asks the controller
   to move its leaderships (MetadataLink.begin_controlled_shutdown: a key
   under its lease in the metadata store, the way every leader change goes).
2. The controller moves each partition it leads to the first other live
   in-sync replica, at the next leader epoch, leaving the ISR as it is
   (core/replicas.py move_leader_off). A partition with no other in-sync
   replica stays, as in Kafka.
3. Meanwhile the store keeps serving: its replica fetcher manager goes on reading
   the metadata every 100 ms and applies each move, so it answers
   NOT_LEADER_OR_FOLLOWER for a moved partition (failing the appends that
   waited for acknowledgement there: the producers retry at the new leader,
   deduplicated) and starts copying from the new leader as a follower — so
   the new leader's acks=all appends find it in sync.
4. It waits, bounded by --controlled-shutdown-timeout-ms, until it leads
   nothing that could still move; then the drain begins as before (new
   requests refused, running ones finished, snapshots written), and its
   lease is revoked last, which takes it out of the ISRs.

When the wait runs out (the metadata store out of reach, no controller),
the partitions still led here move the way a crashed store's do, once its
lease ends: a controlled shutdown is never worse than a kill.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from ...common.kernel.errors import ServiceError
from ...common.metadata.store import LeaseNotFound
from ..core.replicas import PartitionState
from ..runtime import StoreRuntime
from .metadata_link import MetadataLink, TopicPartitionKey

log = logging.getLogger("oncelog.partition_store.controlled_shutdown")

# Kafka waits tens of seconds for its controller (controlled.shutdown.*);
# here a move is one etcd transaction and the stores read the metadata
# every 100 ms, so a hand-over takes a few hundred milliseconds unless the
# metadata store is out of reach — which waiting longer would not mend.
# The Helm chart's terminationGracePeriodSeconds covers it plus the drain.
DEFAULT_CONTROLLED_SHUTDOWN_TIMEOUT_MS = 10_000
# How often the wait looks at what the store still leads (it applies the
# metadata every 100 ms, replication.DEFAULT_METADATA_SYNC_INTERVAL_MS).
HANDOVER_POLL_INTERVAL_MS = 50


@dataclass(frozen=True, slots=True)
class HandoverReport:
    """What a controlled shutdown achieved, for the log and the tests."""

    # Partitions this store led when it began.
    led_before: int
    # Of those, the ones another store leads by the end of the wait.
    handed_over: int
    # Partitions still led here that no other in-sync replica could take.
    kept: tuple[str, ...]
    # Partitions that could have moved but had not when the wait ran out.
    timed_out: tuple[str, ...]
    duration_ms: int


class ControlledShutdown:
    """Hands one store's leaderships over before it drains (the module
    docstring): asks the controller, then waits until the store leads
    nothing that could move, or `timeout_ms` has passed."""

    def __init__(self, runtime: StoreRuntime, link: MetadataLink, *, timeout_ms: int) -> None:
        if timeout_ms <= 0:
            raise ValueError(f"controlled shutdown timeout is {timeout_ms} ms; it must be > 0")
        self._runtime = runtime
        self._link = link
        self._timeout_ms = timeout_ms
        self._node_id = runtime.config.node_id

    def _led(self) -> dict[TopicPartitionKey, PartitionState]:
        """The partitions this store leads, as its runtime applied them (what
        it answers producers by)."""
        return {(p.topic.name, p.partition): p.state for p in self._runtime.partitions
                if not p.closed and p.is_leader}

    async def run(self) -> HandoverReport:
        clock_ms = self._runtime.clock_ms
        started_ms = clock_ms()
        deadline_ms = started_ms + self._timeout_ms
        led_before = set(self._led())
        log.info("store node %d: controlled shutdown: handing over %d leaderships (for at "
                 "most %d ms)", self._node_id, len(led_before), self._timeout_ms)
        asked = False
        last_error: str | None = None
        while True:
            view = self._link.view
            # Asked once, and again whenever the request is not in the
            # metadata (a replaced lease took it away) or this store still
            # holds the controller role.
            if not asked or self._node_id not in view.shutting_down \
                    or view.controller == self._node_id:
                try:
                    await self._link.begin_controlled_shutdown()
                    asked = True
                except (ServiceError, LeaseNotFound) as exc:
                    last_error = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            pending = self._link.leaderships_to_hand_over(self._led())
            if not pending or clock_ms() >= deadline_ms:
                break
            await asyncio.sleep(HANDOVER_POLL_INTERVAL_MS / 1000)
        led_after = self._led()
        pending = self._link.leaderships_to_hand_over(led_after)
        report = HandoverReport(
            led_before=len(led_before),
            handed_over=len(led_before - set(led_after)),
            kept=tuple(sorted(f"{t}-{p}" for (t, p) in set(led_after) - set(pending))),
            timed_out=tuple(sorted(f"{t}-{p}" for (t, p) in pending)),
            duration_ms=clock_ms() - started_ms,
        )
        if report.timed_out:
            log.warning(
                "store node %d: controlled shutdown ran out of time after %d ms with %d "
                "leaderships not handed over (%s%s); they move when its lease ends%s",
                self._node_id, report.duration_ms, len(report.timed_out),
                ", ".join(report.timed_out[:5]), ", ..." if len(report.timed_out) > 5 else "",
                f" (last error: {last_error})" if last_error else "")
        else:
            log.info("store node %d: controlled shutdown handed over %d of %d leaderships in "
                     "%d ms%s", self._node_id, report.handed_over, report.led_before,
                     report.duration_ms,
                     f"; kept {len(report.kept)} with no other in-sync replica "
                     f"({', '.join(report.kept[:5])})" if report.kept else "")
        return report
