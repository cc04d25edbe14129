"""Reading our Error out of a failed gRPC call, and building one (shared by the
SDK and the services: one translation per boundary)."""

from __future__ import annotations

import grpc
from grpc_status import rpc_status

from oncelog.errors import ErrorCode
from oncelog.v1 import errors_pb2


def error_proto(code: ErrorCode, message: str = "") -> errors_pb2.Error:
    return errors_pb2.Error(
        code=errors_pb2.ErrorCode.ValueType(int(code)), retriable=code.retriable,
        message=message,
    )


def error_from_rpc(exc: grpc.RpcError) -> errors_pb2.Error:
    """Our Error from a failed call: from the status details when present, else
    mapped from the bare gRPC code (a transport failure, a proxy, a crash)."""
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    if status is not None:
        for detail in status.details:
            if detail.Is(errors_pb2.Error.DESCRIPTOR):
                err = errors_pb2.Error()
                detail.Unpack(err)
                return err
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return error_proto(ErrorCode.NETWORK_EXCEPTION, f"{code}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return error_proto(ErrorCode.REQUEST_TIMED_OUT, f"{code}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return error_proto(ErrorCode.MESSAGE_TOO_LARGE, f"{code}: {details}")
    return error_proto(ErrorCode.UNKNOWN_SERVER_ERROR, f"{code}: {details}")

