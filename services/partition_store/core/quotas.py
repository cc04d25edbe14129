"""Client quotas: byte rates per (principal, client id), as Kafka's (KIP-13).

A quota is a byte rate for Produce (the batch bytes a client sends) and one
for Fetch (the batch bytes it is given). The rate is measured as Kafka's
`Rate` over a `SampledStat` measures it: `window_num` samples of
`window_size_ms` each (Kafka's `quota.window.num` 11 and
`quota.window.size.seconds` 1); a sample older than all of them together
is forgotten, and the rate is the sum of the samples over the time they
span, counted as at least `window_num - 1` whole windows (so a client that
just started is not judged by its first milliseconds).

When a recorded amount puts the rate over the quota, the client must wait
Kafka's throttle time,

    throttle_time_ms = (observed - quota) / quota * window_ms

where `window_ms` is the span the rate was measured over: the time after
which the rate, with nothing more recorded, is back at the quota. Kafka
does not cap it for byte rates; neither does this.

Which quota applies (Kafka's order of precedence, our subset of it): an
override for this principal and this client id; one for the principal (all
its client ids share it); one for the client id (all principals using it
share it); else the defaults (`--producer-byte-rate`,
`--consumer-byte-rate`), one rate per (principal, client id). A rate of 0
means unlimited, the default, as in Kafka; an unlimited client is not
measured at all.

Pure: the caller passes `now_ms` (the store passes a monotonic clock).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ...common.kernel.invariants import invariant

# Kafka's defaults: quota.window.num and quota.window.size.seconds.
DEFAULT_QUOTA_WINDOW_NUM = 11
DEFAULT_QUOTA_WINDOW_SIZE_MS = 1_000
# Kafka's names of the two rates in a quota override.
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
# The entity part of an override: Kafka's `--entity-type users|clients`.
_USER = "user"
_CLIENT_ID = "client-id"
# What a principal without a type is taken as (`user=alice`).
_DEFAULT_PRINCIPAL_TYPE = "User"


class QuotaKind(enum.StrEnum):
    PRODUCE = "produce"
    FETCH = "fetch"


class QuotaLevel(enum.StrEnum):
    """Which rule gave a client its quota; a metric label (four values)."""

    USER_CLIENT = "user_client_id"
    USER = "user"
    CLIENT = "client_id"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """Whose rate is measured: the clients that share one quota. None
    stands for any principal (a client-id override) or any client id (a
    principal override)."""

    principal: str | None
    client_id: str | None
    level: QuotaLevel


@dataclass(frozen=True, slots=True)
class QuotaOverride:
    """One entry of `--client-quotas`: a principal and/or a client id, and
    the rates it sets (None: this entry says nothing about that rate)."""

    principal: str | None
    client_id: str | None
    producer_byte_rate: int | None = None
    consumer_byte_rate: int | None = None

    def rate(self, kind: QuotaKind) -> int | None:
        return self.producer_byte_rate if kind is QuotaKind.PRODUCE else self.consumer_byte_rate


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    producer_byte_rate: int = 0
    consumer_byte_rate: int = 0
    overrides: tuple[QuotaOverride, ...] = ()
    window_num: int = DEFAULT_QUOTA_WINDOW_NUM
    window_size_ms: int = DEFAULT_QUOTA_WINDOW_SIZE_MS

    def __post_init__(self) -> None:
        invariant(self.window_num >= 2 and self.window_size_ms >= 1,
                  lambda: f"quota windows: {self.window_num} x {self.window_size_ms} ms; "
                          "at least 2 x 1 ms")

    @property
    def enabled(self) -> bool:
        return bool(self.producer_byte_rate or self.consumer_byte_rate or any(
            o.producer_byte_rate or o.consumer_byte_rate for o in self.overrides))

    def quota(self, kind: QuotaKind, principal: str,
              client_id: str) -> tuple[QuotaEntity, int] | None:
        """The entity whose rate counts for this client and its quota in
        bytes per second; None when it is unlimited."""
        by_level: dict[QuotaLevel, int] = {}
        for o in self.overrides:
            rate = o.rate(kind)
            if rate is None:
                continue
            if o.principal == principal and o.client_id == client_id:
                by_level[QuotaLevel.USER_CLIENT] = rate
            elif o.principal == principal and o.client_id is None:
                by_level[QuotaLevel.USER] = rate
            elif o.principal is None and o.client_id == client_id:
                by_level[QuotaLevel.CLIENT] = rate
        for level, entity in (
                (QuotaLevel.USER_CLIENT, QuotaEntity(principal, client_id, QuotaLevel.USER_CLIENT)),
                (QuotaLevel.USER, QuotaEntity(principal, None, QuotaLevel.USER)),
                (QuotaLevel.CLIENT, QuotaEntity(None, client_id, QuotaLevel.CLIENT))):
            if level in by_level:
                rate = by_level[level]
                return (entity, rate) if rate > 0 else None
        default = (self.producer_byte_rate if kind is QuotaKind.PRODUCE
                   else self.consumer_byte_rate)
        if default <= 0:
            return None
        return QuotaEntity(principal, client_id, QuotaLevel.DEFAULT), default

    def max_bytes_in_window(self, quota_bytes_per_s: int) -> int:
        """Kafka's getMaxValueInQuotaWindow: more than this in one fetch is
        throttled even after a quiet window, so a fetch is cut to it."""
        return max(quota_bytes_per_s * (self.window_num - 1) * self.window_size_ms // 1000, 1)


def throttle_time_ms(observed_bytes_per_s: float, quota_bytes_per_s: float,
                     window_ms: int) -> int:
    """Kafka's formula: how long until the rate, measured over `window_ms`,
    is back at the quota when nothing more is recorded. 0 when under it."""
    invariant(quota_bytes_per_s > 0, lambda: f"a quota of {quota_bytes_per_s} B/s")
    if observed_bytes_per_s <= quota_bytes_per_s:
        return 0
    return round((observed_bytes_per_s - quota_bytes_per_s) / quota_bytes_per_s * window_ms)


@dataclass(slots=True)
class _Sample:
    start_ms: int
    value: float = 0.0


class SampledRate:
    """Kafka's Rate over a SampledStat: the samples of the module docstring."""

    def __init__(self, *, window_num: int, window_size_ms: int, now_ms: int) -> None:
        self._window_num = window_num
        self._window_size_ms = window_size_ms
        self._samples = [_Sample(now_ms)]
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        sample = self._samples[self._current]
        if now_ms - sample.start_ms >= self._window_size_ms:
            # The new sample starts on the window grid of the previous one
            # (as Kafka's does), so gaps do not shift the windows.
            previous_end_ms = sample.start_ms + self._window_size_ms
            start_ms = now_ms - (now_ms - previous_end_ms) % self._window_size_ms
            self._current = (self._current + 1) % self._window_num
            if self._current == len(self._samples):
                self._samples.append(_Sample(start_ms))
            else:
                sample = self._samples[self._current]
                sample.start_ms, sample.value = start_ms, 0.0
            sample = self._samples[self._current]
        sample.value += value

    def _purge(self, now_ms: int) -> None:
        expire_age_ms = self._window_num * self._window_size_ms
        for sample in self._samples:
            if now_ms - sample.start_ms >= expire_age_ms:
                sample.start_ms, sample.value = now_ms, 0.0

    def window_ms(self, now_ms: int) -> int:
        """The span the rate is measured over now (Kafka's Rate.windowSize)."""
        self._purge(now_ms)
        elapsed_ms = now_ms - min(s.start_ms for s in self._samples)
        full_windows = elapsed_ms // self._window_size_ms
        min_full_windows = self._window_num - 1
        if full_windows < min_full_windows:
            elapsed_ms += (min_full_windows - full_windows) * self._window_size_ms
        return max(elapsed_ms, 1)

    def total(self, now_ms: int) -> float:
        self._purge(now_ms)
        return sum(s.value for s in self._samples)

    def rate_per_s(self, now_ms: int) -> float:
        window_ms = self.window_ms(now_ms)
        return self.total(now_ms) * 1000 / window_ms

    def idle_since(self, now_ms: int) -> bool:
        """Nothing recorded is still in the window."""
        return self.total(now_ms) == 0


