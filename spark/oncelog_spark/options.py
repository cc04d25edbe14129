"""The source's and the sinks' options: parsed and checked once, into frozen
values.

Spark hands a data source its options as strings with lower-cased names.
Every mistake is reported with the option's name (as the user wrote it) and
the value received, before anything is read or written: an unknown name
(with the option it most likely meant), a bad value, or an option that does
not apply to this kind of read.

Spark's Kafka source and sink options are accepted where they mean the same
thing as an oncelog option (`KAFKA_SOURCE_ALIASES`, `KAFKA_SINK_ALIASES`:
`subscribe` is `topics`, `startingOffsets` is `starting_offsets`, ...), so a
job moves from `format("kafka")` to `format("oncelog")` by changing the
format. Kafka options without an equivalent are refused with the reason,
never silently ignored.

The options that are the clients' own (`bootstrap`, `isolation_level`,
`transaction_timeout_ms`, the security settings), with Spark's Kafka names
for them, come from the clients' options table (oncelog.config_def); the
source's and sinks' own options and Spark's names for those are here.

Security (docs/security.md): `security_protocol`, `ssl_cafile`,
`ssl_certfile`, `ssl_keyfile`, `sasl_mechanism` and `sasl_oauth_token_file`
(`ClientSecurity`) go to every client the source and sinks make, on the
driver and in the executors, so the files must be readable at the same
paths there. Kafka's `kafka.security.protocol` and `kafka.sasl.mechanism`
mean the same; its JKS stores (`kafka.ssl.truststore.location`, ...) and
JAAS settings are refused with the option to give instead.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from oncelog import config_def
from oncelog.config_def import CONSUMER, OAUTHBEARER, PLAINTEXT, PRODUCER, SECURITY_PROTOCOLS
from oncelog_spark.offsets import (
    EARLIEST,
    EARLIEST_OFFSET,
    LATEST,
    LATEST_OFFSET,
    OffsetsError,
    OffsetSpec,
    parse_spec,
)

ISOLATION_LEVELS = config_def.key("isolation_level").choices
DEFAULT_POLL_TIMEOUT_MS = 120_000


def _table_options(client: str) -> dict[str, str]:
    """The clients' options (oncelog.config_def) the source (CONSUMER) or
    the sinks (PRODUCER) take, by name, with what they mean."""
    return {k.name: config_def.tool_doc(k).replace("`", "") for k in config_def.spark_keys(client)}


# The source's own options, then the clients' that it takes (the table's:
# bootstrap, isolation_level, the security settings).
_OPTIONS = {
    "topics": "comma-separated topic names",
    "topic_pattern": "a regular expression over topic names, instead of 'topics'",
    "starting_offsets": "earliest, latest or an offsets JSON",
    "ending_offsets": "latest (default) or an offsets JSON; batch reads only",
    "max_records_per_trigger": "offsets per micro-batch at most; streaming only",
    "fail_on_data_loss": "true (default): fail when records to read are gone; false: skip "
                         "them with a warning",
    "poll_timeout_ms": "how long a task waits for records without progress before failing",
    **_table_options(CONSUMER),
}

# The clients' security settings, taken by the source and the sinks alike.
_SECURITY_OPTIONS = {name: doc for name, doc in _table_options(CONSUMER).items()
                     if config_def.key(name).group == config_def.SECURITY}


class OptionError(ValueError):
    """An option of the oncelog source or sinks that is missing, unknown or wrong."""


@dataclass(frozen=True, slots=True)
class KafkaAlias:
    """An option of Spark's Kafka source or sink that oncelog takes under
    another name, with the same meaning."""

    # As Spark's Kafka integration guide spells it (Spark lower-cases it).
    kafka: str
    oncelog: str


def _aliases(*pairs: tuple[str, str]) -> dict[str, KafkaAlias]:
    return {kafka.lower(): KafkaAlias(kafka, ours) for kafka, ours in pairs}


def _table_aliases(client: str) -> dict[str, KafkaAlias]:
    """Spark's Kafka names for the clients' options the source (CONSUMER)
    or the sinks (PRODUCER) take: the table's (`kafka.bootstrap.servers`,
    `kafka.security.protocol`, ...)."""
    return _aliases(*((k.spark_alias, k.name) for k in config_def.spark_keys(client)
                      if k.spark_alias is not None))


# Spark's Kafka source options that mean what an oncelog source option means.
KAFKA_SOURCE_ALIASES = {
    **_table_aliases(CONSUMER),
    **_aliases(
        ("subscribe", "topics"),
        ("subscribePattern", "topic_pattern"),
        ("startingOffsets", "starting_offsets"),
        ("endingOffsets", "ending_offsets"),
        ("maxOffsetsPerTrigger", "max_records_per_trigger"),
        ("failOnDataLoss", "fail_on_data_loss"),
        ("kafkaConsumer.pollTimeoutMs", "poll_timeout_ms"),
    ),
}

# Spark's Kafka sink options that mean what an oncelog sink option means
# (`topic` is spelled the same): the table's.
KAFKA_SINK_ALIASES = _table_aliases(PRODUCER)

_NO_GROUP = "the oncelog source uses no consumer group (a query's offsets live in its checkpoint)"
_BY_TIMESTAMP = ("starting or ending at a timestamp is not supported by the oncelog source; "
                 "give offsets ('startingOffsets' / 'starting_offsets', 'endingOffsets' / "
                 "'ending_offsets')")


def _give(names: tuple[str, ...]) -> str:
    """Options to give instead, as a message names them."""
    quoted = " and ".join(repr(n) for n in names)
    return f"option {quoted}" if len(names) == 1 else f"options {quoted}"


# Spark's Kafka security options that oncelog takes otherwise (the table's
# list of Kafka properties, as kafka.*).
_KAFKA_SECURITY_UNSUPPORTED = {
    f"kafka.{prop}": refused.reason.format(give=_give(refused.instead))
    for prop, refused in config_def.REFUSED_KAFKA_PROPERTIES.items()
}
_SECURITY = ("not supported; the oncelog source and sinks take " +
             ", ".join(repr(name) for name in _SECURITY_OPTIONS) + " (and Kafka's " +
             ", ".join(config_def.key(name).spark_alias or "" for name in _SECURITY_OPTIONS
                       if config_def.key(name).spark_alias) + ")")

# Spark's Kafka source options that oncelog has no equivalent for: refused
# with the reason, so a ported job does not silently behave otherwise.
_KAFKA_SOURCE_UNSUPPORTED = {
    "assign": "'assign' (reading chosen partitions) is not supported: the oncelog source "
              "reads every partition of its topics ('subscribe' / 'topics', or "
              "'subscribePattern' / 'topic_pattern')",
    "startingtimestamp": _BY_TIMESTAMP,
    "startingoffsetsbytimestamp": _BY_TIMESTAMP,
    "startingoffsetsbytimestampstrategy": _BY_TIMESTAMP,
    "endingtimestamp": _BY_TIMESTAMP,
    "endingoffsetsbytimestamp": _BY_TIMESTAMP,
    "minoffsetspertrigger": "not supported: a micro-batch takes what there is, up to "
                            "'maxOffsetsPerTrigger' / 'max_records_per_trigger'",
    "maxtriggerdelay": "not supported: a micro-batch takes what there is, up to "
                       "'maxOffsetsPerTrigger' / 'max_records_per_trigger'",
    "minpartitions": "not supported: the oncelog source reads each topic partition's range "
                     "in one Spark partition",
    "maxrecordsperpartition": "not supported: the oncelog source reads each topic "
                              "partition's range in one Spark partition",
    "groupidprefix": _NO_GROUP,
    "kafka.group.id": _NO_GROUP,
    "fetchoffset.numretries": "not supported: offset look-ups retry within the client's own "
                              "time budget",
    "fetchoffset.retryintervalms": "not supported: offset look-ups retry within the "
                                   "client's own time budget",
}

_SECURITY_PREFIXES = ("kafka.security.", "kafka.ssl.", "kafka.sasl.")


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How the source's and the sinks' clients connect (the security
    options, checked): what `client_options()` gives every Producer,
    Consumer and Admin they make, on the driver and in the executors."""

    protocol: str = PLAINTEXT
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    token_file: str | None = None

    def client_options(self) -> dict[str, Any]:
        """The SDK's keyword options (docs/sdk.md): the files are read when
        a client is made, the token file again for each new token."""
        return config_def.security_client_options(
            protocol=self.protocol, cafile=self.cafile, certfile=self.certfile,
            keyfile=self.keyfile, token_file=self.token_file)


