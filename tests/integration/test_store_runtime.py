"""The partition store runtime on real RocksDB, in process (no gRPC).

Goal: recovery is "newest good snapshot + replay of what came after it" —
measured by the NUMBER of replayed batches, not by time — with fallback to an
older snapshot and then to the log start when snapshots are damaged;
deduplication survives restarts and retention; group commit shares writes;
the catalog moves between store nodes (forwarding, learning on a miss,
deletion of data of deleted topics, new ids for re-created topics).

Method: StoreRuntime over RocksStore in pytest's tmp_path, driven with
asyncio.run. "Crash" is close(take_snapshots=False): everything acknowledged
is in RocksDB, but no shutdown snapshot is written, so the next start
recovers as after kill -9 (the gRPC test does a real SIGKILL). Time is an
injected clock; snapshots are taken by batch count only (intervals in ms are
set far out of reach).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from oncelog.errors import ErrorCode
from oncelog.records import encode_batch, iter_records
from services.common.metadata.cluster import ClusterLayout
from services.partition_store import metrics
from services.partition_store.api import (
    FetchItem,
    NewPartitions,
    OffsetQuery,
    ProduceItem,
    ProduceOutcome,
    TopicOutcome,
    TopicSpec,
)
from services.partition_store.core.topics import TopicRecord
from services.partition_store.log.partition import Isolation
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.storage import keys
from services.partition_store.storage.memory import MemoryStore
from services.partition_store.storage.port import WriteGroup
from services.partition_store.storage.rocksdb import RocksStore

LAYOUT = ClusterLayout(stores=("127.0.0.1:1",))
PID = 77
HOUR_MS = 3_600_000


class Clock:
    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def _config(**overrides: object) -> StoreConfig:
    base: dict[str, object] = {
        "node_id": 0, "layout": LAYOUT, "snapshot_interval_batches": 10,
        "snapshot_interval_ms": 10 * HOUR_MS, "retention_check_interval_ms": 10 * HOUR_MS,
    }
    base.update(overrides)
    return StoreConfig(**base)  # type: ignore[arg-type]


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())  # type: ignore[arg-type]


async def _open(path: Path, clock: Clock | None = None, **overrides: object) -> StoreRuntime:
    runtime = StoreRuntime(RocksStore(path), _config(**overrides), clock_ms=clock or Clock())
    await runtime.start()
    return runtime


def batch(seq: int, *, count: int = 2, ts_ms: int = 1_700_000_000_000, pid: int = PID,
          epoch: int = 0) -> bytes:
    return encode_batch(
        [(b"k", f"{pid}-{seq + i}".encode(), None, ts_ms + i) for i in range(count)],
        producer_id=pid, producer_epoch=epoch, base_sequence=seq,
    )


async def produce(rt: StoreRuntime, topic: str, data: bytes, partition: int = 0,
                  expected_leo: int | None = None) -> ProduceOutcome:
    [outcome] = await rt.produce([ProduceItem(topic, partition, data, expected_leo)])
    return outcome


async def produce_many(rt: StoreRuntime, topic: str, n: int, *, first_seq: int = 0,
                       **kw: int) -> list[int]:
    """n batches of 2 records from PID, one after another; their base offsets."""
    offsets = []
    for i in range(n):
        outcome = await produce(rt, topic, batch(first_seq + 2 * i, **kw))
        assert outcome.error is None, outcome.error
        offsets.append(outcome.base_offset)
    return offsets


async def create(rt: StoreRuntime, name: str, partitions: int = 1,
                 config: dict[str, str] | None = None) -> TopicOutcome:
    [outcome] = await rt.create_topics([TopicSpec(name, partitions, config or {})],
                                       validate_only=False)
    assert outcome.error is None, outcome.error
    return outcome


async def read_all(rt: StoreRuntime, topic: str, partition: int = 0) -> list[bytes]:
    values: list[bytes] = []
    offset = rt.partition(topic, partition).log.log_start_offset
    while True:
        [out] = await rt.fetch([FetchItem(topic, partition, offset)])
        assert out.error is None, out.error
        for b in out.batches:
            values.extend(r.value or b"" for r in iter_records(b, min_offset=offset))
        if out.next_fetch_offset == offset:
            return values
        offset = out.next_fetch_offset


def _corrupt_snapshot(path: Path, topic: TopicRecord, offset: int) -> None:
    store = RocksStore(path)
    try:
        group = WriteGroup()
        key = keys.snapshot_key(topic.topic_id, 0, offset)
        value = store.get(key)
        assert value is not None, f"no snapshot at {offset}"
        group.put(key, value[:-1] + bytes([value[-1] ^ 0x5A]))
        store.write(group)
    finally:
        store.close()


# ------------------------------------------------------------------ recovery


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, TopicRecord]:
    """25 batches of 2 records from one producer; snapshots every 10 batches
    (at offsets 20 and 40); then a crash. Returns the data path and topic."""
    path = tmp_path / "db"
    record: list[TopicRecord] = []

    async def body() -> None:
        rt = await _open(path)
        await create(rt, "orders")
        offsets = await produce_many(rt, "orders", 25)
        assert offsets == list(range(0, 50, 2))
        part = rt.partition("orders", 0)
        assert part.snapshot_offsets == [20, 40]
        record.append(part.topic)
        await rt.close(take_snapshots=False)

    run(body)
    return path, record[0]


def test_recovery_replays_only_batches_after_newest_snapshot(
    history: tuple[Path, TopicRecord],
) -> None:
    path, _topic = history

    async def body() -> None:
        rt = await _open(path)
        part = rt.partition("orders", 0)
        assert part.recovery_snapshot_offset == 40
        assert part.recovery_replayed_batches == 5      # batches at 40..48
        assert part.recovery_corrupt_snapshots == 0
        assert rt.recovery_replayed_batches == 5
        assert metrics.RECOVERY_REPLAYED_BATCHES._value.get() == 5
        assert (part.log.log_end_offset, part.log.high_watermark) == (50, 50)
        assert len(await read_all(rt, "orders")) == 50
        await rt.close()

    run(body)


def test_corrupt_newest_snapshot_falls_back_to_older(history: tuple[Path, TopicRecord]) -> None:
    path, topic = history
    _corrupt_snapshot(path, topic, 40)

    async def body() -> None:
        rt = await _open(path)
        part = rt.partition("orders", 0)
        assert part.recovery_corrupt_snapshots == 1
        assert part.recovery_snapshot_offset == 20
        assert part.recovery_replayed_batches == 15     # batches at 20..48
        await _assert_dedups_last_five(rt)
        await rt.close()

    run(body)


def test_all_snapshots_corrupt_replays_from_log_start(history: tuple[Path, TopicRecord]) -> None:
    path, topic = history
    _corrupt_snapshot(path, topic, 40)
    _corrupt_snapshot(path, topic, 20)

    async def body() -> None:
        rt = await _open(path)
        part = rt.partition("orders", 0)
        assert part.recovery_corrupt_snapshots == 2
        assert part.recovery_snapshot_offset is None
        assert part.recovery_replayed_batches == 25
        await _assert_dedups_last_five(rt)
        await rt.close()

    run(body)


async def _assert_dedups_last_five(rt: StoreRuntime) -> None:
    """Batches 20..24 (sequences 40..48) are the producer's last five."""
    for i in range(20, 25):
        outcome = await produce(rt, "orders", batch(2 * i))
        assert outcome.error is None, outcome.error
        assert outcome.duplicate, f"batch {i} was appended again"
        assert outcome.base_offset == 2 * i
    older = await produce(rt, "orders", batch(2 * 19))
    assert older.error is not None
    assert older.error.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    following = await produce(rt, "orders", batch(50))
    assert following.error is None and not following.duplicate
    assert following.base_offset == 50


