"""The clients' options, declared once (Kafka's ConfigDef).

Every keyword option of `Producer`, `Consumer` and `Admin` is one
`ConfigKey` in `KEYS`: its name, its type (as the constructor annotates
it), its default, the check its value must pass, what it means, Kafka's
property name for it, the CLI's environment variable, and whether the Spark
source and sinks take it. What used to be parsed three times is derived
from here:

* the constructors check what they are given with `validate(client,
  given)`: each value against its key's validator, in the table's order,
  then the rules that tie options together (idempotence and acks, a group
  for auto-commit, the security settings as a whole);
* `oncelog._keywords` takes Kafka's names for our options from here
  (`KAFKA_NAMES`: `bootstrap_servers` is `bootstrap`);
* the CLI's security flags, their environment variables and the property
  names of a `--command-config` file (`cli_settings()`), and the Spark
  options that are client options, with Spark's Kafka names for them
  (`spark_keys()`);
* the "Client options" section of docs/configuration.md (`markdown()`)
  and docs/cli.md's table of the security settings (`cli_markdown()`);
  tests/unit/test_config_def.py keeps the pages equal to the table, and
  `python -m oncelog.config_def --write DOC` rewrites them.

A test compares the table with `inspect.signature` of each constructor, so
an option added to a constructor and not here (or the other way round), or a
default changed in one place only, fails.

Only construction reads the table: nothing here runs per record.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncelog._client import split_bootstrap
from oncelog._config import (
    DEFAULT_CLIENT_ID,
    acks_option,
    bool_option,
    choice_option,
    client_id_option,
    int_option,
)
from oncelog._group import check_group_id
from oncelog._security import (
    OAUTHBEARER,
    PLAINTEXT,
    SASL_SSL,
    SECURITY_PROTOCOLS,
    SSL,
    SecurityConfig,
    TokenFileProvider,
    security_options,
)
from oncelog.wire.compression import CODEC_NAMES
from oncelog.wire.vocabulary import IsolationLevel, OffsetReset

__all__ = [
    "ADMIN", "BOOTSTRAP_ENV", "CLIENTS", "COMMAND_CONFIG_ENV", "CONNECTION", "CONSUMER",
    "CONSUMING", "KAFKA_NAMES", "KEYS", "MAX_FETCH_WAIT_MS", "MAX_IN_FLIGHT_IDEMPOTENT",
    "OAUTHBEARER", "PLAINTEXT", "PRODUCER", "PRODUCING", "REFUSED_KAFKA_PROPERTIES",
    "REQUIRED", "SASL_SSL", "SECURITY", "SECURITY_PROTOCOLS", "SSL", "TOKEN_FILE",
    "ClientOptions", "ConfigKey", "Refused", "TokenFileProvider", "cli_markdown",
    "cli_settings", "client_keys", "default_security_protocol", "key", "markdown",
    "replace_section", "security_client_options", "spark_keys", "tool_doc", "validate",
]

PRODUCER = "producer"
CONSUMER = "consumer"
ADMIN = "admin"
CLIENTS = (PRODUCER, CONSUMER, ADMIN)
_CLASS_NAMES = {PRODUCER: "Producer", CONSUMER: "Consumer", ADMIN: "Admin"}

# The groups of keys, in the order the docs show them.
CONNECTION = "connection"
PRODUCING = "producer"
CONSUMING = "consumer"
SECURITY = "security"

_MIB = 1024 * 1024
# The CLI's environment variable for --bootstrap.
BOOTSTRAP_ENV = "ONCELOG_BOOTSTRAP"
# Longest a store may make a Fetch wait (services/common/kernel/limits.py
# MAX_FETCH_WAIT_MS): the bound of fetch_max_wait_ms.
MAX_FETCH_WAIT_MS = 30_000


class _Required:
    """The default of an option that has none (`bootstrap`)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


# ------------------------------------------------------------ validators
# Each checks one value (`checked` holds the options checked before it, in
# the table's order) and returns it, perhaps normalized; `describe()` is
# what the docs say about the values it takes.


