"""Compressed batches end to end: the SDK producer's compression_type, the
store's checks, compaction and ListOffsets.

Goal: a producer with each compression_type writes batches whose
attributes name that codec, and a consumer reads every record back under
both isolation levels. The store decodes nothing on produce for an
ordinary topic (a batch whose compressed records are garbage but whose CRC
is right is stored as it is), but for a compacted topic it decompresses to
read the keys: a record without a key is INVALID_RECORD, undecodable
records CORRUPT_MESSAGE. A codec id of 5-7 is INVALID_RECORD naming the
id. Compaction rewrites a compressed batch compressed with the same codec,
and ListOffsets by time finds a record inside a compressed batch.

Method: store behaviour through StoreRuntime over RocksStore in tmp_path
(asyncio.run); the SDK through one LocalCluster, with a raw gRPC Fetch to
see the stored attributes.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import grpc
import pytest

from oncelog import Admin, Producer
from oncelog import records as codec
from oncelog.errors import ErrorCode
from oncelog.testing import LocalCluster
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.wire.compression import Codec
from services.common.metadata.cluster import ClusterLayout
from services.partition_store.api import FetchItem, OffsetQuery, ProduceItem, TopicSpec
from services.partition_store.log.partition import Isolation
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.storage.rocksdb import RocksStore
from tests.support.reading import read_all

LAYOUT = ClusterLayout(stores=("127.0.0.1:1",))
NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000
CODECS = [c for c in Codec if c is not Codec.NONE]


def _rows(keys: list[bytes | None], ts: int = NOW_MS
          ) -> list[tuple[bytes | None, bytes | None, None, int]]:
    return [(key, b"value %d " % i * 20, None, ts + i) for i, key in enumerate(keys)]


def _with_records_part(batch: bytes, records: bytes, attributes: int) -> bytes:
    """The batch's header with another records part and attributes, its
    length and CRC made right (damage a producer's bug could cause)."""
    buf = bytearray(batch[:codec.HEADER_SIZE_BYTES] + records)
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">h", buf, codec.ATTRIBUTES_POS, attributes)
    struct.pack_into(">I", buf, codec.CRC_POS, codec.crc32c(memoryview(buf)[codec.CRC_START:]))
    return bytes(buf)


async def _open(path: Path) -> StoreRuntime:
    config = StoreConfig(
        node_id=0, layout=LAYOUT, snapshot_interval_batches=10_000,
        snapshot_interval_ms=10 * HOUR_MS, retention_check_interval_ms=10 * HOUR_MS,
        compaction_interval_ms=10 * HOUR_MS, unsafe_skip_txn_verification=True,
    )
    rt = StoreRuntime(RocksStore(path), config, clock_ms=lambda: NOW_MS)
    await rt.start()
    outs = await rt.create_topics([TopicSpec("plain", 1, {}),
                                   TopicSpec("kept", 1, {"cleanup.policy": "compact"})],
                                  validate_only=False)
    assert all(out.error is None for out in outs), outs
    return rt


async def _produce(rt: StoreRuntime, topic: str, batch: bytes) -> tuple[ErrorCode | None, str]:
    [out] = await rt.produce([ProduceItem(topic, 0, batch)])
    if out.error is None:
        return None, ""
    return out.error.code, out.error.message


