"""Partition counts of topics, read from the store that keeps the catalog and
cached for a while.

The coordinators need them on request paths (a group's assignment, a
transaction's partitions), where one Metadata round trip per request would
double the request's cost; a count a little stale is harmless there, and a
caller that finds a partition missing can ask again with `refresh=True`
(a topic created a moment ago).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from oncelog.wire.errors import ErrorCode

from ..kernel.errors import ServiceError

# Topics that do not exist are cached too (a group may subscribe to one that
# is created later). Past this many entries those are forgotten, so clients
# naming ever new unknown topics cannot grow the cache without bound.
MAX_ENTRIES = 10_000


class CatalogReader(Protocol):
    """What the cache needs of the store (services.common.rpc.store_client)."""

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]: ...


class PartitionCounts:
    def __init__(self, store: CatalogReader, now_ms: Callable[[], int], max_age_ms: int) -> None:
        self._store = store
        self._now_ms = now_ms
        self._max_age_ms = max_age_ms
        self._counts: dict[str, int] = {}
        self._read_ms: dict[str, int] = {}

    async def get(self, topics: Iterable[str], *, refresh: bool = False) -> dict[str, int]:
        """Each topic's partition count, 0 for a topic that does not exist.
        Counts older than the cache's max age (all of them with `refresh`)
        are read again; a store that cannot be read is
        COORDINATOR_NOT_AVAILABLE (retriable: the client asks again)."""
        wanted = sorted(set(topics))
        now = self._now_ms()
        stale = [t for t in wanted
                 if refresh or t not in self._read_ms
                 or now - self._read_ms[t] > self._max_age_ms]
        if stale:
            try:
                fresh = await self._store.partition_counts(stale)
            except ServiceError as exc:
                raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                   f"reading topic metadata: {exc.message}") from exc
            for t in stale:
                self._counts[t] = fresh.get(t, 0)
                self._read_ms[t] = now
            if len(self._counts) > MAX_ENTRIES:
                self._forget_absent(keep=wanted)
        return {t: self._counts[t] for t in wanted}

    def _forget_absent(self, keep: list[str]) -> None:
        absent = [t for t, n in self._counts.items() if n == 0 and t not in keep]
        for t in absent:
            del self._counts[t]
            del self._read_ms[t]
