"""The shared coordinator runtime (services/common/shards/runtime.py)
with a toy shard.

Goal: pin the machinery both coordinators take from the runtime, apart from
either coordinator's rules: loading claims a coordinator epoch; a write whose
outcome is uncertain triggers a reload from the log; a lost ownership (the log
end moved) is found before an answer from memory, and ends with the partition
fenced; a refused write changes nothing; replay is the only way a shard
changes (a live shard equals one rebuilt from the log); a log others write is
caught up instead of reloaded. Group commit: changes submitted while an
append is in flight go out together as the next append, in the order they
were submitted, each answered once its batch is durable and replayed; a plan
sees the changes submitted before it (pending state), an answer planned from
pending state waits until what it saw is durable; a batch the store refuses
fails exactly its changes and rolls the pending state back (the changes
queued behind it, planned on that state, are told to plan again); a batch
whose outcome is unknown reloads the partition; a check of the log end waits
for the changes in flight instead of taking them for another coordinator.
Following leadership (a coordinator in every store): nothing is owned until
the store leads the partition; leading it loads it with a newer coordinator
epoch, which fences the previous owner; losing it lets it go at once (its
pending changes fail, requests answer NOT_COORDINATOR); leading it again,
or at a new leader epoch, loads it afresh; the same epoch again changes
nothing.

Method: a toy shard (a dict of key -> value, plus the coordinator epoch) on
an in-memory log with the stores' conditional-append semantics and hooks
that make an append fail before or after its records land, or be refused
whole. Two runtimes on one log stand for a zombie and its replacement. For
group commit, a gated log whose appends wait for the test to let each one
through (and say how: land, be refused, land with the reply lost, or land
and hold the reply), so that what is in flight and what is queued is known.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from oncelog.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.common.shards.coordinator_epoch import EPOCH_KEY, decode_epoch
from services.common.shards.runtime import (
    CoordinatorRuntime,
    LogBatch,
    LogEntry,
    LogRead,
    OwnedPartition,
    StalePlan,
    WriteRefused,
)

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


def copy_shard(shard: ToyShard) -> ToyShard:
    return ToyShard(shard.coordinator_epoch, dict(shard.values), shard.replayed)


def toy_runtime(log: ToyLog, *, node_id: int = 0, others_write: bool = False,
                group_commit: bool = False, max_batch_bytes: int = 1 << 20,
                follow_leaders: bool = False) -> ToyRuntime:
    return CoordinatorRuntime(
        topic="__toy", node_id=node_id, kind="toy coordinator", partitions=[PARTITION],
        log=log, new_partition=lambda p: OwnedPartition(p, ToyShard()), new_shard=ToyShard,
        replay=ToyShard.replay, others_write=others_write, tail_wait_ms=10,
        copy_shard=copy_shard if group_commit else None,
        replay_entry=ToyShard.replay if group_commit else None,
        max_batch_bytes=max_batch_bytes, follow_leaders=follow_leaders,
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


class BehindLog(ToyLog):
    """A ToyLog whose next `behind_reads` reads answer as a leader whose
    high watermark is behind (rebuilt after a full disk): nothing, at a high
    watermark of 0."""

    def __init__(self) -> None:
        super().__init__()
        self.behind_reads = 0

    async def read(self, partition: int, from_offset: int, *,
                   max_wait_ms: int = 0) -> LogRead[LogEntry]:
        if self.behind_reads:
            self.behind_reads -= 1
            await asyncio.sleep(0)
            return LogRead([], 0, 0)
        return await super().read(partition, from_offset, max_wait_ms=max_wait_ms)


def test_a_reload_that_reads_a_log_behind_its_own_epoch_retries_instead_of_fencing() -> None:
    """Found by the mixed-fault soak: after a write's outcome was uncertain
    the partition reloads, and the store that leads its log had just been
    rebuilt after a full disk, so its first reads showed none of the log;
    the coordinator took the missing epoch record (-1) for a newer owner and
    fenced itself for good, leaving transactions in PrepareCommit. Only a
    higher epoch fences; a lower one is a read behind, retried."""
    async def main() -> None:
        log = BehindLog()
        rt = toy_runtime(log)
        rt.start()
        owned = await loaded(rt)
        await write(rt, b"k", b"1")
        log.fail_next.append((ServiceError(ErrorCode.REQUEST_TIMED_OUT, "lost"), True))
        log.behind_reads = 2
        with pytest.raises(ServiceError):
            await write(rt, b"k", b"2")
        for _ in range(400):
            if owned.loaded or owned.fenced:
                break
            await asyncio.sleep(0.005)
        assert not owned.fenced, "a read behind the log fenced the coordinator"
        assert owned.loaded and log.behind_reads == 0
        assert owned.my_epoch == 0 and owned.state.values == {b"k": b"2"}
        await write(rt, b"k", b"3")
        assert owned.state.values == {b"k": b"3"}
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


# ------------------------------------------------------------ group commit


class GatedLog(ToyLog):
    """A ToyLog whose appends, once `gated`, each wait for the test to say
    how it goes: "land" (as usual), "refuse" (refused whole, nothing
    written), "lost" (the records land, the reply is lost), or "hold" (the
    records land, the reply waits for `replies`)."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = False
        self.gates: asyncio.Queue[str] = asyncio.Queue()
        self.replies: asyncio.Queue[None] = asyncio.Queue()
        self.appends: list[list[LogEntry]] = []

    async def append(self, partition: int, entries: Sequence[LogEntry], *,
                     expected_log_end_offset: int, writer: None) -> LogBatch[LogEntry]:
        if not self.gated:
            return await super().append(partition, entries,
                                        expected_log_end_offset=expected_log_end_offset,
                                        writer=writer)
        self.appends.append(list(entries))
        how = await self.gates.get()
        if how == "refuse":
            self.refuse_next.append(ServiceError(ErrorCode.MESSAGE_TOO_LARGE, "too large"))
        elif how == "lost":
            self.fail_next.append((ServiceError(ErrorCode.REQUEST_TIMED_OUT, "lost"), True))
        written = await super().append(partition, entries,
                                       expected_log_end_offset=expected_log_end_offset,
                                       writer=writer)
        if how == "hold":
            await self.replies.get()
        return written


