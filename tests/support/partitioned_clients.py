"""Clients for the network-partition tests, and the check of what they saw.

The client functions run inside a LocalCluster's client namespace
(`LocalCluster.client_call`: a fresh Python there, so each is a top-level
function taking and returning plain values). The streams append one line per
outcome to a log file, which the test reads while they run to see progress,
and stop once a stop file exists:

    ack <value> <partition> <offset>        an idempotent record acknowledged
    fail <value> <error class>              an idempotent record given up on
    txn <outcome> <txn> <value>@<partition>:<offset>,...   committed (offsets known)
    txn <outcome> <txn> <value>,...          aborted, or unknown (the commit's
                                             answer was lost: the coordinator
                                             decides, all or nothing)
    note <txn> <error class>: <message>      the error that transaction met

`ClientStreams` runs both streams in the background from the test process;
`check_exactly_once` holds the logs against what a read_committed reader
finds: nothing acknowledged lost or moved, nothing written twice, no
aborted record visible, no torn transaction, per-partition order kept.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncelog import Admin, Consumer, Producer, TopicPartition
from oncelog import errors as oerrors
from oncelog.testing import LocalCluster
from tests.support.reading import read_all

COMMITTED = "committed"
ABORTED = "aborted"
UNKNOWN = "unknown"
RECORDS_PER_TXN = 4
# Every ABORT_EVERY-th transaction is aborted on purpose.
ABORT_EVERY = 5
# The read-process-write stream's consumer group.
COPIER_GROUP = "copier"
# Bounds the idempotent stream's unacknowledged records (memory, and how far
# it runs ahead while a partition stalls it).
MAX_UNACKED = 200
# A produce waits for the high watermark at most this long: a deposed leader
# that cannot replicate answers after it, and the client asks the cluster
# again (Kafka's default is 30 s; a test should not wait that long).
REQUEST_TIMEOUT_MS = 5_000
# How long the streams may take to finish once told to stop.
FINISH_TIMEOUT_S = 120.0


class _LineLog:
    """Appends whole lines, flushed at once, from any thread."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, replication_factor=3)


def stream_idempotent(bootstrap: str, topic: str, partitions: int, log_path: str,
                      stop_path: str) -> int:
    """Numbered records b"i<n>" to partition n % partitions until stop_path
    exists; returns how many were sent."""
    out = _LineLog(log_path)
    unacked: list[Future[object]] = []

    def logged(value: bytes) -> Callable[[Future[object]], None]:
        def done(future: Future[object]) -> None:
            exc = future.exception()
            if exc is None:
                meta = future.result()
                out.write(f"ack {value.decode()} {meta.partition} {meta.offset}")  # type: ignore[attr-defined]
            else:
                out.write(f"fail {value.decode()} {type(exc).__name__}")
        return done

    sent = 0
    with Producer(bootstrap=bootstrap, linger_ms=2, request_timeout_ms=REQUEST_TIMEOUT_MS,
                  delivery_timeout_ms=120_000) as producer:
        while not Path(stop_path).exists():
            unacked = [f for f in unacked if not f.done()]
            if len(unacked) >= MAX_UNACKED:
                time.sleep(0.01)
                continue
            value = b"i%d" % sent
            future = producer.send(topic, value=value, partition=sent % partitions)
            future.add_done_callback(logged(value))  # type: ignore[arg-type]
            unacked.append(future)  # type: ignore[arg-type]
            sent += 1
            if sent % 20 == 0:
                time.sleep(0.02)
        producer.flush(timeout=FINISH_TIMEOUT_S)
    out.close()
    return sent