def test_dedup_after_recovery(history: tuple[Path, TopicRecord]) -> None:
    path, _topic = history

    async def body() -> None:
        rt = await _open(path)
        await _assert_dedups_last_five(rt)
        await rt.close()

    run(body)


def test_clean_shutdown_snapshots_so_nothing_is_replayed(tmp_path: Path) -> None:
    async def body() -> None:
        rt = await _open(tmp_path / "db")
        await create(rt, "t")
        await produce_many(rt, "t", 13)
        await rt.close()
        rt = await _open(tmp_path / "db")
        assert rt.partition("t", 0).recovery_replayed_batches == 0
        assert rt.partition("t", 0).recovery_snapshot_offset == 26
        await rt.close()

    run(body)


# ----------------------------------------------------------------- retention


def test_retention_keeps_dedup_state_across_deletion_and_restart(tmp_path: Path) -> None:
    clock = Clock()
    now = clock.now_ms
    path = tmp_path / "db"

    async def body() -> None:
        rt = await _open(path, clock, snapshot_interval_batches=1000)
        await create(rt, "events", config={"retention.ms": str(HOUR_MS)})
        # Eight old batches, then four recent ones, all from the same producer.
        old = await produce_many(rt, "events", 8, ts_ms=now - 5 * HOUR_MS)
        recent = await produce_many(rt, "events", 4, first_seq=16, ts_ms=now)
        assert old[-1] == 14 and recent == [16, 18, 20, 22]
        part = rt.partition("events", 0)
        assert part.snapshot_offsets == []   # none by count yet
        deleted = await rt.run_retention_once()
        assert deleted == 8
        assert part.log.log_start_offset == 16
        # A snapshot went first: producer state outlives the deleted batches.
        assert part.newest_snapshot_offset == 24
        [out] = await rt.fetch([FetchItem("events", 0, 3)])
        assert out.error is not None and out.error.code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert [o.offset for o in await rt.list_offsets(
            [OffsetQuery("events", 0, -2)], isolation=Isolation.READ_UNCOMMITTED)] == [16]
        # The producer's last five batches include one (seq 14) whose data is gone.
        retry_old = await produce(rt, "events", batch(14, ts_ms=now - 5 * HOUR_MS))
        assert retry_old.duplicate and retry_old.base_offset == 14
        retry_recent = await produce(rt, "events", batch(22, ts_ms=now))
        assert retry_recent.duplicate and retry_recent.base_offset == 22
        # One more batch, then a crash: recovery = retention snapshot + 1 batch.
        assert (await produce(rt, "events", batch(24, ts_ms=now))).base_offset == 24
        await rt.close(take_snapshots=False)

        rt = await _open(path, clock, snapshot_interval_batches=1000)
        part = rt.partition("events", 0)
        assert part.recovery_snapshot_offset == 24
        assert part.recovery_replayed_batches == 1
        assert part.log.log_start_offset == 16
        for seq, offset in ((18, 18), (20, 20), (22, 22), (24, 24)):
            retry = await produce(rt, "events", batch(seq, ts_ms=now))
            assert retry.duplicate and retry.base_offset == offset, (seq, retry)
        assert len(await read_all(rt, "events")) == 10  # offsets 16..25
        # The time index still answers after deletion (clamped to the log start).
        [by_time] = await rt.list_offsets(
            [OffsetQuery("events", 0, now - 10 * HOUR_MS)], isolation=Isolation.READ_UNCOMMITTED
        )
        assert by_time.offset == 16
        [by_time] = await rt.list_offsets(
            [OffsetQuery("events", 0, now + 1)], isolation=Isolation.READ_UNCOMMITTED
        )
        assert (by_time.offset, by_time.timestamp_ms) == (17, now + 1)
        await rt.close()

    run(body)


