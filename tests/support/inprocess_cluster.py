"""The real services in this process, with a fault layer in front of them,
for the SDK's unit tests.

`InProcessCluster` runs one partition store (`StoreRuntime` over the
in-memory `MemoryStore`), one transaction coordinator
(`TxnCoordinatorRuntime`) and one group coordinator
(`GroupCoordinatorRuntime`), each behind its own servicer and its own
`ServiceServer` (health, reflection and the RPC interceptor of
services/common/rpc/server_base.py) on a loopback port chosen by the OS. They
run on one asyncio loop in a background thread, talk to each other over
gRPC as separate processes do, and are wired by the same `wire()` functions
of services/*/server.py that each process's `main` calls.

Nothing here handles a request: every request reaches a real servicer,
unless the fault layer (`_FaultLayer`, a wrapper in front of each servicer)
fails it. Faults do what a network or an operator can do to a real cluster:

* `fault`, a `FaultPlan` asked per batch of a client's Produce request
  (never of the coordinators' own writes): DROP_REPLY (the store appends,
  the reply is lost: the client sees UNAVAILABLE), UNREACHABLE (the request
  never arrives), or an ErrorCode answered for that batch in the store's
  place (the other batches of the request reach the store). A plan may
  block: it runs in a worker thread, so it holds back its request only (a
  plan that sleeps a little reorders pipelined requests);
* `coordinator_fault`, a `CoordinatorFaultPlan` asked per call of the
  transaction and group coordinators, by clients and by the store (whose
  AddPartitionsToTxn on a producer's behalf a fault reaches like any call):
  DROP_REPLY, UNREACHABLE, or an ErrorCode answered as the services answer
  errors (a gRPC status with our Error in its details);
* `fetch_fault(n)` fails the n-th client Fetch with a gRPC status, and
  `fetch_reply` rewrites a Fetch reply (bytes corrupted on the way);
  `produce_reply` rewrites a Produce reply (a throttle time added).

Every request stream (`<Method>Stream`: ProduceStream,
AddPartitionsToTxnStream, WriteTxnMarkersStream) is taken message by
message, each as a call of `<Method>` with that call's faults; a lost reply
or an unreachable service ends the whole stream (a connection lost).

The layer records every call it passes (`calls_named`), except the
services' own reads and writes of their internal topics.

State is read back through the runtimes' public methods (fetch,
list_offsets, describe, fetch_offsets, describe_group), never from a model
of our own; those reads bypass the fault layer and are not recorded.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc
from google.protobuf import message_factory

from oncelog.v1 import (
    coordinator_pb2,
    coordinator_pb2_grpc,
    group_coordinator_pb2,
    group_coordinator_pb2_grpc,
    partition_store_pb2,
    partition_store_pb2_grpc,
)
from oncelog.wire import records as codec
from oncelog.wire.errors import ErrorCode
from oncelog.wire.status import error_from_status, error_proto
from services.common.metadata.cluster import INTERNAL_PREFIX, ClusterLayout
from services.common.rpc.request_streams import answer_each
from services.common.rpc.server_base import ServiceServer
from services.common.rpc.status import to_grpc_status
from services.coordinator import server as coordinator_server
from services.coordinator.core.transactions import TxnMetadata, TxnState
from services.coordinator.txn_runtime import TxnConfig
from services.group_coordinator import server as group_server
from services.group_coordinator.core.groups import Group, Member
from services.group_coordinator.runtime import GroupConfig
from services.partition_store import server as store_server
from services.partition_store.api import FetchItem, OffsetQuery, ProduceItem, TopicSpec
from services.partition_store.log.partition import Isolation
from services.partition_store.rpc.servicer import SERVICE_NAME as STORE_SERVICE_NAME
from services.partition_store.rpc.servicer import PartitionStoreServicer
from services.partition_store.runtime import StoreConfig
from services.partition_store.storage.memory import MemoryStore

DROP_REPLY = "drop_reply"  # let the service act, then fail the RPC as if the reply was lost
UNREACHABLE = "unreachable"  # fail the RPC before the service sees it

T = TypeVar("T")

_MARKERS_IN_FLIGHT = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT,
                      TxnState.PREPARE_EPOCH_FENCE)


@dataclass(frozen=True)
class BatchView:
    """What a fault plan sees of a produced batch."""

    call_number: int  # 1-based count of clients' Produce requests
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int


# Returns None (let it through), DROP_REPLY, UNREACHABLE, or an ErrorCode to
# answer for this batch in the store's place.
FaultPlan = Callable[[BatchView], "str | ErrorCode | None"]

# Given the coordinator method's name ("EndTxn", ...) and its request: None,
# DROP_REPLY, UNREACHABLE, or an ErrorCode to answer in the coordinator's place.
CoordinatorFaultPlan = Callable[[str, Any], "str | ErrorCode | None"]


def _is_internal(topic: str) -> bool:
    return topic.startswith(INTERNAL_PREFIX)


def _internal_traffic(method: str, request: Any) -> bool:
    """The services' own reads and writes of their internal topics."""
    if method == "Produce":
        return bool(request.coordinator_write) or all(
            _is_internal(b.topic) for b in request.batches)
    if method in ("Fetch", "ListOffsets"):
        return bool(request.partitions) and all(
            _is_internal(p.topic) for p in request.partitions)
    return False