def stream_transactions(bootstrap: str, topic: str, partitions: int, log_path: str,
                        stop_path: str, transactional_id: str) -> int:
    """Transactions of RECORDS_PER_TXN records over the partitions, every
    ABORT_EVERY-th aborted, until stop_path exists; returns how many were
    begun. A transaction whose end cannot be confirmed is logged unknown,
    and a new producer with the same id takes over (init_transactions
    fences the old one and settles what it left)."""
    out = _LineLog(log_path)
    producer: Producer | None = None
    number = 0
    while not Path(stop_path).exists():
        try:
            if producer is None:
                producer = Producer(bootstrap=bootstrap, transactional_id=transactional_id,
                                    linger_ms=1, request_timeout_ms=REQUEST_TIMEOUT_MS,
                                    max_block_ms=20_000)
                producer.init_transactions()
        except oerrors.OncelogError:
            if producer is not None:
                producer.close(timeout=5)
            producer = None
            time.sleep(0.2)
            continue
        txn = f"{transactional_id}-{number}"
        number += 1
        values = [f"{txn}-{i}".encode() for i in range(RECORDS_PER_TXN)]
        outcome = UNKNOWN
        futures = []
        error: Exception | None = None
        try:
            producer.begin_transaction()
            futures = [producer.send(topic, value=v, partition=i % partitions)
                       for i, v in enumerate(values)]
            if number % ABORT_EVERY == 0:
                producer.abort_transaction()
                outcome = ABORTED
            else:
                producer.commit_transaction()
                outcome = COMMITTED
        except oerrors.TransactionAbortableError as exc:
            error = exc
            try:
                producer.abort_transaction()
                outcome = ABORTED
            except oerrors.OncelogError as abort_exc:
                error = abort_exc
        except oerrors.OncelogError as exc:
            error = exc
        _log_transaction(out, outcome, txn, values, futures, error)
        if outcome == UNKNOWN:
            producer.close(timeout=5)
            producer = None
    if producer is not None:
        producer.close(timeout=30)
    out.close()
    return number


def copy_identity(txn: str, partition: int, offset: int) -> bytes:
    """An output record of stream_copier: its transaction and the input it
    copies (an input copied again after an abort is another record)."""
    return f"c{txn}|{partition}:{offset}".encode()


def copy_source(identity: bytes) -> tuple[int, int]:
    """The input (partition, offset) an output record of stream_copier copies."""
    partition, offset = identity.decode().rsplit("|", 1)[1].split(":")
    return int(partition), int(offset)


def _rewind(consumer: Consumer, stop_path: str) -> None:
    """Back to the group's committed offsets, retried while the group
    coordinator cannot answer (a fault) unless told to stop."""
    while True:
        try:
            consumer.seek_to_committed(timeout=10)
            return
        except oerrors.OncelogError:
            if Path(stop_path).exists():
                raise
            time.sleep(0.2)


def stream_copier(bootstrap: str, in_topic: str, out_topic: str, log_path: str,
                  stop_path: str, group: str = COPIER_GROUP) -> int:
    """Read-process-write, exactly once: a read_committed consumer in
    `group` reads in_topic, and each polled batch goes to the same partition
    of out_topic in one transaction with the group's offsets (each output
    value is copy_identity(txn, input partition, input offset)); every
    ABORT_EVERY-th transaction is aborted on purpose and its input copied
    again. Logs each transaction as stream_transactions does; a commit whose
    outcome is unknown starts a new producer (which settles it) and goes
    back to the committed offsets. Runs until stop_path exists; returns how
    many transactions it began."""
    out = _LineLog(log_path)
    consumer = Consumer(bootstrap=bootstrap, group_id=group, isolation_level="read_committed",
                        auto_offset_reset="earliest", enable_auto_commit=False,
                        max_poll_records=100, session_timeout_ms=10_000)
    consumer.subscribe([in_topic])
    producer: Producer | None = None
    number = 0
    while not Path(stop_path).exists():
        try:
            if producer is None:
                producer = Producer(bootstrap=bootstrap, transactional_id=f"{group}-tx",
                                    linger_ms=2, request_timeout_ms=REQUEST_TIMEOUT_MS,
                                    max_block_ms=20_000)
                producer.init_transactions()
                _rewind(consumer, stop_path)
            records = consumer.poll(timeout=0.2)
        except oerrors.OncelogError:
            if producer is not None:
                producer.close(timeout=5)
            producer = None
            time.sleep(0.2)
            continue
        if not records:
            continue
        txn = f"copier-{number}"
        number += 1
        values = [copy_identity(txn, r.partition, r.offset) for r in records]
        outcome = UNKNOWN
        futures = []
        error: Exception | None = None
        try:
            producer.begin_transaction()
            futures = [producer.send(out_topic, value=v, partition=r.partition)
                       for v, r in zip(values, records, strict=True)]
            if number % ABORT_EVERY == 0:
                producer.abort_transaction()
                outcome = ABORTED
            else:
                offsets = {tp: consumer.position(tp) for tp in
                           {TopicPartition(r.topic, r.partition) for r in records}}
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
                producer.commit_transaction()
                outcome = COMMITTED
        except oerrors.TransactionAbortableError as exc:
            error = exc
            try:
                producer.abort_transaction()
                outcome = ABORTED
            except oerrors.OncelogError as abort_exc:
                error = abort_exc
        except oerrors.OncelogError as exc:
            error = exc
        _log_transaction(out, outcome, txn, values, futures, error)
        if outcome != COMMITTED:
            if outcome == UNKNOWN:
                producer.close(timeout=5)
                producer = None
            else:
                try:
                    _rewind(consumer, stop_path)
                except oerrors.OncelogError:
                    break
    if producer is not None:
        producer.close(timeout=30)
    consumer.close()
    out.close()
    return number


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int
                      ) -> dict[int, int]:
    """The group's committed offset of each partition of `topic` (0 when
    none)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap=bootstrap, group_id=group, enable_auto_commit=False) as consumer:
        found = consumer.committed(tps, timeout=60)
    return {tp.partition: found.get(tp) or 0 for tp in tps}


def try_one_write(bootstrap: str, topic: str, *, delivery_timeout_ms: int) -> str:
    """One idempotent record to partition 0: "acked", or the error it got
    (class and message) once delivery_timeout_ms has passed."""
    with Producer(bootstrap=bootstrap, linger_ms=0, request_timeout_ms=REQUEST_TIMEOUT_MS,
                  delivery_timeout_ms=delivery_timeout_ms) as producer:
        future = producer.send(topic, value=b"probe", partition=0)
        try:
            future.result(timeout=delivery_timeout_ms / 1000 + 30)
        except oerrors.OncelogError as exc:
            return f"{type(exc).__name__}: {exc}"
    return "acked"


def read_committed(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record a read_committed reader
    sees, once every decided transaction's markers have landed."""
    return [(r.partition, r.offset, r.value or b"")
            for r in read_all(bootstrap, topic, partitions, isolation_level="read_committed",
                              deadline_s=120)]


