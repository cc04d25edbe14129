"""The partition store as a real process, through raw gRPC stubs.

Goal: the wire contract of PartitionStore — create, produce, fetch, list
offsets, metadata, describe producers — and that every bad input gets the
right error code and a message naming what was wrong while the log stays
exactly as it was; and that acknowledged produces survive SIGKILL, with
retries of the last acknowledged batches answered as duplicates at their
original offsets after the restart.

Method: `python -m services.partition_store` in a subprocess on 127.0.0.1
with a free port and a tmp_path data dir, waiting for gRPC health SERVING;
batches encoded with oncelog.records.encode_batch; the process is killed by
the fixture's finalizer whatever happens. No assertion depends on timing.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from oncelog._batching import restamp_batch
from oncelog.errors import ErrorCode
from oncelog.records import (
    CRC_POS,
    CRC_START,
    LAST_OFFSET_DELTA_POS,
    MAGIC_POS,
    PARTITION_LEADER_EPOCH_POS,
    RECORD_COUNT_POS,
    crc32c,
    encode_batch,
    iter_records,
    read_header,
    stamp_batch,
)
from oncelog.testing import free_port
from oncelog.v1 import errors_pb2, partition_store_pb2_grpc, records_pb2
from oncelog.v1 import partition_store_pb2 as pb
from oncelog.wire.limits import CHANNEL_OPTIONS
from oncelog.wire.process import grpc_port_taken
from oncelog.wire.status import error_from_rpc

REPO = Path(__file__).resolve().parents[2]
STARTUP_DEADLINE_S = 60.0
# How many fresh ports a first start tries when another process takes the
# picked one between the pick and the bind.
PORT_ATTEMPTS = 5


class _PortTaken(Exception):
    pass


@dataclass
class StoreProcess:
    data_dir: Path
    port: int
    extra_args: tuple[str, ...] = ()
    node_id: int = 0
    # Every store's address, by node id (default: just this one).
    stores: str = ""
    proc: subprocess.Popen[bytes] | None = None
    channel: grpc.Channel | None = None
    starts: int = 0
    served: bool = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Starts the store and waits until it is SERVING. A first start of a
        store with a layout of its own moves to a fresh port when another
        process took the picked one; a restart keeps its address (clients
        and the data dir's layout know it), as does a store of a shared
        layout (the other stores name its port)."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start_once()
            except _PortTaken:
                if self.served or self.stores or attempt == PORT_ATTEMPTS:
                    raise
                self.port = free_port()
                continue
            self.served = True
            return

    def _start_once(self) -> None:
        self.starts += 1
        log_path = self.data_dir.parent / f"store-{self.node_id}-{self.starts}.log"
        with open(log_path, "wb") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.partition_store",
                 "--node-id", str(self.node_id), "--stores", self.stores or self.address,
                 "--data-dir", str(self.data_dir), *self.extra_args],
                cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        # The SDK's limits (64 MiB each way), as docs/grpc-api.md tells clients.
        self.channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        health = health_pb2_grpc.HealthStub(self.channel)
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while True:
            if self.proc.poll() is not None:
                text = log_path.read_text()
                if grpc_port_taken(text, self.address):
                    self.channel.close()
                    raise _PortTaken(text)
                raise AssertionError(f"store exited with {self.proc.returncode}:\n{text}")
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"store not SERVING in time:\n{log_path.read_text()}")
            time.sleep(0.05)

    @property
    def stub(self) -> partition_store_pb2_grpc.PartitionStoreStub:
        assert self.channel is not None
        return partition_store_pb2_grpc.PartitionStoreStub(self.channel)

    def kill(self) -> None:
        """SIGKILL: no shutdown snapshot, no flush beyond what was written."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _store(tmp_path: Path, *extra: str) -> Iterator[StoreProcess]:
    store = StoreProcess(tmp_path / "data", free_port(), extra)
    try:
        store.start()
        yield store
    finally:
        store.kill()


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreProcess]:
    yield from _store(tmp_path_factory.mktemp("store"))


# ------------------------------------------------------------------ helpers

NOW_MS = 1_700_000_000_000


