"""The transaction coordinator runtime on in-memory storage.

Method: a TxnCoordinatorRuntime over MemoryTxnLog (conditional appends, with
injectable failures) and FakeMarkerSender; drive init / add / commit / abort /
timeout / fencing, and check what the log holds, which markers were sent (with
which epochs; a next transaction's first request that arrives while the
markers are in flight carries the Complete* record in its own append), and
that a second runtime replaying the same log — a restarted
or replacement coordinator — ends in the same state and resumes unfinished
markers; and that verification answers only once a read of the log end
confirms that the runtime's memory is the log's state (a zombie's is not).
Transaction version 1: two transactions on one epoch, their markers naming
the version and rising decision timestamps; a zombie does not answer a
version-1 EndTxn from its stale memory of the last completion; KIP-360
recovery and its retry through the runtime. Group commit: concurrent
transactions share appends and replay to the same state; a lost batch fails
its requests retriably and the ones queued behind it are planned again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

import pytest

from oncelog.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.common.kernel.txn_fate import TxnFate
from services.common.metadata.cluster import ClusterLayout
from services.coordinator.core.hanging import StoreQuestion
from services.coordinator.core.transactions import TransactionVersion, TxnState
from services.coordinator.core.txn_log import TxnPartitionState, txn_key
from services.coordinator.markers import FakeMarkerSender, MarkerSpec
from services.coordinator.producer_id_manager import ProducerIdManager
from services.coordinator.storage.producer_id_log import MemoryProducerIdLog
from services.coordinator.storage.txn_log import Entry, MemoryTxnLog
from services.coordinator.txn_runtime import TxnConfig, TxnCoordinatorRuntime

LAYOUT = ClusterLayout(stores=("s0",), coordinators=("c0",), transaction_state_partitions=2)
TID = "copier-0"
T = TypeVar("T")


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def fresh() -> tuple[MemoryTxnLog, FakeMarkerSender, Clock, MemoryProducerIdLog]:
    return MemoryTxnLog(), FakeMarkerSender(), Clock(), MemoryProducerIdLog()


def make(log: MemoryTxnLog, markers: FakeMarkerSender, clock: Clock,
         ids: MemoryProducerIdLog) -> TxnCoordinatorRuntime:
    return TxnCoordinatorRuntime(
        layout=LAYOUT, node_id=0, txn_log=log, markers=markers,
        producer_ids=ProducerIdManager(ids, node_id=0, block_size=10), now_ms=clock,
        config=TxnConfig(check_interval_ms=10, max_transaction_timeout_ms=60_000),
    )


async def settle(runtime: TxnCoordinatorRuntime) -> None:
    """Lets background loads and marker tasks run to completion."""
    for _ in range(200):
        await asyncio.sleep(0)
        busy = any(not o.loaded or o.marker_tasks for o in runtime.partitions.values())
        if not busy:
            return
    await asyncio.sleep(0.05)


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(scenario())  # type: ignore[arg-type]


def test_commit_writes_markers_with_the_bumped_epoch_and_completes() -> None:
    async def scenario() -> None:
        log, markers, clock, ids = fresh()
        rt = make(log, markers, clock, ids)
        await rt.start()
        await settle(rt)
        pid, epoch, _ = await rt.init_producer_id(TID, 30_000)
        await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0), ("b", 1)}))
        new_pid, new_epoch = await rt.end_txn(TID, pid, epoch, commit=True)
        assert (new_pid, new_epoch) == (pid, epoch + 1)
        await settle(rt)
        sent = sorted(tp for _, tp in markers.written)
        assert sent == [("a", 0), ("b", 1)]
        assert all(spec.commit and spec.producer_epoch == epoch + 1 for spec, _ in markers.written)
        md, _ = rt.describe(TID)
        assert md is not None and md.state is TxnState.COMPLETE_COMMIT
        # Retried EndTxn(commit) after a lost reply: same answer, nothing new.
        assert await rt.end_txn(TID, pid, epoch, commit=True) == (pid, epoch + 1)
        with pytest.raises(ServiceError) as err:
            await rt.end_txn(TID, pid, epoch, commit=False)
        assert err.value.code is ErrorCode.INVALID_TXN_STATE
        await rt.stop()

    run(scenario)


def test_restart_after_prepare_resumes_markers_and_completes() -> None:
    async def scenario() -> None:
        log, clock, ids = MemoryTxnLog(), Clock(), MemoryProducerIdLog()
        first_markers = FakeMarkerSender()
        first_markers.outcomes[("a", 0)] = [ErrorCode.NETWORK_EXCEPTION] * 1000
        rt = make(log, first_markers, clock, ids)
        await rt.start()
        await settle(rt)
        pid, epoch, _ = await rt.init_producer_id(TID, 30_000)
        await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        await rt.end_txn(TID, pid, epoch, commit=False)
        await asyncio.sleep(0.05)
        await rt.stop()  # the coordinator dies with the marker not yet written

        second_markers = FakeMarkerSender()
        rt2 = make(log, second_markers, clock, ids)
        await rt2.start()
        await settle(rt2)
        assert [(s.commit, s.producer_epoch, tp) for s, tp in second_markers.written] == [
            (False, epoch + 1, ("a", 0))
        ]
        md, coordinator_epoch = rt2.describe(TID)
        assert md is not None and md.state is TxnState.COMPLETE_ABORT
        assert coordinator_epoch == 1  # the takeover bumped it
        assert second_markers.written[0][0].coordinator_epoch == 1
        await rt2.stop()

    run(scenario)


def test_new_instance_fences_and_aborts_the_open_transaction() -> None:
    async def scenario() -> None:
        log, markers, clock, ids = fresh()
        rt = make(log, markers, clock, ids)
        await rt.start()
        await settle(rt)
        pid, epoch, _ = await rt.init_producer_id(TID, 30_000)
        await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        with pytest.raises(ServiceError) as err:
            await rt.init_producer_id(TID, 30_000)
        assert err.value.code is ErrorCode.CONCURRENT_TRANSACTIONS
        await settle(rt)
        new_pid, new_epoch, _ = await rt.init_producer_id(TID, 30_000)
        assert new_pid == pid and new_epoch == epoch + 2
        assert [(s.commit, tp) for s, tp in markers.written] == [(False, ("a", 0))]
        for call in (
            rt.add_partitions(TID, pid, epoch, frozenset({("a", 1)})),
            rt.end_txn(TID, pid, epoch, commit=True),
        ):
            with pytest.raises(ServiceError) as err:
                await call
            assert err.value.code is ErrorCode.PRODUCER_FENCED
        await rt.stop()

    run(scenario)


def test_timeout_aborts_and_fences() -> None:
    async def scenario() -> None:
        log, markers, clock, ids = fresh()
        rt = make(log, markers, clock, ids)
        await rt.start()
        await settle(rt)
        pid, epoch, _ = await rt.init_producer_id(TID, 5_000)
        await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        clock.now_ms += 5_000
        await asyncio.sleep(0.05)
        await settle(rt)
        md, _ = rt.describe(TID)
        assert md is not None and md.state is TxnState.COMPLETE_ABORT
        with pytest.raises(ServiceError) as err:
            await rt.end_txn(TID, pid, epoch, commit=True)
        assert err.value.code is ErrorCode.PRODUCER_FENCED
        await rt.stop()

    run(scenario)


def test_lost_reply_of_a_log_write_reloads_and_stays_consistent() -> None:
    async def scenario() -> None:
        log, markers, clock, ids = fresh()
        rt = make(log, markers, clock, ids)
        await rt.start()
        await settle(rt)
        pid, epoch, _ = await rt.init_producer_id(TID, 30_000)
        # The AddPartitions record lands, but its reply is lost.
        log.fail_next.append((ServiceError(ErrorCode.NETWORK_EXCEPTION, "lost"), True))
        with pytest.raises(ServiceError) as err:
            await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        assert err.value.code.retriable
        await settle(rt)
        # The client retries: the partition is already in the transaction.
        await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        md, _ = rt.describe(TID)
        assert md is not None and md.partitions == frozenset({("a", 0)})
        await rt.stop()

    run(scenario)


def test_a_newer_coordinator_fences_the_old_one() -> None:
    async def scenario() -> None:
        log, markers, clock, ids = fresh()
        old = make(log, markers, clock, ids)
        await old.start()
        await settle(old)
        pid, epoch, _ = await old.init_producer_id(TID, 30_000)
        new = make(log, markers, clock, ids)
        await new.start()
        await settle(new)
        with pytest.raises(ServiceError) as err:
            await old.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        assert err.value.code is ErrorCode.NOT_COORDINATOR
        await settle(old)
        assert all(o.fenced for o in old.partitions.values() if o.my_epoch >= 0 and
                   o.partition == LAYOUT.transaction_state_partition(TID))
        with pytest.raises(ServiceError) as err:
            await old.init_producer_id(TID, 30_000)
        assert err.value.code is ErrorCode.NOT_COORDINATOR
        await new.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        await old.stop()
        await new.stop()

    run(scenario)


async def committed_with_markers_delayed(
        log: MemoryTxnLog, markers: FakeMarkerSender, clock: Clock,
        ids: MemoryProducerIdLog) -> tuple[TxnCoordinatorRuntime, int, int]:
    """A started runtime whose TID just committed a transaction on a-0, its
    marker failing three times before it lands; the new producer id and epoch."""
    rt = make(log, markers, clock, ids)
    await rt.start()
    await settle(rt)
    pid, epoch, _ = await rt.init_producer_id(TID, 30_000)
    await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
    markers.outcomes[("a", 0)] = [ErrorCode.NETWORK_EXCEPTION] * 3
    pid, epoch = await rt.end_txn(TID, pid, epoch, commit=True)
    return rt, pid, epoch


def test_next_transaction_waits_for_markers_instead_of_failing() -> None:
    async def scenario() -> None:
        # The marker fails a few times before it lands (store restarting).
        log, markers, clock, ids = fresh()
        rt, pid, epoch = await committed_with_markers_delayed(log, markers, clock, ids)
        # The next transaction's first AddPartitions is held until the
        # markers landed, then succeeds: no CONCURRENT_TRANSACTIONS round trip.
        await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        md, _ = rt.describe(TID)
        assert md is not None and md.state is TxnState.ONGOING
        assert [tp for _, tp in markers.written] == [("a", 0)]
        await rt.stop()

    run(scenario)


class AppendRecordingLog(MemoryTxnLog):
    """MemoryTxnLog that keeps each append's records together."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[list[Entry]] = []

    async def append(self, partition: int, entries: Sequence[Entry], *,
                     expected_log_end_offset: int) -> int:
        log_end = await super().append(partition, entries,
                                       expected_log_end_offset=expected_log_end_offset)
        self.appends.append(list(entries))
        return log_end


