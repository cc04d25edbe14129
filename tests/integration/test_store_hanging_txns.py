"""The store's side of hanging transactions, in process, on real RocksDB.

Goal: a transaction that holds a partition's last stable offset is asked
about only once it is past its timeout (learned from the coordinator's
answer to its verification, else the store's bound) plus the margin; the
store writes the ABORT marker itself only when every `__transaction_state`
partition answered that nobody knows it, through the normal marker path
(the LSO moves, read_committed readers see past it, the aborted index holds
it, the zombie's late batch is fenced); a transaction a coordinator holds
open or has decided is left to that coordinator; the counter
`oncelog_store_auto_aborted_transactions_total` counts each once, by who
aborted it; the switch turns it all off.

Method: StoreRuntime over RocksStore in tmp_path with an injected clock the
test moves; the coordinators are the InMemoryTxnVerifier and
InMemoryTxnResolver fakes (the resolver's answers are set per case, a
missing partition is one that did not answer). `check_hanging_txns` is what
housekeeping runs every tick; the test calls it and awaits the questions it
started, so nothing depends on timing. The real coordinators' side is
tests/unit/test_hanging_txns.py; real processes are
tests/integration/test_hanging_txns_cluster.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from oncelog.errors import ErrorCode
from oncelog.records import MARKER_ABORT, control_marker, encode_batch, iter_records
from services.common.kernel.txn_fate import TxnFate
from services.common.metadata.cluster import ClusterLayout
from services.partition_store import metrics
from services.partition_store.api import FetchItem, ProduceItem, TopicSpec
from services.partition_store.log.partition import Isolation
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.storage.rocksdb import RocksStore
from services.partition_store.transactions.resolver import CoordinatorAnswer, InMemoryTxnResolver
from services.partition_store.transactions.verifier import InMemoryTxnVerifier

LAYOUT = ClusterLayout(stores=("127.0.0.1:1",), coordinators=("127.0.0.1:2",),
                       transaction_state_partitions=2)
START_MS = 1_700_000_000_000
TIMEOUT_MS = 10_000
MARGIN_MS = 2_000
BOUND_MS = 30_000
TOPIC = "payments"
PID = 41
TID = "copier-1"
UNKNOWN = CoordinatorAnswer(TxnFate.UNKNOWN)


class Clock:
    def __init__(self) -> None:
        self.now_ms = START_MS

    def __call__(self) -> int:
        return self.now_ms


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())  # type: ignore[arg-type]


async def _open(path: Path, clock: Clock, resolver: InMemoryTxnResolver,
                **overrides: object) -> tuple[StoreRuntime, InMemoryTxnVerifier]:
    verifier = InMemoryTxnVerifier()
    verifier.begin(TID, PID, 0, [(TOPIC, 0)], timeout_ms=TIMEOUT_MS)
    config: dict[str, object] = {
        "node_id": 0, "layout": LAYOUT, "hanging_txn_margin_ms": MARGIN_MS,
        "max_transaction_timeout_ms": BOUND_MS,
    }
    config.update(overrides)
    rt = StoreRuntime(RocksStore(path), StoreConfig(**config),  # type: ignore[arg-type]
                      txn_verifier=verifier, txn_resolver=resolver, clock_ms=clock)
    await rt.start()
    outcomes = await rt.create_topics([TopicSpec(TOPIC, 1)], validate_only=False)
    assert outcomes[0].error is None or outcomes[0].error.code is ErrorCode.TOPIC_ALREADY_EXISTS
    return rt, verifier


def _batch(value: str, *, epoch: int = 0, sequence: int = 0, txn: bool = True,
           producer_id: int = PID) -> bytes:
    return encode_batch([(None, value.encode(), None, START_MS)], producer_id=producer_id,
                        producer_epoch=epoch, base_sequence=sequence, transactional=txn)


async def _produce(rt: StoreRuntime, batch: bytes) -> ErrorCode | None:
    [out] = await rt.produce([ProduceItem(TOPIC, 0, batch)], transactional_id=TID)
    return None if out.error is None else out.error.code


async def _hang(rt: StoreRuntime) -> None:
    """A verified transaction of PID (its timeout learned), then another
    producer's committed-anywhere data behind it."""
    assert await _produce(rt, _batch("hung")) is None
    assert await _produce(rt, _batch("after", txn=False, producer_id=-1)) is None
    assert rt.partition(TOPIC, 0).log.last_stable_offset == 0


async def _check(rt: StoreRuntime, clock: Clock, at_ms: int) -> int:
    """Housekeeping's tick at START_MS + at_ms: returns the questions asked."""
    clock.now_ms = START_MS + at_ms
    tasks = rt.check_hanging_txns(clock.now_ms)
    await asyncio.gather(*tasks)
    return len(tasks)


async def _read_committed(rt: StoreRuntime) -> list[str]:
    [out] = await rt.fetch([FetchItem(TOPIC, 0, 0)], isolation=Isolation.READ_COMMITTED)
    assert out.error is None
    return [(r.value or b"").decode() for data in out.batches for r in iter_records(data)]


