"""Sending transaction markers to the partition stores.

The port the coordinator runtime needs, its gRPC adapter (one WriteTxnMarkers
request per store node, all of that node's partitions in it, over one
WriteTxnMarkersStream per store: a producer's next transaction waits for the
markers of its last), and a fake for tests. Results are per partition; the
runtime retries what did not land.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import records_pb2
from oncelog.wire.errors import ErrorCode

from ..common.kernel.crashpoints import crash_point
from ..common.kernel.errors import ServiceError
from ..common.metadata.cluster import ClusterLayout
from ..common.rpc.channels import ChannelPool
from ..common.rpc.leaders import LeaderDirectory
from ..common.rpc.local_calls import InProcess
from ..common.rpc.stream_client import StreamMethod
from .core.transactions import TransactionVersion

MARKER_RPC_TIMEOUT_S = 10.0
WRITE_TXN_MARKERS_STREAM = "/oncelog.v1.PartitionStore/WriteTxnMarkersStream"


@dataclass(frozen=True, slots=True)
class MarkerSpec:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    # Which marker rule the stores apply (TxnMarker.transaction_version).
    transaction_version: TransactionVersion = TransactionVersion.V2
    # Version 1: the decision's timestamp, the control batch's (0: the store's clock).
    timestamp_ms: int = 0


class MarkerSender(Protocol):
    async def write(
        self, spec: MarkerSpec, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], ErrorCode]:
        """Writes the marker to each partition; returns each partition's result."""
        ...


class GrpcMarkerSender:
    """Sends each marker to its partitions' leaders (one request per
    leader), following them as they move (services/common/rpc/leaders.py)."""

    def __init__(self, layout: ClusterLayout, *, local: InProcess | None = None) -> None:
        self._layout = layout
        self._channels = ChannelPool()
        self._leaders = LeaderDirectory(layout, self._channels)
        # `local`: the store this process runs, if any, takes its markers without gRPC.
        self._markers: StreamMethod[ps.WriteTxnMarkersRequest, ps.WriteTxnMarkersResponse] = \
            StreamMethod(WRITE_TXN_MARKERS_STREAM, "/oncelog.v1.PartitionStore/WriteTxnMarkers",
                         ps.WriteTxnMarkersResponse, local=local)

    async def close(self) -> None:
        self._markers.close()
        await self._channels.close()

    async def write(
        self, spec: MarkerSpec, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], ErrorCode]:
        by_node: dict[int, list[tuple[str, int]]] = {}
        results: dict[tuple[str, int], ErrorCode] = {}
        for topic, partition in partitions:
            try:
                leader = await self._leaders.leader(topic, partition)
            except ServiceError as exc:
                results[(topic, partition)] = exc.code
                continue
            by_node.setdefault(leader, []).append((topic, partition))
        for index, (node, tps) in enumerate(sorted(by_node.items())):
            if index > 0:
                # Some stores have the marker, others not yet.
                crash_point("coordinator.after_some_markers")
            marker = ps.TxnMarker(
                producer_id=spec.producer_id,
                producer_epoch=spec.producer_epoch,
                type=ps.COMMIT if spec.commit else ps.ABORT,
                coordinator_epoch=spec.coordinator_epoch,
                partitions=[records_pb2.TopicPartition(topic=t, partition=p) for t, p in tps],
                transactional_id=spec.transactional_id,
                transaction_version=int(spec.transaction_version),
                timestamp_ms=spec.timestamp_ms,
            )
            try:
                address = self._leaders.address(node)
                resp = await self._markers.ask(
                    address, self._channels.get(address),
                    ps.WriteTxnMarkersRequest(markers=[marker]), MARKER_RPC_TIMEOUT_S)
            except ServiceError as exc:
                for tp in tps:
                    results[tp] = exc.code
                    self._leaders.forget_on(tp[0], tp[1], exc.code)
                continue
            for r in resp.results:
                code = ErrorCode.from_wire(r.error.code)
                results[(r.topic, r.partition)] = code
                self._leaders.forget_on(r.topic, r.partition, code)
            for tp in tps:
                results.setdefault(tp, ErrorCode.UNKNOWN_SERVER_ERROR)
        return results


class FakeMarkerSender:
    """Records markers; answers from `outcomes` (default NONE)."""

    def __init__(self) -> None:
        self.written: list[tuple[MarkerSpec, tuple[str, int]]] = []
        self.outcomes: dict[tuple[str, int], list[ErrorCode]] = {}

    async def write(
        self, spec: MarkerSpec, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], ErrorCode]:
        results = {}
        for tp in partitions:
            queue = self.outcomes.get(tp)
            code = queue.pop(0) if queue else ErrorCode.NONE
            if code is ErrorCode.NONE:
                self.written.append((spec, tp))
            results[tp] = code
        return results
