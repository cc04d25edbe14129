"""Error codes and the exception class for each.

`ErrorCode` mirrors the protos' `oncelog.v1.ErrorCode` one to one (a test checks
the parity) and tags each code with what a client should do about it:

* retriable  — the same request may succeed if sent again unchanged;
* abortable  — inside a transaction: the transaction must be aborted, then the
  producer can go on (`TransactionAbortableError` subclasses);
* fatal      — the producer (or consumer) cannot go on and must be closed.

Servers translate their failures into these codes once, at the gRPC boundary;
the SDK translates them back into the exception classes below, once.

`PRODUCER_ERROR_CLASSES` sorts every code as a producer meets it (KIP-1050's
classes): retriable, abortable, application-recoverable or fatal. It is the
one table the producer acts on and docs/sdk.md prints ("What is fatal,
abortable, retried"; a test keeps the two equal).
"""

from __future__ import annotations

import enum
from typing import ClassVar


class Kind(enum.Enum):
    """What a client should do about an error."""

    RETRIABLE = "retriable"
    ABORTABLE = "abortable"
    FATAL = "fatal"
    # Bad input or a state that retrying the same request will not change.
    NOT_RETRIABLE = "not_retriable"


class ErrorCode(enum.IntEnum):
    """oncelog's closed set of error codes (Kafka's numbers where Kafka has them)."""

    kind: Kind

    def __new__(cls, value: int, kind: Kind) -> ErrorCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.kind = kind
        return member

    NONE = (0, Kind.NOT_RETRIABLE)
    UNKNOWN_SERVER_ERROR = (-1, Kind.NOT_RETRIABLE)
    OFFSET_OUT_OF_RANGE = (1, Kind.NOT_RETRIABLE)
    CORRUPT_MESSAGE = (2, Kind.NOT_RETRIABLE)
    UNKNOWN_TOPIC_OR_PARTITION = (3, Kind.NOT_RETRIABLE)
    INVALID_FETCH_SIZE = (4, Kind.NOT_RETRIABLE)
    LEADER_NOT_AVAILABLE = (5, Kind.RETRIABLE)
    NOT_LEADER_OR_FOLLOWER = (6, Kind.RETRIABLE)
    REQUEST_TIMED_OUT = (7, Kind.RETRIABLE)
    MESSAGE_TOO_LARGE = (10, Kind.NOT_RETRIABLE)
    OFFSET_METADATA_TOO_LARGE = (12, Kind.NOT_RETRIABLE)
    NETWORK_EXCEPTION = (13, Kind.RETRIABLE)
    COORDINATOR_LOAD_IN_PROGRESS = (14, Kind.RETRIABLE)
    COORDINATOR_NOT_AVAILABLE = (15, Kind.RETRIABLE)
    NOT_COORDINATOR = (16, Kind.RETRIABLE)
    INVALID_TOPIC_EXCEPTION = (17, Kind.NOT_RETRIABLE)
    RECORD_LIST_TOO_LARGE = (18, Kind.NOT_RETRIABLE)
    NOT_ENOUGH_REPLICAS = (19, Kind.RETRIABLE)
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (20, Kind.RETRIABLE)
    ILLEGAL_GENERATION = (22, Kind.NOT_RETRIABLE)
    INCONSISTENT_GROUP_PROTOCOL = (23, Kind.NOT_RETRIABLE)
    INVALID_GROUP_ID = (24, Kind.NOT_RETRIABLE)
    UNKNOWN_MEMBER_ID = (25, Kind.NOT_RETRIABLE)
    INVALID_SESSION_TIMEOUT = (26, Kind.NOT_RETRIABLE)
    REBALANCE_IN_PROGRESS = (27, Kind.NOT_RETRIABLE)
    INVALID_COMMIT_OFFSET_SIZE = (28, Kind.NOT_RETRIABLE)
    # Authorization (docs/security.md): the principal may not do this to the
    # named resource. Refusals, not retriable: the same call fails until an
    # ACL changes.
    TOPIC_AUTHORIZATION_FAILED = (29, Kind.NOT_RETRIABLE)
    GROUP_AUTHORIZATION_FAILED = (30, Kind.NOT_RETRIABLE)
    CLUSTER_AUTHORIZATION_FAILED = (31, Kind.NOT_RETRIABLE)
    INVALID_TIMESTAMP = (32, Kind.NOT_RETRIABLE)
    UNSUPPORTED_VERSION = (35, Kind.NOT_RETRIABLE)
    TOPIC_ALREADY_EXISTS = (36, Kind.NOT_RETRIABLE)
    INVALID_PARTITIONS = (37, Kind.NOT_RETRIABLE)
    INVALID_REPLICATION_FACTOR = (38, Kind.NOT_RETRIABLE)
    INVALID_REPLICA_ASSIGNMENT = (39, Kind.NOT_RETRIABLE)
    INVALID_CONFIG = (40, Kind.NOT_RETRIABLE)
    INVALID_REQUEST = (42, Kind.NOT_RETRIABLE)
    OUT_OF_ORDER_SEQUENCE_NUMBER = (45, Kind.FATAL)
    DUPLICATE_SEQUENCE_NUMBER = (46, Kind.NOT_RETRIABLE)
    INVALID_PRODUCER_EPOCH = (47, Kind.FATAL)
    INVALID_TXN_STATE = (48, Kind.NOT_RETRIABLE)
    INVALID_PRODUCER_ID_MAPPING = (49, Kind.FATAL)
    INVALID_TRANSACTION_TIMEOUT = (50, Kind.NOT_RETRIABLE)
    CONCURRENT_TRANSACTIONS = (51, Kind.RETRIABLE)
    TRANSACTION_COORDINATOR_FENCED = (52, Kind.FATAL)
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = (53, Kind.NOT_RETRIABLE)
    # An ACL call to a cluster that runs without an authorizer.
    SECURITY_DISABLED = (54, Kind.NOT_RETRIABLE)
    STORAGE_ERROR = (56, Kind.RETRIABLE)
    # Any failed authentication: a bad, expired or untrusted bearer token, no
    # client certificate where one is needed, a subject no mapping rule takes.
    SASL_AUTHENTICATION_FAILED = (58, Kind.NOT_RETRIABLE)
    UNKNOWN_PRODUCER_ID = (59, Kind.NOT_RETRIABLE)
    NON_EMPTY_GROUP = (68, Kind.NOT_RETRIABLE)
    GROUP_ID_NOT_FOUND = (69, Kind.NOT_RETRIABLE)
    MEMBER_ID_REQUIRED = (79, Kind.NOT_RETRIABLE)
    FENCED_LEADER_EPOCH = (74, Kind.RETRIABLE)
    UNKNOWN_LEADER_EPOCH = (75, Kind.RETRIABLE)
    OFFSET_NOT_AVAILABLE = (78, Kind.RETRIABLE)
    FENCED_INSTANCE_ID = (82, Kind.FATAL)
    INVALID_RECORD = (87, Kind.NOT_RETRIABLE)
    UNSTABLE_OFFSET_COMMIT = (88, Kind.RETRIABLE)
    PRODUCER_FENCED = (90, Kind.FATAL)
    TRANSACTIONAL_ID_NOT_FOUND = (105, Kind.NOT_RETRIABLE)
    FENCED_MEMBER_EPOCH = (110, Kind.NOT_RETRIABLE)
    UNRELEASED_INSTANCE_ID = (111, Kind.NOT_RETRIABLE)
    STALE_MEMBER_EPOCH = (113, Kind.NOT_RETRIABLE)
    TRANSACTION_ABORTABLE = (120, Kind.ABORTABLE)
    LOG_END_OFFSET_MISMATCH = (1001, Kind.NOT_RETRIABLE)
    SHUTTING_DOWN = (1002, Kind.RETRIABLE)

    @property
    def retriable(self) -> bool:
        return self.kind is Kind.RETRIABLE

    @classmethod
    def from_wire(cls, value: int) -> ErrorCode:
        """A code from the wire; numbers we do not know become UNKNOWN_SERVER_ERROR."""
        try:
            return cls(value)  # type: ignore[call-arg]
        except ValueError:
            return cls.UNKNOWN_SERVER_ERROR


