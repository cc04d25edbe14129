"""The Node.js client example (examples/node) against a real cluster.

Goal: the protos and docs/grpc-api.md are enough to be correct from another
language. A client written in Node.js from them alone encodes record batches
(Kafka's varint records) byte for byte as the Python codec does (CRC32C
included) and decodes what the Python codec writes, gzip-compressed batches
both ways too (it refuses the codecs it does not carry, naming them); it
runs whole transactions (FindCoordinator, InitProducerId,
AddPartitionsToTxn, Produce, EndTxn) with the transaction
version 2 rules (a new epoch from every EndTxn, sequences from 0 again), gets
`duplicate` for a re-sent batch, retries CONCURRENT_TRANSACTIONS while an
earlier instance's transaction is aborted, and reads back with a
read_committed Fetch exactly the records it committed. Python then checks on
its own (oncelog.Consumer, read_committed and read_uncommitted, and the raw
batch headers) that exactly those records are visible, at the offsets Node
reported, and that the aborted ones were written but are never returned.
Errors: Node reads a request-level error from the gRPC status details, and
a batch refused in its partition result makes it abort the transaction.
On a TLS + ACL cluster (LocalCluster(security=True)), Node connects with the
CA and a client certificate from the environment (ONCELOG_SSL_*, the CLI's
variables) as a principal that holds only Write on the topic and the
transactional id and Read on the topic, and its transactions are read back
exactly.

Method: the Node programs run as subprocesses (node and the packages from
examples/node/package-lock.json are installed by scripts/setup.sh, so this
test needs no network). The codec is compared through examples/node/codec_tool.js
(JSON in, JSON out). The transaction test uses one LocalCluster; a Python
transactional producer with the same transactional id leaves a transaction
open first, so Node's InitProducerId must fence it (the coordinator answers
CONCURRENT_TRANSACTIONS until the abort is done: the first answer always is).
A missing node fails the test instead of skipping it: setup installs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from oncelog import (
    AclBinding,
    Admin,
    Consumer,
    ConsumerRecord,
    Producer,
    TopicPartition,
    errors,
)
from oncelog import records as codec
from oncelog.testing import LocalCluster
from oncelog.v1 import partition_store_pb2, partition_store_pb2_grpc, records_pb2
from oncelog.wire.compression import Codec

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "examples" / "node"
# A failure guard only: each Node program finishes in a second or two.
NODE_TIMEOUT_S = 120
PARTITION = 1


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed; bash scripts/setup.sh installs it (apt-get nodejs npm)")
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.fail(f"{NODE_DIR}/node_modules is missing; bash scripts/setup.sh runs npm ci there")
    return node


def run_node(*args: str, stdin: str | None = None, check: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [_node(), *args], cwd=NODE_DIR, input=stdin, capture_output=True, text=True,
        timeout=NODE_TIMEOUT_S, env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"node {' '.join(args)} exited {proc.returncode}\nstdout: {proc.stdout}\n"
            f"stderr: {proc.stderr}"
        )
    return proc


def codec_tool(command: str, payload: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(
        run_node("codec_tool.js", command, stdin=json.dumps(payload)).stdout
    )
    return out


def _hex(b: bytes | None) -> str | None:
    return None if b is None else b.hex()


def _unhex(h: str | None) -> bytes | None:
    return None if h is None else bytes.fromhex(h)


# (key, value, headers, timestamp_ms): every shape the layout has — null key,
# null value, empty bytes, no headers, a null header value, non-ASCII header
# keys, timestamps out of order (the base is the minimum), a larger value.
CODEC_RECORDS: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]] = [
    (b"acct-1", b"-100", [("writer", b"node"), ("trace", None)], 1_700_000_000_123),
    (None, b"no key", [], 1_700_000_000_100),
    (b"k", None, [("h\u00e9ader", b"")], 1_700_000_000_200),
    (b"", b"", [], 1_700_000_000_150),
    (b"big", bytes(range(256)) * 40, [("a", b"1"), ("b", b"2"), ("c", None)], 1_700_000_000_100),
]


@pytest.mark.parametrize(
    ("producer_id", "producer_epoch", "base_sequence", "transactional"),
    [(-1, -1, -1, False), (7, 3, 2**31 - 2, False), (2**40 + 5, 32766, 0, True)],
)
def test_node_encodes_batches_byte_for_byte_as_python(
    producer_id: int, producer_epoch: int, base_sequence: int, transactional: bool
) -> None:
    expected = codec.encode_batch(
        CODEC_RECORDS, producer_id=producer_id, producer_epoch=producer_epoch,
        base_sequence=base_sequence, transactional=transactional,
    )
    out = codec_tool("encode", {
        "records": [
            {"key": _hex(k), "value": _hex(v), "headers": [[hk, _hex(hv)] for hk, hv in h],
             "timestamp_ms": ts}
            for k, v, h, ts in CODEC_RECORDS
        ],
        "producer_id": str(producer_id), "producer_epoch": producer_epoch,
        "base_sequence": base_sequence, "transactional": transactional,
    })
    node_batch = bytes.fromhex(out["batch"])
    assert node_batch == expected
    header = codec.validate_batch(node_batch, max_size_bytes=len(node_batch))
    assert header.is_transactional is transactional
    assert [(r.key, r.value, list(r.headers), r.timestamp_ms)
            for r in codec.iter_records(node_batch)] == [
        (k, v, h, ts) for k, v, h, ts in CODEC_RECORDS]


def test_node_decodes_what_python_encodes() -> None:
    # As the store appends it: base offset and partition leader epoch stamped.
    batch = codec.stamp_batch(
        codec.encode_batch(CODEC_RECORDS, producer_id=11, producer_epoch=2, base_sequence=5,
                           transactional=True),
        base_offset=1000, leader_epoch=4,
    )
    # min_offset skips the records below it, as a Fetch reader must.
    out = codec_tool("decode", {"batch": batch.hex(), "min_offset": 1002})
    assert out["header"] == {
        "base_offset": 1000, "partition_leader_epoch": 4,
        "attributes": codec.ATTR_TRANSACTIONAL, "compression": "none", "is_transactional": True,
        "is_control": False, "producer_id": "11", "producer_epoch": 2, "base_sequence": 5,
        "record_count": len(CODEC_RECORDS), "base_timestamp_ms": 1_700_000_000_100,
        "max_timestamp_ms": 1_700_000_000_200,
    }
    assert [(r["offset"], _unhex(r["key"]), _unhex(r["value"]),
             [(hk, _unhex(hv)) for hk, hv in r["headers"]], r["timestamp_ms"])
            for r in out["records"]] == [
        (r.offset, r.key, r.value, list(r.headers), r.timestamp_ms)
        for r in codec.iter_records(batch, min_offset=1002)]

    # A damaged byte is refused by the CRC check, naming the CRC.
    damaged = bytearray(batch)
    damaged[-1] ^= 0xFF
    proc = run_node("codec_tool.js", "decode", stdin=json.dumps({"batch": damaged.hex()}),
                    check=False)
    assert proc.returncode == 1
    assert "CRC32C" in proc.stderr


def test_gzip_batches_go_both_ways() -> None:
    # zlib builds differ (node bundles its own), so the compressed bytes may
    # too: each side reads the other's instead of comparing bytes.
    rows = [(k, v, h, ts) for k, v, h, ts in CODEC_RECORDS] * 20
    out = codec_tool("encode", {
        "records": [
            {"key": _hex(k), "value": _hex(v), "headers": [[hk, _hex(hv)] for hk, hv in h],
             "timestamp_ms": ts}
            for k, v, h, ts in rows
        ],
        "compression": "gzip",
    })
    node_batch = bytes.fromhex(out["batch"])
    header = codec.validate_batch(node_batch, max_size_bytes=len(node_batch))
    assert header.compression is Codec.GZIP
    assert [(r.key, r.value, list(r.headers), r.timestamp_ms)
            for r in codec.iter_records(node_batch)] == rows

    batch = codec.stamp_batch(codec.encode_batch(rows, compression=Codec.GZIP),
                              base_offset=50, leader_epoch=1)
    assert codec.read_header(batch).compression is Codec.GZIP
    out = codec_tool("decode", {"batch": batch.hex(), "min_offset": 0})
    assert out["header"]["compression"] == "gzip"
    assert [(r["offset"], _unhex(r["key"]), _unhex(r["value"]),
             [(hk, _unhex(hv)) for hk, hv in r["headers"]], r["timestamp_ms"])
            for r in out["records"]] == [
        (r.offset, r.key, r.value, list(r.headers), r.timestamp_ms)
        for r in codec.iter_records(batch)]


@pytest.mark.parametrize("compression", [Codec.SNAPPY, Codec.LZ4, Codec.ZSTD],
                         ids=lambda c: c.name.lower())
def test_node_refuses_the_codecs_it_does_not_carry(compression: Codec) -> None:
    batch = codec.encode_batch([(b"k", b"v" * 1000, None, 1)], compression=compression)
    assert codec.read_header(batch).compression is compression
    proc = run_node("codec_tool.js", "decode", stdin=json.dumps({"batch": batch.hex()}),
                    check=False)
    assert proc.returncode == 1
    assert f"compressed with {compression.name.lower()} (codec {int(compression)})" in (
        proc.stderr)
    proc = run_node("codec_tool.js", "encode", check=False, stdin=json.dumps({
        "records": [{"key": None, "value": "00", "timestamp_ms": 1}],
        "compression": compression.name.lower()}))
    assert proc.returncode == 1
    assert "compression must be one of none, gzip" in proc.stderr


def test_node_crc32c_matches_python() -> None:
    data = bytes((i * 31 + 7) % 256 for i in range(4099))
    for chunk in (b"", b"123456789", data):
        assert codec_tool("crc32c", {"data": chunk.hex()})["crc32c"] == codec.crc32c(chunk)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("node") / "cluster", group_coordinators=0) as c:
        yield c


def read_partition(bootstrap: str, tp: TopicPartition, isolation_level: str,
                   until_offset: int) -> list[ConsumerRecord]:
    """Records of one partition from 0 until the position passes until_offset
    (Consumer checks every batch's CRC); bounded so a bug fails the test."""
    out: list[ConsumerRecord] = []
    with Consumer(bootstrap=bootstrap, isolation_level=isolation_level) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        for _ in range(240):
            out.extend(consumer.poll(timeout=0.5))
            if consumer.position(tp) > until_offset:
                return out
    raise AssertionError(f"{tp}: the {isolation_level} position never passed {until_offset}")


def raw_batches(bootstrap: str, tp: TopicPartition) -> list[bytes]:
    """Every stored data batch of a partition, read_uncommitted, straight off the wire."""
    with grpc.insecure_channel(bootstrap) as channel:
        reply = partition_store_pb2_grpc.PartitionStoreStub(channel).Fetch(
            partition_store_pb2.FetchRequest(
                partitions=[partition_store_pb2.FetchPartition(
                    topic=tp.topic, partition=tp.partition, fetch_offset=0,
                    max_bytes=1 << 20)],
                max_bytes=1 << 20,
                isolation_level=records_pb2.IsolationLevel.READ_UNCOMMITTED,
            ),
            timeout=30,
        )
    return list(reply.results[0].batches)


def as_json(r: ConsumerRecord) -> dict[str, Any]:
    """A record as the Node example reports it (its keys and values are text)."""
    return {
        "offset": r.offset,
        "key": None if r.key is None else r.key.decode(),
        "value": None if r.value is None else r.value.decode(),
        "headers": [[k, None if v is None else v.decode()] for k, v in r.headers],
    }


def test_node_transactions_are_read_back_exactly(cluster: LocalCluster, topic_name: str
                                                 ) -> None:
    tp = TopicPartition(topic_name, PARTITION)
    transactional_id = f"node-{topic_name}"
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)

    # An earlier instance with the same transactional id leaves a transaction
    # open on the partition: Node's InitProducerId must fence it and abort it.
    zombie = Producer(bootstrap=cluster.bootstrap, transactional_id=transactional_id)
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie_sent = [zombie.send(topic_name, value=b"zombie-%d" % i, partition=PARTITION)
                       for i in range(3)]
        zombie.flush()
        zombie_offsets = [f.result(timeout=60).offset for f in zombie_sent]

        proc = run_node("transaction_example.js", "--bootstrap", cluster.bootstrap,
                        "--topic", topic_name, "--partition", str(PARTITION),
                        "--transactional-id", transactional_id, "--timeout-ms", "60000",
                        # From the start: past the zombie's aborted records.
                        "--from-offset", "0")
        report = json.loads(proc.stdout)

        late = zombie.send(topic_name, value=b"zombie-late", partition=PARTITION)
        assert isinstance(late.exception(timeout=60),
                          errors.ProducerFencedError | errors.InvalidProducerEpochError)
    finally:
        zombie.close()

    assert report["ok"] is True
    assert report["init_retries"].get("CONCURRENT_TRANSACTIONS", 0) >= 1
    assert report["init_epoch"] > zombie.producer_epoch
    txn1, txn2, txn3 = report["transactions"]
    assert [t["outcome"] for t in (txn1, txn2, txn3)] == ["commit", "abort", "commit"]
    # Transaction version 2: every EndTxn hands out the next epoch, and each
    # transaction numbers its batches from sequence 0 again.
    assert txn1["producer_epoch"] == report["init_epoch"]
    for before, after in ((txn1, txn2), (txn2, txn3)):
        assert after["producer_epoch"] == before["next_epoch"] == before["producer_epoch"] + 1
    assert [b["base_sequence"] for b in txn1["batches"]] == [0, 3]
    assert [b["base_sequence"] for b in txn2["batches"] + txn3["batches"]] == [0, 0]
    assert txn1["resent_batch"] == {"base_offset": txn1["batches"][1]["base_offset"],
                                    "duplicate": True}

    committed = [r for t in (txn1, txn3) for b in t["batches"] for r in b["records"]]
    aborted = [r for b in txn2["batches"] for r in b["records"]]
    last_offset = committed[-1]["offset"]

    # Python's reader, on its own: exactly Node's committed records, at the
    # offsets Node reported; the zombie's and the aborted ones never.
    seen = [as_json(r) for r in read_partition(cluster.bootstrap, tp, "read_committed",
                                               last_offset)]
    assert seen == committed
    assert report["read_committed"] == committed
    # The aborted records were written (read_uncommitted has them, where Node
    # said), so read_committed left them out rather than never seeing them.
    everything = {r.offset: as_json(r) for r in read_partition(
        cluster.bootstrap, tp, "read_uncommitted", last_offset)}
    for r in aborted + committed:
        assert everything[r["offset"]] == r
    assert set(zombie_offsets) <= set(everything)

    # Node's batches as stored: valid for the Python codec (CRC included),
    # transactional, under the producer id and epochs Node reported.
    stored = [codec.validate_batch(raw, max_size_bytes=len(raw))
              for raw in raw_batches(cluster.bootstrap, tp)]
    from_node = [h for h in stored
                 if h.producer_id == int(report["producer_id"]) and not h.is_control
                 and h.producer_epoch >= report["init_epoch"]]
    assert [(h.base_offset, h.base_sequence, h.producer_epoch, h.is_transactional)
            for h in from_node] == [
        (b["base_offset"], b["base_sequence"], t["producer_epoch"], True)
        for t in (txn1, txn2, txn3) for b in t["batches"]]


