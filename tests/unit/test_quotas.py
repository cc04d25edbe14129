"""Client quotas' rate logic (services/partition_store/core/quotas.py) and
the store's hooks over it (services/partition_store/quotas.py).

Goal: the rate is Kafka's (samples, the minimum window, forgetting old
samples), the throttle time is Kafka's formula, the entity a client counts
against follows Kafka's order of precedence, fetches are cut to one window's
worth, a throttled fetch's bytes are taken back, the state stays bounded,
`--client-quotas` and the other flags refuse bad values naming the flag,
and a request that arrives while its client is throttled is held, in
arrival order, until the throttle has passed.

Method: the pure classes driven with explicit `now_ms`; expected values
computed by hand from the definitions in the module docstring. The hooks'
hold runs on a fake clock whose sleep moves it, so nothing here waits for
real time.
"""

from __future__ import annotations

import asyncio

import pytest

from services.partition_store.core.quotas import (
    ClientQuotas,
    QuotaConfig,
    QuotaEntity,
    QuotaKind,
    QuotaLevel,
    QuotaOverride,
    SampledRate,
    parse_client_quotas,
    throttle_time_ms,
)
from services.partition_store.quotas import (
    FetchThrottle,
    StoreQuotas,
    exempt,
    quota_config_from_args,
)
from services.partition_store.server import build_parser

ALICE = "User:alice"
BOB = "User:bob"
PRODUCE = QuotaKind.PRODUCE
FETCH = QuotaKind.FETCH


# ------------------------------------------------------------------ the rate


def test_a_new_rate_counts_at_least_the_minimum_window() -> None:
    rate = SampledRate(window_num=11, window_size_ms=1000, now_ms=0)
    rate.record(10_000, 0)
    # 10 full windows assumed: 10,000 B over 10 s.
    assert rate.window_ms(0) == 10_000
    assert rate.rate_per_s(0) == 1_000
    # Later within the first window: the time spanned plus 10 windows.
    assert rate.window_ms(500) == 10_500


def test_the_window_grows_past_the_minimum_with_real_samples() -> None:
    rate = SampledRate(window_num=11, window_size_ms=1000, now_ms=0)
    for second in range(11):
        rate.record(100, second * 1000)
    # Oldest sample started at 0; at 10.5 s, 10 full windows have passed.
    assert rate.window_ms(10_500) == 10_500
    assert rate.total(10_500) == 1_100


def test_samples_older_than_all_windows_are_forgotten() -> None:
    rate = SampledRate(window_num=3, window_size_ms=100, now_ms=0)
    rate.record(500, 0)
    rate.record(70, 150)
    assert rate.total(150) == 570
    # The sample that started at 0 expires at 300; the one of 100..200 at 400.
    assert rate.total(300) == 70
    assert rate.total(400) == 0


def test_samples_start_on_the_grid_of_the_previous_one() -> None:
    rate = SampledRate(window_num=3, window_size_ms=100, now_ms=0)
    rate.record(1, 0)
    rate.record(1, 250)  # the sample of 200..300, not 250..350
    rate.record(1, 299)
    assert rate.total(299) == 3
    # At 300 the first sample (0..100) is gone, the 200 one stays.
    assert rate.total(300) == 2


@pytest.mark.parametrize(("observed", "quota", "window_ms", "expected"), [
    (100.0, 100.0, 10_000, 0),
    (50.0, 100.0, 10_000, 0),
    (200.0, 100.0, 10_000, 10_000),
    (150.0, 100.0, 11_000, 5_500),
    (101.0, 100.0, 10_000, 100),
])
def test_throttle_time_is_kafkas_formula(observed: float, quota: float, window_ms: int,
                                         expected: int) -> None:
    assert throttle_time_ms(observed, quota, window_ms) == expected


# ------------------------------------------------------------------ entities


CONFIG = QuotaConfig(
    producer_byte_rate=1000, consumer_byte_rate=0,
    overrides=(
        QuotaOverride(ALICE, "etl", producer_byte_rate=5000),
        QuotaOverride(ALICE, None, producer_byte_rate=3000, consumer_byte_rate=700),
        QuotaOverride(None, "reports", producer_byte_rate=2000),
        QuotaOverride(None, "free", producer_byte_rate=0),
    ),
)


