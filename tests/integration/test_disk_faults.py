"""A partition store on a real disk that fills up, or whose files were
damaged while it was down.

Goal (full disk): appends are refused with the retriable STORAGE_ERROR
saying the disk is full; reads go on; nothing is acknowledged that was not
written and nothing stored is damaged; `oncelog_store_disk_full` says so;
and once space is freed appends resume by themselves, without a restart.
On a replicated cluster the leader whose disk filled takes its followers
back into the ISR afterwards, an idle follower outside it included.

Goal (damaged files): a store finds what was damaged — a byte flipped in a
write-ahead log or a table file, a truncated table file — and never serves
or copies the bad bytes: on a single copy it refuses to start and names the
file; on a replicated cluster it sets the damaged data aside and rebuilds
its replicas from the leaders, and every acknowledged record is still
there, once.

Method: the store's data directory is a size-limited tmpfs mounted by the
test (a real ENOSPC from the kernel), filled with a file until no byte is
left; an idempotent producer of our SDK writes before, during and after;
the store's metrics and a read_uncommitted reader watch. For damage, the
store is stopped (SIGTERM: its writes end up in table files; or kill -9:
they stay in the write-ahead log), bytes of one of RocksDB's files are
flipped or the file is cut short, and the store is started again.
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from oncelog import Admin, Consumer, ConsumerRecord, Producer, RecordMetadata, TopicPartition
from oncelog.errors import OncelogError
from oncelog.testing import LocalCluster
from services.partition_store.damage import EXIT_DAMAGED
from tests.support.nemesis import store_disks
from tests.support.partitioned_clients import create_topic, read_committed
from tests.support.polling import wait_until
from tests.support.reading import read_all

pytestmark = pytest.mark.timeout(300)

TOPIC = "ledger"
# Room for the store's RocksDB files and the internal topics, small enough
# to fill in a moment.
TMPFS_SIZE = "64m"
FILL_CHUNK_BYTES = 1 << 20
FULL_DISK_RECORD_BYTES = 10_000
# Bounds the records sent while waiting for a write to find the disk full.
MAX_FULL_DISK_RECORDS = 5_000


def _metric(cluster: LocalCluster, name: str, node_id: int = 0) -> float:
    with urllib.request.urlopen(cluster.metrics_url("partition_store", node_id),
                                timeout=10) as resp:
        text = resp.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == name)


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def _fill(directory: Path) -> Path:
    """A file that takes every free byte of the directory's device."""
    filler = directory / "filler"
    chunk = FILL_CHUNK_BYTES
    with open(filler, "wb", buffering=0) as out:
        while chunk:
            try:
                out.write(b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    return filler


def _values(cluster: LocalCluster) -> list[int]:
    return [int(r.value[:8]) for r in read_all(cluster.bootstrap, TOPIC, 1)
            if r.value is not None]


def _payload(i: int) -> bytes:
    # Big enough that the room RocksDB set aside for its log runs out soon.
    return b"%08d" % i + b"." * FULL_DISK_RECORD_BYTES


def _acked(futures: Sequence[Future[RecordMetadata]]) -> dict[int, int]:
    """value -> offset of every acknowledged record."""
    return {i: f.result().offset for i, f in enumerate(futures)
            if f.done() and f.exception() is None}


def test_a_full_disk_refuses_appends_keeps_reads_and_resumes_once_space_is_freed(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", group_coordinators=0, start=False)
    with _tmpfs(cluster.data_dir / "partition_store-0", TMPFS_SIZE) as store_dir, cluster:
        cluster.start()
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=1)
        producer = Producer(bootstrap=cluster.bootstrap, linger_ms=1,
                            delivery_timeout_ms=240_000)
        futures = [producer.send(TOPIC, value=_payload(i), partition=0) for i in range(200)]
        producer.flush()
        assert len(_acked(futures)) == 200
        assert _metric(cluster, "oncelog_store_disk_full") == 0

        filler = _fill(store_dir)

        def full() -> bool:
            # Writes go on until one finds no space (RocksDB may have set
            # room aside for its log before the disk filled up).
            if len(futures) < MAX_FULL_DISK_RECORDS:
                futures.extend(producer.send(TOPIC, value=_payload(i), partition=0)
                               for i in range(len(futures), len(futures) + 20))
            return _metric(cluster, "oncelog_store_disk_full") == 1

        wait_until("the store saying its disk is full", full)
        with Producer(bootstrap=cluster.bootstrap, delivery_timeout_ms=3_000) as probe, \
                pytest.raises(OncelogError) as refused:
            probe.send(TOPIC, value=b"probe", partition=0).result(timeout=60)
        assert "disk is full" in str(refused.value), refused.value
        assert _metric(cluster, "oncelog_store_storage_refused_appends_total") > 0
        # Reads go on; what they find is exactly what was acknowledged, and
        # some records wait, refused.
        assert sorted(_values(cluster)) == sorted(_acked(futures))
        waiting = len(futures) - len(_acked(futures))
        assert waiting > 0

        filler.unlink()
        wait_until("appends resuming by themselves",
                   lambda: len(_acked(futures)) == len(futures), deadline_s=120)
        print(f"\n{waiting} records waited for space and were then written")
        assert _metric(cluster, "oncelog_store_disk_full") == 0
        producer.close()
        acked = _acked(futures)
        got = read_all(cluster.bootstrap, TOPIC, 1)
        assert [r.value for r in got] == [_payload(i) for i in range(len(futures))]
        assert [r.offset for r in got] == [acked[i] for i in range(len(futures))]
        # Nothing stored was damaged: a restart reads the same log back.
        cluster.terminate("partition_store", 0)
        cluster.restart("partition_store", 0)
        assert _values(cluster) == list(range(len(futures)))


def write_until_refused(bootstrap: str, topic: str) -> int:
    """Big records to partition 0, one at a time, until one is refused (a
    client-namespace call); returns how many were acknowledged."""
    acked = 0
    with Producer(bootstrap=bootstrap, linger_ms=0, delivery_timeout_ms=5_000) as producer:
        while acked < MAX_FULL_DISK_RECORDS:
            try:
                producer.send(topic, value=_payload(acked), partition=0).result(timeout=60)
            except OncelogError:
                return acked
            acked += 1
    raise AssertionError(f"{acked} records acknowledged and none refused: the disk never filled")


def test_a_leader_whose_disk_filled_takes_a_caught_up_follower_back_into_the_isr(
        tmp_path: Path) -> None:
    """Found by the mixed-fault soak: a follower outside the ISR, caught up
    and idle, when its leader's disk fills and frees. The leader rebuilds
    its partitions from disk and, with them, forgets the followers' log
    ends; the follower lists an idle partition in its fetch session only
    when its own log end moves, so it would never prove it had caught up,
    and a partition below min.insync.replicas, taking no appends, would
    never move again. Here the follower is kept out of the ISR by cutting
    it from etcd (its lease ends; a leader takes only live stores back)."""
    data_dir = tmp_path / "cluster"
    with store_disks(data_dir, size=TMPFS_SIZE) as disks, LocalCluster(
        data_dir, partition_stores=3, group_coordinators=0, etcd_members=1,
        network="namespaces", env={"ONCELOG_LEASE_TTL_S": "2"},
    ) as cluster:
        bootstrap = cluster.bootstrap_servers
        cluster.client_call(create_topic, bootstrap, TOPIC, 1)
        cluster.wait_in_sync([TOPIC])
        leader = cluster.partition_states([TOPIC])[(TOPIC, 0)].leader
        follower = next(i for i in range(3) if i != leader)
        cluster.cut([("partition_store", follower)], [("etcd", 0)])
        wait_until("the follower cut from etcd leaving the ISR",
                   lambda: follower not in cluster.partition_states(
                       [TOPIC], stores=[leader])[(TOPIC, 0)].isr, deadline_s=60)
        # Appends the follower copies (it still reaches the leader), but
        # cannot rejoin with: it is not live.
        filler = _fill(disks[leader])
        acked = cluster.client_call(write_until_refused, bootstrap, TOPIC)
        wait_until("the leader saying its disk is full",
                   lambda: _metric(cluster, "oncelog_store_disk_full", leader) == 1)
        filler.unlink()
        wait_until("the leader reopening its storage",
                   lambda: _metric(cluster, "oncelog_store_disk_full", leader) == 0,
                   deadline_s=60)
        cluster.heal()
        # Asked of the leader: the follower's own view, stale while it was
        # cut from etcd, may still count itself in.
        wait_until("the follower back in the ISR",
                   lambda: follower in cluster.partition_states(
                       [TOPIC], stores=[leader])[(TOPIC, 0)].isr, deadline_s=60)
        # The refused record may have been written too (an error after a
        # timeout is no proof it was not); the acknowledged ones all were.
        values = [value for _p, _o, value in
                  cluster.client_call(read_committed, bootstrap, TOPIC, 1)]
        assert values[:acked] == [_payload(i) for i in range(acked)]


# ------------------------------------------------------------ damaged files

RECORDS = 300
DAMAGED = 150  # the record whose bytes are flipped: the middle of the log


def _value(i: int) -> bytes:
    # Distinct and findable in RocksDB's files (compression is off).
    return b"rec-%06d-" % i + b"x" * 200


def _write(bootstrap: str, *, replication_factor: int) -> dict[int, int]:
    """RECORDS acknowledged records; value index -> offset."""
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=1, replication_factor=replication_factor)
    with Producer(bootstrap=bootstrap, linger_ms=1) as producer:
        futures = [producer.send(TOPIC, value=_value(i), partition=0) for i in range(RECORDS)]
        producer.flush()
        return {i: f.result().offset for i, f in enumerate(futures)}