class ProducerErrorClass(enum.Enum):
    """What a producer does about an error (KIP-1050's classes)."""

    RETRIABLE = "retriable"
    """Retried by the producer itself, with the same sequence numbers (or the
    same producer id and epoch), until delivery_timeout_ms or the call's
    timeout runs out; then the record or call fails with KafkaTimeoutError,
    which in a transaction is abortable."""

    ABORTABLE = "abortable"
    """The record or request failed for good. Outside a transaction only its
    own future fails. Inside one the transaction can no longer commit:
    commit_transaction() raises TransactionAbortableError (caused by the first
    failed record's error); abort_transaction() ends it and the producer goes
    on."""

    APPLICATION_RECOVERABLE = "application_recoverable"
    """This producer instance is finished (every later call raises the same
    error; close it), but the application can recover: a new producer with
    the same transactional id calls init_transactions() and resumes from the
    last committed transaction (another instance took over, or the
    coordinator aborted the transaction and bumped the epoch)."""

    FATAL = "fatal"
    """Neither retrying nor a new producer helps: a configuration the cluster
    refuses, a protocol the cluster does not speak, or a log that lost
    acknowledged data. Close the producer and fix the cause."""


_P = ProducerErrorClass
# Every code a producer can meet, sorted once. The wire kind and the class
# agree: retriable codes are retriable here, fatal ones end the producer
# (application-recoverable or fatal), the rest are abortable unless retrying
# with a new producer cannot help either.
PRODUCER_ERROR_CLASSES: dict[ErrorCode, ProducerErrorClass] = {
    # The cluster is moving or busy: retried.
    ErrorCode.LEADER_NOT_AVAILABLE: _P.RETRIABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: _P.RETRIABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: _P.RETRIABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: _P.RETRIABLE,
    ErrorCode.FENCED_LEADER_EPOCH: _P.RETRIABLE,
    ErrorCode.UNKNOWN_LEADER_EPOCH: _P.RETRIABLE,
    ErrorCode.OFFSET_NOT_AVAILABLE: _P.RETRIABLE,
    ErrorCode.REQUEST_TIMED_OUT: _P.RETRIABLE,
    ErrorCode.NETWORK_EXCEPTION: _P.RETRIABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: _P.RETRIABLE,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: _P.RETRIABLE,
    ErrorCode.NOT_COORDINATOR: _P.RETRIABLE,
    ErrorCode.CONCURRENT_TRANSACTIONS: _P.RETRIABLE,
    ErrorCode.STORAGE_ERROR: _P.RETRIABLE,
    ErrorCode.UNSTABLE_OFFSET_COMMIT: _P.RETRIABLE,
    ErrorCode.SHUTTING_DOWN: _P.RETRIABLE,
    # This record or request is refused, the producer is fine: abortable.
    ErrorCode.UNKNOWN_SERVER_ERROR: _P.ABORTABLE,
    ErrorCode.OFFSET_OUT_OF_RANGE: _P.ABORTABLE,
    ErrorCode.CORRUPT_MESSAGE: _P.ABORTABLE,
    # Retried once after a metadata refresh (the topic may be newer than the
    # producer's metadata); send() waits max_block_ms for it to appear.
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: _P.ABORTABLE,
    ErrorCode.INVALID_FETCH_SIZE: _P.ABORTABLE,
    ErrorCode.MESSAGE_TOO_LARGE: _P.ABORTABLE,
    ErrorCode.OFFSET_METADATA_TOO_LARGE: _P.ABORTABLE,
    ErrorCode.INVALID_TOPIC_EXCEPTION: _P.ABORTABLE,
    ErrorCode.RECORD_LIST_TOO_LARGE: _P.ABORTABLE,
    # A group's offsets refused (send_offsets_to_transaction): the consumer
    # rejoins; this transaction aborts (Kafka's CommitFailedException).
    ErrorCode.ILLEGAL_GENERATION: _P.ABORTABLE,
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: _P.ABORTABLE,
    ErrorCode.INVALID_GROUP_ID: _P.ABORTABLE,
    ErrorCode.UNKNOWN_MEMBER_ID: _P.ABORTABLE,
    ErrorCode.INVALID_SESSION_TIMEOUT: _P.ABORTABLE,
    ErrorCode.REBALANCE_IN_PROGRESS: _P.ABORTABLE,
    ErrorCode.INVALID_COMMIT_OFFSET_SIZE: _P.ABORTABLE,
    ErrorCode.INVALID_TIMESTAMP: _P.ABORTABLE,
    # Refused by an ACL: this record's topic (Kafka's producer aborts the
    # transaction and goes on), or the group of send_offsets_to_transaction.
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: _P.ABORTABLE,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: _P.ABORTABLE,
    # Admin calls only (ACLs on a cluster without an authorizer): a refusal
    # of that one request, like TOPIC_ALREADY_EXISTS.
    ErrorCode.SECURITY_DISABLED: _P.ABORTABLE,
    ErrorCode.TOPIC_ALREADY_EXISTS: _P.ABORTABLE,
    ErrorCode.INVALID_PARTITIONS: _P.ABORTABLE,
    ErrorCode.INVALID_REPLICATION_FACTOR: _P.ABORTABLE,
    ErrorCode.INVALID_REPLICA_ASSIGNMENT: _P.ABORTABLE,
    ErrorCode.INVALID_CONFIG: _P.ABORTABLE,
    ErrorCode.INVALID_REQUEST: _P.ABORTABLE,
    # As a Produce answer it is no error: the batch was written before, at an
    # offset the store no longer knows, so the record is acknowledged
    # (offset -1), as in Kafka. Anywhere else it is a refusal.
    ErrorCode.DUPLICATE_SEQUENCE_NUMBER: _P.ABORTABLE,
    ErrorCode.INVALID_TXN_STATE: _P.ABORTABLE,
    ErrorCode.UNKNOWN_PRODUCER_ID: _P.ABORTABLE,
    ErrorCode.NON_EMPTY_GROUP: _P.ABORTABLE,
    ErrorCode.GROUP_ID_NOT_FOUND: _P.ABORTABLE,
    ErrorCode.MEMBER_ID_REQUIRED: _P.ABORTABLE,
    ErrorCode.INVALID_RECORD: _P.ABORTABLE,
    ErrorCode.TRANSACTIONAL_ID_NOT_FOUND: _P.ABORTABLE,
    ErrorCode.FENCED_MEMBER_EPOCH: _P.ABORTABLE,
    ErrorCode.UNRELEASED_INSTANCE_ID: _P.ABORTABLE,
    ErrorCode.STALE_MEMBER_EPOCH: _P.ABORTABLE,
    ErrorCode.TRANSACTION_ABORTABLE: _P.ABORTABLE,
    ErrorCode.LOG_END_OFFSET_MISMATCH: _P.ABORTABLE,
    # Another instance owns the transactional id (or the coordinator aborted
    # this one's transaction on its timeout): a new producer recovers.
    ErrorCode.PRODUCER_FENCED: _P.APPLICATION_RECOVERABLE,
    ErrorCode.INVALID_PRODUCER_EPOCH: _P.APPLICATION_RECOVERABLE,
    ErrorCode.INVALID_PRODUCER_ID_MAPPING: _P.APPLICATION_RECOVERABLE,
    ErrorCode.TRANSACTION_COORDINATOR_FENCED: _P.APPLICATION_RECOVERABLE,
    ErrorCode.FENCED_INSTANCE_ID: _P.APPLICATION_RECOVERABLE,
    # Nothing the application can retry its way out of.
    ErrorCode.UNSUPPORTED_VERSION: _P.FATAL,
    ErrorCode.INVALID_TRANSACTION_TIMEOUT: _P.FATAL,
    # A sequence gap the producer cannot explain: the log lost acknowledged
    # records, and going on would hide it.
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER: _P.FATAL,
    # The principal may not use its transactional id, or (idempotent
    # producers) may not write at all, or could not be authenticated: a new
    # producer with the same credentials meets the same refusal (Kafka's
    # producer treats all three as fatal).
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: _P.FATAL,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: _P.FATAL,
    ErrorCode.SASL_AUTHENTICATION_FAILED: _P.FATAL,
}
del _P