def test_node_client_names_a_missing_topic(cluster: LocalCluster) -> None:
    # Checked before anything is sent: a clear error naming the topic.
    proc = run_node("transaction_example.js", "--bootstrap", cluster.bootstrap,
                    "--topic", "no-such-topic", check=False)
    assert proc.returncode == 1
    assert 'topic "no-such-topic" does not exist' in proc.stderr


def test_node_client_reads_the_error_from_the_status_details(cluster: LocalCluster,
                                                             topic_name: str) -> None:
    # The coordinator refuses the timeout with a gRPC status (INVALID_ARGUMENT)
    # whose details carry oncelog.v1.Error; Node reports the code and message
    # from there, not from the bare status.
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    proc = run_node("transaction_example.js", "--bootstrap", cluster.bootstrap,
                    "--topic", topic_name, "--partition", "0",
                    "--transaction-timeout-ms", "0", check=False)
    assert proc.returncode == 1
    assert ("INVALID_TRANSACTION_TIMEOUT: transaction timeout 0 ms is outside 1..900000 ms"
            in proc.stderr)


def test_node_client_aborts_a_transaction_whose_batch_is_refused(cluster: LocalCluster,
                                                                 topic_name: str) -> None:
    # The store refuses the first batch in its partition result
    # (MESSAGE_TOO_LARGE, not retriable): the transaction cannot commit, so
    # Node aborts it before exiting, and names the error.
    transactional_id = f"node-{topic_name}"
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, config={"max.message.bytes": "100"})
    proc = run_node("transaction_example.js", "--bootstrap", cluster.bootstrap,
                    "--topic", topic_name, "--transactional-id", transactional_id, check=False)
    assert proc.returncode == 1
    assert "MESSAGE_TOO_LARGE" in proc.stderr
    assert "over the topic's max.message.bytes of 100" in proc.stderr
    with Admin(bootstrap=cluster.bootstrap) as admin:
        txn = admin.describe_transaction(transactional_id)
    # EndTxn(abort) went through: the abort is decided (its marker may still
    # be on its way) and the epoch moved from the new id's 0 to 1.
    assert txn.state in ("PrepareAbort", "CompleteAbort")
    assert txn.producer_epoch == 1