def states_of(entries: Sequence[Entry]) -> list[TxnState]:
    """The state each of TID's records holds, in order."""
    out = []
    for key, value in entries:
        if key == txn_key(TID):
            replayed = TxnPartitionState()
            replayed.replay(key, value)
            out.append(replayed.transactions[TID].state)
    return out


def test_the_next_transaction_carries_the_completion_in_its_own_append() -> None:
    """AddPartitions arriving while the markers are in flight waits for them to
    land, then appends CompleteCommit and Ongoing together: one append where
    there were two, and the log reads as if they had been written apart."""
    async def scenario() -> None:
        log, markers, clock, ids = AppendRecordingLog(), FakeMarkerSender(), Clock(), \
            MemoryProducerIdLog()
        rt, pid, epoch = await committed_with_markers_delayed(log, markers, clock, ids)
        appends_before = len(log.appends)
        await rt.add_partitions(TID, pid, epoch, frozenset({("b", 0)}))
        await settle(rt)
        assert [states_of(a) for a in log.appends[appends_before:]] == [
            [TxnState.COMPLETE_COMMIT, TxnState.ONGOING]]
        md, _ = rt.describe(TID)
        assert md is not None and md.state is TxnState.ONGOING
        assert md.partitions == frozenset({("b", 0)})
        assert [tp for _, tp in markers.written] == [("a", 0)]
        await rt.stop()
        # A coordinator replaying the log ends in the same state, with no
        # marker to resend.
        markers_after = FakeMarkerSender()
        replayed = make(log, markers_after, clock, ids)
        await replayed.start()
        await settle(replayed)
        again, _ = replayed.describe(TID)
        assert again == md
        assert markers_after.written == []
        await replayed.stop()

    run(scenario)