def batch(seq: int, *, pid: int = 500, count: int = 3, ts_ms: int = NOW_MS,
          size: int = 10) -> bytes:
    return encode_batch(
        [(b"k%d" % i, b"%d-%d-" % (pid, seq + i) + b"x" * size, None, ts_ms + i)
         for i in range(count)],
        producer_id=pid, producer_epoch=0, base_sequence=seq,
    )


def create_topic(stub: partition_store_pb2_grpc.PartitionStoreStub, name: str,
                 partitions: int = 2, **config: str) -> int:
    reply = stub.CreateTopics(pb.CreateTopicsRequest(topics=[
        pb.TopicSpec(name=name, partitions=partitions,
                     config={k.replace("_", "."): v for k, v in config.items()})
    ]))
    [result] = reply.results
    assert result.error.code == 0, result.error
    return result.topic_id


def produce(stub: partition_store_pb2_grpc.PartitionStoreStub, topic: str, partition: int,
            data: bytes) -> pb.PartitionProduceResult:
    reply = stub.Produce(pb.ProduceRequest(
        batches=[pb.PartitionBatch(topic=topic, partition=partition, batch=data)]
    ))
    [result] = reply.results
    return result


def fetch_all(stub: partition_store_pb2_grpc.PartitionStoreStub, topic: str,
              partition: int) -> tuple[int, list[bytes]]:
    """(high watermark, every stored batch from the log start)."""
    offset = 0
    batches: list[bytes] = []
    while True:
        [result] = stub.Fetch(pb.FetchRequest(partitions=[
            pb.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)
        ])).results
        assert result.error.code == 0, result.error
        batches.extend(result.batches)
        if result.next_fetch_offset == offset:
            return result.high_watermark, batches
        offset = result.next_fetch_offset


def _code(error: errors_pb2.Error) -> ErrorCode:
    return ErrorCode.from_wire(error.code)


# -------------------------------------------------------------------- tests


def test_create_produce_fetch_list_offsets(shared_store: StoreProcess) -> None:
    stub = shared_store.stub
    topic_id = create_topic(stub, "payments", partitions=2)
    meta = stub.Metadata(pb.MetadataRequest(topics=["payments"]))
    assert [n.address for n in meta.stores] == [shared_store.address]
    assert meta.controller_node_id == 0
    [tmeta] = meta.topics
    assert tmeta.topic_id == topic_id and not tmeta.internal
    assert [(p.partition, p.leader_node_id) for p in tmeta.partitions] == [(0, 0), (1, 0)]
    assert tmeta.config["max.message.bytes"] == str(1024 * 1024)
    internal = stub.Metadata(pb.MetadataRequest(include_internal=True))
    assert {"__producer_ids", "__transaction_state", "__consumer_offsets"} <= {
        t.name for t in internal.topics
    }
    assert "__consumer_offsets" not in {t.name for t in stub.Metadata(pb.MetadataRequest()).topics}

    offsets = []
    for i in range(3):
        result = produce(stub, "payments", 1, batch(3 * i, ts_ms=NOW_MS + 1000 * i))
        assert result.error.code == 0, result.error
        assert not result.duplicate
        offsets.append(result.base_offset)
    assert offsets == [0, 3, 6]

    [fetched] = stub.Fetch(pb.FetchRequest(partitions=[
        pb.FetchPartition(topic="payments", partition=1, fetch_offset=4)
    ])).results
    assert fetched.high_watermark == 9 and fetched.last_stable_offset == 9
    assert fetched.next_fetch_offset == 9
    records = [r for b in fetched.batches for r in iter_records(b, min_offset=4)]
    assert [r.offset for r in records] == [4, 5, 6, 7, 8]
    assert records[0].value == b"500-4-" + b"x" * 10
    assert read_header(fetched.batches[0]).base_offset == 3  # whole batch, from 3

    committed = stub.Fetch(pb.FetchRequest(
        partitions=[pb.FetchPartition(topic="payments", partition=1, fetch_offset=0)],
        isolation_level=records_pb2.READ_COMMITTED,
    )).results[0]
    assert len(committed.batches) == 3

    listed = stub.ListOffsets(pb.ListOffsetsRequest(partitions=[
        pb.ListOffsetsPartition(topic="payments", partition=1, timestamp_ms=-2),
        pb.ListOffsetsPartition(topic="payments", partition=1, timestamp_ms=-1),
        pb.ListOffsetsPartition(topic="payments", partition=1, timestamp_ms=NOW_MS + 1001),
        pb.ListOffsetsPartition(topic="payments", partition=1, timestamp_ms=NOW_MS + 99_000),
    ])).results
    assert [(r.offset, r.timestamp_ms) for r in listed] == [
        (0, -1), (9, -1), (4, NOW_MS + 1001), (-1, -1)
    ]

    [described] = stub.DescribeProducers(pb.DescribeProducersRequest(partitions=[
        records_pb2.TopicPartition(topic="payments", partition=1)
    ])).results
    [view] = described.producers
    assert (view.producer_id, view.producer_epoch, view.last_sequence) == (500, 0, 8)
    assert view.current_txn_start_offset == -1

    # A marker must carry an epoch above the producer's (transaction version
    # 2); this one does not, so nothing is written (markers are covered in
    # test_store_txn_grpc.py).
    markers = stub.WriteTxnMarkers(pb.WriteTxnMarkersRequest(markers=[pb.TxnMarker(
        producer_id=500, producer_epoch=0, type=pb.COMMIT,
        partitions=[records_pb2.TopicPartition(topic="payments", partition=1)],
    )]))
    [marker] = markers.results
    assert _code(marker.error) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert "500" in marker.error.message and "payments-1" in marker.error.message
    assert fetch_all(stub, "payments", 1)[0] == 9

    # Duplicate of the last batch: same offset, nothing written.
    again = produce(stub, "payments", 1, batch(6, ts_ms=NOW_MS + 2000))
    assert again.duplicate and again.base_offset == 6
    assert fetch_all(stub, "payments", 1)[0] == 9