@pytest.mark.parametrize(("kind", "principal", "client_id", "expected"), [
    (PRODUCE, ALICE, "etl", (QuotaEntity(ALICE, "etl", QuotaLevel.USER_CLIENT), 5000)),
    (PRODUCE, ALICE, "other", (QuotaEntity(ALICE, None, QuotaLevel.USER), 3000)),
    # The user override wins over the client-id one.
    (PRODUCE, ALICE, "reports", (QuotaEntity(ALICE, None, QuotaLevel.USER), 3000)),
    (PRODUCE, BOB, "reports", (QuotaEntity(None, "reports", QuotaLevel.CLIENT), 2000)),
    (PRODUCE, BOB, "x", (QuotaEntity(BOB, "x", QuotaLevel.DEFAULT), 1000)),
    # 0 in an override: unlimited, even though a default is set.
    (PRODUCE, BOB, "free", None),
    # Fetch: only alice's user override sets a consumer rate; the default is 0.
    (FETCH, ALICE, "etl", (QuotaEntity(ALICE, None, QuotaLevel.USER), 700)),
    (FETCH, BOB, "etl", None),
])
def test_entities_match_in_kafkas_order(kind: QuotaKind, principal: str, client_id: str,
                                        expected: tuple[QuotaEntity, int] | None) -> None:
    assert CONFIG.quota(kind, principal, client_id) == expected


def test_clients_of_one_user_override_share_its_rate() -> None:
    quotas = ClientQuotas(CONFIG, max_entities=100)
    # 3000 B/s over 10 s: 30,000 B pass; the next byte is over.
    first = quotas.record(PRODUCE, ALICE, "a", 30_000, 0)
    second = quotas.record(PRODUCE, ALICE, "b", 3_000, 0)
    assert first is not None and first.throttle_time_ms == 0
    assert second is not None and second.throttle_time_ms == 1_000  # (3300-3000)/3000*10s
    # Another principal under the default is not touched.
    other = quotas.record(PRODUCE, BOB, "a", 1_000, 0)
    assert other is not None and other.throttle_time_ms == 0


def test_a_throttle_holds_the_entity_until_it_has_passed() -> None:
    quotas = ClientQuotas(QuotaConfig(producer_byte_rate=1000), max_entities=100)
    recorded = quotas.record(PRODUCE, BOB, "p", 20_000, 1_000)
    assert recorded is not None and recorded.throttle_time_ms == 10_000
    assert quotas.delay_ms(PRODUCE, BOB, "p", 1_000) == 10_000
    assert quotas.delay_ms(PRODUCE, BOB, "p", 6_000) == 5_000
    assert quotas.delay_ms(PRODUCE, BOB, "p", 11_000) == 0
    # Fetches and other clients are not held.
    assert quotas.delay_ms(FETCH, BOB, "p", 1_000) == 0
    assert quotas.delay_ms(PRODUCE, BOB, "q", 1_000) == 0


def test_unlimited_clients_keep_no_state() -> None:
    quotas = ClientQuotas(QuotaConfig(), max_entities=100)
    assert quotas.record(PRODUCE, BOB, "p", 10**9, 0) is None
    assert quotas.entity_count == 0
    assert quotas.fetch_max_bytes(BOB, "p", 123) == 123


def test_fetches_are_cut_to_one_windows_worth() -> None:
    quotas = ClientQuotas(QuotaConfig(consumer_byte_rate=1000), max_entities=100)
    assert quotas.fetch_max_bytes(BOB, "c", 50_000) == 10_000
    assert quotas.fetch_max_bytes(BOB, "c", 500) == 500
    assert quotas.fetch_max_bytes(BOB, "c", 0) == 10_000


def test_unrecord_takes_a_throttled_fetch_back() -> None:
    quotas = ClientQuotas(QuotaConfig(consumer_byte_rate=1000), max_entities=100)
    recorded = quotas.record(FETCH, BOB, "c", 15_000, 0)
    assert recorded is not None and recorded.throttle_time_ms == 5_000
    quotas.unrecord(FETCH, recorded.entity, 15_000, 0)
    again = quotas.record(FETCH, BOB, "c", 10_000, 0)
    assert again is not None and again.throttle_time_ms == 0


def test_entities_are_bounded_and_idle_ones_forgotten() -> None:
    quotas = ClientQuotas(QuotaConfig(producer_byte_rate=1000), max_entities=3)
    for i in range(5):
        quotas.record(PRODUCE, BOB, f"c{i}", 1, 0)
    assert quotas.entity_count == 3
    # Idle for the whole window (11 s) with no throttle: gone.
    quotas.expire_idle(11_000)
    assert quotas.entity_count == 0
    # A throttled one stays while its throttle lasts.
    quotas.record(PRODUCE, BOB, "hot", 100_000, 20_000)
    quotas.expire_idle(31_000)
    assert quotas.entity_count == 1


# ------------------------------------------------------------------ flags