def test_a_refused_request_leaves_the_completion_to_the_marker_task() -> None:
    """A request for the id that waited for the markers and is then refused
    (a stale epoch) writes nothing; the marker task persists CompleteCommit."""
    async def scenario() -> None:
        log, markers, clock, ids = AppendRecordingLog(), FakeMarkerSender(), Clock(), \
            MemoryProducerIdLog()
        rt, pid, stale_epoch = await committed_with_markers_delayed(log, markers, clock, ids)
        stale_epoch -= 1  # the epoch before the commit bumped it
        appends_before = len(log.appends)
        with pytest.raises(ServiceError) as refused:
            await rt.add_partitions(TID, pid, stale_epoch, frozenset({("b", 0)}))
        assert refused.value.code is ErrorCode.PRODUCER_FENCED
        await settle(rt)
        assert [states_of(a) for a in log.appends[appends_before:]] == [
            [TxnState.COMPLETE_COMMIT]]
        md, _ = rt.describe(TID)
        assert md is not None and md.state is TxnState.COMPLETE_COMMIT
        await rt.stop()

    run(scenario)


class CountingTxnLog(MemoryTxnLog):
    """MemoryTxnLog that counts log-end reads and can hold an append after it
    landed (its answer still on the way)."""

    def __init__(self) -> None:
        super().__init__()
        self.log_end_reads = 0
        self.hold_reads: asyncio.Event | None = None
        self.hold_after_landing: asyncio.Event | None = None

    async def log_end_offset(self, partition: int) -> int:
        self.log_end_reads += 1
        if self.hold_reads is not None:
            await self.hold_reads.wait()
        return await super().log_end_offset(partition)

    async def append(self, partition: int, entries: Sequence[Entry], *,
                     expected_log_end_offset: int) -> int:
        log_end = await super().append(partition, entries,
                                       expected_log_end_offset=expected_log_end_offset)
        if self.hold_after_landing is not None:
            await self.hold_after_landing.wait()
        return log_end


