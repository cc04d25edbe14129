"""The store's small sealed values (time-index entries, counters, partition
meta), in the shared durable envelope of services.common.kernel.durable."""

from __future__ import annotations

import struct

from ...common.kernel.durable import ENVELOPE_SIZE_BYTES, CorruptValueError, seal, unseal

__all__ = ["ENVELOPE_SIZE_BYTES", "CorruptValueError", "seal", "unseal"]

_OFFSET = struct.Struct(">q")
_PARTITION_META = struct.Struct(">qq")
OFFSET_VERSION = 1
PARTITION_META_VERSION = 1


def encode_offset(offset: int) -> bytes:
    """A sealed int64 (time-index entries, the topic id counter)."""
    return seal(OFFSET_VERSION, _OFFSET.pack(offset))


def decode_offset(data: bytes, *, what: str) -> int:
    payload = unseal(data, version=OFFSET_VERSION, what=what)
    if len(payload) != _OFFSET.size:
        raise CorruptValueError(f"{what}: {len(payload)}-byte payload, expected {_OFFSET.size}")
    return int(_OFFSET.unpack(payload)[0])


def encode_partition_meta(log_start_offset: int, size_bytes: int) -> bytes:
    """A partition's log start offset and stored size, written with every
    change to either (so recovery reads them instead of scanning the log)."""
    return seal(PARTITION_META_VERSION, _PARTITION_META.pack(log_start_offset, size_bytes))


def decode_partition_meta(data: bytes, *, what: str) -> tuple[int, int]:
    payload = unseal(data, version=PARTITION_META_VERSION, what=what)
    if len(payload) != _PARTITION_META.size:
        raise CorruptValueError(
            f"{what}: {len(payload)}-byte payload, expected {_PARTITION_META.size}"
        )
    start, size = _PARTITION_META.unpack(payload)
    return int(start), int(size)