def _security(given: _Given) -> ClientSecurity:
    files = {name: given.get(name, "").strip() or None
             for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "sasl_oauth_token_file")}
    token_file = files.pop("sasl_oauth_token_file")
    if "sasl_mechanism" in given and given["sasl_mechanism"].strip().upper() != OAUTHBEARER:
        raise OptionError(f"option {given.label('sasl_mechanism')} must be OAUTHBEARER (the "
                          f"only mechanism: a bearer token), got {given['sasl_mechanism']!r}")
    if "security_protocol" in given:
        protocol = given["security_protocol"].strip().upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise OptionError(f"option {given.label('security_protocol')} must be one of "
                              f"{', '.join(SECURITY_PROTOCOLS)}, got "
                              f"{given['security_protocol']!r}")
    else:
        protocol = config_def.default_security_protocol(
            tls_files=any(files.values()), token_file=token_file is not None)
    if protocol == PLAINTEXT:
        given_files = [name for name, value in files.items() if value]
        if given_files:
            raise OptionError(f"option {given.label(given_files[0])} is set, but option "
                              f"{given.label('security_protocol')} is PLAINTEXT (no TLS)")
    if (token_file is not None or "sasl_mechanism" in given) != (protocol == config_def.SASL_SSL):
        raise OptionError(
            f"option {given.label('security_protocol')} SASL_SSL and option "
            f"'sasl_oauth_token_file' go together (a bearer token is sent over TLS only), got "
            f"{protocol} and {'a' if token_file else 'no'} token file")
    if (files["ssl_certfile"] is None) != (files["ssl_keyfile"] is None):
        raise OptionError("options 'ssl_certfile' and 'ssl_keyfile' go together: a client "
                          "certificate needs its private key")
    return ClientSecurity(protocol=protocol, cafile=files["ssl_cafile"],
                          certfile=files["ssl_certfile"], keyfile=files["ssl_keyfile"],
                          token_file=token_file)


