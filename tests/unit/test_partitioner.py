"""The partitioner sends keys where Kafka's Java client sends them, and keeps
keyless records together.

Method: murmur2 is checked against published test vectors (Kafka's
`UtilsTest.testMurmur2` and librdkafka's `unittest_murmur2`, which cover every
tail length), partition choice against `toPositive(murmur2(key)) % n`, and the
sticky partitioner with a seeded random source: one partition until its batch
closes, then a different one.
"""

from __future__ import annotations

import random

import pytest

from oncelog._partitioner import StickyPartitioner, murmur2, partition_for_key, to_positive

KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# librdkafka's rdmurmur2.c unit test (the Java results, as unsigned hex).
LIBRDKAFKA_VECTORS = {
    b"kafka": 0xD067CF64,
    b"giberish123456789": 0x8F552B0C,
    b"1234": 0x9FC97B14,
    b"234": 0xE7C009CA,
    b"34": 0x873930DA,
    b"4": 0x5A4B5CA1,
    b"PreAmbleWillBeRemoved,ThePrePartThatIs": 0x78424F1C,
}


@pytest.mark.parametrize(("key", "expected"), sorted(KAFKA_VECTORS.items()))
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), sorted(LIBRDKAFKA_VECTORS.items()))
def test_murmur2_matches_librdkafka(key: bytes, expected: int) -> None:
    assert murmur2(key) & 0xFFFFFFFF == expected


def test_murmur2_is_a_signed_32_bit_int() -> None:
    rng = random.Random(7)
    for length in range(0, 40):
        value = murmur2(rng.randbytes(length))
        assert -(2**31) <= value < 2**31


def test_to_positive_clears_the_sign_bit_like_java() -> None:
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0  # abs() would not do this
    assert to_positive(5) == 5


def test_partition_for_key_is_kafkas_formula() -> None:
    for key, hashed in KAFKA_VECTORS.items():
        for n in (1, 3, 7, 100):
            assert partition_for_key(key, n) == (hashed & 0x7FFFFFFF) % n


def test_sticky_partitioner_sticks_until_the_batch_closes() -> None:
    sticky = StickyPartitioner(random.Random(1))
    first = sticky.partition("t", 6)
    assert all(sticky.partition("t", 6) == first for _ in range(50))
    # A batch of another partition closing changes nothing.
    sticky.on_batch_closed("t", (first + 1) % 6, 6)
    assert sticky.partition("t", 6) == first
    sticky.on_batch_closed("t", first, 6)
    second = sticky.partition("t", 6)
    assert second != first
    assert 0 <= second < 6


def test_sticky_partitioner_spreads_over_all_partitions() -> None:
    sticky = StickyPartitioner(random.Random(3))
    seen = set()
    for _ in range(200):
        p = sticky.partition("t", 4)
        seen.add(p)
        sticky.on_batch_closed("t", p, 4)
    assert seen == {0, 1, 2, 3}


def test_sticky_partitioner_with_one_partition_and_per_topic_state() -> None:
    sticky = StickyPartitioner(random.Random(5))
    assert sticky.partition("one", 1) == 0
    sticky.on_batch_closed("one", 0, 1)
    assert sticky.partition("one", 1) == 0
    a = sticky.partition("a", 1000)
    b = sticky.partition("b", 1000)
    sticky.on_batch_closed("b", b, 1000)
    assert sticky.partition("a", 1000) == a
