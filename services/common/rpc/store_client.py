"""The services' own client of the partition store, for internal topics.

Coordinators keep no disk: their state is records in internal topics, read and
appended through this client. It talks to each partition's leader, found
through Metadata and forgotten when a store says it moved (leaders.py); the
callers retry.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from oncelog.v1 import errors_pb2, records_pb2
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.wire import records
from oncelog.wire.errors import ErrorCode
from oncelog.wire.status import error_from_rpc

from ..kernel.errors import ServiceError
from ..metadata.cluster import ClusterLayout
from .channels import ChannelPool
from .leaders import LeaderDirectory
from .local_calls import InProcess, local_call
from .stream_client import StreamMethod

# A single RPC to a store should not take longer than this; the caller retries.
STORE_RPC_TIMEOUT_S = 10.0

SERVICE_NAME = ps.DESCRIPTOR.services_by_name["PartitionStore"].full_name
PRODUCE_STREAM = f"/{SERVICE_NAME}/ProduceStream"


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One record of an internal topic."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    entries: list[LogEntry]
    # Where the next read should start (past filtered and control batches).
    next_offset: int
    high_watermark: int


def _service_error(error: errors_pb2.Error) -> ServiceError:
    """The store's error (from a status or a per-partition result) as ours."""
    return ServiceError(ErrorCode.from_wire(error.code), error.message)


