"""The stream reader's offset decisions against a real cluster, without Spark.

Goal: the decisions Spark asks the stream reader for, one trigger at a time,
are right — where a query starts (`initialOffset` for earliest, latest and
JSON with -2/-1); where a micro-batch ends (`latestOffset`): at the last
stable offset under read_committed (an open transaction holds it back until
it ends), at most max_records_per_trigger offsets further, spread fairly
over the partitions, and never past the end seen when Trigger.AvailableNow
started; partitions missing from the start offsets (added to a topic since,
or a topic added to the query before a restart) are read from their
earliest offset, and a topic dropped from the query is no longer read; a
start offset past the log's end (the topic was recreated) fails instead of
skipping or re-reading; and the ranges `partitions()` plans read back
exactly the records in them. A `topic_pattern` (Kafka's subscribePattern)
finds topics created after the query started at the next micro-batch and
reads them from their earliest offset. Lost records — a topic deleted or
recreated under the query, records removed by retention before they were
read, a starting offset retention has passed — fail the read by default,
and with fail_on_data_loss false are skipped with a warning while the rest
is read (a recreated topic from its start).

Method: a LocalCluster (real processes) and the real OncelogStreamReader
called as Spark's planner worker calls it (these methods are plain Python;
the Spark tests in this folder run them inside Spark). Partition growth is
not possible on this cluster yet (no CreatePartitions), so "new partition"
is exercised the way a restart with an added topic makes it: a start offset
that does not name the partition.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from oncelog import Admin, Consumer, Producer, TopicPartition, errors
from oncelog.testing import LocalCluster
from oncelog_spark.offsets import OffsetsError
from oncelog_spark.options import SourceOptions
from oncelog_spark.source import OncelogStreamReader
from tests.support.writing import COMMITTED, OPEN, PLAIN, send_all, write_transaction

# Retention runs often, so a topic's old records are removed within the
# test that waits for it (other topics keep the default retention: a week).
RETENTION_CHECK_INTERVAL_MS = 200
# Failure guard for retention that never runs (not a timing assumption).
RETENTION_WAIT_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("reader") / "cluster",
                      group_coordinators=0,
                      extra_args={"partition_store": [
                          "--retention-check-interval-ms", str(RETENTION_CHECK_INTERVAL_MS)]},
                      ) as c:
        yield c


def make_topic(cluster: LocalCluster, name: str, partitions: int,
               records_per_partition: list[int]) -> None:
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=partitions)
    with Producer(bootstrap=cluster.bootstrap) as producer:
        for partition, count in enumerate(records_per_partition):
            values = [f"{name}-{partition}-{i}".encode() for i in range(count)]
            send_all(producer, name, partition, values, outcome=PLAIN)


MakeReader = Callable[..., OncelogStreamReader]


@pytest.fixture
def stream_reader(cluster: LocalCluster) -> Iterator[MakeReader]:
    """Makes stream readers of the module's cluster, stopped after the test."""
    readers: list[OncelogStreamReader] = []

    def make(topics: str = "", **options: str) -> OncelogStreamReader:
        named = {"topics": topics} if topics else {}
        parsed = SourceOptions.parse(
            {"bootstrap": cluster.bootstrap, **named, **options}, streaming=True
        )
        reader = OncelogStreamReader(parsed)
        readers.append(reader)
        return reader

    yield make
    for reader in readers:
        reader.stop()


def read_values(reader: OncelogStreamReader, start: dict, end: dict) -> list[bytes]:
    """What the micro-batch (start, end] delivers, as Spark's tasks read it."""
    values = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            values += [row["value"] for row in batch.to_pylist()]
    return sorted(values)


