"""The gRPC LeaderLink: how a follower store reaches a leader store
(ReplicaFetch, in a fetch session covering every partition it follows
there, and OffsetsForLeaderEpoch, on the leader's store port)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import grpc

from oncelog.v1 import partition_store_pb2 as pb
from oncelog.v1 import partition_store_pb2_grpc
from oncelog.wire.errors import ErrorCode
from oncelog.wire.status import error_from_rpc

from ...common.kernel.errors import ServiceError
from ...common.rpc.channels import ChannelPool
from ...common.rpc.stream_client import StreamMethod
from ..api import EpochEndOutcome, ReplicaFetchItem, ReplicaFetchOutcome
from ..core.replicas import PartitionState, ReplicaStateError
from .convert import error_from_proto

# Beyond the long-poll wait, how long a replica RPC may take.
REPLICA_RPC_TIMEOUT_S = 10.0
# How long another store may take to tell its partition states.
PARTITION_STATES_TIMEOUT_S = 2.0


class GrpcLeaderLink:
    def __init__(self, addresses: Callable[[], Mapping[int, str]]) -> None:
        # Every store's address by node id (stores may join after start).
        self._addresses = addresses
        self._channels = ChannelPool()
        # One stream per leader for the fetches: the follower's next fetch is
        # most of what an acks=all append waits for beyond its own write, and
        # a message on an open stream costs less than a unary call. A leader
        # that does not serve the stream is asked with unary calls.
        self._fetches: StreamMethod[pb.ReplicaFetchRequest, pb.ReplicaFetchResponse] = \
            StreamMethod("/oncelog.v1.PartitionStore/ReplicaFetchStream",
                         "/oncelog.v1.PartitionStore/ReplicaFetch", pb.ReplicaFetchResponse)

    def _address(self, node_id: int) -> str:
        address = self._addresses().get(node_id)
        if address is None:
            raise ServiceError(ErrorCode.LEADER_NOT_AVAILABLE,
                               f"store node {node_id} has no known address")
        return address

    def _stub(self, node_id: int) -> partition_store_pb2_grpc.PartitionStoreAsyncStub:
        channel = self._channels.get(self._address(node_id))
        return partition_store_pb2_grpc.PartitionStoreStub(channel)

    def _from_leader(self, leader: int, code: ErrorCode, message: str) -> ServiceError:
        """A failure of a call to `leader`, named in the message."""
        return ServiceError(code, f"leader store node {leader} ({self._address(leader)}): "
                                  f"{message}")

    def _failed(self, leader: int, exc: grpc.RpcError) -> ServiceError:
        error = error_from_rpc(exc)
        return self._from_leader(leader, ErrorCode.from_wire(error.code), error.message)

    async def replica_fetch(
        self, leader: int, replica_id: int, items: Sequence[ReplicaFetchItem], *,
        max_wait_ms: int, session_id: int = 0, session_epoch: int = 0,
        forgotten: Sequence[tuple[str, int]] = (),
    ) -> tuple[int, list[ReplicaFetchOutcome]]:
        request = pb.ReplicaFetchRequest(
            replica_id=replica_id, max_wait_ms=max_wait_ms,
            session_id=session_id, session_epoch=session_epoch,
            partitions=[
                pb.ReplicaFetchPartition(
                    topic=i.topic, partition=i.partition, fetch_offset=i.fetch_offset,
                    current_leader_epoch=i.current_leader_epoch, max_bytes=i.max_bytes,
                )
                for i in items
            ],
            forgotten=[pb.ReplicaFetchForgotten(topic=t, partition=p) for t, p in forgotten],
        )
        address = self._address(leader)
        try:
            response = await self._fetches.ask(
                address, self._channels.get(address), request,
                REPLICA_RPC_TIMEOUT_S + max_wait_ms / 1000)
        except ServiceError as exc:
            raise self._from_leader(leader, exc.code, exc.message) from exc
        return response.session_id, [
            ReplicaFetchOutcome(
                r.topic, r.partition, error_from_proto(r.error), r.high_watermark,
                r.log_start_offset, r.log_end_offset, tuple(r.batches),
            )
            for r in response.results
        ]

    async def offsets_for_leader_epoch(
        self, leader: int, queries: Sequence[tuple[str, int, int, int]],
    ) -> list[EpochEndOutcome]:
        request = pb.OffsetsForLeaderEpochRequest(partitions=[
            pb.EpochQuery(topic=t, partition=p, leader_epoch=e, current_leader_epoch=c)
            for t, p, e, c in queries
        ])
        try:
            response = await self._stub(leader).OffsetsForLeaderEpoch(
                request, timeout=REPLICA_RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise self._failed(leader, exc) from exc
        return [
            EpochEndOutcome(r.topic, r.partition, error_from_proto(r.error), r.leader_epoch,
                            r.end_offset)
            for r in response.results
        ]

    async def partition_states(self, node_id: int) -> dict[tuple[str, int], PartitionState]:
        """The partition states store `node_id` holds, from its Metadata."""
        request = pb.MetadataRequest(include_internal=True)
        try:
            response = await self._stub(node_id).Metadata(
                request, timeout=PARTITION_STATES_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise self._failed(node_id, exc) from exc
        states: dict[tuple[str, int], PartitionState] = {}
        for topic in response.topics:
            for p in topic.partitions:
                try:
                    states[(topic.name, p.partition)] = PartitionState(
                        tuple(p.replica_node_ids), p.leader_node_id, p.leader_epoch,
                        tuple(p.isr_node_ids), tuple(p.target_replica_node_ids) or None)
                except ReplicaStateError:
                    continue  # not a state a store holds (no replicas known)
        return states

    async def close(self) -> None:
        self._fetches.close()
        await self._channels.close()
