"""Transactions on the partition store runtime, on real RocksDB, in process.

Goal: the store's side of transactions (DESIGN.md §3-§4, transaction
version 2) holds end to end below gRPC:
* committed transactions become visible to read_committed, aborted ones never
  do, across partitions and with producers interleaved; read_uncommitted sees
  all data and no markers;
* an open transaction holds the LSO (and read_committed long-polls) and hides
  later committed records of other producers until its marker is durable;
* a producer's first transactional write to a partition is verified with the
  coordinator (one question per request), refused with the coordinator's code
  when it says no (the log unchanged), retriable when it cannot be reached;
  the producer's pipelined batches wait behind the verification and keep
  their order, while other producers go on; a producer is not expired while
  its verification is out (a marker landing meanwhile fences the batch);
* with add_partitions_to_txn the question asks the coordinator to add the
  partitions (once per transaction and partition), and the producer's next
  transaction may start before the previous one's marker lands: its first
  batch waits for the coordinator instead of being refused, and is appended
  after the marker (never inside the old transaction);
* zombie-coordinator and delayed markers are refused and change nothing;
  identical retries answer with the original offset;
* transaction version 1: a producer keeps its epoch and its sequences across
  transactions, each first write to a partition is verified again, markers
  at the data's epoch end each transaction, and a delayed marker of an
  earlier transaction is told apart by its decision timestamp, also after a
  kill-style restart that replays the control batches;
* the per-partition gauges (LSO, HW - LSO, open transactions, oldest open
  transaction's age) and the markers-written counter follow;
* after a kill-style restart (no shutdown snapshot), also from a corrupt newest
  snapshot or with no usable snapshot, the LSO, the aborted index, the
  producer table and what each isolation level reads are exactly as before.

Method: StoreRuntime over RocksStore in tmp_path, driven with asyncio.run;
the coordinator is the InMemoryTxnVerifier fake (its `hold()` keeps a
verification pending while the test acts). "Crash" is
close(take_snapshots=False), as in test_store_runtime.py. Time is an injected
clock that does not move, so recovered entries compare equal field by field.
Nothing depends on timing: waits are on futures, with generous safety
timeouts only to fail instead of hanging.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import Gauge

from oncelog.errors import ErrorCode
from oncelog.records import (
    MARKER_ABORT,
    MARKER_COMMIT,
    encode_batch,
    iter_records,
    read_header,
)
from services.common.metadata.cluster import ClusterLayout
from services.partition_store import metrics
from services.partition_store.api import (
    FetchItem,
    FetchOutcome,
    MarkerItem,
    MarkerOutcome,
    OffsetQuery,
    ProduceItem,
    ProduceOutcome,
    TopicSpec,
)
from services.partition_store.core.producer_state import ProducerEntry
from services.partition_store.core.topics import decode_topic_record
from services.partition_store.core.txn_index import AbortedTxn
from services.partition_store.log.partition import Isolation
from services.partition_store.log.reads import LATEST_TIMESTAMP
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.storage import keys
from services.partition_store.storage.port import WriteGroup
from services.partition_store.storage.rocksdb import RocksStore
from services.partition_store.transactions.verifier import InMemoryTxnVerifier

LAYOUT = ClusterLayout(stores=("127.0.0.1:1",))
NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000
SAFETY_TIMEOUT_S = 30.0
COMMITTED = Isolation.READ_COMMITTED
UNCOMMITTED = Isolation.READ_UNCOMMITTED


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())  # type: ignore[arg-type]


async def _open(path: Path, verifier: InMemoryTxnVerifier, **overrides: object) -> StoreRuntime:
    config: dict[str, object] = {
        "node_id": 0, "layout": LAYOUT, "snapshot_interval_batches": 4,
        "snapshot_interval_ms": 10 * HOUR_MS, "retention_check_interval_ms": 10 * HOUR_MS,
    }
    config.update(overrides)
    runtime = StoreRuntime(
        RocksStore(path), StoreConfig(**config),  # type: ignore[arg-type]
        txn_verifier=verifier, clock_ms=lambda: NOW_MS,
    )
    await runtime.start()
    return runtime


async def create(rt: StoreRuntime, *names: str) -> None:
    outcomes = await rt.create_topics([TopicSpec(n, 1) for n in names], validate_only=False)
    assert all(o.error is None for o in outcomes), outcomes


@dataclass
class Producer:
    """A producer id with its epoch and per-partition sequences."""

    pid: int
    tid: str = ""
    epoch: int = 0

    def __post_init__(self) -> None:
        self.seqs: dict[str, int] = {}

    def batch(self, topic: str, *values: str, txn: bool = True) -> bytes:
        seq = self.seqs.get(topic, 0)
        self.seqs[topic] = seq + len(values)
        return encode_batch(
            [(b"k", v.encode(), None, NOW_MS) for v in values], producer_id=self.pid,
            producer_epoch=self.epoch, base_sequence=seq, transactional=txn,
        )

    def bump(self) -> None:
        """EndTxn (transaction version 2): the next transaction runs at the
        marker's epoch, sequences from 0."""
        self.epoch += 1
        self.seqs.clear()