def test_retention_by_size_never_deletes_newest_batch(tmp_path: Path) -> None:
    async def body() -> None:
        rt = await _open(tmp_path / "db")
        await create(rt, "sized", config={"retention.bytes": "0"})
        await produce_many(rt, "sized", 5)
        assert await rt.run_retention_once() == 4
        part = rt.partition("sized", 0)
        assert (part.log.log_start_offset, part.log.log_end_offset) == (8, 10)
        assert part.log.size_bytes == len(batch(0))
        assert len(await read_all(rt, "sized")) == 2
        await rt.close()
        rt = await _open(tmp_path / "db")
        assert rt.partition("sized", 0).log.size_bytes == len(batch(0))
        assert rt.partition("sized", 0).log.log_start_offset == 8
        await rt.close()

    run(body)


# -------------------------------------------------------------- group commit


def test_concurrent_produces_share_group_commits(tmp_path: Path) -> None:
    async def body() -> None:
        rt = await _open(tmp_path / "db", fsync=True)
        await create(rt, "busy", partitions=1)
        before = rt.group_commits
        producers = range(1000, 1040)
        results = await asyncio.gather(
            *(produce(rt, "busy", batch(0, pid=p)) for p in producers)
        )
        assert all(r.error is None for r in results)
        assert sorted(r.base_offset for r in results) == list(range(0, 80, 2))
        # Offsets follow call order: each call checked and appended synchronously.
        assert [r.base_offset for r in results] == list(range(0, 80, 2))
        assert rt.group_commits - before < len(results)
        await rt.close()

    run(body)


