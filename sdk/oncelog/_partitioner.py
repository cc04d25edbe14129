"""Choosing a partition for a record, the way Kafka's Java client does.

* A record with a key goes to `to_positive(murmur2(key)) % num_partitions`, so
  the same key lands on the same partition as with Kafka's default partitioner
  (and with any other client that copies it).
* A record without a key goes to the topic's *sticky* partition: one partition
  takes every keyless record until its batch is closed (full, or sent after
  linger_ms), then another partition is picked at random. Batches fill up
  instead of trickling one record per partition (Kafka's KIP-480).
"""

from __future__ import annotations

import random
import struct

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: 32-bit MurmurHash2 with Kafka's seed, as a signed
    Java int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    words = length // 4
    if words:
        for k in struct.unpack_from(f"<{words}I", data):
            k = (k * _M) & _MASK32
            k ^= k >> 24
            k = (k * _M) & _MASK32
            h = ((h * _M) & _MASK32) ^ k
    tail = length & 3
    if tail:
        base = length & ~3
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h ^= data[base]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """Kafka's `Utils.toPositive`: clears the sign bit (not abs(): abs(MIN_VALUE)
    would stay negative in Java)."""
    return n & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return to_positive(murmur2(key)) % num_partitions


class StickyPartitioner:
    """The sticky choice for keyless records, per topic.

    Not thread-safe: the producer calls it under its accumulator lock.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._current: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int) -> int:
        p = self._current.get(topic)
        if p is None or p >= num_partitions:
            p = self._rng.randrange(num_partitions)
            self._current[topic] = p
        return p

    def on_batch_closed(self, topic: str, partition: int, num_partitions: int) -> None:
        """The batch of `partition` was closed: if it was the sticky one, move on
        to another partition (a different one when there is more than one)."""
        if self._current.get(topic) != partition:
            return
        if num_partitions <= 1:
            return
        nxt = self._rng.randrange(num_partitions - 1)
        self._current[topic] = nxt if nxt < partition else nxt + 1