def _zero_record_batch() -> bytes:
    raw = bytearray(batch(0, count=1))
    struct.pack_into(">i", raw, LAST_OFFSET_DELTA_POS, -1)
    struct.pack_into(">i", raw, RECORD_COUNT_POS, 0)
    struct.pack_into(">I", raw, CRC_POS, crc32c(bytes(raw[CRC_START:])))
    return bytes(raw)


def _bad_crc_batch() -> bytes:
    raw = bytearray(batch(3))
    raw[-2] ^= 0x40
    return bytes(raw)


BAD_PRODUCE = [
    ("unknown topic", "nope", 0, batch(3), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "'nope'"),
    ("unknown partition", "strict", 7, batch(3), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
     "partition 7"),
    ("negative partition", "strict", -1, batch(3), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
     "partition -1"),
    ("over max.message.bytes", "strict", 0, batch(3, size=2000), ErrorCode.MESSAGE_TOO_LARGE,
     "max.message.bytes of 1024"),
    ("malformed bytes", "strict", 0, b"definitely not a record batch",
     ErrorCode.CORRUPT_MESSAGE, "shorter than"),
    ("bad crc", "strict", 0, _bad_crc_batch(), ErrorCode.CORRUPT_MESSAGE, "CRC32C"),
    ("empty batch", "strict", 0, b"", ErrorCode.INVALID_RECORD, "empty"),
    ("zero records", "strict", 0, _zero_record_batch(), ErrorCode.INVALID_RECORD, "no records"),
    ("sequence gap", "strict", 0, batch(9), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
     "expected sequence 3, received 9"),
    ("unknown producer not at 0", "strict", 0, batch(4, pid=9),
     ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, "producer 9"),
]

BAD_FETCH = [
    ("negative offset", "strict", 0, -1, ErrorCode.OFFSET_OUT_OF_RANGE, "offset -1"),
    ("offset past HW", "strict", 0, 4, ErrorCode.OFFSET_OUT_OF_RANGE, "high watermark 3"),
    ("unknown topic", "nope", 0, 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "'nope'"),
    ("unknown partition", "strict", 2, 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "partition 2"),
]

