"""The expected-failure value of every service, free of grpc so that pure
`core/` modules can raise it; `services.common.rpc.status` turns it into a
gRPC status at the boundary, `ServiceError.to_proto` into a per-item
`oncelog.v1.Error`."""

from __future__ import annotations

from oncelog.v1 import errors_pb2
from oncelog.wire.errors import ErrorCode

from . import limits

# The per-item Error of a success (no code), in responses that carry one
# Error per partition or per item.
OK = errors_pb2.Error()


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


def check_id_length(field: str, value: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> None:
    """Refuses a client-chosen id (transactional, group, member, instance id)
    longer than limits.MAX_ID_LENGTH. The message names the field, the length
    and the id's start, never the whole id: a long one would not fit in the
    status trailers (see limits.MAX_ID_LENGTH)."""
    if len(value) > limits.MAX_ID_LENGTH:
        raise ServiceError(
            code,
            f"{field} {value[:32]!r}... is {len(value)} characters long, over the limit of "
            f"{limits.MAX_ID_LENGTH}",
        )
