"""Rows of the oncelog source as plain tuples, to compare with what was written."""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import DataFrame, Row

from tests.support.writing import Written

# (topic, partition, offset, key, value, headers, timestamp in ms)
RecordRow = tuple[str, int, int, bytes | None, bytes | None,
                  tuple[tuple[str, bytes | None], ...], int]


def as_tuples(rows: Iterable[Row]) -> list[RecordRow]:
    """Rows selected by `select_columns`, sorted by (topic, partition, offset)."""
    return sorted(
        (r.topic, r.partition, r.offset, _bytes(r.key), _bytes(r.value),
         tuple((h.key, _bytes(h.value)) for h in r.headers), r.timestamp_ms)
        for r in rows
    )


def select_columns(df: DataFrame) -> DataFrame:
    # Timestamps as epoch milliseconds: collect() would turn them into naive
    # datetimes in this process's local time zone.
    return df.selectExpr("topic", "partition", "offset", "key", "value", "headers",
                         "unix_millis(timestamp) AS timestamp_ms")


def collect(df: DataFrame) -> list[RecordRow]:
    return as_tuples(select_columns(df).collect())


def expected(written: Iterable[Written]) -> list[RecordRow]:
    return sorted(
        (w.topic, w.partition, w.offset, w.key, w.value, w.headers, w.timestamp_ms)
        for w in written
    )


def _bytes(value: bytes | bytearray | None) -> bytes | None:
    return None if value is None else bytes(value)
