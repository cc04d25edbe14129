"""Calls between services that share a process, without gRPC.

Goal: a call answered in-process (services/common/rpc/local_calls.py) keeps
what a caller of a remote service relies on: only the process's own
addresses are answered in-process; a request whose caller stops waiting
(deadline, cancellation) still runs to its end, as on a server whose client
went away, and one that then fails is not logged as an exception nobody
retrieved; the handler does not run as the caller's principal; the errors
are the codes a request stream would answer with. And `StreamMethod`, the
services' client of each other, takes that path for an own address and
does not open a channel for it.

Method: handlers that record what they saw, on a real event loop; a
channel that fails the test if used.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
from typing import Any

import pytest

from oncelog.v1 import coordinator_pb2
from oncelog.wire.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.common.rpc.local_calls import InProcess
from services.common.rpc.stream_client import StreamMethod

METHOD = "/oncelog.v1.TransactionCoordinator/EndTxnStream"
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="nobody")


def test_only_own_addresses_and_served_methods_are_answered_in_process() -> None:
    local = InProcess(["127.0.0.1:7000", ""])

    async def handler(_request: Any) -> Any:
        return None

    local.serve(METHOD, handler)
    assert local.handler("127.0.0.1:7000", METHOD) is handler
    assert local.handler("127.0.0.1:7001", METHOD) is None
    assert local.handler("127.0.0.1:7000", "/oncelog.v1.TransactionCoordinator/EndTxn") is None
    assert local.addresses == {"127.0.0.1:7000"}


@pytest.mark.parametrize("method", [
    "/oncelog.v1.TransactionCoordinator/EndTxnStreem",  # no such method
    "/oncelog.v1.TransactionCoordinater/EndTxnStream",  # no such service
    "oncelog.v1.TransactionCoordinator.EndTxnStream",  # not a gRPC path
])
def test_a_method_our_protos_do_not_define_is_refused_on_both_sides(method: str) -> None:
    # Served or asked for under a misspelt name, a method would not fail:
    # every call would quietly go over gRPC instead.
    local = InProcess(["127.0.0.1:7000"])

    async def handler(_request: Any) -> Any:
        return None

    with pytest.raises(ValueError, match="no gRPC method of our protos"):
        local.serve(method, handler)
    for address in ("127.0.0.1:7000", "127.0.0.1:7001"):
        with pytest.raises(ValueError, match="no gRPC method of our protos"):
            local.handler(address, method)


def test_a_request_outlives_a_caller_that_stopped_waiting() -> None:
    async def scenario() -> None:
        local = InProcess(["a:1"])
        release = asyncio.Event()
        finished: list[str] = []

        async def slow(request: str) -> str:
            await release.wait()
            finished.append(request)
            return request

        with pytest.raises(ServiceError) as timed_out:
            await local.call(slow, "late", 0.01)
        assert timed_out.value.code is ErrorCode.REQUEST_TIMED_OUT

        cancelled = asyncio.create_task(local.call(slow, "cancelled", 10.0))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled

        release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert sorted(finished) == ["cancelled", "late"]

    asyncio.run(scenario())


def test_a_request_that_fails_after_its_caller_left_is_not_logged() -> None:
    logged: list[str] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: logged.append(str(context.get("message"))))
        local = InProcess(["a:1"])
        release = asyncio.Event()

        async def fails_late(_request: None) -> None:
            await release.wait()
            raise ServiceError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "leadership moved")

        with pytest.raises(ServiceError):
            await local.call(fails_late, None, 0.01)
        release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        gc.collect()

    asyncio.run(scenario())
    assert logged == []


def test_the_handler_does_not_run_in_the_callers_context() -> None:
    async def scenario() -> None:
        local = InProcess(["a:1"])

        async def who(_request: None) -> str:
            return CALLER.get()

        CALLER.set("User:alice")
        assert await local.call(who, None, 1.0) == "nobody"

    asyncio.run(scenario())


def test_errors_are_the_codes_a_request_stream_answers_with() -> None:
    async def scenario() -> None:
        local = InProcess(["a:1"])

        async def refuses(_request: None) -> None:
            raise ServiceError(ErrorCode.PRODUCER_FENCED, "epoch 3 is older than 4")

        async def breaks(_request: None) -> None:
            raise KeyError("a bug")

        with pytest.raises(ServiceError) as refused:
            await local.call(refuses, None, 1.0)
        assert (refused.value.code, refused.value.message) == (
            ErrorCode.PRODUCER_FENCED, "epoch 3 is older than 4")
        with pytest.raises(ServiceError) as broken:
            await local.call(breaks, None, 1.0)
        assert broken.value.code is ErrorCode.UNKNOWN_SERVER_ERROR
        assert "a bug" in broken.value.message

    asyncio.run(scenario())


class _NoChannel:
    """Fails the test if a call goes over gRPC."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the channel was used ({name})")


def test_stream_method_answers_an_own_address_in_process() -> None:
    async def scenario() -> None:
        local = InProcess(["me:1"])
        asked: list[coordinator_pb2.EndTxnRequest] = []

        async def end_txn(request: coordinator_pb2.EndTxnRequest) -> coordinator_pb2.EndTxnResponse:
            asked.append(request)
            return coordinator_pb2.EndTxnResponse(producer_id=request.producer_id,
                                                  producer_epoch=request.producer_epoch + 1)

        local.serve(METHOD, end_txn)
        method: StreamMethod[coordinator_pb2.EndTxnRequest, coordinator_pb2.EndTxnResponse] = (
            StreamMethod(METHOD, "/oncelog.v1.TransactionCoordinator/EndTxn",
                         coordinator_pb2.EndTxnResponse, local=local))
        answer = await method.ask("me:1", _NoChannel(),  # type: ignore[arg-type]
                                  coordinator_pb2.EndTxnRequest(
                                      transactional_id="t", producer_id=7, producer_epoch=2),
                                  1.0)
        assert (answer.producer_id, answer.producer_epoch) == (7, 3)
        assert [r.transactional_id for r in asked] == ["t"]
        with pytest.raises(AssertionError, match="the channel was used"):
            await method.ask("other:1", _NoChannel(),  # type: ignore[arg-type]
                             coordinator_pb2.EndTxnRequest(transactional_id="t"), 1.0)

    asyncio.run(scenario())
