"""An in-process partition store and transaction coordinator with scripted
faults, for testing the SDK's sender and transaction logic without starting
processes.

It keeps each partition's log in memory and applies the idempotent append
rules of docs (DESIGN §3): per producer id and partition, the epoch, the last
five batches for deduplication, and the next expected sequence. A `FaultPlan`
decides, per produced batch, whether to answer an error instead of appending,
or to append and then lose the reply (the client sees UNAVAILABLE).

The coordinator side (`FakeTxnCoordinator` rules, inside FakeStore) speaks the
transaction RPCs with transaction version 2's rules in their simplest form:
InitProducerId bumps the epoch (aborting an open transaction first),
AddPartitionsToTxn/AddOffsetsToTxn open the transaction, EndTxn writes the
markers at once (epoch + 1, as the real coordinator does), bumps the epoch and
recognises a retry whose answer was lost; two-phase commit in its simplest
form too (PrepareTransaction, InitProducerId keeping a prepared transaction,
CompleteTransaction committing on a matching prepared state, else aborting,
and answering a repeated completion). A transactional batch is accepted
only for a partition in its producer's open transaction (the store's
verification); with `add_partitions_to_txn` on the request (the SDK sets it)
the store first adds the partition on the producer's behalf, as the real store
does through the coordinator, recorded and fault-planned as an
AddPartitionsToTxn call. A `CoordinatorFaultPlan` decides per call whether to answer an
error (a gRPC status carrying our Error), to apply it and lose the reply, or
to be unreachable. `calls` records every coordinator call.

The group side (with group_coordinator=True) is scripted rather than a
second assignor: a member joins (epoch 0) and gets what the test gives it
with `set_assignment`, which also moves its epoch; heartbeats check member
id and epoch (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH) and record what the
member reports as owned; `remove_member` is a session timeout.
OffsetCommit applies the ownership rules of docs/groups.md, OffsetFetch
answers UNSTABLE_OFFSET_COMMIT for a partition with a pending transactional
offset when asked for stable offsets, TxnOffsetCommit keeps offsets pending
until the producer's transaction ends.

Not a model of the real services' performance or of their crash recovery;
those are tested against the same SDK in tests/integration.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, cast

import grpc

from oncelog import records as codec
from oncelog.errors import ErrorCode
from oncelog.v1 import (
    coordinator_pb2,
    coordinator_pb2_grpc,
    group_coordinator_pb2,
    group_coordinator_pb2_grpc,
    partition_store_pb2,
    partition_store_pb2_grpc,
    records_pb2,
)
from oncelog.wire.status import error_proto
from services.common.errors import to_grpc_status

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

# Given the coordinator method's name ("EndTxn", ...) and its request: None
# (answer normally), DROP_REPLY (apply, then lose the reply), UNREACHABLE
# (fail without applying), or an ErrorCode to answer (as a gRPC status with our
# Error in its details) without applying.
CoordinatorFaultPlan = Callable[[str, Any], "str | ErrorCode | None"]

CONSUMER_OFFSETS = "__consumer_offsets"


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class FakeTxn:
    """One transactional id at the fake coordinator."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str = "Empty"
    partitions: set[tuple[str, int]] = field(default_factory=set)
    # The id/epoch before the last EndTxn bump and that EndTxn's kind: a
    # retried EndTxn carries them.
    previous: tuple[int, int] | None = None
    last_commit: bool | None = None
    start_ms: int = -1
    # Two-phase commit: the Prepared transaction's state, and the last
    # prepared one's state and whether it committed.
    prepared: tuple[int, int] | None = None
    last_prepared: tuple[int, int] | None = None
    last_prepared_committed: bool = False


class _WithFallbacks:
    """Our method where we have one, else the generated UNIMPLEMENTED one."""

    def __init__(self, primary: object, fallback: object) -> None:
        self._primary = primary
        self._fallback = fallback

    def __getattr__(self, name: str) -> Any:
        return getattr(self._primary, name, None) or getattr(self._fallback, name)


@dataclass
class FakeMember:
    """One member of a group at the fake group coordinator."""

    member_id: str
    epoch: int
    group_instance_id: str
    subscribed_topics: tuple[str, ...]
    # What the test assigned, and whether the member has been told.
    target: frozenset[tuple[str, int]] = frozenset()
    target_sent: bool = False
    # What the member's last heartbeat reported.
    owned: frozenset[tuple[str, int]] = frozenset()
    # The epoch before set_assignment's: a heartbeat sent before the member
    # heard of the new one carries it, and is accepted (as KIP-848 does).
    previous_epoch: int = -1


@dataclass
class _ProducerState:
    epoch: int
    last_sequence: int
    recent: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=5))
    last_timestamp_ms: int = -1
    coordinator_epoch: int = -1
    txn_start_offset: int = -1