async def send(rt: StoreRuntime, producer: Producer, *writes: tuple[str, bytes],
               add: bool = False) -> list[ProduceOutcome]:
    return await rt.produce(
        [ProduceItem(topic, 0, data) for topic, data in writes],
        transactional_id=producer.tid, add_partitions_to_txn=add,
    )


async def send_ok(rt: StoreRuntime, producer: Producer, topic: str, *values: str,
                  txn: bool = True) -> int:
    [out] = await send(rt, producer, (topic, producer.batch(topic, *values, txn=txn)))
    assert out.error is None, out.error
    return out.base_offset


async def end_txn(rt: StoreRuntime, producer: Producer, marker_type: int, *topics: str,
                  coordinator_epoch: int = 0, epoch: int | None = None) -> list[MarkerOutcome]:
    """Writes the markers of the producer's transaction (epoch + 1 unless told)."""
    return await rt.write_txn_markers([MarkerItem(
        producer_id=producer.pid,
        producer_epoch=producer.epoch + 1 if epoch is None else epoch,
        control_type=marker_type, coordinator_epoch=coordinator_epoch,
        partitions=tuple((t, 0) for t in topics), transactional_id=producer.tid,
    )])


async def end_ok(rt: StoreRuntime, producer: Producer, marker_type: int, *topics: str,
                 verifier: InMemoryTxnVerifier | None = None, coordinator_epoch: int = 0,
                 ) -> list[int]:
    if verifier is not None:
        verifier.end(producer.tid)
    outcomes = await end_txn(rt, producer, marker_type, *topics,
                             coordinator_epoch=coordinator_epoch)
    assert all(o.error is None for o in outcomes), outcomes
    producer.bump()
    return [o.offset for o in outcomes]


async def read(rt: StoreRuntime, topic: str, isolation: Isolation, *,
               max_bytes: int = 0) -> tuple[list[str], int]:
    """Every record value a consumer loop reads from the log start, and where
    it ends (it must be the isolation level's bound)."""
    offset = rt.partition(topic, 0).log.log_start_offset
    values: list[str] = []
    while True:
        [out] = await rt.fetch([FetchItem(topic, 0, offset, max_bytes)], isolation=isolation)
        assert out.error is None, out.error
        for data in out.batches:
            header = read_header(data)
            assert not header.is_control
            values.extend((r.value or b"").decode() for r in iter_records(data, min_offset=offset))
        if out.next_fetch_offset == offset:
            bound = out.last_stable_offset if isolation is COMMITTED else out.high_watermark
            assert offset == bound
            return values, offset
        assert out.next_fetch_offset <= (
            out.last_stable_offset if isolation is COMMITTED else out.high_watermark
        )
        offset = out.next_fetch_offset


async def latest(rt: StoreRuntime, topic: str, isolation: Isolation) -> int:
    [out] = await rt.list_offsets([OffsetQuery(topic, 0, LATEST_TIMESTAMP)],
                                  isolation=isolation)
    assert out.error is None
    return out.offset


def _gauge(gauge: Gauge, topic: str) -> float:
    return float(gauge.labels(topic, "0")._value.get())


def _verifier_with(*txns: tuple[Producer, tuple[str, ...]]) -> InMemoryTxnVerifier:
    verifier = InMemoryTxnVerifier()
    for producer, topics in txns:
        verifier.begin(producer.tid, producer.pid, producer.epoch, [(t, 0) for t in topics])
    return verifier


# ------------------------------------------------------------ commit / abort