# ------------------------------------------------------------- test side


@dataclass
class ClientLog:
    """What the streams logged (see the module docstring)."""

    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    failed: set[bytes] = field(default_factory=set)
    # txn -> (outcome, {value: (partition, offset) or None when not known})
    txns: dict[str, tuple[str, dict[bytes, tuple[int, int] | None]]] = field(
        default_factory=dict)

    @classmethod
    def parse(cls, *paths: Path) -> ClientLog:
        log = cls()
        for path in paths:
            if path.exists():
                for line in path.read_text().splitlines():
                    log.feed(line)
        return log

    def feed(self, line: str) -> None:
        """Takes one line of a stream's log."""
        kind, rest = line.split(" ", 1)
        if kind == "ack":
            value, partition, offset = rest.split()
            self.acked[value.encode()] = (int(partition), int(offset))
        elif kind == "fail":
            self.failed.add(rest.split()[0].encode())
        elif kind == "note":
            pass  # an error a transaction met, for a reader of the log
        elif kind == "txn":
            outcome, txn, items = rest.split(" ", 2)
            placed: dict[bytes, tuple[int, int] | None] = {}
            for item in items.split(","):
                value, _, where = item.partition("@")
                if where:
                    partition, offset = where.split(":")
                    placed[value.encode()] = (int(partition), int(offset))
                else:
                    placed[value.encode()] = None
            self.txns[txn] = (outcome, placed)

    def committed(self) -> int:
        return sum(1 for outcome, _ in self.txns.values() if outcome == COMMITTED)