async def open_transaction(log: MemoryTxnLog, partitions: Sequence[tuple[str, int]]
                           ) -> tuple[TxnCoordinatorRuntime, int, int]:
    """A started runtime over `log` with TID's transaction open on `partitions`."""
    rt = make(log, FakeMarkerSender(), Clock(), MemoryProducerIdLog())
    await rt.start()
    await settle(rt)
    pid, epoch, _ = await rt.init_producer_id(TID, 30_000)
    await rt.add_partitions(TID, pid, epoch, frozenset(partitions))
    return rt, pid, epoch


def test_a_zombie_refuses_to_verify_after_a_newer_coordinator_wrote() -> None:
    """The zombie has not written since the takeover, so nothing has fenced it
    yet; its memory still says the partition is in the open transaction."""
    async def scenario() -> None:
        log = MemoryTxnLog()
        zombie, pid, epoch = await open_transaction(log, [("a", 0)])
        verdicts = await zombie.verify_partitions(TID, pid, epoch, [("a", 0)])
        assert verdicts == {("a", 0): None}
        successor = make(log, FakeMarkerSender(), Clock(), MemoryProducerIdLog())
        await successor.start()
        await settle(successor)
        with pytest.raises(ServiceError) as err:
            await zombie.verify_partitions(TID, pid, epoch, [("a", 0)])
        assert err.value.code is ErrorCode.NOT_COORDINATOR
        await settle(zombie)
        partition = LAYOUT.transaction_state_partition(TID)
        assert zombie.partitions[partition].fenced
        # The successor answers from the same log.
        assert await successor.verify_partitions(TID, pid, epoch, [("a", 0)]) == \
            {("a", 0): None}
        await zombie.stop()
        await successor.stop()

    run(scenario)


def test_a_zombie_does_not_refuse_from_stale_memory() -> None:
    """A refusal is final for a client (PRODUCER_FENCED is fatal, an
    INVALID_TXN_STATE on a completion makes the outside coordinator give up):
    a zombie whose memory is behind must answer NOT_COORDINATOR instead."""
    async def scenario() -> None:
        log = MemoryTxnLog()
        zombie, pid, epoch = await open_transaction(log, [("a", 0)])
        successor = make(log, FakeMarkerSender(), Clock(), MemoryProducerIdLog())
        await successor.start()
        await settle(successor)
        # A new producer instance, through the successor (which first aborts
        # the open transaction: CONCURRENT_TRANSACTIONS, then the epoch).
        with pytest.raises(ServiceError) as err:
            await successor.init_producer_id(TID, 30_000)
        assert err.value.code is ErrorCode.CONCURRENT_TRANSACTIONS
        await settle(successor)
        _, new_epoch, _ = await successor.init_producer_id(TID, 30_000)
        assert new_epoch > epoch
        # Stale routing: it reaches the zombie, whose memory has epoch `epoch`.
        with pytest.raises(ServiceError) as err:
            await zombie.add_partitions(TID, pid, new_epoch, frozenset({("b", 0)}))
        assert err.value.code is ErrorCode.NOT_COORDINATOR
        await settle(zombie)
        assert zombie.partitions[LAYOUT.transaction_state_partition(TID)].fenced
        await zombie.stop()
        await successor.stop()

    run(scenario)


def test_concurrent_verifications_share_one_log_end_read() -> None:
    async def scenario() -> None:
        log = CountingTxnLog()
        parts = [("a", p) for p in range(20)]
        rt, pid, epoch = await open_transaction(log, parts)
        log.hold_reads = asyncio.Event()
        first = asyncio.ensure_future(rt.verify_partitions(TID, pid, epoch, parts[:1]))
        while log.log_end_reads == 0:
            await asyncio.sleep(0)
        # The others arrive while the first one's read is out: that read may
        # have been answered before they came, so they share the next one.
        rest = [asyncio.ensure_future(rt.verify_partitions(TID, pid, epoch, [tp]))
                for tp in parts[1:]]
        await asyncio.sleep(0.01)
        assert not first.done() and not any(f.done() for f in rest)
        log.hold_reads.set()
        answers = [await f for f in [first, *rest]]
        assert answers == [{tp: None} for tp in parts]
        assert log.log_end_reads == 2
        await rt.stop()

    run(scenario)


