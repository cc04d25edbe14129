"""A storage failure under a request reaches the client as STORAGE_ERROR,
never as UNKNOWN.

Goal: while a partition store's database is closed to be reopened (after a
full disk) a read raises the storage adapter's StorageError. Left to gRPC,
the call would end UNKNOWN with no details; the RPC interceptor, given the
partition store's translator (writer.storage_refusal, as its server wires
it), answers STORAGE_ERROR (retriable) with our Error in the status details.
What is not storage's stays what it was.

Method: a real grpc.aio server on loopback with the interceptor and one
generic method whose handler raises; a client call, its status decoded the
way the SDK decodes it.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from oncelog.wire.errors import ErrorCode
from oncelog.wire.status import error_from_status
from services.common.rpc.interceptor import RpcInterceptor
from services.partition_store.storage.port import DiskFullError, StorageError
from services.partition_store.writer import storage_refusal

METHOD = "/oncelog.v1.Probe/Call"


def _identity(data: bytes) -> bytes:
    return data


async def _status_of(failure: Exception) -> tuple[grpc.StatusCode, ErrorCode | None]:
    async def call(_request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
        raise failure

    handler = grpc.method_handlers_generic_handler("oncelog.v1.Probe", {
        "Call": grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=_identity, response_serializer=_identity)})
    server = grpc.aio.server(interceptors=[
        RpcInterceptor("partition_store", translate_error=storage_refusal)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = channel.unary_unary(METHOD, request_serializer=_identity,
                                       response_deserializer=_identity)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub(b"", timeout=10)
    finally:
        await server.stop(None)
    error = raised.value
    if error.code() is grpc.StatusCode.UNKNOWN:
        return error.code(), None
    decoded = error_from_status(error.code(), error.details(), error.trailing_metadata())
    return error.code(), ErrorCode.from_wire(decoded.code)


@pytest.mark.parametrize("failure", [
    StorageError("the database in /data/rocksdb is not open (a reopen failed)"),
    DiskFullError("No space left on device"),
], ids=["closed", "full"])
def test_a_storage_failure_is_answered_storage_error(failure: Exception) -> None:
    _grpc_code, code = asyncio.run(_status_of(failure))
    assert code is ErrorCode.STORAGE_ERROR
    assert code.retriable


def test_what_is_not_storages_is_left_alone() -> None:
    grpc_code, code = asyncio.run(_status_of(ValueError("a bug")))
    assert (grpc_code, code) == (grpc.StatusCode.UNKNOWN, None)