BAD_TOPICS = [
    ("bad!name", 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "'!'"),
    ("", 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "empty"),
    ("..", 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "not allowed"),
    ("x" * 250, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "250 characters"),
    ("__mine", 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "reserved"),
    ("no-partitions", 0, {}, ErrorCode.INVALID_PARTITIONS, "got 0"),
    ("bad-key", 1, {"segment.bytes": "1"}, ErrorCode.INVALID_CONFIG, "'segment.bytes'"),
    ("bad-value", 1, {"retention.ms": "forever"}, ErrorCode.INVALID_CONFIG, "retention.ms"),
    ("bad-policy", 1, {"cleanup.policy": "never"}, ErrorCode.INVALID_CONFIG, "cleanup.policy"),
    ("strict", 1, {}, ErrorCode.TOPIC_ALREADY_EXISTS, "already exists"),
]


def _request_error(call: Callable[[], object]) -> tuple[grpc.StatusCode, errors_pb2.Error]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    exc = info.value
    return exc.code(), error_from_rpc(exc)


def test_bad_input_gets_a_code_and_a_message_and_changes_nothing(
    shared_store: StoreProcess,
) -> None:
    stub = shared_store.stub
    create_topic(stub, "strict", partitions=2, max_message_bytes="1024")
    assert produce(stub, "strict", 0, batch(0)).base_offset == 0
    before = fetch_all(stub, "strict", 0)
    before_other = fetch_all(stub, "strict", 1)
    topics_before = {(t.name, t.topic_id) for t in stub.ListTopics(
        pb.ListTopicsRequest(include_internal=True)).topics}
    problems: list[tuple[object, ...]] = []

    for name, topic, partition, data, code, fragment in BAD_PRODUCE:
        produced = produce(stub, topic, partition, data)
        if _code(produced.error) != code or fragment not in produced.error.message:
            problems.append((name, produced.error))

    for name, topic, partition, offset, code, fragment in BAD_FETCH:
        [result] = stub.Fetch(pb.FetchRequest(partitions=[
            pb.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)
        ])).results
        if _code(result.error) != code or fragment not in result.error.message:
            problems.append((name, result.error))
        if result.next_fetch_offset != offset:
            problems.append((name, f"next_fetch_offset {result.next_fetch_offset}"))

    for name, partitions, config, code, fragment in BAD_TOPICS:
        [created] = stub.CreateTopics(pb.CreateTopicsRequest(topics=[
            pb.TopicSpec(name=name, partitions=partitions, config=config)
        ])).results
        if _code(created.error) != code or fragment not in created.error.message:
            problems.append((f"topic {name[:20]!r}", created.error))

    [deleted] = stub.DeleteTopics(pb.DeleteTopicsRequest(names=["nope"])).results
    if _code(deleted.error) != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        problems.append(("delete unknown", deleted.error))
    listed = stub.ListOffsets(pb.ListOffsetsRequest(partitions=[
        pb.ListOffsetsPartition(topic="strict", partition=9, timestamp_ms=-1),
        pb.ListOffsetsPartition(topic="strict", partition=0, timestamp_ms=-7),
    ])).results
    if [_code(r.error) for r in listed] != [
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_REQUEST
    ]:
        problems.append(("list offsets", listed))

    # Request-level problems: a gRPC status with our Error in the details.
    request_level = [
        ("empty produce", lambda: stub.Produce(pb.ProduceRequest()),
         grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST, "no batch"),
        ("same partition twice", lambda: stub.Produce(pb.ProduceRequest(batches=[
            pb.PartitionBatch(topic="strict", partition=0, batch=batch(3)),
            pb.PartitionBatch(topic="strict", partition=0, batch=batch(6)),
        ])), grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST, "strict-0"),
        ("negative max_bytes", lambda: stub.Fetch(pb.FetchRequest(
            partitions=[pb.FetchPartition(topic="strict", partition=0)], max_bytes=-1,
        )), grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_FETCH_SIZE, "max_bytes (-1)"),
        ("empty fetch", lambda: stub.Fetch(pb.FetchRequest()),
         grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST, "no partition"),
        ("empty create", lambda: stub.CreateTopics(pb.CreateTopicsRequest()),
         grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST, "no topic"),
    ]
    for name, call, status, code, fragment in request_level:
        got_status, error = _request_error(call)
        if got_status != status or _code(error) != code or fragment not in error.message:
            problems.append((name, got_status, error))

    assert not problems, "\n".join(repr(p) for p in problems)
    assert fetch_all(stub, "strict", 0) == before
    assert fetch_all(stub, "strict", 1) == before_other
    assert {(t.name, t.topic_id) for t in stub.ListTopics(
        pb.ListTopicsRequest(include_internal=True)).topics} == topics_before
    # And the producer can go on exactly where it was.
    assert produce(stub, "strict", 0, batch(3)).base_offset == 3


