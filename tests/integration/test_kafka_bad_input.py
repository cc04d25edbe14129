"""Bad input to the stores' Kafka listener: frames no client would send.

Goal: the project rule "bad input gets a clear error and changes nothing
stored", on the Kafka port. Each bad frame is answered as Kafka's broker
answers it — with the response's error code where the request decodes and
one part of it is wrong (a truncated or corrupt batch, an internal topic, a
producer that does not exist), by closing the connection where it cannot be
answered (a size prefix out of range, an unknown API key, a version not
served, bytes that do not decode as the request they claim to be) — never a
crash, never a partial write: afterwards the store still serves the Kafka
port and every gRPC service answers, and everything stored is as it was.

Method: test_bad_input_sweep.py's cluster and stored state (records, a
committed transaction, committed group offsets; its cluster runs a Kafka
listener), raw frames over a socket (tests/support/kafka_wire.py: kio's
encoders and kafka-python's batch builder, not ours). After each case a
good ApiVersions on a fresh connection must be answered, and the stored
state is read back and compared with the setup's.
"""

from __future__ import annotations

import datetime
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.integration import test_bad_input_sweep as bad_input
from tests.integration.test_bad_input_sweep import TOPIC, Sweep, observe
from tests.support.kafka_wire import KafkaSocket, batch, encode_request, request_class

sweep = bad_input.sweep

PRODUCE, API_VERSIONS = 0, 18
# Kafka's error numbers the answers must carry.
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
UNSUPPORTED_VERSION = 35


@pytest.fixture
def kafka(sweep: tuple[Sweep, dict[str, object]]) -> Iterator[Callable[[], KafkaSocket]]:
    s, _ = sweep
    address = s.cluster.kafka_bootstrap.split(",")[0]
    opened: list[KafkaSocket] = []

    def connect() -> KafkaSocket:
        opened.append(KafkaSocket(address))
        return opened[-1]

    yield connect
    for sock in opened:
        sock.close()
    # The listener still answers, and nothing stored changed.
    check = KafkaSocket(address)
    try:
        answer = check.request(request_class(API_VERSIONS, 3)(
            client_software_name="check", client_software_version="1"))
        assert answer is not None and int(answer.error_code.value) == 0
    finally:
        check.close()
    assert observe(s) == sweep[1]


def _produce(partition_records: bytes, *, topic: str = TOPIC,
             transactional_id: str | None = None) -> Any:
    """A Produce v9 request of one partition's records (kio's classes)."""
    request = request_class(PRODUCE, 9)
    classes = sys.modules[request.__module__]
    return request(
        transactional_id=transactional_id, acks=-1, timeout=datetime.timedelta(seconds=5),
        topic_data=(classes.TopicProduceData(name=topic, partition_data=(
            classes.PartitionProduceData(index=0, records=partition_records),)),))


def _partition_error(answer: Any) -> int:
    [topic] = answer.responses
    [partition] = topic.partition_responses
    return int(partition.error_code.value)


@pytest.mark.parametrize("size", [-1, 0, 3, 2**31 - 1], ids=lambda s: f"size {s}")
def test_a_size_prefix_out_of_range_closes_the_connection(
        kafka: Callable[[], KafkaSocket], size: int) -> None:
    sock = kafka()
    sock.send_raw(struct.pack(">i", size) + b"\x00" * 16)
    assert sock.closed_by_listener()


def test_an_unknown_api_key_closes_the_connection(kafka: Callable[[], KafkaSocket]) -> None:
    sock = kafka()
    header = struct.pack(">hhih", 9999, 0, 1, -1)
    sock.send_raw(struct.pack(">i", len(header)) + header)
    assert sock.closed_by_listener()


def test_a_version_not_served_closes_the_connection(kafka: Callable[[], KafkaSocket]) -> None:
    # Produce v2 (message sets, before record batch v2) is not served.
    sock = kafka()
    header = struct.pack(">hhih", PRODUCE, 2, 1, -1)
    sock.send_raw(struct.pack(">i", len(header) + 8) + header + b"\x00" * 8)
    assert sock.closed_by_listener()


