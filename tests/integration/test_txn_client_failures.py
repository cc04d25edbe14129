"""A transaction with a failed record never commits, whatever stage the record failed at.

Goal: the client's own failure paths keep "both or neither". For each stage
of a record's life where it can fail for good — refused inside send() (over
max.message.bytes, a topic not in the cluster within max_block_ms, a
partition the topic does not have, buffer memory still full after
max_block_ms, a bad argument), refused by the store, or expired by
delivery_timeout_ms — a read-process-write transaction with one good record,
the group's offsets and one failing record:

* reports the failure (the send raises or its future fails);
* refuses send_offsets_to_transaction() and commit_transaction() with a
  TransactionAbortableError naming the failed record's topic and error;
* commits nothing: read_committed readers see none of it and the group's
  committed offset does not move;
* ends with abort_transaction(), after which a new transaction on the same
  producer commits normally (its record and its offsets become visible).

Also: a record that fails outside a transaction fails only its own future,
and close() with a transaction open aborts it.

Method: one LocalCluster (real processes) per module; the store is paused
with SIGSTOP (always resumed in a finally) where a stage needs records left
unacknowledged; outcomes are read back with read_committed consumers and
Admin.list_group_offsets.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from oncelog import Admin, GroupMetadata, Producer, TopicPartition, errors
from oncelog.testing import LocalCluster
from tests.support.reading import read_all

_ids = itertools.count()
SMALL_TOPIC_MAX_BYTES = 1_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("txn-client") / "cluster") as c:
        yield c


@dataclass
class Stage:
    """How to make one record of a transaction fail for good."""

    name: str
    # Producer options the stage needs (short timeouts, a small buffer).
    options: dict[str, Any]
    # Sends the failing record on `producer` (to `out`, a one-partition topic
    # with max.message.bytes=SMALL_TOPIC_MAX_BYTES); returns the error it
    # reported, raised by send() or by its future.
    fail: Callable[[Producer, str, LocalCluster], BaseException]
    # What the commit's error must name besides the topic.
    names: str


def _outcome(send: Callable[[], Any]) -> BaseException:
    try:
        future = send()
    except (TypeError, ValueError, errors.OncelogError) as refused:
        return refused
    failed = future.exception(timeout=60)
    assert failed is not None, "the failing record was acknowledged"
    return failed


def _too_large(producer: Producer, out: str, _cluster: LocalCluster) -> BaseException:
    return _outcome(lambda: producer.send(out, value=b"x" * (2 * SMALL_TOPIC_MAX_BYTES)))


def _unknown_topic(producer: Producer, out: str, _cluster: LocalCluster) -> BaseException:
    return _outcome(lambda: producer.send(out + "-missing", value=b"lost"))


def _unknown_partition(producer: Producer, out: str, _cluster: LocalCluster) -> BaseException:
    return _outcome(lambda: producer.send(out, value=b"lost", partition=7))


def _bad_argument(producer: Producer, out: str, _cluster: LocalCluster) -> BaseException:
    return _outcome(lambda: producer.send(out, value="not bytes"))


def _store_rejects(producer: Producer, _out: str, _cluster: LocalCluster) -> BaseException:
    # Clients may not append to internal topics: the store refuses the batch.
    return _outcome(lambda: producer.send("__consumer_offsets", value=b"forged", partition=0))


def _buffer_full(producer: Producer, out: str, cluster: LocalCluster) -> BaseException:
    # With the store paused nothing is acknowledged, so the buffer holding the
    # first record stays full and the second send waits out max_block_ms.
    cluster.pause("partition_store", 0)
    try:
        producer.send(out, value=b"held" * 100)
        return _outcome(lambda: producer.send(out, value=b"waits" * 100))
    finally:
        cluster.resume("partition_store", 0)


def _delivery_timeout(producer: Producer, out: str, cluster: LocalCluster) -> BaseException:
    cluster.pause("partition_store", 0)
    try:
        return _outcome(lambda: producer.send(out, value=b"expires"))
    finally:
        cluster.resume("partition_store", 0)


STAGES = [
    Stage("too_large", {}, _too_large, "MessageTooLargeError"),
    Stage("unknown_topic", {"max_block_ms": 300}, _unknown_topic, "does not exist"),
    Stage("unknown_partition", {"max_block_ms": 300}, _unknown_partition, "no partition 7"),
    Stage("bad_argument", {}, _bad_argument, "TypeError"),
    Stage("store_rejects", {}, _store_rejects, "__consumer_offsets-0"),
    Stage("buffer_full", {"buffer_memory_bytes": 600, "max_block_ms": 300},
          _buffer_full, "buffer_memory_bytes"),
    Stage("delivery_timeout", {"delivery_timeout_ms": 800, "request_timeout_ms": 300},
          _delivery_timeout, "delivery_timeout_ms"),
]


def _topics(cluster: LocalCluster) -> tuple[str, str]:
    n = next(_ids)
    source, out = f"in-{n}", f"out-{n}"
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(source, partitions=1)
        admin.create_topic(out, partitions=1,
                           config={"max.message.bytes": str(SMALL_TOPIC_MAX_BYTES)})
    return source, out


def _committed_values(cluster: LocalCluster, topic: str) -> list[bytes | None]:
    return [r.value for r in read_all(cluster.bootstrap, topic, 1,
                                      isolation_level="read_committed")]


def _group_offset(cluster: LocalCluster, group_id: str, tp: TopicPartition) -> int | None:
    with Admin(bootstrap=cluster.bootstrap) as admin:
        found = admin.list_group_offsets(group_id, [tp])
    return found[tp].offset if tp in found else None


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_a_failed_record_breaks_its_transaction(cluster: LocalCluster, stage: Stage) -> None:
    source, out = _topics(cluster)
    source_tp = TopicPartition(source, 0)
    group = GroupMetadata(f"group-{stage.name}-{next(_ids)}", -1, "")
    options: dict[str, Any] = {"linger_ms": 1, "retry_backoff_ms": 20}
    options.update(stage.options)
    with Producer(bootstrap=cluster.bootstrap, transactional_id=f"tx-{stage.name}-{next(_ids)}",
                  **options) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(out, value=b"good", partition=0).result(timeout=60)
        producer.send_offsets_to_transaction({source_tp: 5}, group)

        failure = stage.fail(producer, out, cluster)
        assert not isinstance(failure, errors.ApplicationRecoverableError)
        assert producer.transaction_state == "abortable_error"

        with pytest.raises(errors.TransactionAbortableError):
            producer.send(out, value=b"after", partition=0)
        with pytest.raises(errors.TransactionAbortableError):
            producer.send_offsets_to_transaction({source_tp: 6}, group)
        with pytest.raises(errors.TransactionAbortableError) as refused:
            producer.commit_transaction(timeout=30)
        message = str(refused.value)
        assert "record for " in message and stage.names in message, message
        # Caused by the record's error (named), caused by what the send reported.
        cause = refused.value.__cause__
        assert cause is not None and repr(cause.__cause__) == repr(failure)

        # Nothing of it is visible, and the group's offset did not move.
        assert _committed_values(cluster, out) == []
        assert _group_offset(cluster, group.group_id, source_tp) is None

        producer.abort_transaction(timeout=30)
        producer.begin_transaction()
        producer.send(out, value=b"next", partition=0)
        producer.send_offsets_to_transaction({source_tp: 7}, group)
        producer.commit_transaction(timeout=30)

    assert _committed_values(cluster, out) == [b"next"]
    assert _group_offset(cluster, group.group_id, source_tp) == 7


def test_outside_a_transaction_only_the_record_fails(cluster: LocalCluster) -> None:
    _source, out = _topics(cluster)
    with Producer(bootstrap=cluster.bootstrap, max_block_ms=300, linger_ms=1) as producer:
        assert isinstance(_too_large(producer, out, cluster), errors.MessageTooLargeError)
        assert isinstance(_unknown_topic(producer, out, cluster),
                          errors.UnknownTopicOrPartitionError)
        assert producer.send(out, value=b"fine", partition=0).result(timeout=60).offset == 0


def test_close_aborts_the_open_transaction(cluster: LocalCluster) -> None:
    _source, out = _topics(cluster)
    producer = Producer(bootstrap=cluster.bootstrap, transactional_id=f"tx-close-{next(_ids)}",
                        linger_ms=1)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(out, value=b"open", partition=0).result(timeout=60)
    producer.close()
    with pytest.raises(errors.IllegalStateError, match="closed"):
        producer.send(out, value=b"late", partition=0)
    with pytest.raises(errors.IllegalStateError, match="closed"):
        producer.commit_transaction()
    assert _committed_values(cluster, out) == []
    # The abort's marker ended the transaction: a read_uncommitted reader
    # sees the record, a read_committed one does not, and nothing hangs.
    assert [r.value for r in read_all(cluster.bootstrap, out, 1)] == [b"open"]