def test_a_fetch_answer_stays_within_a_grpc_message_whatever_max_bytes_asks(
    shared_store: StoreProcess,
) -> None:
    """Past 64 MiB the answer cannot be sent (RESOURCE_EXHAUSTED on every
    retry): the store caps a fetch at 50 MiB, as Kafka's broker caps one at
    its fetch.max.bytes, and only the first partition with data may go over
    what is left of it, by one batch."""
    stub = shared_store.stub
    create_topic(stub, "bulky", partitions=2, max_message_bytes=str(4 << 20))
    big = encode_batch([(b"k", b"x" * (3 << 20), None, NOW_MS)],
                       producer_id=900, producer_epoch=0, base_sequence=0)
    for seq in range(24):  # 72 MiB in partition 0
        data = restamp_batch(big, producer_id=900, producer_epoch=0, base_sequence=seq)
        assert produce(stub, "bulky", 0, data).error.code == 0
    assert produce(stub, "bulky", 1, big).error.code == 0
    unlimited = 2**31 - 1
    reply = stub.Fetch(pb.FetchRequest(
        partitions=[pb.FetchPartition(topic="bulky", partition=p, fetch_offset=0,
                                      max_bytes=unlimited) for p in (0, 1)],
        max_bytes=unlimited,
    ))
    first, second = reply.results
    assert first.error.code == 0 and second.error.code == 0
    got = sum(len(b) for b in first.batches)
    assert 0 < got <= 50 << 20 and got + len(big) > 50 << 20
    # Partition 1's batch did not fit what was left: nothing, and it is
    # fetched from the same offset next time.
    assert (list(second.batches), second.next_fetch_offset) == ([], 0)
    [alone] = stub.Fetch(pb.FetchRequest(partitions=[
        pb.FetchPartition(topic="bulky", partition=1, fetch_offset=0)])).results
    # As stored: the store stamps the leader epoch (0: a single copy).
    assert list(alone.batches) == [stamp_batch(big, base_offset=0, leader_epoch=0)]


def test_sigkill_keeps_every_acknowledged_batch_and_retries_dedup(tmp_path: Path) -> None:
    store = StoreProcess(tmp_path / "data", free_port(),
                         ("--fsync", "--snapshot-interval-batches", "7"))
    try:
        store.start()
        stub = store.stub
        create_topic(stub, "ledger", partitions=3)
        acked: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
        # Four producers, three partitions, 12 batches each; some requests in
        # flight together (futures) so group commits carry several batches.
        for round_ in range(12):
            futures = []
            for pid in range(600, 604):
                partition = pid % 3
                data = batch(3 * round_, pid=pid)
                futures.append((pid, partition, data, stub.Produce.future(pb.ProduceRequest(
                    batches=[pb.PartitionBatch(topic="ledger", partition=partition, batch=data)]
                ))))
            for pid, partition, data, future in futures:
                [result] = future.result().results
                assert result.error.code == 0, result.error
                acked.setdefault((pid, partition), []).append((result.base_offset, data))
        high_watermarks = {p: fetch_all(stub, "ledger", p)[0] for p in range(3)}
        store.kill()

        store.start()
        stub = store.stub
        for partition in range(3):
            hw, stored = fetch_all(stub, "ledger", partition)
            assert hw == high_watermarks[partition]
            by_offset = {read_header(b).base_offset: b for b in stored}
            for (_pid, p), batches in acked.items():
                if p != partition:
                    continue
                for offset, data in batches:
                    assert offset in by_offset, f"acknowledged batch at {p}/{offset} lost"
                    # Same bytes, apart from the base offset and the partition
                    # leader epoch the store set.
                    got = by_offset[offset]
                    assert got[8:PARTITION_LEADER_EPOCH_POS] == data[8:PARTITION_LEADER_EPOCH_POS]
                    assert got[MAGIC_POS:] == data[MAGIC_POS:]
        for (pid, partition), batches in acked.items():
            for offset, data in batches[-5:]:
                retry = produce(stub, "ledger", partition, data)
                assert retry.error.code == 0, retry.error
                assert retry.duplicate, f"producer {pid}: retry at {offset} appended again"
                assert retry.base_offset == offset
            nxt = produce(stub, "ledger", partition, batch(36, pid=pid))
            assert nxt.error.code == 0 and not nxt.duplicate
        for partition in range(3):
            assert fetch_all(stub, "ledger", partition)[0] > high_watermarks[partition]
    finally:
        store.kill()


