"""Raw Kafka frames over a socket, for tests that send what no client would.

Requests and responses are encoded and decoded with kio (classes generated
from Kafka's own schemas; a package no one here wrote), record batches with
kafka-python's DefaultRecordBatchBuilder, so what these tests send is
Kafka's format as others implement it, not ours.
"""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

_SIZE = struct.Struct(">i")
# Failure guard for a test's socket reads, not an expectation.
READ_TIMEOUT_S = 20.0


def batch(values: list[bytes], *, producer_id: int = -1, producer_epoch: int = -1,
          base_sequence: int = -1, transactional: bool = False) -> bytes:
    """A record batch v2 built by kafka-python."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=transactional, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=None, key=None, value=value, headers=[])
    return bytes(builder.build())


def encode_request(body: Any, *, correlation_id: int, client_id: str = "test") -> bytes:
    """A whole request frame (size prefix included) for kio's `body`."""
    cls = type(body)
    header_cls = cls.__header_schema__
    buffer = io.BytesIO()
    header_fields: dict[str, Any] = {"request_api_key": cls.__api_key__,
                                     "request_api_version": cls.__version__,
                                     "correlation_id": correlation_id, "client_id": client_id}
    entity_writer(header_cls)(buffer, header_cls(**header_fields))
    entity_writer(cls)(buffer, body)
    payload = buffer.getvalue()
    return _SIZE.pack(len(payload)) + payload


def request_class(api_key: int, version: int) -> Any:
    return load_request_schema(api_key, version)


class KafkaSocket:
    """One connection to a Kafka listener."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=READ_TIMEOUT_S)
        self._correlation_id = 0

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, body: Any) -> int:
        self._correlation_id += 1
        self.sock.sendall(encode_request(body, correlation_id=self._correlation_id))
        return self._correlation_id

    def read_frame(self) -> bytes | None:
        """The next response frame (without its size), None once the
        listener closed the connection."""
        head = self._read_exactly(_SIZE.size)
        if head is None:
            return None
        (size,) = _SIZE.unpack(head)
        return self._read_exactly(size)

    def _read_exactly(self, count: int) -> bytes | None:
        data = b""
        while len(data) < count:
            try:
                chunk = self.sock.recv(count - len(data))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def request(self, body: Any) -> Any:
        """Sends `body` and decodes its answer (kio's response class of the
        same API and version); None when the connection was closed instead."""
        correlation_id = self.send(body)
        frame = self.read_frame()
        if frame is None:
            return None
        cls = load_response_schema(type(body).__api_key__, type(body).__version__)
        header, size = entity_reader(cls.__header_schema__)(frame, 0)
        if header.correlation_id != correlation_id:
            raise AssertionError(f"answer to correlation id {header.correlation_id}, "
                                 f"expected {correlation_id}")
        response, _ = entity_reader(cls)(frame, size)
        return response

    def closed_by_listener(self) -> bool:
        """Whether the listener has closed this connection (it sends nothing
        more and the read ends)."""
        return self.read_frame() is None

    def close(self) -> None:
        self.sock.close()