def _rocksdb_files(cluster: LocalCluster, node_id: int, suffix: str) -> list[Path]:
    return sorted((cluster.data_dir / f"partition_store-{node_id}" / "rocksdb").glob(
        f"*{suffix}"))


def _flip_inside(files: list[Path], needle: bytes) -> Path:
    """Flips one byte inside `needle` in the file that holds it."""
    for path in files:
        data = path.read_bytes()
        at = data.find(needle)
        if at >= 0:
            with open(path, "r+b") as out:
                out.seek(at + len(needle) // 2)
                out.write(bytes([data[at + len(needle) // 2] ^ 0xFF]))
            return path
    raise AssertionError(f"no file of {[p.name for p in files]} holds {needle!r}")


def _refusal(cluster: LocalCluster, node_id: int) -> str:
    """The store's start fails: the message it exits with."""
    with pytest.raises(RuntimeError) as failed:
        cluster.restart("partition_store", node_id)
    return str(failed.value)


def _check_all_there(bootstrap: str, offsets: dict[int, int]) -> None:
    got = read_all(bootstrap, TOPIC, 1, deadline_s=120)
    assert [(r.offset, r.value) for r in got] == [
        (offsets[i], _value(i)) for i in range(RECORDS)]


@pytest.mark.parametrize("damage", ["flipped-wal", "truncated-sst"])
def test_a_single_copy_refuses_to_start_on_damage_found_when_opening(
        tmp_path: Path, damage: str) -> None:
    with LocalCluster(tmp_path / "cluster", group_coordinators=0) as cluster:
        _write(cluster.bootstrap, replication_factor=1)
        if damage == "flipped-wal":
            # kill -9: the records stay in the write-ahead log; a record in
            # its middle fails its checksum when the log is replayed.
            cluster.kill("partition_store", 0)
            broken = _flip_inside(_rocksdb_files(cluster, 0, ".log"), _value(DAMAGED))
        else:
            # A graceful stop leaves them in a table file, then cut short.
            cluster.terminate("partition_store", 0)
            [broken] = _rocksdb_files(cluster, 0, ".sst")[-1:]
            with open(broken, "r+b") as out:
                out.truncate(broken.stat().st_size // 2)
        message = _refusal(cluster, 0)
        assert "is damaged" in message and broken.name in message, message
        assert "only copy" in message, message


def test_a_single_copy_never_serves_a_damaged_batch_and_then_refuses_to_start(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", group_coordinators=0) as cluster:
        offsets = _write(cluster.bootstrap, replication_factor=1)
        cluster.terminate("partition_store", 0)
        broken = _flip_inside(_rocksdb_files(cluster, 0, ".sst"), _value(DAMAGED))
        # Opening checks no data block: it starts, and recovery (from the
        # snapshot taken at the graceful stop) does not read the log.
        cluster.restart("partition_store", 0)
        got: list[tuple[int, bytes | None]] = []
        with Consumer(bootstrap=cluster.bootstrap, isolation_level="read_uncommitted",
                      request_timeout_ms=5_000) as consumer:
            consumer.assign([TopicPartition(TOPIC, 0)])
            consumer.seek(TopicPartition(TOPIC, 0), 0)

            def stopped() -> bool:
                got.extend((r.offset, r.value) for r in _poll_quietly(consumer))
                return not cluster.alive("partition_store", 0)

            wait_until("the store stopping at the damaged batch", stopped, deadline_s=60)
        assert cluster.wait_exit("partition_store", 0) == EXIT_DAMAGED
        # What was served before it stopped is what was written.
        assert got == [(offsets[i], _value(i)) for i in range(len(got))]
        assert len(got) <= DAMAGED
        message = _refusal(cluster, 0)
        assert "is damaged" in message and broken.name in message, message


def _poll_quietly(consumer: Consumer) -> list[ConsumerRecord]:
    try:
        return consumer.poll(timeout=0.5)
    except OncelogError:
        return []


@pytest.mark.parametrize("damage", ["flipped-wal", "flipped-sst"])
def test_a_replica_with_damaged_files_starts_empty_and_is_rebuilt_from_the_leader(
        tmp_path: Path, damage: str) -> None:
    with LocalCluster(tmp_path / "cluster", partition_stores=3, group_coordinators=0,
                      etcd_members=1, env={"ONCELOG_LEASE_TTL_S": "2"}) as cluster:
        offsets = _write(cluster.bootstrap_servers, replication_factor=3)
        cluster.wait_in_sync([TOPIC])
        damaged = next(i for i in range(3)
                       if cluster.partition_states([TOPIC])[(TOPIC, 0)].leader != i)
        if damage == "flipped-wal":
            cluster.kill("partition_store", damaged)
            broken = _flip_inside(_rocksdb_files(cluster, damaged, ".log"), _value(DAMAGED))
            cluster.restart("partition_store", damaged)
        else:
            # A data block of a table file: only a read finds it, so this
            # start checks every stored batch first.
            cluster.terminate("partition_store", damaged)
            broken = _flip_inside(_rocksdb_files(cluster, damaged, ".sst"), _value(DAMAGED))
            cluster.restart("partition_store", damaged,
                            env={"ONCELOG_VERIFY_CHECKSUMS_ON_START": "1"})
        store_dir = cluster.data_dir / f"partition_store-{damaged}"
        [aside] = store_dir.glob("rocksdb.damaged-*")
        assert (aside / broken.name).exists()
        # Back in every ISR: it copied every partition again from its leader.
        cluster.wait_in_sync(timeout_s=120)
        assert damaged in cluster.partition_states([TOPIC])[(TOPIC, 0)].isr
        assert broken.name in cluster.log_tail("partition_store", damaged, lines=400)
        _check_all_there(cluster.bootstrap_servers, offsets)
