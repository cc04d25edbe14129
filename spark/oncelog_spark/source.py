"""The oncelog source for Spark's Python Data Source API (Spark 4).

    spark.dataSource.register(OncelogDataSource)        # or oncelog_spark.register(spark)
    spark.read.format("oncelog").option("bootstrap", ...).option("topics", "payments").load()
    spark.readStream.format("oncelog").option(...).load()

How Spark runs it: every method here runs in a Python worker process that
Spark starts, never in the driver's own Python. The planning side
(`partitions()`, and the stream reader's offset methods, which live in one
long-lived worker per query) asks the cluster for partitions and offsets;
each input partition (one offset range of one partition) is read by a task
in another worker. Nothing here is shared between those processes but what
Spark pickles (options and ranges) and the offsets Spark keeps in its
checkpoint, so a restarted query continues from the checkpoint alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from oncelog import TopicPartition, errors
from oncelog_spark.cluster import ClusterView
from oncelog_spark.offsets import (
    OffsetRange,
    Offsets,
    OffsetsError,
    OffsetSpec,
    check_covers,
    from_json_dict,
    limit_end,
    plan_ranges,
    resolve,
    to_json_dict,
)
from oncelog_spark.options import OptionError, SinkOptions, SourceOptions
from oncelog_spark.reading import SCHEMA, read_range
from oncelog_spark.stream_sink import OncelogStreamWriter
from oncelog_spark.writing import SinkColumns

FORMAT_NAME = "oncelog"

log = logging.getLogger("oncelog_spark.source")


class OncelogDataSource(DataSource):
    """`format("oncelog")`: batch and streaming reads of oncelog topics, and
    exactly-once streaming writes (stream_sink.py)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return OncelogBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return OncelogStreamReader(SourceOptions.parse(self.options, streaming=True))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise OptionError(
                "the oncelog sink appends records to a log; it cannot overwrite (use "
                "outputMode('append'))"
            )
        options = SinkOptions.parse(self.options)
        if options.app_id_from_checkpoint:
            log.info("oncelog sink: no app_id given; using %s, derived from the checkpoint "
                     "location %s", options.app_id, self.options.get("checkpointLocation"))
        return OncelogStreamWriter(options, SinkColumns.of(schema))


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise OptionError(
            f"the oncelog source has a fixed schema ({SCHEMA.simpleString()}); "
            f"do not pass another one (got {schema.simpleString()})"
        )


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    rng = partition.value
    if rng is None:
        # A batch read with nothing to read: Spark replaces an empty list of
        # partitions with one InputPartition(None) and reads that.
        return iter(())
    if not isinstance(rng, OffsetRange):
        raise TypeError(f"oncelog source: expected an OffsetRange partition, got {rng!r}")
    return read_range(options, rng)


def data_loss(options: SourceOptions, message: str) -> None:
    """Records the read should return are gone: an error when
    fail_on_data_loss is true (the default), else a warning (the caller
    then skips them), as Spark's Kafka source's failOnDataLoss."""
    if options.fail_on_data_loss:
        raise errors.error_for(
            errors.ErrorCode.OFFSET_OUT_OF_RANGE,
            f"oncelog source: {message}. Set option fail_on_data_loss (Kafka: "
            f"failOnDataLoss) to false to skip what is lost with a warning",
        )
    log.warning("oncelog source: %s; skipping it (fail_on_data_loss is false)", message)


