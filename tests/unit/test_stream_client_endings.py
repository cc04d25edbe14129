"""How a request stream between services reads the way it ended.

Goal: a stream cut under its requests by the transport (gRPC's core ends
it with INTERNAL and no Error of ours when the server's process goes away,
as a coordinator does during a rolling restart) fails them with the
retriable NETWORK_EXCEPTION, as a lost connection; a stream a server ended
with its own Error keeps that Error's code. Found by the rolling-restart
test: a store verifying a producer's write with a stopping coordinator got
"Internal error from Core", read it as UNKNOWN_SERVER_ERROR, and the
producer's transaction became abortable instead of retrying.

Method: RequestStream over a fake call whose read ends the stream with a
given status, on a real event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import status_pb2

from oncelog.v1 import coordinator_pb2
from oncelog.wire.errors import ErrorCode
from oncelog.wire.status import STATUS_DETAILS_KEY, error_proto
from services.common.kernel.errors import ServiceError
from services.common.rpc.stream_client import StreamMethod

METHOD = "/oncelog.v1.TransactionCoordinator/AddPartitionsToTxnStream"
UNARY = "/oncelog.v1.TransactionCoordinator/AddPartitionsToTxn"


def ended_with(code: grpc.StatusCode, details: str,
               error: ErrorCode | None = None) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata()
    if error is not None:
        detail = any_pb2.Any()
        detail.Pack(error_proto(error, details))
        trailing.add(STATUS_DETAILS_KEY, status_pb2.Status(
            code=code.value[0], message=details, details=[detail]).SerializeToString())
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details, "")


class EndingCall:
    """A stream call that takes writes and ends with `ending` on its read."""

    def __init__(self, ending: grpc.aio.AioRpcError) -> None:
        self._ending = ending

    async def write(self, _request: Any) -> None:
        await asyncio.sleep(0)

    async def read(self) -> Any:
        await asyncio.sleep(0.01)
        raise self._ending

    def cancel(self) -> bool:
        return True


class Channel:
    def __init__(self, ending: grpc.aio.AioRpcError) -> None:
        self._ending = ending

    def stream_stream(self, _method: str, **_codecs: Any) -> Any:
        return lambda: EndingCall(self._ending)


def ask_through(ending: grpc.aio.AioRpcError) -> ServiceError:
    async def scenario() -> ServiceError:
        method: StreamMethod[coordinator_pb2.AddPartitionsToTxnRequest,
                             coordinator_pb2.AddPartitionsToTxnResponse] = StreamMethod(
            METHOD, UNARY, coordinator_pb2.AddPartitionsToTxnResponse)
        request = coordinator_pb2.AddPartitionsToTxnRequest(transactional_id="t")
        with pytest.raises(ServiceError) as failed:
            await method.ask("c:1", Channel(ending), request,  # type: ignore[arg-type]
                             timeout_s=5.0)
        method.close()
        return failed.value

    return asyncio.run(scenario())


def test_a_stream_cut_by_the_transport_is_a_retriable_network_error() -> None:
    error = ask_through(ended_with(grpc.StatusCode.INTERNAL, "Internal error from Core"))
    assert error.code is ErrorCode.NETWORK_EXCEPTION
    assert error.code.retriable
    assert "Internal error from Core" in error.message


def test_a_stream_a_server_ended_with_its_error_keeps_that_error() -> None:
    error = ask_through(ended_with(grpc.StatusCode.INTERNAL, "the disk failed",
                                   ErrorCode.STORAGE_ERROR))
    assert error.code is ErrorCode.STORAGE_ERROR
    bare = ask_through(ended_with(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert bare.code is ErrorCode.NETWORK_EXCEPTION
