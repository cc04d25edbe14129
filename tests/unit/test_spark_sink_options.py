"""The Spark sinks' options and input columns as pure values.

Goal: sink options parse with their defaults, ignore what Spark adds for
itself (checkpointLocation), and turn every mistake into an error naming
the option (with the oncelog name for a Kafka-sink name); the input
schema check accepts exactly the columns and types of Spark's Kafka sink
and names the column and type that are wrong.

Method: direct calls with hand-made options and Spark schemas; no Spark
session, no cluster.
"""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from oncelog_spark.options import DEFAULT_TRANSACTION_TIMEOUT_MS, OptionError, SinkOptions
from oncelog_spark.writing import HEADERS_TYPE, SinkColumns, SinkInputError

BASE = {"bootstrap": "127.0.0.1:1", "topic": "ledger", "app_id": "ledger-app"}


def test_sink_defaults_and_spark_own_options() -> None:
    opts = SinkOptions.parse({**BASE, "checkpointLocation": "/tmp/x", "queryName": "q"})
    assert (opts.topic, opts.app_id) == ("ledger", "ledger-app")
    assert opts.transaction_timeout_ms == DEFAULT_TRANSACTION_TIMEOUT_MS
    assert opts.test_crash_after_records is None and opts.test_hold_commit_marker is None
    assert SinkOptions.parse({**BASE, "Transaction_Timeout_Ms": "5000"}).transaction_timeout_ms \
        == 5000


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"app_id": ""}, "option 'app_id' is required"),
        ({"app_id": "a b"}, "option 'app_id' must be at most 200 characters without spaces"),
        ({"app_id": "a" * 201}, "option 'app_id' must be at most 200"),
        ({"topic": "a,b"}, "option 'topic' names one output topic"),
        ({"bootstrap": "nohost"}, "option 'bootstrap': bootstrap address 'nohost'"),
        ({"transaction_timeout_ms": "-1"}, "must be a positive integer, got '-1'"),
        ({"transactional.id": "x"}, "did you mean 'app_id'"),
        ({"topics": "x"}, "unknown option 'topics' for the oncelog sink"),
        ({"path": "x"}, "the oncelog sink takes no path"),
        ({"test_crash_after_records": "3"}, "go together"),
    ],
)
def test_sink_option_mistakes_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        SinkOptions.parse({**BASE, **options})


def schema(**columns: object) -> StructType:
    return StructType([StructField(name, t) for name, t in columns.items()])  # type: ignore[arg-type]


def test_sink_columns_are_those_of_the_kafka_sink() -> None:
    full = schema(value=BinaryType(), extra=LongType(), partition=IntegerType(),
                  key=StringType(), topic=StringType(), headers=HEADERS_TYPE)
    assert SinkColumns.of(full).names == ("key", "value", "headers", "topic", "partition")
    assert SinkColumns.of(schema(value=StringType())).names == ("value",)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"key": BinaryType()}, "needs a `value` column .* the input has key"),
        ({"value": LongType()}, "column `value` .* must be binary or string, got bigint"),
        ({"value": BinaryType(), "partition": LongType()}, "`partition` .* must be int"),
        ({"value": BinaryType(), "topic": BinaryType()}, "`topic` .* must be string"),
        ({"value": BinaryType(), "headers": ArrayType(StringType())},
         r"`headers` .* must be array<struct<key:string,value:binary>>"),
    ],
)
def test_sink_column_mistakes_name_the_column(columns: dict[str, object], message: str) -> None:
    with pytest.raises(SinkInputError, match=message):
        SinkColumns.of(schema(**columns))
