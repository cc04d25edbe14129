"""Reading a topic back in tests."""

from __future__ import annotations

import time
from typing import Any

from oncelog import Admin, Consumer, ConsumerRecord, TopicPartition, errors

# Coordinator states of a transaction that is decided and whose markers are
# still being written: until they land, its records are not readable
# (read_committed) although commit_transaction() has returned.
MARKERS_IN_FLIGHT = ("PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def wait_for_markers(bootstrap: str, deadline_s: float = 60.0, **config: Any) -> None:
    """Waits until no transaction is decided with its markers on their way.

    commit_transaction() returns when the commit is decided and its markers
    follow (as in Kafka), so a read_committed reader that takes the last
    stable offset right after it can stop short of the transaction's
    records. A transaction still open (Ongoing, or Prepared under two-phase
    commit) is not waited for: it stays invisible, as it should. A cluster
    without a transaction coordinator has nothing to wait for. `config`
    goes to the Admin (security settings)."""
    stop_at = time.monotonic() + deadline_s
    with Admin(bootstrap=bootstrap, **config) as admin:
        while True:
            try:
                pending = admin.list_transactions(states=MARKERS_IN_FLIGHT)
            except errors.OncelogError:
                return
            if not pending:
                return
            if time.monotonic() > stop_at:
                raise AssertionError(f"markers still on their way after {deadline_s} s: "
                                     f"{[(t.transactional_id, t.state) for t in pending]}")
            time.sleep(0.05)


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
