"""The main job: payments to a double-entry ledger with Spark, exactly once,
while processes are killed.

1. Starts a LocalCluster (three partition stores with etcd holding the
   cluster's metadata, a transaction coordinator, a group coordinator, each
   its own process) and creates `payments` and `ledger` with three copies
   of every partition (min.insync.replicas 2), as are the coordinators'
   internal topics.
2. A generator writes payment events (`id`, `from`, `to`, `amount_cents`)
   into `payments` in transactions; about one transaction in ten is aborted
   on purpose.
3. A Spark Structured Streaming job, its own OS process
   (`python -m oncelog_spark.jobs.payments`), reads `payments` with the
   oncelog source (read_committed) and writes a debit and a credit per
   payment into `ledger` with an exactly-once oncelog sink.
4. Meanwhile a chaos thread kill -9s partition stores, the coordinator
   and the Spark driver (its whole process group: JVM and Python workers)
   at random moments and starts them again — the Spark job from its
   checkpoint. It also wipes one store's disk (the store comes back empty
   and rebuilds its copies from the others) and, last, kills one store for
   good: the pipeline finishes on the two that are left.
5. When the job has caught up, it is stopped and `ledger` is read back with
   read_committed: every committed payment must appear exactly twice (its
   debit and its credit), no aborted payment at all, the entries must sum
   to zero, each account's balance must equal the one computed straight
   from the committed payments, and no transaction may be left hanging.

Prints progress while it runs and a summary table at the end; exits 1 on
any violation (0 otherwise, 2 for bad usage).

    bash scripts/demo.sh [--payments N] [--no-chaos] [--seed N] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from oncelog import Admin, Consumer, ConsumerRecord, Producer, TopicPartition, errors
from oncelog.admin import OPEN_TRANSACTION_STATES
from oncelog.testing import LocalCluster

PAYMENTS = "payments"
LEDGER = "ledger"
PARTITIONS = 3
# Partition stores, each topic's replication factor (min.insync.replicas 2).
STORES = 3
ACCOUNTS = 50
APP_ID = "ledger-writer"
WRITERS = 3
TWO_PHASE = "two-phase"
SINKS = {
    TWO_PHASE: f"two-phase commit: writeStream.format(\"oncelog\"), up to {WRITERS} writers",
    "foreach-batch": f"foreachBatch: exactly_once_writer, {WRITERS} writers",
}
ABORT_EVERY = 10  # about one transaction in ten is aborted on purpose
MAX_PAYMENTS_PER_TXN = 40
# Failure guards, not expectations: a job that cannot catch up within this
# long after the input is complete is a failure, reported as such.
CATCH_UP_TIMEOUT_S = 600
# How long chaos waits for a micro-batch to reach its commit before it
# kills the driver wherever it is.
HOLD_WAIT_S = 60
# A job whose query keeps failing on its own (not killed by chaos) is broken,
# not unlucky: give up after this many restarts.
MAX_JOB_FAILURES = 5
JOB_STOP_TIMEOUT_S = 60
PROGRESS_EVERY_S = 3.0


def log(started: float, message: str) -> None:
    print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)


# --------------------------------------------------------------- payments

@dataclass(frozen=True, slots=True)
class Payment:
    id: int
    payer: str
    payee: str
    amount_cents: int

    def to_json(self) -> bytes:
        return json.dumps({"id": self.id, "from": self.payer, "to": self.payee,
                           "amount_cents": self.amount_cents}).encode()

    @classmethod
    def from_json(cls, value: bytes) -> Payment:
        body = json.loads(value)
        return cls(body["id"], body["from"], body["to"], body["amount_cents"])


@dataclass
class Generator:
    """Writes payments in transactions from a thread; knows what it decided."""

    bootstrap: str
    payments: int
    duration_s: float
    rng: random.Random
    committed: set[int] = field(default_factory=set)
    aborted_on_purpose: set[int] = field(default_factory=set)
    aborted_by_fault: set[int] = field(default_factory=set)
    # A fatal producer error in the middle of a commit leaves its outcome to
    # the coordinator; the log says what happened (the check reads it).
    unknown: set[int] = field(default_factory=set)
    error: BaseException | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="generator", daemon=True)
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    @property
    def done(self) -> int:
        return (len(self.committed) + len(self.aborted_on_purpose) + len(self.aborted_by_fault)
                + len(self.unknown))

    def _producer(self) -> Producer:
        producer = Producer(bootstrap=self.bootstrap, transactional_id="payments-generator",
                            linger_ms=5)
        producer.init_transactions()
        return producer

    def _run(self) -> None:
        try:
            self._generate()
        except BaseException as exc:  # reported by the main thread, not lost here
            self.error = exc

    def _generate(self) -> None:
        rng = self.rng
        producer = self._producer()
        started = time.monotonic()
        next_id = 0
        try:
            while next_id < self.payments:
                size = min(rng.randint(1, MAX_PAYMENTS_PER_TXN), self.payments - next_id)
                batch = [self._payment(i) for i in range(next_id, next_id + size)]
                next_id += size
                ids = {p.id for p in batch}
                on_purpose = rng.randrange(ABORT_EVERY) == 0
                try:
                    producer.begin_transaction()
                    for p in batch:
                        producer.send(PAYMENTS, key=p.payer.encode(), value=p.to_json())
                    if on_purpose:
                        _retry_timeouts(producer.abort_transaction)
                        self.aborted_on_purpose |= ids
                    else:
                        _retry_timeouts(producer.commit_transaction)
                        self.committed |= ids
                except errors.TransactionAbortableError:
                    _retry_timeouts(producer.abort_transaction)
                    self.aborted_by_fault |= ids
                except errors.FatalError:
                    self.unknown |= ids
                    producer.close()
                    producer = self._producer()
                # Spread the payments over duration_s, so faults land mid-stream.
                ahead_s = started + self.duration_s * next_id / self.payments - time.monotonic()
                if ahead_s > 0:
                    time.sleep(ahead_s)
        finally:
            producer.close()

    def _payment(self, payment_id: int) -> Payment:
        payer, payee = self.rng.sample(range(ACCOUNTS), 2)
        return Payment(payment_id, f"acct-{payer:02d}", f"acct-{payee:02d}",
                       self.rng.randint(1, 100_000))


def _retry_timeouts(end_transaction: Callable[[], None]) -> None:
    """commit_transaction()/abort_transaction() until they succeed: a timeout
    leaves the outcome unknown and the call resumes it (a commit is never
    turned into an abort)."""
    deadline_s = time.monotonic() + CATCH_UP_TIMEOUT_S
    while True:
        try:
            end_transaction()
            return
        except errors.KafkaTimeoutError:
            if time.monotonic() > deadline_s:
                raise


# -------------------------------------------------------------- Spark job

@dataclass
class SparkJob:
    """The Spark job as its own process group (the driver's Python, its JVM
    and the Python workers), restarted from its checkpoint as a supervisor
    would."""

    bootstrap: str
    work_dir: Path
    sink: str
    max_records_per_trigger: int
    starts: int = 0
    failures: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def progress_file(self) -> Path:
        return self.work_dir / "progress.jsonl"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "job.log"

    @property
    def hold_marker(self) -> Path:
        """The two-phase sink's commit hold (chaos arms it to kill the driver
        between the tasks' prepare and the driver's commit)."""
        return self.work_dir / "hold-commit"

    def start(self) -> None:
        with self.lock:
            self._start()

    def _start(self) -> None:
        argv = [sys.executable, "-m", "oncelog_spark.jobs.payments",
                "--bootstrap", self.bootstrap, "--checkpoint", str(self.work_dir / "checkpoint"),
                "--app-id", APP_ID, "--input", PAYMENTS, "--output", LEDGER,
                "--sink", self.sink, "--writers", str(WRITERS),
                "--max-records-per-trigger", str(self.max_records_per_trigger),
                "--progress-file", str(self.progress_file)]
        if self.sink == TWO_PHASE:
            argv += ["--hold-commit-marker", str(self.hold_marker)]
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.starts += 1
        self.started_at = time.time()

    def kill_and_restart(self, pause_s: float) -> None:
        """kill -9 of the driver and everything it started, then a new start
        from the checkpoint after `pause_s`; under the lock, so the
        supervisor does not take the killed job for a failed one and start a
        second copy meanwhile."""
        with self.lock:
            self._kill()
            time.sleep(pause_s)
            self._start()

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart_if_exited(self) -> bool:
        """A job that ended on its own (its query failed, say while a store
        was down) is started again; returns True when it had to be."""
        with self.lock:
            if self.proc is None or self.proc.poll() is None:
                return False
            self.failures += 1
            self._start()
            return True

    def stop(self) -> int:
        """SIGTERM: the job stops its query cleanly."""
        with self.lock:
            if self.proc is None:
                return 0
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(JOB_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self._kill()
            with contextlib.suppress(ProcessLookupError):  # Python workers left behind
                os.killpg(self.proc.pid, signal.SIGKILL)
            return int(self.proc.returncode)

    def progress(self) -> list[dict[str, object]]:
        """The micro-batches the job reported done, over all its runs."""
        if not self.progress_file.exists():
            return []
        out = []
        for line in self.progress_file.read_text().splitlines():
            try:  # a line cut short by kill -9
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def reported_since_start(self) -> bool:
        return any(int(str(p["time_ms"])) >= self.started_at * 1000 for p in self.progress())

    def caught_up(self, target: dict[str, dict[str, int]]) -> bool:
        """Some completed micro-batch ended at or past `target` on every
        partition (offsets JSON of the source)."""
        for p in reversed(self.progress()):
            end = p.get("end_offsets")
            if isinstance(end, dict) and all(
                end.get(t, {}).get(part, -1) >= off
                for t, parts in target.items() for part, off in parts.items()
            ):
                return True
        return False

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


# ------------------------------------------------------------------ chaos

FAULT_NAMES = {"partition_store": "partition store", "coordinator": "coordinator",
               "driver": "Spark driver", "wipe": "partition store with its disk wiped",
               "store-for-good": "partition store for good"}
# A wiped store must be a full copy again before the next store fault, or
# the partitions it was rebuilding would have one copy in sync (writes wait).
REBUILD_TIMEOUT_S = 300
INTERNAL_TOPICS = ("__transaction_state", "__consumer_offsets", "__producer_ids")
# A driver kill aimed between the two-phase sink's prepare and its commit.
IN_COMMIT = "driver-in-commit"


@dataclass
class Chaos:
    """kill -9s at random moments within a window, from a thread: each kind
    at least once, then random kinds."""

    cluster: LocalCluster
    job: SparkJob
    rng: random.Random
    faults: int
    window_s: float
    started: float
    done: list[str] = field(default_factory=list)
    # Driver kills that landed between the tasks' prepare and the commit.
    in_commit: int = 0
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    # The store killed for good (chaos kills no other store after it).
    gone: int | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        self._thread.start()

    def finished(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _plan(self) -> list[tuple[float, str]]:
        # Wipe and kill-for-good happen once each; the last fault is the
        # kill for good (the pipeline ends on two stores).
        once = [k for k in ("wipe", "store-for-good") if k in FAULT_NAMES][: self.faults]
        kinds = ["partition_store", "coordinator", "driver"]
        rest = max(0, self.faults - len(once))
        picked = kinds[:rest] + [self.rng.choice(kinds) for _ in range(rest - len(kinds))]
        if "wipe" in once:
            picked.append("wipe")
        self.rng.shuffle(picked)
        moments = sorted(self.rng.uniform(0, self.window_s) for _ in picked)
        plan = list(zip(moments, picked, strict=True))
        if "store-for-good" in once:
            plan.append((self.window_s, "store-for-good"))
        if self.job.sink == TWO_PHASE and "driver" in picked:
            # The two-phase sink's hardest moment comes first: the driver
            # killed with a micro-batch prepared by every task and not yet
            # committed (the next commit after chaos starts).
            plan.remove(next(item for item in plan if item[1] == "driver"))
            plan.insert(0, (0.0, IN_COMMIT))
        return plan

    def _kill_driver_in_commit(self) -> None:
        marker = self.job.hold_marker
        marker.write_text("armed\n")
        deadline_s = time.monotonic() + HOLD_WAIT_S
        held = ""
        while time.monotonic() < deadline_s and not self._stop.is_set():
            held = marker.read_text().strip()
            if held.startswith("held"):
                break
            time.sleep(0.1)
        if held.startswith("held"):
            batch = held.split()[-1]
            self.job.kill_and_restart(pause_s=self.rng.uniform(0.2, 1.0))
            self.in_commit += 1
            log(self.started, f"chaos: kill -9 of the Spark driver with micro-batch {batch} "
                              f"prepared by every task and not committed; the job restarted "
                              f"from its checkpoint")
            return
        # No micro-batch reached its commit meanwhile: kill it where it is.
        marker.write_text("disarmed\n")
        self.job.kill_and_restart(pause_s=self.rng.uniform(0.2, 1.0))
        log(self.started, "chaos: kill -9 of the Spark driver (no commit came to hold); the "
                          "job restarted from its checkpoint")

    def _store_fault(self, kind: str) -> None:
        index = self.rng.choice([i for i in range(STORES) if i != self.gone])
        self.cluster.kill("partition_store", index)
        if kind == "store-for-good":
            self.gone = index
            log(self.started, f"chaos: kill -9 of partition store {index}, for good: the "
                              f"pipeline goes on with {STORES - 1} copies of each partition")
            return
        if kind == "wipe":
            self.cluster.wipe("partition_store", index)
            log(self.started, f"chaos: kill -9 of partition store {index} and its disk "
                              "wiped; it restarts empty")
        else:
            log(self.started, f"chaos: kill -9 of partition store {index}")
        time.sleep(self.rng.uniform(0.2, 1.0))
        self.cluster.restart("partition_store", index)
        log(self.started, f"chaos: partition store {index} restarted")
        waited_s = wait_fully_replicated(self.cluster.bootstrap_servers, self._stop,
                                         REBUILD_TIMEOUT_S)
        if kind == "wipe":
            log(self.started, f"chaos: partition store {index} rebuilt every copy it holds "
                              f"and is in sync again ({waited_s:.1f} s)")

    def _run(self) -> None:
        try:
            begun = time.monotonic()
            for at_s, kind in self._plan():
                if self._stop.wait(max(0.0, begun + at_s - time.monotonic())):
                    return
                if kind == IN_COMMIT:
                    self._kill_driver_in_commit()
                    kind = "driver"
                elif kind == "driver":
                    # Kill a job that is really at work, not one still starting.
                    while not self.job.reported_since_start():
                        if self._stop.wait(0.2):
                            return
                    self.job.kill_and_restart(pause_s=self.rng.uniform(0.2, 1.0))
                    log(self.started, "chaos: kill -9 of the Spark driver (and its workers); "
                                      "the job restarted from its checkpoint")
                elif kind == "coordinator":
                    self.cluster.kill(kind, 0)
                    log(self.started, f"chaos: kill -9 of the {FAULT_NAMES[kind]}")
                    time.sleep(self.rng.uniform(0.2, 1.0))
                    self.cluster.restart(kind, 0)
                    log(self.started, f"chaos: {FAULT_NAMES[kind]} restarted")
                else:
                    self._store_fault(kind)
                self.done.append(kind)
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def wait_fully_replicated(bootstrap: str, stop: threading.Event, timeout_s: float) -> float:
    """Waits until every partition of every topic (internal ones included)
    has all its replicas in sync; returns how long that took."""
    started = time.monotonic()
    with Admin(bootstrap=bootstrap) as admin:
        while time.monotonic() - started < timeout_s and not stop.is_set():
            try:
                names = [*admin.list_topics(), *INTERNAL_TOPICS]
                if all(len(p.isr) == len(p.replicas)
                       for name in names for p in admin.describe_topic(name).partitions):
                    return time.monotonic() - started
            except errors.OncelogError:
                pass
            stop.wait(0.5)
    raise RuntimeError(f"the cluster was not fully replicated again within {timeout_s:.0f} s")


# ----------------------------------------------------------- verification

def read_committed(bootstrap: str, topic: str) -> Iterator[ConsumerRecord]:
    """Every committed record of `topic` (the end offsets taken first)."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with Consumer(bootstrap=bootstrap, isolation_level="read_committed") as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            yield from consumer.poll(timeout=1.0)