async def gated_runtime() -> tuple[GatedLog, ToyRuntime, OwnedPartition[ToyShard]]:
    log = GatedLog()
    rt = toy_runtime(log, group_commit=True)
    rt.start()
    owned = await loaded(rt)
    log.gated = True
    return log, rt, owned


async def submit_increment(rt: ToyRuntime, key: bytes) -> asyncio.Future[None]:
    """A change planned on the pending state: key's counter plus one."""
    owned = rt.owned(PARTITION, f"key {key!r}")
    async with owned.lock:
        view = rt.view(owned)
        now = int(view.state.values.get(key) or b"0")
        return rt.submit(owned, [(key, str(now + 1).encode())], view)


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the condition did not come true")


def outcome(done: asyncio.Future[None]) -> ErrorCode | None:
    """None for a change that succeeded, else the error code it got."""
    error = done.exception()
    if error is None:
        return None
    if not isinstance(error, ServiceError):
        raise error
    return error.code


def test_changes_submitted_while_an_append_flies_go_out_as_one_batch() -> None:
    """The first change goes out at once; the three submitted while it flies
    wait for it and go out together, in order, each planned on the ones
    before (pending state) and answered only once replayed into the shard."""
    async def main() -> None:
        log, rt, owned = await gated_runtime()
        first = await submit_increment(rt, b"n")
        await until(lambda: len(log.appends) == 1)
        rest = [await submit_increment(rt, b"n") for _ in range(3)]
        # Planned on pending state: the counter counts every submitted change,
        # while the shard (what answers from memory read) has none of them.
        assert rt.view(owned).state.values[b"n"] == b"4"
        assert b"n" not in owned.state.values
        answered_with: list[bytes | None] = []
        for done in (first, *rest):
            done.add_done_callback(lambda _f: answered_with.append(owned.state.values.get(b"n")))
        log.gates.put_nowait("land")
        await first
        assert owned.state.values[b"n"] == b"1" and not any(d.done() for d in rest)
        log.gates.put_nowait("land")
        await asyncio.gather(*rest)
        assert log.appends == [[(b"n", b"1")], [(b"n", b"2"), (b"n", b"3"), (b"n", b"4")]]
        assert log.records[1:] == [(b"n", str(i).encode()) for i in range(1, 5)]
        # Each caller answered after its batch was replayed, never before.
        assert answered_with == [b"1", b"4", b"4", b"4"]
        assert owned.pending_state is None and owned.log_end_offset == len(log.records)
        await rt.stop()

    run(main)