def test_node_follows_a_partition_leader_that_moved(tmp_path: Path) -> None:
    """On a replicated cluster (3 stores, etcd): the partition's leader is
    kill -9'd before the Node client starts, bootstrapping from a store that
    does not lead it: Node finds the new leader through Metadata alone and
    its transactions are read back exactly."""
    topic = "node-moved"
    with LocalCluster(tmp_path / "cluster", partition_stores=3, group_coordinators=0,
                      etcd_members=1, env={"ONCELOG_LEASE_TTL_S": "2"}) as replicated:
        with Admin(bootstrap=replicated.bootstrap_servers) as admin:
            admin.create_topic(topic, partitions=2, replication_factor=3)
            leader = admin.describe_topic(topic).partitions[PARTITION].leader_node_id
        replicated.kill("partition_store", leader)
        bootstrap = replicated.address("partition_store", (leader + 1) % 3)
        proc = run_node("transaction_example.js", "--bootstrap", bootstrap,
                        "--topic", topic, "--partition", str(PARTITION),
                        "--transactional-id", "node-moved", "--timeout-ms", "60000",
                        "--from-offset", "0")
        report = json.loads(proc.stdout)
        assert report["ok"] is True
        committed = [r for t in report["transactions"] if t["outcome"] == "commit"
                     for b in t["batches"] for r in b["records"]]
        seen = [as_json(r) for r in read_partition(
            bootstrap, TopicPartition(topic, PARTITION), "read_committed",
            committed[-1]["offset"])]
        assert seen == committed
        with Admin(bootstrap=bootstrap) as admin:
            assert admin.describe_topic(topic).partitions[PARTITION].leader_node_id != leader


