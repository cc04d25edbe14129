"""The coordinator-epoch record shared by the internal topics of both
coordinators (`__transaction_state`, `__consumer_offsets`).

A coordinator that takes over a partition appends one, with an epoch above
the last; replaying the newest says who owns the partition, and an owner that
reads a newer one than its own knows it has been replaced.
"""

from __future__ import annotations

from ..kernel import durable

EPOCH_KEY = b"E"
RECORD_VERSION = 1


def encode_epoch(coordinator_epoch: int, node_id: int) -> tuple[bytes, bytes]:
    return EPOCH_KEY, durable.encode(
        RECORD_VERSION, {"coordinator_epoch": coordinator_epoch, "node_id": node_id}
    )


def decode_epoch(value: bytes) -> tuple[int, int]:
    """(coordinator epoch, node id) of an epoch record's value."""
    payload = durable.decode(value, expected_version=RECORD_VERSION,
                             what="coordinator epoch record")
    return int(payload["coordinator_epoch"]), int(payload["node_id"])