@dataclass(frozen=True, slots=True)
class TxnWriter:
    """Stamps an internal append as a transactional batch of a producer."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    base_sequence: int
    # The store adds the partition to the producer's transaction before the
    # append (ProduceRequest.add_partitions_to_txn), instead of only
    # verifying that the producer added it.
    add_partitions_to_txn: bool = False


@dataclass(frozen=True, slots=True)
class RawRead:
    """Whole batches (control batches included), for readers that follow
    transaction outcomes themselves."""

    batches: list[bytes]
    next_offset: int
    high_watermark: int


class StoreClient:
    """`local`: the store this process runs, if any (local_calls.py); its
    appends and log end offsets are asked of it without gRPC."""

    def __init__(self, layout: ClusterLayout, *, local: InProcess | None = None) -> None:
        self._layout = layout
        self._local = local
        self._channels = ChannelPool()
        self._leaders = LeaderDirectory(layout, self._channels)
        # Appends go over one stream per store address (stream_client.py).
        self._produce: StreamMethod[ps.ProduceRequest, ps.ProduceResponse] = StreamMethod(
            PRODUCE_STREAM, f"/{SERVICE_NAME}/Produce", ps.ProduceResponse,
            local=local)

    async def _unary(self, topic: str, partition: int, method: str, request: Message,
                     timeout_s: float) -> Any:
        """One unary call of the store that leads a partition: in process
        when this process runs it (`local`), else over gRPC; a failure is
        our error, and forgets the leader if it moved."""
        try:
            leader = await self._leaders.leader(topic, partition)
            here = local_call(self._local, self._leaders.address(leader),
                              f"/{SERVICE_NAME}/{method}")
            if here is not None:
                return await here(request, timeout_s)
            return await getattr(self._leaders.stub(leader), method)(request, timeout=timeout_s)
        except ServiceError as exc:
            self._leaders.forget_on(topic, partition, exc.code)
            raise
        except grpc.RpcError as exc:
            raise self._failed(topic, partition, error_from_rpc(exc)) from exc

    def _failed(self, topic: str, partition: int, error: errors_pb2.Error) -> ServiceError:
        """Our error for a failed call, forgetting the leader if it moved."""
        failure = _service_error(error)
        self._leaders.forget_on(topic, partition, failure.code)
        return failure

    async def close(self) -> None:
        self._produce.close()
        await self._channels.close()

    async def append(
        self,
        topic: str,
        partition: int,
        entries: Sequence[tuple[bytes | None, bytes | None]],
        *,
        expected_log_end_offset: int | None = None,
        now_ms: int | None = None,
        producer: TxnWriter | None = None,
    ) -> int:
        """Appends (key, value) records as one batch; returns its base offset.

        With `producer`, the batch is a transactional batch of that producer
        (the group coordinator writes transactional offsets so): the store
        applies its transaction rules to it (verification with the
        transaction coordinator, epoch fencing, sequence order).

        Raises ServiceError with the store's code (LOG_END_OFFSET_MISMATCH when
        the condition did not hold; a retriable code when the store is away).
        """
        ts = int(time.time() * 1000) if now_ms is None else now_ms
        rows = [(k, v, None, ts) for k, v in entries]
        if producer is None:
            batch = records.encode_batch(rows)
        else:
            batch = records.encode_batch(
                rows, producer_id=producer.producer_id, producer_epoch=producer.producer_epoch,
                base_sequence=producer.base_sequence, transactional=True,
            )
        pb = ps.PartitionBatch(topic=topic, partition=partition, batch=batch)
        if expected_log_end_offset is not None:
            pb.expected_log_end_offset = expected_log_end_offset
        request = ps.ProduceRequest(
            batches=[pb], timeout_ms=int(STORE_RPC_TIMEOUT_S * 1000),
            transactional_id=producer.transactional_id if producer else "",
            add_partitions_to_txn=producer.add_partitions_to_txn if producer else False,
            # Our writes go to internal topics, which take no others.
            coordinator_write=True,
        )
        address = self._leaders.address(await self._leaders.leader(topic, partition))
        try:
            resp = await self._produce.ask(address, self._channels.get(address), request,
                                           STORE_RPC_TIMEOUT_S)
        except ServiceError as exc:
            self._leaders.forget_on(topic, partition, exc.code)
            raise
        result = resp.results[0]
        if result.error.code != 0:
            raise self._failed(topic, partition, result.error)
        return result.base_offset

    async def read(
        self, topic: str, partition: int, from_offset: int, *, max_bytes: int = 8 << 20
    ) -> ReadResult:
        """Reads committed records from an offset (no waiting)."""
        req = ps.FetchRequest(
            partitions=[ps.FetchPartition(
                topic=topic, partition=partition, fetch_offset=from_offset, max_bytes=max_bytes
            )],
            max_wait_ms=0,
            max_bytes=max_bytes,
            isolation_level=records_pb2.READ_COMMITTED,
        )
        resp: ps.FetchResponse = await self._unary(
            topic, partition, "Fetch", req, STORE_RPC_TIMEOUT_S)
        result = resp.results[0]
        if result.error.code != 0:
            raise self._failed(topic, partition, result.error)
        entries = [
            LogEntry(r.offset, r.key, r.value, r.timestamp_ms)
            for batch in result.batches
            for r in records.iter_records(batch, min_offset=from_offset)
        ]
        next_offset = max(result.next_fetch_offset, from_offset)
        return ReadResult(entries, next_offset, result.high_watermark)

    async def read_batches(
        self, topic: str, partition: int, from_offset: int, *, max_wait_ms: int = 0,
        max_bytes: int = 8 << 20,
    ) -> RawRead:
        """Reads whole batches from an offset under read_uncommitted, markers
        included; with max_wait_ms, waits that long for something new."""
        req = ps.FetchRequest(
            partitions=[ps.FetchPartition(
                topic=topic, partition=partition, fetch_offset=from_offset, max_bytes=max_bytes
            )],
            max_wait_ms=max_wait_ms,
            min_bytes=1 if max_wait_ms else 0,
            max_bytes=max_bytes,
            isolation_level=records_pb2.READ_UNCOMMITTED,
            include_control_batches=True,
        )
        resp: ps.FetchResponse = await self._unary(
            topic, partition, "Fetch", req, STORE_RPC_TIMEOUT_S + max_wait_ms / 1000)
        result = resp.results[0]
        if result.error.code != 0:
            raise self._failed(topic, partition, result.error)
        return RawRead(list(result.batches), max(result.next_fetch_offset, from_offset),
                       result.high_watermark)

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """Partition counts of existing topics, from any store's Metadata (a
        missing topic is left out)."""
        if not topics:
            return {}
        return await self._leaders.partition_counts(list(topics))

    async def current_leader(self, topic: str, partition: int) -> int:
        """The partition's leader as a store tells it now (not the cached
        one; -1: none right now): for answers that clients act on, such as
        where a coordinator that follows leadership is."""
        self._leaders.forget(topic, partition)
        try:
            return await self._leaders.leader(topic, partition)
        except ServiceError as exc:
            if exc.code is ErrorCode.LEADER_NOT_AVAILABLE:
                return -1
            raise

    async def read_to_end(self, topic: str, partition: int, from_offset: int = 0) -> ReadResult:
        """Reads everything from an offset up to the high watermark at the time of the call."""
        entries: list[LogEntry] = []
        offset = from_offset
        while True:
            result = await self.read(topic, partition, offset)
            entries.extend(result.entries)
            if result.next_offset <= offset or result.next_offset >= result.high_watermark:
                return ReadResult(entries, max(result.next_offset, offset), result.high_watermark)
            offset = result.next_offset

    async def log_end_offset(self, topic: str, partition: int, *,
                             read_committed: bool = False) -> int:
        """The high watermark, or the last stable offset with read_committed."""
        req = ps.ListOffsetsRequest(
            partitions=[ps.ListOffsetsPartition(topic=topic, partition=partition, timestamp_ms=-1)],
            isolation_level=(records_pb2.READ_COMMITTED if read_committed
                             else records_pb2.READ_UNCOMMITTED),
        )
        resp: ps.ListOffsetsResponse = await self._unary(
            topic, partition, "ListOffsets", req, STORE_RPC_TIMEOUT_S)
        result = resp.results[0]
        if result.error.code != 0:
            raise self._failed(topic, partition, result.error)
        return result.offset