def test_own_write_in_flight_is_not_mistaken_for_another_coordinator() -> None:
    async def scenario() -> None:
        log = CountingTxnLog()
        rt, pid, epoch = await open_transaction(log, [("a", 0)])
        # Another id's write lands in the same log partition; its answer is held.
        other = next(t for t in (f"other-{i}" for i in range(100))
                     if LAYOUT.transaction_state_partition(t)
                     == LAYOUT.transaction_state_partition(TID))
        log.hold_after_landing = asyncio.Event()
        init_other = asyncio.ensure_future(rt.init_producer_id(other, 30_000))
        await asyncio.sleep(0.01)
        verify = asyncio.ensure_future(rt.verify_partitions(TID, pid, epoch, [("a", 0)]))
        await asyncio.sleep(0.01)
        assert not verify.done()  # the log is ahead of memory: it waits for the write
        log.hold_after_landing.set()
        await init_other
        assert await verify == {("a", 0): None}
        partition = LAYOUT.transaction_state_partition(TID)
        assert rt.partitions[partition].loaded and not rt.partitions[partition].fenced
        await rt.stop()

    run(scenario)


def test_prepared_transaction_survives_a_restart_and_no_timeout_ends_it() -> None:
    """Two-phase commit: prepared under one coordinator process, never aborted
    by the timer (long past its timeout), kept by a new producer instance
    under the next process, and committed there with markers above the
    data's epoch."""
    async def scenario() -> None:
        log, clock, ids = MemoryTxnLog(), Clock(), MemoryProducerIdLog()
        first = make(log, FakeMarkerSender(), clock, ids)
        await first.start()
        await settle(first)
        pid, epoch, _ = await first.init_producer_id(TID, 5_000, two_phase_commit=True)
        await first.add_partitions(TID, pid, epoch, frozenset({("a", 0), ("b", 1)}))
        for state in (TxnState.ONGOING, TxnState.PREPARED):
            if state is TxnState.PREPARED:
                assert await first.prepare(TID, pid, epoch) == (pid, epoch)
            clock.now_ms += 3_600_000
            await asyncio.sleep(0.05)  # the timer runs every 10 ms
            md, _ = first.describe(TID)
            assert md is not None and md.state is state
        await first.stop()

        markers = FakeMarkerSender()
        second = make(log, markers, clock, ids)
        await second.start()
        await settle(second)
        await asyncio.sleep(0.05)
        new_pid, new_epoch, kept = await second.init_producer_id(
            TID, 5_000, two_phase_commit=True, keep_prepared_txn=True)
        assert (new_pid, new_epoch, kept) == (pid, epoch + 1, (pid, epoch))
        assert markers.written == []
        committed, next_pid, next_epoch = await second.complete_prepared(
            TID, new_pid, new_epoch, (pid, epoch))
        assert (committed, next_pid, next_epoch) == (True, pid, epoch + 2)
        await settle(second)
        assert sorted((s.commit, s.producer_id, s.producer_epoch, tp)
                      for s, tp in markers.written) == [
            (True, pid, epoch + 2, ("a", 0)), (True, pid, epoch + 2, ("b", 1))]
        md, _ = second.describe(TID)
        assert md is not None and md.state is TxnState.COMPLETE_COMMIT
        # Completing the same prepared state again changes nothing.
        assert await second.complete_prepared(TID, pid, epoch + 2, (pid, epoch)) == \
            (True, pid, epoch + 2)
        assert len(markers.written) == 2
        await second.stop()

    run(scenario)


def test_two_phase_commit_can_be_refused_by_configuration() -> None:
    async def scenario() -> None:
        log, markers, clock, ids = fresh()
        rt = TxnCoordinatorRuntime(
            layout=LAYOUT, node_id=0, txn_log=log, markers=markers,
            producer_ids=ProducerIdManager(ids, node_id=0, block_size=10), now_ms=clock,
            config=TxnConfig(allow_two_phase_commit=False),
        )
        await rt.start()
        await settle(rt)
        with pytest.raises(ServiceError) as err:
            await rt.init_producer_id(TID, 5_000, two_phase_commit=True)
        assert err.value.code is ErrorCode.INVALID_REQUEST
        assert "--allow-two-phase-commit" in err.value.message
        await rt.init_producer_id(TID, 5_000)  # without two-phase commit: fine
        await rt.stop()

    run(scenario)


def test_the_two_phase_commit_flag_defaults_on_and_turns_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from services.coordinator.server import parse_args

    assert parse_args([]).allow_two_phase_commit is True
    assert parse_args(["--no-allow-two-phase-commit"]).allow_two_phase_commit is False
    monkeypatch.setenv("ONCELOG_ALLOW_TWO_PHASE_COMMIT", "false")
    assert parse_args([]).allow_two_phase_commit is False
    assert parse_args(["--allow-two-phase-commit"]).allow_two_phase_commit is True


V1 = TransactionVersion.V1