@dataclass
class StoredBatch:
    base_offset: int
    data: bytes
    # Left out of fetches, as a read_committed fetch leaves out aborted data.
    filtered: bool = False
    # Transactional data: None while its transaction is open, then whether the
    # marker committed it.
    committed: bool | None = None

    @property
    def next_offset(self) -> int:
        return self.base_offset + codec.read_header(self.data).record_count


class FakeStore:
    """Serves the PartitionStore RPCs the SDK uses (Metadata, Produce, Fetch,
    ListOffsets, DescribeProducers, WriteTxnMarkers), the TransactionCoordinator
    RPCs, and (with group_coordinator=True) GroupCoordinator's
    ConsumerGroupHeartbeat, OffsetCommit, OffsetFetch and TxnOffsetCommit;
    the others answer UNIMPLEMENTED."""

    def __init__(self, *, workers: int = 1, fault: FaultPlan | None = None,
                 init_producer_id_failures: int = 0, with_coordinator: bool = True,
                 group_coordinator: bool = False) -> None:
        self.fault = fault
        self.coordinator_fault: CoordinatorFaultPlan | None = None
        self.calls: list[tuple[str, Any]] = []
        self.txns: dict[str, FakeTxn] = {}
        # Committed through TxnOffsetCommit, then the marker: group -> {(t, p): offset}.
        self.pending_offsets: dict[tuple[str, int], dict[tuple[str, int], int]] = {}
        self.committed_offsets: dict[str, dict[tuple[str, int], int]] = {}
        self.group_coordinator = group_coordinator
        # group id -> member id -> member (the scripted group side).
        self.groups: dict[str, dict[str, FakeMember]] = {}
        self.heartbeat_interval_ms = 20
        self._member_ids = itertools.count(1)
        self._group_epoch = itertools.count(1)
        # Accept transactional batches without the coordinator's check (the
        # real store's --unsafe-skip-txn-verification), to make hanging ones.
        self.skip_txn_verification = False
        # AddPartitionsToTxn calls a client made itself (the store's own, made
        # for add_partitions_to_txn requests, are in `calls` only).
        self.client_add_partitions_calls = 0
        # Produce requests that asked the store to add partitions.
        self.add_partitions_requests = 0
        self.coordinator_epoch = 0
        self.lock = threading.Lock()
        self.appended = threading.Condition(self.lock)
        self.fetch_calls = 0
        # The partitions of each Fetch request, in request order.
        self.fetch_orders: list[list[tuple[str, int]]] = []
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
        group_coordinator_pb2_grpc.add_GroupCoordinatorServicer_to_server(
            cast(group_coordinator_pb2_grpc.GroupCoordinatorServicer, _WithFallbacks(
                _GroupSide(self),
                cast(Any, group_coordinator_pb2_grpc.GroupCoordinatorServicer)())),
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

    def committed_values(self, topic: str, partition: int) -> list[bytes | None]:
        """What a read_committed reader sees: values of non-transactional data
        and of committed transactions (control batches and open or aborted
        transactions left out)."""
        with self.lock:
            stored = list(self.logs[(topic, partition)])
        out: list[bytes | None] = []
        for b in stored:
            header = codec.read_header(b.data)
            if header.is_control or (header.is_transactional and b.committed is not True):
                continue
            out.extend(r.value for r in codec.iter_records(b.data))
        return out

    def data_values(self, topic: str, partition: int) -> list[bytes | None]:
        """Every data record's value, whatever its transaction's outcome."""
        with self.lock:
            stored = list(self.logs[(topic, partition)])
        return [r.value for b in stored if not codec.read_header(b.data).is_control
                for r in codec.iter_records(b.data)]

    def last_stable_offset(self, topic: str, partition: int) -> int:
        with self.lock:
            return self._lso(self.logs[(topic, partition)])

    @staticmethod
    def _lso(log: list[StoredBatch]) -> int:
        for stored in log:
            header = codec.read_header(stored.data)
            if header.is_transactional and not header.is_control and stored.committed is None:
                return stored.base_offset
        return log[-1].next_offset if log else 0

    # ------------------------------------------------------------ groups

    def members(self, group_id: str) -> dict[str, FakeMember]:
        with self.lock:
            return dict(self.groups.get(group_id, {}))

    def wait_for_members(self, group_id: str, count: int, timeout_s: float = 30.0
                         ) -> list[FakeMember]:
        """Blocks until the group has `count` members (a failure guard, not a timing)."""
        deadline = time.monotonic() + timeout_s
        while True:
            members = list(self.members(group_id).values())
            if len(members) == count:
                return members
            if time.monotonic() > deadline:
                raise AssertionError(f"group {group_id!r} has {len(members)} members, "
                                     f"not {count}")
            time.sleep(0.005)

    def set_assignment(self, group_id: str, member_id: str,
                       partitions: set[tuple[str, int]]) -> int:
        """Gives the member this target assignment with a new epoch; returns it."""
        with self.lock:
            member = self.groups[group_id][member_id]
            member.target = frozenset(partitions)
            member.target_sent = False
            member.previous_epoch = member.epoch
            member.epoch = next(self._group_epoch) + 1
            return member.epoch

    def remove_member(self, group_id: str, member_id: str) -> None:
        """The member's session timed out."""
        with self.lock:
            del self.groups[group_id][member_id]

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
            group_coordinators=[node] if self.group_coordinator else [],
            topics=topics, controller_node_id=0,
        )

    def ListTopics(self, request: partition_store_pb2.ListTopicsRequest,
                   context: grpc.ServicerContext) -> partition_store_pb2.ListTopicsResponse:
        return partition_store_pb2.ListTopicsResponse(
            topics=self.Metadata(partition_store_pb2.MetadataRequest(), context).topics)

    def InitProducerId(self, request: coordinator_pb2.InitProducerIdRequest,
                       context: grpc.ServicerContext) -> coordinator_pb2.InitProducerIdResponse:
        if request.transactional_id:
            return self._coordinator_call("InitProducerId", request, context,
                                          self._init_transactional)
        with self.lock:
            self.init_producer_id_calls += 1
            if self.init_producer_id_calls <= self.init_producer_id_failures:
                return coordinator_pb2.InitProducerIdResponse(
                    error=error_proto(ErrorCode.COORDINATOR_NOT_AVAILABLE, "loading"))
            pid = self.next_producer_id
            self.next_producer_id += 1
        return coordinator_pb2.InitProducerIdResponse(producer_id=pid, producer_epoch=0)

    # ------------------------------------------------------ coordinator side

    def _coordinator_call(self, name: str, request: Any, context: grpc.ServicerContext,
                          handler: Callable[[Any], Any]) -> Any:
        """Records the call, applies the fault plan, runs handler(request)
        under the lock; a _Refused becomes a status carrying our Error."""
        with self.lock:
            copy = type(request)()
            copy.CopyFrom(request)
            self.calls.append((name, copy))
        action = self.coordinator_fault(name, request) if self.coordinator_fault else None
        if action == UNREACHABLE:
            context.abort(grpc.StatusCode.UNAVAILABLE, "coordinator unreachable (fault plan)")
        if isinstance(action, ErrorCode):
            context.abort_with_status(to_grpc_status(action, f"injected {action.name}"))
        try:
            with self.lock:
                reply = handler(request)
        except _Refused as refused:
            context.abort_with_status(to_grpc_status(refused.code, refused.message))
        if action == DROP_REPLY:
            context.abort(grpc.StatusCode.UNAVAILABLE, "reply lost (fault plan)")
        return reply

    def calls_named(self, name: str) -> list[Any]:
        with self.lock:
            return [request for n, request in self.calls if n == name]

    def FindCoordinator(self, request: coordinator_pb2.FindCoordinatorRequest,
                        context: grpc.ServicerContext) -> coordinator_pb2.FindCoordinatorResponse:
        def find(req: coordinator_pb2.FindCoordinatorRequest
                 ) -> coordinator_pb2.FindCoordinatorResponse:
            if req.type == coordinator_pb2.GROUP and not self.group_coordinator:
                raise _Refused(ErrorCode.COORDINATOR_NOT_AVAILABLE, "no group coordinator")
            return coordinator_pb2.FindCoordinatorResponse(node_id=0, address=self.address)
        return cast(coordinator_pb2.FindCoordinatorResponse,
                    self._coordinator_call("FindCoordinator", request, context, find))

    def _txn_of(self, transactional_id: str, producer_id: int, producer_epoch: int) -> FakeTxn:
        txn = self.txns.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            raise _Refused(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                           f"{transactional_id!r} does not map to producer {producer_id}")
        if txn.producer_epoch != producer_epoch:
            raise _Refused(ErrorCode.PRODUCER_FENCED,
                           f"epoch {producer_epoch} is fenced; current {txn.producer_epoch}")
        return txn

    def _init_transactional(self, request: coordinator_pb2.InitProducerIdRequest
                            ) -> coordinator_pb2.InitProducerIdResponse:
        txn = self.txns.get(request.transactional_id)
        if txn is None:
            txn = FakeTxn(self.next_producer_id, 0, request.transaction_timeout_ms)
            self.next_producer_id += 1
            self.txns[request.transactional_id] = txn
        else:
            if txn.state == "Prepared" and request.keep_prepared_txn:
                txn.producer_epoch += 1
                txn.previous = None
                assert txn.prepared is not None
                return coordinator_pb2.InitProducerIdResponse(
                    producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
                    prepared_transaction=coordinator_pb2.PreparedTxnState(
                        producer_id=txn.prepared[0], producer_epoch=txn.prepared[1]))
            if txn.state in ("Ongoing", "Prepared"):
                # Fence the old instance and abort what it left open.
                txn.producer_epoch += 1
                self._end_open(txn, commit=False)
            txn.producer_epoch += 1
            txn.previous = None
            txn.timeout_ms = request.transaction_timeout_ms
        return coordinator_pb2.InitProducerIdResponse(
            producer_id=txn.producer_id, producer_epoch=txn.producer_epoch)

    def _end_open(self, txn: FakeTxn, *, commit: bool) -> None:
        """Markers for the open (or prepared) transaction; remembers how a
        prepared one ended."""
        if txn.state == "Prepared":
            txn.last_prepared, txn.last_prepared_committed = txn.prepared, commit
            txn.prepared = None
        self._write_markers(txn, commit=commit)

    def PrepareTransaction(self, request: coordinator_pb2.PrepareTransactionRequest,
                           context: grpc.ServicerContext
                           ) -> coordinator_pb2.PrepareTransactionResponse:
        def prepare(req: coordinator_pb2.PrepareTransactionRequest
                    ) -> coordinator_pb2.PrepareTransactionResponse:
            txn = self._txn_of(req.transactional_id, req.producer_id, req.producer_epoch)
            if txn.state != "Prepared":
                txn.state = "Prepared"
                txn.prepared = (req.producer_id, req.producer_epoch)
            return coordinator_pb2.PrepareTransactionResponse(
                prepared_transaction=coordinator_pb2.PreparedTxnState(
                    producer_id=req.producer_id, producer_epoch=req.producer_epoch))
        return cast(coordinator_pb2.PrepareTransactionResponse,
                    self._coordinator_call("PrepareTransaction", request, context, prepare))

    def CompleteTransaction(self, request: coordinator_pb2.CompleteTransactionRequest,
                            context: grpc.ServicerContext
                            ) -> coordinator_pb2.CompleteTransactionResponse:
        def complete(req: coordinator_pb2.CompleteTransactionRequest
                     ) -> coordinator_pb2.CompleteTransactionResponse:
            given = (req.prepared_transaction.producer_id,
                     req.prepared_transaction.producer_epoch)
            txn = self.txns.get(req.transactional_id)
            retry = txn is not None and txn.previous == (req.producer_id, req.producer_epoch)
            if not retry:
                txn = self._txn_of(req.transactional_id, req.producer_id, req.producer_epoch)
            assert txn is not None
            if not retry and txn.state == "Prepared":
                match = txn.prepared == given
                txn.previous = (txn.producer_id, txn.producer_epoch)
                txn.last_commit = match
                txn.producer_epoch += 1
                self._end_open(txn, commit=match)
            elif txn.last_prepared != given:
                raise _Refused(ErrorCode.INVALID_TXN_STATE, f"no prepared transaction {given}")
            return coordinator_pb2.CompleteTransactionResponse(
                committed=txn.last_prepared == given and txn.last_prepared_committed,
                producer_id=txn.producer_id, producer_epoch=txn.producer_epoch)
        return cast(coordinator_pb2.CompleteTransactionResponse,
                    self._coordinator_call("CompleteTransaction", request, context, complete))

    def AddPartitionsToTxn(self, request: coordinator_pb2.AddPartitionsToTxnRequest,
                           context: grpc.ServicerContext
                           ) -> coordinator_pb2.AddPartitionsToTxnResponse:
        def add(req: coordinator_pb2.AddPartitionsToTxnRequest
                ) -> coordinator_pb2.AddPartitionsToTxnResponse:
            self.client_add_partitions_calls += 1
            txn = self._txn_of(req.transactional_id, req.producer_id, req.producer_epoch)
            self._open(txn, {(p.topic, p.partition) for p in req.partitions})
            return coordinator_pb2.AddPartitionsToTxnResponse(results=[
                coordinator_pb2.AddPartitionsToTxnResult(partition=p) for p in req.partitions
            ])
        return cast(coordinator_pb2.AddPartitionsToTxnResponse,
                    self._coordinator_call("AddPartitionsToTxn", request, context, add))

    def _open(self, txn: FakeTxn, partitions: set[tuple[str, int]]) -> None:
        if txn.state != "Ongoing":
            txn.state = "Ongoing"
            txn.partitions = set()
            txn.start_ms = int(time.time() * 1000)
        txn.partitions |= partitions

    def AddOffsetsToTxn(self, request: coordinator_pb2.AddOffsetsToTxnRequest,
                        context: grpc.ServicerContext) -> coordinator_pb2.AddOffsetsToTxnResponse:
        def add(req: coordinator_pb2.AddOffsetsToTxnRequest
                ) -> coordinator_pb2.AddOffsetsToTxnResponse:
            txn = self._txn_of(req.transactional_id, req.producer_id, req.producer_epoch)
            self._open(txn, {(CONSUMER_OFFSETS, 0)})
            return coordinator_pb2.AddOffsetsToTxnResponse()
        return cast(coordinator_pb2.AddOffsetsToTxnResponse,
                    self._coordinator_call("AddOffsetsToTxn", request, context, add))

    def EndTxn(self, request: coordinator_pb2.EndTxnRequest,
               context: grpc.ServicerContext) -> coordinator_pb2.EndTxnResponse:
        def end(req: coordinator_pb2.EndTxnRequest) -> coordinator_pb2.EndTxnResponse:
            txn = self.txns.get(req.transactional_id)
            if (txn is not None and txn.previous == (req.producer_id, req.producer_epoch)
                    and txn.last_commit == req.commit):
                # A retry whose first answer was lost: the same answer again.
                return coordinator_pb2.EndTxnResponse(
                    producer_id=txn.producer_id, producer_epoch=txn.producer_epoch)
            txn = self._txn_of(req.transactional_id, req.producer_id, req.producer_epoch)
            is_open = txn.state in ("Ongoing", "Prepared")
            if not is_open and req.commit:
                raise _Refused(ErrorCode.INVALID_TXN_STATE, "no open transaction to commit")
            txn.previous = (txn.producer_id, txn.producer_epoch)
            txn.last_commit = req.commit
            txn.producer_epoch += 1
            if is_open:
                self._end_open(txn, commit=req.commit)
            else:
                txn.state = "CompleteAbort"
            return coordinator_pb2.EndTxnResponse(
                producer_id=txn.producer_id, producer_epoch=txn.producer_epoch)
        return cast(coordinator_pb2.EndTxnResponse,
                    self._coordinator_call("EndTxn", request, context, end))

    def _write_markers(self, txn: FakeTxn, *, commit: bool) -> None:
        """The markers of txn's open transaction (epoch = txn.producer_epoch, already
        bumped), then Complete*. Caller holds the lock."""
        for topic, partition in sorted(txn.partitions):
            if topic == CONSUMER_OFFSETS:
                continue
            self._append_marker(topic, partition, txn.producer_id, txn.producer_epoch,
                                commit=commit, coordinator_epoch=self.coordinator_epoch)
        if CONSUMER_OFFSETS in {t for t, _p in txn.partitions}:
            for (group, pid), offsets in list(self.pending_offsets.items()):
                if pid == txn.producer_id:
                    del self.pending_offsets[(group, pid)]
                    if commit:
                        self.committed_offsets.setdefault(group, {}).update(offsets)
        txn.state = "CompleteCommit" if commit else "CompleteAbort"
        txn.partitions = set()
        txn.start_ms = -1

    def _append_marker(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                       *, commit: bool, coordinator_epoch: int) -> int:
        log = self.logs[(topic, partition)]
        for stored in log:
            header = codec.read_header(stored.data)
            if (header.producer_id == producer_id and header.is_transactional
                    and not header.is_control and stored.committed is None):
                stored.committed = commit
                stored.filtered = not commit
        base = log[-1].next_offset if log else 0
        marker = codec.encode_control_batch(
            marker=codec.MARKER_COMMIT if commit else codec.MARKER_ABORT,
            coordinator_epoch=coordinator_epoch, producer_id=producer_id,
            producer_epoch=producer_epoch, timestamp_ms=int(time.time() * 1000),
            base_offset=base,
        )
        log.append(StoredBatch(base, marker))
        state = self.producers.get((producer_id, topic, partition))
        if state is not None:
            state.epoch = producer_epoch
            state.last_sequence = -1
            state.recent.clear()
            state.coordinator_epoch = coordinator_epoch
            state.txn_start_offset = -1
        self.appended.notify_all()
        return base

    def time_out_transaction(self, transactional_id: str) -> None:
        """What the coordinator does to a transaction past its timeout: abort it
        with an epoch bump, fencing its producer."""
        with self.lock:
            txn = self.txns[transactional_id]
            if txn.state == "Ongoing":
                txn.producer_epoch += 1
                txn.previous = None
                self._write_markers(txn, commit=False)

    def AbortTransaction(self, request: coordinator_pb2.AbortTransactionRequest,
                         context: grpc.ServicerContext
                         ) -> coordinator_pb2.AbortTransactionResponse:
        def abort(req: coordinator_pb2.AbortTransactionRequest
                  ) -> coordinator_pb2.AbortTransactionResponse:
            txn = self.txns.get(req.transactional_id)
            if txn is None or txn.state != "Ongoing":
                raise _Refused(ErrorCode.INVALID_TXN_STATE, "no open transaction")
            partitions = sorted(txn.partitions)
            txn.producer_epoch += 1
            txn.previous = None
            self._write_markers(txn, commit=False)
            return coordinator_pb2.AbortTransactionResponse(
                transaction=coordinator_pb2.TransactionDescription(
                    transactional_id=req.transactional_id, state="PrepareAbort",
                    producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
                    transaction_timeout_ms=txn.timeout_ms,
                    partitions=[records_pb2.TopicPartition(topic=t, partition=p)
                                for t, p in partitions],
                    coordinator_epoch=self.coordinator_epoch))
        return cast(coordinator_pb2.AbortTransactionResponse,
                    self._coordinator_call("AbortTransaction", request, context, abort))

    def ListTransactions(self, request: coordinator_pb2.ListTransactionsRequest,
                         context: grpc.ServicerContext
                         ) -> coordinator_pb2.ListTransactionsResponse:
        with self.lock:
            return coordinator_pb2.ListTransactionsResponse(transactions=[
                coordinator_pb2.TransactionListing(
                    transactional_id=tid, producer_id=txn.producer_id, state=txn.state)
                for tid, txn in sorted(self.txns.items())
                if not request.states or txn.state in request.states
            ])

    def DescribeTransactions(self, request: coordinator_pb2.DescribeTransactionsRequest,
                             context: grpc.ServicerContext
                             ) -> coordinator_pb2.DescribeTransactionsResponse:
        out = []
        with self.lock:
            for tid in request.transactional_ids:
                txn = self.txns.get(tid)
                if txn is None:
                    out.append(coordinator_pb2.TransactionDescription(
                        transactional_id=tid,
                        error=error_proto(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, tid)))
                    continue
                out.append(coordinator_pb2.TransactionDescription(
                    transactional_id=tid, state=txn.state, producer_id=txn.producer_id,
                    producer_epoch=txn.producer_epoch, transaction_timeout_ms=txn.timeout_ms,
                    transaction_start_time_ms=txn.start_ms,
                    partitions=[records_pb2.TopicPartition(topic=t, partition=p)
                                for t, p in sorted(txn.partitions)],
                    coordinator_epoch=self.coordinator_epoch))
        return coordinator_pb2.DescribeTransactionsResponse(transactions=out)

    # ------------------------------------------------------------ store side

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
            if request.add_partitions_to_txn and header.is_transactional:
                with self.lock:
                    self.add_partitions_requests += 1
                refused = self._add_for_producer(request.transactional_id, pb, header)
                if refused is not None:
                    results.append(partition_store_pb2.PartitionProduceResult(
                        topic=pb.topic, partition=pb.partition,
                        error=error_proto(refused.code, refused.message)))
                    continue
            results.append(self._append(pb, request.transactional_id))
            drop = drop or action == DROP_REPLY
        if drop:
            context.abort(grpc.StatusCode.UNAVAILABLE, "reply lost (fault plan)")
        return partition_store_pb2.ProduceResponse(results=results)

    def _add_for_producer(self, transactional_id: str, pb: partition_store_pb2.PartitionBatch,
                          header: codec.BatchHeader) -> _Refused | None:
        """The store's AddPartitionsToTxn on the producer's behalf, before the
        producer's first write to the partition in its transaction; the
        coordinator fault plan applies to it (a lost answer or an unreachable
        coordinator reaches the client as COORDINATOR_NOT_AVAILABLE)."""
        tp = (pb.topic, pb.partition)
        with self.lock:
            txn = self.txns.get(transactional_id)
            if (txn is not None and txn.state == "Ongoing" and tp in txn.partitions
                    and (txn.producer_id, txn.producer_epoch)
                    == (header.producer_id, header.producer_epoch)):
                return None
        request = coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            partitions=[records_pb2.TopicPartition(topic=tp[0], partition=tp[1])])
        with self.lock:
            self.calls.append(("AddPartitionsToTxn", request))
        action = self.coordinator_fault("AddPartitionsToTxn", request) \
            if self.coordinator_fault else None
        if isinstance(action, ErrorCode):
            return _Refused(action, f"injected {action.name}")
        if action in (UNREACHABLE, DROP_REPLY):
            return _Refused(ErrorCode.COORDINATOR_NOT_AVAILABLE, "coordinator unreachable")
        with self.lock:
            try:
                txn = self._txn_of(transactional_id, header.producer_id, header.producer_epoch)
            except _Refused as refused:
                return refused
            if txn.state == "Prepared":
                return _Refused(ErrorCode.INVALID_TXN_STATE, "the transaction is prepared")
            self._open(txn, {tp})
        return None

    def _append(self, pb: partition_store_pb2.PartitionBatch, transactional_id: str = ""
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
                    if header.is_transactional:
                        return fail(ErrorCode.PRODUCER_FENCED, "old epoch")
                    return fail(ErrorCode.INVALID_PRODUCER_EPOCH, "old epoch")
                if header.is_transactional and not self.skip_txn_verification:
                    txn = self.txns.get(transactional_id)
                    if (txn is None or txn.producer_id != pid
                            or txn.producer_epoch != header.producer_epoch
                            or txn.state != "Ongoing"
                            or (pb.topic, pb.partition) not in txn.partitions):
                        return fail(ErrorCode.INVALID_TXN_STATE,
                                    f"{pb.topic}-{pb.partition} is not in an open transaction "
                                    f"of {transactional_id!r} producer {pid}")
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
                state.last_timestamp_ms = header.max_timestamp_ms
                if header.is_transactional and state.txn_start_offset < 0:
                    state.txn_start_offset = next_offset
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
            self.fetch_orders.append([(p.topic, p.partition) for p in request.partitions])
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
            last_stable_offset=self._lso(log), log_start_offset=0, batches=batches,
            next_fetch_offset=next_fetch)

    def ListOffsets(self, request: partition_store_pb2.ListOffsetsRequest,
                    context: grpc.ServicerContext) -> partition_store_pb2.ListOffsetsResponse:
        results = []
        with self.lock:
            for p in request.partitions:
                log = self.logs[(p.topic, p.partition)]
                end = log[-1].next_offset if log else 0
                if request.isolation_level == records_pb2.READ_COMMITTED:
                    end = self._lso(log)
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

    def DescribeProducers(self, request: partition_store_pb2.DescribeProducersRequest,
                          context: grpc.ServicerContext
                          ) -> partition_store_pb2.DescribeProducersResponse:
        results = []
        with self.lock:
            for tp in request.partitions:
                views = [
                    partition_store_pb2.ProducerStateView(
                        producer_id=pid, producer_epoch=st.epoch, last_sequence=st.last_sequence,
                        last_timestamp_ms=st.last_timestamp_ms,
                        coordinator_epoch=st.coordinator_epoch,
                        current_txn_start_offset=st.txn_start_offset)
                    for (pid, topic, partition), st in sorted(self.producers.items())
                    if (topic, partition) == (tp.topic, tp.partition)
                ]
                results.append(partition_store_pb2.DescribeProducersResult(
                    topic=tp.topic, partition=tp.partition, producers=views))
        return partition_store_pb2.DescribeProducersResponse(results=results)

    def WriteTxnMarkers(self, request: partition_store_pb2.WriteTxnMarkersRequest,
                        context: grpc.ServicerContext
                        ) -> partition_store_pb2.WriteTxnMarkersResponse:
        results = []
        with self.lock:
            self.calls.append(("WriteTxnMarkers", request))
            for m in request.markers:
                for tp in m.partitions:
                    state = self.producers.get((m.producer_id, tp.topic, tp.partition))
                    error = None
                    offset = -1
                    if state is not None and m.producer_epoch <= state.epoch:
                        error = error_proto(ErrorCode.INVALID_PRODUCER_EPOCH,
                                            f"marker epoch {m.producer_epoch} not above "
                                            f"{state.epoch}")
                    elif state is not None and m.coordinator_epoch < state.coordinator_epoch:
                        error = error_proto(ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                                            "old coordinator epoch")
                    else:
                        offset = self._append_marker(
                            tp.topic, tp.partition, m.producer_id, m.producer_epoch,
                            commit=m.type == partition_store_pb2.COMMIT,
                            coordinator_epoch=m.coordinator_epoch)
                    results.append(partition_store_pb2.MarkerPartitionResult(
                        producer_id=m.producer_id, topic=tp.topic, partition=tp.partition,
                        error=error, offset=offset))
        return partition_store_pb2.WriteTxnMarkersResponse(results=results)


