"""`kill -9` of the partition store in the middle of a stream of sends.

Method: an idempotent producer sends a numbered stream into two partitions
while the test SIGKILLs the store (after some sends were acknowledged) and
restarts it on the same data directory; the producer retries what was in
flight. Then the log is read back: every acknowledged record is there exactly
once, in send order, and each partition's batches carry contiguous sequence
numbers (no gap, no reuse). A second run also damages the newest producer-state
snapshot of each partition while the store is down, so recovery must fall back
to an older snapshot (or a replay) and still deduplicate the retries.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path

import grpc
import pytest

from oncelog import Admin, Producer, RecordMetadata
from oncelog import records as rec
from oncelog.testing import LocalCluster
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from services.partition_store.storage import keys
from services.partition_store.storage.port import WriteGroup
from services.partition_store.storage.rocksdb import RocksStore
from tests.support.reading import read_all

TOPIC = "stream"
PARTITIONS = 2
RECORDS = 20_000


def _damage_newest_snapshots(db_path: Path, topic_id: int) -> int:
    """Truncates the newest snapshot of each partition; returns how many."""
    store = RocksStore(db_path)
    damaged = 0
    try:
        group = WriteGroup()
        for partition in range(PARTITIONS):
            prefix = keys.partition_prefix(keys.SNAPSHOT, topic_id, partition)
            entries = list(store.scan(prefix, keys.next_prefix(prefix)))
            if entries:
                key, value = entries[-1]
                group.put(key, value[: len(value) // 2])
                damaged += 1
        store.write(group)
        store.sync()
    finally:
        store.close()
    return damaged


def _batch_sequences(bootstrap: str, partition: int) -> list[tuple[int, int, int]]:
    """(producer_id, base_sequence, record_count) of every batch, in log order."""
    out = []
    offset = 0
    with grpc.insecure_channel(bootstrap) as channel:
        stub = ps_grpc.PartitionStoreStub(channel)
        while True:
            resp = stub.Fetch(ps.FetchRequest(
                partitions=[ps.FetchPartition(topic=TOPIC, partition=partition,
                                              fetch_offset=offset, max_bytes=1 << 20)],
                max_wait_ms=0, max_bytes=1 << 20))
            result = resp.results[0]
            for batch in result.batches:
                h = rec.read_header(batch)
                out.append((h.producer_id, h.base_sequence, h.record_count))
            if result.next_fetch_offset >= result.high_watermark or not result.batches:
                return out
            offset = result.next_fetch_offset


@pytest.mark.parametrize("damage_snapshot", [False, True], ids=["clean", "damaged-snapshot"])
def test_kill9_mid_stream_keeps_every_ack_once(tmp_path: Path, damage_snapshot: bool) -> None:
    with LocalCluster(
        tmp_path, group_coordinators=0,
        # Frequent snapshots, so the crash lands after several of them.
        extra_args={"partition_store": ["--snapshot-interval-batches", "10"]},
    ) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS)
        with grpc.insecure_channel(cluster.bootstrap) as channel:
            meta = ps_grpc.PartitionStoreStub(channel).Metadata(ps.MetadataRequest(topics=[TOPIC]))
            topic_id = meta.topics[0].topic_id

        futures: list[Future[RecordMetadata]] = []
        with Producer(bootstrap=cluster.bootstrap, linger_ms=1, batch_size=4096) as producer:
            def send_all() -> None:
                for i in range(RECORDS):
                    futures.append(producer.send(TOPIC, value=b"%d" % i, partition=i % PARTITIONS))
                    if i % 500 == 0:
                        time.sleep(0.01)  # keep the stream going while the store dies

            sender = threading.Thread(target=send_all)
            sender.start()
            while sum(1 for f in list(futures) if f.done()) < RECORDS // 4:
                time.sleep(0.01)
            cluster.kill("partition_store", 0)
            done_at_kill = sum(1 for f in list(futures) if f.done())
            if damage_snapshot:
                damaged = _damage_newest_snapshots(
                    tmp_path / "partition_store-0" / "rocksdb", topic_id)
                assert damaged == PARTITIONS
            cluster.restart("partition_store", 0)
            sender.join()
            producer.flush()
            acked = [f.result(timeout=120) for f in futures]

        got = read_all(cluster.bootstrap, TOPIC, PARTITIONS)
        sequences = [_batch_sequences(cluster.bootstrap, p) for p in range(PARTITIONS)]

    assert len(acked) == RECORDS
    assert done_at_kill < RECORDS, "the store must die in the middle of the stream"
    values = [r.value for r in got]
    assert len(values) == len(set(values)), "a record was written twice"
    assert sorted(int(v) for v in values if v is not None) == list(range(RECORDS))
    for p in range(PARTITIONS):
        in_log = [int(r.value) for r in got if r.partition == p and r.value is not None]
        assert in_log == list(range(p, RECORDS, PARTITIONS)), "order within a partition"
        # Every acknowledgement names the offset the record really has.
        offsets = {int(r.value): r.offset for r in got if r.partition == p and r.value}
        for i in range(p, RECORDS, PARTITIONS):
            assert acked[i].offset == offsets[i]
        # One producer, contiguous sequence numbers from 0.
        expected_seq = 0
        producer_ids = {pid for pid, _, _ in sequences[p]}
        assert len(producer_ids) == 1
        for _pid, base_sequence, count in sequences[p]:
            assert base_sequence == expected_seq
            expected_seq = rec.next_sequence(expected_seq, count)
