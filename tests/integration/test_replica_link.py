"""How a follower store reaches its leader for replica fetches.

Goal: the gRPC LeaderLink (services/partition_store/rpc/replica_link.py)
sends a follower's fetches as messages on one ReplicaFetchStream per leader;
falls back to unary ReplicaFetch calls at a leader that does not serve the
stream (UNIMPLEMENTED: an older store during a rolling upgrade) and keeps
using them there; drops a fetch given up while parked without losing the
stream for the next one; and reports a leader's refusal with the leader's
error code.

Method: a real grpc.aio server on 127.0.0.1 with a PartitionStore servicer
that answers fetches from a script and counts how each arrived (the
generated base class answers UNIMPLEMENTED for what a test leaves out);
the link is the production class, asked as the fetcher asks it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from oncelog.v1 import partition_store_pb2 as pb
from oncelog.v1 import partition_store_pb2_grpc
from oncelog.wire.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.partition_store.api import ReplicaFetchItem
from services.partition_store.rpc.replica_link import GrpcLeaderLink

LEADER = 1
ITEM = ReplicaFetchItem("t", 0, 5, 3, 1 << 20)


class Leader(partition_store_pb2_grpc.PartitionStoreServicer):
    """Answers every fetch with a session id one above the last, and one
    result naming the fetch offset asked for; a fetch whose max_wait_ms is
    over 1000 parks until the test lets it go."""

    def __init__(self, *, serves_stream: bool) -> None:
        self.serves_stream = serves_stream
        self.unary_calls = 0
        self.stream_messages = 0
        self.streams_opened = 0
        self.release = asyncio.Event()
        self.refuse_next = False
        self._sessions = 0

    async def _answer(self, request: pb.ReplicaFetchRequest) -> pb.ReplicaFetchResponse:
        if request.max_wait_ms > 1000:
            await self.release.wait()
        if self.refuse_next:
            self.refuse_next = False
            raise ServiceError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "no ClusterAction")
        self._sessions += 1
        return pb.ReplicaFetchResponse(
            request_id=request.request_id, session_id=self._sessions,
            results=[pb.ReplicaFetchResult(
                topic=p.topic, partition=p.partition, high_watermark=p.fetch_offset,
                log_end_offset=p.fetch_offset) for p in request.partitions])

    async def ReplicaFetch(self, request: pb.ReplicaFetchRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> pb.ReplicaFetchResponse:
        self.unary_calls += 1
        try:
            return await self._answer(request)
        except ServiceError as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, exc.message)
            raise

    async def ReplicaFetchStream(  # noqa: N802
            self, requests: AsyncIterator[pb.ReplicaFetchRequest],
            context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ReplicaFetchResponse]:
        if not self.serves_stream:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        self.streams_opened += 1
        answers: asyncio.Queue[pb.ReplicaFetchResponse] = asyncio.Queue()

        async def one(request: pb.ReplicaFetchRequest) -> None:
            try:
                answers.put_nowait(await self._answer(request))
            except ServiceError as exc:
                answers.put_nowait(pb.ReplicaFetchResponse(
                    request_id=request.request_id, error=exc.to_proto()))

        async def read() -> None:
            async for request in requests:
                self.stream_messages += 1
                asyncio.ensure_future(one(request))

        reader = asyncio.ensure_future(read())
        try:
            while True:
                yield await answers.get()
        finally:
            reader.cancel()


def run(serves_stream: bool,
        test: Callable[[GrpcLeaderLink, Leader], Awaitable[None]]) -> Leader:
    async def main() -> Leader:
        # The generated base answers UNIMPLEMENTED for every method not
        # overridden here (its stub types them as abstract).
        leader = Leader(serves_stream=serves_stream)  # type: ignore[abstract]
        server = grpc.aio.server()
        partition_store_pb2_grpc.add_PartitionStoreServicer_to_server(leader, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        link = GrpcLeaderLink(lambda: {LEADER: f"127.0.0.1:{port}"})
        try:
            await test(link, leader)
        finally:
            await link.close()
            await server.stop(None)
        return leader

    return asyncio.run(main())


async def fetch(link: GrpcLeaderLink, offset: int, *, max_wait_ms: int = 0,
                session_id: int = 0) -> tuple[int, int]:
    session, [outcome] = await link.replica_fetch(
        LEADER, 2, [ReplicaFetchItem("t", 0, offset, 3, 1 << 20)], max_wait_ms=max_wait_ms,
        session_id=session_id, session_epoch=1)
    return session, outcome.high_watermark


def test_fetches_are_messages_on_one_stream() -> None:
    async def test(link: GrpcLeaderLink, leader: Leader) -> None:
        for offset in range(5):
            assert (await fetch(link, offset))[1] == offset

    leader = run(True, test)
    assert (leader.streams_opened, leader.stream_messages, leader.unary_calls) == (1, 5, 0)


def test_a_leader_without_the_stream_is_asked_with_unary_calls() -> None:
    async def test(link: GrpcLeaderLink, leader: Leader) -> None:
        for offset in range(3):
            assert (await fetch(link, offset))[1] == offset

    leader = run(False, test)
    assert leader.unary_calls == 3
    assert leader.stream_messages == 0


def test_a_fetch_given_up_while_parked_leaves_the_stream_usable() -> None:
    async def test(link: GrpcLeaderLink, leader: Leader) -> None:
        parked = asyncio.ensure_future(fetch(link, 7, max_wait_ms=5000))
        await asyncio.sleep(0.2)
        parked.cancel()  # the fetcher does so when a partition is added
        with contextlib.suppress(asyncio.CancelledError):
            await parked
        leader.release.set()  # the parked one is answered late, to nobody
        assert (await fetch(link, 8))[1] == 8

    leader = run(True, test)
    assert leader.streams_opened == 1
    assert leader.stream_messages == 2


@pytest.mark.parametrize("serves_stream", [True, False])
def test_a_refusal_keeps_the_leaders_code(serves_stream: bool) -> None:
    async def test(link: GrpcLeaderLink, leader: Leader) -> None:
        leader.refuse_next = True
        with pytest.raises(ServiceError) as refused:
            await fetch(link, 1)
        assert f"leader store node {LEADER}" in refused.value.message
        if serves_stream:
            assert refused.value.code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert (await fetch(link, 2))[1] == 2

    run(serves_stream, test)
