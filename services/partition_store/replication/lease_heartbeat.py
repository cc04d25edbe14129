"""The store's etcd lease, kept alive from a thread of its own.

Why a thread. The lease says "this store is alive"; when it ends, the
controller moves every partition the store leads, and the new leaders
truncate the tails the old one had not replicated yet. Kept alive from the
store's event loop, the lease measured the loop's latency instead: under
overload (1,000 partitions, three stores and four producers on two CPUs)
the loop-lag probe saw callbacks run 1-2.5 s late, a 3 s lease kept alive
every second ran out, and the stores lost their partitions in the middle of
the load. The moves, truncations and retries then made them busier still:
in those runs requests timed out for two minutes and deliveries failed.
Kafka's brokers heartbeat to the controller from a thread of their own
(BrokerLifecycleManager's event queue) for the same reason.

What the lease still means. A store keeps it while its process runs and its
event loop makes progress: each beat the thread schedules a callback on the
store's loop, and it keeps the lease alive only while such a callback has
run within `loop_stall_limit_s` (three lease TTLs by default: 9 s at the
default 3 s TTL, Kafka's default broker session). So:

* a killed or paused (SIGSTOP) store stops this thread too: its lease ends
  one TTL later, as before;
* a store cut off from etcd cannot keep it from either place;
* a store whose loop is wedged (a bug, a blocking call that never returns)
  loses its lease `loop_stall_limit_s` plus one TTL after its loop stopped;
* a store whose loop runs late under load keeps its partitions.

The event loop's own keep-alive task (replication/fetcher.py) still runs,
without a call to etcd of its own: it asks this thread whether the lease
is still kept (`keeps`), registers the store again under a new lease when
it is not, and tells the thread which lease to keep (`keep`). The thread
only ever keeps alive; it never grants, revokes or writes.

It talks to etcd through an EtcdMetadataStore of its own, on an event loop
of its own (the client's channels belong to the loop that made them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

from ...common.metadata.etcd import EtcdMetadataStore
from ...common.metadata.store import MetadataUnavailable

log = logging.getLogger(__name__)

# How many lease TTLs the store's event loop may go without running a
# callback before the thread stops keeping the lease alive.
DEFAULT_LOOP_STALL_LIMIT_TTLS = 3
# How long stop() waits for the thread (one keep-alive call at most).
STOP_JOIN_TIMEOUT_S = 5.0


def _nothing() -> None:
    return None


class LeaseHeartbeat:
    """Keeps one etcd lease alive from a daemon thread (module docstring).

    `start(loop)` begins; `keep(lease_id)` says which lease (None: none, for
    example while the store registers again); `stop()` ends the thread.
    `keep` may be called from any thread."""

    def __init__(self, endpoints: Sequence[str], *, timeout_ms: int, interval_s: float,
                 loop_stall_limit_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s {interval_s}; expected > 0")
        if loop_stall_limit_s <= 0:
            raise ValueError(f"loop_stall_limit_s {loop_stall_limit_s}; expected > 0")
        self._endpoints = tuple(endpoints)
        self._timeout_ms = timeout_ms
        self._interval_s = interval_s
        self._loop_stall_limit_s = loop_stall_limit_s
        # Written by the store's loop (keep, _ticked) and read by the thread:
        # single assignments of immutable values, which the GIL makes atomic.
        self._lease: int | None = None
        self._last_tick_s = time.monotonic()
        self._watched: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # Wakes the thread's wait early (set once its loop runs).
        self._wake: Callable[[], object] = _nothing
        # Counted for tests and logs: keep-alives sent, and beats withheld
        # because the store's loop had stalled past the limit.
        self.keep_alives_sent = 0
        self.beats_withheld = 0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begins beating; `loop` is the store's event loop, whose progress
        the lease stands for."""
        if self._thread is not None:
            raise RuntimeError("the lease heartbeat is already started")
        self._watched = loop
        self._last_tick_s = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="store-lease-heartbeat",
                                        daemon=True)
        self._thread.start()

    def keep(self, lease_id: int | None) -> None:
        self._lease = lease_id

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def keeps(self, lease_id: int) -> bool:
        """Whether the thread still keeps `lease_id`: False once a keep-alive
        found it ended (then the store registers again)."""
        return self._lease == lease_id

    async def stop(self) -> None:
        """Stops beating (the lease is left to the caller: revoke it, or let
        it run out)."""
        self._lease = None
        self._stopping.set()
        with contextlib.suppress(RuntimeError):  # its loop has ended already
            self._wake()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join, STOP_JOIN_TIMEOUT_S)

    # ------------------------------------------------------------ the thread

    def _ticked(self) -> None:
        """Runs on the store's loop: it made progress now."""
        self._last_tick_s = time.monotonic()

    def _run(self) -> None:
        try:
            asyncio.run(self._beat())
        except Exception:
            # The store's loop sees the thread gone (`running`) and keeps
            # the lease alive itself again.
            log.exception("the lease heartbeat thread failed; the event loop keeps the lease")

    async def _beat(self) -> None:
        etcd = EtcdMetadataStore(self._endpoints, timeout_ms=self._timeout_ms)
        woken = asyncio.Event()
        self._wake = partial(asyncio.get_running_loop().call_soon_threadsafe, woken.set)
        stalled = False
        try:
            while not self._stopping.is_set():
                watched = self._watched
                if watched is None or watched.is_closed():
                    return
                try:
                    watched.call_soon_threadsafe(self._ticked)
                except RuntimeError:  # the store's loop closed meanwhile
                    return
                # Wait one interval, or less when stop() is called.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), self._interval_s)
                lease = self._lease
                if lease is None or self._stopping.is_set():
                    continue
                stall_s = time.monotonic() - self._last_tick_s
                if stall_s > self._loop_stall_limit_s:
                    self.beats_withheld += 1
                    if not stalled:
                        log.warning(
                            "the store's event loop has not run for %.1f s (limit %.1f s): "
                            "its lease %d is no longer kept alive, so its partitions move "
                            "to other stores", stall_s, self._loop_stall_limit_s, lease)
                    stalled = True
                    continue
                if stalled:
                    log.info("the store's event loop runs again; keeping its lease alive")
                    stalled = False
                try:
                    alive = await etcd.keep_alive(lease)
                except MetadataUnavailable as exc:
                    # The store's sync loop reports etcd being away
                    # (replication/fetcher.py); the next beat tries again.
                    log.debug("lease heartbeat: %s", exc)
                    continue
                self.keep_alives_sent += 1
                if not alive and self._lease == lease:
                    # Gone (it ran out, or etcd lost it): the loop's task
                    # registers again and hands over the new one.
                    self._lease = None
        finally:
            await etcd.close()
