"""The source's and the sinks' options: parsed and checked once, into frozen
values.

Spark hands a data source its options as strings with lower-cased names.
Every mistake is reported with the option's name and the value received,
before anything is read or written: an unknown name (with the option it
most likely meant, e.g. Spark's Kafka source's `startingOffsets`), a bad
value, or an option that does not apply to this kind of read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from oncelog._client import split_bootstrap
from oncelog_spark.offsets import (
    EARLIEST,
    EARLIEST_OFFSET,
    LATEST,
    LATEST_OFFSET,
    OffsetsError,
    OffsetSpec,
    parse_spec,
)

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
DEFAULT_POLL_TIMEOUT_MS = 120_000

_OPTIONS = {
    "bootstrap": "host:port of a partition store (comma-separated for several)",
    "topics": "comma-separated topic names",
    "isolation_level": "read_committed (default) or read_uncommitted",
    "starting_offsets": "earliest, latest or an offsets JSON",
    "ending_offsets": "latest (default) or an offsets JSON; batch reads only",
    "max_records_per_trigger": "offsets per micro-batch at most; streaming only",
    "poll_timeout_ms": "how long a task waits for records without progress before failing",
}


class OptionError(ValueError):
    """An option of the oncelog source that is missing, unknown or wrong."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """What one read (batch or streaming) was asked to do."""

    bootstrap: str
    topics: tuple[str, ...]
    isolation_level: str
    starting_offsets: OffsetSpec
    # Batch reads only: where to stop.
    ending_offsets: OffsetSpec
    # Streaming only: offsets per micro-batch at most (None: all available).
    max_records_per_trigger: int | None
    poll_timeout_ms: int

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        given = {str(k).lower(): str(v) for k, v in options.items()}
        _check_names(given)

        bootstrap = _bootstrap(given, _OPTIONS)

        topics = tuple(dict.fromkeys(t.strip() for t in _required(given, "topics").split(",")))
        if any(not t for t in topics):
            raise OptionError(
                f"option 'topics' must be comma-separated topic names, got {given['topics']!r}"
            )

        isolation_level = given.get("isolation_level", "read_committed").strip().lower()
        if isolation_level not in ISOLATION_LEVELS:
            raise OptionError(
                f"option 'isolation_level' must be one of {', '.join(ISOLATION_LEVELS)}, "
                f"got {given['isolation_level']!r}"
            )

        # Defaults as Spark's Kafka source: a stream starts at the end (new
        # records only), a batch read takes everything there is.
        starting = _spec(given, "starting_offsets", LATEST if streaming else EARLIEST)
        if "ending_offsets" in given and streaming:
            raise OptionError(
                "option 'ending_offsets' applies to batch reads (spark.read) only; a stream "
                "has no end"
            )
        ending = _spec(given, "ending_offsets", LATEST)
        if not streaming:
            # A batch read from "latest" reads nothing by definition, and one
            # that ends at "earliest" too: both are mistakes.
            if starting.mentions(LATEST_OFFSET):
                raise OptionError(
                    "option 'starting_offsets' cannot be 'latest' (or -1) in a batch read"
                )
            if ending.mentions(EARLIEST_OFFSET):
                raise OptionError(
                    "option 'ending_offsets' cannot be 'earliest' (or -2) in a batch read"
                )
        for spec, option in ((starting, "starting_offsets"), (ending, "ending_offsets")):
            if spec.per_partition is not None:
                strangers = sorted({tp.topic for tp in spec.per_partition} - set(topics))
                if strangers:
                    raise OptionError(
                        f"option {option!r} names topics that option 'topics' does not: "
                        f"{', '.join(strangers)}"
                    )

        max_records: int | None = None
        if "max_records_per_trigger" in given:
            if not streaming:
                raise OptionError(
                    "option 'max_records_per_trigger' applies to streaming reads only"
                )
            max_records = _positive_int(given, "max_records_per_trigger")

        poll_timeout_ms = DEFAULT_POLL_TIMEOUT_MS
        if "poll_timeout_ms" in given:
            poll_timeout_ms = _positive_int(given, "poll_timeout_ms")

        return cls(
            bootstrap=bootstrap,
            topics=topics,
            isolation_level=isolation_level,
            starting_offsets=starting,
            ending_offsets=ending,
            max_records_per_trigger=max_records,
            poll_timeout_ms=poll_timeout_ms,
        )


# Names users of Spark's Kafka source would write (lower-cased, as Spark
# hands them over), and ours for the same thing.
_KAFKA_NAMES = {
    "kafka.bootstrap.servers": "bootstrap",
    "subscribe": "topics",
    "maxoffsetspertrigger": "max_records_per_trigger",
    "kafka.isolation.level": "isolation_level",
    "kafkaconsumer.polltimeoutms": "poll_timeout_ms",
}


def _check_names(
    given: Mapping[str, str],
    known: Mapping[str, str] = _OPTIONS,
    *,
    what: str = "source",
    path_hint: str = "name the topics with option 'topics'",
    kafka_names: Mapping[str, str] = _KAFKA_NAMES,
) -> None:
    squashed = {name.replace("_", ""): name for name in known}
    for name in given:
        if name in known:
            continue
        if name == "path":
            raise OptionError(f"the oncelog {what} takes no path: {path_hint}")
        hint = kafka_names.get(name) or squashed.get(name.replace("_", ""))
        meant = f"; did you mean {hint!r}?" if hint else ""
        raise OptionError(
            f"unknown option {name!r} for the oncelog {what}{meant} "
            f"(known: {', '.join(known)})"
        )


def _required(
    given: Mapping[str, str], name: str, known: Mapping[str, str] = _OPTIONS
) -> str:
    value = given.get(name, "").strip()
    if not value:
        raise OptionError(f"option {name!r} is required ({known[name]})")
    return value


def _bootstrap(given: Mapping[str, str], known: Mapping[str, str]) -> str:
    bootstrap = _required(given, "bootstrap", known)
    try:
        split_bootstrap(bootstrap)
    except ValueError as exc:
        raise OptionError(f"option 'bootstrap': {exc}") from None
    return bootstrap


def _spec(given: Mapping[str, str], name: str, default: str) -> OffsetSpec:
    try:
        return parse_spec(given.get(name, default), option=name)
    except OffsetsError as exc:
        raise OptionError(str(exc)) from None


def _positive_int(given: Mapping[str, str], name: str) -> int:
    text = given[name].strip()
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise OptionError(f"option {name!r} must be a positive integer, got {given[name]!r}")
    return value


# ------------------------------------------------------------------ sinks

DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000

_SINK_OPTIONS = {
    "bootstrap": "host:port of a partition store (comma-separated for several)",
    "topic": "the output topic (rows may name another in a `topic` column); its "
             "partitions also key the sink's committed batch ids",
    "app_id": "names the sink's transactional ids and its sink-side group; one per query",
    "transaction_timeout_ms": "how long a write transaction may stay open before the "
                              "coordinator aborts it",
    "test_crash_after_records": "tests only: the first write task to send this many "
                                "records kills its own process",
    "test_crash_marker": "tests only: the file that makes test_crash_after_records fire once",
    "test_hold_commit_marker": "tests only: the driver's commit creates this file, then "
                               "waits for the process to be killed",
}

_SINK_KAFKA_NAMES = {
    "kafka.bootstrap.servers": "bootstrap",
    "transactional.id": "app_id",
    "kafka.transaction.timeout.ms": "transaction_timeout_ms",
}

# Options that Spark passes to a sink with the user's own, for its own use.
_SPARK_SINK_OPTIONS = frozenset({"checkpointlocation", "queryname"})

# A transactional id is APP_ID-N; keep the whole within the store's limits
# and readable in the admin tools.
MAX_APP_ID_CHARS = 200


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """What a sink (the foreachBatch helper or format("oncelog")) writes and
    under which identity."""

    bootstrap: str
    topic: str
    app_id: str
    transaction_timeout_ms: int
    # Fault injection for the tests (docs/spark.md, "Testing the sinks").
    test_crash_after_records: int | None = None
    test_crash_marker: str | None = None
    test_hold_commit_marker: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        given = {str(k).lower(): str(v) for k, v in options.items()
                 if str(k).lower() not in _SPARK_SINK_OPTIONS}
        _check_names(given, _SINK_OPTIONS, what="sink",
                     path_hint="name the output topic with option 'topic'",
                     kafka_names=_SINK_KAFKA_NAMES)
        bootstrap = _bootstrap(given, _SINK_OPTIONS)
        topic = _required(given, "topic", _SINK_OPTIONS)
        if "," in topic:
            raise OptionError(
                f"option 'topic' names one output topic, got {given['topic']!r} (rows go to "
                f"other topics through a `topic` column)"
            )
        app_id = _required(given, "app_id", _SINK_OPTIONS)
        if len(app_id) > MAX_APP_ID_CHARS or any(ch.isspace() for ch in app_id):
            raise OptionError(
                f"option 'app_id' must be at most {MAX_APP_ID_CHARS} characters without "
                f"spaces, got {given['app_id']!r}"
            )
        timeout_ms = DEFAULT_TRANSACTION_TIMEOUT_MS
        if "transaction_timeout_ms" in given:
            timeout_ms = _positive_int(given, "transaction_timeout_ms")
        crash_after: int | None = None
        if "test_crash_after_records" in given:
            crash_after = _positive_int(given, "test_crash_after_records")
        crash_marker = given.get("test_crash_marker", "").strip() or None
        if (crash_after is None) != (crash_marker is None):
            raise OptionError(
                "options 'test_crash_after_records' and 'test_crash_marker' go together"
            )
        hold_marker = given.get("test_hold_commit_marker", "").strip() or None
        return cls(
            bootstrap=bootstrap,
            topic=topic,
            app_id=app_id,
            transaction_timeout_ms=timeout_ms,
            test_crash_after_records=crash_after,
            test_crash_marker=crash_marker,
            test_hold_commit_marker=hold_marker,
        )
