"""Spark's Kafka option names and the sink's default app_id, as pure values.

Goal: a job written for `format("kafka")` keeps its options under
`format("oncelog")`: each Kafka name that means what an oncelog option means
parses to exactly what the oncelog name parses to; a Kafka name given with
its oncelog name and another value is an error naming both; Kafka options
with no oncelog equivalent (assign, timestamps, client properties, JKS
stores, JAAS) are refused with the reason, never ignored. The security
options (ours and Kafka's kafka.security.protocol / kafka.sasl.mechanism)
parse into the settings every client of the source and sinks gets, and the
SDK takes what they give; a combination that cannot work is an error
naming the options. The sink's default
app_id is `spark-` and 16 hex digits of the SHA-256 of the normalized
checkpoint location (the formula docs/spark.md gives), equal for every
spelling of one place and different for different places; a relative
checkpoint, or none, without an app_id is an error saying what to give.

Method: direct calls of SourceOptions.parse, SinkOptions.parse and
default_app_id with hand-made options; no Spark session, no cluster (the
queries that use these names run in test_kafka_names.py).
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import pytest

from oncelog import Admin, Consumer, Producer
from oncelog_spark import default_app_id
from oncelog_spark.options import (
    KAFKA_SINK_ALIASES,
    KAFKA_SOURCE_ALIASES,
    ClientSecurity,
    OptionError,
    SinkOptions,
    SourceOptions,
    checkpoint_identity,
)

BOOTSTRAP = "127.0.0.1:1"
SPEC = '{"pay": {"0": 5, "1": -2}}'


def source(options: dict[str, str], streaming: bool = True) -> SourceOptions:
    return SourceOptions.parse(options, streaming=streaming)


@pytest.mark.parametrize(
    ("streaming", "kafka", "oncelog"),
    [
        (True,
         {"kafka.bootstrap.servers": BOOTSTRAP, "subscribe": "pay,refunds",
          "startingOffsets": "earliest", "maxOffsetsPerTrigger": "500",
          "failOnDataLoss": "false", "kafka.isolation.level": "read_uncommitted",
          "kafkaConsumer.pollTimeoutMs": "3000"},
         {"bootstrap": BOOTSTRAP, "topics": "pay,refunds", "starting_offsets": "earliest",
          "max_records_per_trigger": "500", "fail_on_data_loss": "false",
          "isolation_level": "read_uncommitted", "poll_timeout_ms": "3000"}),
        (False,
         {"kafka.bootstrap.servers": BOOTSTRAP, "subscribe": "pay", "startingOffsets": SPEC,
          "endingOffsets": '{"pay": {"0": 9, "1": -1}}', "failOnDataLoss": "TRUE"},
         {"bootstrap": BOOTSTRAP, "topics": "pay", "starting_offsets": SPEC,
          "ending_offsets": '{"pay": {"0": 9, "1": -1}}', "fail_on_data_loss": "true"}),
        (True,
         {"kafka.bootstrap.servers": BOOTSTRAP, "subscribePattern": "pay.*",
          "startingOffsets": "latest", "includeHeaders": "true"},
         {"bootstrap": BOOTSTRAP, "topic_pattern": "pay.*", "starting_offsets": "latest"}),
    ],
)
def test_kafka_source_names_parse_as_the_oncelog_names(
    streaming: bool, kafka: dict[str, str], oncelog: dict[str, str]
) -> None:
    # Spark hands options over with lower-cased names; both spellings work.
    lowered = {name.lower(): value for name, value in kafka.items()}
    assert source(kafka, streaming) == source(oncelog, streaming)
    assert source(lowered, streaming) == source(oncelog, streaming)


def test_every_kafka_alias_names_an_oncelog_option() -> None:
    # The tables are what docs/spark.md lists; each target must be an
    # option that parses (not a name that only looks right).
    assert {a.kafka: a.oncelog for a in KAFKA_SOURCE_ALIASES.values()} == {
        "kafka.bootstrap.servers": "bootstrap", "subscribe": "topics",
        "subscribePattern": "topic_pattern", "startingOffsets": "starting_offsets",
        "endingOffsets": "ending_offsets", "maxOffsetsPerTrigger": "max_records_per_trigger",
        "failOnDataLoss": "fail_on_data_loss", "kafka.isolation.level": "isolation_level",
        "kafkaConsumer.pollTimeoutMs": "poll_timeout_ms",
        "kafka.security.protocol": "security_protocol", "kafka.sasl.mechanism": "sasl_mechanism",
    }
    assert {a.kafka: a.oncelog for a in KAFKA_SINK_ALIASES.values()} == {
        "kafka.bootstrap.servers": "bootstrap",
        "kafka.transaction.timeout.ms": "transaction_timeout_ms",
        "kafka.security.protocol": "security_protocol", "kafka.sasl.mechanism": "sasl_mechanism",
    }
    parsed = source({"kafka.bootstrap.servers": BOOTSTRAP, "subscribe": "a"})
    assert (parsed.bootstrap, parsed.topics, parsed.fail_on_data_loss) == (BOOTSTRAP, ("a",), True)


def test_the_same_value_under_both_names_is_accepted() -> None:
    both = source({"bootstrap": BOOTSTRAP, "kafka.bootstrap.servers": BOOTSTRAP,
                   "topics": "a", "subscribe": "a"})
    assert (both.bootstrap, both.topics) == (BOOTSTRAP, ("a",))


def test_a_pattern_is_matched_against_whole_topic_names() -> None:
    opts = source({"kafka.bootstrap.servers": BOOTSTRAP, "subscribePattern": r"pay\d+"})
    assert (opts.topics, opts.topic_pattern) == ((), r"pay\d+")
    assert opts.reads("pay1") and opts.reads("pay22")
    assert not opts.reads("pay") and not opts.reads("xpay1") and not opts.reads("pay1x")
    assert not source({"bootstrap": BOOTSTRAP, "topics": "a"}).reads("b")


@pytest.mark.parametrize(
    ("streaming", "options", "message"),
    [
        (True, {"kafka.bootstrap.servers": "h:2"},
         r"options 'bootstrap' and 'kafka.bootstrap.servers' name the same setting "
         r"\('bootstrap'\) with different values, '127.0.0.1:1' and 'h:2'"),
        (True, {"subscribe": "b"}, "options 'topics' and 'subscribe' name the same setting"),
        (True, {"subscribePattern": "a.*"},
         "options 'topics' and 'subscribePattern' both choose the topics"),
        (True, {"startingOffsets": "latest", "starting_offsets": "earliest"},
         "'startingOffsets' and 'starting_offsets' name the same setting"),
        (True, {"startingOffsets": "soon"},
         "option 'startingOffsets' must be 'earliest', 'latest' or a JSON object"),
        (True, {"startingOffsets": '{"zz": {"0": 1}}'},
         "option 'startingOffsets' names topics that option 'topics' does not name: zz"),
        (True, {"maxOffsetsPerTrigger": "0"},
         "option 'maxOffsetsPerTrigger' must be a positive integer, got '0'"),
        (False, {"maxOffsetsPerTrigger": "5"},
         "option 'maxOffsetsPerTrigger' applies to streaming reads only"),
        (True, {"endingOffsets": "latest"}, "option 'endingOffsets' applies to batch reads"),
        (False, {"startingOffsets": "latest"}, "option 'startingOffsets' cannot be 'latest'"),
        (True, {"failOnDataLoss": "yes"}, "option 'failOnDataLoss' must be true or false"),
        (True, {"kafka.isolation.level": "snapshot"},
         "option 'kafka.isolation.level' must be one of read_committed, read_uncommitted"),
        (True, {"includeHeaders": "false"},
         "option 'includeHeaders' must be 'true' .* always has the `headers` column"),
        (True, {"assign": '{"a": [0]}'}, "option 'assign' of Spark's Kafka source: .*every "
                                        "partition of its topics"),
        (True, {"startingTimestamp": "1000"}, "at a timestamp is not supported"),
        (True, {"startingOffsetsByTimestamp": "{}"}, "at a timestamp is not supported"),
        (False, {"endingTimestamp": "1000"}, "at a timestamp is not supported"),
        (True, {"minPartitions": "8"}, "option 'minpartitions' .* one Spark partition"),
        (True, {"minOffsetsPerTrigger": "8"}, "option 'minoffsetspertrigger' .* not supported"),
        (True, {"groupIdPrefix": "g"}, "uses no consumer group"),
        (True, {"kafka.group.id": "g"}, "uses no consumer group"),
        (True, {"kafka.ssl.truststore.location": "/x"},
         "option 'kafka.ssl.truststore.location': JKS/PKCS12 truststores are not read: give "
         "option 'ssl_cafile'"),
        (True, {"kafka.ssl.keystore.location": "/x"}, "give options 'ssl_certfile' and "
                                                       "'ssl_keyfile'"),
        (True, {"kafka.ssl.endpoint.identification.algorithm": ""},
         "not supported; the oncelog source and sinks take 'security_protocol', 'ssl_cafile'"),
        (True, {"kafka.security.protocol": "SASL_PLAINTEXT"},
         "option 'kafka.security.protocol' must be one of PLAINTEXT, SSL, SASL_SSL"),
        (True, {"kafka.max.poll.records": "5"},
         r"option 'kafka.max.poll.records': Kafka client properties \(kafka.\*\) are not "
         r"passed through; the oncelog source takes kafka.bootstrap.servers, "
         r"kafka.isolation.level, kafka.security.protocol, kafka.sasl.mechanism"),
        (True, {"topic": "a"}, "unknown option 'topic' for the oncelog source; did you mean "
                               "'topics'"),
    ],
)
def test_kafka_option_mistakes_name_the_option_as_given(
    streaming: bool, options: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        source({"bootstrap": BOOTSTRAP, "topics": "a", **options}, streaming)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribePattern": "("}, "option 'subscribePattern' is not a valid regular "
                                    "expression"),
        ({"subscribePattern": " "}, "option 'subscribePattern' must be a regular expression"),
        ({"subscribePattern": "pay.*", "startingOffsets": '{"refunds": {"0": 1}}'},
         "option 'startingOffsets' names topics that option 'subscribePattern' does not "
         "match: refunds"),
        ({}, "option 'topics' is required .*, or 'topic_pattern' .*'subscribePattern'"),
    ],
)
def test_topic_choice_mistakes(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        source({"kafka.bootstrap.servers": BOOTSTRAP, **options})


# ------------------------------------------------------------------ the sink

SINK = {"kafka.bootstrap.servers": BOOTSTRAP, "topic": "ledger"}


def test_the_sink_takes_kafka_names() -> None:
    kafka = SinkOptions.parse({**SINK, "app_id": "a", "kafka.transaction.timeout.ms": "5000"})
    ours = SinkOptions.parse({"bootstrap": BOOTSTRAP, "topic": "ledger", "app_id": "a",
                              "transaction_timeout_ms": "5000"})
    assert kafka == ours
    for name, message in [
        ("kafka.acks", "Kafka client properties .* the oncelog sink takes "
                       "kafka.bootstrap.servers, kafka.transaction.timeout.ms"),
        ("kafka.sasl.jaas.config", "give the bearer token in a file: option "
                                   "'sasl_oauth_token_file'"),
        ("kafka.sasl.mechanism", "option 'kafka.sasl.mechanism' must be OAUTHBEARER"),
        ("kafka.transactional.id", "did you mean 'app_id'"),
    ]:
        with pytest.raises(OptionError, match=message):
            SinkOptions.parse({**SINK, "app_id": "a", name: "x"})


def test_the_default_app_id_is_a_hash_of_the_checkpoint_location(tmp_path: object) -> None:
    place = "/data/checkpoints/ledger"
    documented = "spark-" + hashlib.sha256(f"file:{place}".encode()).hexdigest()[:16]
    assert default_app_id(place) == documented
    for spelling in [place + "/", "file:" + place, "file://" + place, "/data//checkpoints/ledger",
                     "/data/checkpoints/./ledger", " " + place + " "]:
        assert default_app_id(spelling) == documented, spelling
    assert default_app_id("/data/checkpoints/ledger2") != documented
    assert checkpoint_identity("hdfs://nn:8020/ck//q1/") == "hdfs://nn:8020/ck/q1"
    assert default_app_id("hdfs://nn:8020/ck/q1") != default_app_id("hdfs://nn:8021/ck/q1")

    opts = SinkOptions.parse({**SINK, "checkpointLocation": place, "queryName": "q"})
    assert (opts.app_id, opts.app_id_from_checkpoint, opts.group) == (documented, True,
                                                                      documented)
    given = SinkOptions.parse({**SINK, "checkpointLocation": place, "app_id": "mine"})
    assert (given.app_id, given.app_id_from_checkpoint, given.group) == ("mine", False, "mine")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"checkpointLocation": "relative/ckpt"},
         "option 'checkpointLocation' 'relative/ckpt' is relative: .* Give an absolute "
         "checkpointLocation, or option 'app_id'"),
        ({"checkpointLocation": "file:relative"}, "is relative"),
        ({}, "option 'app_id' is required .* unless the query gives its checkpoint with option "
             "'checkpointLocation'"),
        ({"queryName": "q"}, "spark.sql.streaming.checkpointLocation does not reach the sink"),
    ],
)
def test_without_app_id_the_sink_needs_an_absolute_checkpoint(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        SinkOptions.parse({**SINK, **options})


# ------------------------------------------------------------------ security

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, ClientSecurity()),
        ({"ssl_cafile": "/ca.pem"}, ClientSecurity(protocol="SSL", cafile="/ca.pem")),
        ({"kafka.security.protocol": "ssl", "ssl_cafile": "/ca.pem", "ssl_certfile": "/c.pem",
          "ssl_keyfile": "/c.key"},
         ClientSecurity(protocol="SSL", cafile="/ca.pem", certfile="/c.pem", keyfile="/c.key")),
        ({"sasl_oauth_token_file": "/token", "ssl_cafile": "/ca.pem"},
         ClientSecurity(protocol="SASL_SSL", cafile="/ca.pem", token_file="/token")),
        ({"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "OAUTHBEARER",
          "sasl_oauth_token_file": "/token"},
         ClientSecurity(protocol="SASL_SSL", token_file="/token")),
    ],
)
def test_security_options_parse_for_the_source_and_the_sinks(
    options: dict[str, str], expected: ClientSecurity
) -> None:
    assert source({"bootstrap": BOOTSTRAP, "topics": "a", **options}).security == expected
    assert SinkOptions.parse({**SINK, "app_id": "a", **options}).security == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"security_protocol": "TLS"}, "option 'security_protocol' must be one of PLAINTEXT, "
                                       "SSL, SASL_SSL, got 'TLS'"),
        ({"security_protocol": "PLAINTEXT", "ssl_cafile": "/ca.pem"},
         "option 'ssl_cafile' is set, but option 'security_protocol' is PLAINTEXT"),
        ({"security_protocol": "SSL", "sasl_oauth_token_file": "/t"},
         "SASL_SSL and option 'sasl_oauth_token_file' go together"),
        ({"security_protocol": "SASL_SSL"}, "SASL_SSL and option 'sasl_oauth_token_file' go "
                                            "together .* no token file"),
        ({"ssl_certfile": "/c.pem"}, "options 'ssl_certfile' and 'ssl_keyfile' go together"),
        ({"sasl_mechanism": "SCRAM-SHA-512", "sasl_oauth_token_file": "/t"},
         "option 'sasl_mechanism' must be OAUTHBEARER"),
    ],
)
def test_security_mistakes_name_the_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        source({"bootstrap": BOOTSTRAP, "topics": "a", **options})
    with pytest.raises(OptionError, match=message):
        SinkOptions.parse({**SINK, "app_id": "a", **options})


def test_the_security_settings_are_what_the_clients_take(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(PEM)
    token = tmp_path / "token"
    token.write_text("a-token\n")
    parsed = source({"bootstrap": BOOTSTRAP, "topics": "a", "ssl_cafile": str(ca),
                     "sasl_oauth_token_file": str(token)}).security
    given = parsed.client_options()
    assert (given["security_protocol"], given["ssl_cafile"], given["sasl_mechanism"]) == (
        "SASL_SSL", str(ca), "OAUTHBEARER")
    assert given["sasl_oauth_token_provider"].token() == "a-token"
    with Producer(bootstrap=BOOTSTRAP, **given), Consumer(bootstrap=BOOTSTRAP, **given), \
            Admin(bootstrap=BOOTSTRAP, **given):
        pass  # the SDK accepts them as they are
    assert ClientSecurity().client_options() == {"security_protocol": "PLAINTEXT"}
    # The settings travel to the executors inside the options: they pickle.
    assert pickle.loads(pickle.dumps(parsed)) == parsed