def test_version_1_keeps_the_epoch_across_transactions_and_stamps_markers() -> None:
    async def scenario() -> None:
        log, markers, clock, ids = fresh()
        rt = make(log, markers, clock, ids)
        await rt.start()
        await settle(rt)
        pid, epoch, _ = await rt.init_producer_id(TID, 30_000, transaction_version=V1)
        await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        assert await rt.end_txn(TID, pid, epoch, commit=True) == (pid, epoch)
        await settle(rt)
        first_ts = clock.now_ms
        clock.now_ms -= 10  # a clock step back must not reorder the markers
        await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0), ("b", 0)}))
        assert await rt.end_txn(TID, pid, epoch, commit=False) == (pid, epoch)
        await settle(rt)
        sent = [(s.commit, s.producer_epoch, s.transaction_version, s.timestamp_ms, tp)
                for s, tp in markers.written]
        assert sorted(sent) == sorted([
            (True, epoch, V1, first_ts, ("a", 0)),
            (False, epoch, V1, first_ts + 1, ("a", 0)),
            (False, epoch, V1, first_ts + 1, ("b", 0)),
        ])
        md, _ = rt.describe(TID)
        assert md is not None and md.state is TxnState.COMPLETE_ABORT
        assert (md.producer_id, md.producer_epoch) == (pid, epoch)
        # A retried abort succeeds with the same ids; a commit is refused.
        assert await rt.end_txn(TID, pid, epoch, commit=False) == (pid, epoch)
        with pytest.raises(ServiceError) as err:
            await rt.end_txn(TID, pid, epoch, commit=True)
        assert err.value.code is ErrorCode.INVALID_TXN_STATE
        # A restarted coordinator reads the same version from the log.
        await rt.stop()
        again = make(log, FakeMarkerSender(), clock, ids)
        await again.start()
        await settle(again)
        md, _ = again.describe(TID)
        assert md is not None and md.transaction_version is V1
        await again.stop()

    run(scenario)


def test_a_zombie_does_not_acknowledge_a_version_1_commit_from_stale_memory() -> None:
    """The zombie remembers the last transaction as completed; the log has
    since opened the next one at the same epoch. Answering the next
    transaction's EndTxn(commit) with the last one's success would
    acknowledge a commit nobody makes."""
    async def scenario() -> None:
        log = MemoryTxnLog()
        zombie = make(log, FakeMarkerSender(), Clock(), MemoryProducerIdLog())
        await zombie.start()
        await settle(zombie)
        pid, epoch, _ = await zombie.init_producer_id(TID, 30_000, transaction_version=V1)
        await zombie.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        await zombie.end_txn(TID, pid, epoch, commit=True)
        await settle(zombie)
        successor = make(log, FakeMarkerSender(), Clock(), MemoryProducerIdLog())
        await successor.start()
        await settle(successor)
        await successor.add_partitions(TID, pid, epoch, frozenset({("b", 0)}))
        with pytest.raises(ServiceError) as err:
            await zombie.end_txn(TID, pid, epoch, commit=True)
        assert err.value.code is ErrorCode.NOT_COORDINATOR
        assert await successor.end_txn(TID, pid, epoch, commit=True) == (pid, epoch)
        await zombie.stop()
        await successor.stop()

    run(scenario)


def test_kip_360_recovery_and_its_retry_through_the_runtime() -> None:
    async def scenario() -> None:
        log, markers, clock, ids = fresh()
        rt = make(log, markers, clock, ids)
        await rt.start()
        await settle(rt)
        pid, epoch, _ = await rt.init_producer_id(TID, 30_000, transaction_version=V1)
        await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        await rt.end_txn(TID, pid, epoch, commit=False)
        recovered = await rt.init_producer_id(TID, 30_000, transaction_version=V1,
                                              expected=(pid, epoch))
        assert recovered == (pid, epoch + 1, None)
        # The answer was lost; the retry gets the same ids.
        assert await rt.init_producer_id(TID, 30_000, transaction_version=V1,
                                         expected=(pid, epoch)) == (pid, epoch + 1, None)
        # A late copy during the next transaction writes nothing.
        await rt.add_partitions(TID, pid, epoch + 1, frozenset({("a", 0)}))
        end_before = await log.log_end_offset(LAYOUT.transaction_state_partition(TID))
        assert await rt.init_producer_id(TID, 30_000, transaction_version=V1,
                                         expected=(pid, epoch)) == (pid, epoch + 1, None)
        assert await log.log_end_offset(LAYOUT.transaction_state_partition(TID)) == end_before
        md, _ = rt.describe(TID)
        assert md is not None and md.state is TxnState.ONGOING
        with pytest.raises(ServiceError) as err:
            await rt.init_producer_id(TID, 30_000, transaction_version=V1,
                                      expected=(pid, epoch + 5))
        assert err.value.code is ErrorCode.PRODUCER_FENCED
        await rt.stop()

    run(scenario)