class _Given:
    """Options by their oncelog names, remembering the name each was given
    under (an oncelog name or a Kafka alias) for messages."""

    def __init__(self, values: dict[str, str], labels: dict[str, str]) -> None:
        self.values = values
        self._labels = labels

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def __getitem__(self, name: str) -> str:
        return self.values[name]

    def get(self, name: str, default: str) -> str:
        return self.values.get(name, default)

    def name(self, name: str) -> str:
        """The name option `name` was given under."""
        return self._labels.get(name, name)

    def label(self, name: str) -> str:
        """The option's name as given, quoted for a message."""
        return repr(self.name(name))


def _resolve_aliases(options: Mapping[str, str], aliases: Mapping[str, KafkaAlias]) -> _Given:
    """Options by oncelog name; an alias given with its oncelog name (or
    with another alias of it) must agree with it."""
    values: dict[str, str] = {}
    labels: dict[str, str] = {}
    for name, value in options.items():
        alias = aliases.get(name)
        ours, label = (name, name) if alias is None else (alias.oncelog, alias.kafka)
        if ours in values:
            if values[ours].strip() != value.strip():
                raise OptionError(
                    f"options {labels[ours]!r} and {label!r} name the same setting "
                    f"({ours!r}) with different values, {values[ours]!r} and {value!r}: "
                    f"give one"
                )
            if alias is not None:
                continue        # keep the oncelog name for messages
        values[ours] = value
        labels[ours] = label
    return _Given(values, labels)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """What one read (batch or streaming) was asked to do."""

    bootstrap: str
    # The topics named ('topics'); empty when `topic_pattern` chooses them.
    topics: tuple[str, ...]
    isolation_level: str
    starting_offsets: OffsetSpec
    # Batch reads only: where to stop.
    ending_offsets: OffsetSpec
    # Streaming only: offsets per micro-batch at most (None: all available).
    max_records_per_trigger: int | None
    poll_timeout_ms: int
    # A regular expression (Python's `re`, matched against whole topic
    # names): every topic it matches is read, found again at each
    # micro-batch. None: `topics` are read.
    topic_pattern: str | None = None
    # Records the read should return but that are gone (retention removed
    # them, the topic was deleted or recreated): True fails, False skips
    # them with a warning (Spark's Kafka source's failOnDataLoss).
    fail_on_data_loss: bool = True
    # How the clients connect (TLS, a client certificate, a token).
    security: ClientSecurity = ClientSecurity()

    def reads(self, topic: str) -> bool:
        """True when the query reads `topic` (named, or matched by the pattern)."""
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics

    @property
    def topics_label(self) -> str:
        """What chooses the topics, for messages."""
        if self.topic_pattern is not None:
            return f"topic_pattern {self.topic_pattern!r}"
        return f"topics {', '.join(self.topics)}"

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        _include_headers(lowered)
        _check_names(lowered, _OPTIONS, aliases=KAFKA_SOURCE_ALIASES,
                      unsupported=_KAFKA_SOURCE_UNSUPPORTED,
                      hints={"topic": "topics", "pattern": "topic_pattern"})
        given = _resolve_aliases(lowered, KAFKA_SOURCE_ALIASES)

        bootstrap = _bootstrap(given, _OPTIONS)
        topics, pattern = _topics(given)

        isolation_level = given.get("isolation_level", "read_committed").strip().lower()
        if isolation_level not in ISOLATION_LEVELS:
            raise OptionError(
                f"option {given.label('isolation_level')} must be one of "
                f"{', '.join(ISOLATION_LEVELS)}, got {given['isolation_level']!r}"
            )

        # Defaults as Spark's Kafka source: a stream starts at the end (new
        # records only), a batch read takes everything there is.
        starting = _spec(given, "starting_offsets", LATEST if streaming else EARLIEST)
        if "ending_offsets" in given and streaming:
            raise OptionError(
                f"option {given.label('ending_offsets')} applies to batch reads (spark.read) "
                f"only; a stream has no end"
            )
        ending = _spec(given, "ending_offsets", LATEST)
        if not streaming:
            # A batch read from "latest" reads nothing by definition, and one
            # that ends at "earliest" too: both are mistakes.
            if starting.mentions(LATEST_OFFSET):
                raise OptionError(
                    f"option {given.label('starting_offsets')} cannot be 'latest' (or -1) in "
                    f"a batch read"
                )
            if ending.mentions(EARLIEST_OFFSET):
                raise OptionError(
                    f"option {given.label('ending_offsets')} cannot be 'earliest' (or -2) in "
                    f"a batch read"
                )
        for spec, option in ((starting, "starting_offsets"), (ending, "ending_offsets")):
            if spec.per_partition is None:
                continue
            named = {tp.topic for tp in spec.per_partition}
            if pattern is not None:
                strangers = sorted(t for t in named if re.fullmatch(pattern, t) is None)
                chooser = f"option {given.label('topic_pattern')} does not match"
            else:
                strangers = sorted(named - set(topics))
                chooser = f"option {given.label('topics')} does not name"
            if strangers:
                raise OptionError(
                    f"option {given.label(option)} names topics that {chooser}: "
                    f"{', '.join(strangers)}"
                )

        max_records: int | None = None
        if "max_records_per_trigger" in given:
            if not streaming:
                raise OptionError(
                    f"option {given.label('max_records_per_trigger')} applies to streaming "
                    f"reads only"
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
            topic_pattern=pattern,
            fail_on_data_loss=_boolean(given, "fail_on_data_loss", default=True),
            security=_security(given),
        )


