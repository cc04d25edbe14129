"""Every service's ACLs: read from the internal topic `__acls` and replayed
(security.acl_records) into an Authorizer that is swapped whole, so a
decision never sees half an update.

The watcher reads `__acls` from its leader through the service's own store
client (the partition store too: through its own client, to whichever store
leads the partition), every `refresh_interval_ms`: from where it stopped to
the high watermark, so each round costs one small Fetch when nothing
changed. An ACL change therefore reaches every service within about one
refresh interval (plus a Fetch). A new leader whose high watermark is still
below where the watcher stopped has nothing new for it, and the ACLs stay
as they are; a log that no longer reaches that offset at all
(OFFSET_OUT_OF_RANGE: a single-copy store wiped, an unclean election) is
read again from its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from oncelog.wire.errors import ErrorCode

from ..kernel import durable, metrics
from ..kernel.errors import ServiceError
from ..rpc.store_client import ReadResult
from .acl_records import ACLS_TOPIC, AclState, replay
from .authorizer import Authorizer, AuthorizerConfig

log = logging.getLogger("oncelog.acls")

DEFAULT_ACL_REFRESH_INTERVAL_MS = 1000
ACLS_PARTITION = 0
# A failing read is logged at WARNING at most this often.
_FAILURE_LOG_INTERVAL_S = 30.0


class LogReader(Protocol):
    """What the watcher reads `__acls` through (rpc/store_client.py's StoreClient)."""

    async def read(self, topic: str, partition: int, from_offset: int, *,
                   max_bytes: int = ...) -> ReadResult: ...


class AclWatcher:
    """The current ACLs of one process (guard.AclSource)."""

    def __init__(self, reader: LogReader, *, config: AuthorizerConfig,
                 refresh_interval_ms: int = DEFAULT_ACL_REFRESH_INTERVAL_MS) -> None:
        if refresh_interval_ms < 1:
            raise ValueError(f"ACL refresh interval is {refresh_interval_ms} ms; it must be >= 1")
        self._reader = reader
        self._refresh_interval_s = refresh_interval_ms / 1000
        self._authorizer = Authorizer(config=config)
        self._state = AclState()
        self._next_offset = 0
        self._loaded = False
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._last_failure_log_s: float | None = None

    @property
    def authorizer(self) -> Authorizer:
        return self._authorizer

    @property
    def loaded(self) -> bool:
        """Whether `__acls` has been read to its end at least once."""
        return self._loaded

    @property
    def applied_offset(self) -> int:
        """The offset up to which the ACLs are read (-1: not yet)."""
        return self._next_offset if self._loaded else -1

    async def refresh(self) -> Authorizer:
        """Reads `__acls` from where the last read stopped to its high
        watermark and swaps in the new ACLs; returns them. Raises
        ServiceError when the topic's leader cannot be read (the old ACLs
        stay in effect)."""
        async with self._lock:
            state, offset = self._state, self._next_offset
            reset = False
            while True:
                try:
                    result = await self._reader.read(ACLS_TOPIC, ACLS_PARTITION, offset)
                except ServiceError as exc:
                    if exc.code is not ErrorCode.OFFSET_OUT_OF_RANGE or reset:
                        raise
                    # The log no longer reaches where we stopped (a single-copy
                    # store wiped, an unclean leader election): read it again
                    # from its start.
                    reset = True
                    state, offset = AclState(), 0
                    continue
                if result.high_watermark < offset:
                    # A new leader whose high watermark has not caught up with
                    # what we read already: nothing new yet. (Starting over
                    # from its high watermark would drop ACLs for a moment.)
                    break
                try:
                    for entry in result.entries:
                        replay(state, entry.key, entry.value)
                except durable.CorruptValueError as exc:
                    raise ServiceError(ErrorCode.CORRUPT_MESSAGE,
                                       f"{ACLS_TOPIC} holds a record that cannot be read: "
                                       f"{exc}") from exc
                progressed = result.next_offset > offset
                offset = max(result.next_offset, offset)
                if not progressed or offset >= result.high_watermark:
                    break
            first = not self._loaded
            self._state, self._next_offset, self._loaded = state, offset, True
            bindings = state.bindings()
            if bindings != self._authorizer.bindings:
                self._authorizer = self._authorizer.with_bindings(bindings)
                if not first:
                    log.info("ACLs changed (read up to %s offset %d): %d bindings", ACLS_TOPIC,
                             offset, len(bindings))
            if first:
                log.info("ACLs loaded from %s (up to offset %d): %d bindings", ACLS_TOPIC,
                         offset, len(bindings))
            metrics.ACL_BINDINGS.set(len(bindings))
            metrics.ACL_APPLIED_OFFSET.set(offset)
            return self._authorizer

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self.refresh()
            except ServiceError as exc:
                now_s = loop.time()
                if (self._last_failure_log_s is None
                        or now_s - self._last_failure_log_s >= _FAILURE_LOG_INTERVAL_S):
                    self._last_failure_log_s = now_s
                    level = logging.WARNING if self._loaded else logging.INFO
                    log.log(level, "cannot read %s yet (%s ACLs stay in effect): %s", ACLS_TOPIC,
                            "the last read" if self._loaded else "no", exc)
            await asyncio.sleep(self._refresh_interval_s)

    def start(self) -> None:
        """Starts reading in the background (the first read right away)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