def test_commit_and_abort_across_partitions(tmp_path: Path) -> None:
    t1 = Producer(10, "app-t1")
    t2 = Producer(20, "app-t2")
    plain = Producer(30)
    verifier = _verifier_with((t1, ("a", "b")), (t2, ("a", "b")))

    async def body() -> None:
        rt = await _open(tmp_path / "db", verifier)
        await create(rt, "a", "b")
        # One request opening two partitions: one question to the coordinator.
        outs = await send(rt, t1, ("a", t1.batch("a", "t1-a1")), ("b", t1.batch("b", "t1-b1")))
        assert [o.error for o in outs] == [None, None]
        assert len(verifier.calls) == 1
        assert set(verifier.calls[0].partitions) == {("a", 0), ("b", 0)}
        assert verifier.calls[0].transactional_id == "app-t1"
        await send_ok(rt, t2, "a", "t2-a1")
        await send_ok(rt, plain, "a", "plain-1", txn=False)
        await send_ok(rt, t2, "b", "t2-b1", "t2-b2")
        await send_ok(rt, t1, "a", "t1-a2")
        assert len(verifier.calls) == 3       # later batches of open transactions: none
        part_a = rt.partition("a", 0)
        assert part_a.log.last_stable_offset == 0
        assert part_a.producers.open_txn_count == 2
        assert _gauge(metrics.OPEN_TRANSACTIONS, "a") == 2
        assert _gauge(metrics.LAST_STABLE_OFFSET, "a") == 0
        assert _gauge(metrics.UNSTABLE_OFFSETS, "a") == 4
        part_a.update_txn_age(NOW_MS + 2_500)
        assert _gauge(metrics.OLDEST_OPEN_TXN_AGE_SECONDS, "a") == 2.5
        commits_before = metrics.TXN_MARKERS_WRITTEN.labels("a", "commit")._value.get()

        commit_offsets = await end_ok(rt, t1, MARKER_COMMIT, "a", "b", verifier=verifier,
                                      coordinator_epoch=3)
        await end_ok(rt, t2, MARKER_ABORT, "a", "b", verifier=verifier, coordinator_epoch=3)
        await send_ok(rt, plain, "a", "plain-2", txn=False)

        # a: t1-a1 0, t2-a1 1, plain-1 2, t1-a2 3, COMMIT 4, ABORT 5, plain-2 6.
        assert await read(rt, "a", COMMITTED) == (["t1-a1", "plain-1", "t1-a2", "plain-2"], 7)
        assert await read(rt, "a", UNCOMMITTED) == (
            ["t1-a1", "t2-a1", "plain-1", "t1-a2", "plain-2"], 7
        )
        assert await read(rt, "b", COMMITTED) == (["t1-b1"], 5)
        assert await read(rt, "b", UNCOMMITTED) == (["t1-b1", "t2-b1", "t2-b2"], 5)
        # Small budgets: the loop still reads the same, past every filtered batch.
        assert await read(rt, "a", COMMITTED, max_bytes=1) == (
            ["t1-a1", "plain-1", "t1-a2", "plain-2"], 7
        )
        assert part_a.log.last_stable_offset == part_a.log.high_watermark == 7
        assert await latest(rt, "a", COMMITTED) == 7
        assert _gauge(metrics.OPEN_TRANSACTIONS, "a") == 0
        assert _gauge(metrics.LAST_STABLE_OFFSET, "a") == 7
        assert _gauge(metrics.UNSTABLE_OFFSETS, "a") == 0
        part_a.update_txn_age(NOW_MS + 2_500)
        assert _gauge(metrics.OLDEST_OPEN_TXN_AGE_SECONDS, "a") == 0
        assert metrics.TXN_MARKERS_WRITTEN.labels("a", "commit")._value.get() == (
            commits_before + 1
        )
        assert part_a.aborted.entries() == [AbortedTxn(20, 1, 5, 6)]
        assert rt.partition("b", 0).aborted.entries() == [AbortedTxn(20, 1, 4, 5)]

        [described] = await rt.describe_producers([("a", 0)])
        entries = {e.producer_id: e for e in described.producers}
        assert entries[10].producer_epoch == 1 and entries[10].coordinator_epoch == 3
        assert entries[10].current_txn_first_offset == -1
        assert entries[10].last_marker is not None
        assert entries[10].last_marker.offset == commit_offsets[0]
        # An identical retry of a marker: the original offset, nothing written.
        retry = await end_txn(rt, t1, MARKER_COMMIT, "a", "b", coordinator_epoch=3,
                              epoch=t1.epoch)
        assert [(o.error, o.offset) for o in retry] == [(None, o) for o in commit_offsets]
        assert part_a.log.log_end_offset == 7
        await rt.close()

    run(body)


def test_open_transaction_holds_the_lso_and_read_committed_long_polls(tmp_path: Path) -> None:
    t1 = Producer(10, "app-t1")
    t2 = Producer(20, "app-t2")
    plain = Producer(30)
    verifier = _verifier_with((t1, ("a",)), (t2, ("a",)))

    async def body() -> None:
        rt = await _open(tmp_path / "db", verifier)
        await create(rt, "a")
        await send_ok(rt, t1, "a", "t1-1")                 # 0: holds the LSO
        await send_ok(rt, t2, "a", "t2-1")                 # 1
        await end_ok(rt, t2, MARKER_COMMIT, "a", verifier=verifier)   # 2
        await send_ok(rt, plain, "a", "plain-1", txn=False)  # 3
        part = rt.partition("a", 0)
        assert (part.log.high_watermark, part.log.last_stable_offset) == (4, 0)
        assert await read(rt, "a", COMMITTED) == ([], 0)
        assert await latest(rt, "a", COMMITTED) == 0
        assert await latest(rt, "a", UNCOMMITTED) == 4
        [out] = await rt.fetch([FetchItem("a", 0, 0)], isolation=COMMITTED)
        assert (out.high_watermark, out.last_stable_offset, out.batches) == (4, 0, ())

        # A read_committed long-poll waits for the LSO: more data from others
        # moves the HW, not the LSO, and does not answer it.
        poll: asyncio.Task[list[FetchOutcome]] = asyncio.ensure_future(rt.fetch(
            [FetchItem("a", 0, 0)], isolation=COMMITTED, min_bytes=1,
            max_wait_ms=int(SAFETY_TIMEOUT_S * 1000),
        ))
        for _ in range(5):
            await asyncio.sleep(0)
        await send_ok(rt, plain, "a", "plain-2", txn=False)   # 4
        for _ in range(5):
            await asyncio.sleep(0)
        assert not poll.done()
        await end_ok(rt, t1, MARKER_COMMIT, "a", verifier=verifier)   # 5
        [polled] = await asyncio.wait_for(poll, SAFETY_TIMEOUT_S)
        assert polled.last_stable_offset == 6
        assert polled.next_fetch_offset == 6
        assert await read(rt, "a", COMMITTED) == (["t1-1", "t2-1", "plain-1", "plain-2"], 6)
        await rt.close()

    run(body)