def test_api_versions_of_a_version_not_served_lists_ours(
        kafka: Callable[[], KafkaSocket]) -> None:
    """Kafka's rule: answered at version 0 with UNSUPPORTED_VERSION and the
    versions served, so the client can retry lower."""
    sock = kafka()
    header = struct.pack(">hhih", API_VERSIONS, 99, 7, -1)
    sock.send_raw(struct.pack(">i", len(header)) + header)
    frame = sock.read_frame()
    assert frame is not None
    correlation_id, error, count = struct.unpack_from(">ihi", frame, 0)
    assert (correlation_id, error) == (7, UNSUPPORTED_VERSION)
    keys = {struct.unpack_from(">hhh", frame, 10 + 6 * i)[0]: struct.unpack_from(
        ">hhh", frame, 10 + 6 * i)[1:] for i in range(count)}
    assert keys[API_VERSIONS] == (0, 3)
    assert keys[PRODUCE][0] == 3


def test_bytes_that_do_not_decode_close_the_connection(
        kafka: Callable[[], KafkaSocket]) -> None:
    sock = kafka()
    # A Produce v9 header, then a compact string whose length runs far past
    # the end of the frame.
    header = struct.pack(">hhih", PRODUCE, 9, 1, -1) + b"\x00"
    body = b"\xff\xff\xff\x0f" + b"x" * 4
    sock.send_raw(struct.pack(">i", len(header) + len(body)) + header + body)
    assert sock.closed_by_listener()


def test_a_frame_cut_short_by_the_client_changes_nothing(
        kafka: Callable[[], KafkaSocket]) -> None:
    sock = kafka()
    data = encode_request(_produce(batch([b"never"])), correlation_id=1)
    sock.send_raw(data[:len(data) // 2])
    sock.close()


def test_a_truncated_batch_is_refused(kafka: Callable[[], KafkaSocket]) -> None:
    whole = batch([b"a", b"b", b"c"])
    answer = kafka().request(_produce(whole[:-5]))
    assert answer is not None
    assert _partition_error(answer) == CORRUPT_MESSAGE


def test_a_batch_with_a_wrong_crc_is_refused(kafka: Callable[[], KafkaSocket]) -> None:
    whole = bytearray(batch([b"a", b"b"]))
    whole[-1] ^= 0xFF
    answer = kafka().request(_produce(bytes(whole)))
    assert answer is not None
    assert _partition_error(answer) == CORRUPT_MESSAGE


def test_a_batch_to_an_internal_topic_is_refused(kafka: Callable[[], KafkaSocket]) -> None:
    answer = kafka().request(_produce(batch([b"forged"]), topic="__transaction_state"))
    assert answer is not None
    assert _partition_error(answer) == INVALID_TOPIC_EXCEPTION


def test_a_batch_to_an_unknown_topic_is_refused(kafka: Callable[[], KafkaSocket]) -> None:
    answer = kafka().request(_produce(batch([b"nowhere"]), topic="no-such-topic"))
    assert answer is not None
    assert _partition_error(answer) == UNKNOWN_TOPIC_OR_PARTITION


def test_a_transactional_batch_of_an_unknown_producer_is_refused(
        kafka: Callable[[], KafkaSocket]) -> None:
    forged = batch([b"forged"], producer_id=987654, producer_epoch=0, base_sequence=0,
                   transactional=True)
    answer = kafka().request(_produce(forged, transactional_id="nobody"))
    assert answer is not None
    assert _partition_error(answer) != 0


def test_an_empty_records_field_is_refused(kafka: Callable[[], KafkaSocket]) -> None:
    answer = kafka().request(_produce(b""))
    assert answer is not None
    assert _partition_error(answer) == CORRUPT_MESSAGE
