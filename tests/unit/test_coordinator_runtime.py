"""The shared coordinator runtime (services/common/coordinator_runtime.py)
with a toy shard.

Goal: pin the machinery both coordinators take from the runtime, apart from
either coordinator's rules: loading claims a coordinator epoch; a write whose
outcome is uncertain triggers a reload from the log; a lost ownership (the log
end moved) is found before an answer from memory, and ends with the partition
fenced; a refused write changes nothing; replay is the only way a shard
changes (a live shard equals one rebuilt from the log); a log others write is
caught up instead of reloaded.

Method: a toy shard (a dict of key -> value, plus the coordinator epoch) on
an in-memory log with the stores' conditional-append semantics and hooks
that make an append fail before or after its records land, or be refused
whole. Two runtimes on one log stand for a zombie and its replacement.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from oncelog.errors import ErrorCode
from services.common.coordinator_epoch import EPOCH_KEY, decode_epoch
from services.common.coordinator_runtime import (
    CoordinatorRuntime,
    LogBatch,
    LogEntry,
    LogRead,
    OwnedPartition,
    WriteRefused,
)
from services.common.service_error import ServiceError

PARTITION = 0


@dataclass
class ToyShard:
    coordinator_epoch: int = -1
    values: dict[bytes, bytes | None] = field(default_factory=dict)
    replayed: int = 0

    def replay(self, record: LogEntry) -> None:
        self.replayed += 1
        key, value = record
        if key == EPOCH_KEY:
            assert value is not None
            self.coordinator_epoch, _node = decode_epoch(value)
            return
        assert key is not None
        self.values[key] = value


class ToyLog:
    """One partition's records in memory; appends are conditional."""

    def __init__(self) -> None:
        self.records: list[LogEntry] = []
        # The next appends fail: (error, whether the records land first).
        self.fail_next: list[tuple[ServiceError, bool]] = []
        self.refuse_next: list[ServiceError] = []
        self.log_end_reads = 0

    async def read(self, partition: int, from_offset: int, *,
                   max_wait_ms: int = 0) -> LogRead[LogEntry]:
        await asyncio.sleep(0)
        batches = [LogBatch(i + 1, [r]) for i, r in enumerate(self.records) if i >= from_offset]
        return LogRead(batches, len(self.records), len(self.records))

    async def append(self, partition: int, entries: Sequence[LogEntry], *,
                     expected_log_end_offset: int, writer: None) -> LogBatch[LogEntry]:
        await asyncio.sleep(0)
        if expected_log_end_offset != len(self.records):
            raise ServiceError(ErrorCode.LOG_END_OFFSET_MISMATCH,
                               f"ends at {len(self.records)}, not {expected_log_end_offset}")
        if self.refuse_next:
            raise WriteRefused(self.refuse_next.pop(0))
        if self.fail_next:
            error, landed = self.fail_next.pop(0)
            if landed:
                self.records.extend(entries)
            raise error
        self.records.extend(entries)
        return LogBatch(len(self.records), list(entries))

    async def log_end_offset(self, partition: int) -> int:
        self.log_end_reads += 1
        await asyncio.sleep(0)
        return len(self.records)


ToyRuntime = CoordinatorRuntime[OwnedPartition[ToyShard], ToyShard, LogEntry, None]


def toy_runtime(log: ToyLog, *, node_id: int = 0, others_write: bool = False) -> ToyRuntime:
    return CoordinatorRuntime(
        topic="__toy", node_id=node_id, kind="toy coordinator", partitions=[PARTITION],
        log=log, new_partition=lambda p: OwnedPartition(p, ToyShard()), new_shard=ToyShard,
        replay=ToyShard.replay, others_write=others_write, tail_wait_ms=10,
    )


async def loaded(rt: ToyRuntime) -> OwnedPartition[ToyShard]:
    owned = rt.partitions[PARTITION]
    for _ in range(200):
        if owned.loaded or owned.fenced:
            return owned
        await asyncio.sleep(0.005)
    raise AssertionError("the partition did not load")


async def write(rt: ToyRuntime, key: bytes, value: bytes) -> None:
    owned = rt.owned(PARTITION, f"key {key!r}")
    async with owned.lock:
        rt.check_loaded(owned)
        await rt.append(owned, [(key, value)])


def run(coro_fn):  # type: ignore[no-untyped-def]
    asyncio.run(coro_fn())


def test_load_replays_the_log_and_claims_the_next_coordinator_epoch() -> None:
    async def main() -> None:
        log = ToyLog()
        first = toy_runtime(log)
        first.start()
        await loaded(first)
        await write(first, b"k", b"1")
        await first.stop()
        second = toy_runtime(log, node_id=1)
        second.start()
        owned = await loaded(second)
        assert owned.my_epoch == 1 and owned.state.values == {b"k": b"1"}
        assert owned.log_end_offset == len(log.records) == 3
        await second.stop()

    run(main)