def _topics(given: _Given) -> tuple[tuple[str, ...], str | None]:
    """The named topics, or the pattern: exactly one of the two (as Spark's
    Kafka source takes exactly one of subscribe and subscribePattern)."""
    has_topics = bool(given.get("topics", "").strip())
    has_pattern = "topic_pattern" in given
    if has_topics and has_pattern:
        raise OptionError(
            f"options {given.label('topics')} and {given.label('topic_pattern')} both choose "
            f"the topics to read: give one"
        )
    if has_pattern:
        pattern = given["topic_pattern"].strip()
        if not pattern:
            raise OptionError(
                f"option {given.label('topic_pattern')} must be a regular expression over "
                f"topic names, got {given['topic_pattern']!r}"
            )
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(
                f"option {given.label('topic_pattern')} is not a valid regular expression "
                f"({exc}), got {given['topic_pattern']!r}"
            ) from None
        return (), pattern
    text = _required(given, "topics", _OPTIONS,
                     alternative="'topic_pattern' (Kafka: 'subscribe' or 'subscribePattern')")
    topics = tuple(dict.fromkeys(t.strip() for t in text.split(",")))
    if any(not t for t in topics):
        raise OptionError(
            f"option {given.label('topics')} must be comma-separated topic names, got "
            f"{given['topics']!r}"
        )
    return topics, None


