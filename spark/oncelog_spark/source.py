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

from oncelog import errors
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
        return OncelogStreamWriter(SinkOptions.parse(self.options), SinkColumns.of(schema))


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
                raise OffsetsError(
                    f"option {option!r}: offset {offset} of {tp.topic}-{tp.partition} is "
                    f"before the earliest offset still in the log, {earliest[tp]}"
                )
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
    Partitions that appear later (or topics added to `topics` before a
    restart) are read from their earliest offset.
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
        tps = view.partitions()
        new = [tp for tp in tps if tp not in begin]
        begin = {tp: begin[tp] for tp in tps if tp in begin}
        begin.update(view.earliest(new))
        latest = view.latest(tps)
        self._last_latest = latest
        end = self._not_behind(begin, latest)
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
        return to_json_dict(end)

    def reportLatestOffset(self) -> dict | None:
        return None if self._last_latest is None else to_json_dict(self._last_latest)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = self._start_offsets(start)
        end_offsets = from_json_dict(end, what="micro-batch end offsets")
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

    def _not_behind(self, begin: Offsets, latest: Offsets) -> Offsets:
        """End offsets no lower than the start. A partition whose end is
        below where the query already is has either an open transaction
        below that offset (the query read it under read_uncommitted before a
        restart with read_committed: wait for it to end) or lost its records
        (the topic was deleted and recreated): the latter fails the query
        rather than skip or re-read anything."""
        behind = [tp for tp in latest if latest[tp] < begin[tp]]
        if not behind:
            return dict(latest)
        high = self._cluster().high_watermarks(sorted({tp.topic for tp in behind}))
        lost = [tp for tp in behind if high.get(tp, -1) < begin[tp]]
        if lost:
            tp = lost[0]
            raise errors.error_for(
                errors.ErrorCode.OFFSET_OUT_OF_RANGE,
                f"oncelog source: {tp.topic}-{tp.partition} ends at offset {high.get(tp)}, "
                f"below offset {begin[tp]} that this query already reached: the topic was "
                f"deleted and recreated, or the checkpoint belongs to another cluster",
            )
        return {tp: max(latest[tp], begin[tp]) for tp in latest}
