"""How a follower store reaches its leader for replica fetches.

Goal: the gRPC LeaderLink (services/partition_store/rpc/replica_link.py)
sends a follower's fetches as messages on one ReplicaFetchStream per leader;
falls back to unary ReplicaFetch calls at a leader that does not serve the
stream (UNIMPLEMENTED: an older store during a rolling upgrade) and keeps
using them there; drops a fetch given up while parked without losing the
stream for the next one; and reports a leader's refusal with the leader's
error code, by either path.

Method: a real store runtime (services/partition_store/server.py's `wire`
over a MemoryStore) behind its real servicer, on the services' own server
(ServiceServer, with its RPC interceptor) on 127.0.0.1. That interceptor's
request counter (`oncelog_rpc_requests_total`, by method) tells stream
messages from unary calls. To play a store of the version before the
stream, one more interceptor answers ReplicaFetchStream as unknown. The
link is the production class, asked as the fetcher asks it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from oncelog.v1 import partition_store_pb2_grpc
from oncelog.wire import records as codec
from oncelog.wire.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.common.metadata.cluster import ClusterLayout
from services.common.rpc.server_base import ServiceServer
from services.partition_store import server as store_server
from services.partition_store.api import ProduceItem, ReplicaFetchItem, TopicSpec
from services.partition_store.rpc.replica_link import GrpcLeaderLink
from services.partition_store.rpc.servicer import SERVICE_NAME as STORE_SERVICE_NAME
from services.partition_store.rpc.servicer import PartitionStoreServicer
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.storage.memory import MemoryStore

LEADER = 0
# The store is a single copy (no etcd): its only replica is itself, so the
# fetches name it; what is tested is how they travel, not replication.
FOLLOWER = LEADER
TOPIC = "t"
UNDIALLED = "127.0.0.1:9"


class OlderStore(grpc.aio.ServerInterceptor):
    """Plays a store of the version before ReplicaFetchStream: the server
    answers it as a method it does not know."""

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        if details.method.endswith("/ReplicaFetchStream"):
            return None  # grpc answers UNIMPLEMENTED
        return await continuation(details)


def requests_of(method: str) -> float:
    """Requests the services' RPC interceptor counted for a store method
    (each message of a stream counts as one of the stream's)."""
    value = REGISTRY.get_sample_value(
        "oncelog_rpc_requests_total", {"service": "PartitionStore", "method": method})
    return value or 0.0


def run(without_stream: bool,
        test: Callable[[GrpcLeaderLink, StoreRuntime], Awaitable[None]]) -> tuple[int, int]:
    """Runs `test` against a leader store; returns how many replica fetches
    it received as stream messages and as unary calls."""
    before = requests_of("ReplicaFetchStream"), requests_of("ReplicaFetch")

    async def main() -> None:
        # The layout's address of this store is never dialled on this path
        # (a single copy creates topics and appends by itself), and the
        # servicer must exist before the server picks its port.
        runtime = store_server.wire(MemoryStore(), StoreConfig(
            node_id=LEADER, layout=ClusterLayout(stores=(UNDIALLED,)))).runtime
        await runtime.start()
        # ServiceServer: the services' own server, with the RPC interceptor
        # that turns a servicer's ServiceError into the call's status.
        server = ServiceServer(
            service_name="partition_store", full_service_names=[STORE_SERVICE_NAME],
            register=lambda s: partition_store_pb2_grpc.add_PartitionStoreServicer_to_server(
                PartitionStoreServicer(runtime), s),
            guard=OlderStore() if without_stream else None, shutdown_grace_ms=0)
        address = f"127.0.0.1:{await server.start('127.0.0.1:0')}"
        await server.set_serving()
        [created] = await runtime.create_topics([TopicSpec(TOPIC, 1, {})], validate_only=False)
        assert created.error is None, created.error
        link = GrpcLeaderLink(lambda: {LEADER: address})
        try:
            await test(link, runtime)
        finally:
            await link.close()
            await server.server.stop(None)
            await runtime.close()

    asyncio.run(main())
    return (int(requests_of("ReplicaFetchStream") - before[0]),
            int(requests_of("ReplicaFetch") - before[1]))


async def append(runtime: StoreRuntime, value: bytes) -> None:
    [outcome] = await runtime.produce(
        [ProduceItem(TOPIC, 0, codec.encode_batch([(None, value, None, 1_000)]))])
    assert outcome.error is None, outcome.error


async def fetch(link: GrpcLeaderLink, offset: int, *, max_wait_ms: int = 0) -> int:
    """One fetch without a session; the leader's log end offset."""
    _session, [outcome] = await link.replica_fetch(
        LEADER, FOLLOWER, [ReplicaFetchItem(TOPIC, 0, offset, -1, 1 << 20)],
        max_wait_ms=max_wait_ms)
    assert outcome.error is None, outcome.error
    return outcome.log_end_offset


@pytest.mark.parametrize(("without_stream", "fetches", "received"), [
    (False, 5, (5, 0)),  # messages on one stream
    (True, 3, (0, 3)),  # a leader without the stream: unary calls
])
def test_fetches_go_on_the_stream_or_as_calls_where_there_is_none(
        without_stream: bool, fetches: int, received: tuple[int, int]) -> None:
    async def test(link: GrpcLeaderLink, runtime: StoreRuntime) -> None:
        for i in range(fetches):
            await append(runtime, b"v%d" % i)
            assert await fetch(link, i) == i + 1

    assert run(without_stream, test) == received


def test_a_fetch_given_up_while_parked_leaves_the_stream_usable() -> None:
    async def test(link: GrpcLeaderLink, runtime: StoreRuntime) -> None:
        await append(runtime, b"first")
        parked = asyncio.ensure_future(fetch(link, 1, max_wait_ms=5000))
        await asyncio.sleep(0.2)
        assert not parked.done()
        parked.cancel()  # as the fetcher does when a partition is added
        with contextlib.suppress(asyncio.CancelledError):
            await parked
        # The parked fetch is answered now, to nobody; the next one is not
        # confused by that answer.
        await append(runtime, b"second")
        assert await fetch(link, 0) == 2

    assert run(False, test) == (2, 0)


@pytest.mark.parametrize("without_stream", [False, True])
def test_a_refusal_keeps_the_leaders_code(without_stream: bool) -> None:
    async def test(link: GrpcLeaderLink, runtime: StoreRuntime) -> None:
        with pytest.raises(ServiceError) as refused:
            await fetch(link, 0, max_wait_ms=-1)
        assert refused.value.code is ErrorCode.INVALID_REQUEST
        assert f"leader store node {LEADER}" in refused.value.message
        assert "max_wait_ms is -1" in refused.value.message
        await append(runtime, b"v")
        assert await fetch(link, 0) == 1

    run(without_stream, test)
