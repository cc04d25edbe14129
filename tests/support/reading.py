"""Reading a topic back in tests."""

from __future__ import annotations

import time
from typing import Any

from oncelog import Consumer, ConsumerRecord, TopicPartition
from oncelog.testing import wait_for_markers

__all__ = ["poll_records", "read_all", "wait_for_markers"]


def poll_records(consumer: Consumer, count: int, *, deadline_s: float = 60.0) -> int:
    """Polls a subscribed consumer until it has handed out `count` records
    (the group has joined and read them); returns how many it did. Fails
    the test after deadline_s instead of hanging it."""
    deadline = time.monotonic() + deadline_s
    read = 0
    while read < count:
        assert time.monotonic() < deadline, f"read {read} of {count} records"
        read += len(consumer.poll(timeout=0.5))
    return read


def read_all(bootstrap: str, topic: str, partitions: int, *, expected: int | None = None,
             isolation_level: str = "read_uncommitted", deadline_s: float = 60.0,
             **config: Any) -> list[ConsumerRecord]:
    """Every record of a topic up to its end offsets (taken at the start), or
    until `expected` records arrived; bounded by deadline_s so a bug fails
    the test instead of hanging it. read_committed first waits for the
    markers of every decided transaction (wait_for_markers), then reads up
    to the last stable offset. `config` goes to the clients (security
    settings, for instance)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: list[ConsumerRecord] = []
    if isolation_level == "read_committed":
        wait_for_markers(bootstrap, deadline_s, **config)
    with Consumer(bootstrap=bootstrap, isolation_level=isolation_level, **config) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        ends = consumer.end_offsets(tps)
        stop_at = time.monotonic() + deadline_s
        while time.monotonic() < stop_at:
            out.extend(consumer.poll(timeout=0.5))
            if expected is not None:
                if len(out) >= expected:
                    break
            elif all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
    return out