def _resolve_specs(
    view: ClusterView, options: SourceOptions, specs: Mapping[str, OffsetSpec]
) -> dict[str, Offsets]:
    """Concrete offsets for the specs of the named options, from one look at
    the cluster. Offsets a user asked for must lie inside the log: at or
    after the earliest offset still kept, at or before the end the query
    can see (the last stable offset under read_committed)."""
    tps = view.partitions()
    for option, spec in specs.items():
        check_covers(spec, tps, option=option)
    earliest = view.earliest(tps)
    latest = view.latest(tps)
    end_name = "last stable offset" if options.isolation_level == "read_committed" \
        else "high watermark"
    resolved: dict[str, Offsets] = {}
    for option, spec in specs.items():
        offsets = resolve(spec, tps, earliest=earliest, latest=latest)
        for tp, offset in sorted(offsets.items()):
            if offset < earliest[tp]:
                message = (f"option {option!r}: offset {offset} of {tp.topic}-{tp.partition} "
                           f"is before the earliest offset still in the log, {earliest[tp]}")
                if options.fail_on_data_loss:
                    raise OffsetsError(
                        f"{message} (with fail_on_data_loss false the read starts there)"
                    )
                log.warning("%s: starting there (fail_on_data_loss is false)", message)
                offsets[tp] = offset = earliest[tp]
            if offset > latest[tp]:
                raise OffsetsError(
                    f"option {option!r}: offset {offset} of {tp.topic}-{tp.partition} is "
                    f"past its end, {latest[tp]} (the {end_name} under "
                    f"{options.isolation_level})"
                )
        resolved[option] = offsets
    return resolved