@dataclass(frozen=True, slots=True)
class IntRange:
    """An int (never a bool) at least `minimum` (or at least the value of
    option `at_least`), at most `maximum`."""

    minimum: int | None = None
    maximum: int | None = None
    at_least: str | None = None

    def check(self, name: str, value: object, checked: Mapping[str, Any]) -> object:
        minimum = self.minimum if self.at_least is None else checked[self.at_least]
        number = int_option(name, value, minimum=minimum)
        if self.maximum is not None and number > self.maximum:
            raise ValueError(f"{name} must be within {minimum}..{self.maximum}, got {number}")
        return number

    def describe(self) -> str:
        if self.at_least is not None:
            return f">= `{self.at_least}`"
        if self.maximum is not None:
            return f"{self.minimum}..{self.maximum}"
        return "" if self.minimum is None else f">= {self.minimum}"


@dataclass(frozen=True, slots=True)
class IsBool:
    """True or False; None too where `optional` (the default is derived)."""

    optional: bool = False

    def check(self, name: str, value: object, checked: Mapping[str, Any]) -> object:
        if value is None and self.optional:
            return None
        return bool_option(name, value)

    def describe(self) -> str:
        return "True, False" + (", None" if self.optional else "")


@dataclass(frozen=True, slots=True)
class OneOf:
    """One of `choices` (exactly as spelled)."""

    choices: tuple[str, ...]

    def check(self, name: str, value: object, checked: Mapping[str, Any]) -> object:
        return choice_option(name, value, self.choices)

    def describe(self) -> str:
        return ", ".join(f"`{c}`" for c in self.choices)


@dataclass(frozen=True, slots=True)
class Acks:
    """Kafka's acks: "all" (or -1) or 1, returned as -1 or 1 (whether an
    idempotent producer may have it is a rule of the producer's)."""

    def check(self, name: str, value: object, checked: Mapping[str, Any]) -> object:
        return acks_option(value, idempotent=False)

    def describe(self) -> str:
        return "`all` (= -1), 1"


@dataclass(frozen=True, slots=True)
class NonEmptyStr:
    """A non-empty str, or None."""

    def check(self, name: str, value: object, checked: Mapping[str, Any]) -> object:
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{name} must be a non-empty str or None, got {value!r}")
        return value

    def describe(self) -> str:
        return "non-empty"


@dataclass(frozen=True, slots=True)
class Checked:
    """A check of the SDK's own (`function(value)`, raising ValueError),
    for a value other than None; the value is kept as given."""

    function: Callable[[Any], object]
    description: str

    def check(self, name: str, value: object, checked: Mapping[str, Any]) -> object:
        if value is not None:
            self.function(value)
        return value

    def describe(self) -> str:
        return self.description


@dataclass(frozen=True, slots=True)
class Hook:
    """A callable (a serializer or deserializer), or None."""

    signature: str    # what it takes and returns, for the message

    def check(self, name: str, value: object, checked: Mapping[str, Any]) -> object:
        if value is not None and not callable(value):
            raise ValueError(f"{name} must be a callable ({self.signature}) or None, "
                             f"got {value!r}")
        return value

    def describe(self) -> str:
        return f"a callable ({self.signature})"


@dataclass(frozen=True, slots=True)
class Together:
    """Checked with the other security options when all are known
    (oncelog._security.security_options: which go together, the files)."""

    description: str

    def check(self, name: str, value: object, checked: Mapping[str, Any]) -> object:
        return value

    def describe(self) -> str:
        return self.description


Validator = IntRange | IsBool | OneOf | Acks | NonEmptyStr | Checked | Hook | Together


# ------------------------------------------------------------------- keys

@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One option of the clients: what the constructors, the CLI, the Spark
    source and sinks and the docs know of it."""

    name: str
    # As the constructors annotate it (a test compares).
    type: str
    default: Any
    doc: str
    # Which of PRODUCER, CONSUMER, ADMIN take it (none: an option of the
    # CLI and Spark only, standing for a client option: TOKEN_FILE).
    clients: frozenset[str]
    group: str
    validator: Validator | None = None
    # Kafka's property names for it (the first is the one a client
    # properties file uses), and other clients' keyword names
    # (kafka-python's, confluent-kafka's) where they differ from both.
    kafka: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    # The CLI's environment variable (the flag is `--` and the name with
    # dashes); None: the CLI has no flag for it.
    env: str | None = None
    # The Spark source and sinks take it under its name; with spark_kafka,
    # also under Spark's Kafka name for it ("kafka." and the property).
    spark: bool = False
    spark_kafka: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def kafka_name(self) -> str | None:
        """The Kafka property name a client properties file uses."""
        return self.kafka[0] if self.kafka else None

    @property
    def choices(self) -> tuple[str, ...]:
        """The values it takes, when they are a list (OneOf)."""
        return self.validator.choices if isinstance(self.validator, OneOf) else ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def spark_alias(self) -> str | None:
        """Spark's Kafka source/sink option that means this one."""
        if not self.spark_kafka or not self.kafka:
            return None
        return "kafka." + self.kafka[0]

    def check(self, value: object, checked: Mapping[str, Any]) -> object:
        return value if self.validator is None else self.validator.check(
            self.name, value, checked)


