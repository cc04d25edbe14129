"""A client's side of the stores' quotas: when each store said it may be
asked again (its answers' throttle_time_ms), and what it said overall.

A store answers a client over its byte-rate quota with a throttle time
(Kafka's KIP-13/KIP-219); the client sends that store no request of the
kind before the time has passed, as Kafka's clients do, and the store would
hold one that came sooner anyway. Thread-safe: answers are read on one
thread, the totals on the user's.
"""

from __future__ import annotations

import logging
import threading

from .types import ThrottleTime

log = logging.getLogger("oncelog.quotas")


class Throttles:
    def __init__(self, kind: str) -> None:
        # "produce" or "fetch": what the log lines say.
        self._kind = kind
        self._lock = threading.Lock()
        # Store address -> until when (ms, the caller's clock) it asked to wait.
        self._until_ms: dict[str, int] = {}
        self._count = 0
        self._total_ms = 0
        self._max_ms = 0

    def answered(self, address: str, throttle_time_ms: int, now_ms: int) -> None:
        """A store's answer said throttle_time_ms (0: no throttle)."""
        if throttle_time_ms <= 0:
            return
        with self._lock:
            self._until_ms[address] = max(self._until_ms.get(address, 0),
                                          now_ms + throttle_time_ms)
            self._count += 1
            self._total_ms += throttle_time_ms
            self._max_ms = max(self._max_ms, throttle_time_ms)
        log.debug("the store at %s throttles this client's %s requests for %d ms (its "
                  "byte-rate quota)", address, self._kind, throttle_time_ms)

    def held_until_ms(self, address: str, now_ms: int) -> int | None:
        """When requests to `address` may go again; None: now."""
        with self._lock:
            until_ms = self._until_ms.get(address)
            if until_ms is None:
                return None
            if until_ms <= now_ms:
                del self._until_ms[address]
                return None
            return until_ms

    def next_release_ms(self, now_ms: int) -> int | None:
        """The earliest time a store that throttles now may be asked again."""
        with self._lock:
            pending = [t for t in self._until_ms.values() if t > now_ms]
            return min(pending) if pending else None

    def totals(self) -> ThrottleTime:
        with self._lock:
            return ThrottleTime(count=self._count, total_ms=self._total_ms,
                                max_ms=self._max_ms)