def test_an_uncertain_write_reloads_from_the_log() -> None:
    """A lost reply: the record landed but the runtime was told it failed.
    Memory may be behind the log, so the partition reloads, and the reload
    (not the failed write) brings the record into memory."""
    async def main() -> None:
        log = ToyLog()
        rt = toy_runtime(log)
        rt.start()
        owned = await loaded(rt)
        log.fail_next.append((ServiceError(ErrorCode.REQUEST_TIMED_OUT, "lost"), True))
        with pytest.raises(ServiceError) as err:
            await write(rt, b"k", b"1")
        assert err.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert not owned.loaded and b"k" not in owned.state.values
        with pytest.raises(ServiceError) as err:
            rt.owned(PARTITION, "key")
        assert err.value.code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        owned = await loaded(rt)
        assert owned.state.values == {b"k": b"1"} and not owned.fenced
        assert owned.my_epoch == 0  # a reload keeps the epoch this process claimed
        await write(rt, b"k", b"2")  # and the partition takes writes again
        assert owned.state.values == {b"k": b"2"}
        await rt.stop()

    run(main)


def test_a_lost_ownership_is_found_before_an_answer_from_memory() -> None:
    """A zombie: replaced while paused, it has written nothing since, so only
    the log end tells it. confirm_ownership refuses, and the reload that
    follows finds the newer coordinator epoch: fenced for good."""
    async def main() -> None:
        log = ToyLog()
        zombie = toy_runtime(log)
        zombie.start()
        owned = await loaded(zombie)
        await zombie.confirm_ownership(owned)  # nobody else has written: confirmed
        replacement = toy_runtime(log, node_id=1)
        replacement.start()
        await loaded(replacement)
        with pytest.raises(ServiceError) as err:
            await zombie.confirm_ownership(owned)
        assert err.value.code is ErrorCode.NOT_COORDINATOR
        owned = await loaded(zombie)
        assert owned.fenced and not owned.loaded
        with pytest.raises(ServiceError) as err:
            zombie.owned(PARTITION, "key")
        assert err.value.code is ErrorCode.NOT_COORDINATOR
        await zombie.stop()
        await replacement.stop()

    run(main)


def test_concurrent_confirmations_share_one_read_of_the_log_end() -> None:
    async def main() -> None:
        log = ToyLog()
        rt = toy_runtime(log)
        rt.start()
        owned = await loaded(rt)
        before = log.log_end_reads
        await asyncio.gather(*(rt.confirm_ownership(owned) for _ in range(10)))
        assert log.log_end_reads - before <= 2
        await rt.stop()

    run(main)


def test_a_zombie_write_fails_and_the_reload_fences_it() -> None:
    async def main() -> None:
        log = ToyLog()
        zombie = toy_runtime(log)
        zombie.start()
        await loaded(zombie)
        replacement = toy_runtime(log, node_id=1)
        replacement.start()
        await loaded(replacement)
        with pytest.raises(ServiceError) as err:
            await write(zombie, b"k", b"zombie")
        assert err.value.code is ErrorCode.NOT_COORDINATOR
        owned = await loaded(zombie)
        assert owned.fenced
        assert (b"k", b"zombie") not in log.records
        await zombie.stop()
        await replacement.stop()

    run(main)


def test_a_refused_write_changes_nothing_and_does_not_reload() -> None:
    async def main() -> None:
        log = ToyLog()
        rt = toy_runtime(log)
        rt.start()
        owned = await loaded(rt)
        await write(rt, b"k", b"1")
        state_before, end_before = dict(owned.state.values), owned.log_end_offset
        log.refuse_next.append(ServiceError(ErrorCode.MESSAGE_TOO_LARGE, "too large"))
        with pytest.raises(ServiceError) as err:
            await write(rt, b"k", b"2")
        assert err.value.code is ErrorCode.MESSAGE_TOO_LARGE
        assert owned.loaded and owned.state.values == state_before
        assert owned.log_end_offset == end_before == len(log.records)
        await rt.stop()

    run(main)


def test_replay_is_the_only_way_a_shard_changes() -> None:
    """Every change reaches memory through replay of what the log holds: the
    live shard equals one rebuilt from the log by a fresh load, and every
    record the log holds was replayed once."""
    async def main() -> None:
        log = ToyLog()
        rt = toy_runtime(log)
        rt.start()
        owned = await loaded(rt)
        for i in range(5):
            await write(rt, f"k{i % 2}".encode(), str(i).encode())
        assert owned.state.replayed == len(log.records)
        await rt.stop()
        rebuilt = toy_runtime(log, node_id=1)
        rebuilt.start()
        fresh = await loaded(rebuilt)
        assert fresh.state.values == owned.state.values
        await rebuilt.stop()

    run(main)


def test_a_log_others_write_is_caught_up_not_reloaded() -> None:
    """With others_write (markers on __consumer_offsets), a moved log end is
    read and replayed, and the write goes through; without it (only this
    coordinator writes), the same moved log end means another coordinator."""
    async def main() -> None:
        for others_write in (True, False):
            log = ToyLog()
            rt = toy_runtime(log, others_write=others_write)
            rt.start()
            owned = await loaded(rt)
            log.records.append((b"marker", b"from another writer"))
            if others_write:
                await write(rt, b"k", b"1")
                assert owned.loaded and owned.state.values == {
                    b"marker": b"from another writer", b"k": b"1"}
                assert owned.log_end_offset == len(log.records)
            else:
                with pytest.raises(ServiceError) as err:
                    await write(rt, b"k", b"1")
                assert err.value.code is ErrorCode.NOT_COORDINATOR
                assert not owned.loaded
            await rt.stop()

    run(main)