@dataclass
class Verification:
    payments_in_log: int = 0
    entries: int = 0
    duplicates: int = 0
    missing: int = 0
    aborted_in_ledger: int = 0
    unknown_payments: int = 0
    wrong_entries: int = 0
    entries_sum_cents: int = 0
    accounts_off: int = 0
    generator_mismatch: int = 0
    hanging: int = 0
    open_sink_transactions: int = 0

    @property
    def violations(self) -> list[str]:
        checks = {
            "duplicate ledger entries": self.duplicates,
            "missing ledger entries": self.missing,
            "aborted payments in the ledger": self.aborted_in_ledger,
            "ledger entries of unknown payments": self.unknown_payments,
            "entries with a wrong account or amount": self.wrong_entries,
            "sum of the entries (cents)": self.entries_sum_cents,
            "accounts whose balance is off": self.accounts_off,
            "payments logged unlike the generator decided": self.generator_mismatch,
            "hanging transactions": self.hanging,
            "sink transactions left open": self.open_sink_transactions,
        }
        return [f"{name}: {value}" for name, value in checks.items() if value]


def verify(bootstrap: str, generator: Generator) -> Verification:
    v = Verification()
    payments: dict[int, Payment] = {}
    for record in read_committed(bootstrap, PAYMENTS):
        p = Payment.from_json(record.value or b"")
        v.generator_mismatch += p.id in payments  # the log itself holds a payment twice
        payments[p.id] = p
    v.payments_in_log = len(payments)
    aborted = generator.aborted_on_purpose | generator.aborted_by_fault
    v.generator_mismatch += len(generator.committed - payments.keys())
    v.generator_mismatch += len(aborted & payments.keys())

    seen: Counter[tuple[int, str]] = Counter()
    balances: Counter[str] = Counter()
    for record in read_committed(bootstrap, LEDGER):
        entry = json.loads(record.value or b"")
        v.entries += 1
        pid, kind = entry["payment_id"], entry["entry"]
        seen[(pid, kind)] += 1
        v.entries_sum_cents += entry["amount_cents"]
        balances[entry["account"]] += entry["amount_cents"]
        payment = payments.get(pid)
        if payment is None:
            if pid in aborted:
                v.aborted_in_ledger += 1
            else:
                v.unknown_payments += 1
            continue
        want = (payment.payer, -payment.amount_cents) if kind == "debit" \
            else (payment.payee, payment.amount_cents)
        if (entry["account"], entry["amount_cents"]) != want or kind not in ("debit", "credit"):
            v.wrong_entries += 1
    v.duplicates = sum(n - 1 for n in seen.values() if n > 1)
    v.missing = sum(1 for pid in payments for kind in ("debit", "credit")
                    if (pid, kind) not in seen)
    expected: Counter[str] = Counter()
    for p in payments.values():
        expected[p.payer] -= p.amount_cents
        expected[p.payee] += p.amount_cents
    accounts = set(expected) | set(balances)
    v.accounts_off = sum(1 for a in accounts if expected[a] != balances[a])

    with Admin(bootstrap=bootstrap) as admin:
        v.hanging = len(admin.find_hanging_transactions(topics=[PAYMENTS, LEDGER]))
        v.open_sink_transactions = sum(
            1 for t in admin.list_transactions(states=OPEN_TRANSACTION_STATES)
            if t.transactional_id.startswith(f"{APP_ID}-")
        )
    return v