def test_interleaved_producers_one_aborts_one_commits(tmp_path: Path) -> None:
    p1 = Producer(1, "app-1")
    p2 = Producer(2, "app-2")
    verifier = _verifier_with((p1, ("a",)), (p2, ("a",)))

    async def body() -> None:
        rt = await _open(tmp_path / "db", verifier)
        await create(rt, "a")
        for i in range(3):
            await send_ok(rt, p1, "a", f"p1-{i}")
            await send_ok(rt, p2, "a", f"p2-{i}", f"p2-{i}b")
        await end_ok(rt, p1, MARKER_ABORT, "a", verifier=verifier)
        # p2 is still open from 1; p1's aborted batch at 0 is skipped.
        assert await read(rt, "a", COMMITTED) == ([], 1)
        await end_ok(rt, p2, MARKER_COMMIT, "a", verifier=verifier)
        expected = [v for i in range(3) for v in (f"p2-{i}", f"p2-{i}b")]
        assert await read(rt, "a", COMMITTED) == (expected, 11)
        # p1's next transaction commits: its new batches are visible, the
        # aborted ones stay hidden.
        verifier.begin(p1.tid, p1.pid, p1.epoch, [("a", 0)])
        await send_ok(rt, p1, "a", "p1-next")
        await end_ok(rt, p1, MARKER_COMMIT, "a", verifier=verifier)
        assert await read(rt, "a", COMMITTED) == ([*expected, "p1-next"], 13)
        await rt.close()

    run(body)


# -------------------------------------------------------------- verification


def test_unverified_transactional_write_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    p = Producer(10, "app-1")
    verifier = InMemoryTxnVerifier()

    async def body() -> None:
        rt = await _open(tmp_path / "db", verifier)
        await create(rt, "a", "b")
        part = rt.partition("a", 0)

        [out] = await send(rt, p, ("a", p.batch("a", "x")))
        assert out.error is not None
        assert out.error.code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        for fragment in ("producer 10", "epoch 0", "a-0", "'app-1'"):
            assert fragment in out.error.message

        verifier.begin(p.tid, p.pid, 0, [("b", 0)])          # "a" is not in it
        p.seqs.clear()
        [out] = await send(rt, p, ("a", p.batch("a", "x")))
        assert out.error is not None and out.error.code == ErrorCode.INVALID_TXN_STATE
        assert (part.log.log_end_offset, part.log.last_stable_offset) == (0, 0)
        assert part.producers.get(p.pid) is None
        assert await read(rt, "a", UNCOMMITTED) == ([], 0)

        # Coordinator away: retriable; the retry of the same batch goes through.
        verifier.add_partitions(p.tid, [("a", 0)])
        verifier.unavailable = ErrorCode.COORDINATOR_NOT_AVAILABLE
        p.seqs.clear()
        batch = p.batch("a", "x")
        [out] = await send(rt, p, ("a", batch))
        assert out.error is not None and out.error.code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert out.error.code.retriable
        assert part.log.log_end_offset == 0
        verifier.unavailable = None
        [out] = await send(rt, p, ("a", batch))
        assert out.error is None and out.base_offset == 0
        entry = part.producers.get(p.pid)
        assert entry is not None and entry.current_txn_first_offset == 0
        await rt.close()

    run(body)


def test_the_store_adds_partitions_and_a_next_transaction_waits_for_its_marker(
        tmp_path: Path) -> None:
    p = Producer(12, "app-add")
    verifier = InMemoryTxnVerifier()
    verifier.begin(p.tid, p.pid, p.epoch)           # initialized, nothing added

    async def body() -> None:
        rt = await _open(tmp_path / "db", verifier)
        await create(rt, "a", "b")
        outs = await send(rt, p, ("a", p.batch("a", "1")), ("b", p.batch("b", "1")), add=True)
        assert all(o.error is None for o in outs), outs
        [question] = verifier.calls
        assert question.add and set(question.partitions) == {("a", 0), ("b", 0)}
        # Later batches of the transaction ask nothing.
        outs = await send(rt, p, ("a", p.batch("a", "2")), add=True)
        assert outs[0].error is None and len(verifier.calls) == 1

        # EndTxn answered (the coordinator decided, epoch + 1): the producer's
        # next transaction starts before the marker reaches "a". The
        # coordinator answers only once the markers have landed.
        verifier.end(p.tid)
        old = Producer(p.pid, p.tid, p.epoch)
        p.bump()
        verifier.begin(p.tid, p.pid, p.epoch)
        verifier.end(p.tid)
        verifier.hold()
        pending = asyncio.ensure_future(send(rt, p, ("a", p.batch("a", "3")), add=True))
        while verifier.waiting == 0 and not pending.done():
            await asyncio.sleep(0.001)
        assert not pending.done(), pending.result()
        part = rt.partition("a", 0)
        assert part.log.log_end_offset == 2          # not appended inside the old transaction
        await end_ok(rt, old, MARKER_COMMIT, "a", "b")
        verifier.release()
        [out] = await asyncio.wait_for(pending, 30)
        assert out.error is None and out.base_offset == 3   # after the marker at 2
        assert verifier.calls[-1].add and verifier.calls[-1].producer_epoch == p.epoch
        assert (await read(rt, "a", COMMITTED))[0] == ["1", "2"]
        assert part.log.last_stable_offset == 3      # the new transaction is open from 3
        await rt.close()

    run(body)


