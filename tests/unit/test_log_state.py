"""Partition offsets (LogState) and retention planning.

Goal: the offsets keep log_start <= HW <= LEO, the running max timestamp
decides time-index entries, and plan_retention deletes exactly the batches
Kafka's rules would (oldest first, by max timestamp and by size) while never
deleting the newest batch, anything not yet durable, or anything at or
beyond the newest producer-state snapshot.

Method: pure functions on hand-built batch lists; a table for the planner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from oncelog.records import BatchHeader, encode_batch, read_header
from services.common.kernel.invariants import InvariantViolation
from services.partition_store.core.log_state import (
    BatchInfo,
    LogState,
    RetentionPlan,
    last_stable_offset,
    plan_retention,
)


def _header(base_offset: int, count: int, ts: int) -> BatchHeader:
    raw = encode_batch([(None, b"x", None, ts + i) for i in range(count)])
    return dataclasses.replace(read_header(raw), base_offset=base_offset)


def test_append_durable_truncate() -> None:
    state = LogState("t-0")
    assert state.replay_append(_header(0, 3, 100)) is True   # first batch: index entry
    assert state.replay_append(_header(3, 2, 50)) is False   # older timestamps: none
    assert state.replay_append(_header(5, 1, 500)) is True
    assert (state.log_end_offset, state.high_watermark) == (6, 0)
    assert state.max_timestamp_ms == 500
    assert state.mark_durable(5) is True
    assert state.mark_durable(3) is False  # never moves back
    assert state.high_watermark == 5
    assert state.last_stable_offset == 5  # = HW until transactions land
    state.add_size(300)
    state.replay_truncate_start(3, 100)
    assert (state.log_start_offset, state.size_bytes) == (3, 200)


@pytest.mark.parametrize(
    ("hw", "log_start", "first_unstable", "lso"),
    [
        (10, 0, None, 10),     # no transaction: the HW
        (10, 0, 4, 4),         # an open transaction from 4 holds it
        (10, 0, 10, 10),       # a transaction starting at the HW (not durable yet)
        (10, 0, 12, 10),       # never above the HW
        (10, 6, 4, 6),         # never below the log start (retention went past it)
    ],
)
def test_last_stable_offset(hw: int, log_start: int, first_unstable: int | None,
                            lso: int) -> None:
    assert last_stable_offset(high_watermark=hw, log_start_offset=log_start,
                              first_unstable_offset=first_unstable) == lso
    state = LogState("t-0", log_start_offset=log_start, log_end_offset=12, high_watermark=hw,
                     first_unstable_offset=first_unstable)
    assert state.last_stable_offset == lso


def test_invariants() -> None:
    state = LogState("t-0")
    state.replay_append(_header(0, 2, 1))
    with pytest.raises(InvariantViolation):
        state.replay_append(_header(5, 1, 1))   # gap in offsets
    with pytest.raises(InvariantViolation):
        state.mark_durable(3)                   # beyond LEO
    with pytest.raises(InvariantViolation):
        state.replay_truncate_start(1, 0)       # beyond HW
    # Recovery of a compacted log may skip dropped batches, never go back.
    state.replay_append(_header(5, 1, 1), recovering=True)
    assert state.log_end_offset == 6
    with pytest.raises(InvariantViolation):
        state.replay_append(_header(4, 1, 1), recovering=True)


NOW = 1_000_000


def _log(*specs: tuple[int, int]) -> list[BatchInfo]:
    """Batches of (record count, age in ms), 100 bytes each, from offset 0."""
    out = []
    offset = 0
    for count, age_ms in specs:
        out.append(BatchInfo(offset, offset + count, NOW - age_ms, 100))
        offset += count
    return out


def _plan(batches: list[BatchInfo], **kw: int | None) -> RetentionPlan:
    end = batches[-1].next_offset if batches else 0
    args: dict[str, int | None] = {
        "retention_ms": -1, "retention_bytes": -1, "high_watermark": end,
        "newest_snapshot_offset": end, "max_batches": 1000,
    }
    args.update(kw)
    return plan_retention(
        iter(batches), now_ms=NOW, log_start_offset=batches[0].base_offset if batches else 0,
        log_end_offset=end, size_bytes=100 * len(batches), **args,  # type: ignore[arg-type]
    )


OLD, NEW = 10_000, 10
FIVE = _log((2, OLD), (2, OLD), (2, OLD), (2, NEW), (2, NEW))  # offsets 0..10


@pytest.mark.parametrize(
    ("name", "batches", "kwargs", "start", "count", "needs_snapshot"),
    [
        ("no limits: nothing", FIVE, {}, 0, 0, False),
        ("by time: the three old batches", FIVE, {"retention_ms": 1_000}, 6, 3, False),
        ("by time: boundary is strict (age == retention keeps)", FIVE,
         {"retention_ms": OLD}, 0, 0, False),
        ("by time: stops at the first young batch", _log((1, OLD), (1, NEW), (1, OLD), (1, NEW)),
         {"retention_ms": 1_000}, 1, 1, False),
        ("by size: keep at least retention.bytes", FIVE, {"retention_bytes": 350}, 2, 1, False),
        ("by size: exact fit keeps", FIVE, {"retention_bytes": 300}, 4, 2, False),
        ("by size 0: all but the newest batch", FIVE, {"retention_bytes": 0}, 8, 4, False),
        ("never the newest batch", _log((2, OLD), (2, OLD)), {"retention_ms": 1}, 2, 1, False),
        ("never at or above the HW", FIVE, {"retention_ms": 1, "high_watermark": 4}, 4, 2, False),
        ("stops at the newest snapshot", FIVE, {"retention_ms": 1_000,
                                                "newest_snapshot_offset": 4}, 4, 2, True),
        ("no snapshot: nothing, but asks for one", FIVE, {"retention_ms": 1_000,
                                                          "newest_snapshot_offset": None},
         0, 0, True),
        ("bounded per run", FIVE, {"retention_ms": 1_000, "max_batches": 2}, 4, 2, False),
    ],
)
def test_plan_retention(
    name: str, batches: list[BatchInfo], kwargs: dict[str, int | None], start: int, count: int,
    needs_snapshot: bool,
) -> None:
    plan = _plan(batches, **kwargs)
    assert (plan.new_log_start_offset, plan.batch_count, plan.needs_snapshot) == (
        start, count, needs_snapshot
    )
    assert plan.deleted_bytes == 100 * count


def test_plan_reads_only_what_it_deletes_plus_one() -> None:
    consumed = []

    def batches() -> Iterator[BatchInfo]:
        for b in FIVE:
            consumed.append(b.base_offset)
            yield b

    plan = plan_retention(
        batches(), now_ms=NOW, retention_ms=1_000, retention_bytes=-1, log_start_offset=0,
        log_end_offset=10, high_watermark=10, size_bytes=500, newest_snapshot_offset=10,
        max_batches=100,
    )
    assert plan.batch_count == 3
    assert consumed == [0, 2, 4, 6]