_ALL = frozenset(CLIENTS)
_PRODUCER = frozenset({PRODUCER})
_CONSUMER = frozenset({CONSUMER})
_CONSUMER_ADMIN = frozenset({CONSUMER, ADMIN})
_PRODUCER_CONSUMER = frozenset({PRODUCER, CONSUMER})
_PATH = "str | os.PathLike[str] | None"

# In the order the docs list them: the connection, the producer's, the
# consumer's, the timing every client has, then security. Within a client
# the order is not its signature's (one order cannot be every client's).
KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("bootstrap", "str", REQUIRED,
              "`host:port` of one or more partition stores, comma-separated: the client "
              "asks one of them for the cluster's metadata",
              _ALL, CONNECTION, Checked(split_bootstrap, "`host:port`, comma-separated"),
              kafka=("bootstrap.servers",), env=BOOTSTRAP_ENV,
              spark=True, spark_kafka=True),
    ConfigKey("client_id", "str", DEFAULT_CLIENT_ID,
              "this client's name in the stores' quotas and logs, with its principal (at most "
              "249 characters)",
              _PRODUCER_CONSUMER, CONNECTION,
              Checked(client_id_option, "1..249 characters"), kafka=("client.id",)),
    # The producer's.
    ConfigKey("transactional_id", "str | None", None,
              "makes the producer transactional; one per producer instance across restarts "
              "(it fences the instance's previous incarnation)",
              _PRODUCER, PRODUCING, NonEmptyStr(), kafka=("transactional.id",)),
    ConfigKey("enable_idempotence", "bool | None", None,
              "per-partition sequence numbers, so a retry is never written twice; None: on, "
              "unless `acks=1` without a transactional id",
              _PRODUCER, PRODUCING, IsBool(optional=True), kafka=("enable.idempotence",)),
    ConfigKey("acks", "str | int", "all",
              "`all` (or -1) or 1, Kafka's spellings; the store acknowledges a write once "
              "every in-sync replica has it either way (it has no leader-only "
              "acknowledgement); 0 is refused, and an idempotent producer needs `all`",
              _PRODUCER, PRODUCING, Acks(), kafka=("acks",)),
    ConfigKey("linger_ms", "int", 5,
              "how long a batch waits for more records before it is sent",
              _PRODUCER, PRODUCING, IntRange(minimum=0), kafka=("linger.ms",)),
    ConfigKey("batch_size", "int", 16384,
              "bytes of records (before compression) a batch holds at most",
              _PRODUCER, PRODUCING, IntRange(minimum=1), kafka=("batch.size",)),
    ConfigKey("compression_type", "str", "none",
              "the codec of every batch's records",
              _PRODUCER, PRODUCING, OneOf(tuple(CODEC_NAMES)), kafka=("compression.type",)),
    ConfigKey("max_in_flight", "int", 5,
              "unacknowledged batches per partition at most (at most 5 when idempotent)",
              _PRODUCER, PRODUCING, IntRange(minimum=1),
              kafka=("max.in.flight.requests.per.connection",)),
    ConfigKey("transaction_timeout_ms", "int", 60_000,
              "how long a transaction may stay open before the coordinator aborts it",
              _PRODUCER, PRODUCING, IntRange(minimum=1), kafka=("transaction.timeout.ms",),
              spark=True, spark_kafka=True),
    ConfigKey("delivery_timeout_ms", "int", 120_000,
              "how long `send()` may take in all, retries included, before its future fails",
              _PRODUCER, PRODUCING, IntRange(minimum=1), kafka=("delivery.timeout.ms",)),
    ConfigKey("buffer_memory_bytes", "int", 32 * _MIB,
              "bytes of records waiting to be sent at most; `send()` then blocks",
              _PRODUCER, PRODUCING, IntRange(minimum=1), kafka=("buffer.memory",)),
    ConfigKey("max_block_ms", "int", 60_000,
              "how long `send()` and the transactional calls block at most (full buffer, "
              "unknown topic)",
              _PRODUCER, PRODUCING, IntRange(minimum=0), kafka=("max.block.ms",)),
    ConfigKey("transaction_two_phase_commit_enable", "bool", False,
              "take part in an outside two-phase commit (KIP-939); needs a transactional id",
              _PRODUCER, PRODUCING, IsBool(),
              kafka=("transaction.two.phase.commit.enable",), aliases=("enable_2pc",)),
    ConfigKey("key_serializer", "Serializer | None", None,
              "turns the key given to `send()` into bytes",
              _PRODUCER, PRODUCING, Hook("value -> bytes"), kafka=("key.serializer",)),
    ConfigKey("value_serializer", "Serializer | None", None,
              "turns the value given to `send()` into bytes",
              _PRODUCER, PRODUCING, Hook("value -> bytes"), kafka=("value.serializer",)),
    # The consumer's.
    ConfigKey("group_id", "str | None", None,
              "the consumer group: `subscribe()`, committed offsets",
              _CONSUMER, CONSUMING, Checked(check_group_id, "non-empty"), kafka=("group.id",)),
    ConfigKey("group_instance_id", "str | None", None,
              "a static member's id (needs `group_id`)",
              _CONSUMER, CONSUMING, NonEmptyStr(), kafka=("group.instance.id",)),
    ConfigKey("isolation_level", "str", IsolationLevel.READ_COMMITTED.value,
              "`read_committed`: records of committed transactions only; "
              "`read_uncommitted`: every record",
              _CONSUMER, CONSUMING, OneOf(tuple(sorted(i.value for i in IsolationLevel))),
              kafka=("isolation.level",), spark=True, spark_kafka=True),
    ConfigKey("auto_offset_reset", "str", OffsetReset.EARLIEST.value,
              "where a partition without a committed offset starts (`none`: raise)",
              _CONSUMER, CONSUMING, OneOf(tuple(r.value for r in OffsetReset)),
              kafka=("auto.offset.reset",)),
    ConfigKey("enable_auto_commit", "bool", False,
              "commit the group's offsets every `auto_commit_interval_ms` (needs `group_id`)",
              _CONSUMER, CONSUMING, IsBool(), kafka=("enable.auto.commit",)),
    ConfigKey("auto_commit_interval_ms", "int", 5_000,
              "how often offsets are committed with `enable_auto_commit`",
              _CONSUMER, CONSUMING, IntRange(minimum=1), kafka=("auto.commit.interval.ms",)),
    ConfigKey("max_poll_records", "int", 500,
              "records one `poll()` returns at most",
              _CONSUMER, CONSUMING, IntRange(minimum=1), kafka=("max.poll.records",)),
    ConfigKey("session_timeout_ms", "int", 10_000,
              "how long the group waits for a silent member before removing it",
              _CONSUMER, CONSUMING, IntRange(minimum=1), kafka=("session.timeout.ms",)),
    ConfigKey("fetch_max_wait_ms", "int", 500,
              "how long a store holds a Fetch waiting for `fetch_min_bytes`",
              _CONSUMER, CONSUMING, IntRange(minimum=0, maximum=MAX_FETCH_WAIT_MS),
              kafka=("fetch.max.wait.ms",)),
    ConfigKey("fetch_min_bytes", "int", 1,
              "bytes a Fetch waits for before it is answered",
              _CONSUMER, CONSUMING, IntRange(minimum=0), kafka=("fetch.min.bytes",)),
    ConfigKey("fetch_max_bytes", "int", 50 * _MIB,
              "bytes one Fetch answer holds at most (the first batch may exceed it)",
              _CONSUMER, CONSUMING, IntRange(minimum=1), kafka=("fetch.max.bytes",)),
    ConfigKey("max_partition_fetch_bytes", "int", _MIB,
              "bytes per partition one Fetch answer holds at most",
              _CONSUMER, CONSUMING, IntRange(minimum=1), kafka=("max.partition.fetch.bytes",)),
    ConfigKey("check_crcs", "bool", True,
              "check each fetched batch's CRC",
              _CONSUMER, CONSUMING, IsBool(), kafka=("check.crcs",)),
    ConfigKey("key_deserializer", "Deserializer | None", None,
              "turns a record's key bytes into what `poll()` returns",
              _CONSUMER, CONSUMING, Hook("bytes -> value"), kafka=("key.deserializer",)),
    ConfigKey("value_deserializer", "Deserializer | None", None,
              "turns a record's value bytes into what `poll()` returns",
              _CONSUMER, CONSUMING, Hook("bytes -> value"), kafka=("value.deserializer",)),
    # Every client's timing.
    ConfigKey("request_timeout_ms", "int", 30_000,
              "how long one request may wait for its answer",
              _ALL, CONNECTION, IntRange(minimum=1), kafka=("request.timeout.ms",)),
    ConfigKey("retry_backoff_ms", "int", 100,
              "the first pause before a retry (then doubled, with jitter)",
              _ALL, CONNECTION, IntRange(minimum=1), kafka=("retry.backoff.ms",)),
    ConfigKey("retry_backoff_max_ms", "int", 1_000,
              "the longest pause between retries",
              _ALL, CONNECTION, IntRange(at_least="retry_backoff_ms"),
              kafka=("retry.backoff.max.ms",)),
    ConfigKey("default_api_timeout_ms", "int", 60_000,
              "how long a blocking call without a `timeout` may take, connecting included",
              _CONSUMER_ADMIN, CONNECTION, IntRange(minimum=1),
              kafka=("default.api.timeout.ms",)),
    # Security (docs/sdk.md, "Connecting to a secured cluster").
    ConfigKey("security_protocol", "str", PLAINTEXT,
              "`PLAINTEXT`, `SSL` (TLS) or `SASL_SSL` (TLS and a bearer token); any case",
              _ALL, SECURITY, Together(", ".join(f"`{p}`" for p in SECURITY_PROTOCOLS)),
              kafka=("security.protocol",), env="ONCELOG_SECURITY_PROTOCOL",
              spark=True, spark_kafka=True),
    ConfigKey("ssl_cafile", _PATH, None,
              "the CA bundle (PEM) that signed the cluster's certificates (default: the "
              "system's roots)",
              _ALL, SECURITY, Together("a PEM file"), kafka=("ssl.cafile",),
              env="ONCELOG_SSL_CAFILE", spark=True),
    ConfigKey("ssl_certfile", _PATH, None,
              "this client's certificate (PEM), for mutual TLS: its subject is the principal",
              _ALL, SECURITY, Together("a PEM file, with `ssl_keyfile`"),
              kafka=("ssl.certfile",), env="ONCELOG_SSL_CERTFILE", spark=True),
    ConfigKey("ssl_keyfile", _PATH, None,
              "the private key (PEM, unencrypted) of the client certificate",
              _ALL, SECURITY, Together("a PEM file, with `ssl_certfile`"),
              kafka=("ssl.keyfile",), env="ONCELOG_SSL_KEYFILE", spark=True),
    ConfigKey("sasl_mechanism", "str | None", None,
              "`OAUTHBEARER`, the only mechanism (the one `SASL_SSL` uses when None)",
              _ALL, SECURITY, Together(f"`{OAUTHBEARER}`"), kafka=("sasl.mechanism",),
              spark=True, spark_kafka=True),
    ConfigKey("sasl_oauth_token_provider", "TokenProvider | None", None,
              "an object whose `token()` returns the bearer token (a JWT); with `SASL_SSL`",
              _ALL, SECURITY, Together("has `token()`")),
)