def test_client_quotas_parse() -> None:
    assert parse_client_quotas(
        "user=User:alice,client-id=etl:producer_byte_rate=1048576; "
        "user=bob:consumer_byte_rate=10,producer_byte_rate=20;client-id=a:b:producer_byte_rate=0"
    ) == (
        QuotaOverride(ALICE, "etl", 1048576, None),
        QuotaOverride(BOB, None, 20, 10),
        QuotaOverride(None, "a:b", 0, None),
    )
    assert parse_client_quotas("") == ()


@pytest.mark.parametrize(("text", "named"), [
    ("user=alice", "ENTITY:RATES"),
    ("group=x:producer_byte_rate=1", "'group=x'"),
    ("user=alice:producer_byte_rate=fast", "'fast'"),
    ("user=alice:producer_byte_rate=-1", "producer_byte_rate=-1"),
    ("user=alice:request_percentage=5", "'request_percentage=5'"),
    ("user=alice:producer_byte_rate=1;user=User:alice:consumer_byte_rate=1", "twice"),
])
def test_bad_client_quotas_are_refused_naming_the_flag(text: str, named: str) -> None:
    with pytest.raises(ValueError, match="--client-quotas") as info:
        parse_client_quotas(text)
    assert named in str(info.value)


@pytest.mark.parametrize(("argv", "named"), [
    (["--producer-byte-rate", "-5"], "--producer-byte-rate"),
    (["--consumer-byte-rate", "-1"], "--consumer-byte-rate"),
    (["--quota-window-num", "1"], "--quota-window-num"),
    (["--quota-window-size-ms", "0"], "--quota-window-size-ms"),
    (["--client-quotas", "nonsense"], "--client-quotas"),
])
def test_bad_quota_flags_are_refused_naming_the_flag(argv: list[str], named: str) -> None:
    args = build_parser().parse_args(["--data-dir", "x", *argv])
    with pytest.raises(ValueError, match=named):
        quota_config_from_args(args)


def test_quota_flags_default_to_unlimited() -> None:
    config = quota_config_from_args(build_parser().parse_args(["--data-dir", "x"]))
    assert not config.enabled
    assert (config.window_num, config.window_size_ms) == (11, 1000)


def test_internal_topics_are_exempt() -> None:
    assert exempt(["__consumer_offsets", "__transaction_state"])
    assert not exempt(["__acls", "orders"])


# ------------------------------------------------------------------ the hold


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 0
        self.slept_ms: list[int] = []

    def __call__(self) -> int:
        return self.now_ms

    async def sleep(self, seconds: float) -> None:
        ms = round(seconds * 1000)
        self.slept_ms.append(ms)
        self.now_ms += ms
        await asyncio.sleep(0)


def test_a_throttled_clients_next_requests_are_held_in_order() -> None:
    clock = FakeClock()
    quotas = StoreQuotas(QuotaConfig(producer_byte_rate=1000), clock_ms=clock,
                         sleep=clock.sleep)
    assert quotas.produced(BOB, "p", 20_000) == 10_000
    order: list[int] = []

    async def request(i: int) -> None:
        await quotas.hold(PRODUCE, BOB, "p")
        order.append(i)

    async def main() -> None:
        # Another client is not held: it returns without a wait.
        await quotas.hold(PRODUCE, BOB, "other")
        assert clock.slept_ms == []
        await asyncio.gather(*(request(i) for i in range(3)))

    asyncio.run(main())
    assert order == [0, 1, 2]
    assert clock.now_ms == 10_000
    assert sum(clock.slept_ms) == 10_000


def test_a_throttled_fetch_withholds_its_batches_and_does_not_count() -> None:
    clock = FakeClock()
    quotas = StoreQuotas(QuotaConfig(consumer_byte_rate=1000), clock_ms=clock,
                         sleep=clock.sleep)
    assert quotas.fetched(BOB, "c", 9_000) == FetchThrottle(0, False)
    # 12,000 B over 10 s: 1,200 B/s, 2 s of throttle; withheld and taken back.
    assert quotas.fetched(BOB, "c", 3_000) == FetchThrottle(2_000, True)
    clock.now_ms = 2_000
    assert quotas.fetched(BOB, "c", 1_000) == FetchThrottle(0, False)


def test_an_answer_larger_than_a_window_is_throttled_but_kept() -> None:
    """Withholding it would throttle it again after every wait: the client
    would never get past its first batch."""
    clock = FakeClock()
    quotas = StoreQuotas(QuotaConfig(consumer_byte_rate=1000), clock_ms=clock,
                         sleep=clock.sleep)
    assert quotas.fetched(BOB, "c", 15_000) == FetchThrottle(5_000, False)
    # It counted: the next small fetch is throttled too.
    assert quotas.fetched(BOB, "c", 100).throttle_time_ms > 0
