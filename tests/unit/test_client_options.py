"""Client options are checked when the client is made, with errors that name them.

Goal: a Kafka user's slip — a string where an int goes, True for a number, an
acks value Kafka has but we do not — fails at construction with a ValueError
naming the option and the value received, never later as a raw comparison
error in a background thread; `acks` takes Kafka's spellings with Kafka's
meaning (and its rule that idempotence needs acks="all"); `compression_type`
takes Kafka's codec names and lists them when given another.

Also: retry backoff is exponential with KIP-580's jitter, so clients that
failed together do not retry in step.

Method: construct clients against an address nothing listens on (options are
checked before any connection) and read the errors; draw backoffs from
seeded generators.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from oncelog import Admin, Consumer, Producer
from oncelog._client import BACKOFF_JITTER, backoff_ms
from oncelog.aio import AIOProducer

NOWHERE = "127.0.0.1:1"

PRODUCER_INT_OPTIONS = [
    "linger_ms", "batch_size", "max_in_flight", "transaction_timeout_ms",
    "delivery_timeout_ms", "request_timeout_ms", "retry_backoff_ms",
    "retry_backoff_max_ms", "buffer_memory_bytes", "max_block_ms",
]


@pytest.mark.parametrize("option", PRODUCER_INT_OPTIONS)
@pytest.mark.parametrize("value", ["big", 1.5, True, None])
def test_a_producer_int_option_of_another_type_is_named(option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{option} must be an int, got {value!r}"):
        Producer(bootstrap=NOWHERE, **{option: value})


@pytest.mark.parametrize("option", ["linger_ms", "max_block_ms"])
def test_a_negative_time_is_refused(option: str) -> None:
    options: dict[str, Any] = {option: -1}
    with pytest.raises(ValueError, match=rf"^{option} must be >= 0, got -1"):
        Producer(bootstrap=NOWHERE, **options)


def test_bool_options_take_bools_only() -> None:
    with pytest.raises(ValueError, match="^enable_idempotence must be True or False"):
        Producer(bootstrap=NOWHERE, enable_idempotence="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("acks", ["all", -1, "-1"])
def test_acks_all_is_the_default_and_accepted(acks: Any) -> None:
    with Producer(bootstrap=NOWHERE, acks=acks) as producer:
        assert producer.acks == -1
    with Producer(bootstrap=NOWHERE) as producer:
        assert producer.acks == -1


def test_acks_1_gives_up_idempotence_unless_it_was_asked_for() -> None:
    with Producer(bootstrap=NOWHERE, acks=1) as producer:
        assert producer.acks == 1
    with pytest.raises(ValueError, match="idempotent producer needs acks='all'"):
        Producer(bootstrap=NOWHERE, acks=1, enable_idempotence=True)
    with pytest.raises(ValueError, match="idempotent producer needs acks='all'"):
        Producer(bootstrap=NOWHERE, acks=1, transactional_id="t")


@pytest.mark.parametrize("acks", [0, "0"])
def test_acks_0_is_refused_with_the_reason(acks: Any) -> None:
    with pytest.raises(ValueError, match="acks=0 .fire and forget. is not supported"):
        Producer(bootstrap=NOWHERE, acks=acks, enable_idempotence=False)


@pytest.mark.parametrize("name", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_compression_type_takes_kafkas_names(name: str) -> None:
    with Producer(bootstrap=NOWHERE, compression_type=name) as producer:
        assert producer._accumulator.compression.name.lower() == name
    with Producer(bootstrap=NOWHERE) as producer:
        assert producer._accumulator.compression.name == "NONE"


@pytest.mark.parametrize("value", ["brotli", "GZIP", "", 2, None])
def test_a_bad_compression_type_lists_the_choices(value: Any) -> None:
    match = (r"^compression_type must be one of 'none', 'gzip', 'snappy', 'lz4', 'zstd', "
             rf"got {value!r}")
    with pytest.raises(ValueError, match=match):
        Producer(bootstrap=NOWHERE, compression_type=value)
    # AIOProducer takes Producer's options, checked the same way.
    with pytest.raises(ValueError, match=match):
        AIOProducer(bootstrap=NOWHERE, compression_type=value)


@pytest.mark.parametrize("acks", [2, "leader", False, None])
def test_unknown_acks_are_named(acks: Any) -> None:
    with pytest.raises(ValueError, match="^acks must be 'all', -1 or 1"):
        Producer(bootstrap=NOWHERE, acks=acks, enable_idempotence=False)


CONSUMER_INT_OPTIONS = [
    "auto_commit_interval_ms", "max_poll_records", "session_timeout_ms",
    "fetch_max_wait_ms", "fetch_min_bytes", "fetch_max_bytes", "max_partition_fetch_bytes",
    "request_timeout_ms", "retry_backoff_ms", "retry_backoff_max_ms", "default_api_timeout_ms",
]
ADMIN_INT_OPTIONS = ["request_timeout_ms", "default_api_timeout_ms", "retry_backoff_ms",
                     "retry_backoff_max_ms"]


@pytest.mark.parametrize("option", CONSUMER_INT_OPTIONS)
def test_a_consumer_int_option_of_another_type_is_named(option: str) -> None:
    options: dict[str, Any] = {option: "big"}
    with pytest.raises(ValueError, match=rf"^{option} must be an int, got 'big' \(str\)"):
        Consumer(bootstrap=NOWHERE, **options)


@pytest.mark.parametrize("option", ADMIN_INT_OPTIONS)
def test_an_admin_int_option_of_another_type_is_named(option: str) -> None:
    options: dict[str, Any] = {option: 2.5}
    with pytest.raises(ValueError, match=rf"^{option} must be an int, got 2.5 \(float\)"):
        Admin(bootstrap=NOWHERE, **options)


def test_consumer_choices_and_flags_are_named() -> None:
    with pytest.raises(ValueError, match="^isolation_level must be one of 'read_committed'"):
        Consumer(bootstrap=NOWHERE, isolation_level="serializable")
    with pytest.raises(ValueError, match="^auto_offset_reset must be one of 'earliest'"):
        Consumer(bootstrap=NOWHERE, auto_offset_reset="smallest")
    with pytest.raises(ValueError, match="^enable_auto_commit must be True or False"):
        Consumer(bootstrap=NOWHERE, group_id="g", enable_auto_commit="yes")  # type: ignore[arg-type]


def test_backoff_grows_exponentially_within_the_jitter() -> None:
    rng = random.Random(7)
    for attempt, term_ms in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1000), (30, 1000)]:
        drawn = [backoff_ms(attempt, base_ms=100, max_ms=1000, rng=rng) for _ in range(200)]
        low = term_ms * (1 - BACKOFF_JITTER)
        high = term_ms * (1 + BACKOFF_JITTER)
        assert all(low - 1 <= d <= high for d in drawn), (attempt, min(drawn), max(drawn))
        # Spread, not one value: two clients that failed together drift apart.
        assert max(drawn) - min(drawn) > term_ms * BACKOFF_JITTER, (attempt, drawn[:5])
