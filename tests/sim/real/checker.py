"""The exactly-once checker of the real-runtime simulation.

Goal: say whether a run kept the guarantees, without trusting the code under
test. It never asks a runtime what it believes (no coordinator state, no
producer state); it knows only what the clients did and were told — which
records each transaction wrote, whether its producer asked to commit, what
EndTxn answered — and what a reader sees: every data partition read from
offset 0 under read_committed through the store runtime's real fetch path.

Method: every record's value names its transaction and place
(`tid|instance|txn|partition|index`), so a read maps back to the ledger.

After every N steps, on each data partition whose store is up:
* no record appears twice, and offsets strictly increase;
* no record is visible unless its producer asked to commit its transaction
  (no aborted read, no read of an undecided transaction), and none of a
  transaction whose abort was acknowledged;
* what was visible stays visible at the same offset (no acknowledged,
  committed write is lost by a crash, nothing is rewritten);
* a transaction's records on a partition are visible in the order written,
  without gaps (the rest may still be above the last stable offset).

At the end, after quiescing (faults off, every node up, producers done,
timers run): every transaction is visible whole or not at all, on every
partition together (no torn transaction); every transaction whose commit
was acknowledged is visible whole (no lost write); no partition has an open
transaction (its last stable offset equals its high watermark); no runtime
task died of an exception that is not an expected error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from oncelog import records
from services.partition_store.partition import Isolation
from services.partition_store.runtime import FetchItem, FetchOutcome, StoreRuntime

T = TypeVar("T")

TxnKey = tuple[str, int, int]  # (transactional id, producer instance, txn number)


class Violation(AssertionError):
    """An exactly-once guarantee does not hold."""


@dataclass(slots=True)
class TxnFacts:
    """What the client side knows of one transaction."""

    key: TxnKey
    # partition -> values written to it (assigned to a batch), in order
    values: dict[int, list[bytes]] = field(default_factory=dict)
    commit_sent: bool = False
    # True/False once EndTxn(commit/abort) was answered with success.
    outcome: bool | None = None
    # The error code that refused EndTxn(commit) on its only attempt ("":
    # not refused so): nothing else can commit the transaction.
    commit_refused: str = ""


def record_value(key: TxnKey, partition: int, index: int) -> bytes:
    tid, instance, number = key
    return f"{tid}|{instance}|{number}|{partition}|{index}".encode()


def parse_value(value: bytes) -> tuple[TxnKey, int]:
    tid, instance, number, partition, _index = value.decode().split("|")
    return (tid, int(instance), int(number)), int(partition)


class Ledger:
    def __init__(self) -> None:
        self.txns: dict[TxnKey, TxnFacts] = {}

    def begin(self, key: TxnKey) -> TxnFacts:
        facts = TxnFacts(key)
        self.txns[key] = facts
        return facts


@dataclass(slots=True)
class Seen:
    offset: int
    value: bytes


def run_now(coro: Coroutine[Any, Any, T]) -> T | None:
    """Runs a coroutine that completes without suspending (a fetch with
    max_wait_ms 0 of a known topic) to its end, outside the loop's
    schedule; None if it would have to wait."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    return None