class BatchCountingTxnLog(MemoryTxnLog):
    """MemoryTxnLog that records the size of each append and yields once
    inside it, as a store round trip would, so that changes queue meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.append_sizes: list[int] = []

    async def append(self, partition: int, entries: Sequence[Entry], *,
                     expected_log_end_offset: int) -> int:
        self.append_sizes.append(len(entries))
        await asyncio.sleep(0.001)
        return await super().append(partition, entries,
                                    expected_log_end_offset=expected_log_end_offset)


def same_partition_ids(count: int) -> list[str]:
    partition = LAYOUT.transaction_state_partition(TID)
    return [t for t in (f"batched-{i}" for i in range(10 * count))
            if LAYOUT.transaction_state_partition(t) == partition][:count]


def test_concurrent_transactions_share_appends_and_replay_to_the_same_state() -> None:
    """Twenty ids on one partition run a transaction each at once: their
    changes go out in fewer appends than changes (group commit), every one
    succeeds, and a coordinator that replays the log ends in the same state."""
    async def scenario() -> None:
        log, markers, clock, ids = BatchCountingTxnLog(), FakeMarkerSender(), Clock(), \
            MemoryProducerIdLog()
        rt = make(log, markers, clock, ids)
        await rt.start()
        await settle(rt)
        tids = same_partition_ids(20)

        async def one(i: int, tid: str) -> tuple[int, int]:
            pid, epoch, _ = await rt.init_producer_id(tid, 30_000)
            await rt.add_partitions(tid, pid, epoch, frozenset({("a", i)}))
            return await rt.end_txn(tid, pid, epoch, commit=True)

        log.append_sizes.clear()
        bumped = await asyncio.gather(*(one(i, t) for i, t in enumerate(tids)))
        await settle(rt)
        changes = sum(log.append_sizes)  # one record per change here
        assert changes >= 3 * len(tids) and len(log.append_sizes) < changes
        assert max(log.append_sizes) > 1
        assert sorted(tp for _, tp in markers.written) == [("a", i) for i in range(len(tids))]
        replayed = make(log, FakeMarkerSender(), clock, ids)
        await replayed.start()
        await settle(replayed)
        for tid, (pid, epoch) in zip(tids, bumped, strict=True):
            md, _ = rt.describe(tid)
            assert md is not None and md.state is TxnState.COMPLETE_COMMIT
            assert (md.producer_id, md.producer_epoch) == (pid, epoch)
            assert replayed.describe(tid)[0] == md
        await rt.stop()
        await replayed.stop()

    run(scenario)


def test_a_failed_batch_fails_its_requests_and_the_ones_behind_are_planned_again() -> None:
    """The batch in flight is lost (its records do not land): its request
    fails retriably and the partition reloads; the requests queued behind it,
    planned on its pending state, are planned again and answered from what
    the log holds (retriably while the partition loads), never from the lost
    change. Retried, every one succeeds."""
    async def scenario() -> None:
        log, markers, clock, ids = BatchCountingTxnLog(), FakeMarkerSender(), Clock(), \
            MemoryProducerIdLog()
        rt = make(log, markers, clock, ids)
        await rt.start()
        await settle(rt)
        tids = same_partition_ids(5)
        opened = [await rt.init_producer_id(tid, 30_000) for tid in tids]
        log.fail_next.append((ServiceError(ErrorCode.NETWORK_EXCEPTION, "lost"), False))
        results = await asyncio.gather(*(
            rt.add_partitions(tid, pid, epoch, frozenset({("a", 0)}))
            for tid, (pid, epoch, _) in zip(tids, opened, strict=True)), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        assert failed and all(isinstance(r, ServiceError) and r.code.retriable for r in failed)
        await settle(rt)
        for tid, (pid, epoch, _) in zip(tids, opened, strict=True):
            await rt.add_partitions(tid, pid, epoch, frozenset({("a", 0)}))
            md, _ = rt.describe(tid)
            assert md is not None and md.state is TxnState.ONGOING
            assert md.partitions == frozenset({("a", 0)})
        await rt.stop()

    run(scenario)


class GatedTxnLog(MemoryTxnLog):
    """MemoryTxnLog whose appends wait at a gate while it is closed, as
    appends do while a store cannot acknowledge (a full disk, an ISR being
    rebuilt): the changes submitted meanwhile queue for one later append."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def append(self, partition: int, entries: Sequence[Entry], *,
                     expected_log_end_offset: int) -> int:
        await self.gate.wait()
        return await super().append(partition, entries,
                                    expected_log_end_offset=expected_log_end_offset)


