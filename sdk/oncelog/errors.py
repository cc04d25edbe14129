"""Error codes and the exception class for each: `oncelog.wire.errors`, under
the name users import (`from oncelog import errors`). See that module.

Besides those, the client's own errors that no server ever sends: a
(de)serializer that failed is the application's code failing inside the
client, so its classes live here and not in the wire kernel the services
share. Each still carries an error code, as the client-side classes of the
wire module do (KafkaTimeoutError, IllegalStateError), so code that sorts
errors by `code` or by `producer_error_class` treats them like the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oncelog.wire.errors import *  # noqa: F403 - this module is that one, renamed
from oncelog.wire.errors import ErrorCode, OncelogError

if TYPE_CHECKING:
    from oncelog.types import ConsumerRecord


class SerializationError(OncelogError):
    """A key or value serializer raised (or returned something other than
    bytes): the record was not sent. `__cause__` is the serializer's own
    exception. Kafka's SerializationException.

    Outside a transaction only this send() fails; inside one, the
    transaction can no longer commit (commit_transaction() raises a
    TransactionAbortableError caused by this error) and abort_transaction()
    lets the producer go on, as for any record that failed in send()."""

    # The record cannot be written as given: abortable in a transaction
    # (errors.PRODUCER_ERROR_CLASSES), never retried.
    code = ErrorCode.INVALID_RECORD


class DeserializationError(SerializationError):
    """A key or value deserializer raised on a fetched record (Kafka's
    RecordDeserializationException). The consumer's position stays at that
    record: poll() raises this again until the application seeks past it,
    `consumer.seek(TopicPartition(e.topic, e.partition), e.offset + 1)`.
    `record` is the record as fetched, key and value still bytes (for a
    dead-letter topic, say); `__cause__` is the deserializer's exception."""

    def __init__(self, message: str, *, topic: str, partition: int, offset: int,
                 record: ConsumerRecord) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.record = record


def __getattr__(name: str) -> type[OncelogError]:
    # Makes mypy accept the generated class names (errors.ProducerFencedError).
    raise AttributeError(name)
