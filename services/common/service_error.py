"""The expected-failure value of every service, free of grpc so that pure
`core/` modules can raise it; `services.common.errors` turns it into wire
errors at the gRPC boundary."""

from __future__ import annotations

from oncelog.errors import ErrorCode
from oncelog.v1 import errors_pb2


class ServiceError(Exception):
    """An expected failure with an error code; never a broken invariant."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    def to_proto(self) -> errors_pb2.Error:
        return errors_pb2.Error(
            code=errors_pb2.ErrorCode.ValueType(int(self.code)),
            retriable=self.code.retriable,
            message=self.message,
        )
