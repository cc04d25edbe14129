"""Producer-id blocks: how coordinators hand out cluster-unique producer ids.

A coordinator claims a block of ids by appending a record to the internal
topic `__producer_ids` (one partition) with a *conditional append*: the append
succeeds only if the log still ends where the claimant read the previous
claim. Two coordinators racing for the next block cannot both win, and a
restarted coordinator claims a fresh block after the last durable one, so no
id is ever handed out twice (ids of a claimed but unused block are skipped,
as in Kafka).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...common.kernel import durable
from ...common.kernel.invariants import invariant

BLOCK_RECORD_VERSION = 1
DEFAULT_BLOCK_SIZE = 1000
# Producer ids are int64 on the wire; -1 means "none".
MAX_PRODUCER_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """Ids [first_id, first_id + size) belong to coordinator `owner_node_id`."""

    first_id: int
    size: int
    owner_node_id: int

    @property
    def end_id(self) -> int:
        """One past the last id of the block."""
        return self.first_id + self.size


def next_block(
    last: ProducerIdBlock | None, *, owner_node_id: int, block_size: int
) -> ProducerIdBlock:
    """The block to claim after the last durable one (None: the log is empty)."""
    invariant(block_size > 0, lambda: f"producer id block size {block_size} must be positive")
    first_id = 0 if last is None else last.end_id
    invariant(
        first_id + block_size <= MAX_PRODUCER_ID,
        lambda: f"producer ids exhausted: next block would start at {first_id}",
    )
    return ProducerIdBlock(first_id=first_id, size=block_size, owner_node_id=owner_node_id)


def encode_block(block: ProducerIdBlock) -> bytes:
    return durable.encode(
        BLOCK_RECORD_VERSION,
        {"first_id": block.first_id, "size": block.size, "owner": block.owner_node_id},
    )


def decode_block(value: bytes) -> ProducerIdBlock:
    """Raises durable.CorruptValueError for a damaged or foreign record."""
    payload = durable.decode(value, expected_version=BLOCK_RECORD_VERSION)
    return ProducerIdBlock(
        first_id=int(payload["first_id"]),
        size=int(payload["size"]),
        owner_node_id=int(payload["owner"]),
    )