def test_duplicate_of_a_pending_batch_waits_and_returns_its_offset(tmp_path: Path) -> None:
    async def body() -> None:
        rt = await _open(tmp_path / "db", fsync=True)
        await create(rt, "t")
        first, again = await asyncio.gather(
            produce(rt, "t", batch(0)), produce(rt, "t", batch(0))
        )
        assert (first.base_offset, first.duplicate) == (0, False)
        assert (again.base_offset, again.duplicate) == (0, True)
        assert rt.partition("t", 0).log.high_watermark == 2
        await rt.close()

    run(body)


def test_conditional_append(tmp_path: Path) -> None:
    async def body() -> None:
        rt = await _open(tmp_path / "db")
        await create(rt, "claims")
        plain = encode_batch([(None, b"a", None, 1)])
        assert (await produce(rt, "claims", plain, expected_leo=0)).base_offset == 0
        stale = await produce(rt, "claims", plain, expected_leo=0)
        assert stale.error is not None
        assert stale.error.code == ErrorCode.LOG_END_OFFSET_MISMATCH
        assert "expected log end offset 0" in stale.error.message and "is 1" in stale.error.message
        assert (await produce(rt, "claims", plain, expected_leo=1)).base_offset == 1
        assert (await produce(rt, "claims", plain)).base_offset == 2
        await rt.close()

    run(body)


def test_long_poll_returns_when_data_arrives(tmp_path: Path) -> None:
    async def body() -> None:
        rt = await _open(tmp_path / "db")
        await create(rt, "t")
        fetch = asyncio.ensure_future(
            rt.fetch([FetchItem("t", 0, 0)], max_wait_ms=30_000, min_bytes=1)
        )
        await asyncio.sleep(0)
        assert not fetch.done()
        await produce(rt, "t", batch(0))
        [out] = await fetch
        assert len(out.batches) == 1 and out.next_fetch_offset == 2
        await rt.close()

    run(body)


# ------------------------------------------------------------------- catalog


class InProcessLink:
    """ControllerLink straight to the controller runtime (same event loop)."""

    def __init__(self) -> None:
        self.controller: StoreRuntime | None = None
        self.nodes: dict[int, StoreRuntime] = {}

    def _c(self) -> StoreRuntime:
        assert self.controller is not None
        return self.controller

    async def list_topics(self) -> list[TopicRecord]:
        return self._c().topics(include_internal=True)

    async def create_topics(self, specs: Sequence[TopicSpec], *,
                            validate_only: bool) -> list[TopicOutcome]:
        return await self._c().create_topics(specs, validate_only=validate_only)

    async def delete_topics(self, names: Sequence[str]) -> list[TopicOutcome]:
        return await self._c().delete_topics(names)

    async def create_partitions(self, specs: Sequence[NewPartitions], *,
                                validate_only: bool) -> list[TopicOutcome]:
        return await self._c().create_partitions(specs, validate_only=validate_only)

    def partition_states(self) -> None:
        return None

    async def notify_catalog_changed(self, node_id: int) -> None:
        if node_id in self.nodes:
            await self.nodes[node_id].refresh_catalog()

    async def close(self) -> None:
        pass


