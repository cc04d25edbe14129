"""Where a partition lives by default, as every process of a cluster (and
the local cluster that lays one out) computes it.

A topic's partition p starts at store index (stable_hash(topic) + p): its
single copy in a cluster without replication, its preferred leader in a
replicated one. A transaction coordinator that runs in a store's process
(`--transaction-coordinator`) is placed by the same rule, so that the
`__transaction_state` partitions it owns are led, while their preferred
leaders lead, by the store it runs in; a group coordinator
(`--group-coordinator`) likewise with its `__consumer_offsets` partitions.
"""

from __future__ import annotations

import zlib

TRANSACTION_STATE_TOPIC = "__transaction_state"
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"


def stable_hash(key: str) -> int:
    """A hash that is the same in every process and release (unlike hash())."""
    return zlib.crc32(key.encode())


def state_partition(key: str, partition_count: int) -> int:
    """The partition of a coordinator's state topic that holds `key` (a
    transactional id in `__transaction_state`, a group id in
    `__consumer_offsets`)."""
    return stable_hash(key) % partition_count


def owner_of_state_partition(partition: int, coordinator_count: int) -> int:
    """The coordinator (of either kind) that owns a partition of its state topic."""
    return partition % coordinator_count


def preferred_store(topic: str, partition: int, store_count: int) -> int:
    """The store index that holds (or prefers to lead) a partition."""
    return (stable_hash(topic) + partition) % store_count


# With one coordinator of a kind per store, coordinator c owns the partitions
# p of its state topic with p % store_count == c (the layout's rule for both
# kinds), and every one of them prefers the same store, since
# (hash + p) % n is the same for every p = c (mod n): that of partition c.


def store_of_coordinator(coordinator: int, store_count: int) -> int:
    """The store that runs transaction coordinator `coordinator` (its
    `__transaction_state` partitions' preferred store)."""
    return preferred_store(TRANSACTION_STATE_TOPIC, coordinator, store_count)


def store_of_group_coordinator(coordinator: int, store_count: int) -> int:
    """The store that runs group coordinator `coordinator` (its
    `__consumer_offsets` partitions' preferred store)."""
    return preferred_store(CONSUMER_OFFSETS_TOPIC, coordinator, store_count)
