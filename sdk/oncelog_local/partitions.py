"""Who holds each partition of a local cluster, as a store's Metadata says
it: `PartitionPlacement`, and `read_placements`, which asks the stores.

Behind LocalCluster.partition_states and wait_in_sync. Kept apart from
cluster.py because it reads the cluster through a service's API, as a
client would, instead of running the cluster's processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import grpc

from oncelog.v1 import partition_store_pb2, partition_store_pb2_grpc


class PartitionPlacement(NamedTuple):
    """Who holds a partition of a replicated cluster, as a store's Metadata
    says it (LocalCluster.partition_states)."""

    leader: int              # store node id; -1: offline
    leader_epoch: int
    replicas: tuple[int, ...]  # the first is the preferred leader
    isr: tuple[int, ...]

    @property
    def in_sync(self) -> bool:
        """Led, and every replica in the in-sync replica set."""
        return self.leader >= 0 and set(self.isr) == set(self.replicas)

    @property
    def preferred(self) -> bool:
        """Led by its preferred (first) replica."""
        return self.leader == self.replicas[0]


def read_placements(
    addresses: Iterable[str], channel: Callable[[str], grpc.Channel],
    topics: Sequence[str], timeout_s: float,
) -> dict[tuple[str, int], PartitionPlacement]:
    """Every partition of `topics` (empty: every topic, internal ones
    included), from the first store of `addresses` that answers Metadata
    within `timeout_s` without an error for a topic; {} when none does.
    `channel` opens a channel to an address (the cluster's own)."""
    request = partition_store_pb2.MetadataRequest(topics=list(topics), include_internal=True)
    for address in addresses:
        with channel(address) as open_channel:
            try:
                reply = partition_store_pb2_grpc.PartitionStoreStub(open_channel).Metadata(
                    request, timeout=timeout_s)
            except grpc.RpcError:
                continue
        if any(t.error.code for t in reply.topics):
            continue
        return {(t.name, p.partition): PartitionPlacement(
                    p.leader_node_id, p.leader_epoch, tuple(p.replica_node_ids),
                    tuple(p.isr_node_ids))
                for t in reply.topics for p in t.partitions}
    return {}
