"""Reading a topic back in tests."""

from __future__ import annotations

import time
from typing import Any

from oncelog import Consumer, ConsumerRecord, TopicPartition


def read_all(bootstrap: str, topic: str, partitions: int, *, expected: int | None = None,
             isolation_level: str = "read_uncommitted", deadline_s: float = 60.0,
             until: str = "log_end", **config: Any) -> list[ConsumerRecord]:
    """Every record of a topic up to its end offsets (taken at the start), or
    until `expected` records arrived; bounded by deadline_s so a bug fails
    the test instead of hanging it.

    With read_committed, `until="log_end"` (the default) reads up to the log
    end: commit_transaction() returns when the commit is decided and its
    markers follow (as in Kafka), so the last stable offset of the moment can
    stop short of a transaction that has just committed. Every transaction
    written so far must be decided within deadline_s. `until="stable"` reads
    up to the last stable offset of the moment, for checks that a still-open
    transaction is invisible. `config` goes to the consumers (security
    settings, for instance)."""
    if until not in ("log_end", "stable"):
        raise ValueError(f"until must be 'log_end' or 'stable', not {until!r}")
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: list[ConsumerRecord] = []
    if isolation_level == "read_committed" and until == "log_end":
        with Consumer(bootstrap=bootstrap, isolation_level="read_uncommitted",
                      **config) as probe:
            ends = probe.end_offsets(tps)
    else:
        ends = {}
    with Consumer(bootstrap=bootstrap, isolation_level=isolation_level, **config) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        ends = ends or consumer.end_offsets(tps)
        stop_at = time.monotonic() + deadline_s
        while time.monotonic() < stop_at:
            out.extend(consumer.poll(timeout=0.5))
            if expected is not None:
                if len(out) >= expected:
                    break
            elif all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
    return out
