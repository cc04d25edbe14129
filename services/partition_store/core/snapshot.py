"""Producer-state snapshots: the partition's producer table as of offset X
(every batch below X applied, none at or above it).

Layout: the envelope of core/codec.py (version byte, CRC32C, payload) around a
JSON payload. JSON because snapshots are written every thousand batches or a
minute, not per request, and a human can read one when something goes wrong.
`decode_snapshot` raises SnapshotError on any problem so the caller falls back
to an older snapshot or to a replay of the log.

When transactions land, open transactions and the aborted-transaction index
join the payload (a new version number).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from services.partition_store.core.codec import CorruptValueError, seal, unseal
from services.partition_store.core.producer_state import BatchMetadata, ProducerEntry

SNAPSHOT_VERSION = 1


class SnapshotError(CorruptValueError):
    """The bytes are not a snapshot this version can load."""


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    offset: int
    producers: tuple[ProducerEntry, ...]


def encode_snapshot(offset: int, producers: list[ProducerEntry]) -> bytes:
    payload = {
        "offset": offset,
        "producers": [
            [
                e.producer_id, e.producer_epoch, e.last_timestamp_ms, e.last_append_time_ms,
                e.coordinator_epoch, e.current_txn_first_offset,
                [
                    [b.first_sequence, b.last_sequence, b.base_offset, b.record_count,
                     b.max_timestamp_ms]
                    for b in e.batches
                ],
            ]
            for e in producers
        ],
    }
    return seal(SNAPSHOT_VERSION, json.dumps(payload, separators=(",", ":")).encode())


def decode_snapshot(data: bytes) -> ProducerSnapshot:
    try:
        payload = unseal(data, version=SNAPSHOT_VERSION, what="producer-state snapshot")
    except CorruptValueError as exc:
        raise SnapshotError(str(exc)) from exc
    try:
        doc = json.loads(payload)
        offset = _int(doc["offset"])
        producers = []
        for row in doc["producers"]:
            pid, epoch, last_ts, last_append, coord_epoch, txn_first, batches = row
            producers.append(
                ProducerEntry(
                    producer_id=_int(pid),
                    producer_epoch=_int(epoch),
                    batches=tuple(BatchMetadata(*(_int(v) for v in b)) for b in batches),
                    last_timestamp_ms=_int(last_ts),
                    last_append_time_ms=_int(last_append),
                    coordinator_epoch=_int(coord_epoch),
                    current_txn_first_offset=_int(txn_first),
                )
            )
    except (ValueError, TypeError, KeyError) as exc:
        raise SnapshotError(f"producer-state snapshot does not parse: {exc}") from exc
    if offset < 0:
        raise SnapshotError(f"producer-state snapshot has a negative offset {offset}")
    return ProducerSnapshot(offset=offset, producers=tuple(producers))


def _int(value: object) -> int:
    # bool is an int subclass; a snapshot never holds one where a number belongs.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, found {value!r}")
    return value