# Not a client's option: the CLI's and Spark's stand-in for
# `sasl_oauth_token_provider`, a file holding the token (TokenFileProvider).
TOKEN_FILE = ConfigKey(
    "sasl_oauth_token_file", "str | None", None,
    "a file holding the bearer token (a JWT), read again for each new token (a Kubernetes "
    "projected token, a sidecar's); stands for `sasl_oauth_token_provider` (and "
    "`sasl_mechanism` `OAUTHBEARER`)",
    frozenset(), SECURITY, kafka=("sasl.oauthbearer.token.file",),
    env="ONCELOG_SASL_OAUTH_TOKEN_FILE", spark=True)

@dataclass(frozen=True, slots=True)
class Refused:
    """A Kafka client property oncelog takes otherwise: why, as a sentence
    with `{give}` where the options to give instead go (each tool names
    them its way: `ssl.cafile` in a properties file, option 'ssl_cafile' in
    Spark)."""

    reason: str
    instead: tuple[str, ...]


_TRUSTSTORE = Refused("JKS/PKCS12 truststores are not read: give {give}, the CA bundle as PEM",
                      ("ssl_cafile",))
_KEYSTORE = Refused("JKS/PKCS12 keystores are not read: give {give} as PEM",
                    ("ssl_certfile", "ssl_keyfile"))