class _GroupSide:
    """GroupCoordinator of the fake (see the module's doc): scripted
    membership, offsets with the ownership rules, transactional offsets
    pending until the producer's transaction ends (then committed or
    dropped)."""

    def __init__(self, store: FakeStore) -> None:
        self._store = store

    def ConsumerGroupHeartbeat(self, request: group_coordinator_pb2.ConsumerGroupHeartbeatRequest,
                               context: grpc.ServicerContext
                               ) -> group_coordinator_pb2.ConsumerGroupHeartbeatResponse:
        store = self._store

        def beat(req: group_coordinator_pb2.ConsumerGroupHeartbeatRequest
                 ) -> group_coordinator_pb2.ConsumerGroupHeartbeatResponse:
            members = store.groups.setdefault(req.group_id, {})
            if req.member_epoch == 0:
                if not req.subscribed_topics:
                    raise _Refused(ErrorCode.INVALID_REQUEST, "join without topics")
                for old_id, old in list(members.items()):
                    if req.group_instance_id and old.group_instance_id == req.group_instance_id:
                        del members[old_id]  # a static member replaced
                member = FakeMember(f"member-{next(store._member_ids)}",
                                    next(store._group_epoch), req.group_instance_id,
                                    tuple(req.subscribed_topics))
                members[member.member_id] = member
            else:
                found = members.get(req.member_id)
                if found is None:
                    raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID,
                                   f"member {req.member_id!r} is not in {req.group_id!r}")
                member = found
                if req.member_epoch < 0:
                    del members[req.member_id]
                    return group_coordinator_pb2.ConsumerGroupHeartbeatResponse(
                        member_id=req.member_id, member_epoch=req.member_epoch)
                if req.member_epoch not in (member.epoch, member.previous_epoch):
                    raise _Refused(ErrorCode.FENCED_MEMBER_EPOCH,
                                   f"epoch {req.member_epoch}, expected {member.epoch}")
                member.owned = frozenset((p.topic, p.partition) for p in req.owned_partitions)
                member.subscribed_topics = tuple(req.subscribed_topics)
            resp = group_coordinator_pb2.ConsumerGroupHeartbeatResponse(
                member_id=member.member_id, member_epoch=member.epoch,
                heartbeat_interval_ms=store.heartbeat_interval_ms,
            )
            if not member.target_sent:
                member.target_sent = True
                resp.has_assignment = True
                resp.assignment.extend(
                    records_pb2.TopicPartition(topic=t, partition=p)
                    for t, p in sorted(member.target))
            return resp

        return cast(group_coordinator_pb2.ConsumerGroupHeartbeatResponse,
                    store._coordinator_call("ConsumerGroupHeartbeat", request, context, beat))

    def OffsetCommit(self, request: group_coordinator_pb2.OffsetCommitRequest,
                     context: grpc.ServicerContext) -> group_coordinator_pb2.OffsetCommitResponse:
        store = self._store

        def commit(req: group_coordinator_pb2.OffsetCommitRequest
                   ) -> group_coordinator_pb2.OffsetCommitResponse:
            members = store.groups.get(req.group_id, {})
            if any(p.offset < 0 for p in req.partitions):
                raise _Refused(ErrorCode.INVALID_REQUEST, "negative offset")
            results = []
            if req.member_id:
                member = members.get(req.member_id)
                if member is None:
                    raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"no member {req.member_id!r}")
                if req.generation_id > member.epoch:
                    raise _Refused(ErrorCode.FENCED_MEMBER_EPOCH, "generation above epoch")
            elif members:
                raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID, "the group has members")
            else:
                member = None
            stale = [p for p in req.partitions
                     if member is not None and (p.topic, p.partition) not in member.owned]
            for p in req.partitions:
                error = (error_proto(ErrorCode.STALE_MEMBER_EPOCH, "not owned")
                         if p in stale else None)
                results.append(group_coordinator_pb2.OffsetPartitionResult(
                    topic=p.topic, partition=p.partition, error=error))
            if not stale:
                offsets = store.committed_offsets.setdefault(req.group_id, {})
                for p in req.partitions:
                    offsets[(p.topic, p.partition)] = p.offset
            return group_coordinator_pb2.OffsetCommitResponse(results=results)

        return cast(group_coordinator_pb2.OffsetCommitResponse,
                    store._coordinator_call("OffsetCommit", request, context, commit))

    def OffsetFetch(self, request: group_coordinator_pb2.OffsetFetchRequest,
                    context: grpc.ServicerContext) -> group_coordinator_pb2.OffsetFetchResponse:
        store = self._store

        def fetch(req: group_coordinator_pb2.OffsetFetchRequest
                  ) -> group_coordinator_pb2.OffsetFetchResponse:
            committed = store.committed_offsets.get(req.group_id, {})
            pending = {tp for (group, _pid), offsets in store.pending_offsets.items()
                       if group == req.group_id for tp in offsets}
            wanted = ([(p.topic, p.partition) for p in req.partitions] if req.partitions
                      else sorted(committed))
            out = []
            for tp in wanted:
                part = group_coordinator_pb2.OffsetFetchPartition(
                    topic=tp[0], partition=tp[1], offset=committed.get(tp, -1))
                if req.require_stable and tp in pending:
                    part.error.CopyFrom(error_proto(ErrorCode.UNSTABLE_OFFSET_COMMIT, "pending"))
                out.append(part)
            return group_coordinator_pb2.OffsetFetchResponse(partitions=out)

        return cast(group_coordinator_pb2.OffsetFetchResponse,
                    store._coordinator_call("OffsetFetch", request, context, fetch))

    def TxnOffsetCommit(self, request: group_coordinator_pb2.TxnOffsetCommitRequest,
                        context: grpc.ServicerContext
                        ) -> group_coordinator_pb2.TxnOffsetCommitResponse:
        store = self._store

        def commit(req: group_coordinator_pb2.TxnOffsetCommitRequest
                   ) -> group_coordinator_pb2.TxnOffsetCommitResponse:
            txn = store._txn_of(req.transactional_id, req.producer_id, req.producer_epoch)
            if (CONSUMER_OFFSETS, 0) not in txn.partitions or txn.state != "Ongoing":
                raise _Refused(ErrorCode.INVALID_TXN_STATE, "AddOffsetsToTxn first")
            members = store.groups.get(req.group_id)
            if req.member_id and members is not None:
                member = members.get(req.member_id)
                if member is None:
                    raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"no member {req.member_id!r}")
                if any((p.topic, p.partition) not in member.owned for p in req.partitions):
                    raise _Refused(ErrorCode.STALE_MEMBER_EPOCH, "a partition is not owned")
            pending = store.pending_offsets.setdefault((req.group_id, req.producer_id), {})
            for p in req.partitions:
                pending[(p.topic, p.partition)] = p.offset
            return group_coordinator_pb2.TxnOffsetCommitResponse(results=[
                group_coordinator_pb2.OffsetPartitionResult(topic=p.topic, partition=p.partition)
                for p in req.partitions
            ])

        return cast(group_coordinator_pb2.TxnOffsetCommitResponse,
                    store._coordinator_call("TxnOffsetCommit", request, context, commit))
