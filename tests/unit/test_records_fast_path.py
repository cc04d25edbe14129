"""encode_batch's fast path writes exactly the bytes of the general form.

Method: encode batches whose records all take the fast path (a value, no
headers; with and without keys), rebuild the same batch from
records._encode_record (the general form) and compare byte for byte; then
round-trip mixed batches through iter_records.
"""

from __future__ import annotations

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