def test_pipelined_batches_wait_behind_the_verification_in_order(tmp_path: Path) -> None:
    p = Producer(10, "app-1")
    other = Producer(30)
    verifier = _verifier_with((p, ("a",)))

    async def body() -> None:
        rt = await _open(tmp_path / "db", verifier)
        await create(rt, "a")
        verifier.hold()
        first = asyncio.ensure_future(send(rt, p, ("a", p.batch("a", "v0"))))
        while verifier.waiting == 0:
            await asyncio.sleep(0)
        # Four more batches of the same producer, each its own request, sent
        # while the first waits: they must not be checked before it lands.
        later = [asyncio.ensure_future(send(rt, p, ("a", p.batch("a", f"v{i}"))))
                 for i in range(1, 5)]
        for _ in range(5):
            await asyncio.sleep(0)
        # Other producers are not held up by the verification.
        offset = await send_ok(rt, other, "a", "other", txn=False)
        assert offset == 0
        assert not first.done() and not any(t.done() for t in later)
        verifier.release()
        outs = [o for t in [first, *later] for o in await asyncio.wait_for(t, SAFETY_TIMEOUT_S)]
        assert [o.error for o in outs] == [None] * 5
        assert [o.base_offset for o in outs] == [1, 2, 3, 4, 5]
        assert len(verifier.calls) == 1
        assert await read(rt, "a", UNCOMMITTED) == (["other", "v0", "v1", "v2", "v3", "v4"], 6)

        # A failed verification: the batch behind it is checked after it, and
        # (its predecessor missing) refused as out of order, never appended first.
        q = Producer(11, "app-2")
        verifier.begin(q.tid, q.pid, 0, [("a", 0)])
        verifier.hold()
        q_first = asyncio.ensure_future(send(rt, q, ("a", q.batch("a", "q0"))))
        while verifier.waiting == 0:
            await asyncio.sleep(0)
        q_second = asyncio.ensure_future(send(rt, q, ("a", q.batch("a", "q1"))))
        for _ in range(5):
            await asyncio.sleep(0)
        verifier.unavailable = ErrorCode.NOT_COORDINATOR
        verifier.release()
        [out0] = await asyncio.wait_for(q_first, SAFETY_TIMEOUT_S)
        [out1] = await asyncio.wait_for(q_second, SAFETY_TIMEOUT_S)
        assert out0.error is not None and out0.error.code == ErrorCode.NOT_COORDINATOR
        assert out1.error is not None
        assert out1.error.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert rt.partition("a", 0).log.log_end_offset == 6
        await rt.close()

    run(body)


def test_a_marker_during_the_verification_fences_the_batch_despite_expiry(
        tmp_path: Path) -> None:
    """The coordinator's verdict was true when given, but the transaction
    ended (its ABORT marker landed) before the verdict came back, and the
    store's retention ran meanwhile. The producer must not be forgotten while
    its verification is out: the marker's epoch is what refuses the batch."""
    p = Producer(10, "app-1")
    verifier = _verifier_with((p, ("a",)))

    async def body() -> None:
        rt = await _open(tmp_path / "db", verifier)
        await create(rt, "a")
        part = rt.partition("a", 0)

        def expire_every_idle_producer() -> None:
            # What run_retention_once does for the partition, an hour later.
            part.expire_producers(now_ms=NOW_MS + HOUR_MS, expiration_ms=1)

        verifier.hold()
        first = asyncio.ensure_future(send(rt, p, ("a", p.batch("a", "late"))))
        while verifier.waiting == 0:
            await asyncio.sleep(0)
        [marker] = await end_txn(rt, p, MARKER_ABORT, "a")
        assert marker.error is None
        expire_every_idle_producer()
        assert part.producers.get(p.pid) is not None
        verifier.release()
        [out] = await asyncio.wait_for(first, SAFETY_TIMEOUT_S)
        assert out.error is not None and out.error.code == ErrorCode.PRODUCER_FENCED
        assert part.log.log_end_offset == 1  # the marker only
        assert part.log.last_stable_offset == part.log.high_watermark == 1
        # Once the question is answered the producer may expire again.
        expire_every_idle_producer()
        assert part.producers.get(p.pid) is None
        await rt.close()

    run(body)


