"""oncelog: a transactional, partitioned log with exactly-once semantics.

    from oncelog import Admin, Producer, Consumer, TopicPartition, AclBinding
    from oncelog import errors

docs/sdk.md describes what the SDK does: batching, retries, ordering and the
idempotence guarantees.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

from oncelog.wire import VERSION

if TYPE_CHECKING:
    from oncelog import errors
    from oncelog.admin import Admin
    from oncelog.consumer import Consumer
    from oncelog.producer import Producer
    from oncelog.types import (
        AclBinding,
        AclFilter,
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
        PartitionRecords,
        PreparedTxnState,
        ProducerState,
        RecordMetadata,
        TopicDescription,
        TopicPartition,
        TransactionDescription,
        TransactionListing,
    )


def _release() -> str:
    """The installed distribution's version, what pip and users' lock files
    see (built from VERSION); VERSION itself when this package runs from a
    source tree that was never installed."""
    try:
        return importlib.metadata.version("oncelog")
    except importlib.metadata.PackageNotFoundError:
        return VERSION


__version__ = _release()

# The public names, each loaded on first use (PEP 562): the services import
# `oncelog.wire`, which imports this package first, and must not load the
# client (its threads, its channels) with it.
_LAZY = {
    "Admin": "oncelog.admin",
    "Consumer": "oncelog.consumer",
    "Producer": "oncelog.producer",
    "errors": None,
    **{name: "oncelog.types" for name in (
        "AclBinding", "AclFilter", "ConsumerRecord", "GroupDescription", "GroupListing",
        "GroupMetadata", "GroupOffset",
        "HangingTransaction", "MemberDescription", "NewTopic", "OffsetAndTimestamp",
        "PartitionDescription", "PartitionRecords", "PreparedTxnState", "ProducerState",
        "RecordMetadata",
        "TopicDescription", "TopicPartition", "TransactionDescription", "TransactionListing",
    )},
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'oncelog' has no attribute {name!r}")
    module_name = _LAZY[name]
    value = (importlib.import_module(f"oncelog.{name}") if module_name is None
             else getattr(importlib.import_module(module_name), name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AclBinding",
    "AclFilter",
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
    "PartitionRecords",
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
