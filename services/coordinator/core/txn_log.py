"""Records of the transaction log (`__transaction_state`), as values.

Two kinds, told apart by the first byte of the key:

    T | transactional id (utf-8)  -> TxnMetadata after a change (None: tombstone,
                                     the id expired)
    E                             -> a coordinator took the partition over:
                                     {"coordinator_epoch": n, "node_id": k}

Replaying a partition's records in order rebuilds the coordinator's memory
exactly: the newest T record per id is its state; the newest E record is the
partition's coordinator epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common import durable
from services.coordinator.core.transactions import TxnMetadata

RECORD_VERSION = 1
TXN_KEY_PREFIX = b"T"
EPOCH_KEY = b"E"


def txn_key(transactional_id: str) -> bytes:
    return TXN_KEY_PREFIX + transactional_id.encode()


def encode_txn(md: TxnMetadata) -> tuple[bytes, bytes]:
    return txn_key(md.transactional_id), durable.encode(RECORD_VERSION, md.to_payload())


def encode_tombstone(transactional_id: str) -> tuple[bytes, None]:
    return txn_key(transactional_id), None


def encode_epoch(coordinator_epoch: int, node_id: int) -> tuple[bytes, bytes]:
    return EPOCH_KEY, durable.encode(
        RECORD_VERSION, {"coordinator_epoch": coordinator_epoch, "node_id": node_id}
    )


@dataclass
class TxnPartitionState:
    """What replaying one `__transaction_state` partition yields."""

    coordinator_epoch: int = -1
    epoch_owner_node_id: int = -1
    transactions: dict[str, TxnMetadata] = field(default_factory=dict)

    def replay(self, key: bytes | None, value: bytes | None) -> None:
        """Applies one record. Raises durable.CorruptValueError for a damaged one
        (the batch CRC makes that a sign of a bug or foreign writer, not of a
        torn write, so the caller must not skip it silently)."""
        if key == EPOCH_KEY:
            if value is None:
                return
            payload = durable.decode(value, expected_version=RECORD_VERSION,
                                     what="coordinator epoch record")
            self.coordinator_epoch = int(payload["coordinator_epoch"])
            self.epoch_owner_node_id = int(payload["node_id"])
            return
        if key is None or not key.startswith(TXN_KEY_PREFIX):
            raise durable.CorruptValueError(f"transaction log record with unknown key {key!r}")
        transactional_id = key[len(TXN_KEY_PREFIX):].decode()
        if value is None:
            self.transactions.pop(transactional_id, None)
            return
        payload = durable.decode(value, expected_version=RECORD_VERSION,
                                 what=f"transaction state of {transactional_id!r}")
        self.transactions[transactional_id] = TxnMetadata.from_payload(transactional_id, payload)
