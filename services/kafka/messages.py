"""Kafka's request and response messages, through kio.

kio's classes are generated from Kafka's own JSON message schemas: one
module per API and version (`kio.schema.produce.v9.request`), with the
header version each message uses. This module is the one place that knows
how kio is called:

* `decode_request(frame)` — a request frame (without its size prefix) into
  its header and body, or `RequestError` naming what is wrong;
* `encode_response(...)` — a response body and its header into a frame
  (with the size prefix);
* `Builder` — builds a response of the version a request came with from
  keyword arguments: fields the version does not have are dropped (a
  handler fills every field of the newest version it serves and the
  builder keeps what the asked version has), plain ints become kio's
  ErrorCode and timedelta values where the schema says so.
"""

from __future__ import annotations

import datetime
import functools
import io
import struct
import uuid
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from types import ModuleType
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_payload_module
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

# api_key (int16), api_version (int16), correlation_id (int32): the fields
# every request header starts with, whatever its version.
_HEADER_START = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")

# Kafka error codes kio knows, by number (ours not among them are mapped to
# UNKNOWN_SERVER_ERROR by errors.py before they get here).
KAFKA_ERROR_CODES: Mapping[int, KafkaErrorCode] = {int(c.value): c for c in KafkaErrorCode}


class RequestError(Exception):
    """A request frame that cannot be read; `correlation_id` when the frame
    was long enough to hold one."""

    def __init__(self, message: str, *, api_key: int = -1, api_version: int = -1,
                 correlation_id: int | None = None) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@functools.cache
def _module(api_key: int, version: int, entity: EntityType) -> ModuleType:
    return load_payload_module(api_key, version, entity)  # type: ignore[arg-type]


@functools.cache
def request_class(api_key: int, version: int) -> type[Any] | None:
    """kio's request class of an API version; None when kio has none."""
    try:
        module = _module(api_key, version, EntityType.request)
    except (UnknownAPIKey, UnknownEntity):
        return None
    return _payload_class(module, EntityType.request)


@functools.cache
def response_class(api_key: int, version: int) -> type[Any]:
    return _payload_class(_module(api_key, version, EntityType.response),
                          EntityType.response)


def _payload_class(module: ModuleType, entity: EntityType) -> type[Any]:
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "__type__", None) is entity:
            return value
    raise LookupError(f"{module.__name__} holds no {entity.name} class")


_readers: dict[type[Any], Any] = {}
_writers: dict[type[Any], Any] = {}


def _reader(cls: type[Any]) -> Any:
    reader = _readers.get(cls)
    if reader is None:
        reader = _readers[cls] = entity_reader(cls)
    return reader


def _writer(cls: type[Any]) -> Any:
    writer = _writers.get(cls)
    if writer is None:
        writer = _writers[cls] = entity_writer(cls)
    return writer


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame."""
    if len(frame) < _HEADER_START.size:
        raise RequestError(f"a request of {len(frame)} bytes is shorter than the "
                           f"{_HEADER_START.size} bytes every request header starts with")
    key, version, correlation_id = _HEADER_START.unpack_from(frame, 0)
    return int(key), int(version), int(correlation_id)


def decode_request(frame: bytes, cls: type[Any]) -> tuple[RequestHeader, Any]:
    """The header and body of a request frame whose class is `cls`;
    RequestError when the bytes do not hold that message."""
    key, version, correlation_id = peek_header(frame)
    try:
        header, header_size = _reader(cls.__header_schema__)(frame, 0)
        body, body_size = _reader(cls)(frame, header_size)
    except Exception as exc:  # kio's native reader raises several kinds
        raise RequestError(f"api key {key} version {version}: the request does not decode "
                           f"({type(exc).__name__}: {exc})", api_key=key, api_version=version,
                           correlation_id=correlation_id) from None
    # Bytes after the last field are ignored, as Kafka's broker ignores
    # them: librdkafka's Metadata for every topic (v9+) leaves a 4-byte
    # placeholder where a 1-byte count belongs, and Kafka's parser reads the
    # fields it knows and stops.
    return RequestHeader(key, version, correlation_id, header.client_id), body


def encode_response(correlation_id: int, body: Any) -> bytes:
    """A response frame: size, header (the version the response's schema
    names), body."""
    cls = type(body)
    header_cls = cls.__header_schema__
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    _writer(header_cls)(buffer, header_cls(correlation_id=correlation_id))
    _writer(cls)(buffer, body)
    frame = buffer.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - _SIZE.size)
    return bytes(frame)


# ------------------------------------------------------------------ building


@dataclass(frozen=True, slots=True)
class _FieldInfo:
    name: str
    kafka_type: str | None
    required: bool
    nullable: bool


_field_infos: dict[type[Any], tuple[_FieldInfo, ...]] = {}


def _fields(cls: type[Any]) -> tuple[_FieldInfo, ...]:
    infos = _field_infos.get(cls)
    if infos is None:
        infos = _field_infos[cls] = tuple(
            _FieldInfo(f.name, f.metadata.get("kafka_type"),
                       f.default is MISSING and f.default_factory is MISSING,
                       "None" in str(f.type))
            for f in fields(cls)
        )
    return infos


def kafka_error(code: int) -> KafkaErrorCode:
    return KAFKA_ERROR_CODES.get(code, KafkaErrorCode.unknown_server_error)


def _coerce(info: _FieldInfo, value: Any) -> Any:
    kafka_type = info.kafka_type
    if kafka_type == "error_code" and not isinstance(value, KafkaErrorCode):
        return kafka_error(int(value))
    if kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64" and isinstance(value, int):
        # -1 means "none": a nullable field's null; a field that cannot be
        # null carries the instant that encodes as -1.
        if value < 0 and info.nullable:
            return None
        return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
    if kafka_type == "uuid" and isinstance(value, int):
        return uuid.UUID(int=value)
    return value


class Builder:
    """Builds the messages of one API version's response module."""

    def __init__(self, api_key: int, version: int) -> None:
        self.version = version
        self._module = _module(api_key, version, EntityType.response)
        self._response = response_class(api_key, version)

    def has(self, class_name: str, field_name: str) -> bool:
        cls = self._class(class_name)
        return any(f.name == field_name for f in _fields(cls))

    def _class(self, class_name: str) -> type[Any]:
        if class_name == "":
            return self._response
        cls = getattr(self._module, class_name, None)
        if not isinstance(cls, type):
            raise LookupError(f"{self._module.__name__} has no class {class_name}")
        return cls

    def make(self, class_name: str, /, **values: Any) -> Any:
        """An instance of `class_name` ("" for the response itself) with the
        given fields the class has; the others are dropped."""
        cls = self._class(class_name)
        kwargs = {}
        for info in _fields(cls):
            if info.name in values:
                kwargs[info.name] = _coerce(info, values[info.name])
            elif info.required:
                raise LookupError(f"{cls.__qualname__} (version {self.version}) needs "
                                  f"{info.name}")
        return cls(**kwargs)

    def response(self, **values: Any) -> Any:
        return self.make("", **values)