def test_non_transactional_write_during_open_transaction_is_refused(tmp_path: Path) -> None:
    p = Producer(10, "app-1")
    verifier = _verifier_with((p, ("a",)))

    async def body() -> None:
        rt = await _open(tmp_path / "db", verifier)
        await create(rt, "a")
        await send_ok(rt, p, "a", "in-txn")
        [out] = await send(rt, p, ("a", p.batch("a", "plain", txn=False)))
        assert out.error is not None and out.error.code == ErrorCode.INVALID_TXN_STATE
        assert rt.partition("a", 0).log.log_end_offset == 1
        await rt.close()

    run(body)


# ------------------------------------------------------------------- markers


def test_zombie_coordinator_and_delayed_markers_change_nothing(tmp_path: Path) -> None:
    p = Producer(10, "app-1")
    verifier = _verifier_with((p, ("a",)))

    async def body() -> None:
        rt = await _open(tmp_path / "db", verifier)
        await create(rt, "a")
        await send_ok(rt, p, "a", "first")
        await end_ok(rt, p, MARKER_COMMIT, "a", verifier=verifier, coordinator_epoch=5)
        verifier.begin(p.tid, p.pid, p.epoch, [("a", 0)])
        await send_ok(rt, p, "a", "second")                     # open, epoch 1, at 2
        part = rt.partition("a", 0)
        before = (part.log.log_end_offset, part.log.high_watermark,
                  part.log.last_stable_offset, part.producers.get(p.pid),
                  part.aborted.entries())

        [zombie] = await end_txn(rt, p, MARKER_ABORT, "a", coordinator_epoch=4)
        assert zombie.error is not None
        assert zombie.error.code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
        # The earlier transaction's marker, delayed (same epoch, other type).
        [delayed] = await end_txn(rt, p, MARKER_ABORT, "a", coordinator_epoch=5, epoch=1)
        assert delayed.error is not None
        assert delayed.error.code == ErrorCode.INVALID_PRODUCER_EPOCH
        after = (part.log.log_end_offset, part.log.high_watermark,
                 part.log.last_stable_offset, part.producers.get(p.pid),
                 part.aborted.entries())
        assert after == before
        assert before[2] == 2                      # the open transaction holds the LSO
        # The real marker still works.
        await end_ok(rt, p, MARKER_ABORT, "a", verifier=verifier, coordinator_epoch=5)
        assert await read(rt, "a", COMMITTED) == (["first"], 4)
        await rt.close()

    run(body)


def test_version_1_transactions_share_an_epoch_and_refuse_delayed_markers(
        tmp_path: Path) -> None:
    p = Producer(10, "kafka-1")
    verifier = _verifier_with((p, ("a",)))

    def v1_marker(marker_type: int, decided_ms: int) -> MarkerItem:
        return MarkerItem(producer_id=p.pid, producer_epoch=p.epoch, control_type=marker_type,
                          coordinator_epoch=1, partitions=(("a", 0),),
                          transactional_id=p.tid, transaction_version=1,
                          timestamp_ms=decided_ms)

    async def written(rt: StoreRuntime, item: MarkerItem) -> MarkerOutcome:
        [out] = await rt.write_txn_markers([item])
        return out

    async def body() -> None:
        # No snapshot in between: recovery replays the control batches.
        rt = await _open(tmp_path / "db", verifier, snapshot_interval_batches=1000)
        await create(rt, "a")
        await send_ok(rt, p, "a", "t1-1", "t1-2")                  # 0-1, sequences 0-1
        verifier.end(p.tid)
        first = await written(rt, v1_marker(MARKER_COMMIT, 100))   # 2
        assert (first.error, first.offset) == (None, 2)
        # The next transaction: the same epoch, the sequence goes on, and its
        # first write here is verified again.
        verifier.begin(p.tid, p.pid, p.epoch, [("a", 0)])
        calls = len(verifier.calls)
        await send_ok(rt, p, "a", "t2-1")                           # 3, sequence 2
        assert len(verifier.calls) == calls + 1
        part = rt.partition("a", 0)
        assert part.log.last_stable_offset == 3
        # A delayed copy of the first marker: nothing written, still open.
        copy = await written(rt, v1_marker(MARKER_COMMIT, 100))
        assert (copy.error, copy.offset) == (None, 2)
        late = await written(rt, v1_marker(MARKER_ABORT, 100))
        assert late.error is not None and late.error.code is ErrorCode.INVALID_PRODUCER_EPOCH
        assert (part.log.log_end_offset, part.log.last_stable_offset) == (4, 3)
        verifier.end(p.tid)
        second = await written(rt, v1_marker(MARKER_ABORT, 200))   # 4
        assert (second.error, second.offset) == (None, 4)
        assert await read(rt, "a", COMMITTED) == (["t1-1", "t1-2"], 5)
        [out] = await rt.fetch([FetchItem("a", 0, 4, 0)], isolation=UNCOMMITTED,
                               include_control=True)
        # The marker's control batch carries its decision's timestamp.
        assert [read_header(b).max_timestamp_ms for b in out.batches] == [200]
        await rt.close(take_snapshots=False)

        rt = await _open(tmp_path / "db", verifier, snapshot_interval_batches=1000)
        part = rt.partition("a", 0)
        assert part.recovery_replayed_batches > 0
        entry = part.producers.get(p.pid)
        assert entry is not None and entry.last_marker is not None
        assert (entry.producer_epoch, entry.last_marker.timestamp_ms) == (0, 200)
        stale = await written(rt, v1_marker(MARKER_COMMIT, 100))
        assert stale.error is not None and stale.error.code is ErrorCode.INVALID_PRODUCER_EPOCH
        assert part.log.log_end_offset == 5
        assert await read(rt, "a", COMMITTED) == (["t1-1", "t1-2"], 5)
        await rt.close()

    run(body)


