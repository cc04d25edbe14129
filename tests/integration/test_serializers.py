"""Serializers: the producer's and consumer's hooks and the ready ones.

Goal: keys and values go through `key_serializer`/`value_serializer` on the
way in and `key_deserializer`/`value_deserializer` on the way out, so what
an application reads back equals what it sent — with the ready String,
JSON, Avro and Protobuf (de)serializers of `oncelog.serializers`, through
the threaded and the asyncio client alike; a None key or value (a
tombstone) passes by them untouched; a serializer that fails makes send()
raise SerializationError (caused by the serializer's exception) and sends
nothing — outside a transaction the producer simply goes on, inside one the
transaction can no longer commit (commit_transaction() refuses), and
abort_transaction() lets the producer go on; a deserializer that fails
raises DeserializationError naming topic, partition and offset, after
handing out the records before it, and the position stays at that record
until the application seeks past it. The ready serializers refuse what
they cannot encode with a clear error, and the Avro ones say which extra to
install when fastavro is missing.

Method: the serializers alone where no cluster is needed; otherwise one
LocalCluster (one store, one coordinator, no group coordinator) for the
module, a topic per test, and each cluster test run with the threaded and
the asyncio client through test_client_contract's driver (`make_clients`).
Reading back goes through the client under test.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.protobuf import struct_pb2

from oncelog import Admin, Consumer, ConsumerRecord, Producer, TopicPartition, errors
from oncelog.serializers import (
    AvroDeserializer,
    AvroSerializer,
    JsonDeserializer,
    JsonSerializer,
    ProtobufDeserializer,
    ProtobufSerializer,
    StringDeserializer,
    StringSerializer,
)
from oncelog.testing import LocalCluster
from tests.integration.test_client_contract import (
    CLIENT_KINDS,
    Clients,
    ConsumerDriver,
    make_clients,
)
from tests.support.reading import wait_for_markers

PARTITIONS = 2
WAIT_S = 30.0
_ids = itertools.count()

PAYMENT_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "Payment", "namespace": "oncelog.test",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "from", "type": "string"},
        {"name": "to", "type": "string"},
        {"name": "amount_cents", "type": "long"},
    ],
}


def payment(n: int) -> dict[str, Any]:
    return {"id": f"p-{n}", "from": f"acct-{n % 3}", "to": f"acct-{(n + 1) % 3}",
            "amount_cents": 100 * n + 1}


def struct(n: int) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update({"id": f"p-{n}", "amount_cents": 100 * n + 1, "tags": ["a", "b"]})
    return message


# (serializer, deserializer, values) per format; keys are str throughout.
FORMATS: dict[str, tuple[Callable[[], Any], Callable[[], Any], list[Any]]] = {
    "string": (StringSerializer, StringDeserializer, ["plain", "ünïcödé €", ""]),
    "json": (JsonSerializer, JsonDeserializer,
             [payment(1), [1, 2.5, None, True], "text", 0, {"nested": {"ok": [1]}}]),
    "avro": (lambda: AvroSerializer(PAYMENT_SCHEMA), lambda: AvroDeserializer(PAYMENT_SCHEMA),
             [payment(n) for n in range(4)]),
    "protobuf": (ProtobufSerializer, lambda: ProtobufDeserializer(struct_pb2.Struct),
                 [struct(n) for n in range(3)]),
}


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("serializers") / "cluster",
                      group_coordinators=0) as c:
        yield c


@pytest.fixture(params=CLIENT_KINDS)
def clients(request: pytest.FixtureRequest, cluster: LocalCluster) -> Iterator[Clients]:
    with make_clients(request.param, cluster.bootstrap) as c:
        yield c


@pytest.fixture
def topic(cluster: LocalCluster) -> str:
    name = f"ser-{next(_ids)}"
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=PARTITIONS)
    return name


def read_back(clients: Clients, topic: str, *, isolation_level: str = "read_committed",
              **options: Any) -> list[ConsumerRecord]:
    """Every record of `topic` up to its end, through the client under test
    with `options` (the deserializers); read_committed once the markers of
    every decided transaction have landed (wait_for_markers)."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    out: list[ConsumerRecord] = []
    if isolation_level == "read_committed":
        wait_for_markers(clients.bootstrap)
    with clients.consumer(isolation_level=isolation_level, **options) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + WAIT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{topic} not read to {ends}"
            out.extend(consumer.poll(timeout=0.2))
    return sorted(out, key=lambda r: (r.partition, r.offset))


class Refusing:
    """A (de)serializer that fails on `bad` and counts its calls."""

    def __init__(self, bad: Any) -> None:
        self.bad = bad
        self.calls: list[Any] = []

    def __call__(self, value: Any) -> Any:
        self.calls.append(value)
        if value == self.bad:
            raise RuntimeError(f"cannot handle {value!r}")
        return value


