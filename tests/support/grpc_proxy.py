"""gRPC proxies that sit between clients and oncelog processes and can lose
replies on purpose, or answer in the process's place.

A `LostReplyProxy` forwards every unary call byte for byte to one upstream
process. Its `DropPolicy` can let the upstream act on the n-th call of a
method and then drop the reply (the client sees UNAVAILABLE): the "lost
acknowledgement" a retrying client must survive without duplicates.
The request streams clients use (ProduceStream, EndTxnStream) are forwarded
message by message, each counted as a call of the unary method (Produce,
EndTxn): a dropped reply ends the stream with UNAVAILABLE after the upstream
acted on the request (a connection lost with the reply on it), so every
other request the client had on that stream is unanswered too. Replies
that name addresses (Metadata, FindCoordinator) are rewritten so clients keep
talking through the proxies.

A `ProxyMesh` puts one such proxy in front of every process of a cluster
(stores, transaction coordinators, group coordinators), all sharing one
address map and one policy, so a test can lose, say, the first
"/oncelog.v1.TransactionCoordinator/EndTxn" reply wherever it is served.
The services still talk to each other directly: only clients' replies are lost.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from oncelog.testing import LocalCluster
from oncelog.v1 import coordinator_pb2 as co
from oncelog.v1 import partition_store_pb2 as ps

PRODUCE = "/oncelog.v1.PartitionStore/Produce"
PRODUCE_STREAM = "/oncelog.v1.PartitionStore/ProduceStream"
METADATA = "/oncelog.v1.PartitionStore/Metadata"
FIND_COORDINATOR = "/oncelog.v1.TransactionCoordinator/FindCoordinator"
INIT_PRODUCER_ID = "/oncelog.v1.TransactionCoordinator/InitProducerId"
ADD_OFFSETS_TO_TXN = "/oncelog.v1.TransactionCoordinator/AddOffsetsToTxn"
END_TXN = "/oncelog.v1.TransactionCoordinator/EndTxn"
END_TXN_STREAM = "/oncelog.v1.TransactionCoordinator/EndTxnStream"
PREPARE_TRANSACTION = "/oncelog.v1.TransactionCoordinator/PrepareTransaction"
COMPLETE_TRANSACTION = "/oncelog.v1.TransactionCoordinator/CompleteTransaction"
TXN_OFFSET_COMMIT = "/oncelog.v1.GroupCoordinator/TxnOffsetCommit"
CONSUMER_GROUP_HEARTBEAT = "/oncelog.v1.GroupCoordinator/ConsumerGroupHeartbeat"

_CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 << 20),
                    ("grpc.max_receive_message_length", 64 << 20)]


def _identity(data: bytes) -> bytes:
    return data


@dataclass(frozen=True)
class _StreamOf:
    """A request stream: the unary method its messages count as, and the
    types of its messages."""

    unary: str
    request: type[Any]
    answer: type[Any]


_STREAMS = {
    PRODUCE_STREAM: _StreamOf(PRODUCE, ps.ProduceRequest, ps.ProduceResponse),
    END_TXN_STREAM: _StreamOf(END_TXN, co.EndTxnRequest, co.EndTxnResponse),
}


@dataclass
class DropPolicy:
    """Which replies to drop: those of the n-th calls (1-based) of a method
    that the upstream answered successfully, so the upstream has acted on
    every call whose reply is lost. `drop` maps full gRPC method names to
    call numbers; `drop_calls` is shorthand for Produce calls (the original
    API). Counts are per method across every proxy that shares the policy."""

    drop_calls: set[int] = field(default_factory=set)
    drop: dict[str, set[int]] = field(default_factory=dict)
    # Successful upstream answers per method, and the (method, n) dropped.
    calls: Counter[str] = field(default_factory=Counter)
    dropped_calls: list[tuple[str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # answer(method, request bytes) -> reply bytes to send instead of
    # forwarding the call (the upstream never sees it), or None to forward:
    # an error answer the real process would not give on demand.
    answer: Callable[[str, bytes], bytes | None] | None = None
    # Serve no request stream (clients get UNIMPLEMENTED, as from a service
    # older than the streams): they must fall back to unary calls.
    refuse_streams: bool = False

    def __post_init__(self) -> None:
        if self.drop_calls:
            self.drop = {**self.drop, PRODUCE: self.drop.get(PRODUCE, set()) | self.drop_calls}

    def should_drop(self, method: str = PRODUCE) -> bool:
        with self.lock:
            self.calls[method] += 1
            if self.calls[method] in self.drop.get(method, ()):
                self.dropped_calls.append((method, self.calls[method]))
                return True
            return False

    @property
    def dropped(self) -> int:
        return len(self.dropped_calls)

    @property
    def produce_calls(self) -> int:
        return self.calls[PRODUCE]


class _Forwarder(grpc.GenericRpcHandler):
    def __init__(self, proxy: LostReplyProxy) -> None:
        self._proxy = proxy

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        stream_of = _STREAMS.get(method)
        if stream_of is not None:
            if self._proxy.policy.refuse_streams:
                return None  # type: ignore[return-value]  # grpc: UNIMPLEMENTED
            return grpc.stream_stream_rpc_method_handler(
                functools.partial(self._forward_stream, method, stream_of),
                request_deserializer=_identity, response_serializer=_identity)
        upstream = self._proxy.upstream_channel.unary_unary(
            method, request_serializer=_identity, response_deserializer=_identity
        )

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            answer = self._proxy.policy.answer
            injected = None if answer is None else answer(method, request)
            if injected is not None:
                return injected
            try:
                reply = upstream(request, timeout=30)
            except grpc.RpcError as exc:
                # The services put their typed Error in the trailing metadata
                # (grpc-status-details-bin); without it the client would get
                # only the bare gRPC code, and PRODUCER_FENCED would arrive as
                # UNKNOWN_SERVER_ERROR.
                context.set_trailing_metadata(
                    tuple((md.key, md.value) for md in exc.trailing_metadata() or ()))
                context.abort(exc.code(), exc.details() or "")
            if self._proxy.policy.should_drop(method):
                context.abort(grpc.StatusCode.UNAVAILABLE, "reply dropped by the test proxy")
            return self._proxy.rewrite(method, reply)

        return grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=_identity, response_serializer=_identity
        )


    def _forward_stream(self, method: str, stream_of: _StreamOf, requests: Iterator[bytes],
                        context: grpc.ServicerContext) -> Iterator[bytes]:
        policy = self._proxy.policy
        replies: queue.SimpleQueue[bytes | _StreamEnd] = queue.SimpleQueue()
        upstream_requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

        def from_client() -> None:
            try:
                for request in requests:
                    injected = (None if policy.answer is None
                                else policy.answer(stream_of.unary, request))
                    if injected is None:
                        upstream_requests.put(request)
                        continue
                    answer = stream_of.answer.FromString(injected)
                    answer.request_id = stream_of.request.FromString(request).request_id
                    replies.put(answer.SerializeToString())
            except grpc.RpcError:
                pass  # the client went away
            finally:
                upstream_requests.put(None)

        def from_upstream() -> None:
            upstream = self._proxy.upstream_channel.stream_stream(
                method, request_serializer=_identity, response_deserializer=_identity)
            try:
                for reply in upstream(iter(upstream_requests.get, None)):
                    failed = stream_of.answer.FromString(reply).error.code != 0
                    if not failed and policy.should_drop(stream_of.unary):
                        replies.put(_StreamEnd(grpc.StatusCode.UNAVAILABLE,
                                               "reply dropped by the test proxy"))
                        return
                    replies.put(reply)
                replies.put(_StreamEnd(None, ""))
            except grpc.RpcError as exc:
                replies.put(_StreamEnd(exc.code(), exc.details() or "",
                                       exc.trailing_metadata() or ()))

        threading.Thread(target=from_client, daemon=True).start()
        threading.Thread(target=from_upstream, daemon=True).start()
        while not isinstance(reply := replies.get(), _StreamEnd):
            yield reply
        if reply.code is not None:
            context.set_trailing_metadata(tuple((md.key, md.value) for md in reply.metadata))
            context.abort(reply.code, reply.details)


@dataclass(frozen=True)
class _StreamEnd:
    code: grpc.StatusCode | None
    details: str
    metadata: Iterable[Any] = ()


class LostReplyProxy:
    """Listens on a free loopback port and forwards to `upstream_address`.

    `addresses` maps upstream addresses to the proxies in front of them (a
    ProxyMesh shares one map between its proxies); without it the proxy only
    knows itself, and addresses of other processes pass through unchanged."""

    def __init__(self, upstream_address: str, policy: DropPolicy | None = None,
                 addresses: dict[str, str] | None = None) -> None:
        self.policy = policy or DropPolicy()
        self.upstream_address = upstream_address
        self.upstream_channel = grpc.insecure_channel(upstream_address, options=_CHANNEL_OPTIONS)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                                   options=_CHANNEL_OPTIONS)
        self._server.add_generic_rpc_handlers((_Forwarder(self),))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self.addresses = addresses if addresses is not None else {}
        self.addresses[upstream_address] = self.address

    def rewrite(self, method: str, reply: bytes) -> bytes:
        """The reply with every upstream address it names replaced by its proxy's."""
        if method == METADATA:
            return self.rewrite_metadata(reply)
        if method == FIND_COORDINATOR:
            found = co.FindCoordinatorResponse.FromString(reply)
            found.address = self.addresses.get(found.address, found.address)
            return found.SerializeToString()
        return reply

    def rewrite_metadata(self, reply: bytes) -> bytes:
        meta = ps.MetadataResponse.FromString(reply)
        for node in (*meta.stores, *meta.coordinators, *meta.group_coordinators):
            node.address = self.addresses.get(node.address, node.address)
        return meta.SerializeToString()

    def __enter__(self) -> LostReplyProxy:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)
        self.upstream_channel.close()


