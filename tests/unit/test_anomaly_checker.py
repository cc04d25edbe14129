"""The soaks' independent checker (tests/support/partitioned_clients.py:
find_anomalies, find_copy_anomalies, check_exactly_once).

Goal: each kind of anomaly is found and counted under its own kind, and a
history with none is clean — so that a soak's "0 anomalies" means the
checker looked, not that it could not see.

Method: a small clean history (what the clients logged, what a reader
found), then one change to it per kind of anomaly; each must show up as
exactly that kind.
"""

from __future__ import annotations

import pytest

from tests.support.partitioned_clients import (
    ABORTED,
    ANOMALY_KINDS,
    COMMITTED,
    UNKNOWN,
    ClientLog,
    check_exactly_once,
    copy_identity,
    find_anomalies,
    find_copy_anomalies,
)

Records = list[tuple[int, int, bytes]]


def _history() -> tuple[ClientLog, Records]:
    log = ClientLog()
    for line in ("ack i0 0 0", "ack i1 1 0", "ack i2 0 1",
                 "txn committed w-1 w-1-0@0:2,w-1-1@1:1",
                 "txn aborted w-2 w-2-0,w-2-1",
                 "txn unknown w-3 w-3-0,w-3-1"):
        log.feed(line)
    records = [(0, 0, b"i0"), (1, 0, b"i1"), (0, 1, b"i2"), (0, 2, b"w-1-0"),
               (1, 1, b"w-1-1"), (0, 3, b"w-3-0"), (1, 2, b"w-3-1")]
    return log, records


def _kinds(found: dict[str, list[str]]) -> dict[str, int]:
    return {kind: len(lines) for kind, lines in found.items() if lines}


def test_a_clean_history_has_no_anomaly() -> None:
    log, records = _history()
    assert set(find_anomalies(log, records)) == set(ANOMALY_KINDS)
    assert _kinds(find_anomalies(log, records)) == {}
    check_exactly_once(log, records)


@pytest.mark.parametrize(("kind", "change"), [
    ("lost", lambda r: [x for x in r if x[2] != b"i1"]),
    ("lost", lambda r: [x for x in r if x[2] != b"w-1-1"]),
    ("duplicated", lambda r: [*r, (0, 4, b"i2")]),
    ("aborted_read", lambda r: [*r, (0, 4, b"w-2-0"), (1, 3, b"w-2-1")]),
    ("torn", lambda r: [x for x in r if x[2] != b"w-3-1"]),
    ("non_monotonic", lambda r: [(0, 0, b"i2") if x[2] == b"i0" else
                                 (0, 1, b"i0") if x[2] == b"i2" else x for x in r]),
    ("uncommitted_read", lambda r: [*r, (1, 3, b"w-4-0")]),
])
def test_each_anomaly_is_found_as_its_kind(kind: str, change) -> None:  # type: ignore[no-untyped-def]
    log, records = _history()
    found = _kinds(find_anomalies(log, change(records)))
    # Swapping two acknowledged records also moves them: lost as well.
    assert kind in found, found
    assert set(found) <= {kind, "lost"}, found
    with pytest.raises(AssertionError, match=kind):
        check_exactly_once(log, change(records))


def test_the_copy_check_finds_lost_duplicated_and_reordered_copies() -> None:
    inputs = [(0, o, b"i%d" % o) for o in range(4)]
    copies = [(0, o, copy_identity("copier-0", 0, o)) for o in range(4)]
    assert _kinds(find_copy_anomalies(inputs, copies, {0: 4})) == {}
    assert _kinds(find_copy_anomalies(inputs, copies[:3], {0: 4})) == {"lost": 1}
    # Below the committed offset only: an input not yet copied is not lost.
    assert _kinds(find_copy_anomalies(inputs, copies[:3], {0: 3})) == {}
    again = [*copies, (0, 4, copy_identity("copier-1", 0, 3))]
    assert _kinds(find_copy_anomalies(inputs, again, {0: 4})) == {"duplicated": 1}
    swapped = [(0, 0, copies[1][2]), (0, 1, copies[0][2]), *copies[2:]]
    assert _kinds(find_copy_anomalies(inputs, swapped, {0: 4})) == {"non_monotonic": 1}
    assert ABORTED and COMMITTED and UNKNOWN  # the outcomes the logs use