class OncelogBatchReader(DataSourceReader):
    """`spark.read`: the offsets [starting_offsets, ending_offsets) of each
    partition, resolved once when Spark plans the read."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options

    def partitions(self) -> Sequence[InputPartition]:
        opts = self._options
        with ClusterView(opts) as view:
            resolved = _resolve_specs(view, opts, {
                "starting_offsets": opts.starting_offsets,
                "ending_offsets": opts.ending_offsets,
            })
        ranges = plan_ranges(resolved["starting_offsets"], resolved["ending_offsets"],
                             earliest_of_new={})
        return [InputPartition(rng) for rng in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self._options, partition)


class OncelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream`: micro-batches of offset ranges; the offsets live in
    Spark's checkpoint as {topic: {partition: next offset}}.

    A micro-batch ends where the cluster's end was when Spark asked
    (`latestOffset`): the last stable offset under read_committed, so open
    and aborted transactions are never read; at most max_records_per_trigger
    offsets further than the previous batch, spread fairly over partitions.
    Partitions that appear later (topics `topic_pattern` comes to match,
    or topics added to `topics` before a restart) are read from their
    earliest offset. Records that are gone (deleted topics, a recreated
    topic, retention) fail the query, or with fail_on_data_loss false are
    skipped with a warning.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        # Created on first use: this object is also pickled into the read
        # tasks, which need no connection of their own here.
        self._view: ClusterView | None = None
        # Trigger.AvailableNow: the end offsets when the query started; no
        # micro-batch goes past them.
        self._target: Offsets | None = None
        self._last_latest: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_view"] = None
        return state

    def _cluster(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(self._options)
        return self._view

    def initialOffset(self) -> dict:
        opts = self._options
        resolved = _resolve_specs(self._cluster(), opts,
                                  {"starting_offsets": opts.starting_offsets})
        return to_json_dict(resolved["starting_offsets"])

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._options.max_records_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self._options.max_records_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        view = self._cluster()
        self._target = view.latest(view.partitions())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        view = self._cluster()
        begin = self._start_offsets(start)
        tps = self._current_partitions(begin)
        new = [tp for tp in tps if tp not in begin]
        begin = {tp: begin[tp] for tp in tps if tp in begin}
        begin.update(view.earliest(new))
        latest = view.latest(tps)
        self._last_latest = latest
        end, restart = self._not_behind(begin, latest)
        if self._target is not None:
            end = {tp: max(begin[tp], min(end[tp], self._target.get(tp, begin[tp])))
                   for tp in tps}
        if isinstance(limit, ReadMaxRows):
            end = limit_end(begin, end, limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            raise OptionError(
                f"the oncelog source limits micro-batches by records (ReadMaxRows), "
                f"not by {type(limit).__name__}"
            )
        # Partitions whose records were lost (fail_on_data_loss false): the
        # micro-batch reads nothing of them and the next one starts at their
        # earliest offset.
        end.update(restart)
        return to_json_dict(end)

    def reportLatestOffset(self) -> dict | None:
        return None if self._last_latest is None else to_json_dict(self._last_latest)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = self._start_offsets(start)
        end_offsets = from_json_dict(end, what="micro-batch end offsets")
        # An end below the start is what latestOffset plans for a partition
        # whose records were lost: nothing to read there.
        for tp in sorted(tp for tp in end_offsets
                         if tp in begin and end_offsets[tp] < begin[tp]):
            data_loss(self._options,
                      f"{tp.topic}-{tp.partition}: offsets from {begin[tp]} on are gone (the "
                      f"micro-batch ends at {end_offsets[tp]})")
            begin[tp] = end_offsets[tp]
        new = [tp for tp in end_offsets if tp not in begin]
        earliest_of_new = self._cluster().earliest(new) if new else {}
        ranges = plan_ranges(begin, end_offsets, earliest_of_new=earliest_of_new)
        return [InputPartition(rng) for rng in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self._options, partition)

    def commit(self, end: dict) -> None:
        # Offsets live in Spark's checkpoint; the cluster keeps no state for
        # this reader, so there is nothing to tell it.
        return None

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None

    @staticmethod
    def _start_offsets(start: Mapping[str, Any]) -> Offsets:
        return from_json_dict(dict(start), what="micro-batch start offsets")

    def _current_partitions(self, begin: Offsets) -> list[TopicPartition]:
        """The partitions to read now. A topic the query was reading (one in
        the micro-batch's start offsets, still named or matched) that is
        gone from the cluster was deleted: what was written to it since the
        last micro-batch is lost. A named topic that does not exist fails
        the query, unless fail_on_data_loss is false: then it is read once
        it exists (as Spark's Kafka source's subscribe waits for it)."""
        opts = self._options
        view = self._cluster()
        tps, missing = view.topic_partitions()
        present = {tp.topic for tp in tps}
        gone = sorted({tp.topic for tp in begin
                       if tp.topic not in present and opts.reads(tp.topic)})
        if gone:
            data_loss(opts, f"topic(s) {', '.join(gone)} were deleted while this query read "
                            f"them; records written to them after its last micro-batch are "
                            f"lost")
        never_read = [t for t in missing if t not in gone]
        if never_read:
            if opts.fail_on_data_loss:
                raise view.missing_topics_error(never_read)
            log.warning("oncelog source: topic(s) %s do not exist at %s; reading them once "
                        "they do", ", ".join(never_read), opts.bootstrap)
        return tps

    def _not_behind(self, begin: Offsets, latest: Offsets) -> tuple[Offsets, Offsets]:
        """End offsets no lower than the start, and the partitions whose
        records were lost with the offset to read them from next.

        A partition whose end is below where the query already is has
        either an open transaction below that offset (the query read it
        under read_uncommitted before a restart with read_committed: wait
        for it to end) or lost its records (the topic was deleted and
        recreated, or the checkpoint belongs to another cluster): the latter
        fails the query rather than skip or re-read anything, or with
        fail_on_data_loss false is read again from its earliest offset."""
        behind = [tp for tp in latest if latest[tp] < begin[tp]]
        if not behind:
            return dict(latest), {}
        high = self._cluster().high_watermarks(sorted({tp.topic for tp in behind}))
        lost = [tp for tp in behind if high.get(tp, -1) < begin[tp]]
        for tp in lost:
            data_loss(self._options,
                      f"{tp.topic}-{tp.partition} ends at offset {high.get(tp)}, below offset "
                      f"{begin[tp]} that this query already reached: the topic was deleted "
                      f"and recreated, or the checkpoint belongs to another cluster")
        restart = self._cluster().earliest(lost) if lost else {}
        return {tp: max(latest[tp], begin[tp]) for tp in latest}, restart
