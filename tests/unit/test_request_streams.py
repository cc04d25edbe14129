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


def _bounded_stream(requests: list[ps.ProduceRequest], *, max_in_flight: int,
                    max_in_flight_bytes: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Streams `requests` into answer_each with handlers that wait until
    released, releasing them one by one; returns (messages read, requests
    running) each time before a release, and the ids answered."""
    async def scenario() -> tuple[list[tuple[int, int]], list[int]]:
        releases: asyncio.Queue[asyncio.Event] = asyncio.Queue()
        read = 0
        running = 0

        async def source() -> AsyncIterator[Any]:
            nonlocal read
            for request in requests:
                read += 1
                yield request

        async def handle(request: ps.ProduceRequest) -> ps.ProduceResponse:
            nonlocal running
            running += 1
            release = asyncio.Event()
            releases.put_nowait(release)
            await release.wait()
            running -= 1
            return ps.ProduceResponse(request_id=request.request_id)

        answered: list[int] = []
        seen: list[tuple[int, int]] = []

        async def drive() -> None:
            async for answer in answer_each(source(), handle, ps.ProduceResponse,
                                            max_in_flight=max_in_flight,
                                            max_in_flight_bytes=max_in_flight_bytes):
                answered.append(answer.request_id)

        consumer = asyncio.create_task(drive())
        while len(answered) < len(requests):
            for _ in range(20):  # let the reader go as far as it may
                await asyncio.sleep(0)
            if releases.empty():
                continue  # answers of released requests are still on their way
            seen.append((read, running))
            releases.get_nowait().set()
        await consumer
        return seen, answered

    return asyncio.run(scenario())


def test_a_stream_reads_no_further_than_its_bound_of_requests_in_flight() -> None:
    """A client that keeps sending while its requests wait (a throttled
    producer that ignores its throttle time, or one faster than the disk)
    is pushed back: the server runs at most the bound at once and reads one
    message past it (the one waiting for room), so gRPC's flow control
    stops the client; each completion lets one more in, and every request
    is answered."""
    requests = [ps.ProduceRequest(request_id=i) for i in range(1, 11)]
    seen, answered = _bounded_stream(requests, max_in_flight=3, max_in_flight_bytes=1 << 20)
    assert seen[:7] == [(4, 3), (5, 3), (6, 3), (7, 3), (8, 3), (9, 3), (10, 3)]
    assert sorted(answered) == list(range(1, 11))


def test_a_stream_reads_no_further_than_its_bound_of_bytes_in_flight() -> None:
    """The same by size: two 40 KiB requests fit under a 100 KiB bound, a
    third waits; a request larger than the bound still runs when it is
    alone, so no request is refused for its size here."""
    big = ps.PartitionBatch(topic="t", partition=0, batch=b"x" * (40 << 10))
    requests = [ps.ProduceRequest(request_id=i, batches=[big]) for i in range(1, 5)]
    huge = ps.PartitionBatch(topic="t", partition=0, batch=b"x" * (200 << 10))
    requests.append(ps.ProduceRequest(request_id=5, batches=[huge]))
    seen, answered = _bounded_stream(requests, max_in_flight=100, max_in_flight_bytes=100 << 10)
    assert seen == [(3, 2), (4, 2), (5, 2), (5, 1), (5, 1)]
    assert sorted(answered) == [1, 2, 3, 4, 5]