class ProxyMesh:
    """A LostReplyProxy in front of each of `upstream_addresses`, sharing one
    policy and one address map: a client bootstrapped at `bootstrap` reaches
    every process only through a proxy."""

    def __init__(self, upstream_addresses: Iterable[str], policy: DropPolicy | None = None
                 ) -> None:
        self.policy = policy or DropPolicy()
        self.addresses: dict[str, str] = {}
        # Every proxy binds its port here, so the map is complete before any
        # proxy serves (a Metadata reply rewritten early would miss some).
        self.proxies = [LostReplyProxy(upstream, self.policy, self.addresses)
                        for upstream in dict.fromkeys(upstream_addresses)]

    @classmethod
    def in_front_of(cls, cluster: LocalCluster, policy: DropPolicy | None = None) -> ProxyMesh:
        """Proxies for every process of `cluster`; the bootstrap is its first store's."""
        return cls([proc.address for procs in cluster.processes.values() for proc in procs],
                   policy)

    @property
    def bootstrap(self) -> str:
        """The proxy of the first upstream (for a LocalCluster, its bootstrap store)."""
        return self.proxies[0].address

    def __enter__(self) -> ProxyMesh:
        for proxy in self.proxies:
            proxy.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for proxy in self.proxies:
            proxy.__exit__()