def test_catalog_across_two_nodes(tmp_path: Path) -> None:
    layout = ClusterLayout(stores=("127.0.0.1:1", "127.0.0.1:2"))

    async def body() -> None:
        link = InProcessLink()
        node0 = StoreRuntime(RocksStore(tmp_path / "n0"), _config(layout=layout), controller=link)
        node1 = StoreRuntime(RocksStore(tmp_path / "n1"), _config(layout=layout, node_id=1),
                             controller=link)
        link.controller, link.nodes = node0, {1: node1}
        await node0.start()
        await node1.start()
        # Creation through node 1 is forwarded to the controller.
        [made] = await node1.create_topics([TopicSpec("shared", 4, {})], validate_only=False)
        assert made.error is None and made.topic_id > 0
        assert node0.topics(include_internal=False)[0].topic_id == made.topic_id
        on1 = [p for p in range(4) if layout.store_for("shared", p) == 1]
        on0 = [p for p in range(4) if layout.store_for("shared", p) == 0]
        assert on0 and on1
        # Each node owns its partitions; the other answers NOT_LEADER_OR_FOLLOWER.
        out = await produce(node1, "shared", batch(0), partition=on1[0])
        assert out.error is None
        wrong = await produce(node0, "shared", batch(0), partition=on1[0])
        assert wrong.error is not None
        assert wrong.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert "store node 1" in wrong.error.message
        # Delete and re-create: node 1 drops the old data; the new topic is empty.
        [gone] = await node0.delete_topics(["shared"])
        assert gone.error is None
        assert "shared" not in {t.name for t in node1.topics(include_internal=False)}
        remade = await create(node0, "shared", partitions=4)
        assert remade.topic_id != made.topic_id
        [out2] = await node1.fetch([FetchItem("shared", on1[0], 0)])
        assert out2.error is None and out2.high_watermark == 0 and out2.batches == ()
        old_prefix = keys.topic_prefix(keys.LOG, made.topic_id)
        assert list(node1._shared.store.scan(old_prefix, keys.next_prefix(old_prefix))) == []
        # Internal topics exist everywhere; users cannot delete them.
        [internal] = await node1.delete_topics(["__consumer_offsets"])
        assert internal.error is not None
        assert internal.error.code == ErrorCode.INVALID_TOPIC_EXCEPTION
        await node1.close()
        await node0.close()

    run(body)