class GatedMarkerSender(FakeMarkerSender):
    """FakeMarkerSender whose writes wait at a gate while it is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def write(self, spec: MarkerSpec, partitions: Iterable[tuple[str, int]],
                    ) -> dict[tuple[str, int], ErrorCode]:
        await self.gate.wait()
        return await super().write(spec, partitions)


def test_a_decision_durable_in_the_same_append_as_the_previous_completion_gets_its_markers(
) -> None:
    """The soak's copier once stalled for minutes: its transaction stayed
    PrepareCommit, and no marker was sent until the coordinator restarted.
    The previous transaction's Complete* record, the next transaction's add
    and its EndTxn's PrepareCommit became durable in one append (they queued
    behind a slow one, and EndTxn had given up waiting for the old marker
    task). The old task ended in the same loop turn as EndTxn resumed, and
    its entry was still registered when EndTxn started the new decision's
    markers, so none were started. The new decision must get its markers."""
    async def scenario() -> None:
        log, markers, clock, ids = GatedTxnLog(), GatedMarkerSender(), Clock(), \
            MemoryProducerIdLog()
        rt = TxnCoordinatorRuntime(
            layout=LAYOUT, node_id=0, txn_log=log, markers=markers,
            producer_ids=ProducerIdManager(ids, node_id=0, block_size=10), now_ms=clock,
            config=TxnConfig(check_interval_ms=10, max_transaction_timeout_ms=60_000,
                             wait_for_markers_ms=20),
        )
        await rt.start()
        await settle(rt)
        other = same_partition_ids(1)[0]
        pid, epoch, _ = await rt.init_producer_id(TID, 30_000)
        await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        markers.gate.clear()
        _, next_epoch = await rt.end_txn(TID, pid, epoch, commit=True)
        # A slow append of another id's change is in flight when the marker
        # task, its markers landed, submits Complete*: that record queues.
        log.gate.clear()
        blocker = asyncio.ensure_future(rt.init_producer_id(other, 30_000))
        await asyncio.sleep(0.01)
        markers.gate.set()
        await asyncio.sleep(0.01)
        # The next transaction's add and its EndTxn (which gives up waiting
        # for the old marker task) queue behind it too.
        add = asyncio.ensure_future(
            rt.add_partitions(TID, pid, next_epoch, frozenset({("a", 0)})))
        await asyncio.sleep(0.01)
        end = asyncio.ensure_future(rt.end_txn(TID, pid, next_epoch, commit=True))
        await asyncio.sleep(0.05)
        log.gate.set()
        await asyncio.wait_for(asyncio.gather(blocker, add, end), 2)
        for _ in range(100):
            await asyncio.sleep(0.01)
            md, _ = rt.describe(TID)
            if md is not None and md.state is TxnState.COMPLETE_COMMIT and \
                    md.producer_epoch > next_epoch:
                break
        sent_epochs = sorted({spec.producer_epoch for spec, tp in markers.written
                              if spec.transactional_id == TID})
        assert sent_epochs == [next_epoch, next_epoch + 1], (
            f"markers sent with epochs {sent_epochs}; the second decision's are missing")
        md, _ = rt.describe(TID)
        assert md is not None and md.state is TxnState.COMPLETE_COMMIT
        await rt.stop()

    run(scenario)


def test_a_store_asking_about_a_decided_transaction_with_no_marker_task_gets_its_markers(
) -> None:
    """The safety net behind the test above: whatever left a decided
    transaction without a marker task, the store holding it open asks past
    its timeout, and the coordinator starts the markers instead of saying
    "on its way" for ever."""
    async def scenario() -> None:
        log, markers, clock, ids = MemoryTxnLog(), GatedMarkerSender(), Clock(), \
            MemoryProducerIdLog()
        rt = make(log, markers, clock, ids)
        await rt.start()
        await settle(rt)
        pid, epoch, _ = await rt.init_producer_id(TID, 30_000)
        await rt.add_partitions(TID, pid, epoch, frozenset({("a", 0)}))
        markers.gate.clear()
        await rt.end_txn(TID, pid, epoch, commit=True)
        owned = rt.partitions[LAYOUT.transaction_state_partition(TID)]
        # The task is lost (what the bug above did): cancelled, and gone.
        for task in owned.marker_tasks.values():
            task.cancel()
        owned.marker_tasks.clear()
        owned.markers_landed.clear()
        markers.gate.set()
        await asyncio.sleep(0.05)
        assert markers.written == []
        answers = await rt.resolve_transaction(StoreQuestion(pid, epoch, ("a", 0)))
        answer = answers[LAYOUT.transaction_state_partition(TID)]
        assert not isinstance(answer, ServiceError) and answer.fate is TxnFate.DECIDED_COMMIT
        await settle(rt)
        assert [(spec.producer_epoch, tp) for spec, tp in markers.written] == [
            (epoch + 1, ("a", 0))]
        md, _ = rt.describe(TID)
        assert md is not None and md.state is TxnState.COMPLETE_COMMIT
        await rt.stop()

    run(scenario)