def test_marker_for_partition_never_written_and_unknown_partitions(tmp_path: Path) -> None:
    p = Producer(10, "app-1")
    verifier = InMemoryTxnVerifier()

    async def body() -> None:
        rt = await _open(tmp_path / "db", verifier)
        await create(rt, "a")
        outs = await rt.write_txn_markers([MarkerItem(
            producer_id=p.pid, producer_epoch=3, control_type=MARKER_ABORT,
            coordinator_epoch=0, partitions=(("a", 0), ("missing", 0), ("a", 7)),
        )])
        assert [o.error.code if o.error else None for o in outs] == [
            None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ]
        entry = rt.partition("a", 0).producers.get(p.pid)
        assert entry is not None and entry.producer_epoch == 3 and not entry.has_open_txn
        assert rt.partition("a", 0).aborted.entries() == []    # nothing to hide
        assert await read(rt, "a", COMMITTED) == ([], 1)
        await rt.close()

    run(body)


# ------------------------------------------------------------------ recovery


@dataclass(frozen=True)
class Seen:
    """Everything recovery must reproduce, per partition."""

    lso: int
    hw: int
    aborted: list[AbortedTxn]
    producers: list[ProducerEntry]
    committed: tuple[list[str], int]
    uncommitted: tuple[list[str], int]


async def _seen(rt: StoreRuntime, topic: str) -> Seen:
    part = rt.partition(topic, 0)
    return Seen(
        part.log.last_stable_offset, part.log.high_watermark, part.aborted.entries(),
        part.producers.entries(), await read(rt, topic, COMMITTED),
        await read(rt, topic, UNCOMMITTED),
    )


@pytest.fixture
def txn_history(tmp_path: Path) -> tuple[Path, Seen, dict[str, Producer]]:
    """Snapshots every 4 batches; T1 commits, T2 aborts, T3 stays open (it
    holds the LSO), others write around them; markers land on both sides of
    the newest snapshot; then a crash (no shutdown snapshot)."""
    path = tmp_path / "db"
    producers = {
        "t1": Producer(1, "app-t1"), "t2": Producer(2, "app-t2"),
        "t3": Producer(3, "app-t3"), "plain": Producer(9),
    }
    verifier = _verifier_with(*((producers[n], ("a",)) for n in ("t1", "t2", "t3")))
    seen: list[Seen] = []

    async def body() -> None:
        rt = await _open(path, verifier)
        await create(rt, "a")
        t1, t2, t3, plain = (producers[n] for n in ("t1", "t2", "t3", "plain"))
        await send_ok(rt, t1, "a", "t1-1")
        await send_ok(rt, t2, "a", "t2-1", "t2-2")
        await send_ok(rt, plain, "a", "plain-1", txn=False)
        await end_ok(rt, t2, MARKER_ABORT, "a", verifier=verifier, coordinator_epoch=2)
        await send_ok(rt, t3, "a", "t3-1")
        await send_ok(rt, t1, "a", "t1-2")
        await end_ok(rt, t1, MARKER_COMMIT, "a", verifier=verifier, coordinator_epoch=2)
        await send_ok(rt, plain, "a", "plain-2", txn=False)
        verifier.begin(t2.tid, t2.pid, t2.epoch, [("a", 0)])
        await send_ok(rt, t2, "a", "t2-again")
        await end_ok(rt, t2, MARKER_ABORT, "a", verifier=verifier, coordinator_epoch=3)
        await send_ok(rt, t3, "a", "t3-2")
        # Offsets: t1-1 0, t2 1-2, plain-1 3, ABORT(t2) 4, t3-1 5, t1-2 6,
        # COMMIT(t1) 7, plain-2 8, t2-again 9, ABORT(t2) 10, t3-2 11. Snapshots
        # after every 4 batches: at 5 (before T3 opened) and 9 (T3 open).
        part = rt.partition("a", 0)
        assert part.snapshot_offsets == [5, 9]
        assert part.log.last_stable_offset == 5               # T3, open since 5
        assert len(part.aborted) == 2
        seen.append(await _seen(rt, "a"))
        await rt.close(take_snapshots=False)

    run(body)
    return path, seen[0], producers


