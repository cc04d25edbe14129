"""An in-process partition store and coordinator with scripted faults, for
testing the SDK's sender logic without starting processes.

It keeps each partition's log in memory and applies the idempotent append
rules of docs (DESIGN §3): per producer id and partition, the epoch, the last
five batches for deduplication, and the next expected sequence. A `FaultPlan`
decides, per produced batch, whether to answer an error instead of appending,
or to append and then lose the reply (the client sees UNAVAILABLE).

Not a model of the real store's performance or of transactions; the real
store is tested against the same SDK in tests/integration.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, cast

import grpc

from oncelog import records as codec
from oncelog._status import error_proto
from oncelog.errors import ErrorCode
from oncelog.v1 import (
    coordinator_pb2,
    coordinator_pb2_grpc,
    partition_store_pb2,
    partition_store_pb2_grpc,
    records_pb2,
)

DROP_REPLY = "drop_reply"  # append, then fail the RPC as if the reply was lost
UNREACHABLE = "unreachable"  # fail the RPC without appending


@dataclass(frozen=True)
class BatchView:
    """What a fault plan sees of a produced batch."""

    call_number: int  # 1-based count of Produce RPCs
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int


# Returns None (append normally), DROP_REPLY, UNREACHABLE, or an ErrorCode to
# answer for this batch without appending it.
FaultPlan = Callable[[BatchView], "str | ErrorCode | None"]


class _WithFallbacks:
    """Our method where we have one, else the generated UNIMPLEMENTED one."""

    def __init__(self, primary: object, fallback: object) -> None:
        self._primary = primary
        self._fallback = fallback

    def __getattr__(self, name: str) -> Any:
        return getattr(self._primary, name, None) or getattr(self._fallback, name)


@dataclass
class _ProducerState:
    epoch: int
    last_sequence: int
    recent: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=5))


@dataclass
class StoredBatch:
    base_offset: int
    data: bytes
    # Left out of fetches, as a read_committed fetch leaves out aborted data.
    filtered: bool = False

    @property
    def next_offset(self) -> int:
        return self.base_offset + codec.read_header(self.data).record_count


class FakeStore:
    """Serves the PartitionStore RPCs the SDK uses (Metadata, Produce, Fetch,
    ListOffsets) and TransactionCoordinator.InitProducerId; the others answer
    UNIMPLEMENTED."""

    def __init__(self, *, workers: int = 1, fault: FaultPlan | None = None,
                 init_producer_id_failures: int = 0, with_coordinator: bool = True) -> None:
        self.fault = fault
        self.lock = threading.Lock()
        self.appended = threading.Condition(self.lock)
        self.fetch_calls = 0
        self.fetch_fault: Callable[[int], grpc.StatusCode | None] | None = None
        self.topics: dict[str, tuple[int, dict[str, str]]] = {}
        self.logs: dict[tuple[str, int], list[StoredBatch]] = {}
        self.producers: dict[tuple[int, str, int], _ProducerState] = {}
        self.produce_calls = 0
        self.init_producer_id_calls = 0
        self.init_producer_id_failures = init_producer_id_failures
        self.next_producer_id = 1000
        self.with_coordinator = with_coordinator
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
        # The generated servicer base classes are abstract for mypy; the server
        # only looks methods up by name, and the rest fall back to UNIMPLEMENTED.
        partition_store_pb2_grpc.add_PartitionStoreServicer_to_server(
            cast(partition_store_pb2_grpc.PartitionStoreServicer, _WithFallbacks(
                self, cast(Any, partition_store_pb2_grpc.PartitionStoreServicer)())),
            self.server)
        coordinator_pb2_grpc.add_TransactionCoordinatorServicer_to_server(
            cast(coordinator_pb2_grpc.TransactionCoordinatorServicer, _WithFallbacks(
                self, cast(Any, coordinator_pb2_grpc.TransactionCoordinatorServicer)())),
            self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self.server.start()

    def close(self) -> None:
        self.server.stop(None)

    def __enter__(self) -> FakeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_topic(self, name: str, partitions: int, config: dict[str, str] | None = None
                     ) -> None:
        with self.lock:
            self.topics[name] = (partitions, dict(config or {}))
            for p in range(partitions):
                self.logs[(name, p)] = []

    def records(self, topic: str, partition: int) -> list[codec.Record]:
        with self.lock:
            stored = list(self.logs[(topic, partition)])
        out: list[codec.Record] = []
        for b in stored:
            out.extend(codec.iter_records(codec.with_base_offset(b.data, b.base_offset)))
        return out

    def append_raw(self, topic: str, partition: int, batch: bytes, *,
                   filtered: bool = False) -> int:
        """Appends an encoded batch as is (control batches, corrupt bytes, data
        a fetch must leave out); returns its base offset."""
        with self.lock:
            log = self.logs[(topic, partition)]
            base = log[-1].next_offset if log else 0
            log.append(StoredBatch(base, codec.with_base_offset(batch, base), filtered))
            self.appended.notify_all()
            return base

    def headers(self, topic: str, partition: int) -> list[codec.BatchHeader]:
        with self.lock:
            return [codec.read_header(b.data) for b in self.logs[(topic, partition)]]

    # ------------------------------------------------------------------ RPCs

    def Metadata(self, request: partition_store_pb2.MetadataRequest,
                 context: grpc.ServicerContext) -> partition_store_pb2.MetadataResponse:
        node = records_pb2.Node(node_id=0, address=self.address)
        with self.lock:
            topics = [
                partition_store_pb2.TopicMetadata(
                    name=name, topic_id=i + 1,
                    partitions=[partition_store_pb2.PartitionMetadata(partition=p,
                                                                      leader_node_id=0)
                                for p in range(n)],
                    config=config,
                )
                for i, (name, (n, config)) in enumerate(sorted(self.topics.items()))
            ]
        return partition_store_pb2.MetadataResponse(
            stores=[node], coordinators=[node] if self.with_coordinator else [],
            topics=topics, controller_node_id=0,
        )

    def InitProducerId(self, request: coordinator_pb2.InitProducerIdRequest,
                       context: grpc.ServicerContext) -> coordinator_pb2.InitProducerIdResponse:
        with self.lock:
            self.init_producer_id_calls += 1
            if self.init_producer_id_calls <= self.init_producer_id_failures:
                return coordinator_pb2.InitProducerIdResponse(
                    error=error_proto(ErrorCode.COORDINATOR_NOT_AVAILABLE, "loading"))
            pid = self.next_producer_id
            self.next_producer_id += 1
        return coordinator_pb2.InitProducerIdResponse(producer_id=pid, producer_epoch=0)

    def Produce(self, request: partition_store_pb2.ProduceRequest,
                context: grpc.ServicerContext) -> partition_store_pb2.ProduceResponse:
        results = []
        drop = False
        with self.lock:
            self.produce_calls += 1
            call_number = self.produce_calls
        for pb in request.batches:
            header = codec.read_header(pb.batch)
            view = BatchView(call_number, pb.topic, pb.partition, header.producer_id,
                             header.producer_epoch, header.base_sequence, header.record_count)
            action = self.fault(view) if self.fault is not None else None
            if action == UNREACHABLE:
                context.abort(grpc.StatusCode.UNAVAILABLE, "store unreachable (fault plan)")
            if isinstance(action, ErrorCode):
                results.append(partition_store_pb2.PartitionProduceResult(
                    topic=pb.topic, partition=pb.partition,
                    error=error_proto(action, f"injected {action.name}")))
                continue
            results.append(self._append(pb))
            drop = drop or action == DROP_REPLY
        if drop:
            context.abort(grpc.StatusCode.UNAVAILABLE, "reply lost (fault plan)")
        return partition_store_pb2.ProduceResponse(results=results)

    def _append(self, pb: partition_store_pb2.PartitionBatch
                ) -> partition_store_pb2.PartitionProduceResult:
        def fail(code: ErrorCode, message: str) -> partition_store_pb2.PartitionProduceResult:
            return partition_store_pb2.PartitionProduceResult(
                topic=pb.topic, partition=pb.partition, error=error_proto(code, message))

        with self.lock:
            if (pb.topic, pb.partition) not in self.logs:
                return fail(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{pb.topic}-{pb.partition}")
            _n, config = self.topics[pb.topic]
            limit = int(config.get("max.message.bytes", str(1 << 20)))
            try:
                header = codec.validate_batch(pb.batch, max_size_bytes=limit)
            except codec.BatchFormatError as exc:
                return fail(ErrorCode.CORRUPT_MESSAGE, str(exc))
            log = self.logs[(pb.topic, pb.partition)]
            next_offset = log[-1].next_offset if log else 0
            pid = header.producer_id
            if pid >= 0:
                key = (pid, pb.topic, pb.partition)
                state = self.producers.get(key)
                first, last = header.base_sequence, header.last_sequence
                if state is not None and header.producer_epoch < state.epoch:
                    return fail(ErrorCode.INVALID_PRODUCER_EPOCH, "old epoch")
                if state is None or header.producer_epoch > state.epoch:
                    if first != 0:
                        return fail(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                    f"new epoch must start at 0, got {first}")
                    state = _ProducerState(epoch=header.producer_epoch, last_sequence=-1)
                else:
                    for r_first, r_last, r_offset in state.recent:
                        if (r_first, r_last) == (first, last):
                            return partition_store_pb2.PartitionProduceResult(
                                topic=pb.topic, partition=pb.partition, base_offset=r_offset,
                                duplicate=True)
                    if first != codec.next_sequence(state.last_sequence):
                        return fail(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                    f"expected {codec.next_sequence(state.last_sequence)}, "
                                    f"got {first}")
                state.last_sequence = last
                state.recent.append((first, last, next_offset))
                self.producers[key] = state
            log.append(StoredBatch(next_offset, codec.with_base_offset(pb.batch, next_offset)))
            self.appended.notify_all()
        return partition_store_pb2.PartitionProduceResult(
            topic=pb.topic, partition=pb.partition, base_offset=next_offset,
            log_append_time_ms=int(time.time() * 1000))

    def Fetch(self, request: partition_store_pb2.FetchRequest,
              context: grpc.ServicerContext) -> partition_store_pb2.FetchResponse:
        with self.lock:
            self.fetch_calls += 1
            call_number = self.fetch_calls
        if self.fetch_fault is not None:
            status = self.fetch_fault(call_number)
            if status is not None:
                context.abort(status, "injected fetch failure")
        deadline = time.monotonic() + request.max_wait_ms / 1000
        with self.lock:
            while True:
                results = [self._fetch_one(p) for p in request.partitions]
                if any(r.batches or r.error.code for r in results):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.appended.wait(remaining)
        return partition_store_pb2.FetchResponse(results=results)

    def _fetch_one(self, p: partition_store_pb2.FetchPartition
                   ) -> partition_store_pb2.PartitionFetchResult:
        log = self.logs.get((p.topic, p.partition))
        if log is None:
            return partition_store_pb2.PartitionFetchResult(
                topic=p.topic, partition=p.partition,
                error=error_proto(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, p.topic))
        end = log[-1].next_offset if log else 0
        if not 0 <= p.fetch_offset <= end:
            return partition_store_pb2.PartitionFetchResult(
                topic=p.topic, partition=p.partition, high_watermark=end,
                error=error_proto(ErrorCode.OFFSET_OUT_OF_RANGE,
                                  f"offset {p.fetch_offset} outside 0..{end}"))
        batches: list[bytes] = []
        size = 0
        next_fetch = p.fetch_offset
        for stored in log:
            if stored.next_offset <= p.fetch_offset:
                continue
            if batches and size + len(stored.data) > p.max_bytes:
                break
            next_fetch = stored.next_offset
            if stored.filtered:
                continue
            batches.append(stored.data)
            size += len(stored.data)
        return partition_store_pb2.PartitionFetchResult(
            topic=p.topic, partition=p.partition, high_watermark=end,
            last_stable_offset=end, log_start_offset=0, batches=batches,
            next_fetch_offset=next_fetch)

    def ListOffsets(self, request: partition_store_pb2.ListOffsetsRequest,
                    context: grpc.ServicerContext) -> partition_store_pb2.ListOffsetsResponse:
        results = []
        with self.lock:
            for p in request.partitions:
                log = self.logs[(p.topic, p.partition)]
                end = log[-1].next_offset if log else 0
                offset = {-2: 0, -1: end}.get(p.timestamp_ms, -1)
                if p.timestamp_ms >= 0:
                    for stored in log:
                        hits = [r.offset for r in codec.iter_records(stored.data)
                                if r.timestamp_ms >= p.timestamp_ms]
                        if hits:
                            offset = hits[0]
                            break
                results.append(partition_store_pb2.ListOffsetsResult(
                    topic=p.topic, partition=p.partition, offset=offset))
        return partition_store_pb2.ListOffsetsResponse(results=results)
