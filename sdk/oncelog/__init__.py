"""oncelog: a transactional, partitioned log with exactly-once semantics.

    from oncelog import Admin, Producer, Consumer, TopicPartition
    from oncelog import errors

docs/sdk.md describes what the SDK does: batching, retries, ordering and the
idempotence guarantees.
"""

from __future__ import annotations

from oncelog import errors
from oncelog.admin import Admin
from oncelog.consumer import Consumer
from oncelog.producer import Producer
from oncelog.types import (
    ConsumerRecord,
    GroupDescription,
    GroupListing,
    GroupMetadata,
    GroupOffset,
    HangingTransaction,
    MemberDescription,
    NewTopic,
    OffsetAndTimestamp,
    PartitionDescription,
    PreparedTxnState,
    ProducerState,
    RecordMetadata,
    TopicDescription,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "Consumer",
    "ConsumerRecord",
    "GroupDescription",
    "GroupListing",
    "GroupMetadata",
    "GroupOffset",
    "HangingTransaction",
    "MemberDescription",
    "NewTopic",
    "OffsetAndTimestamp",
    "PartitionDescription",
    "PreparedTxnState",
    "Producer",
    "ProducerState",
    "RecordMetadata",
    "TopicDescription",
    "TopicPartition",
    "TransactionDescription",
    "TransactionListing",
    "__version__",
    "errors",
]
