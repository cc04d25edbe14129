"""The gRPC ControllerLink: how a store node reaches the catalog owner (node
`layout.controller_node_id`) and how the controller nudges the others."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc

from oncelog.v1 import partition_store_pb2, partition_store_pb2_grpc
from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ...common.metadata.cluster import ClusterLayout
from ...common.rpc.channels import ChannelPool
from ..api import NewPartitions, TopicOutcome, TopicSpec
from ..core.topics import TopicRecord
from .convert import error_from_proto, topic_record_from_metadata

log = logging.getLogger("oncelog.partition_store.controller_link")

# gRPC metadata key on a DeleteTopics call from the controller to another
# store node: "the catalog changed, refresh it now" (nothing else is done).
CATALOG_CHANGED_METADATA = "oncelog-catalog-changed"


class GrpcControllerLink:
    def __init__(self, layout: ClusterLayout, *, timeout_ms: int = 5_000) -> None:
        self._layout = layout
        self._timeout_s = timeout_ms / 1000
        self._channels = ChannelPool()

    def _stub(self, node_id: int) -> partition_store_pb2_grpc.PartitionStoreAsyncStub:
        channel = self._channels.get(self._layout.stores[node_id])
        return partition_store_pb2_grpc.PartitionStoreStub(channel)

    def _unreachable(self, exc: grpc.aio.AioRpcError) -> ServiceError:
        node = self._layout.controller_node_id
        return ServiceError(
            ErrorCode.LEADER_NOT_AVAILABLE,
            f"the topic catalog's owner, store node {node} at {self._layout.stores[node]}, "
            f"did not answer: {exc.code().name} {exc.details()}",
        )

    async def list_topics(self) -> list[TopicRecord]:
        stub = self._stub(self._layout.controller_node_id)
        try:
            response = await stub.ListTopics(
                partition_store_pb2.ListTopicsRequest(include_internal=True),
                timeout=self._timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            raise self._unreachable(exc) from exc
        return [topic_record_from_metadata(t) for t in response.topics]

    async def create_topics(
        self, specs: Sequence[TopicSpec], *, validate_only: bool
    ) -> list[TopicOutcome]:
        stub = self._stub(self._layout.controller_node_id)
        request = partition_store_pb2.CreateTopicsRequest(
            topics=[
                partition_store_pb2.TopicSpec(name=s.name, partitions=s.partitions, config=s.config)
                for s in specs
            ],
            validate_only=validate_only,
        )
        try:
            response = await stub.CreateTopics(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._unreachable(exc) from exc
        return [
            TopicOutcome(r.name, error_from_proto(r.error), r.topic_id) for r in response.results
        ]

    async def delete_topics(self, names: Sequence[str]) -> list[TopicOutcome]:
        stub = self._stub(self._layout.controller_node_id)
        try:
            response = await stub.DeleteTopics(
                partition_store_pb2.DeleteTopicsRequest(names=list(names)),
                timeout=self._timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            raise self._unreachable(exc) from exc
        return [
            TopicOutcome(r.name, error_from_proto(r.error), r.topic_id) for r in response.results
        ]

    async def create_partitions(
        self, specs: Sequence[NewPartitions], *, validate_only: bool
    ) -> list[TopicOutcome]:
        stub = self._stub(self._layout.controller_node_id)
        request = partition_store_pb2.CreatePartitionsRequest(
            topics=[partition_store_pb2.CreatePartitionsTopic(name=s.name, count=s.count)
                    for s in specs],
            validate_only=validate_only,
        )
        try:
            response = await stub.CreatePartitions(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._unreachable(exc) from exc
        return [
            TopicOutcome(r.name, error_from_proto(r.error), r.topic_id) for r in response.results
        ]

    async def notify_catalog_changed(self, node_id: int) -> None:
        try:
            await self._stub(node_id).DeleteTopics(
                partition_store_pb2.DeleteTopicsRequest(),
                metadata=((CATALOG_CHANGED_METADATA, "1"),),
                timeout=self._timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            # Best effort: the node also refreshes periodically and on a miss.
            log.info("could not tell store node %d to refresh its catalog: %s", node_id,
                     exc.code().name)

    def partition_states(self) -> None:
        """Single copies: placement is layout.store_for."""
        return None

    async def close(self) -> None:
        await self._channels.close()
