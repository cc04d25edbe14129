"""Producer-state snapshots: encode/decode and refusal of damaged bytes.

Goal: a snapshot round-trips exactly (open transactions, coordinator epochs,
last markers with their timestamps, and the ended transactions whose marker
the HW had not passed included), snapshots of versions 1 to 3 (written
before transactions, before markers kept their timestamps, and before the
ended transactions were kept) still load, and anything but an intact snapshot of a known
version (flipped bit, bad CRC, truncation, unknown version, garbage payload)
raises SnapshotError, so recovery falls back instead of loading a wrong
producer table.

Method: build entries with every field set, encode, mutate bytes, decode; a
version-1 payload is built by hand in the old layout.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

from oncelog.records import crc32c
from services.partition_store.core.producer_state import (
    BatchMetadata,
    MarkerMetadata,
    ProducerEntry,
)
from services.partition_store.core.snapshot import (
    SNAPSHOT_VERSION,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
)

ENTRIES = [
    ProducerEntry(
        producer_id=7, producer_epoch=3,
        batches=tuple(BatchMetadata(i * 2, i * 2 + 1, 100 + i * 2, 2, 5_000 + i) for i in range(5)),
        last_timestamp_ms=5_004, last_append_time_ms=9_000, coordinator_epoch=2,
        current_txn_first_offset=-1,
        last_marker=MarkerMetadata(producer_epoch=3, control_type=1, offset=99,
                                   timestamp_ms=1_234),
    ),
    ProducerEntry(producer_id=8, producer_epoch=0, current_txn_first_offset=42,
                  current_txn_start_time_ms=8_500, coordinator_epoch=4,
                  last_marker=MarkerMetadata(producer_epoch=0, control_type=0, offset=30)),
    ProducerEntry(
        producer_id=2**40, producer_epoch=32766,
        batches=(BatchMetadata(2**31 - 2, 0, 7, 3, -5),),
        last_timestamp_ms=-5, last_append_time_ms=0,
    ),
]


def test_round_trip() -> None:
    data = encode_snapshot(1234, ENTRIES)
    snap = decode_snapshot(data)
    assert snap.offset == 1234
    assert list(snap.producers) == ENTRIES


def test_round_trip_empty() -> None:
    snap = decode_snapshot(encode_snapshot(0, []))
    assert snap.offset == 0 and snap.producers == () and snap.unreplicated == ()


def test_round_trip_keeps_transactions_whose_marker_is_not_replicated() -> None:
    snap = decode_snapshot(encode_snapshot(1234, ENTRIES, ((50, 42), (60, 55))))
    assert snap.unreplicated == ((50, 42), (60, 55))
    assert list(snap.producers) == ENTRIES


def test_version_3_snapshots_still_load_with_no_unreplicated_transactions() -> None:
    payload = b'{"offset": 10, "producers": [[7, 3, 5004, 9000, 2, -1, [], -1, [3, 1, 9, 77]]]}'
    snap = decode_snapshot(_reseal(payload, 3))
    assert snap.offset == 10 and snap.unreplicated == ()
    assert snap.producers[0].last_marker == MarkerMetadata(3, 1, 9, 77)


def _reseal(payload: bytes, version: int = SNAPSHOT_VERSION) -> bytes:
    return struct.pack(">BI", version, crc32c(payload)) + payload


@pytest.mark.parametrize(
    ("name", "mutate"),
    [
        ("flipped payload bit", lambda d: d[:20] + bytes([d[20] ^ 0x01]) + d[21:]),
        ("bad crc", lambda d: d[:1] + bytes([d[1] ^ 0xFF]) + d[2:]),
        ("truncated payload", lambda d: d[:-3]),
        ("truncated envelope", lambda d: d[:3]),
        ("empty", lambda d: b""),
        ("wrong version", lambda d: bytes([SNAPSHOT_VERSION + 1]) + d[1:]),
        ("version 1 byte on a current payload", lambda d: bytes([1]) + d[1:]),
        ("current payload sealed as version 1", lambda d: _reseal(d[5:], 1)),
        ("current payload sealed as version 2", lambda d: _reseal(d[5:], 2)),
        ("bad marker, valid crc", lambda d: _reseal(
            b'{"offset": 3, "producers": [[1, 0, 0, 0, 0, -1, [], -1, [1, 2]]]}')),
        ("wrong version, valid crc", lambda d: _reseal(d[5:], SNAPSHOT_VERSION + 1)),
        ("not json, valid crc", lambda d: _reseal(b"\x00not json")),
        ("missing field, valid crc", lambda d: _reseal(b'{"offset": 3}')),
        ("unreplicated pair of the wrong shape, valid crc", lambda d: _reseal(
            b'{"offset": 3, "producers": [], "unreplicated": [[1, 2, 3]]}')),
        ("no unreplicated list, valid crc", lambda d: _reseal(
            b'{"offset": 3, "producers": []}')),
        ("wrong shape, valid crc", lambda d: _reseal(b'{"offset": 3, "producers": [[1, 2]]}')),
        ("string where a number belongs", lambda d: _reseal(
            b'{"offset": "3", "producers": []}')),
        ("negative offset", lambda d: _reseal(b'{"offset": -1, "producers": []}')),
    ],
)
def test_damaged_snapshots_are_refused(name: str, mutate: Callable[[bytes], bytes]) -> None:
    data = encode_snapshot(1234, ENTRIES)
    damaged = mutate(data)
    with pytest.raises(SnapshotError):
        decode_snapshot(damaged)


def test_version_1_snapshots_still_load() -> None:
    """Written before transactions: no open-transaction start time, no last
    marker (the store never had open transactions then)."""
    payload = (
        b'{"offset": 10, "producers": [[7, 3, 5004, 9000, -1, -1, [[0, 1, 8, 2, 5000]]]]}'
    )
    snap = decode_snapshot(_reseal(payload, 1))
    assert snap.offset == 10
    assert list(snap.producers) == [ProducerEntry(
        producer_id=7, producer_epoch=3, batches=(BatchMetadata(0, 1, 8, 2, 5000),),
        last_timestamp_ms=5004, last_append_time_ms=9000,
    )]


def test_version_2_snapshots_still_load() -> None:
    """Written before markers kept their timestamp: the last marker loads
    with the timestamp unknown."""
    payload = (
        b'{"offset": 10, "producers": [[7, 3, 5004, 9000, 2, -1, [], -1, [3, 1, 9]]]}'
    )
    snap = decode_snapshot(_reseal(payload, 2))
    assert list(snap.producers) == [ProducerEntry(
        producer_id=7, producer_epoch=3, last_timestamp_ms=5004, last_append_time_ms=9000,
        coordinator_epoch=2, last_marker=MarkerMetadata(3, 1, 9),
    )]