_JAAS = Refused("give the bearer token in a file: {give}", (TOKEN_FILE.name,))
# Kafka's security properties without an equivalent here (oncelog reads PEM
# files and a token file): the CLI's --command-config and the Spark options
# (as kafka.*) refuse them with what to give instead.
REFUSED_KAFKA_PROPERTIES: Mapping[str, Refused] = {
    "ssl.truststore.location": _TRUSTSTORE,
    "ssl.truststore.password": _TRUSTSTORE,
    "ssl.truststore.type": _TRUSTSTORE,
    "ssl.keystore.location": _KEYSTORE,
    "ssl.keystore.password": _KEYSTORE,
    "ssl.keystore.type": _KEYSTORE,
    "ssl.key.password": Refused("encrypted keys are not read: give {give} unencrypted (PEM)",
                                ("ssl_keyfile",)),
    "sasl.jaas.config": _JAAS,
    "sasl.login.callback.handler.class": _JAAS,
}

_BY_NAME = {k.name: k for k in (*KEYS, TOKEN_FILE)}


def key(name: str) -> ConfigKey:
    """The key of option `name` (TOKEN_FILE's too)."""
    return _BY_NAME[name]


def client_keys(client: str) -> tuple[ConfigKey, ...]:
    """The options of PRODUCER, CONSUMER or ADMIN, in the table's order."""
    return _CLIENT_KEYS[client]