def test_initial_offsets(cluster: LocalCluster, stream_reader: MakeReader, topic_name: str) -> None:
    make_topic(cluster, topic_name, 2, [3, 5])
    assert stream_reader(topic_name, starting_offsets="earliest").initialOffset() == {
        topic_name: {"0": 0, "1": 0}}
    assert stream_reader(topic_name).initialOffset() == {topic_name: {"0": 3, "1": 5}}
    spec = f'{{"{topic_name}": {{"0": -1, "1": 2}}}}'
    assert stream_reader(topic_name, starting_offsets=spec).initialOffset() == {
        topic_name: {"0": 3, "1": 2}}
    with pytest.raises(OffsetsError, match="past its end"):
        stream_reader(topic_name, starting_offsets=f'{{"{topic_name}": {{"0": 9, "1": 0}}}}'
                      ).initialOffset()


def test_partitions_missing_from_the_start_are_read_from_earliest(
    cluster: LocalCluster, stream_reader: MakeReader, topic_name: str
) -> None:
    grown, added = f"{topic_name}-a", f"{topic_name}-b"
    make_topic(cluster, grown, 2, [3, 2])
    make_topic(cluster, added, 1, [2])
    reader = stream_reader(f"{grown},{added}")
    # A checkpoint from before partition 1 of `grown` and topic `added` were
    # read, still naming a topic the query no longer reads.
    start = {grown: {"0": 3}, "dropped-topic": {"0": 7}}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {grown: {"0": 3, "1": 2}, added: {"0": 2}}
    assert read_values(reader, start, end) == sorted(
        [f"{grown}-1-0".encode(), f"{grown}-1-1".encode(),
         f"{added}-0-0".encode(), f"{added}-0-1".encode()]
    )


def test_max_records_per_trigger_is_spread_fairly(
    cluster: LocalCluster, stream_reader: MakeReader, topic_name: str
) -> None:
    make_topic(cluster, topic_name, 3, [10, 2, 0])
    reader = stream_reader(topic_name, max_records_per_trigger="6")
    assert reader.getDefaultReadLimit() == ReadMaxRows(6)
    start = {topic_name: {"0": 0, "1": 0, "2": 0}}
    # Equal shares of 3; partition 1 can use only 2, its spare offset goes
    # to partition 0.
    first = reader.latestOffset(start, ReadMaxRows(6))
    assert first == {topic_name: {"0": 4, "1": 2, "2": 0}}
    second = reader.latestOffset(first, ReadMaxRows(6))
    assert second == {topic_name: {"0": 10, "1": 2, "2": 0}}
    assert reader.latestOffset(second, ReadMaxRows(6)) == second
    # Spark may ask for everything regardless of the option (a trigger's
    # own rules); then the limit does not apply.
    assert reader.latestOffset(start, ReadAllAvailable()) == second
    assert len(read_values(reader, start, first)) == 6


def test_available_now_stops_at_the_end_seen_when_it_started(
    cluster: LocalCluster, stream_reader: MakeReader, topic_name: str
) -> None:
    make_topic(cluster, topic_name, 1, [3])
    reader = stream_reader(topic_name)
    start = {topic_name: {"0": 0}}
    reader.prepareForTriggerAvailableNow()
    with Producer(bootstrap=cluster.bootstrap) as producer:
        send_all(producer, topic_name, 0, [b"later"], outcome=PLAIN)
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {topic_name: {"0": 3}}
    assert reader.latestOffset(end, ReadAllAvailable()) == end
    assert reader.reportLatestOffset() == {topic_name: {"0": 4}}