def test_node_runs_its_transactions_on_a_secured_cluster(tmp_path: Path) -> None:
    topic, transactional_id = "node-secured", "node-secured-tx"
    with LocalCluster(tmp_path / "cluster", security=True, group_coordinators=0) as secured:
        admin_config = secured.client_config("admin")
        with Admin(bootstrap=secured.bootstrap, **admin_config) as admin:
            admin.create_topic(topic, partitions=2)
            admin.create_acls([
                AclBinding(principal="User:node-app", resource_type="topic",
                           resource_name=topic, operation=operation)
                for operation in ("write", "read")
            ] + [AclBinding(principal="User:node-app", resource_type="transactional_id",
                            resource_name=transactional_id, operation="write")])
        node_app = secured.client_config("node-app")
        env = {"ONCELOG_SSL_CAFILE": node_app["ssl_cafile"],
               "ONCELOG_SSL_CERTFILE": node_app["ssl_certfile"],
               "ONCELOG_SSL_KEYFILE": node_app["ssl_keyfile"]}
        args = ("transaction_example.js", "--bootstrap", secured.bootstrap, "--topic", topic,
                "--partition", str(PARTITION), "--transactional-id", transactional_id,
                "--timeout-ms", "60000", "--from-offset", "0")

        # ACLs reach every service within the cluster's refresh interval:
        # the first attempt may meet the old ones (refused, nothing written).
        deadline = time.monotonic() + 60
        while True:
            proc = run_node(*args, env=env, check=False)
            if proc.returncode == 0 or "AUTHORIZATION_FAILED" not in proc.stderr:
                break
            assert time.monotonic() < deadline, proc.stderr
            time.sleep(0.2)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["ok"] is True
        committed = [r for t in report["transactions"] if t["outcome"] == "commit"
                     for b in t["batches"] for r in b["records"]]
        tp = TopicPartition(topic, PARTITION)
        with Consumer(bootstrap=secured.bootstrap, isolation_level="read_committed",
                      **admin_config) as consumer:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            seen: list[ConsumerRecord] = []
            while consumer.position(tp) <= committed[-1]["offset"]:
                assert time.monotonic() < deadline, "the committed records never showed"
                seen.extend(consumer.poll(timeout=0.5))
        assert [as_json(r) for r in seen] == committed
