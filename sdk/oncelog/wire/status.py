"""Reading our Error out of a failed gRPC call, and building one (shared by the
SDK and the services: one translation per boundary)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.rpc import status_pb2

from oncelog.v1 import errors_pb2
from oncelog.wire.errors import ErrorCode

# Where gRPC carries a google.rpc.Status (with our Error in its details).
STATUS_DETAILS_KEY = "grpc-status-details-bin"


def error_proto(code: ErrorCode, message: str = "") -> errors_pb2.Error:
    return errors_pb2.Error(
        code=errors_pb2.ErrorCode.ValueType(int(code)), retriable=code.retriable,
        message=message,
    )


def error_from_status(
    code: grpc.StatusCode | None, details: str | None,
    trailing_metadata: Iterable[Any] | None,
) -> errors_pb2.Error:
    """Our Error from the parts of a finished call: from the status details
    when present, else mapped from the bare gRPC code (a transport failure, a
    proxy, a crash). Servers read their own calls' outcome the same way."""
    for key, value in trailing_metadata or ():
        if key != STATUS_DETAILS_KEY:
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(errors_pb2.Error.DESCRIPTOR):
                err = errors_pb2.Error()
                detail.Unpack(err)
                return err
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return error_proto(ErrorCode.NETWORK_EXCEPTION, f"{code}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return error_proto(ErrorCode.REQUEST_TIMED_OUT, f"{code}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return error_proto(ErrorCode.MESSAGE_TOO_LARGE, f"{code}: {details}")
    return error_proto(ErrorCode.UNKNOWN_SERVER_ERROR, f"{code}: {details}")


def carries_error(exc: grpc.RpcError) -> bool:
    """Whether a failed call's status holds a server's Error (in its
    details): our services put one in every failure they answer with, so a
    status without one was made by the transport, a proxy or a crash."""
    metadata: Iterable[Any] | None = (
        exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None)
    return any(key == STATUS_DETAILS_KEY for key, _ in metadata or ())


def cut_by_transport(exc: grpc.RpcError) -> bool:
    """Whether a request stream that ended with `exc` was cut under its
    requests rather than ended by a server: INTERNAL without an Error of a
    server's in its status. gRPC's core ends a stream with "Internal error
    from Core" when the server's process goes away while the stream is open
    (a service stopping during a rolling restart), and our services put an
    Error in every failure they answer with. Both stream clients (the
    services' and the SDK's) take it as a lost connection, retriable, as
    Kafka's clients take a broken connection; read as a server's INTERNAL it
    would be UNKNOWN_SERVER_ERROR, which a producer cannot retry."""
    code = exc.code() if hasattr(exc, "code") else None
    return code == grpc.StatusCode.INTERNAL and not carries_error(exc)


def error_from_rpc(exc: grpc.RpcError) -> errors_pb2.Error:
    """Our Error from a failed call (see error_from_status)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    metadata = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return error_from_status(code, details, metadata)