def test_create_partitions_across_two_nodes(tmp_path: Path) -> None:
    """Growing a topic through either node: the controller records the new
    count, both nodes open their new partitions (the other one told to
    refresh before the answer), existing partitions keep their records, and
    after both restart (a crash: no shutdown snapshots) the count holds."""
    layout = ClusterLayout(stores=("127.0.0.1:1", "127.0.0.1:2"))

    async def start(link: InProcessLink) -> tuple[StoreRuntime, StoreRuntime]:
        node0 = StoreRuntime(RocksStore(tmp_path / "n0"), _config(layout=layout),
                             controller=link)
        node1 = StoreRuntime(RocksStore(tmp_path / "n1"), _config(layout=layout, node_id=1),
                             controller=link)
        link.controller, link.nodes = node0, {1: node1}
        await node0.start()
        await node1.start()
        return node0, node1

    def owner(nodes: tuple[StoreRuntime, StoreRuntime], p: int) -> StoreRuntime:
        return nodes[layout.store_for("grow", p)]

    async def body() -> None:
        nodes = await start(InProcessLink())
        node0, node1 = nodes
        made = await create(node0, "grow", partitions=2)
        await create(node0, "grow-too", partitions=1)
        for p in range(2):
            assert (await produce(owner(nodes, p), "grow", batch(0), partition=p)).error is None
        # validate_only answers as if grown and changes nothing, on either node.
        for node in nodes:
            [checked] = await node.create_partitions([NewPartitions("grow", 5)],
                                                     validate_only=True)
            assert (checked.error, checked.topic_id) == (None, made.topic_id)
            assert [r.partitions for r in node.topics(include_internal=False)
                    if r.name == "grow"] == [2]
        # Forwarded by node 1 to the controller.
        [grown] = await node1.create_partitions([NewPartitions("grow", 5)], validate_only=False)
        assert (grown.error, grown.topic_id) == (None, made.topic_id)
        for node in nodes:
            record = {r.name: r for r in node.topics(include_internal=False)}["grow"]
            assert (record.partitions, record.topic_id) == (5, made.topic_id)
        assert {p for p in range(5) if layout.store_for("grow", p) == 1} - {0, 1}, (
            "the test needs a new partition on node 1")
        for p in range(2, 5):
            out = await produce(owner(nodes, p), "grow", batch(0, pid=PID + p), partition=p)
            assert (out.error, out.base_offset) == (None, 0)
        for p in range(2):
            assert await read_all(owner(nodes, p), "grow", p) == [b"77-0", b"77-1"]
        # Shrinking, the same count, an unknown or internal topic: refused,
        # per topic, and the topics asked beside them are still handled.
        outcomes = await node1.create_partitions(
            [NewPartitions("grow", 3), NewPartitions("nowhere", 2),
             NewPartitions("__consumer_offsets", 99), NewPartitions("grow-too", 2)],
            validate_only=False)
        assert [o.error.code if o.error else None for o in outcomes] == [
            ErrorCode.INVALID_PARTITIONS, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.INVALID_REQUEST, None]
        assert {r.name: r.partitions for r in node1.topics(include_internal=False)} == {
            "grow": 5, "grow-too": 2}
        # Grown at the controller: node 1 was told before the answer came.
        [told] = await node0.create_partitions([NewPartitions("grow-too", 4)],
                                               validate_only=False)
        assert told.error is None
        assert {r.name: r.partitions for r in node1.topics(include_internal=False)} == {
            "grow": 5, "grow-too": 4}
        assert {p for p in range(2, 4) if layout.store_for("grow-too", p) == 1}, (
            "the test needs a new partition of grow-too on node 1")
        for p in range(2, 4):
            assert (await produce(nodes[layout.store_for("grow-too", p)], "grow-too", batch(0),
                                  partition=p)).error is None
        [twice, again] = await node0.create_partitions(
            [NewPartitions("grow", 6), NewPartitions("grow", 7)], validate_only=False)
        assert twice.error is not None and twice.error.code == ErrorCode.INVALID_REQUEST
        assert again.error is not None and "2 times" in again.error.message
        assert {r.name: r.partitions for r in node0.topics(include_internal=False)} == {
            "grow": 5, "grow-too": 4}
        await node1.close(take_snapshots=False)
        await node0.close(take_snapshots=False)

        nodes = await start(InProcessLink())
        for node in nodes:
            assert {r.name: r.partitions for r in node.topics(include_internal=False)} == {
                "grow": 5, "grow-too": 4}
        for p in range(5):
            expected = [b"77-0", b"77-1"] if p < 2 else [f"{PID + p}-0".encode(),
                                                         f"{PID + p}-1".encode()]
            assert await read_all(owner(nodes, p), "grow", p) == expected
        for node in nodes:
            await node.close()

    run(body)


class DeafLink(InProcessLink):
    """A link over which the controller's "the catalog changed" nudge is
    lost (a store unreachable at that moment)."""

    async def notify_catalog_changed(self, node_id: int) -> None:
        pass


def test_a_store_that_missed_the_growth_learns_it_when_a_new_partition_is_asked(
        tmp_path: Path) -> None:
    """Without the nudge, node 1 still has the old count cached; a produce,
    fetch or ListOffsets naming one of the new partitions makes it ask the
    controller, instead of refusing until its periodic refresh."""
    layout = ClusterLayout(stores=("127.0.0.1:1", "127.0.0.1:2"))

    async def body() -> None:
        link = DeafLink()
        node0 = StoreRuntime(RocksStore(tmp_path / "n0"), _config(layout=layout),
                             controller=link)
        node1 = StoreRuntime(RocksStore(tmp_path / "n1"), _config(layout=layout, node_id=1),
                             controller=link)
        link.controller, link.nodes = node0, {1: node1}
        await node0.start()
        await node1.start()
        await create(node0, "late", partitions=1)
        await node1.refresh_catalog()
        [grown] = await node0.create_partitions([NewPartitions("late", 6)],
                                                validate_only=False)
        assert grown.error is None
        assert [r.partitions for r in node1.topics(include_internal=False)] == [1]
        on1 = [p for p in range(1, 6) if layout.store_for("late", p) == 1]
        assert len(on1) >= 2, "the test needs two new partitions on node 1"
        out = await produce(node1, "late", batch(0), partition=on1[0])
        assert (out.error, out.base_offset) == (None, 0)
        assert [r.partitions for r in node1.topics(include_internal=False)] == [6]
        # The same for a fetch and for ListOffsets, each after another growth.
        for count, ask in ((9, "fetch"), (12, "list offsets")):
            [again] = await node0.create_partitions([NewPartitions("late", count)],
                                                    validate_only=False)
            assert again.error is None
            new = next(p for p in range(count - 3, count) if layout.store_for("late", p) == 1)
            if ask == "fetch":
                [read] = await node1.fetch([FetchItem("late", new, 0)])
                assert (read.error, read.high_watermark) == (None, 0)
            else:
                [end] = await node1.list_offsets([OffsetQuery("late", new, -1)],
                                                 isolation=Isolation.READ_UNCOMMITTED)
                assert (end.error, end.offset) == (None, 0)
            assert [r.partitions for r in node1.topics(include_internal=False)] == [count]
        await node0.close()
        await node1.close()

    run(body)


