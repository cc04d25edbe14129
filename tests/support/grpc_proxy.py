"""A gRPC proxy that sits between clients and one partition store and can lose
replies on purpose.

It forwards every unary call byte for byte. For Produce it can let the store
append and then drop the reply (the client sees UNAVAILABLE), which is the
"lost acknowledgement" a retrying producer must survive without duplicates.
Metadata replies are rewritten so clients keep talking through the proxy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from oncelog.v1 import partition_store_pb2 as ps

PRODUCE = "/oncelog.v1.PartitionStore/Produce"
METADATA = "/oncelog.v1.PartitionStore/Metadata"


def _identity(data: bytes) -> bytes:
    return data


@dataclass
class DropPolicy:
    """Which Produce replies to drop: the n-th calls (1-based) in `drop_calls`,
    after the store has handled them."""

    drop_calls: set[int] = field(default_factory=set)
    produce_calls: int = 0
    dropped: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def should_drop(self) -> bool:
        with self.lock:
            self.produce_calls += 1
            if self.produce_calls in self.drop_calls:
                self.dropped += 1
                return True
            return False


class _Forwarder(grpc.GenericRpcHandler):
    def __init__(self, proxy: LostReplyProxy) -> None:
        self._proxy = proxy

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        upstream = self._proxy.upstream_channel.unary_unary(
            method, request_serializer=_identity, response_deserializer=_identity
        )

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                reply = upstream(request, timeout=30)
            except grpc.RpcError as exc:
                context.abort(exc.code(), exc.details() or "")
            if method == PRODUCE and self._proxy.policy.should_drop():
                context.abort(grpc.StatusCode.UNAVAILABLE, "reply dropped by the test proxy")
            if method == METADATA:
                reply = self._proxy.rewrite_metadata(reply)
            return reply

        return grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=_identity, response_serializer=_identity
        )


class LostReplyProxy:
    """Listens on a free loopback port and forwards to `upstream_address`."""

    def __init__(self, upstream_address: str, policy: DropPolicy | None = None) -> None:
        self.policy = policy or DropPolicy()
        self.upstream_address = upstream_address
        self.upstream_channel = grpc.insecure_channel(
            upstream_address,
            options=[("grpc.max_send_message_length", 64 << 20),
                     ("grpc.max_receive_message_length", 64 << 20)],
        )
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=16),
            options=[("grpc.max_send_message_length", 64 << 20),
                     ("grpc.max_receive_message_length", 64 << 20)],
        )
        self._server.add_generic_rpc_handlers((_Forwarder(self),))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self.metadata_hook: Callable[[ps.MetadataResponse], None] | None = None

    def rewrite_metadata(self, reply: bytes) -> bytes:
        meta = ps.MetadataResponse.FromString(reply)
        for node in meta.stores:
            if node.address == self.upstream_address:
                node.address = self.address
        return meta.SerializeToString()

    def __enter__(self) -> LostReplyProxy:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)
        self.upstream_channel.close()
