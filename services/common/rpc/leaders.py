"""Where each partition's leader is, for the services' own calls to the stores
(the coordinators' internal topics and transaction markers).

Leaders move (docs/replication.md), so the services follow them as clients
do: they ask any store for Metadata, cache each partition's leader, and
forget it when a store answers NOT_LEADER_OR_FOLLOWER, a leader-epoch error,
or cannot be reached; the caller retries and the next lookup asks again.
"""

from __future__ import annotations

import asyncio
import itertools

import grpc

from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.wire.errors import ErrorCode

from ..kernel.errors import ServiceError
from ..metadata.cluster import ClusterLayout
from .channels import ChannelPool

METADATA_RPC_TIMEOUT_S = 5.0

# Answers after which a cached leader is no longer trusted.
MOVED_CODES = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT, ErrorCode.SHUTTING_DOWN,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
})


class LeaderDirectory:
    def __init__(self, layout: ClusterLayout, channels: ChannelPool) -> None:
        self._layout = layout
        self._channels = channels
        self._leaders: dict[tuple[str, int], int] = {}
        # Addresses by node id: the layout's, and those Metadata names (a
        # replicated cluster may have grown).
        self._addresses: dict[int, str] = dict(enumerate(layout.stores))
        self._counts: dict[str, int] = {}
        # Which store to ask first: rotates, so a dead one is not asked first
        # every time.
        self._next_store = itertools.cycle(range(len(layout.stores)))
        self._lock = asyncio.Lock()

    def address(self, node_id: int) -> str:
        address = self._addresses.get(node_id)
        if address is None:
            raise ServiceError(ErrorCode.LEADER_NOT_AVAILABLE,
                               f"store node {node_id} has no known address; retry")
        return address

    def stub(self, node_id: int) -> ps_grpc.PartitionStoreAsyncStub:
        return ps_grpc.PartitionStoreStub(self._channels.get(self.address(node_id)))

    async def leader(self, topic: str, partition: int) -> int:
        """The node id of the partition's leader (asks when not cached).
        Raises LEADER_NOT_AVAILABLE when no store knows one."""
        node = self._leaders.get((topic, partition))
        if node is not None:
            return node
        await self.refresh([topic])
        node = self._leaders.get((topic, partition))
        if node is None:
            raise ServiceError(
                ErrorCode.LEADER_NOT_AVAILABLE,
                f"no store named a leader for {topic}-{partition}; retry",
            )
        return node

    def forget(self, topic: str, partition: int) -> None:
        self._leaders.pop((topic, partition), None)

    def forget_on(self, topic: str, partition: int, code: ErrorCode) -> None:
        """Forgets the cached leader when `code` says it may have moved."""
        if code in MOVED_CODES:
            self.forget(topic, partition)

    async def partition_counts(self, topics: list[str]) -> dict[str, int]:
        await self.refresh(topics)
        return {t: self._counts[t] for t in topics if t in self._counts}

    async def refresh(self, topics: list[str]) -> None:
        """Asks the stores in turn for the topics' metadata until one answers."""
        async with self._lock:
            last: Exception | None = None
            for _ in range(len(self._layout.stores)):
                node = next(self._next_store)
                try:
                    response = await self.stub(node).Metadata(
                        ps.MetadataRequest(topics=topics, include_internal=True),
                        timeout=METADATA_RPC_TIMEOUT_S)
                except grpc.RpcError as exc:
                    last = exc
                    continue
                self._addresses.update({n.node_id: n.address for n in response.stores})
                for topic in response.topics:
                    if topic.error.code != 0:
                        self._counts.pop(topic.name, None)
                        continue
                    self._counts[topic.name] = len(topic.partitions)
                    for meta in topic.partitions:
                        if meta.leader_node_id >= 0:
                            self._leaders[(topic.name, meta.partition)] = meta.leader_node_id
                        else:
                            self._leaders.pop((topic.name, meta.partition), None)
                return
            raise ServiceError(
                ErrorCode.LEADER_NOT_AVAILABLE,
                f"no store answered Metadata ({', '.join(self._layout.stores)}): {last}",
            )
