"""The source's options: parsed and checked once, into a frozen value.

Spark hands a data source its options as strings with lower-cased names.
Every mistake is reported with the option's name and the value received,
before anything is read: an unknown name (with the option it most likely
meant, e.g. Spark's Kafka source's `startingOffsets`), a bad value, or an
option that does not apply to this kind of read.
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

        bootstrap = _required(given, "bootstrap")
        try:
            split_bootstrap(bootstrap)
        except ValueError as exc:
            raise OptionError(f"option 'bootstrap': {exc}") from None

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


def _check_names(given: Mapping[str, str]) -> None:
    squashed = {known.replace("_", ""): known for known in _OPTIONS}
    for name in given:
        if name in _OPTIONS:
            continue
        if name == "path":
            raise OptionError(
                "the oncelog source takes no path: name the topics with option 'topics'"
            )
        hint = _KAFKA_NAMES.get(name) or squashed.get(name.replace("_", ""))
        meant = f"; did you mean {hint!r}?" if hint else ""
        raise OptionError(
            f"unknown option {name!r} for the oncelog source{meant} "
            f"(known: {', '.join(_OPTIONS)})"
        )


def _required(given: Mapping[str, str], name: str) -> str:
    value = given.get(name, "").strip()
    if not value:
        raise OptionError(f"option {name!r} is required ({_OPTIONS[name]})")
    return value


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
