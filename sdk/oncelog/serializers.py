"""Ready serializers for the producer's `key_serializer`/`value_serializer`
and the consumer's `key_deserializer`/`value_deserializer` (kafka-python's
hooks: a serializer takes the value given to send() and returns bytes, a
deserializer takes a fetched record's bytes).

    Producer(bootstrap=..., key_serializer=StringSerializer(),
             value_serializer=JsonSerializer())
    Consumer(bootstrap=..., key_deserializer=StringDeserializer(),
             value_deserializer=JsonDeserializer())

* `StringSerializer(encoding="utf-8")` / `StringDeserializer(encoding="utf-8")`
* `JsonSerializer()` / `JsonDeserializer()`: UTF-8 JSON text.
* `AvroSerializer(schema)` / `AvroDeserializer(schema, reader_schema=None)`:
  Avro's binary encoding of one datum, without a header or a schema id
  (fastavro's schemaless writer and reader); both sides are given the schema
  by the application. Needs fastavro: `pip install 'oncelog[avro]'`.
* `ProtobufSerializer()` / `ProtobufDeserializer(message_class)`: a
  protobuf message's wire format.

Any callable of one argument will do as well (`json.dumps(v).encode()`). A
None key or value is never passed to a (de)serializer: None stays None (a
None value is a tombstone). An exception from a serializer makes send()
raise `errors.SerializationError`; from a deserializer, poll() raises
`errors.DeserializationError` (docs/sdk.md, "Serializers").
"""

from __future__ import annotations

import codecs
import contextlib
import io
import json
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from google.protobuf.message import Message

# What the producer and consumer take: bytes (or None) from anything, and
# anything from bytes.
Serializer = Callable[[Any], bytes | bytearray | memoryview | None]
Deserializer = Callable[[bytes], Any]

AvroSchema = Mapping[str, Any] | Sequence[Any] | str


def _check_encoding(encoding: str) -> str:
    if not isinstance(encoding, str):
        raise TypeError(f"encoding must be a str, got {encoding!r}")
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ValueError(f"unknown text encoding {encoding!r}") from None
    return encoding


class StringSerializer:
    """str -> bytes in `encoding`; anything but a str is a TypeError (an int
    key is a mistake to report, not a text to guess)."""

    def __init__(self, encoding: str = "utf-8") -> None:
        self.encoding = _check_encoding(encoding)

    def __call__(self, value: str) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"StringSerializer takes a str, got {type(value).__name__}")
        return value.encode(self.encoding)

    def __repr__(self) -> str:
        return f"StringSerializer({self.encoding!r})"


class StringDeserializer:
    """bytes -> str, decoded strictly in `encoding`."""

    def __init__(self, encoding: str = "utf-8") -> None:
        self.encoding = _check_encoding(encoding)

    def __call__(self, data: bytes) -> str:
        return data.decode(self.encoding)

    def __repr__(self) -> str:
        return f"StringDeserializer({self.encoding!r})"


class JsonSerializer:
    """Any JSON-able value -> compact UTF-8 JSON. `default` is json.dumps's
    hook for other types (e.g. `str` for Decimal); NaN and the infinities
    are refused, since JSON has no spelling for them."""

    def __init__(self, *, default: Callable[[Any], Any] | None = None,
                 sort_keys: bool = False) -> None:
        if default is not None and not callable(default):
            raise TypeError(f"default must be callable or None, got {default!r}")
        self._default = default
        self._sort_keys = bool(sort_keys)

    def __call__(self, value: Any) -> bytes:
        return json.dumps(value, default=self._default, sort_keys=self._sort_keys,
                          separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")


class JsonDeserializer:
    """UTF-8 JSON -> the value (dict, list, str, int, float, bool, None)."""

    def __call__(self, data: bytes) -> Any:
        return json.loads(data)


def _fastavro() -> ModuleType:
    # Imported on first use: the Avro support is an optional extra.
    try:
        import fastavro
    except ImportError as exc:
        raise ImportError(
            "the Avro serializers need fastavro, which is not installed: "
            "pip install 'oncelog[avro]'"
        ) from exc
    return fastavro


def _parse_avro_schema(fastavro: ModuleType, schema: AvroSchema, what: str) -> Any:
    if isinstance(schema, str):
        # A schema as JSON text; else a primitive's bare name, e.g. string.
        with contextlib.suppress(ValueError):
            schema = json.loads(schema)
    try:
        return fastavro.parse_schema(schema)
    except Exception as exc:  # fastavro raises several kinds
        raise ValueError(f"{what} is not a valid Avro schema: {exc}") from exc


class AvroSerializer:
    """A datum -> Avro binary under `schema` (a dict, or its JSON text).
    The bytes carry no schema and no schema id: the reader must be given
    the same schema (or a compatible writer/reader pair)."""

    def __init__(self, schema: AvroSchema) -> None:
        self._fastavro = _fastavro()
        self.schema = _parse_avro_schema(self._fastavro, schema, "schema")

    def __call__(self, value: Any) -> bytes:
        out = io.BytesIO()
        self._fastavro.schemaless_writer(out, self.schema, value)
        return out.getvalue()


class AvroDeserializer:
    """Avro binary written with `schema` -> the datum; with `reader_schema`,
    resolved to that schema (Avro's schema evolution: added fields with
    defaults, removed fields)."""

    def __init__(self, schema: AvroSchema, *, reader_schema: AvroSchema | None = None) -> None:
        self._fastavro = _fastavro()
        self.schema = _parse_avro_schema(self._fastavro, schema, "schema")
        self.reader_schema = (None if reader_schema is None else
                              _parse_avro_schema(self._fastavro, reader_schema, "reader_schema"))

    def __call__(self, data: bytes) -> Any:
        stream = io.BytesIO(data)
        datum = self._fastavro.schemaless_reader(stream, self.schema, self.reader_schema)
        if stream.tell() != len(data):
            # The schemaless reader stops where the schema ends; bytes left
            # over mean the record was written with another schema.
            raise ValueError(
                f"Avro datum of {len(data)} bytes has {len(data) - stream.tell()} bytes "
                "after the end of the schema: written with a different schema?"
            )
        return datum


class ProtobufSerializer:
    """A protobuf message -> its wire format (SerializeToString)."""

    def __call__(self, message: Message) -> bytes:
        if not isinstance(message, Message):
            raise TypeError(
                f"ProtobufSerializer takes a protobuf message, got {type(message).__name__}"
            )
        return message.SerializeToString()


class ProtobufDeserializer:
    """Wire format -> an instance of `message_class` (a generated message class)."""

    def __init__(self, message_class: type[Message]) -> None:
        if not (isinstance(message_class, type) and issubclass(message_class, Message)):
            raise TypeError(
                f"message_class must be a generated protobuf message class, got {message_class!r}"
            )
        self.message_class = message_class

    def __call__(self, data: bytes) -> Message:
        message = self.message_class()
        message.ParseFromString(data)
        return message

    def __repr__(self) -> str:
        return f"ProtobufDeserializer({self.message_class.__name__})"