_CLIENT_KEYS = {client: tuple(k for k in KEYS if client in k.clients) for client in CLIENTS}
_SECURITY_NAMES = tuple(k.name for k in KEYS if k.group == SECURITY)


def _python_name(name: str) -> str:
    return name.replace(".", "_").replace("-", "_")


# Kafka's (and kafka-python's, confluent-kafka's) keyword for an option ->
# ours, where they differ: what oncelog._keywords takes.
KAFKA_NAMES: Mapping[str, str] = {
    _python_name(other): k.name
    for k in KEYS for other in (*k.kafka, *k.aliases) if _python_name(other) != k.name
}


# ------------------------------------------------------------ validation

@dataclass(frozen=True, slots=True)
class ClientOptions:
    """A client's options, checked (`validate`): the values, some
    normalized (acks as -1 or 1, enable_idempotence decided), and the
    security settings made from them."""

    values: Mapping[str, Any]
    security: SecurityConfig

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


# Kafka's limit for an idempotent producer: the store deduplicates against the
# producer's last five batches per partition.
MAX_IN_FLIGHT_IDEMPOTENT = 5


def _producer_rules(given: Mapping[str, Any], values: dict[str, Any]) -> None:
    """What ties the producer's options together (Kafka's ProducerConfig)."""
    transactional_id = values["transactional_id"]
    if values["transaction_two_phase_commit_enable"] and transactional_id is None:
        raise ValueError("transaction_two_phase_commit_enable=True needs a transactional_id")
    idempotent = values["enable_idempotence"]
    if idempotent is None:
        # As in Kafka, an unset enable.idempotence gives way to acks=1.
        idempotent = transactional_id is not None or given["acks"] not in (1, "1")
        values["enable_idempotence"] = idempotent
    if transactional_id is not None and not idempotent:
        raise ValueError("a transactional producer is idempotent: transactional_id needs "
                         "enable_idempotence=True")
    acks_option(given["acks"], idempotent=idempotent)
    if idempotent and values["max_in_flight"] > MAX_IN_FLIGHT_IDEMPOTENT:
        raise ValueError(
            f"an idempotent producer allows at most {MAX_IN_FLIGHT_IDEMPOTENT} batches in "
            f"flight per partition (the store deduplicates against the last "
            f"{MAX_IN_FLIGHT_IDEMPOTENT}), got max_in_flight={values['max_in_flight']}")