def _include_headers(lowered: dict[str, str]) -> None:
    """Kafka's includeHeaders: the oncelog source always has the `headers`
    column, so "true" asks for what is there anyway; "false" cannot be had."""
    if "includeheaders" not in lowered:
        return
    value = lowered.pop("includeheaders")
    if value.strip().lower() == "true":
        return
    raise OptionError(
        f"option 'includeHeaders' must be 'true' for the oncelog source, whose schema always "
        f"has the `headers` column (drop the column instead), got {value!r}"
    )


def _check_names(
    given: Mapping[str, str],
    known: Mapping[str, str],
    *,
    what: str = "source",
    path_hint: str = "name the topics with option 'topics'",
    aliases: Mapping[str, KafkaAlias],
    unsupported: Mapping[str, str],
    hints: Mapping[str, str],
) -> None:
    squashed = {name.replace("_", ""): name for name in known}
    for name in given:
        if name in known or name in aliases:
            continue
        if name == "path":
            raise OptionError(f"the oncelog {what} takes no path: {path_hint}")
        if name in unsupported:
            raise OptionError(f"option {name!r} of Spark's Kafka {what}: {unsupported[name]}")
        if name in _KAFKA_SECURITY_UNSUPPORTED:
            raise OptionError(f"option {name!r}: {_KAFKA_SECURITY_UNSUPPORTED[name]}")
        if name.startswith(_SECURITY_PREFIXES):
            raise OptionError(f"option {name!r}: {_SECURITY}")
        if name.startswith("kafka.") and name not in hints:
            passed = ", ".join(a.kafka for a in aliases.values() if a.kafka.startswith("kafka."))
            raise OptionError(
                f"option {name!r}: Kafka client properties (kafka.*) are not passed through; "
                f"the oncelog {what} takes {passed}"
            )
        hint = hints.get(name) or squashed.get(name.replace("_", ""))
        meant = f"; did you mean {hint!r}?" if hint else ""
        raise OptionError(
            f"unknown option {name!r} for the oncelog {what}{meant} "
            f"(known: {', '.join(known)}; and Spark's Kafka names "
            f"{', '.join(a.kafka for a in aliases.values())})"
        )