def test_order_is_kept_across_concurrent_submitters_and_batches() -> None:
    async def main() -> None:
        log, rt, owned = await gated_runtime()
        log.gated = False  # appends land at once; batches form while they fly

        async def one(i: int) -> None:
            for _ in range(i % 3):
                await asyncio.sleep(0)
            await (await submit_increment(rt, b"n"))

        await asyncio.gather(*(one(i) for i in range(30)))
        assert [v for k, v in log.records if k == b"n"] == [
            str(i).encode() for i in range(1, 31)]
        assert owned.state.values[b"n"] == b"30"
        await rt.stop()

    run(main)


def test_a_batch_is_bounded_in_bytes() -> None:
    async def main() -> None:
        log = GatedLog()
        rt = toy_runtime(log, group_commit=True, max_batch_bytes=210)
        rt.start()
        await loaded(rt)
        log.gated = True
        dones = [await submit_increment(rt, f"k{i}".encode()) for i in range(6)]
        for _ in range(6):
            log.gates.put_nowait("land")
        await asyncio.gather(*dones)
        # 64 bytes of allowance plus key and value (3 bytes) per record: three
        # fit in 210 bytes, a fourth would not.
        assert [len(a) for a in log.appends] == [3, 3]
        assert [k for a in log.appends for k, _ in a] == [f"k{i}".encode() for i in range(6)]
        await rt.stop()

    run(main)


def test_a_refused_batch_fails_only_its_changes_and_rolls_back_pending_state() -> None:
    """Batch 1 lands; batch 2 is refused whole: its two changes get the
    store's error, the change queued behind it (planned on them) is told to
    plan again, the pending state is the durable one again, and the
    partition stays loaded; a change planned now lands on batch 1's state."""
    async def main() -> None:
        log, rt, owned = await gated_runtime()
        c1 = await submit_increment(rt, b"n")
        await until(lambda: len(log.appends) == 1)
        c2, c3 = await submit_increment(rt, b"n"), await submit_increment(rt, b"m")
        log.gates.put_nowait("land")
        await c1
        await until(lambda: len(log.appends) == 2)
        c4 = await submit_increment(rt, b"n")
        assert rt.view(owned).state.values == {b"n": b"3", b"m": b"1"}
        log.gates.put_nowait("refuse")
        await asyncio.wait([c2, c3, c4])
        assert [outcome(c) for c in (c2, c3)] == [ErrorCode.MESSAGE_TOO_LARGE] * 2
        assert isinstance(c4.exception(), StalePlan)
        assert owned.loaded and owned.state.values == {b"n": b"1"}
        assert rt.view(owned).state.values == {b"n": b"1"}
        c5 = await submit_increment(rt, b"n")
        log.gates.put_nowait("land")
        await c5
        assert log.records[1:] == [(b"n", b"1"), (b"n", b"2")]
        assert owned.state.values == {b"n": b"2"}
        await rt.stop()

    run(main)


def test_a_plan_made_before_a_rollback_cannot_be_submitted() -> None:
    async def main() -> None:
        log, rt, owned = await gated_runtime()
        c1 = await submit_increment(rt, b"n")
        await until(lambda: len(log.appends) == 1)
        async with owned.lock:
            stale = rt.view(owned)  # sees c1
        log.gates.put_nowait("refuse")
        with pytest.raises(ServiceError):
            await c1
        async with owned.lock:
            with pytest.raises(StalePlan):
                rt.submit(owned, [(b"n", b"2")], stale)
        await rt.stop()

    run(main)


