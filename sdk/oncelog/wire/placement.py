"""Where a partition lives by default, as every process of a cluster (and
the local cluster that lays one out) computes it.

A topic's partition p starts at store index (stable_hash(topic) + p): its
single copy in a cluster without replication, its preferred leader in a
replicated one. A transaction coordinator that runs in a store's process
(`--transaction-coordinator`) is placed by the same rule, so that the
`__transaction_state` partitions it owns are led, while their preferred
leaders lead, by the store it runs in.
"""

from __future__ import annotations

import zlib

TRANSACTION_STATE_TOPIC = "__transaction_state"


def stable_hash(key: str) -> int:
    """A hash that is the same in every process and release (unlike hash())."""
    return zlib.crc32(key.encode())


def preferred_store(topic: str, partition: int, store_count: int) -> int:
    """The store index that holds (or prefers to lead) a partition."""
    return (stable_hash(topic) + partition) % store_count


def store_of_coordinator(coordinator: int, store_count: int) -> int:
    """The store that runs transaction coordinator `coordinator` when each
    of `store_count` stores runs one. Coordinator c owns the
    `__transaction_state` partitions p with p % store_count == c, and every
    one of them prefers the store this returns."""
    return preferred_store(TRANSACTION_STATE_TOPIC, coordinator, store_count)