def _required(given: _Given, name: str, known: Mapping[str, str], *,
              alternative: str = "") -> str:
    value = given.get(name, "").strip()
    if not value:
        other = f", or {alternative}" if alternative else ""
        raise OptionError(f"option {given.label(name)} is required ({known[name]}){other}")
    return value


def _bootstrap(given: _Given, known: Mapping[str, str]) -> str:
    bootstrap = _required(given, "bootstrap", known,
                          alternative="Kafka's 'kafka.bootstrap.servers'")
    try:
        config_def.key("bootstrap").check(bootstrap, {})
    except ValueError as exc:
        raise OptionError(f"option {given.label('bootstrap')}: {exc}") from None
    return bootstrap


def _spec(given: _Given, name: str, default: str) -> OffsetSpec:
    try:
        return parse_spec(given.get(name, default), option=given.name(name))
    except OffsetsError as exc:
        raise OptionError(str(exc)) from None


def _positive_int(given: _Given, name: str) -> int:
    text = given[name].strip()
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise OptionError(
            f"option {given.label(name)} must be a positive integer, got {given[name]!r}"
        )
    return value


def _boolean(given: _Given, name: str, *, default: bool) -> bool:
    if name not in given:
        return default
    text = given[name].strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"option {given.label(name)} must be true or false, got "
                          f"{given[name]!r}")
    return text == "true"


# ------------------------------------------------------------------ sinks

# The producer's default (oncelog.config_def).
DEFAULT_TRANSACTION_TIMEOUT_MS: int = config_def.key("transaction_timeout_ms").default

# The sinks' own options, then the clients' that they take (the table's:
# bootstrap, transaction_timeout_ms, the security settings).
_SINK_OPTIONS = {
    "topic": "the output topic (rows may name another in a `topic` column); its "
             "partitions also key the sink's committed batch ids",
    "app_id": "names the sink's transactional ids and its sink-side group; one per query",
    "test_crash_after_records": "tests only: the first write task to send this many "
                                "records kills its own process",
    "test_crash_marker": "tests only: the file that makes test_crash_after_records fire once",
    "test_hold_commit_marker": "tests only: the driver's commit creates this file, then "
                               "waits for the process to be killed",
    **_table_options(PRODUCER),
}

# Kafka names whose meaning differs from ours: a hint, not an alias (a
# transactional id is one producer's; app_id names a family of them).
_SINK_HINTS = {
    "transactional.id": "app_id",
    "kafka.transactional.id": "app_id",
    "topics": "topic",
}

# Options that Spark passes to a sink with the user's own, for its own use.
_SPARK_SINK_OPTIONS = frozenset({"checkpointlocation", "queryname"})

# A transactional id is APP_ID-N; keep the whole within the store's limits
# and readable in the admin tools.
MAX_APP_ID_CHARS = 200

# The default app_id: this prefix and the first 16 hex digits of the
# SHA-256 of the query's checkpoint location (normalized).
DEFAULT_APP_ID_PREFIX = "spark-"
_DEFAULT_APP_ID_HEX_DIGITS = 16