class _FaultLayer:
    """Stands in front of one real servicer: records each call, asks the
    cluster's fault plans, and passes the call on (or fails it). Methods are
    looked up when the server registers them; the servicer behind is set
    once the cluster's layout (which needs every bound port) is known."""

    def __init__(self, cluster: InProcessCluster, service: str) -> None:
        self._cluster = cluster
        self._service = service
        self.target: object | None = None

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        if method.endswith(_STREAM_SUFFIX):
            return functools.partial(self._request_stream, method)
        return functools.partial(self._call, method)

    async def _call(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        cluster = self._cluster
        if self.target is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "still starting")
        upstream = getattr(self.target, method)
        if _internal_traffic(method, request):
            return await upstream(request, context)
        cluster._record(method, request)
        if self._service == "store":
            if method == "Produce":
                return await cluster._produce(upstream, request, context)
            if method == "Fetch":
                return await cluster._fetch(upstream, request, context)
            return await upstream(request, context)
        plan = cluster.coordinator_fault
        action = None if plan is None else await asyncio.to_thread(plan, method, request)
        await _fail_before(action, context, "coordinator")
        reply = await upstream(request, context)
        if action == DROP_REPLY:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "reply lost (fault plan)")
        return reply

    async def _request_stream(self, method: str, requests: AsyncIterator[Any],
                              context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """A request stream (ProduceStream, AddPartitionsToTxnStream,
        WriteTxnMarkersStream): each message goes through what a call of the
        unary method goes through here (recorded as such a call, the same
        faults), to the servicer's unary method. A lost reply or an
        unreachable service ends the whole stream with UNAVAILABLE (a
        connection lost); a request the service refuses as a whole is
        answered in the stream."""
        unary = method[:-len(_STREAM_SUFFIX)]
        # A constructor of the answer message taking its fields as keywords:
        # typed as such because protobuf's stubs give GetMessageClass's result
        # the base Message class, whose constructor takes no fields.
        answer_type: Callable[..., Any] = message_factory.GetMessageClass(
            _SERVICES[self._service].methods_by_name[method].output_type)

        async def handle(request: Any) -> Any:
            message_context: Any = _MessageContext(context)
            try:
                reply = await self._call(unary, request, message_context)
            except _Refused as refused:
                return answer_type(request_id=request.request_id, error=error_from_status(
                    refused.status.code, refused.status.details,
                    refused.status.trailing_metadata))
            except _StreamEnds as end:
                return end  # ends the stream once it comes out (below)
            reply.request_id = request.request_id
            return reply

        # The services' own way of answering a stream (request_streams.py).
        async for answer in answer_each(requests, handle, answer_type):
            if isinstance(answer, _StreamEnds):
                await context.abort(answer.code, answer.details)
            yield answer


_STREAM_SUFFIX = "Stream"
_SERVICES = {
    "store": partition_store_pb2.DESCRIPTOR.services_by_name["PartitionStore"],
    "coordinator": coordinator_pb2.DESCRIPTOR.services_by_name["TransactionCoordinator"],
    "group_coordinator": group_coordinator_pb2.DESCRIPTOR.services_by_name["GroupCoordinator"],
}


class _StreamEnds(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _Refused(Exception):
    def __init__(self, status: Any) -> None:
        super().__init__(status.details)
        self.status = status


class _MessageContext:
    """A unary handler's context for one message of a stream: where the
    handler would end its call, it raises instead (the stream decides)."""

    def __init__(self, real: grpc.aio.ServicerContext) -> None:
        self._real = real

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: Any) -> None:
        raise _StreamEnds(code, details)

    async def abort_with_status(self, status: Any) -> None:
        raise _Refused(status)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


async def _fail_before(action: str | ErrorCode | None, context: grpc.aio.ServicerContext,
                       what: str) -> None:
    if action == UNREACHABLE:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"{what} unreachable (fault plan)")
    if isinstance(action, ErrorCode):
        await context.abort_with_status(  # type: ignore[attr-defined]
            to_grpc_status(action, f"injected {action.name}"))