def producer_error_class(exc: BaseException) -> ProducerErrorClass:
    """The class of an error a producer met: by its code for the SDK's
    errors; any other exception (a bad argument, a serializer that raised)
    fails only the record it came with, so it is abortable."""
    if isinstance(exc, OncelogError):
        return PRODUCER_ERROR_CLASSES.get(exc.code, ProducerErrorClass.ABORTABLE)
    return ProducerErrorClass.ABORTABLE


class OncelogError(Exception):
    """Base of every error the SDK raises for an error code."""

    code: ClassVar[ErrorCode] = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code.name)
        self.message = message

    @property
    def retriable(self) -> bool:
        return self.code.retriable

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class RetriableError(OncelogError):
    """The same request may succeed when retried."""


class FatalError(OncelogError):
    """The client that got this cannot go on; close it."""


class TransactionAbortableError(OncelogError):
    """The current transaction must be aborted; the producer can go on after that."""


class ApplicationRecoverableError(FatalError):
    """This producer is finished (close it), but a new one with the same
    transactional id can init_transactions() and go on from the last
    committed transaction (KIP-1050's application-recoverable class)."""


class KafkaTimeoutError(RetriableError):
    """A client-side deadline passed (delivery_timeout_ms, a blocking call's timeout)."""

    code = ErrorCode.REQUEST_TIMED_OUT


