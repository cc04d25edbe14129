"""Error codes on the wire: the gRPC side of the services' errors.

Handlers return or raise `ServiceError(code, message)` (kernel/errors.py,
free of grpc); the servicer boundary turns it into either a per-partition
`oncelog.v1.Error` (`ServiceError.to_proto`) or, here, a gRPC status whose
details carry the same `Error` (google.rpc.Status in
`grpc-status-details-bin`). Messages name what was wrong: the topic,
partition, offset, producer id, and the value received and the value expected.
"""

from __future__ import annotations

from typing import NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

from oncelog.wire.errors import ErrorCode
from oncelog.wire.status import error_proto

from ..kernel.errors import ServiceError

__all__ = ["abort_with", "to_grpc_status"]


# Which gRPC status code a request-level error travels with. Everything not
# listed is FAILED_PRECONDITION (a state the request does not fit).
_GRPC_CODE: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.UNKNOWN_SERVER_ERROR: grpc.StatusCode.INTERNAL,
    ErrorCode.INVALID_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.CORRUPT_MESSAGE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_RECORD: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.MESSAGE_TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.RECORD_LIST_TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_COMMIT_OFFSET_SIZE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.OFFSET_METADATA_TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_CONFIG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_PARTITIONS: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_REPLICATION_FACTOR: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_REPLICA_ASSIGNMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_TOPIC_EXCEPTION: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_TIMESTAMP: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_FETCH_SIZE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_TRANSACTION_TIMEOUT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_SESSION_TIMEOUT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_GROUP_ID: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: grpc.StatusCode.NOT_FOUND,
    ErrorCode.GROUP_ID_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.TRANSACTIONAL_ID_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.TOPIC_ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.OFFSET_OUT_OF_RANGE: grpc.StatusCode.OUT_OF_RANGE,
    ErrorCode.REQUEST_TIMED_OUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.NOT_COORDINATOR: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.LEADER_NOT_AVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNKNOWN_LEADER_EPOCH: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.STORAGE_ERROR: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.SHUTTING_DOWN: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.NETWORK_EXCEPTION: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.CONCURRENT_TRANSACTIONS: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.PRODUCER_FENCED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.INVALID_PRODUCER_EPOCH: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.TRANSACTION_COORDINATOR_FENCED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.FENCED_INSTANCE_ID: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.FENCED_MEMBER_EPOCH: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: grpc.StatusCode.PERMISSION_DENIED,
    # ACL calls to a cluster without an authorizer: the cluster's setup does
    # not fit the call (UNIMPLEMENTED would read as "no such RPC").
    ErrorCode.SECURITY_DISABLED: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.SASL_AUTHENTICATION_FAILED: grpc.StatusCode.UNAUTHENTICATED,
}


def to_grpc_status(code: ErrorCode, message: str) -> grpc.Status:
    """A gRPC status carrying our Error in its details."""
    detail = any_pb2.Any()
    detail.Pack(error_proto(code, message))
    grpc_code = _GRPC_CODE.get(code, grpc.StatusCode.FAILED_PRECONDITION)
    status = status_pb2.Status(
        code=grpc_code.value[0], message=f"{code.name}: {message}", details=[detail]
    )
    return rpc_status.to_status(status)


async def abort_with(context: grpc.aio.ServicerContext, err: ServiceError) -> NoReturn:
    """Ends an aio RPC with our error in the status details."""
    await context.abort_with_status(  # type: ignore[attr-defined]
        to_grpc_status(err.code, err.message)
    )
    raise AssertionError("abort_with_status returned")  # pragma: no cover