def checkpoint_identity(checkpoint_location: str) -> str:
    """The checkpoint location in one spelling per place: a local path as
    `file:/abs/path` (`/abs/path/`, `file:///abs/path` and `file:/abs//path`
    are all the same directory), any other URI as `scheme://authority/path`
    with its path normalized. Raises OptionError for a relative path: Spark
    resolves one against the driver's working directory, which the sink's
    Python workers do not always share (under Spark Connect they run in a
    directory of their own per session), so it names no place the sink can
    see."""
    text = checkpoint_location.strip()
    parts = urlsplit(text)
    # A one-letter scheme is a Windows drive, not a URI scheme.
    if len(parts.scheme) > 1 and parts.scheme.lower() != "file":
        # Object stores and HDFS: only repeated and trailing slashes are
        # spelling ("a/../b" may be a key of its own).
        path = re.sub("/+", "/", parts.path).rstrip("/") or "/"
        return f"{parts.scheme.lower()}://{parts.netloc}{path}"
    path = parts.path if parts.scheme.lower() == "file" else text
    if not posixpath.isabs(path):
        raise OptionError(
            f"option 'checkpointLocation' {checkpoint_location!r} is relative: the sink "
            f"derives its default app_id from the checkpoint location, and a relative one is "
            f"resolved against the driver's working directory, which the sink cannot see. "
            f"Give an absolute checkpointLocation, or option 'app_id'"
        )
    path = posixpath.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return f"file:{path}"


def default_app_id(checkpoint_location: str) -> str:
    """The app_id of a `format("oncelog")` sink given none: `spark-` and the
    first 16 hex digits of the SHA-256 of `checkpoint_identity(location)`.
    A query restarted from the same checkpoint gets the same one, so its
    writers' transactional ids fence the previous run's (its zombies)."""
    digest = hashlib.sha256(checkpoint_identity(checkpoint_location).encode()).hexdigest()
    return DEFAULT_APP_ID_PREFIX + digest[:_DEFAULT_APP_ID_HEX_DIGITS]


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """What a sink (the foreachBatch helper or format("oncelog")) writes and
    under which identity."""

    bootstrap: str
    topic: str
    app_id: str
    transaction_timeout_ms: int
    # True when no app_id was given and `app_id` was derived from the
    # query's checkpoint location (default_app_id).
    app_id_from_checkpoint: bool = False
    # The sink-side group that keeps the written batch ids; None: `app_id`.
    # A derived app_id's group also names the query's id (the stream
    # writer sets it in each task), so a new checkpoint at an old one's
    # path starts with no batch ids (stream_sink.py).
    group_id: str | None = None
    # Fault injection for the tests (docs/spark.md, "Testing the sinks").
    test_crash_after_records: int | None = None
    test_crash_marker: str | None = None
    test_hold_commit_marker: str | None = None
    # How the clients connect (TLS, a client certificate, a token).
    security: ClientSecurity = ClientSecurity()

    @property
    def group(self) -> str:
        """The sink-side group: where each writer's batch ids are committed."""
        return self.group_id or self.app_id

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        checkpoint = lowered.get("checkpointlocation", "").strip()
        own = {k: v for k, v in lowered.items() if k not in _SPARK_SINK_OPTIONS}
        _check_names(own, _SINK_OPTIONS, what="sink",
                     path_hint="name the output topic with option 'topic'",
                     aliases=KAFKA_SINK_ALIASES, unsupported={}, hints=_SINK_HINTS)
        given = _resolve_aliases(own, KAFKA_SINK_ALIASES)
        bootstrap = _bootstrap(given, _SINK_OPTIONS)
        topic = _required(given, "topic", _SINK_OPTIONS)
        if "," in topic:
            raise OptionError(
                f"option 'topic' names one output topic, got {given['topic']!r} (rows go to "
                f"other topics through a `topic` column)"
            )
        app_id = given.get("app_id", "").strip()
        from_checkpoint = not app_id
        if from_checkpoint:
            if not checkpoint:
                raise OptionError(
                    f"option 'app_id' is required ({_SINK_OPTIONS['app_id']}) unless the "
                    f"query gives its checkpoint with option 'checkpointLocation', from which "
                    f"the sink derives one (a checkpoint set with the session's "
                    f"spark.sql.streaming.checkpointLocation does not reach the sink)"
                )
            app_id = default_app_id(checkpoint)
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
            app_id_from_checkpoint=from_checkpoint,
            test_crash_after_records=crash_after,
            test_crash_marker=crash_marker,
            test_hold_commit_marker=hold_marker,
            security=_security(given),
        )