# ---------------------------------------------------------------- running

def payments_end(bootstrap: str) -> dict[str, dict[str, int]]:
    """Where the job must get to: the end of `payments` for read_committed
    readers, as the source's offsets JSON."""
    tps = [TopicPartition(PAYMENTS, p) for p in range(PARTITIONS)]
    with Consumer(bootstrap=bootstrap, isolation_level="read_committed") as consumer:
        ends = consumer.end_offsets(tps)
    return {PAYMENTS: {str(tp.partition): off for tp, off in ends.items()}}


def report_progress(started: float, generator: Generator, job: SparkJob,
                    faults: int) -> None:
    progress = job.progress()
    rows_in = sum(int(str(p["input_rows"])) for p in progress)
    if not job.reported_since_start():
        state = f"starting (run {job.starts})"
    else:
        state = f"batch {progress[-1]['batch_id']}"
    log(started, f"payments: {generator.done:,}/{generator.payments:,} written "
                 f"({len(generator.committed):,} committed) | Spark job: {state}, "
                 f"{rows_in:,} payment rows read | faults so far: {faults}")


def run(args: argparse.Namespace, data_dir: Path) -> int:
    started = time.monotonic()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    log(started, f"starting a local cluster in {data_dir} (seed {seed}) ...")
    with LocalCluster(data_dir / "cluster", partition_stores=STORES, etcd_members=1) as cluster:
        bootstrap = cluster.bootstrap_servers
        log(started, f"cluster up ({STORES} partition stores, etcd at "
                     f"{','.join(cluster.etcd_endpoints)}), bootstrap {bootstrap}")
        with Admin(bootstrap=bootstrap) as admin:
            admin.create_topic(PAYMENTS, partitions=PARTITIONS, replication_factor=STORES)
            admin.create_topic(LEDGER, partitions=PARTITIONS, replication_factor=STORES)
        work_dir = data_dir / "job"
        work_dir.mkdir(parents=True, exist_ok=True)
        job = SparkJob(bootstrap, work_dir, args.sink,
                       max_records_per_trigger=max(500, args.payments // 10))
        job.start()
        log(started, f"Spark job started (its log: {job.log_file})")
        generator = Generator(bootstrap, args.payments, args.generate_s, rng)
        generator.start()
        chaos: Chaos | None = None
        try:
            last_report = 0.0
            caught_up_at: float | None = None
            while True:
                if chaos is None and not args.no_chaos and job.reported_since_start():
                    chaos = Chaos(cluster, job, rng, args.faults,
                                  window_s=max(args.generate_s, 10.0), started=started)
                    chaos.start()
                    log(started, f"chaos: {args.faults} faults over the next "
                                 f"{chaos.window_s:.0f} s")
                if job.restart_if_exited():
                    log(started, "the Spark job exited on its own; restarted from its "
                                 f"checkpoint\n{job.log_tail(15)}")
                    if job.failures > MAX_JOB_FAILURES:
                        log(started, f"the Spark job failed {job.failures} times; giving up")
                        return 1
                for thread_error in (generator.error, chaos.error if chaos else None):
                    if thread_error is not None:
                        raise thread_error
                if time.monotonic() - last_report >= PROGRESS_EVERY_S:
                    report_progress(started, generator, job, len(chaos.done) if chaos else 0)
                    last_report = time.monotonic()
                input_done = generator.done == args.payments and (
                    args.no_chaos or (chaos is not None and chaos.finished()))
                if input_done:
                    if caught_up_at is None:
                        generator.join()
                        target = payments_end(bootstrap)
                        caught_up_at = time.monotonic()
                    if job.caught_up(target):
                        break
                    if time.monotonic() - caught_up_at > CATCH_UP_TIMEOUT_S:
                        log(started, f"the Spark job did not catch up within "
                                     f"{CATCH_UP_TIMEOUT_S} s\n{job.log_tail()}")
                        return 1
                time.sleep(0.2)
            processing_s = time.monotonic() - started
            log(started, "the Spark job caught up; stopping it")
        finally:
            if chaos is not None:
                chaos.stop()
            job.stop()
        log(started, "verifying the ledger (read_committed) ...")
        result = verify(bootstrap, generator)
    elapsed_s = time.monotonic() - started
    faults = Counter(chaos.done if chaos else [])
    print_summary(args, generator, job, result, faults, chaos.in_commit if chaos else 0,
                  elapsed_s, processing_s)
    return 1 if result.violations else 0


def print_summary(args: argparse.Namespace, generator: Generator, job: SparkJob,
                  v: Verification, faults: Counter[str], in_commit: int, elapsed_s: float,
                  processing_s: float) -> None:
    aborted = len(generator.aborted_on_purpose) + len(generator.aborted_by_fault)
    # The Spark job's own pace: the time its micro-batches took, JVM starts
    # and restarts left out.
    progress = job.progress()
    batch_s = max(0.001, sum(_trigger_ms(p) for p in progress) / 1000)
    fault_text = ", ".join(f"{FAULT_NAMES[k]} {faults[k]}" for k in FAULT_NAMES if faults[k])
    rows = [
        ("sink", SINKS[args.sink]),
        ("payments generated", f"{args.payments:,}"),
        ("  committed", f"{len(generator.committed):,}"),
        ("  aborted on purpose", f"{len(generator.aborted_on_purpose):,}"),
        ("  aborted by faults", f"{len(generator.aborted_by_fault):,}"),
        ("  outcome left to the coordinator", f"{len(generator.unknown):,}"),
        ("records in (committed payments)", f"{v.payments_in_log:,}"),
        ("records out (ledger entries)", f"{v.entries:,}"),
        ("duplicates", f"{v.duplicates}"),
        ("missing", f"{v.missing}"),
        ("aborted filtered (payments never in the ledger)", f"{aborted:,}"),
        ("aborted payments in the ledger", f"{v.aborted_in_ledger}"),
        ("wrong entries", f"{v.wrong_entries}"),
        ("sum of all entries (cents)", f"{v.entries_sum_cents}"),
        ("accounts whose balance is off", f"{v.accounts_off} of {ACCOUNTS}"),
        ("hanging / open sink transactions", f"{v.hanging} / {v.open_sink_transactions}"),
        ("faults injected", f"{sum(faults.values())}"
                                      + (f" ({fault_text})" if fault_text else "")),
        ("  driver kills between prepare and commit", f"{in_commit}"),
        ("Spark job starts", f"{job.starts} ({job.failures} after a failed query)"),
        ("elapsed", f"{elapsed_s:.1f} s"),
        ("throughput", f"{v.entries / processing_s:,.0f} ledger entries/s "
                       f"({v.payments_in_log / processing_s:,.0f} payments/s, until caught up)"),
        ("  in micro-batches", f"{v.payments_in_log / batch_s:,.0f} payments/s over "
                               f"{batch_s:.1f} s of {len(progress)} micro-batches"),
    ]
    width = max(len(name) for name, _ in rows)
    print()
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    print()
    if v.violations:
        print("exactly once: VIOLATED — " + "; ".join(v.violations))
    else:
        print("exactly once: OK")


def _trigger_ms(progress: dict[str, object]) -> int:
    durations = progress.get("duration_ms")
    return int(durations.get("triggerExecution", 0)) if isinstance(durations, dict) else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--payments", type=int, default=20_000,
                        help="payment events to generate (default 20,000)")
    parser.add_argument("--no-chaos", action="store_true", help="kill nothing")
    parser.add_argument("--faults", type=int, default=6,
                        help="faults to inject (default 6): kill -9 of a partition store, "
                             "the coordinator or the Spark driver, one store's disk wiped, "
                             "and last one store killed for good; each kind at least once "
                             "when 5 or more")
    parser.add_argument("--generate-s", type=float, default=60.0,
                        help="spread the payments over this many seconds (default 60)")
    parser.add_argument("--sink", choices=list(SINKS), default=TWO_PHASE,
                        help="the exactly-once sink of the Spark job (default two-phase)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (printed)")
    parser.add_argument("--data-dir", type=Path, help="keep the cluster's data and job here")
    args = parser.parse_args()
    if args.payments < 1 or args.faults < 0 or args.generate_s < 0:
        parser.error("--payments must be positive, --faults and --generate-s not negative")
    if args.data_dir:
        sys.exit(run(args, args.data_dir))
    with tempfile.TemporaryDirectory(prefix="oncelog-payments-") as tmp:
        sys.exit(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