class IllegalStateError(OncelogError):
    """A client method was called in a state where it is not allowed."""

    code = ErrorCode.INVALID_TXN_STATE


_BASE_FOR_KIND: dict[Kind, type[OncelogError]] = {
    Kind.RETRIABLE: RetriableError,
    Kind.FATAL: FatalError,
    Kind.ABORTABLE: TransactionAbortableError,
    Kind.NOT_RETRIABLE: OncelogError,
}

# Class names follow Kafka's exception names, in Python style.
_CLASS_NAMES: dict[ErrorCode, str] = {
    ErrorCode.UNKNOWN_SERVER_ERROR: "UnknownServerError",
    ErrorCode.OFFSET_OUT_OF_RANGE: "OffsetOutOfRangeError",
    ErrorCode.CORRUPT_MESSAGE: "CorruptRecordError",
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "UnknownTopicOrPartitionError",
    ErrorCode.INVALID_FETCH_SIZE: "InvalidFetchSizeError",
    ErrorCode.LEADER_NOT_AVAILABLE: "LeaderNotAvailableError",
    ErrorCode.NOT_LEADER_OR_FOLLOWER: "NotLeaderOrFollowerError",
    ErrorCode.NOT_ENOUGH_REPLICAS: "NotEnoughReplicasError",
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: "NotEnoughReplicasAfterAppendError",
    ErrorCode.FENCED_LEADER_EPOCH: "FencedLeaderEpochError",
    ErrorCode.UNKNOWN_LEADER_EPOCH: "UnknownLeaderEpochError",
    ErrorCode.OFFSET_NOT_AVAILABLE: "OffsetNotAvailableError",
    ErrorCode.REQUEST_TIMED_OUT: "RequestTimedOutError",
    ErrorCode.MESSAGE_TOO_LARGE: "MessageTooLargeError",
    ErrorCode.NETWORK_EXCEPTION: "NetworkError",
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: "CoordinatorLoadInProgressError",
    ErrorCode.COORDINATOR_NOT_AVAILABLE: "CoordinatorNotAvailableError",
    ErrorCode.NOT_COORDINATOR: "NotCoordinatorError",
    ErrorCode.INVALID_TOPIC_EXCEPTION: "InvalidTopicError",
    ErrorCode.RECORD_LIST_TOO_LARGE: "RecordListTooLargeError",
    ErrorCode.ILLEGAL_GENERATION: "IllegalGenerationError",
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: "InconsistentGroupProtocolError",
    ErrorCode.INVALID_GROUP_ID: "InvalidGroupIdError",
    ErrorCode.UNKNOWN_MEMBER_ID: "UnknownMemberIdError",
    ErrorCode.INVALID_SESSION_TIMEOUT: "InvalidSessionTimeoutError",
    ErrorCode.REBALANCE_IN_PROGRESS: "RebalanceInProgressError",
    ErrorCode.INVALID_COMMIT_OFFSET_SIZE: "InvalidCommitOffsetSizeError",
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: "TopicAuthorizationFailedError",
    ErrorCode.GROUP_AUTHORIZATION_FAILED: "GroupAuthorizationFailedError",
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: "ClusterAuthorizationFailedError",
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "TransactionalIdAuthorizationFailedError",
    ErrorCode.SECURITY_DISABLED: "SecurityDisabledError",
    ErrorCode.SASL_AUTHENTICATION_FAILED: "AuthenticationFailedError",
    ErrorCode.OFFSET_METADATA_TOO_LARGE: "OffsetMetadataTooLargeError",
    ErrorCode.INVALID_TIMESTAMP: "InvalidTimestampError",
    ErrorCode.UNSUPPORTED_VERSION: "UnsupportedVersionError",
    ErrorCode.TOPIC_ALREADY_EXISTS: "TopicAlreadyExistsError",
    ErrorCode.INVALID_PARTITIONS: "InvalidPartitionsError",
    ErrorCode.INVALID_REPLICATION_FACTOR: "InvalidReplicationFactorError",
    ErrorCode.INVALID_REPLICA_ASSIGNMENT: "InvalidReplicaAssignmentError",
    ErrorCode.INVALID_CONFIG: "InvalidConfigError",
    ErrorCode.INVALID_REQUEST: "InvalidRequestError",
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER: "OutOfOrderSequenceNumberError",
    ErrorCode.DUPLICATE_SEQUENCE_NUMBER: "DuplicateSequenceNumberError",
    ErrorCode.INVALID_PRODUCER_EPOCH: "InvalidProducerEpochError",
    ErrorCode.INVALID_TXN_STATE: "InvalidTxnStateError",
    ErrorCode.INVALID_PRODUCER_ID_MAPPING: "InvalidProducerIdMappingError",
    ErrorCode.INVALID_TRANSACTION_TIMEOUT: "InvalidTransactionTimeoutError",
    ErrorCode.CONCURRENT_TRANSACTIONS: "ConcurrentTransactionsError",
    ErrorCode.TRANSACTION_COORDINATOR_FENCED: "TransactionCoordinatorFencedError",
    ErrorCode.STORAGE_ERROR: "StorageError",
    ErrorCode.UNKNOWN_PRODUCER_ID: "UnknownProducerIdError",
    ErrorCode.NON_EMPTY_GROUP: "NonEmptyGroupError",
    ErrorCode.GROUP_ID_NOT_FOUND: "GroupIdNotFoundError",
    ErrorCode.MEMBER_ID_REQUIRED: "MemberIdRequiredError",
    ErrorCode.FENCED_INSTANCE_ID: "FencedInstanceIdError",
    ErrorCode.INVALID_RECORD: "InvalidRecordError",
    ErrorCode.UNSTABLE_OFFSET_COMMIT: "UnstableOffsetCommitError",
    ErrorCode.PRODUCER_FENCED: "ProducerFencedError",
    ErrorCode.TRANSACTIONAL_ID_NOT_FOUND: "TransactionalIdNotFoundError",
    ErrorCode.FENCED_MEMBER_EPOCH: "FencedMemberEpochError",
    ErrorCode.UNRELEASED_INSTANCE_ID: "UnreleasedInstanceIdError",
    ErrorCode.STALE_MEMBER_EPOCH: "StaleMemberEpochError",
    ErrorCode.TRANSACTION_ABORTABLE: "TransactionAbortableServerError",
    ErrorCode.LOG_END_OFFSET_MISMATCH: "LogEndOffsetMismatchError",
    ErrorCode.SHUTTING_DOWN: "ShuttingDownError",
}