@dataclass(slots=True)
class _EntityState:
    rate: SampledRate
    # The client may send its next request of this kind from then on.
    throttled_until_ms: int = 0
    last_used_ms: int = 0


@dataclass(frozen=True, slots=True)
class Recorded:
    """What recording an amount found: the entity, its quota, its rate
    after the amount and the throttle time it earned (0: none)."""

    entity: QuotaEntity
    quota_bytes_per_s: int
    rate_bytes_per_s: float
    throttle_time_ms: int


@dataclass(slots=True)
class ClientQuotas:
    """The measured rates of every limited entity, bounded: an entity idle
    for a whole window with no throttle pending is forgotten, and beyond
    `max_entities` the least recently used one is (its rate starts over)."""

    config: QuotaConfig
    max_entities: int
    _states: dict[tuple[QuotaKind, QuotaEntity], _EntityState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        invariant(self.max_entities >= 1, lambda: f"max_entities={self.max_entities}")

    @property
    def entity_count(self) -> int:
        return len(self._states)

    def quota(self, kind: QuotaKind, principal: str,
              client_id: str) -> tuple[QuotaEntity, int] | None:
        return self.config.quota(kind, principal, client_id)

    def _state(self, kind: QuotaKind, entity: QuotaEntity, now_ms: int) -> _EntityState:
        key = (kind, entity)
        state = self._states.pop(key, None)
        if state is None:
            self.expire_idle(now_ms)
            while len(self._states) >= self.max_entities:
                # The least recently used: dict order is use order here.
                del self._states[next(iter(self._states))]
            state = _EntityState(SampledRate(window_num=self.config.window_num,
                                             window_size_ms=self.config.window_size_ms,
                                             now_ms=now_ms))
        state.last_used_ms = now_ms
        self._states[key] = state
        return state

    def record(self, kind: QuotaKind, principal: str, client_id: str, size_bytes: int,
               now_ms: int) -> Recorded | None:
        """Counts `size_bytes` for this client; None when it is unlimited.
        A throttle time > 0 also holds the entity's next request of this
        kind until then (`delay_ms`)."""
        found = self.quota(kind, principal, client_id)
        if found is None:
            return None
        entity, quota = found
        state = self._state(kind, entity, now_ms)
        state.rate.record(size_bytes, now_ms)
        window_ms = state.rate.window_ms(now_ms)
        rate = state.rate.total(now_ms) * 1000 / window_ms
        throttle_ms = throttle_time_ms(rate, quota, window_ms)
        if throttle_ms > 0:
            state.throttled_until_ms = max(state.throttled_until_ms, now_ms + throttle_ms)
        return Recorded(entity, quota, rate, throttle_ms)

    def unrecord(self, kind: QuotaKind, entity: QuotaEntity, size_bytes: int,
                 now_ms: int) -> None:
        """Takes back an amount recorded (Kafka's unrecordQuotaSensor: a
        throttled fetch returns nothing, so its bytes do not count)."""
        state = self._states.get((kind, entity))
        if state is not None:
            state.rate.record(-size_bytes, now_ms)

    def delay_ms(self, kind: QuotaKind, principal: str, client_id: str, now_ms: int) -> int:
        """How long this client's request of this kind must still wait."""
        found = self.quota(kind, principal, client_id)
        if found is None:
            return 0
        state = self._states.get((kind, found[0]))
        if state is None:
            return 0
        return max(state.throttled_until_ms - now_ms, 0)

    def fetch_max_bytes(self, principal: str, client_id: str, max_bytes: int) -> int:
        """The fetch size this client gets: its own, cut to what its quota
        allows in one window (0 stays 0: the store's default applies, cut too)."""
        found = self.quota(QuotaKind.FETCH, principal, client_id)
        if found is None:
            return max_bytes
        cap = self.config.max_bytes_in_window(found[1])
        return cap if max_bytes <= 0 else min(max_bytes, cap)

    def expire_idle(self, now_ms: int) -> None:
        """Forgets entities with nothing in their window and no throttle pending."""
        idle_ms = self.config.window_num * self.config.window_size_ms
        for key in [k for k, s in self._states.items()
                    if now_ms - s.last_used_ms >= idle_ms and s.throttled_until_ms <= now_ms]:
            del self._states[key]


# ------------------------------------------------------------ flag parsing


def _principal(value: str) -> str:
    return value if ":" in value else f"{_DEFAULT_PRINCIPAL_TYPE}:{value}"


def _rate(flag: str, name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{flag}: {name}={text!r} is not a whole number of bytes per "
                         "second") from None
    if value < 0:
        raise ValueError(f"{flag}: {name}={value}; a byte rate is >= 0 (0: unlimited)")
    return value


def check_byte_rate(flag: str, value: int) -> int:
    if value < 0:
        raise ValueError(f"{flag} is {value}; a byte rate is >= 0 bytes per second "
                         "(0: unlimited)")
    return value


def parse_client_quotas(text: str, *, flag: str = "--client-quotas") -> tuple[QuotaOverride, ...]:
    """Parses `ENTITY:RATES;ENTITY:RATES;...`, where ENTITY is
    `user=PRINCIPAL`, `client-id=ID` or both (comma-separated) and RATES is
    `producer_byte_rate=N` and/or `consumer_byte_rate=N` (comma-separated),
    e.g. `user=User:alice,client-id=etl:producer_byte_rate=1048576`. The
    rates follow the last ':' (a principal has one of its own). A principal
    without a type is a User. ValueError naming `flag` and the bad part."""
    overrides: list[QuotaOverride] = []
    seen: set[tuple[str | None, str | None]] = set()
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        entity_text, colon, rates_text = entry.rpartition(":")
        if not colon or not entity_text or not rates_text:
            raise ValueError(f"{flag}: {entry!r} is not ENTITY:RATES "
                             "(e.g. user=User:alice,client-id=etl:producer_byte_rate=1048576)")
        entity: dict[str, str] = {}
        for part in entity_text.split(","):
            key, eq, value = part.strip().partition("=")
            if not eq or key not in (_USER, _CLIENT_ID) or not value or key in entity:
                raise ValueError(f"{flag}: {part.strip()!r} in {entry!r}; an entity is "
                                 f"{_USER}=PRINCIPAL and/or {_CLIENT_ID}=ID, each once")
            entity[key] = value.strip()
        rates: dict[str, int] = {}
        for part in rates_text.split(","):
            key, eq, value = part.strip().partition("=")
            if not eq or key not in (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE) or key in rates:
                raise ValueError(f"{flag}: {part.strip()!r} in {entry!r}; the rates are "
                                 f"{PRODUCER_BYTE_RATE}=N and/or {CONSUMER_BYTE_RATE}=N, "
                                 "each once")
            rates[key] = _rate(flag, key, value.strip())
        principal = _principal(entity[_USER]) if _USER in entity else None
        client_id = entity.get(_CLIENT_ID)
        if (principal, client_id) in seen:
            raise ValueError(f"{flag}: the entity of {entry!r} is given twice")
        seen.add((principal, client_id))
        overrides.append(QuotaOverride(principal, client_id,
                                       rates.get(PRODUCER_BYTE_RATE),
                                       rates.get(CONSUMER_BYTE_RATE)))
    return tuple(overrides)