class Checker:
    def __init__(self, ledger: Ledger, topic: str, partitions: int,
                 store_of: Callable[[int], StoreRuntime | None]) -> None:
        self._ledger = ledger
        self._topic = topic
        self._partitions = partitions
        self._store_of = store_of
        # partition -> the read_committed view at the last check
        self._seen: dict[int, list[Seen]] = {}
        self.checks = 0

    def read_committed(self, partition: int) -> tuple[list[Seen], FetchOutcome] | None:
        """Every record visible under read_committed, from offset 0, through
        StoreRuntime.fetch; None when the store is down or still starting."""
        store = self._store_of(partition)
        if store is None or not store.started:
            return None
        out: list[Seen] = []
        offset = 0
        while True:
            outcomes = run_now(store.fetch(
                [FetchItem(self._topic, partition, offset, 1 << 20)],
                isolation=Isolation.READ_COMMITTED,
            ))
            if outcomes is None:
                return None
            (outcome,) = outcomes
            if outcome.error is not None:
                return None
            for batch in outcome.batches:
                out.extend(Seen(r.offset, r.value or b"")
                           for r in records.iter_records(batch, min_offset=offset))
            if outcome.next_fetch_offset <= offset or not outcome.batches:
                return out, outcome
            offset = outcome.next_fetch_offset

    def check_step(self) -> None:
        self.checks += 1
        for partition in range(self._partitions):
            read = self.read_committed(partition)
            if read is None:
                continue
            self._check_partition(partition, read[0])

    def _check_partition(self, partition: int, view: list[Seen]) -> None:
        where = f"{self._topic}-{partition}"
        last_offset = -1
        by_txn: dict[TxnKey, list[bytes]] = {}
        seen_values: set[bytes] = set()
        for seen in view:
            if seen.offset <= last_offset:
                raise Violation(f"{where}: offsets not increasing: {seen.offset} after "
                                f"{last_offset}")
            last_offset = seen.offset
            if seen.value in seen_values:
                raise Violation(f"{where}: duplicate record {seen.value!r} at {seen.offset}")
            seen_values.add(seen.value)
            key, written_to = parse_value(seen.value)
            if written_to != partition:
                raise Violation(f"{where}: record {seen.value!r} was sent to partition "
                                f"{written_to}")
            facts = self._ledger.txns.get(key)
            if facts is None:
                raise Violation(f"{where}: record {seen.value!r} of no known transaction")
            if not facts.commit_sent:
                raise Violation(f"{where}: record {seen.value!r} at {seen.offset} is visible, "
                                f"but its producer never asked to commit {key} "
                                "(aborted or undecided read)")
            if facts.outcome is False:
                raise Violation(f"{where}: record {seen.value!r} at {seen.offset} is visible, "
                                f"but the abort of {key} was acknowledged")
            if facts.commit_refused:
                raise Violation(f"{where}: record {seen.value!r} at {seen.offset} is visible, "
                                f"but the commit of {key} was refused "
                                f"({facts.commit_refused}) on its only attempt (aborted read)")
            by_txn.setdefault(key, []).append(seen.value)
        for key, values in by_txn.items():
            # A prefix: the rest may lie above the last stable offset (behind
            # another transaction still open); check_final wants it whole.
            expected = self._ledger.txns[key].values.get(partition, [])
            if values != expected[:len(values)]:
                raise Violation(f"{where}: transaction {key} is visible out of order or with "
                                f"gaps: {values!r}, written {expected!r}")
        before = self._seen.get(partition, [])
        if view[:len(before)] != before:
            lost = [s for s in before if s not in view]
            raise Violation(f"{where}: records once visible are gone or moved: "
                            f"{[(s.offset, s.value) for s in lost[:3]]!r}")
        self._seen[partition] = view

    def check_final(self, *, runtime_errors: list[str]) -> None:
        """After quiescing; every store must be up."""
        if runtime_errors:
            raise Violation(f"a runtime raised an unexpected exception: {runtime_errors[0]}")
        visible: dict[TxnKey, dict[int, list[bytes]]] = {}
        for partition in range(self._partitions):
            read = self.read_committed(partition)
            if read is None:
                raise Violation(f"{self._topic}-{partition}: not readable after quiescing")
            view, last = read
            self._check_partition(partition, view)
            if last.last_stable_offset != last.high_watermark:
                raise Violation(f"{self._topic}-{partition}: a transaction is still open after "
                                f"quiescing (LSO {last.last_stable_offset}, HW "
                                f"{last.high_watermark})")
            for seen in view:
                key, _p = parse_value(seen.value)
                visible.setdefault(key, {}).setdefault(partition, []).append(seen.value)
        for key, facts in self._ledger.txns.items():
            got = visible.get(key, {})
            written = {p: v for p, v in facts.values.items() if v}
            if got and got != written:
                raise Violation(f"transaction {key} is torn: visible on "
                                f"{sorted(got)} of its partitions {sorted(written)}")
            if facts.outcome is True and got != written:
                raise Violation(f"transaction {key}: its commit was acknowledged but "
                                f"{sum(map(len, written.values())) - sum(map(len, got.values()))}"
                                " of its records are not visible (lost write)")


__all__ = ["Checker", "Ledger", "TxnFacts", "TxnKey", "Violation", "parse_value",
           "record_value", "run_now", "asyncio"]
