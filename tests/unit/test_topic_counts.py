"""The coordinators' cache of topic partition counts (services.common.metadata.topic_counts).

Goal: counts are read from the catalog once and served from memory until
they are older than the cache's max age; `refresh` reads them again at
once (a topic created a moment ago); a topic that does not exist counts 0;
a catalog that cannot be read is a retriable COORDINATOR_NOT_AVAILABLE.
Method: a fake catalog that records every read and a clock the test moves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from oncelog.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.common.metadata import topic_counts
from services.common.metadata.topic_counts import PartitionCounts


class Catalog:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {"a": 3}
        self.reads: list[list[str]] = []
        self.down = False

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        self.reads.append(list(topics))
        if self.down:
            raise ServiceError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "store 0 is restarting")
        return {t: n for t, n in self.counts.items() if t in topics}


def test_counts_are_read_once_then_served_until_they_are_older_than_the_max_age() -> None:
    catalog, now_ms = Catalog(), [1_000]
    counts = PartitionCounts(catalog, lambda: now_ms[0], max_age_ms=500)

    async def scenario() -> None:
        assert await counts.get(["a", "b"]) == {"a": 3, "b": 0}
        assert await counts.get(["a"]) == {"a": 3}
        assert catalog.reads == [["a", "b"]]
        catalog.counts["b"] = 2
        now_ms[0] += 500
        assert await counts.get(["b"]) == {"b": 0}  # not older than 500 ms yet
        now_ms[0] += 1
        assert await counts.get(["a", "b"]) == {"a": 3, "b": 2}
        assert catalog.reads == [["a", "b"], ["a", "b"]]

    asyncio.run(scenario())


def test_refresh_reads_the_named_topics_again_at_once() -> None:
    catalog = Catalog()
    counts = PartitionCounts(catalog, lambda: 0, max_age_ms=60_000)

    async def scenario() -> None:
        assert await counts.get(["a", "new"]) == {"a": 3, "new": 0}
        catalog.counts["new"] = 1
        assert await counts.get(["new"]) == {"new": 0}
        assert await counts.get(["new"], refresh=True) == {"new": 1}
        # The refreshed count is what later reads are served.
        assert await counts.get(["a", "new"]) == {"a": 3, "new": 1}
        assert catalog.reads == [["a", "new"], ["new"]]

    asyncio.run(scenario())


def test_an_unreadable_catalog_is_retriable_and_caches_nothing() -> None:
    catalog = Catalog()
    catalog.down = True
    counts = PartitionCounts(catalog, lambda: 0, max_age_ms=60_000)

    async def scenario() -> None:
        with pytest.raises(ServiceError) as info:
            await counts.get(["a"])
        assert info.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert info.value.code.retriable
        assert "store 0 is restarting" in info.value.message
        catalog.down = False
        assert await counts.get(["a"]) == {"a": 3}

    asyncio.run(scenario())


def test_unknown_topics_are_forgotten_past_the_cache_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(topic_counts, "MAX_ENTRIES", 3)
    catalog = Catalog()
    counts = PartitionCounts(catalog, lambda: 0, max_age_ms=60_000)

    async def scenario() -> None:
        await counts.get(["a", "x1", "x2"])
        await counts.get(["x3"])  # a fourth entry: x1 and x2 are forgotten
        catalog.reads.clear()
        assert await counts.get(["a", "x3"]) == {"a": 3, "x3": 0}
        assert catalog.reads == []
        assert await counts.get(["x1"]) == {"x1": 0}
        assert catalog.reads == [["x1"]]

    asyncio.run(scenario())