# ------------------------------------------------------------------ the serializers alone


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_each_format_round_trips(fmt: str) -> None:
    make_serializer, make_deserializer, samples = FORMATS[fmt]
    serializer, deserializer = make_serializer(), make_deserializer()
    for value in samples:
        data = serializer(value)
        assert isinstance(data, bytes)
        assert deserializer(data) == value


def test_string_and_json_encodings() -> None:
    assert StringSerializer("latin-1")("é") == b"\xe9"
    assert StringDeserializer("latin-1")(b"\xe9") == "é"
    assert JsonSerializer()({"b": 1, "a": "é"}) == '{"b":1,"a":"é"}'.encode()
    assert JsonSerializer(sort_keys=True)({"b": 1, "a": 2}) == b'{"a":2,"b":1}'
    assert JsonSerializer(default=str)({"when": 1.5j}) == b'{"when":"1.5j"}'


def test_avro_reader_schema_resolves_an_evolved_record() -> None:
    evolved = {**PAYMENT_SCHEMA, "fields": [
        *PAYMENT_SCHEMA["fields"][:3],  # amount_cents dropped
        {"name": "currency", "type": "string", "default": "EUR"},
    ]}
    data = AvroSerializer(json.dumps(PAYMENT_SCHEMA))(payment(2))
    read = AvroDeserializer(PAYMENT_SCHEMA, reader_schema=evolved)(data)
    assert read == {"id": "p-2", "from": "acct-2", "to": "acct-0", "currency": "EUR"}


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: StringSerializer()(5), TypeError, "takes a str, got int"),  # type: ignore[arg-type]
    (lambda: StringSerializer("no-such-codec"), ValueError, "unknown text encoding"),
    (lambda: StringDeserializer()(b"\xff"), UnicodeDecodeError, "utf-8"),
    (lambda: JsonSerializer()({1, 2}), TypeError, "set is not JSON serializable"),
    (lambda: JsonSerializer()(math.nan), ValueError, "not JSON compliant"),
    (lambda: JsonDeserializer()(b"{not json"), ValueError, "Expecting property name"),
    (lambda: AvroSerializer({"type": "record", "name": "X", "fields": [{"name": "a"}]}),
     ValueError, "not a valid Avro schema"),
    (lambda: AvroSerializer(PAYMENT_SCHEMA)({"id": "p-1"}), ValueError, "from"),
    (lambda: AvroDeserializer(PAYMENT_SCHEMA)(
        AvroSerializer(PAYMENT_SCHEMA)(payment(1)) + b"\x00"),
     ValueError, "after the end of the schema"),
    (lambda: ProtobufSerializer()(b"raw"), TypeError, "takes a protobuf message, got bytes"),  # type: ignore[arg-type]
    (lambda: ProtobufDeserializer(dict), TypeError,  # type: ignore[arg-type]
     "must be a generated protobuf message class"),
])
def test_what_cannot_be_encoded_is_refused_clearly(
        call: Callable[[], object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_avro_without_fastavro_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes `import fastavro` fail, as it does
    # where the extra is not installed.
    monkeypatch.setitem(sys.modules, "fastavro", None)
    with pytest.raises(ImportError, match=r"pip install 'oncelog\[avro\]'"):
        AvroSerializer(PAYMENT_SCHEMA)
    with pytest.raises(ImportError, match=r"oncelog\[avro\]"):
        AvroDeserializer(PAYMENT_SCHEMA)


def test_the_hooks_must_be_callable() -> None:
    with pytest.raises(ValueError, match="value_serializer must be a callable"):
        Producer(bootstrap="127.0.0.1:9", value_serializer="json")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key_deserializer must be a callable"):
        Consumer(bootstrap="127.0.0.1:9", key_deserializer=b"utf-8")  # type: ignore[arg-type]


# ------------------------------------------------------------------ through the cluster


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_records_round_trip_through_the_cluster(clients: Clients, topic: str,
                                                fmt: str) -> None:
    make_serializer, make_deserializer, samples = FORMATS[fmt]
    with clients.producer(key_serializer=StringSerializer(),
                          value_serializer=make_serializer()) as producer:
        sent = [(f"key-{i}", value, producer.send(topic, value=value, key=f"key-{i}",
                                                  partition=i % PARTITIONS))
                for i, value in enumerate(samples)]
        where = {(d.result(timeout=60).partition, d.result().offset): (k, v)
                 for k, v, d in sent}
    records = read_back(clients, topic, key_deserializer=StringDeserializer(),
                        value_deserializer=make_deserializer())
    assert {(r.partition, r.offset): (r.key, r.value) for r in records} == where


def test_none_passes_by_the_serializers(clients: Clients, topic: str) -> None:
    key_serializer, value_serializer = Refusing(None), Refusing(None)
    with clients.producer(key_serializer=key_serializer,
                          value_serializer=value_serializer) as producer:
        producer.send(topic, value=None, key=None, partition=0).result(timeout=60)
        producer.send(topic, value=b"v", key=None, partition=0).result(timeout=60)
        producer.send(topic, value=None, key=b"k", partition=0).result(timeout=60)
    assert key_serializer.calls == [b"k"]
    assert value_serializer.calls == [b"v"]
    key_deserializer, value_deserializer = Refusing(None), Refusing(None)
    records = read_back(clients, topic, key_deserializer=key_deserializer,
                        value_deserializer=value_deserializer)
    assert [(r.key, r.value) for r in records] == [(None, None), (None, b"v"), (b"k", None)]
    assert (key_deserializer.calls, value_deserializer.calls) == ([b"k"], [b"v"])


def test_a_failing_serializer_fails_only_its_send(clients: Clients, topic: str) -> None:
    value_serializer = Refusing(b"bad")
    with clients.producer(value_serializer=value_serializer) as producer:
        producer.send(topic, value=b"before", partition=0).result(timeout=60)
        with pytest.raises(errors.SerializationError,
                           match=f"value of a record for topic '{topic}'") as raised:
            producer.send(topic, value=b"bad", partition=0)
        assert isinstance(raised.value.__cause__, RuntimeError)
        assert "cannot handle b'bad'" in str(raised.value)
        producer.send(topic, value=b"after", partition=0).result(timeout=60)
    with clients.producer(value_serializer=len) as counting, \
            pytest.raises(errors.SerializationError, match="returned int, not bytes"):
        counting.send(topic, value=b"xyz", partition=0)
    assert [r.value for r in read_back(clients, topic)] == [b"before", b"after"]


def test_a_failing_serializer_breaks_the_transaction(clients: Clients, topic: str) -> None:
    with clients.producer(transactional_id=f"ser-tx-{topic}",
                          value_serializer=JsonSerializer()) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, value={"n": 1}, partition=0).result(timeout=60)
        with pytest.raises(errors.SerializationError) as raised:
            producer.send(topic, value={"not", "json"}, partition=1)
        assert isinstance(raised.value.__cause__, TypeError)
        # The transaction lost a record: it must not commit.
        with pytest.raises(errors.TransactionAbortableError) as refused:
            producer.commit_transaction()
        cause = refused.value.__cause__
        assert isinstance(cause, errors.SerializationError), refused.value
        assert "not JSON serializable" in str(refused.value)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, value={"n": 2}, partition=0)
        producer.commit_transaction()
    assert [r.value for r in read_back(clients, topic, value_deserializer=JsonDeserializer())
            ] == [{"n": 2}]
    assert len(read_back(clients, topic, isolation_level="read_uncommitted")) == 2