def _consumer_rules(given: Mapping[str, Any], values: dict[str, Any]) -> None:
    if values["group_instance_id"] is not None and values["group_id"] is None:
        raise ValueError("group_instance_id needs a group_id")
    if values["enable_auto_commit"] and values["group_id"] is None:
        raise ValueError("enable_auto_commit needs a group_id (offsets are the group's)")


def _no_rules(given: Mapping[str, Any], values: dict[str, Any]) -> None:
    return None


_RULES: dict[str, Callable[[Mapping[str, Any], dict[str, Any]], None]] = {
    PRODUCER: _producer_rules, CONSUMER: _consumer_rules, ADMIN: _no_rules,
}


def validate(client: str, given: Mapping[str, Any]) -> ClientOptions:
    """`given` (every option of `client`, by our names) checked: each value
    by its key's validator, in the table's order, then the client's rules
    and the security settings together. A wrong value is a ValueError
    naming the option and the value received."""
    keys = _CLIENT_KEYS[client]
    if given.keys() != {k.name for k in keys}:
        # The constructor and the table disagree: a bug here, not the caller's.
        raise RuntimeError(f"{_CLASS_NAMES[client]}'s options and the table differ: "
                           f"{sorted(given.keys() ^ {k.name for k in keys})}")
    values: dict[str, Any] = {}
    for k in keys:
        values[k.name] = k.check(given[k.name], values)
    _RULES[client](given, values)
    security = security_options(**{name: values[name] for name in _SECURITY_NAMES})
    return ClientOptions(values, security)


# ------------------------------------------------- the CLI and Spark

def cli_settings() -> tuple[ConfigKey, ...]:
    """The security settings the CLI has flags (and environment variables)
    for, in order: each key's `flag`, `env` and `kafka_name` (the property
    of a --command-config file)."""
    return tuple(k for k in (*KEYS, TOKEN_FILE) if k.group == SECURITY and k.env is not None)


def spark_keys(client: str) -> tuple[ConfigKey, ...]:
    """The client options the Spark source (CONSUMER) or sinks (PRODUCER)
    take, in the table's order; TOKEN_FILE is one of them."""
    return tuple(k for k in (*KEYS, TOKEN_FILE)
                 if k.spark and (client in k.clients or not k.clients))


def default_security_protocol(*, tls_files: bool, token_file: bool) -> str:
    """The protocol the CLI and Spark take when none is given: SASL_SSL with
    a token file, SSL with a TLS file, else PLAINTEXT."""
    return SASL_SSL if token_file else SSL if tls_files else PLAINTEXT


def security_client_options(*, protocol: str, cafile: str | None = None,
                            certfile: str | None = None, keyfile: str | None = None,
                            token_file: str | None = None) -> dict[str, Any]:
    """The clients' keyword options for security settings given as text
    (the CLI's flags, Spark's options): the files as given, a token file as
    its TokenFileProvider with OAUTHBEARER."""
    options: dict[str, Any] = {"security_protocol": protocol}
    for name, value in (("ssl_cafile", cafile), ("ssl_certfile", certfile),
                        ("ssl_keyfile", keyfile)):
        if value:
            options[name] = value
    if token_file:
        options["sasl_mechanism"] = OAUTHBEARER
        options["sasl_oauth_token_provider"] = TokenFileProvider(token_file)
    return options


# ------------------------------------------------------------------ docs

DOC_BEGIN = ("<!-- generated from sdk/oncelog/config_def.py: "
             "python -m oncelog.config_def --write docs/configuration.md -->")
DOC_END = "<!-- end of generated client options -->"


def _shown_default(k: ConfigKey) -> str:
    if k.required:
        return "required"
    if isinstance(k.default, int) and not isinstance(k.default, bool) \
            and k.default >= _MIB and k.default % _MIB == 0:
        return f"`{k.default // _MIB} MiB`"
    return f"`{k.default!r}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _spark_cell(k: ConfigKey) -> str:
    if not k.spark:
        return "—"
    alias = k.spark_alias
    where = ("" if not k.clients or k.clients >= {PRODUCER, CONSUMER}
             else ", sinks" if PRODUCER in k.clients else ", source")
    return f"`{k.name}`" + ("" if alias is None else f" (`{alias}`)") + where