def test_an_answer_planned_on_pending_state_waits_until_it_is_durable() -> None:
    """No write of its own, but it saw a change in flight: it is given once
    that change is durable, and never if that change failed."""
    async def main() -> None:
        log, rt, owned = await gated_runtime()
        c1 = await submit_increment(rt, b"n")
        await until(lambda: len(log.appends) == 1)
        async with owned.lock:
            view = rt.view(owned)
        assert view.state.values[b"n"] == b"1"
        answer = asyncio.ensure_future(rt.settle(owned, view))
        await asyncio.sleep(0.01)
        assert not answer.done()
        log.gates.put_nowait("land")
        await answer
        assert c1.done() and owned.state.values[b"n"] == b"1"

        c2 = await submit_increment(rt, b"n")
        await until(lambda: len(log.appends) == 2)
        async with owned.lock:
            view = rt.view(owned)
        log.gates.put_nowait("refuse")
        with pytest.raises(StalePlan):
            await rt.settle(owned, view)
        assert outcome(c2) is ErrorCode.MESSAGE_TOO_LARGE
        await rt.stop()

    run(main)


def test_a_batch_whose_outcome_is_unknown_reloads_and_fails_what_is_pending() -> None:
    async def main() -> None:
        log, rt, owned = await gated_runtime()
        c1 = await submit_increment(rt, b"n")
        await until(lambda: len(log.appends) == 1)
        c2 = await submit_increment(rt, b"n")
        log.gates.put_nowait("lost")
        await asyncio.wait([c1, c2])
        assert outcome(c1) is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert isinstance(c2.exception(), StalePlan)
        log.gated = False
        owned = await loaded(rt)
        # The reload, not the failed batch, brings the landed record in.
        assert owned.state.values == {b"n": b"1"} and owned.pending_state is None
        await (await submit_increment(rt, b"n"))
        assert owned.state.values == {b"n": b"2"}
        await rt.stop()

    run(main)


def test_a_log_end_check_waits_for_our_batch_in_flight() -> None:
    """The batch has landed but its reply has not come back: the log ends
    past memory. A check of the log end (lock held) waits for the batch
    instead of taking it for another coordinator's write."""
    async def main() -> None:
        log, rt, owned = await gated_runtime()
        c1 = await submit_increment(rt, b"n")
        log.gates.put_nowait("hold")
        await until(lambda: len(log.records) == 2)

        async def check() -> None:
            async with owned.lock:
                await rt.check_log_end_locked(owned)

        checking = asyncio.ensure_future(check())
        await asyncio.sleep(0.01)
        assert not checking.done()
        log.replies.put_nowait(None)
        await checking
        await c1
        assert owned.loaded and not owned.fenced
        await rt.stop()

    run(main)


def test_stopping_fails_the_changes_still_pending() -> None:
    async def main() -> None:
        log, rt, owned = await gated_runtime()
        c1 = await submit_increment(rt, b"n")
        await until(lambda: len(log.appends) == 1)
        c2 = await submit_increment(rt, b"n")
        await rt.stop()
        assert outcome(c1) is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert outcome(c2) is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert owned.pending_state is None

    run(main)


# ------------------------------------------------------ following leaders


def test_a_coordinator_that_follows_leadership_owns_what_its_store_leads() -> None:
    async def main() -> None:
        log = ToyLog()
        here = toy_runtime(log, follow_leaders=True)
        there = toy_runtime(log, node_id=1, follow_leaders=True)
        here.start()
        there.start()
        with pytest.raises(ServiceError) as err:
            here.owned(PARTITION, "key b'k'")
        assert err.value.code is ErrorCode.NOT_COORDINATOR
        assert log.records == []  # nothing loads before its store leads
        assert not here.assigned(PARTITION)

        here.follow(PARTITION, leads=True, leader_epoch=3)
        assert here.assigned(PARTITION)
        owned_here = await loaded(here)
        assert owned_here.loaded and owned_here.my_epoch == 0
        await write(here, b"k", b"1")
        # The same leader epoch again: nothing to do (no reload).
        here.follow(PARTITION, leads=True, leader_epoch=3)
        assert here.partitions[PARTITION] is owned_here and owned_here.loaded

        # Leadership moves: this one lets go at once, the other takes over
        # with a newer coordinator epoch and the records so far.
        here.follow(PARTITION, leads=False, leader_epoch=4)
        assert not here.assigned(PARTITION)
        with pytest.raises(ServiceError) as err:
            await write(here, b"k", b"stale")
        assert err.value.code is ErrorCode.NOT_COORDINATOR
        there.follow(PARTITION, leads=True, leader_epoch=4)
        owned_there = await loaded(there)
        assert owned_there.my_epoch == 1 and owned_there.state.values == {b"k": b"1"}
        await write(there, b"k", b"2")

        # And back, at a newer leader epoch: a fresh load, another claim.
        there.follow(PARTITION, leads=False, leader_epoch=5)
        here.follow(PARTITION, leads=True, leader_epoch=5)
        owned_again = await loaded(here)
        assert owned_again is not owned_here
        assert owned_again.my_epoch == 2 and owned_again.state.values == {b"k": b"2"}
        assert (b"k", b"stale") not in log.records
        await here.stop()
        await there.stop()

    run(main)


