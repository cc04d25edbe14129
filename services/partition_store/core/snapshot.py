"""Producer-state snapshots: the partition's producer table as of offset X
(every batch below X applied, none at or above it).

Layout: the envelope of core/codec.py (version byte, CRC32C, payload) around a
JSON payload. JSON because snapshots are written every thousand batches or a
minute, not per request, and a human can read one when something goes wrong.
`decode_snapshot` raises SnapshotError on any problem so the caller falls back
to an older snapshot or to a replay of the log.

Versions:
* 1 — per producer: id, epoch, last timestamp, last append time,
  coordinator epoch, open transaction's first offset, last five batches.
  Written before transactions existed (no open transactions then); still
  read, the fields it lacks take their defaults.
* 2 — version 1 plus, per producer, the store time its open transaction
  started and its last marker (epoch, type, offset). Still read (the
  marker's timestamp unknown).
* 3 — version 2 with the last marker's timestamp (a version-1 marker's
  decision timestamp, which the marker rules compare). Still read (no
  unreplicated transactions).
* 4 — version 3 plus the transactions ended by a marker that the
  replica's HW had not passed yet (marker offset, first offset). They hold
  the LSO until the HW passes their markers. A replica that restarts
  from the snapshot starts with its HW at its log start, so without them it
  would let such a transaction's records below its LSO before its marker is
  replicated. Written now.

The aborted-transaction index is not in the snapshot: each entry is its own
key, written in the same RocksDB write as its ABORT marker (storage/keys.py),
which is at least as strong as DESIGN.md's "snapshot it with producer state"
and keeps snapshots small.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .codec import CorruptValueError, seal, unseal
from .producer_state import (
    BatchMetadata,
    MarkerMetadata,
    ProducerEntry,
)

SNAPSHOT_VERSION = 4
# Versions decode_snapshot reads.
READABLE_VERSIONS = (1, 2, 3, 4)


class SnapshotError(CorruptValueError):
    """The bytes are not a snapshot this version can load."""


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    offset: int
    producers: tuple[ProducerEntry, ...]
    # (marker offset, first offset): ProducerStateManager.unreplicated().
    unreplicated: tuple[tuple[int, int], ...] = ()


def encode_snapshot(offset: int, producers: list[ProducerEntry],
                    unreplicated: tuple[tuple[int, int], ...] = ()) -> bytes:
    payload = {
        "offset": offset,
        "unreplicated": [list(pair) for pair in unreplicated],
        "producers": [
            [
                e.producer_id, e.producer_epoch, e.last_timestamp_ms, e.last_append_time_ms,
                e.coordinator_epoch, e.current_txn_first_offset,
                [
                    [b.first_sequence, b.last_sequence, b.base_offset, b.record_count,
                     b.max_timestamp_ms]
                    for b in e.batches
                ],
                e.current_txn_start_time_ms,
                None if e.last_marker is None else [
                    e.last_marker.producer_epoch, e.last_marker.control_type,
                    e.last_marker.offset, e.last_marker.timestamp_ms,
                ],
            ]
            for e in producers
        ],
    }
    return seal(SNAPSHOT_VERSION, json.dumps(payload, separators=(",", ":")).encode())


def decode_snapshot(data: bytes) -> ProducerSnapshot:
    version = data[0] if data else None
    if version not in READABLE_VERSIONS:
        version = SNAPSHOT_VERSION  # let unseal name the problem
    try:
        payload = unseal(data, version=version, what="producer-state snapshot")
    except CorruptValueError as exc:
        raise SnapshotError(str(exc)) from exc
    try:
        doc = json.loads(payload)
        offset = _int(doc["offset"])
        unreplicated = tuple(
            (_int(marker_offset), _int(first_offset))
            for marker_offset, first_offset in (doc["unreplicated"] if version >= 4 else ()))
        producers = []
        for row in doc["producers"]:
            txn_start_ms: object = -1
            marker: object = None
            if version == 1:
                pid, epoch, last_ts, last_append, coord_epoch, txn_first, batches = row
            else:
                (pid, epoch, last_ts, last_append, coord_epoch, txn_first, batches,
                 txn_start_ms, marker) = row
            producers.append(
                ProducerEntry(
                    producer_id=_int(pid),
                    producer_epoch=_int(epoch),
                    batches=tuple(BatchMetadata(*(_int(v) for v in b)) for b in batches),
                    last_timestamp_ms=_int(last_ts),
                    last_append_time_ms=_int(last_append),
                    coordinator_epoch=_int(coord_epoch),
                    current_txn_first_offset=_int(txn_first),
                    current_txn_start_time_ms=_int(txn_start_ms),
                    last_marker=_marker(marker, with_timestamp=version >= 3),
                )
            )
    except (ValueError, TypeError, KeyError) as exc:
        raise SnapshotError(f"producer-state snapshot does not parse: {exc}") from exc
    if offset < 0:
        raise SnapshotError(f"producer-state snapshot has a negative offset {offset}")
    return ProducerSnapshot(offset=offset, producers=tuple(producers),
                            unreplicated=unreplicated)


def _marker(value: object, *, with_timestamp: bool) -> MarkerMetadata | None:
    if value is None:
        return None
    fields = 4 if with_timestamp else 3
    if not isinstance(value, list) or len(value) != fields:
        shape = "[epoch, type, offset, timestamp]" if with_timestamp else "[epoch, type, offset]"
        raise TypeError(f"expected {shape} for a marker, found {value!r}")
    return MarkerMetadata(*(_int(v) for v in value))


def _int(value: object) -> int:
    # bool is an int subclass; a snapshot never holds one where a number belongs.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, found {value!r}")
    return value
