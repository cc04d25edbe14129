"""The PartitionStore gRPC servicer: proto -> runtime call -> proto.

Per-partition and per-topic failures go into the results' `error` fields.
A malformed request as a whole (nothing in it, negative sizes, the same
partition twice) ends the call with a gRPC status carrying our Error
(INVALID_REQUEST / INVALID_FETCH_SIZE) and changes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import grpc

from oncelog.v1 import partition_store_pb2 as pb
from oncelog.v1 import partition_store_pb2_grpc, records_pb2
from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import MARKER_ABORT, MARKER_COMMIT

from ...common.kernel.errors import ServiceError
from ...common.rpc.local_calls import InProcess
from ...common.rpc.request_streams import Refused, answer_each
from ...common.security.guard import current_principal, without_client_certificate
from ..acls import AclService
from ..api import (
    FetchItem,
    MarkerItem,
    NewPartitions,
    OffsetQuery,
    ProduceItem,
    ReplicaFetchItem,
    TopicSpec,
)
from ..core.quotas import QuotaKind
from ..log.partition import Isolation
from ..quotas import NOT_THROTTLED, StoreQuotas, exempt
from ..runtime import StoreRuntime
from .controller_link import CATALOG_CHANGED_METADATA
from .convert import error_to_proto, topic_metadata

SERVICE_NAME = "oncelog.v1.PartitionStore"
_MARKER_TYPES = {pb.ABORT: MARKER_ABORT, pb.COMMIT: MARKER_COMMIT}


def _isolation(value: int) -> Isolation:
    if value == records_pb2.READ_COMMITTED:
        return Isolation.READ_COMMITTED
    if value == records_pb2.READ_UNCOMMITTED:
        return Isolation.READ_UNCOMMITTED
    raise ServiceError(ErrorCode.INVALID_REQUEST, f"unknown isolation level {value}")


def _bad_request(message: str) -> ServiceError:
    return ServiceError(ErrorCode.INVALID_REQUEST, message)


def _check_unique(pairs: Iterable[tuple[str, int]], what: str) -> None:
    seen: set[tuple[str, int]] = set()
    for topic, partition in pairs:
        if (topic, partition) in seen:
            raise _bad_request(f"{what} names partition {topic}-{partition} more than once")
        seen.add((topic, partition))


def _security_disabled() -> ServiceError:
    return ServiceError(
        ErrorCode.SECURITY_DISABLED,
        "this cluster runs without an authorizer (--authorizer none): it keeps no ACLs; "
        "start the services with --authorizer acl (docs/security.md)")


class PartitionStoreServicer(partition_store_pb2_grpc.PartitionStoreServicer):
    def __init__(self, runtime: StoreRuntime, *, acls: AclService | None = None,
                 quotas: StoreQuotas | None = None) -> None:
        self._runtime = runtime
        # None or disabled: every client is unlimited (quotas.py).
        self._quotas = quotas if quotas is not None and quotas.enabled else None
        # None: no authorizer; the ACL RPCs answer SECURITY_DISABLED.
        self._acls = acls
        layout = runtime.layout
        # [main port's, token listener's] (see without_client_certificate).
        self._coordinators = [
            [records_pb2.Node(node_id=i, address=a)
             for i, a in enumerate(layout.coordinator_addresses(token=token))]
            for token in (False, True)
        ]
        self._group_coordinators = [
            [records_pb2.Node(node_id=i, address=a)
             for i, a in enumerate(layout.group_coordinator_addresses(token=token))]
            for token in (False, True)
        ]

    def serve_in_process(self, local: InProcess) -> None:
        """Answers the calls of the coordinators that run in this store's
        process (services/common/rpc/local_calls.py): their appends, their
        reads, their log end offsets and the transaction coordinator's
        markers."""
        for method, handler in (
            ("ProduceStream", self._produce),
            ("Fetch", self._fetch),
            ("ListOffsets", self._list_offsets),
            ("WriteTxnMarkersStream", self._write_txn_markers),
        ):
            local.serve(f"/{SERVICE_NAME}/{method}", handler)

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        lookups = await self._runtime.metadata(
            list(request.topics), include_internal=request.include_internal
        )
        token = without_client_certificate(context)
        # Where coordinators follow leadership, those of dead stores are
        # left out (ClusterLayout.coordinators_to_ask): a client that asks
        # every coordinator (Admin.list_transactions) does not wait for one.
        live = self._runtime.hooks.live()
        stores = self._runtime.hooks.store_addresses()
        if token:
            stores = {**stores, **self._runtime.hooks.token_store_addresses()}
        response = pb.MetadataResponse(
            stores=[records_pb2.Node(node_id=i, address=a) for i, a in sorted(stores.items())],
            coordinators=[self._coordinators[token][c]
                          for c in self._runtime.layout.coordinators_to_ask(live)],
            group_coordinators=[self._group_coordinators[token][c]
                                for c in self._runtime.layout.group_coordinators_to_ask(live)],
            controller_node_id=self._runtime.catalog_node_id,
        )
        for lookup in lookups:
            if lookup.record is not None:
                response.topics.append(
                    topic_metadata(lookup.record, self._runtime.partition_state))
            else:
                response.topics.append(
                    pb.TopicMetadata(name=lookup.name, error=error_to_proto(lookup.error))
                )
        return response

    async def CreateTopics(
        self, request: pb.CreateTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTopicsResponse:
        if not request.topics:
            raise _bad_request("CreateTopics names no topic")
        outcomes = await self._runtime.create_topics(
            [TopicSpec(t.name, t.partitions, dict(t.config), t.replication_factor)
             for t in request.topics],
            validate_only=request.validate_only,
        )
        return pb.CreateTopicsResponse(results=[
            pb.TopicResult(name=o.name, error=error_to_proto(o.error), topic_id=o.topic_id)
            for o in outcomes
        ])

    async def DeleteTopics(
        self, request: pb.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTopicsResponse:
        metadata = dict(context.invocation_metadata() or ())
        if metadata.get(CATALOG_CHANGED_METADATA):
            # The controller telling this node that topics were deleted.
            await self._runtime.refresh_catalog()
            return pb.DeleteTopicsResponse()
        if not request.names:
            raise _bad_request("DeleteTopics names no topic")
        outcomes = await self._runtime.delete_topics(list(request.names))
        return pb.DeleteTopicsResponse(results=[
            pb.TopicResult(name=o.name, error=error_to_proto(o.error), topic_id=o.topic_id)
            for o in outcomes
        ])

    async def CreatePartitions(
        self, request: pb.CreatePartitionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreatePartitionsResponse:
        if not request.topics:
            raise _bad_request("CreatePartitions names no topic")
        outcomes = await self._runtime.create_partitions(
            [NewPartitions(t.name, t.count) for t in request.topics],
            validate_only=request.validate_only,
        )
        return pb.CreatePartitionsResponse(results=[
            pb.TopicResult(name=o.name, error=error_to_proto(o.error), topic_id=o.topic_id)
            for o in outcomes
        ])

    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTopicsResponse:
        records = await self._runtime.list_topics(include_internal=request.include_internal)
        return pb.ListTopicsResponse(
            topics=[topic_metadata(r, self._runtime.partition_state) for r in records])

    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        return await self._produce(request)

    async def ProduceStream(
        self, requests: AsyncIterator[pb.ProduceRequest | Refused],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProduceResponse]:
        async for answer in answer_each(requests, self._produce, pb.ProduceResponse):
            yield answer

    async def _produce(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        """Produce's work, for both its forms; raises ServiceError when the
        request fails as a whole."""
        if not request.batches:
            raise _bad_request("ProduceRequest carries no batch")
        if request.timeout_ms < 0:
            raise _bad_request(f"timeout_ms is {request.timeout_ms}; it must be >= 0")
        _check_unique(((b.topic, b.partition) for b in request.batches), "ProduceRequest")
        quotas = None if request.coordinator_write or exempt(
            b.topic for b in request.batches) else self._quotas
        principal = current_principal()
        if quotas is not None:
            await quotas.hold(QuotaKind.PRODUCE, principal, request.client_id)
        items = [
            ProduceItem(
                b.topic, b.partition, b.batch,
                b.expected_log_end_offset
                if b.HasField("expected_log_end_offset") and b.expected_log_end_offset >= 0
                else None,
                b.leader_epoch if b.HasField("leader_epoch") else None,
            )
            for b in request.batches
        ]
        outcomes = await self._runtime.produce(
            items, timeout_ms=request.timeout_ms,
            transactional_id=request.transactional_id,
            add_partitions_to_txn=request.add_partitions_to_txn,
            coordinator_write=request.coordinator_write,
        )
        throttle_ms = 0 if quotas is None else quotas.produced(
            principal, request.client_id, sum(len(b.batch) for b in request.batches))
        return pb.ProduceResponse(request_id=request.request_id, throttle_time_ms=throttle_ms,
                                  results=[
            pb.PartitionProduceResult(
                topic=o.topic, partition=o.partition, error=error_to_proto(o.error),
                base_offset=o.base_offset, duplicate=o.duplicate,
                log_start_offset=o.log_start_offset, log_append_time_ms=o.log_append_time_ms,
            )
            for o in outcomes
        ])

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchResponse:
        return await self._fetch(request)

    async def _fetch(self, request: pb.FetchRequest) -> pb.FetchResponse:
        if not request.partitions:
            raise _bad_request("FetchRequest names no partition")
        if request.max_bytes < 0 or request.min_bytes < 0:
            raise ServiceError(
                ErrorCode.INVALID_FETCH_SIZE,
                f"max_bytes ({request.max_bytes}) and min_bytes ({request.min_bytes}) "
                "must be >= 0",
            )
        if request.max_wait_ms < 0:
            raise _bad_request(f"max_wait_ms is {request.max_wait_ms}; it must be >= 0")
        for p in request.partitions:
            if p.max_bytes < 0:
                raise ServiceError(
                    ErrorCode.INVALID_FETCH_SIZE,
                    f"max_bytes of {p.topic}-{p.partition} is {p.max_bytes}; "
                    "it must be >= 0",
                )
        _check_unique(((p.topic, p.partition) for p in request.partitions), "FetchRequest")
        if (request.include_control_batches
                and request.isolation_level == records_pb2.READ_COMMITTED):
            raise _bad_request(
                "include_control_batches needs isolation_level READ_UNCOMMITTED "
                "(read_committed readers never see markers)"
            )
        quotas = None if request.include_control_batches or exempt(
            p.topic for p in request.partitions) else self._quotas
        principal = current_principal()
        max_bytes = request.max_bytes
        if quotas is not None:
            await quotas.hold(QuotaKind.FETCH, principal, request.client_id)
            max_bytes = quotas.fetch_max_bytes(principal, request.client_id, max_bytes)
        outcomes = await self._runtime.fetch(
            [FetchItem(p.topic, p.partition, p.fetch_offset, p.max_bytes,
                       p.current_leader_epoch if p.HasField("current_leader_epoch")
                       else None)
             for p in request.partitions],
            max_wait_ms=request.max_wait_ms, min_bytes=request.min_bytes,
            max_bytes=max_bytes, isolation=_isolation(request.isolation_level),
            include_control=request.include_control_batches,
        )
        throttle = NOT_THROTTLED if quotas is None else quotas.fetched(
            principal, request.client_id, sum(len(b) for o in outcomes for b in o.batches))
        if throttle.withhold_batches:
            # As Kafka's: a throttled fetch returns no batches (they do not
            # count against the quota either); the client fetches the same
            # offsets once its throttle time has passed.
            offsets = {(p.topic, p.partition): p.fetch_offset for p in request.partitions}
            return pb.FetchResponse(throttle_time_ms=throttle.throttle_time_ms, results=[
                pb.PartitionFetchResult(
                    topic=o.topic, partition=o.partition, error=error_to_proto(o.error),
                    high_watermark=o.high_watermark, last_stable_offset=o.last_stable_offset,
                    log_start_offset=o.log_start_offset,
                    next_fetch_offset=offsets.get((o.topic, o.partition), o.next_fetch_offset),
                )
                for o in outcomes
            ])
        return pb.FetchResponse(throttle_time_ms=throttle.throttle_time_ms, results=[
            pb.PartitionFetchResult(
                topic=o.topic, partition=o.partition, error=error_to_proto(o.error),
                high_watermark=o.high_watermark, last_stable_offset=o.last_stable_offset,
                log_start_offset=o.log_start_offset, batches=o.batches,
                next_fetch_offset=o.next_fetch_offset,
            )
            for o in outcomes
        ])

    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListOffsetsResponse:
        return await self._list_offsets(request)

    async def _list_offsets(self, request: pb.ListOffsetsRequest) -> pb.ListOffsetsResponse:
        if not request.partitions:
            raise _bad_request("ListOffsetsRequest names no partition")
        outcomes = await self._runtime.list_offsets(
            [OffsetQuery(p.topic, p.partition, p.timestamp_ms) for p in request.partitions],
            isolation=_isolation(request.isolation_level),
        )
        return pb.ListOffsetsResponse(results=[
            pb.ListOffsetsResult(
                topic=o.topic, partition=o.partition, error=error_to_proto(o.error),
                offset=o.offset, timestamp_ms=o.timestamp_ms,
            )
            for o in outcomes
        ])

    async def WriteTxnMarkers(
        self, request: pb.WriteTxnMarkersRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteTxnMarkersResponse:
        return await self._write_txn_markers(request)

    async def WriteTxnMarkersStream(
        self, requests: AsyncIterator[pb.WriteTxnMarkersRequest | Refused],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.WriteTxnMarkersResponse]:
        async for answer in answer_each(requests, self._write_txn_markers,
                                        pb.WriteTxnMarkersResponse):
            yield answer

    async def _write_txn_markers(
        self, request: pb.WriteTxnMarkersRequest
    ) -> pb.WriteTxnMarkersResponse:
        """WriteTxnMarkers' work, for both its forms; raises ServiceError
        when the request fails as a whole."""
        if not request.markers:
            raise _bad_request("WriteTxnMarkersRequest carries no marker")
        for m in request.markers:
            if not m.partitions:
                raise _bad_request(
                    f"the marker of producer {m.producer_id} names no partition"
                )
        outcomes = await self._runtime.write_txn_markers([
            MarkerItem(
                producer_id=m.producer_id, producer_epoch=m.producer_epoch,
                # Unknown types pass through; the core refuses them per partition.
                control_type=_MARKER_TYPES.get(m.type, int(m.type)),
                coordinator_epoch=m.coordinator_epoch,
                partitions=tuple((tp.topic, tp.partition) for tp in m.partitions),
                transactional_id=m.transactional_id,
                transaction_version=m.transaction_version,
                timestamp_ms=m.timestamp_ms,
            )
            for m in request.markers
        ])
        return pb.WriteTxnMarkersResponse(request_id=request.request_id, results=[
            pb.MarkerPartitionResult(
                producer_id=o.producer_id, topic=o.topic, partition=o.partition,
                error=error_to_proto(o.error), offset=o.offset,
            )
            for o in outcomes
        ])

    async def DescribeProducers(
        self, request: pb.DescribeProducersRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeProducersResponse:
        if not request.partitions:
            raise _bad_request("DescribeProducersRequest names no partition")
        outcomes = await self._runtime.describe_producers(
            [(p.topic, p.partition) for p in request.partitions]
        )
        return pb.DescribeProducersResponse(results=[
            pb.DescribeProducersResult(
                topic=o.topic, partition=o.partition, error=error_to_proto(o.error),
                producers=[
                    pb.ProducerStateView(
                        producer_id=e.producer_id, producer_epoch=e.producer_epoch,
                        last_sequence=e.last_sequence, last_timestamp_ms=e.last_timestamp_ms,
                        coordinator_epoch=e.coordinator_epoch,
                        current_txn_start_offset=e.current_txn_first_offset,
                    )
                    for e in o.producers
                ],
            )
            for o in outcomes
        ])

    async def ReplicaFetch(
        self, request: pb.ReplicaFetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReplicaFetchResponse:
        return await self._replica_fetch(request)

    async def ReplicaFetchStream(
        self, requests: AsyncIterator[pb.ReplicaFetchRequest | Refused],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ReplicaFetchResponse]:
        async for answer in answer_each(requests, self._replica_fetch, pb.ReplicaFetchResponse):
            yield answer

    async def _replica_fetch(self, request: pb.ReplicaFetchRequest) -> pb.ReplicaFetchResponse:
        """ReplicaFetch's work, for both its forms; raises ServiceError when
        the request fails as a whole."""
        # A session's later requests may list nothing (nothing moved).
        if not request.partitions and request.session_epoch <= 1:
            raise _bad_request("ReplicaFetchRequest names no partition")
        if request.max_wait_ms < 0:
            raise _bad_request(f"max_wait_ms is {request.max_wait_ms}; it must be >= 0")
        _check_unique(((p.topic, p.partition) for p in request.partitions),
                      "ReplicaFetchRequest")
        session_id, outcomes = await self._runtime.replica_fetch_session(
            request.replica_id,
            [ReplicaFetchItem(p.topic, p.partition, p.fetch_offset, p.current_leader_epoch,
                              max(p.max_bytes, 0))
             for p in request.partitions],
            session_id=request.session_id, session_epoch=request.session_epoch,
            forgotten=[(f.topic, f.partition) for f in request.forgotten],
            max_wait_ms=request.max_wait_ms,
        )
        return pb.ReplicaFetchResponse(
            request_id=request.request_id, session_id=session_id, results=[
            pb.ReplicaFetchResult(
                topic=o.topic, partition=o.partition, error=error_to_proto(o.error),
                high_watermark=o.high_watermark, log_start_offset=o.log_start_offset,
                log_end_offset=o.log_end_offset, batches=o.batches,
            )
            for o in outcomes
        ])

    async def OffsetsForLeaderEpoch(
        self, request: pb.OffsetsForLeaderEpochRequest, context: grpc.aio.ServicerContext
    ) -> pb.OffsetsForLeaderEpochResponse:
        if not request.partitions:
            raise _bad_request("OffsetsForLeaderEpochRequest names no partition")
        await self._runtime.ensure_known({q.topic for q in request.partitions})
        outcomes = self._runtime.offsets_for_leader_epoch([
            (q.topic, q.partition, q.leader_epoch, q.current_leader_epoch)
            for q in request.partitions
        ])
        return pb.OffsetsForLeaderEpochResponse(results=[
            pb.EpochEndOffset(
                topic=o.topic, partition=o.partition, error=error_to_proto(o.error),
                leader_epoch=o.leader_epoch, end_offset=o.end_offset,
            )
            for o in outcomes
        ])

    async def AlterPartitionReassignments(
        self, request: pb.AlterPartitionReassignmentsRequest,
        context: grpc.aio.ServicerContext,
    ) -> pb.AlterPartitionReassignmentsResponse:
        if not request.partitions:
            raise _bad_request("AlterPartitionReassignmentsRequest names no partition")
        _check_unique(((p.topic, p.partition) for p in request.partitions),
                      "AlterPartitionReassignmentsRequest")
        outcomes = await self._runtime.alter_reassignments(
            {(p.topic, p.partition): tuple(p.replica_node_ids) for p in request.partitions})
        return pb.AlterPartitionReassignmentsResponse(results=[
            pb.ReassignResult(topic=topic, partition=partition, error=error_to_proto(error))
            for (topic, partition), error in outcomes.items()
        ])

    # ------------------------------------------------------------------ ACLs

    async def CreateAcls(
        self, request: pb.CreateAclsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateAclsResponse:
        if self._acls is None:
            raise _security_disabled()
        return await self._acls.create(request)

    async def DescribeAcls(
        self, request: pb.DescribeAclsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeAclsResponse:
        if self._acls is None:
            raise _security_disabled()
        return await self._acls.describe(request)

    async def DeleteAcls(
        self, request: pb.DeleteAclsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteAclsResponse:
        if self._acls is None:
            raise _security_disabled()
        return await self._acls.delete(request)
