"""Request streams on the server: answer_each and the RPC interceptor's
per-message gate (services/common/rpc/request_streams.py, interceptor.py).

Goal: a stream answers every request it started, under that request's id,
as each completes (not in arrival order); a request that fails as a whole,
or that an interceptor refused, is answered in the stream and the others go
on; a message that arrives while the process drains ends the stream with
SHUTTING_DOWN after the answers of the requests already started, and is
never handed to the servicer; each message counts as a request in flight
until its answer leaves, so a drain waits for it.

Method: the real functions with asyncio and a fake servicer context whose
abort raises; no gRPC server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from oncelog.v1 import partition_store_pb2 as ps
from oncelog.wire.errors import ErrorCode
from oncelog.wire.status import error_from_status
from services.common.kernel import metrics
from services.common.kernel.errors import ServiceError
from services.common.rpc.interceptor import RpcInterceptor, _MethodMetrics
from services.common.rpc.request_streams import Refused, answer_each


class Aborted(Exception):
    """What the fake context raises where grpc ends the call."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class FakeContext:
    async def abort_with_status(self, status: Any) -> None:
        error = error_from_status(status.code, status.details, status.trailing_metadata)
        raise Aborted(ErrorCode.from_wire(error.code), error.message)


def method_metrics() -> _MethodMetrics:
    return _MethodMetrics(
        "TestService", "Stream",
        requests=metrics.RPC_REQUESTS.labels("TestService", "Stream"),
        latency=metrics.RPC_LATENCY_SECONDS.labels("TestService", "Stream"),
        in_flight=metrics.RPC_IN_FLIGHT.labels("TestService"))


def fake_context() -> Any:
    """A FakeContext, typed as the grpc context the wrapped handler takes."""
    return FakeContext()


async def feed(queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    while (item := await queue.get()) is not None:
        yield item


def test_answers_come_as_requests_complete_and_a_failure_stays_alone() -> None:
    async def scenario() -> list[ps.ProduceResponse]:
        release_first = asyncio.Event()

        async def handle(request: ps.ProduceRequest) -> ps.ProduceResponse:
            if request.request_id == 1:
                await release_first.wait()
            if request.request_id == 3:
                raise ServiceError(ErrorCode.INVALID_REQUEST, "request 3 is bad")
            return ps.ProduceResponse(request_id=request.request_id)

        requests: asyncio.Queue[Any] = asyncio.Queue()
        for item in (ps.ProduceRequest(request_id=1), ps.ProduceRequest(request_id=2),
                     ps.ProduceRequest(request_id=3),
                     Refused(4, ServiceError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "no"))):
            requests.put_nowait(item)
        answers: list[ps.ProduceResponse] = []
        stream = answer_each(feed(requests), handle, ps.ProduceResponse)
        async for answer in stream:
            answers.append(answer)
            if len(answers) == 3:
                release_first.set()
                requests.put_nowait(None)
        return answers

    answers = asyncio.run(scenario())
    # Request 1 waited: the others were answered first, then it.
    assert [a.request_id for a in answers][-1] == 1
    assert sorted(a.request_id for a in answers) == [1, 2, 3, 4]
    codes = {a.request_id: ErrorCode.from_wire(a.error.code) for a in answers}
    assert codes == {1: ErrorCode.NONE, 2: ErrorCode.NONE, 3: ErrorCode.INVALID_REQUEST,
                     4: ErrorCode.TOPIC_AUTHORIZATION_FAILED}


def test_a_bug_in_the_handler_is_answered_not_left_waiting() -> None:
    async def scenario() -> list[ps.ProduceResponse]:
        async def handle(request: ps.ProduceRequest) -> ps.ProduceResponse:
            raise KeyError("a bug")

        requests: asyncio.Queue[Any] = asyncio.Queue()
        requests.put_nowait(ps.ProduceRequest(request_id=9))
        requests.put_nowait(None)
        return [a async for a in answer_each(feed(requests), handle, ps.ProduceResponse)]

    [answer] = asyncio.run(scenario())
    assert answer.request_id == 9
    assert ErrorCode.from_wire(answer.error.code) is ErrorCode.UNKNOWN_SERVER_ERROR
    assert "KeyError" in answer.error.message


def test_a_message_that_arrives_while_draining_ends_the_stream_after_the_others() -> None:
    handled: list[int] = []

    async def scenario() -> tuple[list[int], ErrorCode, list[int]]:
        interceptor = RpcInterceptor("test-service")
        release = asyncio.Event()

        async def handle(request: ps.ProduceRequest) -> ps.ProduceResponse:
            handled.append(request.request_id)
            await release.wait()
            return ps.ProduceResponse(request_id=request.request_id)

        async def servicer(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for answer in answer_each(requests, handle, ps.ProduceResponse):
                yield answer

        wrapped = interceptor._wrap_stream(servicer, method_metrics())
        requests: asyncio.Queue[Any] = asyncio.Queue()
        requests.put_nowait(ps.ProduceRequest(request_id=1))
        answered: list[int] = []
        in_flight_seen: list[int] = []

        async def drain_then_release() -> None:
            while not handled:
                await asyncio.sleep(0)
            in_flight_seen.append(interceptor.in_flight)
            interceptor.draining = True
            requests.put_nowait(ps.ProduceRequest(request_id=2))
            for _ in range(20):
                await asyncio.sleep(0)
            release.set()

        helper = asyncio.create_task(drain_then_release())
        with pytest.raises(Aborted) as ended:
            async for answer in wrapped(feed(requests), fake_context()):
                answered.append(answer.request_id)
        await helper
        in_flight_seen.append(interceptor.in_flight)
        assert await interceptor.wait_idle(1.0)
        return answered, ended.value.code, in_flight_seen

    answered, code, in_flight = asyncio.run(scenario())
    assert answered == [1]
    assert code is ErrorCode.SHUTTING_DOWN
    # Request 2 arrived while draining: never handled, so safe to send again.
    assert handled == [1]
    # Request 1 was in flight until answered; nothing is after the stream ended.
    assert in_flight == [1, 0]


def test_a_stream_opened_while_draining_is_refused() -> None:
    async def scenario() -> ErrorCode:
        interceptor = RpcInterceptor("test-service")
        interceptor.draining = True

        async def servicer(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            raise AssertionError("the servicer must not run")
            yield  # pragma: no cover

        wrapped = interceptor._wrap_stream(servicer, method_metrics())
        requests: asyncio.Queue[Any] = asyncio.Queue()
        with pytest.raises(Aborted) as ended:
            async for _ in wrapped(feed(requests), fake_context()):
                pass
        return ended.value.code

    assert asyncio.run(scenario()) is ErrorCode.SHUTTING_DOWN