def _count(resolution: str) -> float:
    return float(metrics.AUTO_ABORTED_TRANSACTIONS.labels(TOPIC, resolution)._value.get())


def test_nobody_knows_it_so_the_store_aborts_it_once_every_partition_said_so(
        tmp_path: Path) -> None:
    clock = Clock()
    resolver = InMemoryTxnResolver({0: UNKNOWN})        # partition 1 does not answer

    async def body() -> None:
        rt, _verifier = await _open(tmp_path / "db", clock, resolver)
        await _hang(rt)
        part = rt.partition(TOPIC, 0)
        assert part.txn_timeouts_ms == {PID: TIMEOUT_MS}   # from the verification
        # Not before its timeout plus the margin.
        assert await _check(rt, clock, TIMEOUT_MS + MARGIN_MS - 1) == 0
        assert resolver.asked == []
        assert await _check(rt, clock, TIMEOUT_MS + MARGIN_MS) == 1
        [question] = resolver.asked
        assert (question.producer_id, question.producer_epoch, question.topic,
                question.partition) == (PID, 0, TOPIC, 0)
        # One partition of two answered: the store waits, and asks again
        # only after the retry interval.
        assert part.log.last_stable_offset == 0
        assert await _check(rt, clock, TIMEOUT_MS + 2 * MARGIN_MS - 1) == 0
        before = _count("store")
        resolver.answers[1] = UNKNOWN
        assert await _check(rt, clock, TIMEOUT_MS + 2 * MARGIN_MS) == 1
        # The ABORT marker went through the marker path: offset 2, the LSO
        # past it, the aborted index, read_committed readers unblocked.
        assert _count("store") == before + 1
        assert part.log.last_stable_offset == part.log.high_watermark == 3
        assert [e.first_offset for e in part.aborted.entries()] == [0]
        assert await _read_committed(rt) == ["after"]
        entry = part.producers.get(PID)
        assert entry is not None and not entry.has_open_txn and entry.producer_epoch == 1
        [(header, marker_batch)] = list(part.read_stored(2, 3))
        assert (header.producer_epoch, header.max_timestamp_ms) == (1, 0)
        assert control_marker(marker_batch) == (MARKER_ABORT, -1)
        # KIP-890's late produce: the zombie's batch is fenced, not a new hang.
        assert await _produce(rt, _batch("late", sequence=1)) is ErrorCode.PRODUCER_FENCED
        assert part.producers.open_txn_count == 0
        # Nothing left to ask about.
        assert await _check(rt, clock, 10 * BOUND_MS) == 0
        await rt.close()

    run(body)


def test_what_a_coordinator_holds_open_or_decides_is_left_to_it(tmp_path: Path) -> None:
    clock = Clock()
    resolver = InMemoryTxnResolver()

    async def body() -> None:
        rt, _verifier = await _open(tmp_path / "db", clock, resolver)
        await _hang(rt)
        part = rt.partition(TOPIC, 0)
        coordinator, store = _count("coordinator"), _count("store")
        at_ms = TIMEOUT_MS + MARGIN_MS
        for fate in (TxnFate.ONGOING, TxnFate.HELD_OPEN, TxnFate.DECIDED_COMMIT,
                     TxnFate.ABORTING, TxnFate.DECIDED_ABORT):
            resolver.answers = {0: UNKNOWN, 1: CoordinatorAnswer(fate, TID, 20_000)}
            assert await _check(rt, clock, at_ms) == 1, fate
            at_ms += MARGIN_MS
            # The store wrote nothing: the coordinator's marker ends it.
            assert part.log.last_stable_offset == 0
            assert part.producers.open_txn_count == 1
        # The coordinator's abort counted once for the transaction, and the
        # timeout it named replaced the one the store had.
        assert (_count("coordinator"), _count("store")) == (coordinator + 1, store)
        assert part.txn_timeouts_ms == {PID: 20_000}
        await rt.close()

    run(body)


def test_without_its_timeout_the_bound_applies_and_the_switch_turns_it_off(
        tmp_path: Path) -> None:
    clock = Clock()
    resolver = InMemoryTxnResolver({0: UNKNOWN, 1: UNKNOWN})

    async def body() -> None:
        # A restart forgets the learned timeouts: the bound applies.
        rt, _verifier = await _open(tmp_path / "db", clock, resolver)
        await _hang(rt)
        await rt.close()
        rt, _verifier = await _open(tmp_path / "db", clock, resolver)
        assert rt.partition(TOPIC, 0).txn_timeouts_ms == {}
        assert await _check(rt, clock, BOUND_MS + MARGIN_MS - 1) == 0
        await rt.close()
        # Off: never asked, however old.
        off, _verifier = await _open(tmp_path / "db", clock, resolver,
                                     resolve_hanging_txns=False)
        assert await _check(off, clock, 100 * BOUND_MS) == 0
        assert resolver.asked == []
        await off.close()
        rt, _verifier = await _open(tmp_path / "db", clock, resolver)
        assert await _check(rt, clock, BOUND_MS + MARGIN_MS) == 1
        assert rt.partition(TOPIC, 0).producers.open_txn_count == 0
        await rt.close()

    run(body)