def markdown() -> str:
    """The "Client options" section of docs/configuration.md, between
    DOC_BEGIN and DOC_END (both included)."""
    lines = [DOC_BEGIN, ""]
    header = ["| option | type | default | valid values | Kafka property | Spark option | "
              "meaning |", "|---|---|---|---|---|---|---|"]
    for client in CLIENTS:
        lines += [f"### `{_CLASS_NAMES[client]}`", "", *header]
        for k in client_keys(client):
            valid = "" if k.validator is None else k.validator.describe()
            kafka = ", ".join(f"`{n}`" for n in (*k.kafka, *k.aliases)) or "—"
            lines.append(
                f"| `{k.name}` | `{_cell(k.type)}` | {_shown_default(k)} | {_cell(valid)} | "
                f"{kafka} | {_spark_cell(k)} | {_cell(k.doc)} |")
        lines.append("")
    lines += ["### The CLI's connection and security settings", "",
              "| flag | environment variable | `--command-config` property | Spark option | "
              "meaning |", "|---|---|---|---|---|"]
    for k in (key("bootstrap"), *cli_settings()):
        prop = f"`{k.kafka_name}`" if k.group == SECURITY else "—"
        lines.append(f"| `{k.flag}` | `{k.env}` | {prop} | {_spark_cell(k)} | "
                     f"{_cell(tool_doc(k))} |")
    lines += ["", DOC_END]
    return "\n".join(lines) + "\n"


# The CLI's variable for --command-config (a client properties file).
COMMAND_CONFIG_ENV = "ONCELOG_COMMAND_CONFIG"
# How the CLI and Spark choose the protocol when none is given
# (default_security_protocol).
TOOL_PROTOCOL_DEFAULT = ("default: `SSL` when a TLS file is given, `SASL_SSL` when a token "
                         "file is, else `PLAINTEXT`")
CLI_DOC_BEGIN = ("<!-- generated from sdk/oncelog/config_def.py: "
                 "python -m oncelog.config_def --write docs/cli.md -->")
CLI_DOC_END = "<!-- end of generated CLI security settings -->"


def tool_doc(k: ConfigKey) -> str:
    """What a security setting means to the CLI and Spark, which choose the
    protocol from the files given when none is."""
    return k.doc + (f"; {TOOL_PROTOCOL_DEFAULT}" if k.name == "security_protocol" else "")


def cli_markdown() -> str:
    """docs/cli.md's table of the security settings, between CLI_DOC_BEGIN
    and CLI_DOC_END (both included)."""
    lines = [CLI_DOC_BEGIN, "",
             "| flag | environment | `--command-config` property | what |", "|---|---|---|---|"]
    lines += [f"| `{k.flag}` | `{k.env}` | `{k.kafka_name}` | {_cell(tool_doc(k))} |"
              for k in cli_settings()]
    lines += [f"| `--command-config FILE` | `{COMMAND_CONFIG_ENV}` | | the client properties "
              f"file (the name Kafka's tools give it) |", "", CLI_DOC_END]
    return "\n".join(lines) + "\n"


# Each generated section: its first and last lines, and what makes it.
SECTIONS: tuple[tuple[str, str, Callable[[], str]], ...] = (
    (DOC_BEGIN, DOC_END, markdown), (CLI_DOC_BEGIN, CLI_DOC_END, cli_markdown))


def replace_section(text: str) -> str:
    """`text` (a doc) with every generated section it has made equal to
    what the table makes now."""
    for begin, end_line, render in SECTIONS:
        if begin not in text:
            continue
        start = text.index(begin)
        end = text.index(end_line, start) + len(end_line) + 1
        text = text[:start] + render() + text[end:]
    return text


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m oncelog.config_def",
        description="The clients' options table, as the markdown of docs/configuration.md "
                    "and docs/cli.md.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--markdown", action="store_true", help="print the generated section")
    what.add_argument("--write", metavar="DOC",
                      help="rewrite the generated section of DOC in place")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    path = Path(args.write)
    text = path.read_text(encoding="utf-8")
    if not any(begin in text for begin, _end, _render in SECTIONS):
        parser.error(f"{path} has no generated section (a line {DOC_BEGIN!r} or "
                     f"{CLI_DOC_BEGIN!r})")
    path.write_text(replace_section(text), encoding="utf-8")
    print(f"wrote the client options into {os.fspath(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
