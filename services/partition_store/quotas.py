"""Client quotas in a store: its flags, and the hooks its gRPC servicer and
its Kafka listener call around Produce and Fetch (the rate logic is
core/quotas.py; docs/partition-store.md, "Client quotas").

A client over its quota is still answered, with `throttle_time_ms` (the
batches of a throttled Produce are written; a throttled Fetch returns no
batches, as Kafka's does). Kafka (>= 2.0, KIP-219) then mutes the client's
connection for that long. A gRPC channel carries many clients' calls and a
store cannot stop reading one call's stream without holding the others, so
the store holds the client's next requests instead: a Produce or Fetch of
the same quota entity that arrives before its throttle time has passed
waits (in arrival order) until it has, and only then is read. Clients that
honour the throttle time, ours and Kafka's, never wait there.

Only limited clients cost anything: with every rate unlimited (the
default) the hooks return at once and nothing is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from ..common.kernel import limits
from ..common.rpc.server_base import env_default
from . import metrics
from .core.quotas import (
    DEFAULT_QUOTA_WINDOW_NUM,
    DEFAULT_QUOTA_WINDOW_SIZE_MS,
    ClientQuotas,
    QuotaConfig,
    QuotaEntity,
    QuotaKind,
    Recorded,
    check_byte_rate,
    parse_client_quotas,
)

# Internal topics' names start with this; their traffic is the services'
# own (coordinators, ACLs), which Kafka's quotas never meet either (Kafka's
# coordinators live in its brokers).
_INTERNAL_PREFIX = "__"


def exempt(topics: Iterable[str]) -> bool:
    """A request that names internal topics only is not limited."""
    return all(t.startswith(_INTERNAL_PREFIX) for t in topics)


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def add_quota_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--producer-byte-rate", type=int, default=env_default("producer-byte-rate", "0"),
        help="default producer quota: bytes per second each (principal, client id) may "
             "produce to this store before its answers carry a throttle time (Kafka's "
             "producer_byte_rate; 0: unlimited)")
    add("--consumer-byte-rate", type=int, default=env_default("consumer-byte-rate", "0"),
        help="default consumer quota: bytes per second each (principal, client id) may "
             "fetch from this store (Kafka's consumer_byte_rate; 0: unlimited)")
    add("--client-quotas", default=env_default("client-quotas", ""),
        help="quota overrides, ';'-separated ENTITY:RATES, ENTITY being user=PRINCIPAL "
             "and/or client-id=ID and RATES producer_byte_rate=N and/or "
             "consumer_byte_rate=N (e.g. 'user=User:alice,client-id=etl:"
             "producer_byte_rate=1048576'); matched in Kafka's order: user and client id, "
             "user, client id, then the defaults")
    add("--quota-window-num", type=int,
        default=env_default("quota-window-num", str(DEFAULT_QUOTA_WINDOW_NUM)),
        help="samples a client's byte rate is measured over (Kafka's quota.window.num)")
    add("--quota-window-size-ms", type=int,
        default=env_default("quota-window-size-ms", str(DEFAULT_QUOTA_WINDOW_SIZE_MS)),
        help="length of one sample (Kafka's quota.window.size.seconds, in ms)")


def quota_config_from_args(args: argparse.Namespace) -> QuotaConfig:
    """The quotas the flags give; ValueError naming the flag that is wrong."""
    if args.quota_window_num < 2:
        raise ValueError(f"--quota-window-num is {args.quota_window_num}; at least 2 "
                         "samples (Kafka's default: 11)")
    if args.quota_window_size_ms < 1:
        raise ValueError(f"--quota-window-size-ms is {args.quota_window_size_ms}; at least "
                         "1 ms (Kafka's default: 1000)")
    return QuotaConfig(
        producer_byte_rate=check_byte_rate("--producer-byte-rate", args.producer_byte_rate),
        consumer_byte_rate=check_byte_rate("--consumer-byte-rate", args.consumer_byte_rate),
        overrides=parse_client_quotas(args.client_quotas or ""),
        window_num=args.quota_window_num, window_size_ms=args.quota_window_size_ms,
    )


@dataclass(frozen=True, slots=True)
class FetchThrottle:
    """What a Fetch's answer gets: its throttle time (0: none), and whether
    its batches are withheld (StoreQuotas.fetched)."""

    throttle_time_ms: int
    withhold_batches: bool


NOT_THROTTLED = FetchThrottle(0, False)


@dataclass(slots=True)
class _Gate:
    """The requests of one entity waiting out its throttle, in order."""

    lock: asyncio.Lock
    waiting: int = 0


class StoreQuotas:
    """The store's quotas, shared by its gRPC servicer and Kafka listener."""

    def __init__(self, config: QuotaConfig, *, clock_ms: Callable[[], int] = monotonic_ms,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.config = config
        self.enabled = config.enabled
        self._quotas = ClientQuotas(config, max_entities=limits.MAX_QUOTA_ENTITIES)
        self._clock_ms = clock_ms
        self._sleep = sleep
        self._gates: dict[tuple[QuotaKind, QuotaEntity], _Gate] = {}

    async def hold(self, kind: QuotaKind, principal: str, client_id: str) -> None:
        """Returns once this client may be served: at once unless it is
        still throttled, or earlier requests of its entity are waiting.
        Returning without a wait does not yield, so requests that are not
        held keep their arrival order."""
        if not self.enabled:
            return
        found = self._quotas.quota(kind, principal, client_id)
        if found is None:
            return
        key = (kind, found[0])
        gate = self._gates.get(key)
        if gate is None and self._quotas.delay_ms(kind, principal, client_id,
                                                  self._clock_ms()) <= 0:
            return
        if gate is None:
            gate = self._gates[key] = _Gate(asyncio.Lock())
        gate.waiting += 1
        metrics.QUOTA_DELAYED_REQUESTS.labels(kind.value).inc()
        try:
            async with gate.lock:
                # Requeued behind the ones before it; the throttle may have
                # grown meanwhile (their own answers).
                while (delay_ms := self._quotas.delay_ms(kind, principal, client_id,
                                                         self._clock_ms())) > 0:
                    await self._sleep(delay_ms / 1000)
        finally:
            gate.waiting -= 1
            if gate.waiting == 0:
                self._gates.pop(key, None)

    def _record(self, kind: QuotaKind, principal: str, client_id: str,
                size_bytes: int) -> Recorded | None:
        recorded = self._quotas.record(kind, principal, client_id, size_bytes, self._clock_ms())
        metrics.QUOTA_ENTITIES.set(self._quotas.entity_count)
        if recorded is None:
            return None
        level = recorded.entity.level.value
        if recorded.throttle_time_ms > 0:
            metrics.QUOTA_THROTTLED_REQUESTS.labels(kind.value, level).inc()
            metrics.QUOTA_THROTTLE_SECONDS.labels(kind.value).observe(
                recorded.throttle_time_ms / 1000)
        return recorded

    def produced(self, principal: str, client_id: str, size_bytes: int) -> int:
        """Counts a Produce's batch bytes; the throttle time to answer (ms)."""
        if not self.enabled:
            return 0
        recorded = self._record(QuotaKind.PRODUCE, principal, client_id, size_bytes)
        if recorded is None:
            return 0
        metrics.QUOTA_BYTES.labels(QuotaKind.PRODUCE.value, recorded.entity.level.value).inc(
            max(size_bytes, 0))
        return recorded.throttle_time_ms

    def fetch_max_bytes(self, principal: str, client_id: str, max_bytes: int) -> int:
        """The fetch size to use: the client's, cut to what its quota allows
        in one window (a 0, "the store's default", is cut too)."""
        if not self.enabled:
            return max_bytes
        return self._quotas.fetch_max_bytes(principal, client_id, max_bytes)

    def fetched(self, principal: str, client_id: str, size_bytes: int) -> FetchThrottle:
        """Counts a Fetch's answer of `size_bytes` batch bytes: the throttle
        time to answer, and whether to answer without the batches.

        As Kafka's broker, a throttled fetch is answered without its batches
        and they do not count, so the client fetches them again after its
        throttle time. Unlike Kafka's, an answer larger than the quota
        allows in a whole window (its first batch alone is larger: a fetch
        always returns its first batch whole) keeps its batches and counts:
        it would be throttled however long the client waited, and the
        consumer would never get past it."""
        if not self.enabled:
            return NOT_THROTTLED
        recorded = self._record(QuotaKind.FETCH, principal, client_id, size_bytes)
        if recorded is None:
            return NOT_THROTTLED
        withhold = (recorded.throttle_time_ms > 0 and size_bytes
                    <= self.config.max_bytes_in_window(recorded.quota_bytes_per_s))
        if withhold:
            self._quotas.unrecord(QuotaKind.FETCH, recorded.entity, size_bytes,
                                  self._clock_ms())
        else:
            metrics.QUOTA_BYTES.labels(QuotaKind.FETCH.value, recorded.entity.level.value).inc(
                max(size_bytes, 0))
        return FetchThrottle(recorded.throttle_time_ms, withhold)