ERROR_CLASSES: dict[ErrorCode, type[OncelogError]] = {}
for _code, _name in _CLASS_NAMES.items():
    _base = _BASE_FOR_KIND[_code.kind]
    if PRODUCER_ERROR_CLASSES[_code] is ProducerErrorClass.APPLICATION_RECOVERABLE:
        _base = ApplicationRecoverableError
    elif PRODUCER_ERROR_CLASSES[_code] is ProducerErrorClass.FATAL:
        _base = FatalError
    _cls = type(_name, (_base,), {"code": _code, "__doc__": _code.name})
    _cls.__module__ = __name__
    ERROR_CLASSES[_code] = _cls
    globals()[_name] = _cls


class TransactionAbortedError(TransactionAbortableError):
    """A record's future: the record was dropped unsent because its
    transaction was aborted (abort_transaction()), or broke and must be
    aborted (`__cause__` is the error that broke it). Raised by the client,
    never sent on the wire (Kafka's TransactionAbortedException); a subclass
    of TransactionAbortableError so code that aborts on those goes on working."""

    code = ErrorCode.TRANSACTION_ABORTABLE


def error_for(code: ErrorCode | int, message: str = "") -> OncelogError:
    """The exception instance for a code from the wire."""
    cls = ERROR_CLASSES.get(ErrorCode.from_wire(int(code)), OncelogError)
    return cls(message)


def __getattr__(name: str) -> type[OncelogError]:
    # Makes mypy accept the generated class names (errors.ProducerFencedError).
    raise AttributeError(name)