def test_a_new_leader_epoch_with_the_same_leader_loads_afresh() -> None:
    """Another store may have led the partition, and written to it, between
    two states this store saw itself lead in: its memory may be behind."""
    async def main() -> None:
        log = ToyLog()
        here = toy_runtime(log, follow_leaders=True)
        here.start()
        here.follow(PARTITION, leads=True, leader_epoch=1)
        first = await loaded(here)
        # Written by an owner this store never heard of (it led at epoch 2).
        log.records.append((b"k", b"theirs"))
        here.follow(PARTITION, leads=True, leader_epoch=3)
        second = await loaded(here)
        assert second is not first and first.fenced
        assert second.state.values == {b"k": b"theirs"}
        await here.stop()

    run(main)


def test_letting_go_fails_the_changes_pending_and_a_layout_runtime_ignores_follow() -> None:
    async def main() -> None:
        log = GatedLog()
        rt = toy_runtime(log, group_commit=True, follow_leaders=True)
        rt.start()
        rt.follow(PARTITION, leads=True, leader_epoch=1)
        owned = await loaded(rt)
        log.gated = True
        in_flight = await submit_increment(rt, b"n")
        await until(lambda: len(log.appends) == 1)
        queued = await submit_increment(rt, b"n")
        rt.follow(PARTITION, leads=False, leader_epoch=2)
        log.gates.put_nowait("land")
        await asyncio.wait([in_flight, queued])
        assert outcome(in_flight) is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert outcome(queued) is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert owned.fenced and not owned.loaded
        await rt.stop()

        static = toy_runtime(ToyLog())
        static.start()
        owned = await loaded(static)
        static.follow(PARTITION, leads=False, leader_epoch=9)
        assert static.partitions[PARTITION] is owned and owned.loaded
        await static.stop()

    run(main)


class HeldLog(ToyLog):
    """A ToyLog whose reads wait until `opened` is set: a load that has not
    finished."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = asyncio.Event()

    async def read(self, partition: int, from_offset: int, *,
                   max_wait_ms: int = 0) -> LogRead[LogEntry]:
        await self.opened.wait()
        return await super().read(partition, from_offset, max_wait_ms=max_wait_ms)


def test_a_listing_while_a_partition_loads_is_refused_not_silently_partial() -> None:
    """Kafka's ListTransactions and ListGroups answer COORDINATOR_LOAD_IN_PROGRESS
    while a partition loads; a listing without that partition's entries would
    look whole to a caller looking for hanging transactions."""
    async def main() -> None:
        log = HeldLog()
        rt = toy_runtime(log)
        rt.start()
        await asyncio.sleep(0.01)
        assert rt.loading() == [PARTITION]
        assert list(rt.serving()) == []  # what a listing used to walk: nothing
        with pytest.raises(ServiceError) as err:
            rt.serving_whole("ListTransactions")
        assert err.value.code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert "ListTransactions" in str(err.value) and f"{PARTITION}" in str(err.value)

        log.opened.set()
        owned = await loaded(rt)
        assert rt.loading() == []
        assert rt.serving_whole("ListTransactions") == [owned]
        await rt.stop()

        # Following leadership, a partition its store does not lead is not
        # this coordinator's: it is not loading, and the listing is whole.
        follower = toy_runtime(ToyLog(), follow_leaders=True)
        follower.start()
        assert follower.loading() == [] and follower.serving_whole("ListGroups") == []
        await follower.stop()

    run(main)
