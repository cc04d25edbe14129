"""Reading Kafka's consumer protocol (protocol type "consumer"): the
subscription a classic member sends as its JoinGroup metadata and the
assignment its leader sends in SyncGroup. The coordinator never needs them
to run a group (they are opaque to it, as in Kafka); DescribeGroups decodes
them to show a classic consumer group's topics and partitions the way it
shows a server-assigned group's.

Every version starts with the fields of version 0 (Kafka reads the
subscription's topics the same way), so only those are read:

    Subscription: version int16, topics [string], user_data bytes, ...
    Assignment:   version int16, [topic string, partitions [int32]], ...

Strings are an int16 length and UTF-8; arrays an int32 count. Anything that
does not parse gives None: another client's bytes must not break a
description.
"""

from __future__ import annotations

import struct

# Bounds the work on a malformed count (each entry takes at least 2 bytes).
_MIN_ENTRY_BYTES = 2


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def _take(self, size: int) -> bytes:
        if size < 0 or self._at + size > len(self._data):
            raise ValueError("truncated")
        chunk = self._data[self._at:self._at + size]
        self._at += size
        return chunk

    def int16(self) -> int:
        value: int = struct.unpack(">h", self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = struct.unpack(">i", self._take(4))[0]
        return value

    def string(self) -> str:
        return self._take(self.int16()).decode("utf-8")

    def count(self) -> int:
        n = self.int32()
        if n < 0 or n * _MIN_ENTRY_BYTES > len(self._data) - self._at:
            raise ValueError(f"array of {n} entries in {len(self._data) - self._at} bytes")
        return n


def subscribed_topics(metadata: bytes) -> tuple[str, ...] | None:
    """The topics of a consumer's subscription metadata, or None."""
    try:
        reader = _Reader(metadata)
        if reader.int16() < 0:
            return None
        return tuple(reader.string() for _ in range(reader.count()))
    except (ValueError, UnicodeDecodeError, struct.error):
        return None


def assigned_partitions(assignment: bytes) -> tuple[tuple[str, int], ...] | None:
    """The (topic, partition)s of a consumer's assignment, or None. An empty
    assignment (a member the leader gave nothing, or none yet) is empty."""
    if not assignment:
        return ()
    try:
        reader = _Reader(assignment)
        if reader.int16() < 0:
            return None
        out: list[tuple[str, int]] = []
        for _ in range(reader.count()):
            topic = reader.string()
            out.extend((topic, reader.int32()) for _ in range(reader.count()))
        return tuple(out)
    except (ValueError, UnicodeDecodeError, struct.error):
        return None