def test_open_transaction_holds_back_the_end_under_read_committed(
    cluster: LocalCluster, stream_reader: MakeReader, topic_name: str
) -> None:
    make_topic(cluster, topic_name, 1, [2])
    committed_reader = stream_reader(topic_name)
    uncommitted_reader = stream_reader(topic_name, isolation_level="read_uncommitted")
    start = {topic_name: {"0": 0}}
    with Producer(bootstrap=cluster.bootstrap, transactional_id=f"{topic_name}-txn") as txn, \
            Producer(bootstrap=cluster.bootstrap) as plain:
        txn.init_transactions()
        held = write_transaction(txn, topic_name, 0, [b"o0", b"o1"], outcome=OPEN)
        send_all(plain, topic_name, 0, [b"after"], outcome=PLAIN)
        first_open = held[0].offset
        assert committed_reader.latestOffset(start, ReadAllAvailable()) == {
            topic_name: {"0": first_open}}
        high = {topic_name: {"0": first_open + 3}}
        assert uncommitted_reader.latestOffset(start, ReadAllAvailable()) == high
        # A query that already read past the open transaction under
        # read_uncommitted and restarts with read_committed waits where it is.
        assert committed_reader.latestOffset(high, ReadAllAvailable()) == high
        txn.commit_transaction()
        write_transaction(txn, topic_name, 0, [b"c0"], outcome=COMMITTED)
    end = committed_reader.latestOffset(start, ReadAllAvailable())
    # o0, o1, the commit marker, `after`, c0 and its marker.
    assert end == {topic_name: {"0": first_open + 6}}
    assert read_values(committed_reader, start, end) == sorted(
        [f"{topic_name}-0-0".encode(), f"{topic_name}-0-1".encode(),
         b"o0", b"o1", b"after", b"c0"]
    )


def test_start_past_the_log_end_fails(
    cluster: LocalCluster, stream_reader: MakeReader, topic_name: str
) -> None:
    make_topic(cluster, topic_name, 1, [2])
    reader = stream_reader(topic_name)
    with pytest.raises(errors.OncelogError, match="deleted and recreated"):
        reader.latestOffset({topic_name: {"0": 50}}, ReadAllAvailable())


def test_a_pattern_finds_topics_created_after_the_start(
    cluster: LocalCluster, stream_reader: MakeReader, topic_name: str
) -> None:
    first, second, later = f"{topic_name}-a", f"{topic_name}-b", f"{topic_name}-c"
    make_topic(cluster, first, 2, [2, 1])
    make_topic(cluster, second, 1, [1])
    make_topic(cluster, f"other-{topic_name}", 1, [3])       # not matched
    reader = stream_reader(topic_pattern=re.escape(topic_name) + "-.*",
                           starting_offsets="earliest")
    start = reader.initialOffset()
    assert start == {first: {"0": 0, "1": 0}, second: {"0": 0}}

    make_topic(cluster, later, 1, [2])
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {first: {"0": 2, "1": 1}, second: {"0": 1}, later: {"0": 2}}
    assert read_values(reader, start, end) == sorted(
        [f"{first}-0-0".encode(), f"{first}-0-1".encode(), f"{first}-1-0".encode(),
         f"{second}-0-0".encode(), f"{later}-0-0".encode(), f"{later}-0-1".encode()]
    )


def test_a_pattern_that_matches_nothing_yet_waits_for_a_topic(
    cluster: LocalCluster, stream_reader: MakeReader, topic_name: str
) -> None:
    reader = stream_reader(topic_pattern=re.escape(topic_name) + "-.*")
    start = reader.initialOffset()
    assert start == {}
    assert reader.latestOffset(start, ReadAllAvailable()) == {}
    make_topic(cluster, f"{topic_name}-new", 1, [1])
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {f"{topic_name}-new": {"0": 1}}
    assert read_values(reader, start, end) == [f"{topic_name}-new-0-0".encode()]