def test_a_deserializer_error_names_the_record_and_keeps_the_position(
        clients: Clients, topic: str) -> None:
    tp = TopicPartition(topic, 0)
    with clients.producer() as producer:
        for value in (b"ok-0", b"ok-1", b"bad", b"ok-3"):
            producer.send(topic, value=value, partition=0)
        producer.flush()
    with clients.consumer(value_deserializer=Refusing(b"bad")) as consumer:
        consumer.assign([tp])
        got, failure = poll_until_error(consumer)
        assert [(r.offset, r.value) for r in got] == [(0, b"ok-0"), (1, b"ok-1")]
        assert (failure.topic, failure.partition, failure.offset) == (topic, 0, 2)
        assert consumer.position(tp) == 2
        # Polled again, the same record fails again: it is not skipped.
        again, failure = poll_until_error(consumer)
        assert again == []
        assert (failure.topic, failure.partition, failure.offset) == (topic, 0, 2)
        assert failure.record.value == b"bad" and failure.record.offset == 2
        assert isinstance(failure.__cause__, RuntimeError)
        assert f"{topic}-0" in str(failure) and "offset 2" in str(failure)
        consumer.seek(tp, failure.offset + 1)
        rest: list[ConsumerRecord] = []
        deadline = time.monotonic() + WAIT_S
        while not rest:
            assert time.monotonic() < deadline
            rest = consumer.poll(timeout=0.2)
        assert [(r.offset, r.value) for r in rest] == [(3, b"ok-3")]


def poll_until_error(consumer: ConsumerDriver
                     ) -> tuple[list[ConsumerRecord], errors.DeserializationError]:
    """The records polled until a poll raised DeserializationError, and that error."""
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + WAIT_S
    while True:
        assert time.monotonic() < deadline, f"no DeserializationError; got {got}"
        try:
            got += consumer.poll(timeout=0.2)
        except errors.DeserializationError as failure:
            return got, failure