def test_validate_only_creates_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        rt = await _open(tmp_path / "db")
        [ok] = await rt.create_topics([TopicSpec("later", 3, {})], validate_only=True)
        assert ok.error is None
        assert "later" not in {t.name for t in rt.topics(include_internal=False)}
        [dup1, dup2] = await rt.create_topics(
            [TopicSpec("twice", 1, {}), TopicSpec("twice", 1, {})], validate_only=False
        )
        assert dup1.error is not None and dup1.error.code == ErrorCode.INVALID_REQUEST
        await create(rt, "once")
        [again] = await rt.create_topics([TopicSpec("once", 1, {})], validate_only=False)
        assert again.error is not None and again.error.code == ErrorCode.TOPIC_ALREADY_EXISTS
        await rt.close()

    run(body)


def test_topic_ids_are_never_reused(tmp_path: Path) -> None:
    async def body() -> None:
        rt = await _open(tmp_path / "db")
        first = await create(rt, "a")
        await rt.delete_topics(["a"])
        await rt.close()
        rt = await _open(tmp_path / "db")
        second = await create(rt, "a")
        assert second.topic_id > first.topic_id
        await rt.close()

    run(body)


def test_transactional_batch_that_cannot_be_verified_is_refused(tmp_path: Path) -> None:
    """Without the request's transactional id, or without a coordinator to
    verify it with, a transactional batch is refused and the log is unchanged
    (tests/integration/test_store_txn_runtime.py covers verification)."""
    async def body() -> None:
        rt = await _open(tmp_path / "db")
        await create(rt, "t")
        txn = encode_batch([(None, b"x", None, 1)], producer_id=5, producer_epoch=0,
                           base_sequence=0, transactional=True)
        out = await produce(rt, "t", txn)
        assert out.error is not None and out.error.code == ErrorCode.INVALID_REQUEST
        assert "transactional_id" in out.error.message
        [out] = await rt.produce([ProduceItem("t", 0, txn)], transactional_id="app-1")
        assert out.error is not None and out.error.code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert out.error.code.retriable
        assert rt.partition("t", 0).log.log_end_offset == 0
        assert rt.partition("t", 0).producers.get(5) is None
        await rt.close()

    run(body)


class FailingStore(MemoryStore):
    """The in-memory adapter, with writes that fail once `broken` is set."""

    broken = False

    def write(self, group: WriteGroup) -> None:
        if self.broken:
            raise OSError("disk on fire")
        super().write(group)


def test_storage_failure_fails_pending_and_later_writes() -> None:
    async def body() -> None:
        store = FailingStore()
        rt = StoreRuntime(store, _config())
        await rt.start()
        await create(rt, "t")
        assert (await produce(rt, "t", batch(0))).base_offset == 0
        store.broken = True
        failed = await produce(rt, "t", batch(2))
        assert failed.error is not None and failed.error.code == ErrorCode.STORAGE_ERROR
        assert "restarted" in failed.error.message
        later = await produce(rt, "t", batch(4))
        assert later.error is not None and later.error.code == ErrorCode.STORAGE_ERROR
        # Nothing beyond the last durable batch is readable.
        [out] = await rt.fetch([FetchItem("t", 0, 0)])
        assert out.high_watermark == 2 and len(out.batches) == 1
        await rt.close()

    run(body)