def test_a_topic_deleted_under_the_query_is_data_loss(
    cluster: LocalCluster, stream_reader: MakeReader, topic_name: str
) -> None:
    doomed, kept = f"{topic_name}-a", f"{topic_name}-b"
    make_topic(cluster, doomed, 1, [2])
    make_topic(cluster, kept, 1, [1])
    pattern = re.escape(topic_name) + "-.*"
    start = {doomed: {"0": 1}, kept: {"0": 0}}
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.delete_topic(doomed)

    for reader in (stream_reader(topic_pattern=pattern), stream_reader(f"{doomed},{kept}")):
        with pytest.raises(errors.OffsetOutOfRangeError,
                           match=f"topic.*{doomed} were deleted while this query read them.*"
                                 f"fail_on_data_loss"):
            reader.latestOffset(start, ReadAllAvailable())
    for reader in (stream_reader(topic_pattern=pattern, fail_on_data_loss="false"),
                   stream_reader(f"{doomed},{kept}", failOnDataLoss="false")):
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {kept: {"0": 1}}
        assert read_values(reader, start, end) == [f"{kept}-0-0".encode()]
    # A named topic that never existed is not data loss: it fails the
    # query unless fail_on_data_loss is false, which waits for it.
    with pytest.raises(errors.UnknownTopicOrPartitionError, match="do not exist"):
        stream_reader(f"{kept},{topic_name}-never").latestOffset({}, ReadAllAvailable())
    waiting = stream_reader(f"{kept},{topic_name}-never", fail_on_data_loss="false")
    assert waiting.latestOffset({}, ReadAllAvailable()) == {kept: {"0": 1}}


def test_a_recreated_topic_is_read_again_from_its_start_when_data_loss_is_allowed(
    cluster: LocalCluster, stream_reader: MakeReader, topic_name: str
) -> None:
    make_topic(cluster, topic_name, 1, [2])
    reader = stream_reader(topic_name, fail_on_data_loss="false")
    # The query had reached offset 50 of the topic's previous life.
    start = {topic_name: {"0": 50}}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {topic_name: {"0": 0}}
    assert reader.partitions(start, end) == []
    following = reader.latestOffset(end, ReadAllAvailable())
    assert following == {topic_name: {"0": 2}}
    assert read_values(reader, end, following) == [f"{topic_name}-0-0".encode(),
                                                   f"{topic_name}-0-1".encode()]
    # Planned by a run that allowed the loss, replayed by one that does not.
    with pytest.raises(errors.OffsetOutOfRangeError, match="offsets from 50 on are gone"):
        stream_reader(topic_name).partitions(start, end)


def test_records_removed_by_retention_fail_the_read_or_are_skipped(
    cluster: LocalCluster, stream_reader: MakeReader, topic_name: str
) -> None:
    tp = TopicPartition(topic_name, 0)
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, config={"retention.bytes": "1"})
    with Producer(bootstrap=cluster.bootstrap) as producer:
        for i in range(5):      # one batch each: retention removes whole batches
            send_all(producer, topic_name, 0, [f"r{i}".encode()], outcome=PLAIN)
    # Retention keeps the newest batch at least; wait until it has run.
    with Consumer(bootstrap=cluster.bootstrap) as consumer:
        deadline_s = time.monotonic() + RETENTION_WAIT_S
        while (earliest := consumer.beginning_offsets([tp])[tp]) == 0:
            assert time.monotonic() < deadline_s, "retention never removed a batch"
            time.sleep(RETENTION_CHECK_INTERVAL_MS / 1000)
    assert 0 < earliest <= 4
    kept = [f"r{i}".encode() for i in range(earliest, 5)]
    start, end = {topic_name: {"0": 0}}, {topic_name: {"0": 5}}
    from_zero = f'{{"{topic_name}": {{"0": 0}}}}'

    strict = stream_reader(topic_name, starting_offsets=from_zero)
    with pytest.raises(errors.OffsetOutOfRangeError,
                       match=r"no longer in the log \(retention\).*fail_on_data_loss"):
        read_values(strict, start, end)
    with pytest.raises(OffsetsError, match="before the earliest offset still in the log"):
        strict.initialOffset()

    lenient = stream_reader(topic_name, starting_offsets=from_zero, failOnDataLoss="false")
    assert read_values(lenient, start, end) == kept
    assert lenient.initialOffset() == {topic_name: {"0": earliest}}
