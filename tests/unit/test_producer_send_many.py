"""Producer.send_many against the real store and coordinator, with faults.

Goal: send_many() is send() for many records at once. Its future resolves
to each record's metadata in the order given, also when the records span
several batches; records land in that order, once, where send() would put
them (by key, else the sticky partition, else the partition named); a
record over max.message.bytes, bad arguments and an unknown topic queue
nothing; a batch the store fails fails the call's future with that error;
inside a transaction its records commit and abort with the transaction, and
a failure breaks it (commit_transaction raises); serializers apply.

Method: tests/support/inprocess_cluster.InProcessCluster (the real store
and transaction coordinator in this process, a produce fault plan to fail a
batch); the log is read back through the store.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from oncelog import Producer, errors
from oncelog._partitioner import partition_for_key
from oncelog.errors import ErrorCode
from tests.support.inprocess_cluster import BatchView, InProcessCluster

PARTITIONS = 4


@pytest.fixture
def store() -> Iterator[InProcessCluster]:
    with InProcessCluster(group_coordinator=False) as s:
        s.create_topic("t", PARTITIONS)
        s.create_topic("small", 1, {"max.message.bytes": "2000"})
        yield s


def test_the_result_is_in_the_order_given_across_batches(store: InProcessCluster) -> None:
    values = [b"v%03d" % i for i in range(300)]
    # Batches of ~10 records: the call's records span about 30 of them.
    with Producer(bootstrap=store.address, linger_ms=1, batch_size=400) as producer:
        producer.send("t", value=b"before", partition=2).result()
        sent = producer.send_many("t", values, partition=2, timestamp_ms=1234).result()
    assert [m.offset for m in sent] == list(range(1, 301))
    assert {(m.topic, m.partition, m.timestamp_ms) for m in sent} == {("t", 2, 1234)}
    assert sent[-1].offset == 300 and len(sent) == 300
    assert len(store.headers("t", 2)) > 10
    assert store.data_values("t", 2) == [b"before", *values]


def test_keys_place_records_as_send_does(store: InProcessCluster) -> None:
    keys = [b"acct-%d" % i for i in range(40)]
    with Producer(bootstrap=store.address, linger_ms=1) as producer:
        sent = producer.send_many("t", [b"x"] * len(keys), keys=keys).result()
    for key, meta in zip(keys, sent, strict=True):
        assert meta.partition == partition_for_key(key, PARTITIONS)
    for p in range(PARTITIONS):
        assert [r.key for r in store.records("t", p)] == [
            k for k in keys if partition_for_key(k, PARTITIONS) == p]


def test_refused_calls_queue_nothing(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address, linger_ms=1, max_block_ms=300) as producer:
        too_large = producer.send_many("small", [b"ok", b"x" * 5000], partition=0)
        with pytest.raises(errors.MessageTooLargeError, match="queued none"):
            too_large.result()
        unknown = producer.send_many("nope", [b"a"])
        with pytest.raises(errors.OncelogError, match="does not exist"):
            unknown.result()
        with pytest.raises(TypeError, match="sequence of values"):
            producer.send_many("t", b"not a list")
        with pytest.raises(ValueError, match="keys has 1 items and values 2"):
            producer.send_many("t", [b"a", b"b"], keys=[b"k"])
        with pytest.raises(ValueError, match="at least one record"):
            producer.send_many("t", [])
        producer.flush()
    assert store.data_values("small", 0) == []
    assert all(store.data_values("t", p) == [] for p in range(PARTITIONS))


def test_a_failed_batch_fails_the_call(store: InProcessCluster) -> None:
    def plan(view: BatchView) -> ErrorCode | None:
        return ErrorCode.CORRUPT_MESSAGE if view.partition == 1 else None

    store.fault = plan
    with Producer(bootstrap=store.address, linger_ms=1) as producer:
        future = producer.send_many("t", [b"a", b"b"], partition=1)
        with pytest.raises(errors.CorruptRecordError):
            future.result(timeout=30)
        assert producer.send_many("t", [b"c"], partition=0).result()[0].offset == 0


def test_in_a_transaction_records_commit_and_abort_with_it(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address, transactional_id="many-tx", linger_ms=1,
                  value_serializer=lambda v: json.dumps(v).encode()) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_many("t", [{"n": 1}, {"n": 2}], partition=0)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send_many("t", [{"n": 3}], partition=0)
        producer.abort_transaction()
        # A refused call breaks the transaction it was meant for.
        producer.begin_transaction()
        producer.send_many("small", [{"pad": "x" * 5000}], partition=0)
        with pytest.raises(errors.TransactionAbortableError, match="small"):
            producer.commit_transaction()
        producer.abort_transaction()
    store.settle()
    assert store.committed_values("t", 0) == [b'{"n": 1}', b'{"n": 2}']


def test_records_that_find_no_buffer_fail_and_the_others_land(store: InProcessCluster) -> None:
    held = threading.Event()

    def plan(view: BatchView) -> None:
        held.wait(10)  # the first requests are held: the buffer stays full

    store.fault = plan
    values = [b"%03d" % i + b"x" * 97 for i in range(20)]
    with Producer(bootstrap=store.address, linger_ms=1, buffer_memory_bytes=600,
                  max_block_ms=200) as producer:
        # Returns once max_block_ms ran out for the records left over.
        future = producer.send_many("t", values, partition=3)
        held.set()
        with pytest.raises(errors.KafkaTimeoutError, match="buffer_memory_bytes"):
            future.result(timeout=30)
        producer.flush()
    landed = store.data_values("t", 3)
    # What was queued before the buffer filled landed, in order, once.
    assert 0 < len(landed) < len(values)
    assert landed == values[:len(landed)]