def test_graceful_shutdown_snapshots(tmp_path: Path) -> None:
    """SIGTERM drains and snapshots: the next start replays nothing."""
    store = StoreProcess(tmp_path / "data", free_port())
    try:
        store.start()
        create_topic(store.stub, "calm", partitions=1)
        for i in range(5):
            assert produce(store.stub, "calm", 0, batch(3 * i)).error.code == 0
        store.stop()
        assert store.proc is not None and store.proc.returncode == 0
        store.start()
        log_text = (tmp_path / "store-0-2.log").read_text()
        assert "replayed 0 batches" in log_text, log_text
        assert fetch_all(store.stub, "calm", 0)[0] == 15
    finally:
        store.kill()


def test_two_nodes_share_the_catalog(tmp_path: Path) -> None:
    """Node 1 forwards topic changes to node 0 (the controller), learns topics
    from it, owns its share of the partitions, and drops the data of a
    deleted topic; a re-created topic starts empty under a new id."""
    ports = (free_port(), free_port())
    stores = ",".join(f"127.0.0.1:{p}" for p in ports)
    nodes = [
        StoreProcess(tmp_path / f"data{i}", ports[i], node_id=i, stores=stores)
        for i in range(2)
    ]
    try:
        for node in nodes:
            node.start()
        first_id = create_topic(nodes[1].stub, "spread", partitions=4)
        meta = nodes[1].stub.Metadata(pb.MetadataRequest(topics=["spread"]))
        assert [n.address for n in meta.stores] == stores.split(",")
        [tmeta] = meta.topics
        assert tmeta.topic_id == first_id
        leaders = {p.partition: p.leader_node_id for p in tmeta.partitions}
        assert set(leaders.values()) == {0, 1}
        for partition, leader in leaders.items():
            owner = nodes[leader].stub
            assert produce(owner, "spread", partition, batch(0)).base_offset == 0
            other = nodes[1 - leader].stub
            wrong = produce(other, "spread", partition, batch(3))
            assert _code(wrong.error) == ErrorCode.NOT_LEADER_OR_FOLLOWER
            assert f"store node {leader}" in wrong.error.message
        [gone] = nodes[1].stub.DeleteTopics(pb.DeleteTopicsRequest(names=["spread"])).results
        assert gone.error.code == 0 and gone.topic_id == first_id
        for node in nodes:
            names = {t.name for t in node.stub.ListTopics(pb.ListTopicsRequest()).topics}
            assert "spread" not in names
        second_id = create_topic(nodes[0].stub, "spread", partitions=4)
        assert second_id > first_id
        on_node1 = [p for p, leader in leaders.items() if leader == 1]
        [fresh] = nodes[1].stub.Fetch(pb.FetchRequest(partitions=[
            pb.FetchPartition(topic="spread", partition=on_node1[0], fetch_offset=0)
        ])).results
        assert fresh.error.code == 0 and fresh.high_watermark == 0
    finally:
        for node in nodes:
            node.kill()
