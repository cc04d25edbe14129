"""Writing records with known outcomes, for tests that check what a reader sees."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oncelog import Producer

# What became of a record's transaction.
COMMITTED = "committed"
ABORTED = "aborted"
OPEN = "open"
PLAIN = "plain"  # not transactional (idempotent producer)


@dataclass(frozen=True, slots=True)
class Written:
    """One record as it landed in the log."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int
    outcome: str


def send_all(
    producer: Producer,
    topic: str,
    partition: int,
    values: Sequence[bytes],
    *,
    outcome: str,
    key: bytes | None = None,
    headers: Sequence[tuple[str, bytes | None]] = (),
    timestamp_ms: int | None = None,
) -> list[Written]:
    """Sends `values` to one partition and waits until each is in the log
    (flush), so a transaction aborted afterwards has records the reader must
    skip; `outcome` is what the caller will do with the transaction."""
    futures = [
        producer.send(topic, value=v, key=key, partition=partition, headers=list(headers),
                      timestamp_ms=timestamp_ms)
        for v in values
    ]
    producer.flush()
    out = []
    for value, future in zip(values, futures, strict=True):
        meta = future.result()
        out.append(Written(topic, meta.partition, meta.offset, key, value, tuple(headers),
                           meta.timestamp_ms, outcome))
    return out


def write_transaction(
    producer: Producer,
    topic: str,
    partition: int,
    values: Sequence[bytes],
    *,
    outcome: str,
    key: bytes | None = None,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> list[Written]:
    """One transaction of `values` on one partition, committed, aborted, or
    left open (the caller ends it later)."""
    if outcome not in (COMMITTED, ABORTED, OPEN):
        raise ValueError(f"outcome must be committed, aborted or open, got {outcome!r}")
    producer.begin_transaction()
    written = send_all(producer, topic, partition, values, outcome=outcome, key=key,
                       headers=headers)
    if outcome == COMMITTED:
        producer.commit_transaction()
    elif outcome == ABORTED:
        producer.abort_transaction()
    return written
