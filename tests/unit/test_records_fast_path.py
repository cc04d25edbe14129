"""encode_batch's fast path writes exactly the bytes of the general form.

Method: encode batches whose records all take the fast path (a value, no
headers; with and without keys), rebuild the same batch from
records._encode_record (the general form) and compare byte for byte; then
round-trip mixed batches through iter_records, hand records out as the
consumer's records (take_records, poll) and as columns (take_columns,
poll_columns), and read a consumer's
buffer of batches (iter_buffered_fields) with each offset once.
"""

from __future__ import annotations

import collections

from oncelog.types import ConsumerRecord
from oncelog.wire import records


def _general(rows: list[tuple[bytes | None, bytes | None, None, int]]) -> bytes:
    base_ts = min(r[3] for r in rows)
    body = b"".join(
        records._encode_record(i, key, value, headers, ts - base_ts)
        for i, (key, value, headers, ts) in enumerate(rows)
    )
    return records._finish(body, 0, len(rows), base_ts, max(r[3] for r in rows), 7, 1, 40, 0)


def test_fast_path_bytes_equal_the_general_form() -> None:
    rows: list[tuple[bytes | None, bytes | None, None, int]] = [
        (None, b"value-%d" % i if i % 3 else b"", None, 1_000 + (i * 7) % 13)
        if i % 2 else (b"key-%d" % i, b"v" * i, None, 2_000 - i)
        for i in range(50)
    ]
    fast = records.encode_batch(rows, producer_id=7, producer_epoch=1, base_sequence=40)
    assert fast == _general(rows)


def test_mixed_batches_round_trip() -> None:
    rows = [
        (b"k", b"v", None, 5),
        (None, None, None, 6),
        (b"k2", b"v2", [("h", b"x"), ("n", None), ("\u00e9t\u00e9", b"")], 4),
        (None, b"plain", None, 9),
    ]
    batch = records.with_base_offset(records.encode_batch(rows), 100)
    records.validate_batch(batch, max_size_bytes=1 << 20)
    got = [(r.offset, r.key, r.value, r.headers, r.timestamp_ms)
           for r in records.iter_records(batch)]
    assert got == [
        (100, b"k", b"v", (), 5),
        (101, None, None, (), 6),
        (102, b"k2", b"v2", (("h", b"x"), ("n", None), ("\u00e9t\u00e9", b"")), 4),
        (103, None, b"plain", (), 9),
    ]


# Five records at offsets 100-104, with and without keys, values and headers.
_HAND_OUT_ROWS: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None,
                          int]] = [
    (b"k", b"v", None, 5),
    (None, None, None, 6),
    (b"k2", b"v2", [("h", b"x"), ("n", None)], 4),
    (None, b"plain", None, 9),
    (b"k5", b"", None, 7),
]


def test_take_records_makes_the_consumers_records_up_to_its_limit() -> None:
    # The consumer's hand-out (poll): record i is what iter_record_fields
    # yields as record i, with its topic and partition, in the named tuple's
    # field order; the limit stops it mid-batch, and the rest comes from
    # the same iterator next time.
    batch = records.with_base_offset(records.encode_batch(_HAND_OUT_ROWS), 100)
    want = [ConsumerRecord("t", 3, offset, key, value, headers, timestamp_ms)
            for offset, timestamp_ms, key, value, headers
            in records.iter_record_fields(batch, min_offset=101)]
    fields = records.iter_record_fields(batch, min_offset=101)
    first, ran_out = records.take_records(fields, 3, "t", 3, ConsumerRecord)
    assert not ran_out
    second, ran_out = records.take_records(fields, 3, "t", 3, ConsumerRecord)
    assert ran_out
    assert first + second == want
    assert all(type(r) is ConsumerRecord for r in first + second)
    assert first[1].key == b"k2" and first[1].headers == (("h", b"x"), ("n", None))
    assert records.take_records(fields, 3, "t", 3, ConsumerRecord) == ([], True)


def test_take_columns_hands_out_the_fields_up_to_its_limit() -> None:
    # The consumer's columnar hand-out: item i of each column is record i of
    # what iter_record_fields yields; the limit stops it mid-batch, and the
    # rest comes from the same iterator next time.
    batch = records.with_base_offset(records.encode_batch(_HAND_OUT_ROWS), 100)
    want = list(records.iter_record_fields(batch, min_offset=101))
    fields = records.iter_record_fields(batch, min_offset=101)
    first, ran_out = records.take_columns(fields, 3)
    assert not ran_out
    second, ran_out = records.take_columns(fields, 3)
    assert ran_out
    assert first[0] == [101, 102, 103] and second[0] == [104]
    got = [list(zip(*columns, strict=True)) for columns in (first, second)]
    assert got[0] + got[1] == want
    assert first[2] == [None, b"k2", None] and first[3] == [None, b"v2", b"plain"]
    assert first[4][1] == (("h", b"x"), ("n", None))
    empty, ran_out = records.take_columns(fields, 3)
    assert ran_out and empty == ([], [], [], [], [])


def _numbered(base_offset: int, count: int) -> bytes:
    return records.encode_batch([(None, b"%d" % (base_offset + i), None, 1) for i in range(count)],
                                base_offset=base_offset)


def test_a_buffer_of_batches_reads_each_offset_once_in_order() -> None:
    # A consumer's buffer: batches leave the queue as they are begun, one
    # appended meanwhile (fetched ahead) is read too, a control batch gives
    # nothing, and a batch that begins before the end of the last one
    # begun (overlapping it) is read from after that end.
    marker = records.encode_control_batch(marker=1, coordinator_epoch=0, producer_id=5,
                                          producer_epoch=0, timestamp_ms=1, base_offset=6)
    buffer = collections.deque([_numbered(0, 4), _numbered(2, 4), marker])
    reader = records.iter_buffered_fields(buffer, min_offset=1)
    first = [next(reader)[0] for _ in range(3)]
    assert len(buffer) == 2  # the second batch is not begun yet
    buffer.append(_numbered(7, 2))
    rest = [fields[0] for fields in reader]
    assert first + rest == [1, 2, 3, 4, 5, 7, 8]
    assert not buffer