def _check_recovered(path: Path, before: Seen, producers: dict[str, Producer], *,
                     snapshot_offset: int | None, corrupt: int) -> None:
    verifier = InMemoryTxnVerifier()

    async def body() -> None:
        rt = await _open(path, verifier)
        part = rt.partition("a", 0)
        assert part.recovery_snapshot_offset == snapshot_offset
        assert part.recovery_corrupt_snapshots == corrupt
        assert part.recovery_replayed_batches > 0
        after = await _seen(rt, "a")
        assert after == before
        # The open transaction goes on after the restart: its next batch needs
        # no new verification, its marker ends it, the LSO catches up.
        t3 = producers["t3"]
        await send_ok(rt, t3, "a", "t3-3")
        assert verifier.calls == []
        await end_ok(rt, t3, MARKER_COMMIT, "a", coordinator_epoch=3)
        committed, end = await read(rt, "a", COMMITTED)
        assert committed == [
            "t1-1", "plain-1", "t3-1", "t1-2", "plain-2", "t3-2", "t3-3"
        ]
        assert end == part.log.high_watermark
        await rt.close(take_snapshots=False)

    run(body)


def test_kill_restart_reproduces_lso_aborted_index_and_filtering(
    txn_history: tuple[Path, Seen, dict[str, Producer]],
) -> None:
    path, before, producers = txn_history
    _check_recovered(path, before, producers, snapshot_offset=9, corrupt=0)
    # And again, after markers and data written since the first restart.
    verifier = InMemoryTxnVerifier()
    seen: list[Seen] = []

    async def capture() -> None:
        rt = await _open(path, verifier)
        seen.append(await _seen(rt, "a"))
        await rt.close(take_snapshots=False)

    run(capture)
    run(capture)
    assert seen[0] == seen[1]
    assert seen[0].lso == seen[0].hw


def _corrupt_snapshot(path: Path, offset: int) -> None:
    store = RocksStore(path)
    try:
        catalog = list(store.scan(keys.CATALOG_START, keys.CATALOG_END))
        assert catalog
        topic_id = next(decode_topic_record(v).topic_id for _k, v in catalog
                        if decode_topic_record(v).name == "a")
        key = keys.snapshot_key(topic_id, 0, offset)
        value = store.get(key)
        assert value is not None, f"no snapshot at {offset}"
        group = WriteGroup()
        group.put(key, value[:-1] + bytes([value[-1] ^ 0x5A]))
        store.write(group)
    finally:
        store.close()


def test_corrupt_newest_snapshot_with_open_transactions(
    txn_history: tuple[Path, Seen, dict[str, Producer]],
) -> None:
    path, before, producers = txn_history
    _corrupt_snapshot(path, 9)
    _check_recovered(path, before, producers, snapshot_offset=5, corrupt=1)


def test_no_usable_snapshot_replays_the_whole_log(
    txn_history: tuple[Path, Seen, dict[str, Producer]],
) -> None:
    path, before, producers = txn_history
    _corrupt_snapshot(path, 9)
    _corrupt_snapshot(path, 5)
    _check_recovered(path, before, producers, snapshot_offset=None, corrupt=2)


def test_corrupt_aborted_index_entry_is_rebuilt_from_the_log(
    txn_history: tuple[Path, Seen, dict[str, Producer]], caplog: pytest.LogCaptureFixture,
) -> None:
    path, before, producers = txn_history
    store = RocksStore(path)
    try:
        prefix = keys.ABORTED_TXN
        [(key, value), _second] = list(store.scan(prefix, keys.next_prefix(prefix)))
        group = WriteGroup()
        group.put(key, value[:-1] + bytes([value[-1] ^ 0x01]))
        store.write(group)
    finally:
        store.close()
    with caplog.at_level("WARNING", logger="oncelog.partition_store.partition"):
        _check_recovered(path, before, producers, snapshot_offset=9, corrupt=0)
    assert "rebuilding the aborted index by scanning the log" in caplog.text


def test_retention_prunes_the_aborted_index_with_the_batches(tmp_path: Path) -> None:
    p = Producer(1, "app-1")
    plain = Producer(9)
    verifier = _verifier_with((p, ("a",)))

    async def body() -> None:
        rt = await _open(tmp_path / "db", verifier, snapshot_interval_batches=1)
        await rt.create_topics([TopicSpec("a", 1, {"retention.bytes": "1"})],
                               validate_only=False)
        await send_ok(rt, p, "a", "aborted")                            # 0
        await end_ok(rt, p, MARKER_ABORT, "a", verifier=verifier)       # 1
        for i in range(3):
            await send_ok(rt, plain, "a", f"plain-{i}", txn=False)      # 2, 3, 4
        part = rt.partition("a", 0)
        assert len(part.aborted) == 1
        await rt.run_retention_once()
        assert part.log.log_start_offset == 4        # all but the newest batch
        assert part.aborted.entries() == []
        await rt.close()
        rt = await _open(tmp_path / "db", verifier)
        assert rt.partition("a", 0).aborted.entries() == []
        assert await read(rt, "a", COMMITTED) == (["plain-2"], 5)
        await rt.close()

    run(body)