async def _read(rt: StoreRuntime, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    offset = 0
    out: list[tuple[int, bytes | None, bytes | None]] = []
    while True:
        [fetched] = await rt.fetch([FetchItem(topic, 0, offset)],
                                   isolation=Isolation.READ_UNCOMMITTED)
        for data in fetched.batches:
            out.extend((r.offset, r.key, r.value)
                       for r in codec.iter_records(data, min_offset=offset))
        if fetched.next_fetch_offset == offset:
            return out
        offset = fetched.next_fetch_offset


def test_the_store_checks_compressed_batches_only_where_it_must(tmp_path: Path) -> None:
    async def body() -> None:
        rt = await _open(tmp_path / "db")
        try:
            for compression in CODECS:
                keyed = codec.encode_batch(_rows([b"a", b"b"]), compression=compression)
                assert codec.read_header(keyed).compression is compression
                assert await _produce(rt, "kept", keyed) == (None, "")
                null_key = codec.encode_batch(_rows([b"a", None, b"c"]),
                                              compression=compression)
                code, message = await _produce(rt, "kept", null_key)
                assert code is ErrorCode.INVALID_RECORD
                assert "record 1 of the batch has none" in message
                garbage = _with_records_part(keyed, b"\x07" * 40, int(compression))
                code, message = await _produce(rt, "kept", garbage)
                assert code is ErrorCode.CORRUPT_MESSAGE, message
                assert compression.name.lower() in message
                # An ordinary topic stores it unread: the store does not decode.
                assert await _produce(rt, "plain", garbage) == (None, "")
            for codec_id in (5, 6, 7):
                plain = codec.encode_batch(_rows([b"a"]))
                bad = _with_records_part(plain, plain[codec.HEADER_SIZE_BYTES:], codec_id)
                for topic in ("plain", "kept"):
                    code, message = await _produce(rt, topic, bad)
                    assert code is ErrorCode.INVALID_RECORD
                    assert f"compression codec is {codec_id}" in message
        finally:
            await rt.close()

    asyncio.run(body())


@pytest.mark.parametrize("compression", CODECS, ids=lambda c: c.name.lower())
def test_compaction_and_time_lookups_read_compressed_batches(tmp_path: Path,
                                                             compression: Codec) -> None:
    async def body() -> None:
        rt = await _open(tmp_path / "db")
        try:
            for round_ in range(3):
                batch = codec.encode_batch(
                    _rows([b"k%d" % i for i in range(8)], ts=NOW_MS + 1_000 * round_),
                    compression=compression)
                assert await _produce(rt, "kept", batch) == (None, "")
            # By time: inside the second batch, compressed.
            [found] = await rt.list_offsets([OffsetQuery("kept", 0, NOW_MS + 1_003)],
                                            isolation=Isolation.READ_UNCOMMITTED)
            assert (found.offset, found.timestamp_ms) == (11, NOW_MS + 1_003)
            before = await _read(rt, "kept")
            [report] = await rt.run_compaction_once(force=True)
            # The newest batch is never cleaned; below it, the second batch
            # holds every key's newest record and the first goes.
            assert (report.batches_dropped, report.records_removed) == (1, 8)
            assert await _read(rt, "kept") == before[8:]
            part = rt.partition("kept", 0)
            stored = [(h.base_offset, h.compression) for h, _v in part.read_stored(0, 24)]
            assert stored == [(8, compression), (16, compression)]
        finally:
            await rt.close()

    asyncio.run(body())


def test_the_producer_compresses_with_each_codec_and_the_consumer_reads_it(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path, group_coordinators=0) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            for name in ("none", *(c.name.lower() for c in CODECS)):
                admin.create_topic(f"t-{name}", partitions=1)
        for name in ("none", *(c.name.lower() for c in CODECS)):
            topic = f"t-{name}"
            with Producer(bootstrap=cluster.bootstrap, compression_type=name,
                          linger_ms=50) as producer:
                futures = [producer.send(topic, key=b"k%d" % (i % 10),
                                         value=b"compressible %d " % i * 10,
                                         headers=[("n", b"%d" % i)] if i % 3 else None,
                                         partition=0)
                           for i in range(500)]
                producer.flush()
                assert [f.result(timeout=30).offset for f in futures] == list(range(500))
            for isolation in ("read_uncommitted", "read_committed"):
                got = read_all(cluster.bootstrap, topic, 1, isolation_level=isolation)
                assert [(r.offset, r.key, r.value, r.headers) for r in got] == [
                    (i, b"k%d" % (i % 10), b"compressible %d " % i * 10,
                     (("n", b"%d" % i),) if i % 3 else ()) for i in range(500)]
            with grpc.insecure_channel(cluster.bootstrap) as channel:
                fetched = ps_grpc.PartitionStoreStub(channel).Fetch(ps.FetchRequest(
                    partitions=[ps.FetchPartition(topic=topic, partition=0, fetch_offset=0,
                                                  max_bytes=1 << 20)],
                    max_wait_ms=0, max_bytes=1 << 20))
            codecs = {codec.read_header(b).compression for b in fetched.results[0].batches}
            assert codecs == {Codec[name.upper()]}