class ClientStreams:
    """An idempotent and a transactional stream in the cluster's client
    namespace, run from threads of the test process; with `copy_to`, a
    third: stream_copier, reading `topic` and writing `copy_to` (its log
    apart: copier_log())."""

    def __init__(self, cluster: LocalCluster, topic: str, partitions: int,
                 directory: Path, *, transactional_id: str = "writer",
                 copy_to: str | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.idempotent_log = directory / "idempotent.log"
        self.txn_log = directory / "transactions.log"
        self.copier_log_path = directory / "copier.log"
        self._stop_path = directory / "stop"
        self._stop_path.unlink(missing_ok=True)
        self._log = ClientLog()
        self._copier_log = ClientLog()
        self._read_bytes = {self.idempotent_log: 0, self.txn_log: 0, self.copier_log_path: 0}
        bootstrap = cluster.bootstrap_servers
        self._pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="client-stream")
        self._runs = [
            self._pool.submit(cluster.client_call, stream_idempotent, bootstrap, topic,
                              partitions, str(self.idempotent_log), str(self._stop_path),
                              timeout_s=None),
            self._pool.submit(cluster.client_call, stream_transactions, bootstrap, topic,
                              partitions, str(self.txn_log), str(self._stop_path),
                              transactional_id, timeout_s=None),
        ]
        if copy_to is not None:
            self._runs.append(self._pool.submit(
                cluster.client_call, stream_copier, bootstrap, topic, copy_to,
                str(self.copier_log_path), str(self._stop_path), timeout_s=None))

    def _read_on(self, path: Path, into: ClientLog) -> None:
        if not path.exists():
            return
        with open(path, "rb") as source:
            source.seek(self._read_bytes[path])
            chunk = source.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self._read_bytes[path] += len(complete)
        for line in complete.decode().splitlines():
            into.feed(line)

    def log(self) -> ClientLog:
        """What the producing streams logged so far (read on from where the
        last call stopped: the logs grow to tens of thousands of lines)."""
        for path in (self.idempotent_log, self.txn_log):
            self._read_on(path, self._log)
        return dataclasses.replace(self._log, acked=dict(self._log.acked),
                                   failed=set(self._log.failed), txns=dict(self._log.txns))

    def copier_log(self) -> ClientLog:
        """What the copier logged so far (empty without copy_to)."""
        self._read_on(self.copier_log_path, self._copier_log)
        return dataclasses.replace(self._copier_log, txns=dict(self._copier_log.txns))

    def _raise_if_failed(self) -> None:
        for run in self._runs:
            if run.done() and run.exception() is not None:
                raise AssertionError("a client stream failed") from run.exception()

    def wait_progress(self, what: str, *, acks: int = 50, commits: int = 3,
                      copies: int = 0, deadline_s: float = 90.0) -> float:
        """Waits until both streams got `acks` acknowledgements and `commits`
        committed transactions more than now (and the copier `copies`
        committed transactions); returns the seconds it took."""
        before = self.log()
        copied_before = self.copier_log().committed()
        started = time.monotonic()
        while True:
            self._raise_if_failed()
            now = self.log()
            copied = self.copier_log().committed() - copied_before
            if (len(now.acked) >= len(before.acked) + acks
                    and now.committed() >= before.committed() + commits
                    and copied >= copies):
                return time.monotonic() - started
            if time.monotonic() - started > deadline_s:
                raise AssertionError(
                    f"{what}: after {deadline_s} s the clients got "
                    f"{len(now.acked) - len(before.acked)} acknowledgements (wanted {acks}), "
                    f"{now.committed() - before.committed()} commits (wanted {commits}) "
                    f"and {copied} copier commits (wanted {copies})")
            time.sleep(0.1)

    def stop(self) -> ClientLog:
        """Tells both streams to stop and waits until they have finished."""
        self._stop_path.touch()
        try:
            for run in self._runs:
                run.result(timeout=FINISH_TIMEOUT_S + 60)
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
        return ClientLog.parse(self.idempotent_log, self.txn_log)

    def final_copier_log(self) -> ClientLog:
        """The copier's whole log, once stop() returned."""
        return ClientLog.parse(self.copier_log_path)


ANOMALY_KINDS = ("lost", "duplicated", "aborted_read", "torn", "non_monotonic",
                 "uncommitted_read")


