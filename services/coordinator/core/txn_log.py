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

from ...common.kernel import durable

# encode_epoch is re-exported: the runtime and the simulation take it from here.
from ...common.shards.coordinator_epoch import EPOCH_KEY, decode_epoch
from ...common.shards.coordinator_epoch import encode_epoch as encode_epoch
from .transactions import TxnMetadata

RECORD_VERSION = 1
TXN_KEY_PREFIX = b"T"


def txn_key(transactional_id: str) -> bytes:
    return TXN_KEY_PREFIX + transactional_id.encode()


def encode_txn(md: TxnMetadata) -> tuple[bytes, bytes]:
    return txn_key(md.transactional_id), durable.encode(RECORD_VERSION, md.to_payload())


def encode_tombstone(transactional_id: str) -> tuple[bytes, None]:
    return txn_key(transactional_id), None


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
            self.coordinator_epoch, self.epoch_owner_node_id = decode_epoch(value)
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