class InProcessCluster:
    """See the module's doc. `coordinator` / `group_coordinator`: whether the
    layout has one (without, clients get the services' own "no coordinator"
    answers). The timing options are the services' settings of the same
    name (TxnConfig, GroupConfig; all but session_check_interval_ms are also
    flags), shortened so that timeouts fire within a test."""

    def __init__(self, *, coordinator: bool = True, group_coordinator: bool = True,
                 unsafe_skip_txn_verification: bool = False,
                 transaction_check_interval_ms: int = 1000,
                 min_session_timeout_ms: int = 1000,
                 max_heartbeat_interval_ms: int = 3000,
                 session_check_interval_ms: int = 200) -> None:
        self.fault: FaultPlan | None = None
        self.coordinator_fault: CoordinatorFaultPlan | None = None
        self.fetch_fault: Callable[[int], grpc.StatusCode | None] | None = None
        self.fetch_reply: (Callable[[partition_store_pb2.FetchResponse],
                                    partition_store_pb2.FetchResponse] | None) = None
        self.produce_reply: (Callable[[partition_store_pb2.ProduceResponse],
                                      partition_store_pb2.ProduceResponse] | None) = None
        self.lock = threading.Lock()
        self._calls: list[tuple[str, Any]] = []
        self.produce_calls = 0
        self.fetch_calls = 0
        self._kinds = ["store"] + (["coordinator"] if coordinator else []) + (
            ["group_coordinator"] if group_coordinator else [])
        self._unsafe_skip_txn_verification = unsafe_skip_txn_verification
        self._txn_config = TxnConfig(check_interval_ms=transaction_check_interval_ms)
        self._group_config = GroupConfig(min_session_timeout_ms=min_session_timeout_ms,
                                         max_heartbeat_interval_ms=max_heartbeat_interval_ms,
                                         session_check_interval_ms=session_check_interval_ms)
        self._layers = {kind: _FaultLayer(self, kind) for kind in self._kinds}
        self._servers: dict[str, ServiceServer] = {}
        # Each runtime's stop, in the order they are stopped.
        self._stops: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="inprocess-cluster", daemon=True)
        self._thread.start()
        try:
            self._run(self._start())
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ lifecycle

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _start(self) -> None:
        registrations: dict[str, tuple[Callable[[Any, Any], None], str]] = {
            "store": (partition_store_pb2_grpc.add_PartitionStoreServicer_to_server,
                      STORE_SERVICE_NAME),
            "coordinator": (
                coordinator_pb2_grpc.add_TransactionCoordinatorServicer_to_server,
                coordinator_pb2.DESCRIPTOR.services_by_name["TransactionCoordinator"].full_name),
            "group_coordinator": (
                group_coordinator_pb2_grpc.add_GroupCoordinatorServicer_to_server,
                group_coordinator_pb2.DESCRIPTOR.services_by_name["GroupCoordinator"].full_name),
        }
        addresses: dict[str, str] = {}
        for kind in self._kinds:
            add, full_name = registrations[kind]
            layer = self._layers[kind]
            server = ServiceServer(
                service_name=kind, full_service_names=[full_name], shutdown_grace_ms=1000,
                register=functools.partial(add, layer),
                on_draining=self._store_draining if kind == "store" else None)
            port = await server.start("127.0.0.1:0")
            self._servers[kind] = server
            addresses[kind] = f"127.0.0.1:{port}"
        self.layout = ClusterLayout(
            stores=(addresses["store"],),
            coordinators=tuple(a for k, a in addresses.items() if k == "coordinator"),
            group_coordinators=tuple(a for k, a in addresses.items()
                                     if k == "group_coordinator"),
            transaction_state_partitions=1, consumer_offsets_partitions=1,
        )
        self.address = addresses["store"]
        await self._start_store()
        if "coordinator" in self._kinds:
            await self._start_coordinator()
        if "group_coordinator" in self._kinds:
            await self._start_group_coordinator()
        for server in self._servers.values():
            await server.set_serving()

    async def _start_store(self) -> None:
        """The store as services/partition_store/server.py wires it, on a MemoryStore."""
        config = StoreConfig(node_id=0, layout=self.layout,
                             unsafe_skip_txn_verification=self._unsafe_skip_txn_verification)
        self.store = store_server.wire(MemoryStore(), config).runtime
        await self.store.start()
        self._stops.append(self.store.close)
        self._layers["store"].target = PartitionStoreServicer(self.store)

    async def _start_coordinator(self) -> None:
        """The transaction coordinator as services/coordinator/server.py wires it."""
        wired = coordinator_server.wire(self.layout, 0, config=self._txn_config)
        self.transactions = wired.runtime
        self._layers["coordinator"].target = wired.servicer
        await wired.start()
        self._stops.insert(0, wired.stop)

    async def _start_group_coordinator(self) -> None:
        """The group coordinator as services/group_coordinator/server.py wires
        it, without the lag metric's refresh task (no test reads it)."""
        wired = group_server.wire(self.layout, 0, config=self._group_config,
                                  lag_refresh_interval_ms=None)
        self.groups = wired.runtime
        self._layers["group_coordinator"].target = wired.servicer
        await wired.start()
        self._stops.insert(0, wired.stop)

    async def _store_draining(self) -> None:
        # As server.py's `draining`: wake long-polls, refuse new writes.
        self.store.begin_shutdown()

    def close(self) -> None:
        async def shutdown() -> None:
            # Servers first (no new requests), then the runtimes, as
            # server_base.serve's shutdown does; the store last.
            for server in self._servers.values():
                await server.shutdown()
            for stop in self._stops:
                await stop()

        if self._loop.is_running():
            try:
                self._run(shutdown())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> InProcessCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------- fault layer

    def _record(self, method: str, request: Any) -> None:
        copy = type(request)()
        copy.CopyFrom(request)
        with self.lock:
            self._calls.append((method, copy))

    def calls_named(self, method: str) -> list[Any]:
        """The requests of every call of `method` that reached the fault
        layer (clients' and the services' own, but not the services' reads
        and writes of internal topics), in arrival order."""
        with self.lock:
            return [request for name, request in self._calls if name == method]

    async def _produce(self, upstream: Callable[..., Any],
                       request: partition_store_pb2.ProduceRequest,
                       context: grpc.aio.ServicerContext) -> partition_store_pb2.ProduceResponse:
        plan = self.fault
        with self.lock:
            self.produce_calls += 1
            call_number = self.produce_calls
        if plan is None:
            reply = cast(partition_store_pb2.ProduceResponse, await upstream(request, context))
            rewrite = self.produce_reply
            return reply if rewrite is None else rewrite(reply)
        actions: list[str | ErrorCode | None] = []
        for pb in request.batches:
            header = codec.read_header(pb.batch)
            view = BatchView(call_number, pb.topic, pb.partition, header.producer_id,
                             header.producer_epoch, header.base_sequence, header.record_count)
            action = await asyncio.to_thread(plan, view)
            await _fail_before(None if isinstance(action, ErrorCode) else action, context,
                               "store")
            actions.append(action)
        passed = [pb for pb, a in zip(request.batches, actions, strict=True)
                  if not isinstance(a, ErrorCode)]
        answered: list[partition_store_pb2.PartitionProduceResult] = []
        if passed:
            forward = partition_store_pb2.ProduceRequest()
            forward.CopyFrom(request)
            del forward.batches[:]
            forward.batches.extend(passed)
            reply = await upstream(forward, context)
            answered = list(reply.results)
        results = iter(answered)
        merged = [
            partition_store_pb2.PartitionProduceResult(
                topic=pb.topic, partition=pb.partition,
                error=error_proto(a, f"injected {a.name}"))
            if isinstance(a, ErrorCode) else next(results)
            for pb, a in zip(request.batches, actions, strict=True)
        ]
        if DROP_REPLY in actions:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "reply lost (fault plan)")
        return partition_store_pb2.ProduceResponse(results=merged)

    async def _fetch(self, upstream: Callable[..., Any],
                     request: partition_store_pb2.FetchRequest,
                     context: grpc.aio.ServicerContext) -> partition_store_pb2.FetchResponse:
        with self.lock:
            self.fetch_calls += 1
            call_number = self.fetch_calls
        fault = self.fetch_fault
        status = None if fault is None else fault(call_number)
        if status is not None:
            await context.abort(status, "injected fetch failure")
        reply = cast(partition_store_pb2.FetchResponse, await upstream(request, context))
        rewrite = self.fetch_reply
        return reply if rewrite is None else rewrite(reply)

    # ------------------------------------------------------------ set-up

    def create_topic(self, name: str, partitions: int,
                     config: dict[str, str] | None = None) -> None:
        [outcome] = self._run(self.store.create_topics(
            [TopicSpec(name, partitions, dict(config or {}))], validate_only=False))
        if outcome.error is not None:
            raise outcome.error

    def append_raw(self, topic: str, partition: int, batch: bytes) -> int:
        """Appends an encoded batch through the store's produce path (bypassing
        the fault layer); returns its base offset."""
        [outcome] = self._run(self.store.produce([ProduceItem(topic, partition, batch)]))
        if outcome.error is not None:
            raise outcome.error
        return outcome.base_offset

    # ------------------------------------------------------------ read-back

    def settle(self, timeout_s: float = 30.0) -> None:
        """Waits until no transaction's markers are still on their way (the
        coordinator answers EndTxn once its decision is durable and writes
        the markers after). A failure guard, not a timing."""
        if "coordinator" not in self._kinds:
            return

        async def in_flight() -> list[str]:
            return [md.transactional_id for md in self.transactions.list_transactions()
                    if md.state in _MARKERS_IN_FLIGHT]

        deadline = time.monotonic() + timeout_s
        while pending := self._run(in_flight()):
            if time.monotonic() > deadline:
                raise AssertionError(f"markers of {pending} still not written")
            time.sleep(0.002)

    def _read(self, topic: str, partition: int, isolation: Isolation) -> list[bytes]:
        """Every batch a reader with `isolation` gets from offset 0, control
        batches included."""
        self.settle()
        out: list[bytes] = []
        offset = 0
        while True:
            [got] = self._run(self.store.fetch(
                [FetchItem(topic, partition, offset)], isolation=isolation,
                include_control=True))
            if got.error is not None:
                raise got.error
            out.extend(got.batches)
            end = (got.last_stable_offset if isolation is Isolation.READ_COMMITTED
                   else got.high_watermark)
            if got.next_fetch_offset >= end or got.next_fetch_offset == offset:
                return out
            offset = got.next_fetch_offset

    def records(self, topic: str, partition: int, *, read_committed: bool = False
                ) -> list[codec.Record]:
        """The data records (control batches left out) a reader sees."""
        isolation = Isolation.READ_COMMITTED if read_committed else Isolation.READ_UNCOMMITTED
        return [r for b in self._read(topic, partition, isolation)
                if not codec.read_header(b).is_control for r in codec.iter_records(b)]

    def committed_values(self, topic: str, partition: int) -> list[bytes | None]:
        """What a read_committed reader sees."""
        return [r.value for r in self.records(topic, partition, read_committed=True)]

    def data_values(self, topic: str, partition: int) -> list[bytes | None]:
        """Every data record's value, whatever its transaction's outcome."""
        return [r.value for r in self.records(topic, partition)]

    def headers(self, topic: str, partition: int) -> list[codec.BatchHeader]:
        """Every batch's header, control batches included."""
        return [codec.read_header(b)
                for b in self._read(topic, partition, Isolation.READ_UNCOMMITTED)]

    def markers(self, topic: str, partition: int) -> list[tuple[int, int]]:
        """(marker type, producer epoch) of the partition's control batches."""
        return [(codec.control_marker(b)[0], codec.read_header(b).producer_epoch)
                for b in self._read(topic, partition, Isolation.READ_UNCOMMITTED)
                if codec.read_header(b).is_control]

    def last_stable_offset(self, topic: str, partition: int) -> int:
        self.settle()
        [outcome] = self._run(self.store.list_offsets(
            [OffsetQuery(topic, partition, -1)], isolation=Isolation.READ_COMMITTED))
        if outcome.error is not None:
            raise outcome.error
        return outcome.offset

    def transaction(self, transactional_id: str) -> TxnMetadata | None:
        """What the coordinator knows of the id, once its markers are written."""
        self.settle()

        async def describe() -> TxnMetadata | None:
            return self.transactions.describe(transactional_id)[0]
        return self._run(describe())

    def committed_offsets(self, group_id: str, *, stable: bool = True,
                          timeout_s: float = 30.0) -> dict[tuple[str, int], int]:
        """The group's committed offsets. `stable`: first wait until no
        transactional offset of the group is pending (the markers of ended
        transactions reach the group coordinator through its log); else the
        pending ones are left out."""
        self.settle()

        async def fetch() -> tuple[dict[tuple[str, int], int], bool]:
            fetched = self.groups.fetch_offsets(group_id=group_id, partitions=(),
                                                require_stable=stable)
            return ({f.tp: f.offset for f in fetched if f.offset >= 0},
                    any(f.error is not None for f in fetched))

        deadline = time.monotonic() + timeout_s
        while True:
            offsets, unstable = self._run(fetch())
            if not unstable:
                return offsets
            if time.monotonic() > deadline:
                raise AssertionError(f"group {group_id!r} still has pending offsets")
            time.sleep(0.005)

    def members(self, group_id: str) -> dict[str, Member]:
        async def describe() -> dict[str, Member]:
            try:
                group, _epoch = self.groups.describe_group(group_id)
            except Exception:  # GROUP_ID_NOT_FOUND: no members
                return {}
            # Server-assigned groups only (classic ones have no such members).
            return dict(group.members) if isinstance(group, Group) else {}
        return self._run(describe())

    def join_member(self, group_id: str, topics: Sequence[str], *,
                    session_timeout_ms: int = 60_000) -> str:
        """A member that joins through the group coordinator's own protocol
        (one ConsumerGroupHeartbeat with epoch 0) and then stays silent for
        its session: it takes a share of the partitions, which its group's
        other members must first give up. Returns its member id."""
        member_id = f"joined-{uuid.uuid4()}"
        with grpc.insecure_channel(self.layout.group_coordinators[0]) as channel:
            group_coordinator_pb2_grpc.GroupCoordinatorStub(channel).ConsumerGroupHeartbeat(
                group_coordinator_pb2.ConsumerGroupHeartbeatRequest(
                    group_id=group_id, member_id=member_id, member_epoch=0,
                    session_timeout_ms=session_timeout_ms, subscribed_topics=list(topics)),
                timeout=10)
        return member_id

    def wait_for_members(self, group_id: str, count: int, timeout_s: float = 30.0,
                         *, but_not: Sequence[str] = ()) -> list[Member]:
        """Blocks until the group has `count` members none of whose ids is in
        `but_not` (a failure guard, not a timing)."""
        deadline = time.monotonic() + timeout_s
        while True:
            members = list(self.members(group_id).values())
            if len(members) == count and not {m.member_id for m in members} & set(but_not):
                return members
            if time.monotonic() > deadline:
                raise AssertionError(f"group {group_id!r} has members "
                                     f"{[m.member_id for m in members]}, not {count}")
            time.sleep(0.005)