def find_anomalies(log: ClientLog, records: list[tuple[int, int, bytes]]
                   ) -> dict[str, list[str]]:
    """What the reader found that the clients' logs rule out, by kind (each
    of ANOMALY_KINDS, an empty list when none), one line per anomaly:

    * lost: an acknowledged record, or one of a committed transaction, not
      visible, or not at the partition and offset its acknowledgement gave;
    * duplicated: a value visible more than once;
    * aborted_read: a record of a transaction its client aborted is visible;
    * torn: a transaction whose outcome its client does not know is visible
      in part only;
    * non_monotonic: an idempotent stream's numbers out of order in a
      partition;
    * uncommitted_read: a visible record no client logged as acknowledged,
      failed or part of an ended transaction (what a read_committed reader
      must never see: the writes of a transaction that never ended)."""
    found: dict[str, list[str]] = {kind: [] for kind in ANOMALY_KINDS}
    counts = Counter(value for _p, _o, value in records)
    found["duplicated"] = [f"{value!r} x{n}" for value, n in counts.items() if n > 1]
    where = {value: (partition, offset) for partition, offset, value in records}
    found["lost"] = [f"acknowledged {value!r} at {at}, read at {where.get(value)}"
                     for value, at in log.acked.items() if where.get(value) != at]
    for txn, (outcome, placed) in log.txns.items():
        present = [value for value in placed if value in where]
        if outcome == COMMITTED:
            found["lost"] += [f"committed {txn}: {v!r} at {at}, read at {where.get(v)}"
                              for v, at in placed.items() if where.get(v) != at]
        elif outcome == ABORTED:
            if present:
                found["aborted_read"].append(f"aborted {txn} visible: {present}")
        elif len(present) not in (0, len(placed)):
            found["torn"].append(f"{txn} (outcome unknown to its client): only {present} "
                                 f"of {list(placed)} visible")
    known = set(log.acked) | log.failed | {v for _o, placed in log.txns.values()
                                           for v in placed}
    found["uncommitted_read"] = [f"{value!r} logged by no client" for value in counts
                                 if value not in known]
    for partition in sorted({p for p, _o, _v in records}):
        numbers = [int(value[1:]) for p, _o, value in sorted(records)
                   if p == partition and value.startswith(b"i")]
        if numbers != sorted(numbers):
            found["non_monotonic"].append(f"partition {partition}: idempotent order changed")
    return found


def find_copy_anomalies(inputs: list[tuple[int, int, bytes]],
                        outputs: list[tuple[int, int, bytes]],
                        committed: dict[int, int]) -> dict[str, list[str]]:
    """What stream_copier's output (read_committed) holds against its input
    and its group's committed offsets, by kind: an input below the committed
    offset with no visible copy is lost, one with two is duplicated, and
    the copies of an input partition out of input order are non_monotonic.
    (Aborted, torn and uncommitted copies are find_anomalies's on the
    copier's own log.)"""
    found: dict[str, list[str]] = {kind: [] for kind in ANOMALY_KINDS}
    sources = Counter(copy_source(value) for _p, _o, value in outputs)
    found["duplicated"] = [f"input {src} copied {n} times" for src, n in sources.items()
                           if n > 1]
    found["lost"] = [f"input {p}:{o} below the committed offset {committed.get(p)} and "
                     f"never copied" for p, o, _v in inputs
                     if o < committed.get(p, 0) and (p, o) not in sources]
    for partition in sorted({p for p, _o, _v in outputs}):
        copied = [copy_source(value) for p, _o, value in sorted(outputs) if p == partition]
        offsets = [o for source_partition, o in copied if source_partition == partition]
        if offsets != sorted(offsets):
            found["non_monotonic"].append(f"output partition {partition}: copies out of "
                                          f"input order")
    return found


def check_exactly_once(log: ClientLog, records: list[tuple[int, int, bytes]]) -> None:
    """Fails unless what the reader found is exactly what the clients were
    told (module docstring; find_anomalies says what each kind means)."""
    found = {kind: lines for kind, lines in find_anomalies(log, records).items() if lines}
    assert not found, "anomalies: " + "; ".join(
        f"{len(lines)} {kind}, e.g. {lines[:5]}" for kind, lines in found.items())


def _log_transaction(out: Any, outcome: str, txn: Any, values: Sequence[bytes],
                     futures: Sequence[Any], error: Exception | None = None) -> None:
    """One transaction's line: a committed one with where each record landed,
    any other with its values only; then, when one was met, a `note` line
    with the error (what a run that stalls is read by)."""
    if outcome == COMMITTED:
        placed = [f"{v.decode()}@{f.result().partition}:{f.result().offset}"
                  for v, f in zip(values, futures, strict=True)]
        out.write(f"txn {outcome} {txn} {','.join(placed)}")
    else:
        out.write(f"txn {outcome} {txn} {','.join(v.decode() for v in values)}")
    if error is not None:
        message = " ".join(str(error).split())
        out.write(f"note {txn} {type(error).__name__}: {message[:500]}")

